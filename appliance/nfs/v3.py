"""NFSv3 (RFC 1813) over the namespace API, sharing the NFSv4.1 server's
exports, file handles (a v3 handle works in v4 and back) and write verifier.

Each procedure is a handler registered with ``@procedure(NFSPROC3_X)``: it gets
a ``Call3`` context and the arguments decoded from their declared XDR type
(types3.ARGS3), returns the resok value, or raises ``Nfs3Error`` / an
engine.errors exception, which becomes the NFS3ERR_* status with the
procedure's resfail value. Calls run in the server's worker threads.
``VersionDispatch`` lets program 100003 answer version 3 here and version 4
in the existing Nfs4Program."""
from __future__ import annotations

import errno
import logging
import time
from typing import NamedTuple

from appliance.nfs import types3 as t
from appliance.nfs.fh import KIND_FILE, BadHandle, StaleHandle
from appliance.nfs.rpc import GARBAGE_ARGS, PROC_UNAVAIL, InWorker, RpcReject, accepted
from appliance.nfs.xdr import Packer, XdrError
from engine import errors
from engine.catalog.database import CatalogUnavailable
from engine.catalog.models import BLK, CHR, DIR, FIFO, LNK, REG, SOCK
from engine.namespace import R_OK, SET_TO_NOW, W_OK, X_OK, Attr, may

log = logging.getLogger("shingle.nfs.v3")

MAX_IO = 1 << 20
MAX_FILE_SIZE = (1 << 63) - 1
NS = 1_000_000_000
COOKIEVERF = b"\0" * 8  # cookies are dirent ids, valid while the directory changes: no verifier needed
READDIR_MAX_ENTRIES = 4096
# XDR sizes used to fill READDIR(PLUS) replies up to the client's count
FATTR3_SIZE = 84
RESOK_OVERHEAD = 4 + 4 + FATTR3_SIZE + 8 + 4 + 4  # status, dir attrs, verifier, list end, eof

ERRNO_TO_NFS3 = {
    errno.EPERM: t.NFS3ERR_PERM, errno.ENOENT: t.NFS3ERR_NOENT, errno.EIO: t.NFS3ERR_IO,
    errno.ENXIO: t.NFS3ERR_NXIO, errno.EACCES: t.NFS3ERR_ACCES, errno.EEXIST: t.NFS3ERR_EXIST,
    errno.EXDEV: t.NFS3ERR_XDEV, errno.ENODEV: t.NFS3ERR_NODEV, errno.ENOTDIR: t.NFS3ERR_NOTDIR,
    errno.EISDIR: t.NFS3ERR_ISDIR, errno.EINVAL: t.NFS3ERR_INVAL, errno.EFBIG: t.NFS3ERR_FBIG,
    errno.ENOSPC: t.NFS3ERR_NOSPC, errno.EROFS: t.NFS3ERR_ROFS, errno.EMLINK: t.NFS3ERR_MLINK,
    errno.ENAMETOOLONG: t.NFS3ERR_NAMETOOLONG, errno.ENOTEMPTY: t.NFS3ERR_NOTEMPTY,
    errno.EDQUOT: t.NFS3ERR_DQUOT, errno.ESTALE: t.NFS3ERR_STALE, errno.ENODATA: t.NFS3ERR_NOENT,
    errno.ENOTSUP: t.NFS3ERR_NOTSUPP,
}

HANDLERS3: dict = {}


def procedure(proc: int):
    def register(fn):
        HANDLERS3[proc] = fn
        return fn
    return register


class Nfs3Error(Exception):
    def __init__(self, status: int, message: str = ""):
        super().__init__(message or str(status))
        self.status = status


def status_of(exc: Exception) -> int:
    if isinstance(exc, Nfs3Error):
        return exc.status
    if isinstance(exc, CatalogUnavailable):
        return t.NFS3ERR_JUKEBOX  # the client retries later
    if isinstance(exc, OSError):
        return ERRNO_TO_NFS3.get(exc.errno, t.NFS3ERR_IO)
    return t.NFS3ERR_SERVERFAULT


