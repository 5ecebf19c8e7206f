"""File handle and metadata operations: PUTFH, PUTROOTFH, PUTPUBFH, GETFH,
SAVEFH, RESTOREFH, LOOKUP, LOOKUPP, GETATTR, SETATTR, VERIFY, NVERIFY, ACCESS,
CREATE, LINK, REMOVE, RENAME, READDIR, READLINK."""

from __future__ import annotations

from appliance.nfs import access as export_access
from appliance.nfs.exports import ExportRule, PseudoDir, pseudo_ino
from appliance.nfs.state import NfsError
from appliance.nfs.v4 import attrs as fattr
from appliance.nfs.v4 import const as c
from appliance.nfs.v4.attrs import AttrSubject
from appliance.nfs.v4.context import CODES, Node
from appliance.nfs.v4.ops.common import apply_attrs, check_component, cinfo, need_dir, resok
from appliance.nfs.v4.registry import operation
from appliance.nfs.v4.types import entry4
from engine.base import errors
from engine.base.blocking import WouldBlock, blocking_forbidden, holding
from engine.catalog.models import BLK, CHR, DIR, LNK

READDIR_BATCH = 512
# What SETATTR may set on the event loop (bitmap words): the namespace answers a mode or size that
# changes nothing from the cache; owner names may read /etc/passwd, and times always change
LOOP_SETTABLE = (1 << c.FATTR4_SIZE, 1 << (c.FATTR4_MODE - 32))
# attributes a write delegation's holder may have changed without telling (CB_GETATTR first)
HOLDER_WORD0 = 1 << c.FATTR4_CHANGE | 1 << c.FATTR4_SIZE
HOLDER_WORD1 = (
    1 << (c.FATTR4_SPACE_USED - 32)
    | 1 << (c.FATTR4_TIME_METADATA - 32)
    | 1 << (c.FATTR4_TIME_MODIFY - 32)
)


# -- file handles ------------------------------------------------------------------------
@operation(c.OP_PUTFH)
def putfh(cx, fh):
    cx.cur = cx.node_from_fh(fh)


@operation(c.OP_PUTROOTFH)
def putrootfh(cx, _):
    cx.cur = cx.root_node()


@operation(c.OP_PUTPUBFH)
def putpubfh(cx, _):
    cx.cur = cx.root_node()


@operation(c.OP_GETFH)
def getfh(cx, _):
    return cx.fh_of(cx.need_fh())


@operation(c.OP_SAVEFH)
def savefh(cx, _):
    cx.saved = cx.need_fh()
    cx.saved_stateid = cx.cur_stateid


@operation(c.OP_RESTOREFH)
def restorefh(cx, _):
    if cx.saved is None:
        raise NfsError(c.NFS4ERR_RESTOREFH, "no saved file handle")
    cx.cur = cx.saved
    cx.cur_stateid = cx.saved_stateid


# -- lookup -----------------------------------------------------------------------------------
def _pseudo_child(cx, node: PseudoDir, name: str) -> Node:
    child = cx.server.exports.visible(node, cx.address).get(name)
    if child is None:
        if name in node.children:
            raise NfsError(c.NFS4ERR_ACCESS, f"export {name!r} does not admit client {cx.address}")
        raise NfsError(c.NFS4ERR_NOENT, f"{name!r} is not exported")
    if isinstance(child, ExportRule):
        return cx.node_for_export(child)
    return Node(None, child.ino, 0, pseudo=child)


def _parent(cx, node: Node) -> Node:
    exports = cx.server.exports
    if node.pseudo is not None:
        if node.pseudo.parent is None:
            raise NfsError(c.NFS4ERR_NOENT, "the pseudo-root has no parent")
        parent = node.pseudo.parent
        return Node(None, parent.ino, 0, pseudo=parent)
    assert node.export is not None  # a node outside the pseudo-root is in an export
    if node.ino == node.export.root_ino:
        if not node.export.parts:
            raise NfsError(c.NFS4ERR_NOENT, "the root has no parent")
        parent = exports.pseudo_parent_of(node.export)
        return Node(None, parent.ino, 0, pseudo=parent)
    attr = cx.ns.parent(node.ino)
    export_access.need_inside(cx.server, node.export, attr, CODES)  # moved out meanwhile
    return Node(node.export, attr.ino, attr.generation)


