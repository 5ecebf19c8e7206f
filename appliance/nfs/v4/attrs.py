"""NFSv4 file attributes: which are supported, their XDR types, how they are
read from a namespace ``Attr`` and how settable ones are decoded.

``ATTRS`` declares each attribute once: bit, XDR type, getter, settable."""

from __future__ import annotations

import functools
import grp
import pwd
import time
from dataclasses import dataclass
from typing import Any, Protocol

from appliance.nfs.onc.xdr import Array, Bool, Packer, UHyper, UInt, XdrError
from appliance.nfs.v4 import const as c
from appliance.nfs.v4.types import bitmap4, fsid4, nfs_fh4, nfstime4, settime4, specdata4, utf8str
from engine.catalog.models import REG
from engine.namespace.quotas import QuotaTracker


class AttrServer(Protocol):
    """What GETATTR needs of the NFS server (appliance/nfs/server.py's NfsServer): a Protocol
    rather than an import, so the attribute table does not depend on the server above it."""

    namespace: Any
    lease_seconds: int
    pnfs: Any  # appliance.nfs.pnfs.Pnfs: fs_layout_type, layout_blksize
    idmap_domain: str  # owners by name are user@idmap_domain

    def statfs(self) -> Any: ...


MAX_IO = 1 << 20
MAX_FILE_SIZE = (1 << 63) - 1
NS = 1_000_000_000


class AttrError(Exception):
    def __init__(self, status: int, message: str = ""):
        super().__init__(message or str(status))
        self.status = status


@dataclass(slots=True)
class AttrSubject:
    """What GETATTR describes: the inode attributes plus protocol facts."""

    attr: object  # engine.namespace.Attr (or a pseudo directory's stand-in)
    fh: bytes
    fsid: tuple[int, int]
    mounted_on_fileid: int
    server: AttrServer  # lease time, statfs
    rdattr_error: int = 0
    minor: int = 1  # NFSv4.0 has no attribute past mounted_on_fileid
    # owner and owner_group as user@domain (the client maps names: Kerberos), else numeric
    owner_names: bool = False


def _space_used(s: AttrSubject) -> int:
    attr: Any = s.attr
    # a pseudo directory's stand-in is no namespace inode: its size, as for every directory
    if attr.type == REG:
        return s.server.namespace.space_used(attr)
    return (attr.size + 4095) & ~4095