class Node3(NamedTuple):
    """A file of an export named by a v3 handle, with its attributes at decode time."""

    rule: object  # appliance.nfs.exports.ExportRule
    attr: Attr


def _time(ns: int):
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

    # -- identities and handles ---------------------------------------------------------
    def cred(self, rule):
        r = self.rpc_cred
        return rule.cred(r.uid, r.gid, r.gids)

    def node(self, fh) -> Node3:
        try:
            h = self.server.handles.unpack(fh)
        except BadHandle as exc:
            raise Nfs3Error(t.NFS3ERR_BADHANDLE, str(exc)) from None
        except StaleHandle as exc:
            raise Nfs3Error(t.NFS3ERR_STALE, str(exc)) from None
        if h.kind != KIND_FILE:
            raise Nfs3Error(t.NFS3ERR_BADHANDLE, "an NFSv4 pseudo-root handle has no meaning in NFSv3")
        rule = self.server.exports.by_id.get(h.export_id)
        if rule is None:
            raise Nfs3Error(t.NFS3ERR_STALE, f"export {h.export_id} no longer exists")
        if not rule.allows(self.address):
            raise Nfs3Error(t.NFS3ERR_ACCES, f"export {rule.name} does not admit client {self.address}")
        attr = self.ns.getattr(h.ino)  # a freed inode: errors.StaleHandle -> NFS3ERR_STALE
        if attr.generation != h.generation:
            raise Nfs3Error(t.NFS3ERR_STALE, f"inode {h.ino} generation {attr.generation}, handle {h.generation}")
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
        if rule.read_only:
            raise Nfs3Error(t.NFS3ERR_ROFS, f"export {rule.name} is read-only")

    # -- attributes ------------------------------------------------------------------------
    def fattr(self, rule, a: Attr):
        fsid = (self.server.handles.fsid + rule.id) & ((1 << 64) - 1)
        return t.fattr3.cls(a.type, a.mode & 0o7777, min(a.nlink, 0xFFFFFFFF), a.uid, a.gid, a.size,
                            (a.size + 4095) & ~4095, t.specdata3.cls((a.rdev >> 32) & 0xFFFFFFFF, a.rdev & 0xFFFFFFFF),
                            fsid, a.ino, _time(a.atime_ns), _time(a.mtime_ns), _time(a.ctime_ns))

    def post(self, rule, ino: int):
        """post_op_attr: the current attributes, or none when they cannot be had."""
        try:
            return self.fattr(rule, self.ns.getattr(ino))
        except Exception:  # noqa: BLE001 - attributes are optional here; the status says what happened
            return None

    @staticmethod
    def pre(a: Attr):
        return t.wcc_attr.cls(a.size, _time(a.mtime_ns), _time(a.ctime_ns))

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
    return name


# -- attributes ----------------------------------------------------------------------------------
@procedure(t.NFSPROC3_GETATTR)
def getattr_(cx: Call3, fh):
    node = cx.node(fh)
    return cx.fattr(node.rule, node.attr)


@procedure(t.NFSPROC3_SETATTR)
def setattr_(cx: Call3, a):
    node = cx.node(a.object)
    cx.need_writable(node.rule)
    if a.guard is not None and (a.guard.seconds, a.guard.nseconds) != tuple(_time(node.attr.ctime_ns)):
        raise Nfs3Error(t.NFS3ERR_NOT_SYNC, "ctime guard does not match")
    cx.apply_sattr(node.rule, node.attr.ino, a.new_attributes)
    return cx.wcc(node)


@procedure(t.NFSPROC3_ACCESS)
def access(cx: Call3, a):
    node = cx.node(a.object)
    attr = node.attr
    bits = cx.ns.access(cx.cred(node.rule), attr.ino, R_OK | W_OK | X_OK)
    is_dir = attr.type == DIR
    granted = 0
    if bits & R_OK:
        granted |= t.ACCESS3_READ
    if bits & X_OK:
        granted |= t.ACCESS3_LOOKUP if is_dir else t.ACCESS3_EXECUTE
    if bits & W_OK and not node.rule.read_only:
        granted |= t.ACCESS3_MODIFY | t.ACCESS3_EXTEND | (t.ACCESS3_DELETE if is_dir else 0)
    return t.ACCESS3resok.cls(cx.fattr(node.rule, attr), granted & a.access)