@operation(c.OP_LOOKUP)
def lookup(cx, name):
    # no need_dir() here: namespace.lookup refuses a non-directory itself (one query less)
    node = cx.need_fh()
    # RFC 7530 16.13.5 (and RFC 8881 18.15.4) give "." and ".." no special meaning, but
    # nfs-rs (NFSv4.0 and 4.1) looks up "." for an export's root, and NFSv4.1's ".." is kept
    # as it was (a walk upwards, confined like LOOKUPP); no NFSv4.0 client sends ".."
    # (nfs-rs resolves it itself, the Linux client sends LOOKUPP): BADNAME, as a name
    if name == ".":
        need_dir(cx)
        return None
    if name == "..":
        need_dir(cx)
        if cx.minor == c.MINOR_VERSION_40:
            raise NfsError(c.NFS4ERR_BADNAME, '".." names nothing in NFSv4.0: LOOKUPP')
        cx.cur = _parent(cx, node)
        return None
    check_component(name)
    if node.pseudo is not None:
        cx.cur = _pseudo_child(cx, node.pseudo, name)
        return None
    try:
        attr = cx.ns.lookup(cx.cred(node), node.ino, name)
    except errors.NotADirectory:
        need_dir(cx)  # RFC 7530 16.13.5: SYMLINK from a symbolic link, NOTDIR from the rest
        raise
    cx.cur = Node(node.export, attr.ino, attr.generation)


@operation(c.OP_LOOKUPP)
def lookupp(cx, _):
    node = need_dir(cx)
    cx.cur = _parent(cx, node)


# -- attributes ---------------------------------------------------------------------------------
@operation(c.OP_GETATTR)
def getattr_(cx, words):
    fattr.check_readable(words)
    node = cx.need_fh()
    attr = None
    if node.pseudo is None and _asks_changes(words):
        delegations = cx.state.delegations
        holder = delegations.write_holder(node.ino, cx.client)
        if holder is not None:  # RFC 8881 10.4.3: the holder may have changed it
            if blocking_forbidden():
                raise WouldBlock("GETATTR of a file under another client's write delegation")
            attr = delegations.holder_attr(holder, cx.ns.getattr(node.ino))
        elif delegations.foreign_write(node.ino):  # through another head: CB_GETATTR there
            if blocking_forbidden():
                raise WouldBlock("GETATTR of a file under another head's write delegation")
            attr = delegations.foreign_holder_attr(cx.ns.getattr(node.ino), cx.client)
    return fattr.encode(words, cx.subject(node, attr))


def _asks_changes(words) -> bool:
    """Whether a GETATTR asks what a write delegation's holder may have changed."""
    return bool((words and words[0] & HOLDER_WORD0) or (len(words) > 1 and words[1] & HOLDER_WORD1))


def _check_size_stateid(cx, node, sid):
    sid = cx.stateid(sid)
    if cx.is_special(sid):
        return
    with holding(cx.state.lock, "state lock held"):  # SETATTR runs on the event loop too
        st = cx.state.find(sid, cx.need_client())
        if st.kind == "deleg":
            if not st.write or st.ino != node.ino:
                raise NfsError(c.NFS4ERR_OPENMODE, "a read delegation does not change the size")
            return
        open_st = st if st.kind == "open" else st.open
        if open_st.ino != node.ino:
            raise NfsError(c.NFS4ERR_BAD_STATEID, "stateid of another file")
        if not open_st.access & c.OPEN4_SHARE_ACCESS_WRITE:
            raise NfsError(c.NFS4ERR_OPENMODE, "file not open for writing")


def _loop_settable(mask) -> bool:
    """Whether a SETATTR of the attributes in ``mask`` may be tried on the event loop."""
    allowed = LOOP_SETTABLE + (0,) * max(len(mask) - len(LOOP_SETTABLE), 0)
    return not any(word & ~ok for word, ok in zip(mask, allowed, strict=False))


