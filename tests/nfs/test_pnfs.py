"""pNFS FILES layout by raw requests (appliance/nfs/v4/ops/pnfs.py, docs/pnfs.md): a metadata
server and a data server (two NFS servers of one process over one namespace, as two heads over
one catalog), the layout and device they describe, I/O through the data server under the
metadata server's stateid, and every bad request answered with its own error (never
SERVERFAULT)."""

from __future__ import annotations

import struct
import time

import pytest
from nfs4_rawclient import RawClient, stateid
from nfs4_support import start_server

from appliance.nfs.onc.xdr import Array, UInt
from appliance.nfs.pnfs import MEMBERSHIP_KEY, Pnfs
from appliance.nfs.v4 import attrs as fattr
from appliance.nfs.v4 import const as c
from appliance.nfs.v4 import types as t

UNIT = 512 * 1024  # the test stack's stripe: 8 x 64 KiB
ALL = c.NFS4_UINT64_MAX


@pytest.fixture
def heads(stack, server):
    """(metadata server, data server, the data server's Pnfs) on one namespace, beside
    ``server``, a head without pNFS (whose fixture adds the export)."""
    ds_pnfs = Pnfs("ds", stripe_unit=UNIT)
    ds = start_server(stack, pnfs=ds_pnfs, head_index=1)
    ds_pnfs.address = ("127.0.0.1", ds.port)
    # the second data server: an IPv6 one (no head serves it; its address is listed)
    mds_pnfs = Pnfs("mds", [("127.0.0.1", ds.port), ("fd00::2", 2049)], stripe_unit=UNIT)
    mds_pnfs.publish(stack.catalog)
    mds = start_server(stack, pnfs=mds_pnfs, head_index=0)
    yield mds, ds, ds_pnfs
    mds.stop()
    ds.stop()


def _exchange_id(port: int):
    client = RawClient(port)
    try:
        st, res = client.compound(
            [
                (
                    c.OP_EXCHANGE_ID,
                    t.ARGS[c.OP_EXCHANGE_ID](b"v" * 8, b"flags", 0, (c.SP4_NONE, None), []),
                )
            ]
        )
        assert st == 0
        return res[0][2]
    finally:
        client.close()


def _layoutget(client, fh, sid, *, layout_type=c.LAYOUT4_NFSV4_1_FILES, iomode=None, **kw):
    args = t.ARGS[c.OP_LAYOUTGET](
        False,
        layout_type,
        iomode or c.LAYOUTIOMODE4_RW,
        kw.get("offset", 0),
        kw.get("length", ALL),
        kw.get("minlength", 0),
        sid,
        kw.get("maxcount", 4096),
    )
    return client.session([(c.OP_PUTFH, fh), (c.OP_LAYOUTGET, args)])


def _getdeviceinfo(client, device_id, *, layout_type=c.LAYOUT4_NFSV4_1_FILES, maxcount=4096):
    args = t.ARGS[c.OP_GETDEVICEINFO](device_id, layout_type, maxcount, [])
    return client.session([(c.OP_GETDEVICEINFO, args)])


def test_roles_in_exchange_id_and_attributes(heads, server):
    mds, ds, _ = heads
    mds_flags = _exchange_id(mds.port).flags
    assert mds_flags & c.EXCHGID4_FLAG_USE_PNFS_MDS
    assert not mds_flags & c.EXCHGID4_FLAG_USE_NON_PNFS  # the Linux client refuses both
    ds_flags = _exchange_id(ds.port).flags
    assert ds_flags & c.EXCHGID4_FLAG_USE_PNFS_DS and ds_flags & c.EXCHGID4_FLAG_USE_NON_PNFS
    plain = _exchange_id(server.port).flags  # a head without [pnfs]
    # one scope (the same namespace and handles), an owner per head (each its own state)
    owners = {port: _exchange_id(port) for port in (mds.port, ds.port)}
    assert owners[mds.port].server_scope == owners[ds.port].server_scope
    assert owners[mds.port].server_owner_major != owners[ds.port].server_owner_major
    assert plain & c.EXCHGID4_FLAG_MASK_A == c.EXCHGID4_FLAG_USE_NON_PNFS

    for port, types in ((mds.port, [c.LAYOUT4_NFSV4_1_FILES]), (ds.port, [])):
        client = RawClient(port).setup()
        try:
            words = fattr.to_bitmap([c.FATTR4_FS_LAYOUT_TYPES])
            st, res = client.session([(c.OP_PUTFH, client.root_fh()), (c.OP_GETATTR, words)])
            assert st == 0
            assert Array(UInt).decode(res[-1][2].attr_vals) == types
            words = fattr.to_bitmap([c.FATTR4_LAYOUT_BLKSIZE])
            st, res = client.session([(c.OP_PUTFH, client.root_fh()), (c.OP_GETATTR, words)])
            assert UInt.decode(res[-1][2].attr_vals) == UNIT
        finally:
            client.close()