# -- lookup and reading ---------------------------------------------------------------------------------
@procedure(t.NFSPROC3_LOOKUP)
def lookup(cx: Call3, a):
    node = cx.dir_node(a.dir)
    name = check_name(a.name)
    if name == ".." and node.attr.ino == node.rule.root_ino:
        child = node.attr  # the export's root is the top of what this client sees
    else:
        child = cx.ns.lookup(cx.cred(node.rule), node.attr.ino, name)
    return t.LOOKUP3resok.cls(cx.fh(node.rule, child), cx.fattr(node.rule, child), cx.post(node.rule, node.attr.ino))


@procedure(t.NFSPROC3_READLINK)
def readlink(cx: Call3, fh):
    node = cx.node(fh)
    if node.attr.type != LNK:
        raise Nfs3Error(t.NFS3ERR_INVAL, f"inode {node.attr.ino} is not a symbolic link")
    return t.READLINK3resok.cls(cx.fattr(node.rule, node.attr), bytes(cx.ns.readlink(node.attr.ino)))


def _regular(node: Node3) -> None:
    if node.attr.type == DIR:
        raise Nfs3Error(t.NFS3ERR_ISDIR, f"inode {node.attr.ino} is a directory")
    if node.attr.type != REG:
        raise Nfs3Error(t.NFS3ERR_INVAL, f"inode {node.attr.ino} is not a regular file")


@procedure(t.NFSPROC3_READ)
def read(cx: Call3, a):
    node = cx.node(a.file)
    _regular(node)
    cred = cx.cred(node.rule)
    attr = node.attr
    # the owner may read what it created with a mode lacking r, and x implies reading (as knfsd)
    if cred.uid != attr.uid and not may(cred, attr, R_OK) and not may(cred, attr, X_OK):
        raise Nfs3Error(t.NFS3ERR_ACCES, f"uid {cred.uid} may not read inode {attr.ino}")
    data = cx.ns.read(attr.ino, a.offset, min(a.count, MAX_IO))
    cx.server.counters.read(len(data))
    eof = a.offset + len(data) >= attr.size
    return t.READ3resok.cls(cx.fattr(node.rule, attr), len(data), eof, data)


# -- writing -----------------------------------------------------------------------------------------------
@procedure(t.NFSPROC3_WRITE)
def write(cx: Call3, a):
    node = cx.node(a.file)
    cx.need_writable(node.rule)
    _regular(node)
    cred = cx.cred(node.rule)
    attr = node.attr
    # the owner writes even without w in the mode (a file created 0444 and filled by its creator)
    if cred.uid != attr.uid and not may(cred, attr, W_OK):
        raise Nfs3Error(t.NFS3ERR_ACCES, f"uid {cred.uid} may not write inode {attr.ino}")
    if a.count > len(a.data):
        raise Nfs3Error(t.NFS3ERR_INVAL, f"WRITE count {a.count} but {len(a.data)} bytes of data")
    if a.offset + a.count > MAX_FILE_SIZE:
        raise Nfs3Error(t.NFS3ERR_FBIG, f"write to offset {a.offset}+{a.count} exceeds the maximum file size")
    data = a.data[:a.count]
    stable = a.stable != t.UNSTABLE
    count = cx.ns.write(attr.ino, a.offset, data, stable=stable)
    cx.server.counters.write(count)
    return t.WRITE3resok.cls(cx.wcc(node), count, t.FILE_SYNC if stable else t.UNSTABLE,
                             cx.server.write_verifier)


@procedure(t.NFSPROC3_COMMIT)
def commit(cx: Call3, a):
    node = cx.node(a.file)
    _regular(node)
    cx.ns.commit(node.attr.ino)
    return t.COMMIT3resok.cls(cx.wcc(node), cx.server.write_verifier)


# -- creating -----------------------------------------------------------------------------------------------
def _verifier_ns(verf: bytes) -> int:
    """An EXCLUSIVE create's verifier kept as the file's mtime (the usual v3 trick)."""
    return int.from_bytes(verf[:4], "big") * NS + int.from_bytes(verf[4:], "big") % NS