@operation(c.OP_SETATTR)
def setattr_(cx, a):
    node = cx.need_file()
    cx.need_writable(node)
    if blocking_forbidden() and not _loop_settable(a.obj_attributes.attrmask):
        raise WouldBlock("SETATTR of owners, times or ACLs")
    values = fattr.decode_settable(a.obj_attributes)
    if c.FATTR4_SIZE in values:
        _check_size_stateid(cx, node, a.stateid)
    cx.state.delegations.conflict(node.ino, cx.client)
    return fattr.to_bitmap(apply_attrs(cx, node, values))


def _same(cx, fattr4_value) -> bool:
    fattr.check_supported(fattr4_value.attrmask)
    if c.FATTR4_RDATTR_ERROR in fattr.from_bitmap(fattr4_value.attrmask):
        raise NfsError(c.NFS4ERR_INVAL, "rdattr_error cannot be verified")
    ours = fattr.encode_values(fattr4_value.attrmask, cx.subject(cx.need_fh()))
    return ours == bytes(fattr4_value.attr_vals)


@operation(c.OP_VERIFY)
def verify(cx, a):
    if not _same(cx, a):
        raise NfsError(c.NFS4ERR_NOT_SAME, "attributes differ")


@operation(c.OP_NVERIFY)
def nverify(cx, a):
    if _same(cx, a):
        raise NfsError(c.NFS4ERR_SAME, "attributes are the same")


@operation(c.OP_ACCESS)
def access(cx, want):
    node = cx.need_fh()
    if node.pseudo is not None:
        granted = want & (c.ACCESS4_READ | c.ACCESS4_LOOKUP)
        return resok(c.OP_ACCESS).cls(want & c.ACCESS4_ALL, granted)
    attr = cx.ns.getattr(node.ino)
    granted = export_access.granted_access(cx.ns, cx.cred(node), attr, node.export)
    is_dir = attr.type == DIR
    supported = c.ACCESS4_READ | c.ACCESS4_MODIFY | c.ACCESS4_EXTEND
    supported |= (c.ACCESS4_LOOKUP | c.ACCESS4_DELETE) if is_dir else c.ACCESS4_EXECUTE
    if cx.minor >= c.MINOR_VERSION_42:  # RFC 8276 8.4.1.3: reading and listing go with READ
        supported |= c.ACCESS4_XAREAD | c.ACCESS4_XAWRITE | c.ACCESS4_XALIST
        if granted & c.ACCESS4_READ:
            granted |= c.ACCESS4_XAREAD | c.ACCESS4_XALIST
        if granted & c.ACCESS4_MODIFY:
            granted |= c.ACCESS4_XAWRITE
    supported &= want
    return resok(c.OP_ACCESS).cls(supported, granted & supported)


# -- changes ---------------------------------------------------------------------------------------
def _dir_for_change(cx) -> Node:
    node = need_dir(cx)
    cx.need_writable(node)
    return node


@operation(c.OP_CREATE)
def create(cx, a):
    node = _dir_for_change(cx)
    name = check_component(a.objname)
    values = fattr.decode_settable(a.createattrs)
    mode = values.get(c.FATTR4_MODE, 0o755 if a.objtype[0] == DIR else 0o644) & 0o7777
    cred = cx.cred(node)
    before = cx.ns.getattr(node.ino).change
    kind, data = a.objtype
    if kind == DIR:
        attr = cx.ns.mkdir(cred, node.ino, name, mode)
    elif kind == LNK:
        attr = cx.ns.symlink(cred, node.ino, name, bytes(data))
    elif kind in (BLK, CHR):
        rdev = (data.specdata1 << 32) | data.specdata2
        attr = cx.ns.mknod(cred, node.ino, name, kind, mode, rdev)
    elif kind in (c.NF4SOCK, c.NF4FIFO):
        attr = cx.ns.mknod(cred, node.ino, name, kind, mode)
    else:
        raise NfsError(c.NFS4ERR_BADTYPE, f"CREATE of type {kind}")
    after = cx.ns.getattr(node.ino).change
    child = Node(node.export, attr.ino, attr.generation)
    done = apply_attrs(cx, child, values, skip=(c.FATTR4_MODE,) if kind != LNK else ())
    if c.FATTR4_MODE in values and kind != LNK:
        done = sorted(set(done) | {c.FATTR4_MODE})
    cx.cur = child
    return resok(c.OP_CREATE).cls(cinfo(before, after), fattr.to_bitmap(done))


