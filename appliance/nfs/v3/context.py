"""The context of an NFSv3 call (``Call3``): the file a handle names (through
appliance.nfs.access, the checks NFSv4 shares), identities, and fattr3/wcc_data built
from namespace attributes; the NFSv3 errors and status codes."""

from __future__ import annotations

import errno
from typing import TYPE_CHECKING, NamedTuple

from appliance.nfs import access
from appliance.nfs.fh import KIND_FILE
from appliance.nfs.onc.rpc import AuthTooWeak
from appliance.nfs.state import NfsError
from appliance.nfs.v3 import types as t
from engine.base import errors
from engine.catalog.models import DIR
from engine.namespace import SET_TO_NOW, Attr, Cred

if TYPE_CHECKING:
    from appliance.nfs.exports import ExportRule

MAX_IO = 1 << 20
MAX_FILE_SIZE = (1 << 63) - 1
NS = 1_000_000_000
# cookies are dirent ids, valid while the directory changes: no verifier needed
COOKIEVERF = b"\0" * 8
READDIR_MAX_ENTRIES = 4096
ANY_CRED = Cred(0, 0)  # the server's own lookup of the file a change names (not the caller's)
# XDR sizes used to fill READDIR(PLUS) replies up to the client's count
FATTR3_SIZE = 84
RESOK_OVERHEAD = 4 + 4 + FATTR3_SIZE + 8 + 4 + 4  # status, dir attrs, verifier, list end, eof

ERRNO_TO_NFS3 = {
    errno.EPERM: t.NFS3ERR_PERM,
    errno.ENOENT: t.NFS3ERR_NOENT,
    errno.EIO: t.NFS3ERR_IO,
    errno.ENXIO: t.NFS3ERR_NXIO,
    errno.EACCES: t.NFS3ERR_ACCES,
    errno.EEXIST: t.NFS3ERR_EXIST,
    errno.EXDEV: t.NFS3ERR_XDEV,
    errno.ENODEV: t.NFS3ERR_NODEV,
    errno.ENOTDIR: t.NFS3ERR_NOTDIR,
    errno.EISDIR: t.NFS3ERR_ISDIR,
    errno.EINVAL: t.NFS3ERR_INVAL,
    errno.EFBIG: t.NFS3ERR_FBIG,
    errno.ENOSPC: t.NFS3ERR_NOSPC,
    errno.EROFS: t.NFS3ERR_ROFS,
    errno.EMLINK: t.NFS3ERR_MLINK,
    errno.ENAMETOOLONG: t.NFS3ERR_NAMETOOLONG,
    errno.ENOTEMPTY: t.NFS3ERR_NOTEMPTY,
    errno.EDQUOT: t.NFS3ERR_DQUOT,
    errno.ESTALE: t.NFS3ERR_STALE,
    errno.ENODATA: t.NFS3ERR_NOENT,
    errno.ENOTSUP: t.NFS3ERR_NOTSUPP,
}


class Nfs3Error(Exception):
    def __init__(self, status: int, message: str = ""):
        super().__init__(message or str(status))
        self.status = status


CODES = access.Codes(
    Nfs3Error,
    badhandle=t.NFS3ERR_BADHANDLE,
    stale=t.NFS3ERR_STALE,
    access=t.NFS3ERR_ACCES,
    rofs=t.NFS3ERR_ROFS,
    io=t.NFS3ERR_IO,
    delay=t.NFS3ERR_JUKEBOX,
    serverfault=t.NFS3ERR_SERVERFAULT,
    inval=t.NFS3ERR_INVAL,
    fbig=t.NFS3ERR_FBIG,
    errno_map=ERRNO_TO_NFS3,
    carries_status=(Nfs3Error,),
)


def status_of(exc: Exception) -> int:
    return access.status_of(exc, CODES)


class Node3(NamedTuple):
    """A file of an export named by a v3 handle, with its attributes at decode time."""

    rule: ExportRule
    attr: Attr


