"""NFSv3 (RFC 1813) procedures over the namespace API, sharing the NFSv4.1 server's
exports, file handles (a v3 handle works in v4 and back) and write verifier.

Each procedure is a handler registered with ``@procedure(NFSPROC3_X)``: it gets
a ``Call3`` context and the arguments decoded from their declared XDR type
(types.ARGS3), returns the resok value, or raises ``Nfs3Error`` / an
engine.base.errors exception, which becomes the NFS3ERR_* status with the
procedure's resfail value (appliance.nfs.v3.program). Calls run in the server's
worker threads."""

from __future__ import annotations

from collections.abc import Callable

from appliance.nfs import access as export_access
from appliance.nfs.v3 import types as t
from appliance.nfs.v3.context import (
    CODES,
    COOKIEVERF,
    FATTR3_SIZE,
    MAX_FILE_SIZE,
    MAX_IO,
    NS,
    READDIR_MAX_ENTRIES,
    RESOK_OVERHEAD,
    Call3,
    Nfs3Error,
    Node3,
    check_name,
    nfstime,
)
from engine.base import errors
from engine.catalog.models import BLK, CHR, DIR, FIFO, LNK, REG, SOCK
from engine.namespace import R_OK, W_OK, X_OK, Attr, may

HANDLERS3: dict[int, Callable] = {}


def procedure(proc: int) -> Callable[[Callable], Callable]:
    def register(fn: Callable) -> Callable:
        HANDLERS3[proc] = fn
        return fn

    return register


# -- attributes ----------------------------------------------------------------------------------
@procedure(t.NFSPROC3_GETATTR)
def getattr_(cx: Call3, fh):
    node = cx.node(fh)
    return cx.fattr(node.rule, cx.holder_attr(node.attr))


@procedure(t.NFSPROC3_SETATTR)
def setattr_(cx: Call3, a):
    node = cx.node(a.object)
    cx.need_writable(node.rule)
    guard = a.guard
    if guard is not None and (guard.seconds, guard.nseconds) != tuple(nfstime(node.attr.ctime_ns)):
        raise Nfs3Error(t.NFS3ERR_NOT_SYNC, "ctime guard does not match")
    cx.recall_first(None, node.attr.ino)
    cx.apply_sattr(node.rule, node.attr.ino, a.new_attributes)
    return cx.wcc(node)


@procedure(t.NFSPROC3_ACCESS)
def access(cx: Call3, a):
    node = cx.node(a.object)
    attr = node.attr
    granted = export_access.granted_access(cx.ns, cx.cred(node.rule), attr, node.rule)
    return t.ACCESS3resok.cls(cx.post_op(node.rule, attr), granted & a.access)


# -- lookup and reading ----------------------------------------------------------------------------
@procedure(t.NFSPROC3_LOOKUP)
def lookup(cx: Call3, a):
    node = cx.dir_node(a.dir)
    name = check_name(a.name)
    if name == ".." and node.attr.ino == node.rule.root_ino:
        child = node.attr  # the export's root is the top of what this client sees
    else:
        child = cx.ns.lookup(cx.cred(node.rule), node.attr.ino, name)
        if name == "..":  # the directory was moved out of the export since it was inside
            export_access.need_inside(cx.server, node.rule, child, CODES)
    return t.LOOKUP3resok.cls(
        cx.fh(node.rule, child), cx.post_op(node.rule, child), cx.post(node.rule, node.attr.ino)
    )


@procedure(t.NFSPROC3_READLINK)
def readlink(cx: Call3, fh):
    node = cx.node(fh)
    if node.attr.type != LNK:
        raise Nfs3Error(t.NFS3ERR_INVAL, f"inode {node.attr.ino} is not a symbolic link")
    return t.READLINK3resok.cls(
        cx.fattr(node.rule, node.attr), bytes(cx.ns.readlink(node.attr.ino))
    )


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
    cx.recall_first(None, attr.ino, write=False)  # a write delegation's data is the holder's
    data = cx.ns.read(attr.ino, a.offset, min(a.count, MAX_IO))
    cx.server.counters.read(len(data), node.rule.id)
    eof = a.offset + len(data) >= attr.size
    return t.READ3resok.cls(cx.post_op(node.rule, attr), len(data), eof, data)


# -- writing ---------------------------------------------------------------------------------------
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
        raise Nfs3Error(
            t.NFS3ERR_FBIG, f"write to offset {a.offset}+{a.count} exceeds the maximum file size"
        )
    data = a.data[: a.count]
    cx.recall_first(None, attr.ino)
    stable = a.stable != t.UNSTABLE
    verifier = cx.server.write_verifier  # before: bytes let go after it change the verifier
    count = cx.ns.write(attr.ino, a.offset, data, stable=stable)
    cx.server.counters.write(count, node.rule.id)
    return t.WRITE3resok.cls(cx.wcc(node), count, t.FILE_SYNC if stable else t.UNSTABLE, verifier)


