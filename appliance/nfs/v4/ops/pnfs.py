"""pNFS operations of the FILES layout (RFC 8881 12, 13, 18.40-18.44): LAYOUTGET,
GETDEVICEINFO, LAYOUTRETURN, LAYOUTCOMMIT. The head's role and the layout states are
appliance.nfs.pnfs.Pnfs (``cx.server.pnfs``); docs/pnfs.md says why the layout looks as it does.

The layout handed out: whole file (offset 0, length all ones: the only kind the Linux client
takes), sparse (every data server sees the file's own offsets under the metadata server's file
handle: they all write the one file of the shared namespace, so a dense packing per data server
would mean nothing), a stripe unit of a multiple of the default band class's stripe data size,
one device listing the data servers in order, each alone in its multipath list (the Linux
client would take extra addresses of one list as trunks of one server)."""

from __future__ import annotations

from appliance.nfs.pnfs import netaddr
from appliance.nfs.state import NfsError
from appliance.nfs.v4 import const as c
from appliance.nfs.v4.ops.common import resok
from appliance.nfs.v4.ops.io import need_io_rights, need_regular
from appliance.nfs.v4.registry import operation
from appliance.nfs.v4.types import (
    layout4,
    netaddr4,
    nfsv4_1_file_layout4,
    nfsv4_1_file_layout_ds_addr4,
    stateid4,
)

_LAYOUTGET_OK = resok(c.OP_LAYOUTGET)
_GETDEVICEINFO_OK = resok(c.OP_GETDEVICEINFO)
# what LAYOUTGET4resok adds around the layout body: return_on_close, stateid, the array's
# count and one layout4's offset, length, iomode, type and body length
_LAYOUTGET_OVERHEAD = 4 + 16 + 4 + 8 + 8 + 4 + 4 + 4
_GETDEVICEINFO_OVERHEAD = 4 + 4 + 4  # layout type, body length, an empty notification bitmap


def _check_layout_type(layout_type: int) -> None:
    if layout_type != c.LAYOUT4_NFSV4_1_FILES:
        raise NfsError(
            c.NFS4ERR_UNKNOWN_LAYOUTTYPE,
            f"layout type {layout_type}: only LAYOUT4_NFSV4_1_FILES (1) is served",
        )


def _check_range(offset: int, length: int, what: str) -> None:
    if length == 0:
        raise NfsError(c.NFS4ERR_INVAL, f"{what} of length 0")
    if length != c.NFS4_UINT64_MAX and offset + length > c.NFS4_UINT64_MAX:
        raise NfsError(c.NFS4ERR_INVAL, f"{what} offset {offset} + length {length} past 2^64")


def _layout_body(cx, node, pnfs) -> bytes:
    device_id, serving = pnfs.device  # one snapshot: the list can change under a heartbeat
    if not serving:
        raise NfsError(
            c.NFS4ERR_LAYOUTUNAVAILABLE, "no data server is up: I/O goes through this server"
        )
    return nfsv4_1_file_layout4.encode(
        nfsv4_1_file_layout4.cls(
            device_id,
            pnfs.stripe_unit,  # sparse, no commit through the metadata server: no flag bits
            pnfs.first_stripe_index(node.ino, len(serving)),
            0,
            [cx.fh_of(node)],  # one handle for every data server: the file itself
        )
    )


@operation(c.OP_LAYOUTGET)
def layoutget(cx, a):
    cl = cx.need_client()
    node = cx.need_file()
    pnfs = cx.server.pnfs
    _check_layout_type(a.layout_type)
    if a.iomode not in (c.LAYOUTIOMODE4_READ, c.LAYOUTIOMODE4_RW):
        raise NfsError(c.NFS4ERR_BADIOMODE, f"LAYOUTGET iomode {a.iomode}: expected READ or RW")
    _check_range(a.offset, a.length, "LAYOUTGET")
    if a.minlength > a.length:
        raise NfsError(c.NFS4ERR_INVAL, f"minlength {a.minlength} above length {a.length}")
    need_regular(cx, cx.ns.getattr(node.ino), "LAYOUTGET")
    if not pnfs.is_mds:
        raise NfsError(c.NFS4ERR_LAYOUTUNAVAILABLE, "this head is no pNFS metadata server")
    want = (
        c.OPEN4_SHARE_ACCESS_WRITE if a.iomode == c.LAYOUTIOMODE4_RW else c.OPEN4_SHARE_ACCESS_READ
    )
    if want == c.OPEN4_SHARE_ACCESS_WRITE:
        cx.need_writable(node)
    need_io_rights(cx, node, want)
    sid = cx.stateid(a.stateid)
    if pnfs.is_layout_stateid(sid.other):
        layout = pnfs.grant(cl.clientid, node.ino, sid.other)
    else:
        _check_open_stateid(cx, cl, node, sid)
        layout = pnfs.grant(cl.clientid, node.ino, None)
    body = _layout_body(cx, node, pnfs)
    needed = _LAYOUTGET_OVERHEAD + len(body) + (-len(body) % 4)
    if needed > a.maxcount:
        raise NfsError(c.NFS4ERR_TOOSMALL, f"a layout takes {needed} bytes, maxcount {a.maxcount}")
    content = layout4.cls(0, c.NFS4_UINT64_MAX, a.iomode, (c.LAYOUT4_NFSV4_1_FILES, body))
    # layouts are hints any data server serves: nothing to give back at close, no recall
    return _LAYOUTGET_OK.cls(False, stateid4.cls(layout.seqid, layout.other), [content])