def _created(cx: Call3, node: Node3, child: Attr):
    return t.CREATE3resok.cls(cx.fh(node.rule, child), cx.post(node.rule, child.ino), cx.wcc(node))


def _dir_for_change(cx: Call3, fh, name: str) -> Node3:
    node = cx.dir_node(fh)
    cx.need_writable(node.rule)
    check_name(name)
    return node


@procedure(t.NFSPROC3_CREATE)
def create(cx: Call3, a):
    node = _dir_for_change(cx, a.where.dir, a.where.name)
    cred = cx.cred(node.rule)
    mode, how = a.how
    name = a.where.name
    if mode == t.EXCLUSIVE:
        stamp = _verifier_ns(a.how[1])
        try:
            child = cx.ns.create(cred, node.attr.ino, name, 0o600, exclusive=True)
        except errors.Exists:
            child = cx.ns.lookup(cred, node.attr.ino, name)
            if child.type != REG or child.mtime_ns != stamp:
                raise
            return _created(cx, node, child)  # a retransmitted EXCLUSIVE create
        cx.ns.setattr(cred, child.ino, atime_ns=stamp, mtime_ns=stamp)
        return _created(cx, node, child)
    attrs = how
    perm = attrs.mode & 0o7777 if attrs.mode is not None else 0o644
    try:
        child = cx.ns.create(cred, node.attr.ino, name, perm, exclusive=True)
    except errors.Exists:
        if mode == t.GUARDED:
            raise
        child = cx.ns.lookup(cred, node.attr.ino, name)
        if child.type != REG:
            raise
        if attrs.size is not None:  # UNCHECKED on an existing file: only the size applies (truncate)
            cx.ns.setattr(cred, child.ino, size=attrs.size)
        return _created(cx, node, child)
    cx.apply_sattr(node.rule, child.ino, attrs, skip_mode=True)
    return _created(cx, node, child)


@procedure(t.NFSPROC3_MKDIR)
def mkdir(cx: Call3, a):
    node = _dir_for_change(cx, a.where.dir, a.where.name)
    attrs = a.attributes
    perm = attrs.mode & 0o7777 if attrs.mode is not None else 0o755
    child = cx.ns.mkdir(cx.cred(node.rule), node.attr.ino, a.where.name, perm)
    cx.apply_sattr(node.rule, child.ino, attrs, skip_mode=True)
    return _created(cx, node, child)


@procedure(t.NFSPROC3_SYMLINK)
def symlink(cx: Call3, a):
    node = _dir_for_change(cx, a.where.dir, a.where.name)
    target = a.symlink.symlink_data.encode("utf-8", "surrogateescape")
    child = cx.ns.symlink(cx.cred(node.rule), node.attr.ino, a.where.name, target)
    return _created(cx, node, child)


@procedure(t.NFSPROC3_MKNOD)
def mknod(cx: Call3, a):
    node = _dir_for_change(cx, a.where.dir, a.where.name)
    ftype, what = a.what
    if ftype in (t.NF3CHR, t.NF3BLK):
        attrs, rdev = what.dev_attributes, (what.spec.specdata1 << 32) | what.spec.specdata2
    elif ftype in (t.NF3SOCK, t.NF3FIFO):
        attrs, rdev = what, 0
    else:
        raise Nfs3Error(t.NFS3ERR_BADTYPE, f"MKNOD of type {ftype}: expected CHR, BLK, SOCK or FIFO")
    kind = {t.NF3CHR: CHR, t.NF3BLK: BLK, t.NF3SOCK: SOCK, t.NF3FIFO: FIFO}[ftype]
    perm = attrs.mode & 0o7777 if attrs.mode is not None else 0o644
    child = cx.ns.mknod(cx.cred(node.rule), node.attr.ino, a.where.name, kind, perm, rdev)
    cx.apply_sattr(node.rule, child.ino, attrs, skip_mode=True)
    return _created(cx, node, child)