def test_layout_device_and_io_through_the_data_server(heads, stack):
    mds, ds, ds_pnfs = heads
    client = RawClient(mds.port).setup()
    try:
        fh, open_sid = client.open_new("striped")
        st, res = _layoutget(client, fh, open_sid)
        assert st == 0, res
        got = res[-1][2]
        assert not got.return_on_close
        (layout,) = got.layout
        assert (layout.offset, layout.length, layout.iomode) == (0, ALL, c.LAYOUTIOMODE4_RW)
        kind, body = layout.content
        assert kind == c.LAYOUT4_NFSV4_1_FILES
        files = t.nfsv4_1_file_layout4.decode(body)
        assert files.util == UNIT  # sparse, no commit through the metadata server
        assert files.util % (8 * 64 * 1024) == 0
        assert files.fh_list == [fh]
        assert files.pattern_offset == 0 and files.first_stripe_index < 2
        # a second LAYOUTGET under the layout stateid moves its seqid on
        st, res = _layoutget(client, fh, got.stateid)
        assert st == 0 and res[-1][2].stateid.seqid == got.stateid.seqid + 1
        assert res[-1][2].stateid.other == got.stateid.other

        st, res = _getdeviceinfo(client, bytes(files.deviceid))
        assert st == 0, res
        kind, body = res[-1][2].device_addr
        device = t.nfsv4_1_file_layout_ds_addr4.decode(body)
        assert device.stripe_indices == [0, 1]
        hi, lo = ds.port >> 8, ds.port & 0xFF
        assert [[(a.netid, a.addr) for a in path] for path in device.multipath_ds_list] == [
            [("tcp", f"127.0.0.1.{hi}.{lo}")],
            [("tcp6", "fd00::2.8.1")],  # RFC 5665: netid tcp6, the IPv6 text and .p1.p2
        ]

        # the data server takes the metadata server's open stateid: FILE_SYNC, and the size
        # and mtime the metadata server reads are the data server's
        data = bytes(range(256)) * 4096  # 1 MiB: two stripe units
        dsc = RawClient(ds.port).setup()
        try:
            st, res = dsc.session(
                [(c.OP_PUTFH, fh), (c.OP_WRITE, t.ARGS[c.OP_WRITE](open_sid, 0, c.UNSTABLE4, data))]
            )
            assert st == 0, res
            assert res[-1][2].committed == c.FILE_SYNC4
            st, res = dsc.session(
                [(c.OP_PUTFH, fh), (c.OP_READ, t.ARGS[c.OP_READ](open_sid, 4096, 8192))]
            )
            assert st == 0 and res[-1][2].data == data[4096 : 4096 + 8192]
            words = fattr.to_bitmap([c.FATTR4_SIZE])
            st, res = client.session([(c.OP_PUTFH, fh), (c.OP_GETATTR, words)])
            assert struct.unpack(">Q", res[-1][2].attr_vals)[0] == len(data)

            # out of the published list: the client's layout is old
            stack.catalog.set_setting(
                MEMBERSHIP_KEY, '{"generation": 9, "data_servers": ["127.0.0.2:2049"]}'
            )
            ds_pnfs._member = None  # noqa: SLF001 - skip the 2 s the data server trusts its view
            st, res = dsc.session(
                [(c.OP_PUTFH, fh), (c.OP_READ, t.ARGS[c.OP_READ](open_sid, 0, 10))]
            )
            assert st == c.NFS4ERR_PNFS_NO_LAYOUT
            # a stateid the data server issued itself still works (an ordinary client of it)
            own_fh, own_sid = dsc.open_new("own")
            st, res = dsc.session(
                [(c.OP_PUTFH, own_fh), (c.OP_WRITE, t.ARGS[c.OP_WRITE](own_sid, 0, 0, b"x"))]
            )
            assert st == 0 and res[-1][2].committed == c.UNSTABLE4
        finally:
            dsc.close()

        # LAYOUTCOMMIT grows the size only; LAYOUTRETURN ends the layout
        commit = t.ARGS[c.OP_LAYOUTCOMMIT](
            0, ALL, False, got.stateid, (True, 3 << 20), (False, None), (1, b"")
        )
        st, res = client.session([(c.OP_PUTFH, fh), (c.OP_LAYOUTCOMMIT, commit)])
        assert st == 0 and res[-1][2] == (True, (3 << 20) + 1)
        ret = t.ARGS[c.OP_LAYOUTRETURN](
            False, 1, c.LAYOUTIOMODE4_ANY, (c.LAYOUTRETURN4_FILE, (0, ALL, got.stateid, b""))
        )
        st, res = client.session([(c.OP_PUTFH, fh), (c.OP_LAYOUTRETURN, ret)])
        assert st == 0 and res[-1][2] == (False, None)
        assert mds.server.pnfs.held() == 0
        st, _ = client.session([(c.OP_PUTFH, fh), (c.OP_LAYOUTRETURN, ret)])
        assert st == c.NFS4ERR_BAD_STATEID  # returned already
    finally:
        client.close()