@operation(c.OP_LINK)
def link(cx, newname):
    if cx.saved is None:
        raise NfsError(c.NFS4ERR_NOFILEHANDLE, "LINK needs a saved file handle (the source)")
    target_dir = _dir_for_change(cx)
    assert target_dir.export is not None  # _dir_for_change refuses the (read-only) pseudo-root
    source = cx.saved
    if source.pseudo is not None or source.export.id != target_dir.export.id:
        raise NfsError(c.NFS4ERR_XDEV, "link across exports")
    # RFC 7530 Table 9 gives LINK ISDIR, not the PERM the namespace's refusal would map to
    if cx.ns.getattr(source.ino).type == DIR:
        raise NfsError(c.NFS4ERR_ISDIR, f"hard link to directory {source.ino}")
    name = check_component(newname)
    cx.state.delegations.conflict(source.ino, cx.client)
    before = cx.ns.getattr(target_dir.ino).change
    cx.ns.link(cx.cred(target_dir), source.ino, target_dir.ino, name)
    return cinfo(before, cx.ns.getattr(target_dir.ino).change)


@operation(c.OP_REMOVE)
def remove(cx, target):
    node = _dir_for_change(cx)
    name = check_component(target)
    cred = cx.cred(node)
    before = cx.ns.getattr(node.ino).change
    victim = cx.ns.lookup(cred, node.ino, name)
    cx.state.delegations.conflict(victim.ino, cx.client)
    if victim.type == DIR:
        cx.ns.rmdir(cred, node.ino, name)
    else:
        cx.ns.unlink(cred, node.ino, name)
    return cinfo(before, cx.ns.getattr(node.ino).change)


@operation(c.OP_RENAME)
def rename(cx, a):
    if cx.saved is None:
        raise NfsError(
            c.NFS4ERR_NOFILEHANDLE, "RENAME needs a saved file handle (the source directory)"
        )
    dst = _dir_for_change(cx)
    assert dst.export is not None  # _dir_for_change refuses the (read-only) pseudo-root
    src = cx.saved
    if src.pseudo is not None or src.export.id != dst.export.id:
        raise NfsError(c.NFS4ERR_XDEV, "rename across exports")
    old, new = check_component(a.oldname), check_component(a.newname)
    _recall_named(cx, (src, old), (dst, new))
    sb, db = cx.ns.getattr(src.ino).change, cx.ns.getattr(dst.ino).change
    cx.ns.rename(cx.cred(dst), src.ino, old, dst.ino, new)
    sa, da = cx.ns.getattr(src.ino).change, cx.ns.getattr(dst.ino).change
    return resok(c.OP_RENAME).cls(cinfo(sb, sa), cinfo(db, da))


def _recall_named(cx, *entries) -> None:
    """Delegations of the files a RENAME moves or replaces are recalled first."""
    for node, name in entries:
        try:
            ino = cx.ns.lookup(cx.cred(node), node.ino, name).ino
        except errors.NotFound:
            continue  # the rename itself says what is missing
        cx.state.delegations.conflict(ino, cx.client)


@operation(c.OP_READLINK)
def readlink(cx, _):
    node = cx.need_file()
    attr = cx.ns.getattr(node.ino)
    if attr.type != LNK:
        raise NfsError(c.NFS4ERR_INVAL, "not a symbolic link")
    return cx.ns.readlink(node.ino)


# -- directories -----------------------------------------------------------------------------------
COOKIE_BASE = 3  # cookies 0, 1 and 2 are reserved by NFSv4
ENTRY_OVERHEAD = 8 + 4 + 4 + 4  # cookie, name length, bitmap count, attr length (+ "more" bool)
# maxcount bounds READDIR4resok (RFC 7530 16.24.4): the cookie verifier, the end of the entry
# list and eof, nothing more, so an entry that fits beside them is answered, not TOOSMALL
RESOK_OVERHEAD = 8 + 4 + 4