# -- removing and renaming ---------------------------------------------------------------------------------------
@procedure(t.NFSPROC3_REMOVE)
def remove(cx: Call3, a):
    node = _dir_for_change(cx, a.dir, a.name)
    cx.ns.unlink(cx.cred(node.rule), node.attr.ino, a.name)
    return cx.wcc(node)


@procedure(t.NFSPROC3_RMDIR)
def rmdir(cx: Call3, a):
    node = _dir_for_change(cx, a.dir, a.name)
    cx.ns.rmdir(cx.cred(node.rule), node.attr.ino, a.name)
    return cx.wcc(node)


@procedure(t.NFSPROC3_RENAME)
def rename(cx: Call3, a):
    src = _dir_for_change(cx, a.from_.dir, a.from_.name)
    dst = _dir_for_change(cx, a.to.dir, a.to.name)
    if src.rule.id != dst.rule.id:
        raise Nfs3Error(t.NFS3ERR_XDEV, "rename across exports")
    cx.ns.rename(cx.cred(src.rule), src.attr.ino, a.from_.name, dst.attr.ino, a.to.name)
    return t.RENAME3res_body.cls(cx.wcc(src), cx.wcc(dst))


@procedure(t.NFSPROC3_LINK)
def link(cx: Call3, a):
    node = cx.node(a.file)
    dst = _dir_for_change(cx, a.link.dir, a.link.name)
    if node.rule.id != dst.rule.id:
        raise Nfs3Error(t.NFS3ERR_XDEV, "hard link across exports")
    cx.ns.link(cx.cred(dst.rule), node.attr.ino, dst.attr.ino, a.link.name)
    return t.LINK3res_body.cls(cx.post(node.rule, node.attr.ino), cx.wcc(dst))


# -- directories ------------------------------------------------------------------------------------------------
def _pad(n: int) -> int:
    return n + (-n) % 4


