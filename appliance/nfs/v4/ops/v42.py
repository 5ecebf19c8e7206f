"""NFSv4.2's operations (RFC 7862) over the namespace's ranges: SEEK, ALLOCATE, DEALLOCATE,
READ_PLUS, CLONE, COPY inside the server (synchronous, or in the background with CB_OFFLOAD,
OFFLOAD_STATUS and OFFLOAD_CANCEL); and the extended attributes of
RFC 8276 (GETXATTR, SETXATTR, LISTXATTRS, REMOVEXATTR) over the namespace's xattrs, in their
"user." namespace. The executor answers these only in minor version 2 COMPOUNDs."""

from __future__ import annotations

from os import R_OK, W_OK

from appliance.nfs.onc.xdr import Packer
from appliance.nfs.state import NfsError
from appliance.nfs.v4 import attrs as fattr
from appliance.nfs.v4 import const as c
from appliance.nfs.v4 import offload
from appliance.nfs.v4.attrs import MAX_IO
from appliance.nfs.v4.context import Node
from appliance.nfs.v4.ops.common import cinfo, is_utf8, resok
from appliance.nfs.v4.ops.io import check_io_stateid
from appliance.nfs.v4.registry import operation
from appliance.nfs.v4.types import read_plus_content, write_response4, xattrkey4
from engine.base import errors
from engine.catalog.models import DIR, REG
from engine.namespace import XATTR_NAME_MAX, XATTR_VALUE_MAX

READ, WRITE = c.OPEN4_SHARE_ACCESS_READ, c.OPEN4_SHARE_ACCESS_WRITE
USER_PREFIX = "user."  # RFC 8276 3: the protocol carries user-namespace names without it
_data4, _hole4 = (
    read_plus_content.arms[c.NFS4_CONTENT_DATA],
    read_plus_content.arms[c.NFS4_CONTENT_HOLE],
)
_copy_requirements = resok(c.OP_COPY).fields[1][1]


def _regular(cx, node: Node):
    attr = cx.ns.getattr(node.ino)
    if attr.type == DIR:
        raise NfsError(c.NFS4ERR_ISDIR, "a directory has no byte ranges")
    if attr.type != REG:
        raise NfsError(c.NFS4ERR_WRONG_TYPE, f"file type {attr.type} has no byte ranges")
    return attr


def _end(offset: int, length: int) -> int:
    end = offset + length
    if end > fattr.MAX_FILE_SIZE:
        raise NfsError(c.NFS4ERR_FBIG, f"range ends past {fattr.MAX_FILE_SIZE}")
    return end


def _file_for_write(cx, sid) -> Node:
    node = cx.need_file()
    cx.need_writable(node)
    check_io_stateid(cx, node, sid, WRITE)
    _regular(cx, node)
    return node


# -- ranges -------------------------------------------------------------------------------------
@operation(c.OP_SEEK)
def seek(cx, a):
    node = cx.need_file()
    check_io_stateid(cx, node, a.stateid, READ)
    size = _regular(cx, node).size
    if a.what not in (c.NFS4_CONTENT_DATA, c.NFS4_CONTENT_HOLE):
        raise NfsError(c.NFS4ERR_UNION_NOTSUPP, f"seek for content {a.what}")
    if a.offset >= size:  # RFC 7862 15.11.3
        raise NfsError(c.NFS4ERR_NXIO, f"seek from {a.offset}: the file has {size} bytes")
    if a.what == c.NFS4_CONTENT_HOLE:
        found = cx.ns.seek_hole(node.ino, a.offset)
        return resok(c.OP_SEEK).cls(found >= size, found)
    try:
        return resok(c.OP_SEEK).cls(False, cx.ns.seek_data(node.ino, a.offset))
    except errors.NoSuchOffset:  # only holes up to the end: OK with sr_eof
        return resok(c.OP_SEEK).cls(True, size)


@operation(c.OP_ALLOCATE)
def allocate(cx, a):
    node = _file_for_write(cx, a.stateid)
    _end(a.offset, a.length)
    cx.ns.allocate(cx.cred(node), node.ino, a.offset, a.length)


@operation(c.OP_DEALLOCATE)
def deallocate(cx, a):
    node = _file_for_write(cx, a.stateid)
    _end(a.offset, a.length)
    cx.ns.deallocate(cx.cred(node), node.ino, a.offset, a.length)


def _segments(ns, ino: int, offset: int, end: int, size: int) -> list[tuple[str, int, int]]:
    """[offset, end) as ("data" | "hole", start, stop) pieces, end <= size."""
    pieces, pos = [], offset
    while pos < end:
        try:
            data = min(ns.seek_data(ino, pos), end)
        except errors.NoSuchOffset:
            data = end
        if data > pos:
            pieces.append(("hole", pos, data))
            pos = data
        if pos >= end:
            break
        hole = min(ns.seek_hole(ino, pos), end, size)
        pieces.append(("data", pos, hole))
        pos = hole
    return pieces