def _time(ns: int):
    return nfstime4.cls(ns // NS, ns % NS)


def _owner(s: AttrSubject, uid: int, *, group: bool) -> str:
    """'1000', or 'alice@domain' for a client that maps names (an id without a name in the
    name service stays numeric, which the Linux client also reads)."""
    if s.owner_names:
        name = _name_of(uid, group, int(time.monotonic() // NAME_CACHE_S))
        if name is not None:
            return f"{name}@{s.server.idmap_domain}"
    return str(uid)


NAME_CACHE_S = 60  # how long a name-service answer is reused (GETATTR asks for every entry)


@functools.lru_cache(maxsize=8192)
def _name_of(uid: int, group: bool, _period: int) -> str | None:
    try:
        return grp.getgrgid(uid).gr_name if group else pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def parse_owner(text: str, *, group: bool, domain: str = "") -> int:
    """Numeric ids ('1000'), names ('alice') or 'alice@domain' to an id: BADOWNER for a name
    the name service does not know or another domain than ``domain`` (when given)."""
    name, at, their_domain = text.partition("@")
    if not text:  # no name at all is a bad argument, not an owner this server cannot map
        raise AttrError(c.NFS4ERR_INVAL, "empty owner or owner_group")
    what = "group" if group else "user"
    if at and domain and their_domain.lower() != domain.lower():
        raise AttrError(
            c.NFS4ERR_BADOWNER, f"{what} {text!r}: domain {their_domain!r}, expected {domain!r}"
        )
    if name.isdigit():
        return int(name)
    try:
        return grp.getgrnam(name).gr_gid if group else pwd.getpwnam(name).pw_uid
    except KeyError:
        if name == "nobody":
            return 65534
        raise AttrError(c.NFS4ERR_BADOWNER, f"unknown {what} {text!r}") from None


def _statfs(s: AttrSubject):
    return s.server.statfs()


def _quota(s: AttrSubject) -> tuple[int, int, int]:
    """(quota_avail_hard, quota_avail_soft, quota_used) in bytes: the quotas of the inode's
    directory trees (engine/namespace/quotas.py); with none, the pool's free space and the file's
    use."""
    free = _statfs(s).avail_bytes
    attr: Any = s.attr
    quotas: QuotaTracker | None = getattr(s.server.namespace, "quotas", None)
    # a pseudo directory's stand-in has no generation: it is in no quota tree
    found = None
    if quotas is not None and hasattr(attr, "generation"):
        found = quotas.space(attr.ino, free)
    if found is None:
        return free, free, (attr.size + 4095) & ~4095
    return found.avail_hard, found.avail_soft, found.used


# bit -> (xdr type, getter(subject) or None when only settable, settable)
ATTRS = {
    c.FATTR4_SUPPORTED_ATTRS: (bitmap4, lambda s: SUPPORTED_BY_MINOR[s.minor], False),
    c.FATTR4_TYPE: (UInt, lambda s: s.attr.type, False),
    c.FATTR4_FH_EXPIRE_TYPE: (UInt, lambda s: c.FH4_PERSISTENT, False),
    c.FATTR4_CHANGE: (UHyper, lambda s: s.attr.change, False),
    c.FATTR4_SIZE: (UHyper, lambda s: s.attr.size, True),
    c.FATTR4_LINK_SUPPORT: (Bool, lambda s: True, False),
    c.FATTR4_SYMLINK_SUPPORT: (Bool, lambda s: True, False),
    c.FATTR4_NAMED_ATTR: (Bool, lambda s: False, False),
    c.FATTR4_FSID: (fsid4, lambda s: s.fsid, False),
    c.FATTR4_UNIQUE_HANDLES: (Bool, lambda s: True, False),
    c.FATTR4_LEASE_TIME: (UInt, lambda s: s.server.lease_seconds, False),
    c.FATTR4_RDATTR_ERROR: (UInt, lambda s: s.rdattr_error, False),
    c.FATTR4_ACLSUPPORT: (UInt, lambda s: 0, False),
    c.FATTR4_CANSETTIME: (Bool, lambda s: True, False),
    c.FATTR4_CASE_INSENSITIVE: (Bool, lambda s: False, False),
    c.FATTR4_CASE_PRESERVING: (Bool, lambda s: True, False),
    c.FATTR4_CHOWN_RESTRICTED: (Bool, lambda s: True, False),
    c.FATTR4_FILEHANDLE: (nfs_fh4, lambda s: s.fh, False),
    c.FATTR4_FILEID: (UHyper, lambda s: s.attr.ino, False),
    c.FATTR4_FILES_AVAIL: (UHyper, lambda s: _statfs(s).free_files, False),
    c.FATTR4_FILES_FREE: (UHyper, lambda s: _statfs(s).free_files, False),
    c.FATTR4_FILES_TOTAL: (UHyper, lambda s: _statfs(s).total_files, False),
    c.FATTR4_HOMOGENEOUS: (Bool, lambda s: True, False),
    c.FATTR4_MAXFILESIZE: (UHyper, lambda s: MAX_FILE_SIZE, False),
    c.FATTR4_MAXLINK: (UInt, lambda s: 65000, False),
    c.FATTR4_MAXNAME: (UInt, lambda s: 255, False),
    c.FATTR4_MAXREAD: (UHyper, lambda s: MAX_IO, False),
    c.FATTR4_MAXWRITE: (UHyper, lambda s: MAX_IO, False),
    c.FATTR4_MODE: (UInt, lambda s: s.attr.mode & 0o7777, True),
    c.FATTR4_NO_TRUNC: (Bool, lambda s: True, False),
    c.FATTR4_NUMLINKS: (UInt, lambda s: s.attr.nlink, False),
    c.FATTR4_OWNER: (utf8str, lambda s: _owner(s, s.attr.uid, group=False), True),
    c.FATTR4_OWNER_GROUP: (utf8str, lambda s: _owner(s, s.attr.gid, group=True), True),
    c.FATTR4_RAWDEV: (
        specdata4,
        lambda s: specdata4.cls(s.attr.rdev >> 32, s.attr.rdev & 0xFFFFFFFF),
        False,
    ),
    c.FATTR4_QUOTA_AVAIL_HARD: (UHyper, lambda s: _quota(s)[0], False),
    c.FATTR4_QUOTA_AVAIL_SOFT: (UHyper, lambda s: _quota(s)[1], False),
    c.FATTR4_QUOTA_USED: (UHyper, lambda s: _quota(s)[2], False),
    c.FATTR4_SPACE_AVAIL: (UHyper, lambda s: _statfs(s).avail_bytes, False),
    c.FATTR4_SPACE_FREE: (UHyper, lambda s: _statfs(s).free_bytes, False),
    c.FATTR4_SPACE_TOTAL: (UHyper, lambda s: _statfs(s).total_bytes, False),
    c.FATTR4_SPACE_USED: (UHyper, lambda s: _space_used(s), False),
    c.FATTR4_TIME_ACCESS: (nfstime4, lambda s: _time(s.attr.atime_ns), False),
    c.FATTR4_TIME_ACCESS_SET: (settime4, None, True),
    c.FATTR4_TIME_CREATE: (nfstime4, lambda s: _time(s.attr.btime_ns), False),
    c.FATTR4_TIME_DELTA: (nfstime4, lambda s: nfstime4.cls(0, 1), False),
    c.FATTR4_TIME_METADATA: (nfstime4, lambda s: _time(s.attr.ctime_ns), False),
    c.FATTR4_TIME_MODIFY: (nfstime4, lambda s: _time(s.attr.mtime_ns), False),
    c.FATTR4_TIME_MODIFY_SET: (settime4, None, True),
    c.FATTR4_MOUNTED_ON_FILEID: (UHyper, lambda s: s.mounted_on_fileid, False),
    c.FATTR4_FS_LAYOUT_TYPES: (Array(UInt), lambda s: s.server.pnfs.layout_types, False),
    # the stripe unit of the layouts: I/O of that size reaches one data server
    c.FATTR4_LAYOUT_BLKSIZE: (UInt, lambda s: s.server.pnfs.stripe_unit, False),
    c.FATTR4_SUPPATTR_EXCLCREAT: (bitmap4, lambda s: EXCLCREAT_BITMAP, False),
    # NFSv4.2 (RFC 7862 12.2, RFC 8276 8.2): extents are shared at byte granularity, so CLONE
    # needs no alignment; space_freed counts shared extents too (an upper bound); change is a
    # counter that only grows
    c.FATTR4_CLONE_BLKSIZE: (UInt, lambda s: 1, False),
    c.FATTR4_SPACE_FREED: (UHyper, lambda s: (s.attr.size + 4095) & ~4095, False),
    c.FATTR4_CHANGE_ATTR_TYPE: (UInt, lambda s: c.NFS4_CHANGE_TYPE_IS_MONOTONIC_INCR, False),
    c.FATTR4_XATTR_SUPPORT: (Bool, lambda s: True, False),
}


def to_bitmap(bits) -> list[int]:
    words: list[int] = []
    for bit in bits:
        w = bit // 32
        while len(words) <= w:
            words.append(0)
        words[w] |= 1 << (bit % 32)
    return words


def from_bitmap(words) -> list[int]:
    bits = []
    for w, word in enumerate(words):
        base = w * 32
        while word:
            low = word & -word
            bits.append(base + low.bit_length() - 1)
            word ^= low
    return bits


SUPPORTED = sorted(ATTRS)
SUPPORTED_BITMAP = to_bitmap(SUPPORTED)
SUPPORTED_BITMAP_40 = to_bitmap(b for b in SUPPORTED if b <= c.LAST_FATTR4_40)
SUPPORTED_BITMAP_41 = to_bitmap(b for b in SUPPORTED if b <= c.LAST_FATTR4_41)
SUPPORTED_BY_MINOR: dict[int, list[int]] = {
    0: SUPPORTED_BITMAP_40,
    1: SUPPORTED_BITMAP_41,
    2: SUPPORTED_BITMAP,
}
_WORD2_41 = (1 << (c.LAST_FATTR4_41 - 63)) - 1  # word 2's bits an NFSv4.1 server has
SETTABLE = frozenset(b for b, (_, _, settable) in ATTRS.items() if settable)
WRITE_ONLY = frozenset(b for b, (_, get, _) in ATTRS.items() if get is None)
WRITE_ONLY_BITMAP = to_bitmap(WRITE_ONLY)
# time_access_set and time_modify_set: both in word 1, so one test per GETATTR finds them
assert len(WRITE_ONLY_BITMAP) == 2 and not WRITE_ONLY_BITMAP[0], WRITE_ONLY_BITMAP
_WRITE_ONLY_WORD1 = WRITE_ONLY_BITMAP[1]
EXCLCREAT_BITMAP: list[int] = to_bitmap(
    [c.FATTR4_SIZE, c.FATTR4_MODE, c.FATTR4_OWNER, c.FATTR4_OWNER_GROUP]
)
_plans: dict[tuple, tuple] = {}


def _plan(words) -> tuple:
    key = tuple(words)
    plan = _plans.get(key)
    if plan is None:
        bits = [b for b in from_bitmap(words) if b in ATTRS and ATTRS[b][1] is not None]
        plan = (to_bitmap(bits), tuple((ATTRS[b][0].pack, ATTRS[b][1]) for b in bits))
        if len(_plans) < 4096:
            _plans[key] = plan
    return plan


def encode(words, subject: AttrSubject):
    """fattr4 for the requested bitmap: unsupported bits (and NFSv4.2's, asked in an NFSv4.1
    COMPOUND) are left out."""
    if len(words) > 2 and words[2] & ~_WORD2_41 and subject.minor < c.MINOR_VERSION_42:
        words = [*words[:2], words[2] & _WORD2_41]
    mask, steps = _plan(words)
    p = Packer()
    for pack, get in steps:
        pack(p, get(subject))
    return (mask, p.getvalue())


def encode_values(words, subject: AttrSubject) -> bytes:
    return encode(words, subject)[1]


def only_40(words) -> list[int]:
    """A requested bitmap without NFSv4.1's attributes (an NFSv4.0 server has none of them)."""
    words = list(words[:2])
    if len(words) == 2:
        words[1] &= (1 << (c.LAST_FATTR4_40 - 31)) - 1
    return words


def check_readable(words) -> None:
    """Refuse a request for a write-only attribute (time_access_set, time_modify_set): RFC 7530
    and RFC 8881 5.5 want INVAL, not the silence an unsupported attribute gets."""
    if len(words) > 1 and words[1] & _WRITE_ONLY_WORD1:
        bits = [b for b in from_bitmap(words) if b in WRITE_ONLY]
        raise AttrError(c.NFS4ERR_INVAL, f"attributes {bits} are write-only")


def check_supported(words) -> None:
    """What VERIFY and NVERIFY may compare: an unsupported attribute is ATTRNOTSUPP, a
    write-only one INVAL (RFC 7530 16.15.5)."""
    check_readable(words)
    for bit in from_bitmap(words):
        if bit not in ATTRS:
            raise AttrError(c.NFS4ERR_ATTRNOTSUPP, f"attribute {bit} is not supported")


def decode_settable(fattr) -> dict[int, Any]:
    """The values of a client-sent fattr4 (SETATTR, CREATE, OPEN), by bit."""
    values = {}
    buf = fattr.attr_vals
    pos = 0
    try:
        for bit in from_bitmap(fattr.attrmask):
            spec = ATTRS.get(bit)
            if spec is None:
                raise AttrError(c.NFS4ERR_ATTRNOTSUPP, f"attribute {bit} is not supported")
            if not spec[2]:
                raise AttrError(c.NFS4ERR_INVAL, f"attribute {bit} is read-only")
            values[bit], pos = spec[0].unpack(buf, pos)
    except XdrError as exc:
        raise AttrError(c.NFS4ERR_BADXDR, str(exc)) from None
    if pos != len(buf):
        raise AttrError(c.NFS4ERR_BADXDR, f"{len(buf) - pos} bytes after the attribute values")
    return values


def setattr_kwargs(values: dict, now_marker, domain: str = "") -> dict:
    """namespace.setattr keyword arguments for decoded attribute values (owner names of
    ``domain``)."""
    kw = {}
    if c.FATTR4_MODE in values:
        kw["mode"] = values[c.FATTR4_MODE] & 0o7777
    if c.FATTR4_SIZE in values:
        kw["size"] = values[c.FATTR4_SIZE]
        if kw["size"] > MAX_FILE_SIZE:
            raise AttrError(c.NFS4ERR_FBIG, f"size {kw['size']}: at most {MAX_FILE_SIZE}")
    if c.FATTR4_OWNER in values:
        kw["uid"] = parse_owner(values[c.FATTR4_OWNER], group=False, domain=domain)
    if c.FATTR4_OWNER_GROUP in values:
        kw["gid"] = parse_owner(values[c.FATTR4_OWNER_GROUP], group=True, domain=domain)
    for bit, key in (
        (c.FATTR4_TIME_ACCESS_SET, "atime_ns"),
        (c.FATTR4_TIME_MODIFY_SET, "mtime_ns"),
    ):
        if bit in values:
            how, t = values[bit]
            if how == c.SET_TO_CLIENT_TIME4:
                if t.nseconds >= NS:
                    raise AttrError(c.NFS4ERR_INVAL, f"nseconds {t.nseconds}: expected < 10^9")
                kw[key] = t.seconds * NS + t.nseconds
                if not -(1 << 63) <= kw[key] < 1 << 63:  # nanoseconds in 64 bits: year 2262
                    raise AttrError(c.NFS4ERR_INVAL, f"time {t.seconds} s out of range")
            else:
                kw[key] = now_marker
    return kw