def _listing(cx: Call3, node: Node3, cookie: int, dircount: int, maxcount: int, plus: bool):
    """Entries after ``cookie`` that fit in the client's byte counts, and eof."""
    budget = maxcount - RESOK_OVERHEAD
    per_entry_min = 24 + (4 + FATTR3_SIZE + 4 + 4 + 48 if plus else 0)
    limit = max(1, min(READDIR_MAX_ENTRIES, budget // (per_entry_min + 8) + 1))
    entries, eof = cx.ns.readdir(cx.cred(node.rule), node.attr.ino, cookie, limit)
    out = []
    used = dir_used = 0
    for entry in entries:
        name_len = _pad(len(entry.name.encode("utf-8", "surrogateescape")))
        base = 4 + 8 + 4 + name_len + 8
        size = base
        if plus:
            fh = cx.fh(node.rule, entry.attr)
            size += 4 + FATTR3_SIZE + 4 + 4 + _pad(len(fh))
        if used + size > budget or (plus and dir_used + base > dircount and out):
            eof = False
            break
        used += size
        dir_used += base
        if plus:
            out.append(t.entryplus3.cls(entry.attr.ino, entry.name, entry.cookie,
                                        cx.fattr(node.rule, entry.attr), fh))
        else:
            out.append(t.entry3.cls(entry.attr.ino, entry.name, entry.cookie))
    if entries and not out:
        raise Nfs3Error(t.NFS3ERR_TOOSMALL, f"reply size {maxcount} holds no entry")
    return out, eof


@procedure(t.NFSPROC3_READDIR)
def readdir(cx: Call3, a):
    node = cx.dir_node(a.dir)
    out, eof = _listing(cx, node, a.cookie, a.count, a.count, plus=False)
    return t.READDIR3resok.cls(cx.fattr(node.rule, node.attr), COOKIEVERF, out, eof)


@procedure(t.NFSPROC3_READDIRPLUS)
def readdirplus(cx: Call3, a):
    node = cx.dir_node(a.dir)
    out, eof = _listing(cx, node, a.cookie, a.dircount, a.maxcount, plus=True)
    return t.READDIRPLUS3resok.cls(cx.fattr(node.rule, node.attr), COOKIEVERF, out, eof)


# -- file system --------------------------------------------------------------------------------------------------
@procedure(t.NFSPROC3_FSSTAT)
def fsstat(cx: Call3, fh):
    node = cx.node(fh)
    s = cx.server.statfs()
    return t.FSSTAT3resok.cls(cx.fattr(node.rule, node.attr), s.total_bytes, s.free_bytes, s.avail_bytes,
                              s.total_files, s.free_files, s.free_files, 0)


@procedure(t.NFSPROC3_FSINFO)
def fsinfo(cx: Call3, fh):
    node = cx.node(fh)
    return t.FSINFO3resok.cls(cx.fattr(node.rule, node.attr), MAX_IO, MAX_IO, 4096, MAX_IO, MAX_IO, 4096, 64 * 1024,
                              MAX_FILE_SIZE, t.nfstime3.cls(0, 1),
                              t.FSF3_LINK | t.FSF3_SYMLINK | t.FSF3_HOMOGENEOUS | t.FSF3_CANSETTIME)


@procedure(t.NFSPROC3_PATHCONF)
def pathconf(cx: Call3, fh):
    node = cx.node(fh)
    return t.PATHCONF3resok.cls(cx.fattr(node.rule, node.attr), 65000, 255, True, True, False, True)


# -- dispatch -------------------------------------------------------------------------------------------------------
def execute(server, rpc_cred, address: str, proc: int, args) -> list:
    """Run one NFSv3 procedure; returns the reply body chunks."""
    rtype, fail = t.RESULTS3[proc]
    cx = Call3(server, rpc_cred, address)
    name = t.PROC3_NAMES.get(proc, proc)
    server.counters.op(f"v3_{str(name).lower()}")
    try:
        value = HANDLERS3[proc](cx, args)
        status = t.NFS3_OK
    except Exception as exc:  # noqa: BLE001 - every failure becomes a status, never a dead connection
        status = status_of(exc)
        if status == t.NFS3ERR_SERVERFAULT:
            log.exception("NFSv3 %s failed", name)
        else:
            log.debug("NFSv3 %s: status %d: %s", name, status, exc)
        value = fail
    p = Packer()
    try:
        rtype.pack(p, (status, value))
    except XdrError:
        # a result that does not encode (a bug) still gets an answer: the client must not hang
        log.exception("NFSv3 %s: result does not encode", name)
        p = Packer()
        rtype.pack(p, (t.NFS3ERR_SERVERFAULT, fail))
    return p.result()


def decode_args(argtype, call, record, pos):
    """The procedure's arguments, or GARBAGE_ARGS when they do not decode exactly."""
    try:
        args, end = argtype.unpack(record, pos)
    except XdrError as exc:
        log.debug("garbage arguments for prog %d proc %d: %s", call.prog, call.proc, exc)
        raise RpcReject(accepted(call.xid, GARBAGE_ARGS)) from None
    if end != len(record):
        log.debug("prog %d proc %d: %d bytes after the arguments", call.prog, call.proc, len(record) - end)
        raise RpcReject(accepted(call.xid, GARBAGE_ARGS))
    return args


class Nfs3Program:
    versions = (t.NFS_V3,)

    def __init__(self, server):
        self.server = server

    def call(self, conn, call, cred, record, pos):
        argtype = t.ARGS3.get(call.proc)
        if argtype is None:
            raise RpcReject(accepted(call.xid, PROC_UNAVAIL))
        args = decode_args(argtype, call, record, pos)
        if call.proc == t.NFSPROC3_NULL:
            return []
        return InWorker(execute, self.server, cred, conn.peer[0], call.proc, args)


class VersionDispatch:
    """One RPC program answering several versions, each by its own program object."""

    def __init__(self, by_version: dict):
        self.by_version = by_version
        self.versions = tuple(sorted(by_version))

    def call(self, conn, call, cred, record, pos):
        started = time.perf_counter()
        counted = conn.server.counters.call_done
        try:
            result = self.by_version[call.vers].call(conn, call, cred, record, pos)
        except BaseException:
            counted(time.perf_counter() - started)
            raise
        if isinstance(result, InWorker):
            result.finished = lambda: counted(time.perf_counter() - started)  # in the worker, once done
        else:
            counted(time.perf_counter() - started)
        return result