@operation(c.OP_READ_PLUS)
def read_plus(cx, a):
    node = cx.need_file()
    check_io_stateid(cx, node, a.stateid, READ)
    size = _regular(cx, node).size
    limit = cx.session.max_response - 1024 if cx.session is not None else MAX_IO
    count = min(a.count, limit, 4 * MAX_IO)
    if a.offset >= size or count == 0:
        return resok(c.OP_READ_PLUS).cls(a.offset >= size, [])
    end = min(a.offset + count, size)
    contents = []
    for kind, start, stop in _segments(cx.ns, node.ino, a.offset, end, size):
        if kind == "hole":
            contents.append((c.NFS4_CONTENT_HOLE, _hole4.cls(start, stop - start)))
        else:
            data = cx.ns.read(node.ino, start, stop - start)
            cx.server.counters.read(len(data), node.export.id)
            contents.append((c.NFS4_CONTENT_DATA, _data4.cls(start, data)))
    return resok(c.OP_READ_PLUS).cls(end >= size, contents)


def _source_and_destination(cx, src_sid, dst_sid) -> tuple[Node, Node]:
    """SAVED_FH is the source, CURRENT_FH the destination (RFC 7862 15.2, 15.13)."""
    if cx.saved is None:
        raise NfsError(c.NFS4ERR_NOFILEHANDLE, "no saved file handle (the source)")
    dst = _file_for_write(cx, dst_sid)
    src = cx.saved
    if src.pseudo is not None:
        raise NfsError(c.NFS4ERR_ISDIR, "the pseudo-root holds only directories")
    # nodes outside the pseudo-root are in an export
    assert src.export is not None and dst.export is not None
    if src.export.id != dst.export.id:
        raise NfsError(c.NFS4ERR_XDEV, "source and destination are in different exports")
    check_io_stateid(cx, src, src_sid, READ)
    _regular(cx, src)
    return src, dst


@operation(c.OP_CLONE)
def clone(cx, a):
    src, dst = _source_and_destination(cx, a.src_stateid, a.dst_stateid)
    _end(a.src_offset, a.count)
    _end(a.dst_offset, a.count)
    if (
        src.ino == dst.ino
        and a.count
        and (a.src_offset < a.dst_offset + a.count and a.dst_offset < a.src_offset + a.count)
    ):
        raise NfsError(c.NFS4ERR_INVAL, "overlapping ranges of one file")
    cx.ns.clone_range(cx.cred(dst), src.ino, a.src_offset, dst.ino, a.dst_offset, a.count)


@operation(c.OP_COPY)
def copy(cx, a):
    """Synchronous, or asynchronous when the client asks (ca_synchronous false) for at least
    offload.ASYNC_MIN bytes and can be told the result (appliance/nfs/v4/offload.py); RFC 7862
    15.2.3 lets the server do an asked-for asynchronous copy synchronously."""
    if a.source_server:
        raise NfsError(c.NFS4ERR_NOTSUPP, "inter-server COPY")
    src, dst = _source_and_destination(cx, a.src_stateid, a.dst_stateid)
    _end(a.dst_offset, a.count)
    size = cx.ns.getattr(src.ino).size
    if a.src_offset > size:
        raise NfsError(c.NFS4ERR_INVAL, f"source offset {a.src_offset} past its {size} bytes")
    if (
        src.ino == dst.ino
        and a.src_offset < a.dst_offset + max(a.count, 1)
        and a.dst_offset < a.src_offset + (a.count or size)
    ):
        raise NfsError(c.NFS4ERR_INVAL, "overlapping ranges of one file")
    assert dst.export is not None  # _source_and_destination took both files in one export
    wanted = max(min(a.count or size, size - a.src_offset), 0)  # short at the source's end
    if not a.synchronous and wanted >= offload.ASYNC_MIN:
        started = _copy_async(cx, src, dst, a, wanted)
        if started is not None:
            return resok(c.OP_COPY).cls(started, _copy_requirements.cls(True, False))
    count = 0
    if a.src_offset < size:
        count = cx.ns.copy_range(
            cx.cred(dst), src.ino, a.src_offset, dst.ino, a.dst_offset, a.count
        )
    cx.server.counters.write(count, dst.export.id)
    response = write_response4.cls([], count, c.FILE_SYNC4, cx.server.write_verifier)
    return resok(c.OP_COPY).cls(response, _copy_requirements.cls(True, True))


def _copy_async(cx, src: Node, dst: Node, a, count: int):
    """The write_response4 of a copy started in the background, or None when the client gets a
    synchronous one (no usable backchannel, or too many copies held)."""
    offloads = cx.server.offloads
    cl = cx.need_client()
    if not offloads.admit(cl):
        offloads.counts["synchronous"] += 1
        return None
    cred = cx.cred(dst)
    # what a synchronous COPY would be refused, refused now: the copier's own failures reach
    # the client only in CB_OFFLOAD
    if cx.ns.access(cred, src.ino, R_OK) != R_OK or cx.ns.access(cred, dst.ino, W_OK) != W_OK:
        raise NfsError(c.NFS4ERR_ACCESS, "COPY needs read on the source, write on the destination")
    with cx.state.lock:
        other = cx.state.new_other(cl)
    assert dst.export is not None  # _source_and_destination took both files in one export
    st = offload.CopyState(
        other,
        cl,
        cx.fh_of(dst),
        cred,
        dst.export.id,
        src.ino,
        a.src_offset,
        dst.ino,
        a.dst_offset,
        count,
    )
    offloads.start(st)
    # each piece is durable when it is counted: FILE_SYNC4 now and in CB_OFFLOAD
    return write_response4.cls([st.stateid], 0, c.FILE_SYNC4, cx.server.write_verifier)