def test_bad_layout_requests_get_their_errors(heads, server):
    mds, ds, _ = heads
    client = RawClient(mds.port).setup()
    try:
        fh, sid = client.open_new("f")
        root = client.root_fh()
        cases = [
            (dict(layout_type=4), c.NFS4ERR_UNKNOWN_LAYOUTTYPE),
            (dict(layout_type=0xFFFFFFFF), c.NFS4ERR_UNKNOWN_LAYOUTTYPE),
            (dict(iomode=c.LAYOUTIOMODE4_ANY), c.NFS4ERR_BADIOMODE),
            (dict(iomode=7), c.NFS4ERR_BADIOMODE),
            (dict(length=0), c.NFS4ERR_INVAL),
            (dict(offset=ALL - 5, length=10), c.NFS4ERR_INVAL),
            (dict(length=10, minlength=20), c.NFS4ERR_INVAL),
            (dict(maxcount=20), c.NFS4ERR_TOOSMALL),
        ]
        for kw, want in cases:
            st, res = _layoutget(client, fh, sid, **kw)
            assert st == want, (kw, st)
        for bad_sid, want in (
            (stateid(0, b"\0" * 12), c.NFS4ERR_BAD_STATEID),  # anonymous: names no open
            (stateid(1, b"pNFS" + b"\0" * 8), c.NFS4ERR_BAD_STATEID),  # no such layout
            (stateid(1, b"\x07" * 12), c.NFS4ERR_STALE_STATEID),  # not of this instance
        ):
            st, _ = _layoutget(client, fh, bad_sid)
            assert st == want, (bad_sid, st)
        st, _ = _layoutget(client, root, sid)
        assert st == c.NFS4ERR_ISDIR
        st, _ = client.session(
            [(c.OP_LAYOUTGET, t.ARGS[c.OP_LAYOUTGET](False, 1, 1, 0, ALL, 0, sid, 4096))]
        )
        assert st == c.NFS4ERR_NOFILEHANDLE

        st, res = _layoutget(client, fh, sid)
        assert st == 0
        device_id = bytes(t.nfsv4_1_file_layout4.decode(res[-1][2].layout[0].content.body).deviceid)
        st, _ = _getdeviceinfo(client, b"\x01" * 16)
        assert st == c.NFS4ERR_NOENT
        st, _ = _getdeviceinfo(client, device_id, layout_type=2)
        assert st == c.NFS4ERR_UNKNOWN_LAYOUTTYPE
        st, res = _getdeviceinfo(client, device_id, maxcount=16)
        assert st == c.NFS4ERR_TOOSMALL and res[-1][2] > 16  # gdir_mincount

        layout_sid = res_sid = _layoutget(client, fh, sid)[1][-1][2].stateid
        for returned, want in (
            ((c.LAYOUTRETURN4_FILE, (0, ALL, sid, b"")), c.NFS4ERR_BAD_STATEID),  # an open's
            ((c.LAYOUTRETURN4_FILE, (0, 0, res_sid, b"")), c.NFS4ERR_INVAL),
            ((7, None), c.NFS4ERR_INVAL),
        ):
            ret = t.ARGS[c.OP_LAYOUTRETURN](False, 1, c.LAYOUTIOMODE4_ANY, returned)
            st, _ = client.session([(c.OP_PUTFH, fh), (c.OP_LAYOUTRETURN, ret)])
            assert st == want, (returned, st)
        ret = t.ARGS[c.OP_LAYOUTRETURN](False, 3, c.LAYOUTIOMODE4_ANY, (c.LAYOUTRETURN4_ALL, None))
        st, _ = client.session([(c.OP_LAYOUTRETURN, ret)])
        assert st == c.NFS4ERR_UNKNOWN_LAYOUTTYPE
        commit = t.ARGS[c.OP_LAYOUTCOMMIT](
            0, ALL, False, sid, (False, None), (False, None), (1, b"")
        )
        st, _ = client.session([(c.OP_PUTFH, fh), (c.OP_LAYOUTCOMMIT, commit)])
        assert st == c.NFS4ERR_BAD_STATEID  # an open stateid is no layout's
        commit = t.ARGS[c.OP_LAYOUTCOMMIT](
            0, ALL, False, layout_sid, (False, None), (False, None), (9, b"")
        )
        st, _ = client.session([(c.OP_PUTFH, fh), (c.OP_LAYOUTCOMMIT, commit)])
        assert st == c.NFS4ERR_UNKNOWN_LAYOUTTYPE

        # a truncated LAYOUTGET: a decoding error, not a server fault
        ops = bytearray(client.compound_bytes([client.sequence_op(), (c.OP_PUTFH, fh)]))
        struct.pack_into(">I", ops, 8, 3)  # (empty tag, minor version) then three operations
        ops += struct.pack(">I", c.OP_LAYOUTGET) + b"\0\0\0\0\0\0\0\1"
        status, _ = RawClient.parse(client.call_raw(1, bytes(ops)))
        assert status == c.NFS4ERR_BADXDR
    finally:
        client.close()

    # a head that is no metadata server hands out no layouts and knows no device
    for port in (ds.port, server.port):
        other = RawClient(port).setup()
        try:
            fh, sid = other.open_new("g")
            st, _ = _layoutget(other, fh, sid)
            assert st == c.NFS4ERR_LAYOUTUNAVAILABLE
            st, _ = _getdeviceinfo(other, device_id)
            assert st == c.NFS4ERR_NOENT
        finally:
            other.close()