def _check_open_stateid(cx, cl, node, sid) -> None:
    """A first LAYOUTGET names an open, lock or delegation stateid of the file (RFC 8881
    12.5.3); a special stateid names none."""
    if cx.is_special(sid):
        raise NfsError(c.NFS4ERR_BAD_STATEID, "LAYOUTGET needs an open, lock or layout stateid")
    with cx.state.lock:
        st = cx.state.find(sid, cl)
        if st.ino != node.ino:
            raise NfsError(c.NFS4ERR_BAD_STATEID, "stateid of another file")


@operation(c.OP_GETDEVICEINFO)
def getdeviceinfo(cx, a):
    cx.need_client()
    pnfs = cx.server.pnfs
    _check_layout_type(a.layout_type)
    device_id, serving = pnfs.device
    if not pnfs.is_mds or bytes(a.device_id) != device_id:
        # RFC 8881 18.40.3: an unknown device id; also one of an older list of data servers
        raise NfsError(c.NFS4ERR_NOENT, f"no device {bytes(a.device_id).hex()}")
    body = nfsv4_1_file_layout_ds_addr4.encode(
        nfsv4_1_file_layout_ds_addr4.cls(
            list(range(len(serving))),
            [[netaddr4.cls(*netaddr(host, port))] for host, port in serving],
        )
    )
    needed = _GETDEVICEINFO_OVERHEAD + len(body) + (-len(body) % 4)
    if needed > a.maxcount:
        raise NfsError(
            c.NFS4ERR_TOOSMALL, f"the device takes {needed} bytes, maxcount {a.maxcount}", needed
        )
    # no notifications: a changed list is a new device id (docs/pnfs.md)
    return _GETDEVICEINFO_OK.cls((c.LAYOUT4_NFSV4_1_FILES, body), [])


@operation(c.OP_LAYOUTRETURN)
def layoutreturn(cx, a):
    cl = cx.need_client()
    pnfs = cx.server.pnfs
    _check_layout_type(a.layout_type)
    if a.iomode not in (c.LAYOUTIOMODE4_READ, c.LAYOUTIOMODE4_RW, c.LAYOUTIOMODE4_ANY):
        raise NfsError(c.NFS4ERR_INVAL, f"LAYOUTRETURN iomode {a.iomode}")
    kind, arg = a.layoutreturn
    if kind in (c.LAYOUTRETURN4_FSID, c.LAYOUTRETURN4_ALL):
        if kind == c.LAYOUTRETURN4_FSID:
            cx.need_fh()
        pnfs.give_back_all(cl.clientid)
        return (False, None)
    if kind != c.LAYOUTRETURN4_FILE:
        raise NfsError(c.NFS4ERR_INVAL, f"layoutreturn type {kind}")
    node = cx.need_file()
    _check_range(arg.offset, arg.length, "LAYOUTRETURN")
    sid = cx.stateid(arg.stateid)
    if not pnfs.is_layout_stateid(sid.other):
        raise NfsError(c.NFS4ERR_BAD_STATEID, "LAYOUTRETURN names no layout stateid")
    layout = pnfs.find(sid.other, cl.clientid, node.ino)
    # every layout is whole-file: a return of any part of it ends the client's layout of the
    # file (the Linux client returns whole files); a later LAYOUTGET starts a new one
    pnfs.give_back(layout)
    return (False, None)


@operation(c.OP_LAYOUTCOMMIT)
def layoutcommit(cx, a):
    cl = cx.need_client()
    node = cx.need_file()
    pnfs = cx.server.pnfs
    _check_layout_type(a.layoutupdate.type)
    _check_range(a.offset, a.length, "LAYOUTCOMMIT")
    sid = cx.stateid(a.stateid)
    if not pnfs.is_layout_stateid(sid.other):
        raise NfsError(c.NFS4ERR_BAD_STATEID, "LAYOUTCOMMIT names no layout stateid")
    pnfs.find(sid.other, cl.clientid, node.ino)
    cx.need_writable(node)
    need_io_rights(cx, node, c.OPEN4_SHARE_ACCESS_WRITE)
    # the data servers wrote FILE_SYNC through the shared data path and recorded size and mtime
    # with the data: all a commit may still do is grow the size to the last byte written
    attr = cx.ns.getattr(node.ino)
    has_offset, last = a.last_write_offset
    if has_offset and last + 1 > attr.size:
        attr = cx.ns.setattr(cx.cred(node), node.ino, size=last + 1)
        return (True, attr.size)
    return (False, None)