def _entry_size(name_len: int, fa) -> int:
    mask, vals = fa
    return ENTRY_OVERHEAD + 4 + ((name_len + 3) & ~3) + 4 * len(mask) + ((len(vals) + 3) & ~3)


@operation(c.OP_READDIR)
def readdir(cx, a):
    node = need_dir(cx)
    want = a.attr_request
    fattr.check_readable(want)
    budget = a.maxcount - RESOK_OVERHEAD
    if budget <= 0:
        raise NfsError(c.NFS4ERR_TOOSMALL, f"maxcount {a.maxcount} too small for any entry")
    dirbudget = a.dircount or (1 << 32)
    if a.cookie in (1, 2):
        raise NfsError(c.NFS4ERR_BAD_COOKIE, f"cookie {a.cookie} is reserved")
    entries = []
    used = dirused = 0
    eof = True
    if node.pseudo is not None:
        visible = sorted(cx.server.exports.visible(node.pseudo, cx.address).items())
        start = a.cookie - COOKIE_BASE + 1 if a.cookie else 0
        for index in range(start, len(visible)):
            name, child = visible[index]
            if isinstance(child, ExportRule):
                sub = cx.node_for_export(child)
            else:
                sub = Node(None, child.ino, 0, child)
            subject = cx.subject(sub)
            if isinstance(child, ExportRule):
                subject.mounted_on_fileid = pseudo_ino(child.parts)
            fa = fattr.encode(want, subject)
            size = _entry_size(len(name.encode()), fa)
            if used + size > budget:
                eof = False
                break
            entries.append(entry4.cls(index + COOKIE_BASE, name, fa))
            used += size
    else:
        cookie = a.cookie - COOKIE_BASE + 1 if a.cookie >= COOKIE_BASE else 0
        cred = cx.cred(node)
        with_fh = bool(want and want[0] & (1 << c.FATTR4_FILEHANDLE))
        holders = cx.state.delegations if _asks_changes(want) else None
        full = False
        while not full:
            batch, done = cx.ns.readdir(cred, node.ino, cookie, limit=READDIR_BATCH)
            for e in batch:
                attr = e.attr if holders is None else _as_holder_sees(cx, holders, e.attr)
                child = Node(node.export, attr.ino, attr.generation)
                subject = cx.subject(child, attr) if with_fh else _light_subject(cx, node, attr)
                fa = fattr.encode(want, subject)
                name_len = len(e.name.encode("utf-8", "surrogateescape"))
                size = _entry_size(name_len, fa)
                if used + size > budget or dirused + 8 + name_len > dirbudget:
                    full = True
                    eof = False
                    break
                # the namespace cookie is the dirent id; shift it past the reserved values
                entries.append(entry4.cls(e.cookie + COOKIE_BASE - 1, e.name, fa))
                used += size
                dirused += 8 + name_len
                cookie = e.cookie
            if done and not full:
                break
            if not batch:
                break
    if not entries and not eof:
        raise NfsError(c.NFS4ERR_TOOSMALL, f"maxcount {a.maxcount} cannot hold one entry")
    return resok(c.OP_READDIR).cls(b"\0" * 8, entries, eof)


def _as_holder_sees(cx, delegations, attr):
    """A READDIR entry's attributes as another client's write delegation's holder sees the
    file (CB_GETATTR, as for GETATTR: RFC 8881 10.4.3)."""
    holder = delegations.write_holder(attr.ino, cx.client)
    if holder is None and not delegations.foreign_write(attr.ino):
        return attr
    if blocking_forbidden():
        raise WouldBlock("READDIR of a file under another client's write delegation")
    if holder is None:  # another head's: CB_GETATTR through it (a recall when unanswered)
        return delegations.foreign_holder_attr(attr, cx.client)
    return delegations.holder_attr(holder, attr)


def _light_subject(cx, node: Node, attr):
    server = cx.server
    assert node.export is not None  # a node outside the pseudo-root is in an export
    return AttrSubject(
        attr,
        b"",
        (server.handles.fsid, node.export.id),
        attr.ino,
        server,
        minor=cx.minor,
        owner_names=cx.owner_names,
    )