def test_unstable_data_server_writes_commit_at_the_data_server(heads):
    """[pnfs] data_server_writes = "unstable": the data server buffers a layout's WRITEs, the
    client's COMMIT there makes them durable with the file's size, and LAYOUTCOMMIT at the
    metadata server finds the size right already."""
    mds, ds, ds_pnfs = heads
    ds_pnfs.stable_writes = False
    client = RawClient(mds.port).setup()
    dsc = RawClient(ds.port).setup()
    try:
        fh, sid = client.open_new("buffered")
        st, res = _layoutget(client, fh, sid)
        assert st == 0
        layout_sid = res[-1][2].stateid
        data = bytes(range(256)) * 2048  # 512 KiB: one stripe unit of the test stack
        st, res = dsc.session(
            [(c.OP_PUTFH, fh), (c.OP_WRITE, t.ARGS[c.OP_WRITE](sid, 0, c.UNSTABLE4, data))]
        )
        assert st == 0 and res[-1][2].committed == c.UNSTABLE4
        verifier = res[-1][2].writeverf
        st, res = dsc.session([(c.OP_PUTFH, fh), (c.OP_COMMIT, t.ARGS[c.OP_COMMIT](0, 0))])
        assert st == 0 and res[-1][2] == verifier
        commit = t.ARGS[c.OP_LAYOUTCOMMIT](
            0, ALL, False, layout_sid, (True, len(data) - 1), (False, None), (1, b"")
        )
        st, res = client.session([(c.OP_PUTFH, fh), (c.OP_LAYOUTCOMMIT, commit)])
        assert st == 0 and res[-1][2] == (False, None)  # the data server's commit set it
        words = fattr.to_bitmap([c.FATTR4_SIZE])
        st, res = client.session([(c.OP_PUTFH, fh), (c.OP_GETATTR, words)])
        assert struct.unpack(">Q", res[-1][2].attr_vals)[0] == len(data)
        st, res = client.session(
            [(c.OP_PUTFH, fh), (c.OP_READ, t.ARGS[c.OP_READ](sid, 1000, 4096))]
        )  # through the metadata server: what the data server committed
        assert st == 0 and res[-1][2].data == data[1000:5096]
    finally:
        dsc.close()
        client.close()