@operation(c.OP_OFFLOAD_STATUS)
def offload_status(cx, sid):
    """The bytes copied so far; ``complete`` holds the copy's status once it ended."""
    node = cx.need_file()
    st = cx.server.offloads.find(sid, cx.need_client(), node.ino)
    done = [] if st.status is None else [st.status]
    return resok(c.OP_OFFLOAD_STATUS).cls(st.done, done)


@operation(c.OP_OFFLOAD_CANCEL)
def offload_cancel(cx, sid):
    node = cx.need_file()
    cx.server.offloads.cancel(sid, cx.need_client(), node.ino)


# -- extended attributes (RFC 8276) -------------------------------------------------------------
def _xattr_name(key: str) -> str:
    if not key:
        raise NfsError(c.NFS4ERR_INVAL, "empty extended attribute name")
    if not key.isascii() and not is_utf8(key):
        raise NfsError(c.NFS4ERR_INVAL, "extended attribute name is not UTF-8")
    name = USER_PREFIX + key
    if len(name.encode()) > XATTR_NAME_MAX:
        raise NfsError(c.NFS4ERR_NAMETOOLONG, f"extended attribute name of {len(key)} bytes")
    return name


def _xattr_node(cx, *, change: bool) -> Node:
    node = cx.need_fh()
    if change:
        cx.need_writable(node)
    elif node.pseudo is not None:
        raise NfsError(c.NFS4ERR_NOXATTR, "the pseudo-root has no extended attributes")
    return node


@operation(c.OP_GETXATTR)
def getxattr(cx, key):
    node = _xattr_node(cx, change=False)
    name = _xattr_name(key)
    try:
        return cx.ns.getxattr(cx.cred(node), node.ino, name)
    except errors.NoData as exc:
        raise NfsError(c.NFS4ERR_NOXATTR, str(exc)) from None


@operation(c.OP_SETXATTR)
def setxattr(cx, a):
    node = _xattr_node(cx, change=True)
    name = _xattr_name(a.key)
    if a.option > c.SETXATTR4_REPLACE:
        raise NfsError(c.NFS4ERR_INVAL, f"setxattr option {a.option}")
    if len(a.value) > XATTR_VALUE_MAX:
        raise NfsError(
            c.NFS4ERR_XATTR2BIG, f"value of {len(a.value)} bytes, at most {XATTR_VALUE_MAX}"
        )
    before = cx.ns.getattr(node.ino).change
    try:
        cx.ns.setxattr(
            cx.cred(node),
            node.ino,
            name,
            bytes(a.value),
            create=a.option == c.SETXATTR4_CREATE,
            replace_only=a.option == c.SETXATTR4_REPLACE,
        )
    except errors.NoData as exc:
        raise NfsError(c.NFS4ERR_NOXATTR, str(exc)) from None
    return cinfo(before, cx.ns.getattr(node.ino).change)


@operation(c.OP_REMOVEXATTR)
def removexattr(cx, key):
    node = _xattr_node(cx, change=True)
    name = _xattr_name(key)
    before = cx.ns.getattr(node.ino).change
    try:
        cx.ns.removexattr(cx.cred(node), node.ino, name)
    except errors.NoData as exc:
        raise NfsError(c.NFS4ERR_NOXATTR, str(exc)) from None
    return cinfo(before, cx.ns.getattr(node.ino).change)


_LIST_FIXED = 8 + 4 + 4  # lxr_cookie, the names' count, lxr_eof


@operation(c.OP_LISTXATTRS)
def listxattrs(cx, a):
    """The cookie is the index of the next name in the sorted list."""
    node = cx.need_fh()
    names = (
        []
        if node.pseudo is not None
        else [
            n[len(USER_PREFIX) :]
            for n in cx.ns.listxattr(cx.cred(node), node.ino)
            if n.startswith(USER_PREFIX) and len(n) > len(USER_PREFIX)
        ]
    )
    if a.cookie > len(names):
        raise NfsError(c.NFS4ERR_BAD_COOKIE, f"cookie {a.cookie} of {len(names)} names")
    out, used, index = [], _LIST_FIXED, a.cookie
    for name in names[a.cookie :]:
        p = Packer()
        xattrkey4.pack(p, name)
        if used + len(p) > a.maxcount:
            break
        out.append(name)
        used += len(p)
        index += 1
    eof = index == len(names)
    if not out and not eof or used > a.maxcount:
        raise NfsError(c.NFS4ERR_TOOSMALL, f"maxcount {a.maxcount} cannot hold one name")
    return resok(c.OP_LISTXATTRS).cls(index, out, eof)