def nfstime(ns: int):
    return t.nfstime3.cls((ns // NS) & 0xFFFFFFFF, ns % NS)


def _client_time(how_value):
    how, value = how_value
    if how == t.SET_TO_CLIENT_TIME:
        if value.nseconds >= NS:
            raise Nfs3Error(t.NFS3ERR_INVAL, f"nseconds {value.nseconds}: expected < 10^9")
        return value.seconds * NS + value.nseconds
    if how == t.SET_TO_SERVER_TIME:
        return SET_TO_NOW
    return None


class Call3:
    """Per-call context: the server, the client's address and RPC credential."""

    def __init__(self, server, rpc_cred, address: str):
        self.server = server
        self.ns = server.namespace
        self.rpc_cred = rpc_cred
        self.address = address
        self.export_id: int | None = None  # of the last handle resolved, for per-export counters

    # -- identities and handles ---------------------------------------------------------
    def recall_first(self, dir_ino: int | None, name_or_ino, *, write: bool = True) -> None:
        """An NFSv3 change of a file (an inode, or ``name`` in ``dir_ino``; a read with
        ``write`` False, which only a write delegation conflicts with): JUKEBOX while an
        NFSv4 client's delegation of it stands (recalled first; appliance.nfs.state.delegations)."""
        state = self.server.state
        if state is None or not state.delegations.held(None):
            return
        ino = name_or_ino
        if dir_ino is not None:
            try:
                ino = self.ns.lookup(ANY_CRED, dir_ino, name_or_ino).ino
            except errors.FsError:
                return  # the change itself says what is wrong
        try:
            state.delegations.conflict(ino, None, write=write)
        except NfsError as exc:
            raise Nfs3Error(t.NFS3ERR_JUKEBOX, str(exc)) from None

    def holder_attr(self, attr):
        """``attr`` as an NFSv4 client holding a write delegation of it sees it (CB_GETATTR;
        JUKEBOX while it is recalled instead)."""
        state = self.server.state
        holder = state.delegations.write_holder(attr.ino, None) if state is not None else None
        if holder is None and (state is None or not state.delegations.foreign_write(attr.ino)):
            return attr
        try:
            if holder is None:  # another head's: CB_GETATTR through it
                return state.delegations.foreign_holder_attr(attr, None)
            return state.delegations.holder_attr(holder, attr)
        except NfsError as exc:
            raise Nfs3Error(t.NFS3ERR_JUKEBOX, str(exc)) from None

    def cred(self, rule):
        r = self.rpc_cred
        return rule.cred(r.uid, r.gid, r.gids)

    def node(self, fh) -> Node3:
        _, rule, attr = access.resolve(self.server, fh, self.address, CODES)
        assert rule is not None and isinstance(attr, Attr)  # v3 has no pseudo-root handles
        if not rule.admits(self.rpc_cred.sec):
            raise AuthTooWeak(f"export {rule.name} does not allow flavour {self.rpc_cred.sec}")
        self.export_id = rule.id
        return Node3(rule, attr)

    def dir_node(self, fh) -> Node3:
        node = self.node(fh)
        if node.attr.type != DIR:
            raise Nfs3Error(t.NFS3ERR_NOTDIR, f"inode {node.attr.ino} is not a directory")
        return node

    def fh(self, rule, attr: Attr) -> bytes:
        return self.server.handles.pack(KIND_FILE, rule.id, attr.ino, attr.generation)

    @staticmethod
    def need_writable(rule) -> None:
        access.need_writable(rule, CODES)

    # -- attributes ------------------------------------------------------------------------
    def fattr(self, rule, a: Attr):
        fsid = (self.server.handles.fsid + rule.id) & ((1 << 64) - 1)
        rdev = t.specdata3.cls((a.rdev >> 32) & 0xFFFFFFFF, a.rdev & 0xFFFFFFFF)
        return t.fattr3.cls(
            a.type,
            a.mode & 0o7777,
            min(a.nlink, 0xFFFFFFFF),
            a.uid,
            a.gid,
            a.size,
            self.server.namespace.space_used(a),
            rdev,
            fsid,
            a.ino,
            nfstime(a.atime_ns),
            nfstime(a.mtime_ns),
            nfstime(a.ctime_ns),
        )

    def post(self, rule, ino: int):
        """post_op_attr: the current attributes, or none when they cannot be had."""
        try:
            return self.post_op(rule, self.ns.getattr(ino))
        except Exception:  # noqa: BLE001 - attributes are optional here; the status says what happened
            return None

    def post_op(self, rule, a: Attr):
        """post_op_attr of ``a``: none for a file under an NFSv4 client's write delegation
        (through this head or another), whose stored size and change may be behind the
        holder's: the Linux client takes a newer reply's attributes over what GETATTR told it
        (a LOOKUP's or an ACCESS's would shrink the file it sees back to the stored size),
        and without them it asks GETATTR, which asks the holder (``holder_attr``)."""
        state = self.server.state
        if state is not None and (
            state.delegations.write_holder(a.ino, None) is not None
            or state.delegations.foreign_write(a.ino)
        ):
            return None
        return self.fattr(rule, a)

    @staticmethod
    def pre(a: Attr):
        return t.wcc_attr.cls(a.size, nfstime(a.mtime_ns), nfstime(a.ctime_ns))

    def wcc(self, node: Node3):
        return t.wcc_data.cls(self.pre(node.attr), self.post(node.rule, node.attr.ino))

    def apply_sattr(self, rule, ino: int, s, *, skip_mode: bool = False) -> Attr | None:
        """namespace.setattr for a sattr3 (what the client asked to set)."""
        kw = {}
        if s.mode is not None and not skip_mode:
            kw["mode"] = s.mode & 0o7777
        if s.uid is not None:
            kw["uid"] = s.uid
        if s.gid is not None:
            kw["gid"] = s.gid
        if s.size is not None:
            if s.size > MAX_FILE_SIZE:
                raise Nfs3Error(t.NFS3ERR_FBIG, f"size {s.size}: at most {MAX_FILE_SIZE}")
            kw["size"] = s.size
        for key, value in (("atime_ns", s.atime), ("mtime_ns", s.mtime)):
            when = _client_time(value)
            if when is not None:
                kw[key] = when
        if not kw:
            return None
        return self.ns.setattr(self.cred(rule), ino, **kw)


def check_name(name: str) -> str:
    if not name or "/" in name or "\0" in name:
        raise Nfs3Error(t.NFS3ERR_INVAL if name else t.NFS3ERR_NOENT, f"invalid file name {name!r}")
    if not name.isascii():
        try:
            name.encode("utf-8")  # the XDR decoder keeps bytes that are not UTF-8 as surrogates
        except UnicodeEncodeError:
            raise Nfs3Error(t.NFS3ERR_INVAL, "file name is not UTF-8") from None
    return name