def _device(client, fh, sid) -> tuple[bytes, list[int]]:
    """(device id of a new layout of ``fh``, the data servers' ports it lists)."""
    st, res = _layoutget(client, fh, sid)
    assert st == 0, res
    files = t.nfsv4_1_file_layout4.decode(res[-1][2].layout[0].content.body)
    device_id = bytes(files.deviceid)
    st, res = _getdeviceinfo(client, device_id)
    assert st == 0, res
    device = t.nfsv4_1_file_layout_ds_addr4.decode(res[-1][2].device_addr.body)
    ports = []
    for (addr,) in device.multipath_ds_list:
        *_, hi, lo = addr.addr.split(".")
        ports.append(int(hi) * 256 + int(lo))
    assert files.first_stripe_index < len(ports)
    return device_id, ports


def _device_change(client, fh, sid, before: bytes) -> tuple[bytes, list[int]]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        device_id, ports = _device(client, fh, sid)
        if device_id != before:
            return device_id, ports
        time.sleep(0.2)
    raise AssertionError("the layouts' device did not change in 20 s")


def test_a_dead_data_servers_head_leaves_new_layouts(stack, server):
    """A data server killed (its head stops beating) is left out of the device of new layouts
    once another head expired it (a lease), so clients stop sending it I/O; the device of older
    layouts is gone (NOENT, the client asks again); it is back once its head joins again. All
    data servers dead: LAYOUTUNAVAILABLE, I/O through the metadata server."""
    lease = 2  # heads beat every lease / 6 and expire each other after a lease of silence

    def data_server(index: int, port: int = 0):
        pnfs = Pnfs("ds", stripe_unit=UNIT)
        ds = start_server(stack, pnfs=pnfs, head_index=index, lease_seconds=lease, port=port)
        pnfs.address = ("127.0.0.1", ds.port)  # (the port is known once it listens)
        return ds

    ds = [data_server(1), data_server(2)]
    ports = [d.port for d in ds]
    deadline = time.monotonic() + 10  # (a beat announces the address set after the start)
    while not all(d.server.pnfs.announced for d in ds) and time.monotonic() < deadline:
        time.sleep(0.1)
    mds_pnfs = Pnfs("mds", [("127.0.0.1", p) for p in ports], stripe_unit=UNIT)
    mds_pnfs.publish(stack.catalog)
    mds = start_server(stack, pnfs=mds_pnfs, head_index=0, lease_seconds=lease)
    client = RawClient(mds.port).setup()
    try:
        fh, sid = client.open_new("f")
        first, listed = _device(client, fh, sid)
        assert listed == ports
        ds[1].stop()  # as kill -9 leaves it: its row stays until another head expires it
        second, listed = _device_change(client, fh, sid, first)
        assert listed == ports[:1]
        st, _ = _getdeviceinfo(client, first)
        assert st == c.NFS4ERR_NOENT  # the older device: the client drops it and asks again
        dsc = RawClient(ports[0]).setup()  # the data server left serves the layout's I/O
        try:
            st, res = dsc.session(
                [(c.OP_PUTFH, fh), (c.OP_WRITE, t.ARGS[c.OP_WRITE](sid, 0, c.UNSTABLE4, b"a"))]
            )
            assert st == 0 and res[-1][2].committed == c.FILE_SYNC4
        finally:
            dsc.close()

        ds[1] = data_server(2, ports[1])  # head2 back on its port: it joins again
        _, listed = _device_change(client, fh, sid, second)
        assert listed == ports

        for d in ds:
            d.stop()
        deadline = time.monotonic() + 20
        while (st := _layoutget(client, fh, sid)[0]) == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert st == c.NFS4ERR_LAYOUTUNAVAILABLE
        st, res = client.session(
            [(c.OP_PUTFH, fh), (c.OP_WRITE, t.ARGS[c.OP_WRITE](sid, 0, c.FILE_SYNC4, b"b"))]
        )
        assert st == 0 and res[-1][2].count == 1
    finally:
        client.close()
        mds.stop()
        for d in ds:
            d.stop()