@procedure(t.NFSPROC3_COMMIT)
def commit(cx: Call3, a):
    node = cx.node(a.file)
    _regular(node)
    cx.ns.commit(node.attr.ino)
    return t.COMMIT3resok.cls(cx.wcc(node), cx.server.write_verifier)


# -- creating --------------------------------------------------------------------------------------
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
        # UNCHECKED on an existing file: only the size applies (truncate)
        if attrs.size is not None:
            if attrs.size > MAX_FILE_SIZE:
                raise Nfs3Error(
                    t.NFS3ERR_FBIG, f"size {attrs.size}: at most {MAX_FILE_SIZE}"
                ) from None
            cx.recall_first(None, child.ino)
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
        raise Nfs3Error(
            t.NFS3ERR_BADTYPE, f"MKNOD of type {ftype}: expected CHR, BLK, SOCK or FIFO"
        )
    kind = {t.NF3CHR: CHR, t.NF3BLK: BLK, t.NF3SOCK: SOCK, t.NF3FIFO: FIFO}[ftype]
    perm = attrs.mode & 0o7777 if attrs.mode is not None else 0o644
    child = cx.ns.mknod(cx.cred(node.rule), node.attr.ino, a.where.name, kind, perm, rdev)
    cx.apply_sattr(node.rule, child.ino, attrs, skip_mode=True)
    return _created(cx, node, child)


# -- removing and renaming -------------------------------------------------------------------------
@procedure(t.NFSPROC3_REMOVE)
def remove(cx: Call3, a):
    node = _dir_for_change(cx, a.dir, a.name)
    cx.recall_first(node.attr.ino, a.name)
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
    cx.recall_first(src.attr.ino, a.from_.name)
    cx.recall_first(dst.attr.ino, a.to.name)
    cx.ns.rename(cx.cred(src.rule), src.attr.ino, a.from_.name, dst.attr.ino, a.to.name)
    return t.RENAME3res_body.cls(cx.wcc(src), cx.wcc(dst))


@procedure(t.NFSPROC3_LINK)
def link(cx: Call3, a):
    node = cx.node(a.file)
    dst = _dir_for_change(cx, a.link.dir, a.link.name)
    if node.rule.id != dst.rule.id:
        raise Nfs3Error(t.NFS3ERR_XDEV, "hard link across exports")
    cx.recall_first(None, node.attr.ino)
    cx.ns.link(cx.cred(dst.rule), node.attr.ino, dst.attr.ino, a.link.name)
    return t.LINK3res_body.cls(cx.post(node.rule, node.attr.ino), cx.wcc(dst))


# -- directories -----------------------------------------------------------------------------------
def _pad(n: int) -> int:
    return n + (-n) % 4


def _listing(cx: Call3, node: Node3, cookie: int, dircount: int, maxcount: int, plus: bool):
    """Entries after ``cookie`` that fit in the client's byte counts, and eof."""
    budget = maxcount - RESOK_OVERHEAD
    per_entry_min = 24 + (4 + FATTR3_SIZE + 4 + 4 + 48 if plus else 0)
    limit = max(1, min(READDIR_MAX_ENTRIES, budget // (per_entry_min + 8) + 1))
    entries, eof = cx.ns.readdir(cx.cred(node.rule), node.attr.ino, cookie, limit)
    out: list = []
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
            out.append(
                t.entryplus3.cls(
                    entry.attr.ino, entry.name, entry.cookie, cx.post_op(node.rule, entry.attr), fh
                )
            )
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


# -- file system -----------------------------------------------------------------------------------
@procedure(t.NFSPROC3_FSSTAT)
def fsstat(cx: Call3, fh):
    node = cx.node(fh)
    s = cx.server.statfs()
    return t.FSSTAT3resok.cls(
        cx.fattr(node.rule, node.attr),
        s.total_bytes,
        s.free_bytes,
        s.avail_bytes,
        s.total_files,
        s.free_files,
        s.free_files,
        0,
    )


@procedure(t.NFSPROC3_FSINFO)
def fsinfo(cx: Call3, fh):
    node = cx.node(fh)
    return t.FSINFO3resok.cls(
        cx.fattr(node.rule, node.attr),
        MAX_IO,
        MAX_IO,
        4096,
        MAX_IO,
        MAX_IO,
        4096,
        64 * 1024,
        MAX_FILE_SIZE,
        t.nfstime3.cls(0, 1),
        t.FSF3_LINK | t.FSF3_SYMLINK | t.FSF3_HOMOGENEOUS | t.FSF3_CANSETTIME,
    )


@procedure(t.NFSPROC3_PATHCONF)
def pathconf(cx: Call3, fh):
    node = cx.node(fh)
    return t.PATHCONF3resok.cls(cx.fattr(node.rule, node.attr), 65000, 255, True, True, False, True)
