"""Protocol conformance at the RPC and COMPOUND level, with a raw peer:
RPC errors, record limits, sessions and the reply cache, locks across
clients, bad handles, exports refusing a foreign address (retries on a slot:
test_slot_retries.py)."""

from __future__ import annotations

import os
import socket
import struct
import time

from nfs4_rawclient import RawClient, open_args
from nfs4_support import add_export, nfsrs, start_server

from appliance.nfs.v4 import const as c
from appliance.nfs.v4 import types as t


def rpc_status(reply: bytes) -> tuple:
    xid, mtype, stat = struct.unpack_from(">III", reply, 0)
    if stat == 1:  # denied
        return ("denied",) + struct.unpack_from(">II", reply, 12)
    vlen = struct.unpack_from(">I", reply, 16)[0]
    return ("accepted", struct.unpack_from(">I", reply, 20 + vlen)[0])


def test_rpc_level_errors(server):
    raw = RawClient(server.port)
    assert rpc_status(raw.call_raw(0, b"")) == ("accepted", 0)  # NULL
    assert rpc_status(raw.call_raw(0, b"", prog=100099)) == ("accepted", 1)  # PROG_UNAVAIL
    reply = raw.call_raw(0, b"", vers=2)
    assert rpc_status(reply) == ("accepted", 2)  # PROG_MISMATCH low..high = 3..4 (NFSv3 and v4)
    assert struct.unpack_from(">II", reply, 24) == (3, 4)
    assert rpc_status(raw.call_raw(7, b"")) == ("accepted", 3)  # PROC_UNAVAIL
    # RPCSEC_GSS is refused with an auth error (AUTH_TOOWEAK)
    assert rpc_status(raw.call_raw(0, b"", flavor=6, cred=b"\0" * 8)) == ("denied", 1, 5)
    # a body that is not a COMPOUND
    st, res = raw.parse(raw.call_raw(1, b"\0\0\0"))
    assert st == c.NFS4ERR_BADXDR and res == []
    raw.close()


def test_minor_versions_and_unknown_ops(server):
    raw = RawClient(server.port)
    st, res = raw.compound([(c.OP_PUTROOTFH, None)], minor=3)
    assert st == c.NFS4ERR_MINOR_VERS_MISMATCH and res == []
    # minor version 2 is served (tests/nfs/test_v42.py) with 4.1's session rules
    st, res = raw.compound([(c.OP_PUTROOTFH, None)], minor=2)
    assert st == c.NFS4ERR_OP_NOT_IN_SESSION
    # minor version 0 is served (tests/nfs/test_v40.py): no SEQUENCE needed
    st, res = raw.compound([(c.OP_PUTROOTFH, None)], minor=0)
    assert st == 0 and res == [(c.OP_PUTROOTFH, 0, None)]
    raw.setup()
    st, res = raw.session([(c.OP_PUTROOTFH, None)])
    assert st == 0
    # an operation not run: NOTSUPP (GETDEVICELIST, gone from the Linux client, has no declared
    # arguments: the COMPOUND stops there)
    seq = raw.compound_bytes([raw.sequence_op()])
    count_at = 4 + 4  # tag length (0) + minorversion
    patched = bytearray(seq)
    struct.pack_into(">I", patched, count_at, 2)
    reply = raw.call_raw(1, bytes(patched) + struct.pack(">I", c.OP_GETDEVICELIST))
    st, res = raw.parse(reply)
    assert st == c.NFS4ERR_NOTSUPP and res[-1][:2] == (c.OP_GETDEVICELIST, c.NFS4ERR_NOTSUPP)
    seq = bytearray(raw.compound_bytes([raw.sequence_op()]))
    struct.pack_into(">I", seq, count_at, 2)
    st, res = raw.parse(raw.call_raw(1, bytes(seq) + struct.pack(">I", 9999)))
    assert st == c.NFS4ERR_OP_ILLEGAL and res[-1][:2] == (c.OP_ILLEGAL, c.NFS4ERR_OP_ILLEGAL)
    # no SEQUENCE first: refused
    st, res = raw.compound([(c.OP_PUTROOTFH, None)])
    assert st == c.NFS4ERR_OP_NOT_IN_SESSION
    raw.close()


def test_oversized_record_closes_connection_cleanly(server):
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(struct.pack(">I", 0x80000000 | (64 << 20)) + b"x" * 1000)
    sock.settimeout(10)
    assert sock.recv(100) == b""  # closed, nothing sent
    sock.close()
    # multi-fragment records are reassembled
    raw = RawClient(server.port)
    body = struct.pack(">IIIIII", 99, 0, 2, c.NFS4_PROGRAM, 4, 0) + struct.pack(">IIII", 0, 0, 0, 0)
    raw.sock.sendall(
        struct.pack(">I", 10)
        + body[:10]
        + struct.pack(">I", 0x80000000 | (len(body) - 10))
        + body[10:]
    )
    assert rpc_status(raw.recv_record()) == ("accepted", 0)
    raw.close()


def test_tampered_handles(server):
    raw = RawClient(server.port).setup()
    root = raw.root_fh()
    for bad in (
        root[:-1] + bytes([root[-1] ^ 1]),
        root[:10],
        b"\0" * len(root),
        bytes([root[0]]) + root[1:20] + bytes([root[20] ^ 0x80]) + root[21:],
    ):
        st, res = raw.session([(c.OP_PUTFH, bad), (c.OP_GETATTR, [1 << c.FATTR4_TYPE])])
        assert st in (c.NFS4ERR_BADHANDLE, c.NFS4ERR_STALE), st
    st, _ = raw.session([(c.OP_PUTFH, root), (c.OP_GETATTR, [1 << c.FATTR4_TYPE])])
    assert st == 0
    raw.close()


def test_locks_across_clients(server):
    a = RawClient(server.port).setup()
    b = RawClient(server.port).setup()
    root = a.root_fh()

    def opened(cl, owner):
        st, res = cl.session(
            [
                (c.OP_PUTFH, root),
                (c.OP_OPEN, open_args("locked", owner, cl.clientid)),
                (c.OP_GETFH, None),
            ]
        )
        assert st == 0, res
        return res[2][2].stateid, res[3][2]

    sid_a, fh = opened(a, b"owner-a")
    sid_b, _ = opened(b, b"owner-b")

    def lock(cl, sid, owner, locktype, offset, length):
        locker = (
            True,
            t.open_to_lock_owner4.cls(0, sid, 0, t.state_owner4.cls(cl.clientid, owner)),
        )
        return cl.session(
            [
                (c.OP_PUTFH, fh),
                (c.OP_LOCK, t.ARGS[c.OP_LOCK](locktype, False, offset, length, locker)),
            ]
        )

    st, res = lock(a, sid_a, b"lock-a", c.WRITE_LT, 0, 100)
    assert st == 0
    lock_sid = res[-1][2]
    st, res = lock(b, sid_b, b"lock-b", c.WRITE_LT, 50, 10)
    assert st == c.NFS4ERR_DENIED
    denied = res[-1][2]
    assert (denied.offset, denied.length, denied.locktype) == (0, 100, c.WRITE_LT)
    assert denied.owner.owner == b"lock-a"
    # LOCKT from B sees the conflict; a range past A's lock is free
    st, _ = b.session(
        [
            (c.OP_PUTFH, fh),
            (
                c.OP_LOCKT,
                t.ARGS[c.OP_LOCKT](c.READ_LT, 99, 1, t.state_owner4.cls(b.clientid, b"lock-b")),
            ),
        ]
    )
    assert st == c.NFS4ERR_DENIED
    st, _ = lock(b, sid_b, b"lock-b", c.WRITE_LT, 100, c.NFS4_UINT64_MAX)
    assert st == 0
    # A unlocks: B can take the range
    st, _ = a.session(
        [(c.OP_PUTFH, fh), (c.OP_LOCKU, t.ARGS[c.OP_LOCKU](c.WRITE_LT, 0, lock_sid, 0, 100))]
    )
    assert st == 0
    st, _ = lock(b, sid_b, b"lock-b2", c.WRITE_LT, 50, 10)
    assert st == 0
    # read locks are shared
    st, _ = lock(a, sid_a, b"lock-a2", c.READ_LT, 200, 10)
    assert st == c.NFS4ERR_DENIED  # B's write lock covers [100, EOF)
    st, _ = lock(a, sid_a, b"lock-a2", c.READ_LT, 20, 10)
    st2, _ = lock(b, sid_b, b"lock-b3", c.READ_LT, 25, 10)
    assert (st, st2) == (0, 0)  # read locks are shared
    a.close()
    b.close()


def test_share_reservation_deny(server):
    a = RawClient(server.port).setup()
    b = RawClient(server.port).setup()
    root = a.root_fh()
    args = open_args("shared", b"oa", a.clientid)
    args.share_deny = c.OPEN4_SHARE_DENY_WRITE
    st, _ = a.session([(c.OP_PUTFH, root), (c.OP_OPEN, args)])
    assert st == 0
    st, _ = b.session([(c.OP_PUTFH, root), (c.OP_OPEN, open_args("shared", b"ob", b.clientid))])
    assert st == c.NFS4ERR_SHARE_DENIED
    st, _ = b.session(
        [
            (c.OP_PUTFH, root),
            (
                c.OP_OPEN,
                open_args(
                    "shared", b"ob", b.clientid, access=c.OPEN4_SHARE_ACCESS_READ, create=False
                ),
            ),
        ]
    )
    assert st == 0


def test_export_refuses_foreign_address(stack):
    add_export(stack.catalog, clients="127.0.0.1/32")
    srv = start_server(stack, host="0.0.0.0")
    try:
        foreign = RawClient(srv.port, source="127.0.0.2").setup()
        st, res = foreign.session([(c.OP_PUTROOTFH, None), (c.OP_LOOKUP, "export")])
        assert st == c.NFS4ERR_ACCESS
        # the pseudo-root does not even list it
        st, res = foreign.session(
            [
                (c.OP_PUTROOTFH, None),
                (
                    c.OP_READDIR,
                    t.ARGS[c.OP_READDIR](0, b"\0" * 8, 4096, 8192, [1 << c.FATTR4_TYPE]),
                ),
            ]
        )
        assert st == 0 and res[-1][2].entries == []
        local = RawClient(srv.port).setup()
        fh = local.root_fh()
        # a genuine handle does not help a foreign client either
        st, _ = foreign.session([(c.OP_PUTFH, fh), (c.OP_GETATTR, [1 << c.FATTR4_TYPE])])
        assert st == c.NFS4ERR_ACCESS
        with nfsrs(srv.port) as cl:
            assert cl.listdir(".") == []
        foreign.close()
        local.close()
    finally:
        srv.stop()


def test_restart_keeps_handles_and_session_recovers(stack):
    add_export(stack.catalog)
    srv = start_server(stack, grace_seconds=2)
    port = srv.port
    raw = RawClient(port).setup()
    with nfsrs(port) as cl:
        with cl.open("keep.bin", "wb") as f:
            f.write(b"before restart")
        fh_root = raw.root_fh()
        st, res = raw.session(
            [(c.OP_PUTFH, fh_root), (c.OP_LOOKUP, "keep.bin"), (c.OP_GETFH, None)]
        )
        fh = res[-1][2]
        st, res = raw.session([(c.OP_PUTFH, fh), (c.OP_COMMIT, t.ARGS[c.OP_COMMIT](0, 0))])
        verifier_before = res[-1][2]
        raw.close()
        srv.stop()
        srv = start_server(stack, port=port, grace_seconds=2)
        try:
            # the same client object carries on: new session, same handles, same data
            with cl.open("keep.bin", "rb") as f:
                assert f.read() == b"before restart"
            cl.mkdir("after")
            assert sorted(cl.listdir(".")) == ["after", "keep.bin"]
            raw = RawClient(port).setup()
            st, res = raw.session(
                [(c.OP_PUTFH, fh), (c.OP_GETATTR, [1 << c.FATTR4_TYPE, 1 << (c.FATTR4_SIZE)])]
            )
            assert st == 0
            st, res = raw.session([(c.OP_PUTFH, fh), (c.OP_COMMIT, t.ARGS[c.OP_COMMIT](0, 0))])
            assert res[-1][2] != verifier_before  # UNSTABLE writes must be resent after a restart
            raw.close()
        finally:
            srv.stop()


def test_open_modes_stateids_and_verify(server):
    raw = RawClient(server.port).setup()
    root = raw.root_fh()
    verf = b"12345678"
    excl = t.ARGS[c.OP_OPEN](
        0,
        c.OPEN4_SHARE_ACCESS_BOTH,
        0,
        t.state_owner4.cls(raw.clientid, b"o"),
        (c.OPEN4_CREATE, (c.EXCLUSIVE4_1, t.creatverfattr.cls(verf, t.fattr4.cls([], b"")))),
        (c.CLAIM_NULL, "excl"),
    )
    st, res = raw.session([(c.OP_PUTFH, root), (c.OP_OPEN, excl), (c.OP_GETFH, None)])
    assert st == 0
    sid, fh = res[2][2].stateid, res[3][2]
    # a retransmitted exclusive create (same verifier) succeeds; another verifier gets EXIST
    st, res = raw.session([(c.OP_PUTFH, root), (c.OP_OPEN, excl)])
    assert st == 0
    sid = res[2][2].stateid
    excl.openhow = (
        c.OPEN4_CREATE,
        (c.EXCLUSIVE4_1, t.creatverfattr.cls(b"87654321", t.fattr4.cls([], b""))),
    )
    st, _ = raw.session([(c.OP_PUTFH, root), (c.OP_OPEN, excl)])
    assert st == c.NFS4ERR_EXIST
    # TEST_STATEID knows the open stateid and not a made-up one
    bogus = t.stateid4.cls(1, sid.other[:4] + b"\xee" * 8)
    st, res = raw.session([(c.OP_TEST_STATEID, [sid, bogus])])
    assert st == 0 and res[-1][2] == [0, c.NFS4ERR_BAD_STATEID]
    # OPEN_DOWNGRADE to read-only (after an OPEN for reading: a downgrade names modes that
    # were opened, RFC 8881 18.18.3): a WRITE with it is refused
    reread = open_args("excl", b"o", raw.clientid, access=c.OPEN4_SHARE_ACCESS_READ, create=False)
    st, res = raw.session([(c.OP_PUTFH, root), (c.OP_OPEN, reread)])
    assert st == 0
    sid = res[-1][2].stateid
    st, res = raw.session(
        [
            (c.OP_PUTFH, fh),
            (
                c.OP_OPEN_DOWNGRADE,
                t.ARGS[c.OP_OPEN_DOWNGRADE](sid, 0, c.OPEN4_SHARE_ACCESS_READ, 0),
            ),
        ]
    )
    assert st == 0
    sid = res[-1][2]
    st, _ = raw.session(
        [(c.OP_PUTFH, fh), (c.OP_WRITE, t.ARGS[c.OP_WRITE](sid, 0, c.FILE_SYNC4, b"x"))]
    )
    assert st == c.NFS4ERR_OPENMODE
    # VERIFY / NVERIFY compare attributes the server encodes
    size0 = t.fattr4.cls([1 << c.FATTR4_SIZE], struct.pack(">Q", 0))
    size9 = t.fattr4.cls([1 << c.FATTR4_SIZE], struct.pack(">Q", 9))
    assert raw.session([(c.OP_PUTFH, fh), (c.OP_VERIFY, size0)])[0] == 0
    assert raw.session([(c.OP_PUTFH, fh), (c.OP_VERIFY, size9)])[0] == c.NFS4ERR_NOT_SAME
    assert raw.session([(c.OP_PUTFH, fh), (c.OP_NVERIFY, size0)])[0] == c.NFS4ERR_SAME
    # CLOSE; the stateid is gone afterwards
    st, _ = raw.session([(c.OP_PUTFH, fh), (c.OP_CLOSE, t.ARGS[c.OP_CLOSE](0, sid))])
    assert st == 0
    st, res = raw.session([(c.OP_TEST_STATEID, [sid])])
    assert res[-1][2] == [c.NFS4ERR_BAD_STATEID]
    # SECINFO_NO_NAME answers AUTH_SYS and consumes the current file handle
    st, res = raw.session([(c.OP_PUTFH, fh), (c.OP_SECINFO_NO_NAME, 0), (c.OP_GETFH, None)])
    assert res[2][2][0] == (c.AUTH_SYS, None) and st == c.NFS4ERR_NOFILEHANDLE
    raw.close()


def test_lease_expiry_drops_idle_client(stack):
    add_export(stack.catalog)
    srv = start_server(stack, lease_seconds=1)
    try:
        raw = RawClient(srv.port).setup()
        root = raw.root_fh()
        st, _ = raw.session(
            [(c.OP_PUTFH, root), (c.OP_OPEN, open_args("leased", b"o", raw.clientid))]
        )
        assert st == 0
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            time.sleep(0.5)
            if raw.clientid not in srv.server.state.clients:
                break
        st, _ = raw.session([(c.OP_PUTROOTFH, None)])
        assert st == c.NFS4ERR_BADSESSION  # the idle client's lease ran out: state gone
        # its open no longer holds a share reservation against others
        other = RawClient(srv.port).setup()
        args = open_args("leased", b"o2", other.clientid)
        args.share_deny = c.OPEN4_SHARE_DENY_BOTH
        assert other.session([(c.OP_PUTFH, root), (c.OP_OPEN, args)])[0] == 0
        raw.close()
        other.close()
    finally:
        srv.stop()


def test_grace_period_reclaim_after_restart(stack):
    add_export(stack.catalog)
    srv = start_server(stack, grace_seconds=30)
    port = srv.port
    a = RawClient(port).setup(owner=b"client-a")
    root = a.root_fh()
    st, res = a.session(
        [(c.OP_PUTFH, root), (c.OP_OPEN, open_args("held", b"oa", a.clientid)), (c.OP_GETFH, None)]
    )
    assert st == 0
    fh = res[-1][2]
    # the client drops its session (so it cannot simply carry on) and the server restarts
    assert a.compound([(c.OP_DESTROY_SESSION, a.sessionid)])[0] == 0
    a.close()
    srv.stop()
    srv = start_server(stack, port=port, grace_seconds=30)
    try:
        b = RawClient(port).setup(owner=b"client-b")
        st, _ = b.session([(c.OP_PUTFH, root), (c.OP_OPEN, open_args("new", b"ob", b.clientid))])
        assert st == c.NFS4ERR_GRACE  # new opens wait while a previous client may reclaim
        a = RawClient(port).setup(owner=b"client-a", reclaim_complete=False)
        reclaim = open_args("held", b"oa", a.clientid, create=False)
        reclaim.claim = (c.CLAIM_PREVIOUS, c.OPEN_DELEGATE_NONE)
        st, res = a.session([(c.OP_PUTFH, fh), (c.OP_OPEN, reclaim)])
        assert st == 0
        # b never held state: it cannot reclaim
        reclaim_b = open_args("held", b"ob", b.clientid, create=False)
        reclaim_b.claim = (c.CLAIM_PREVIOUS, c.OPEN_DELEGATE_NONE)
        assert b.session([(c.OP_PUTFH, fh), (c.OP_OPEN, reclaim_b)])[0] == c.NFS4ERR_RECLAIM_BAD
        # the only previous client is done reclaiming: the grace period ends early
        assert a.session([(c.OP_RECLAIM_COMPLETE, False)])[0] == 0
        st, _ = b.session([(c.OP_PUTFH, root), (c.OP_OPEN, open_args("new", b"ob", b.clientid))])
        assert st == 0
        assert a.session([(c.OP_PUTFH, fh), (c.OP_OPEN, reclaim)])[0] == c.NFS4ERR_NO_GRACE
        a.close()
        b.close()
    finally:
        srv.stop()


def test_pipelined_replies_larger_than_the_socket_buffers_arrive_whole(server, stack):
    """Workers send replies straight to the socket; when it is full the rest queues behind on
    the event loop, and later replies must queue behind that rest. 1 MiB READs on all eight
    slots, each slot asked again as soon as its reply is read, replies read only once the
    first eight were made: every record must arrive intact with the right bytes."""
    from engine.namespace import ROOT

    ns = stack.namespace
    data = os.urandom(4 << 20)
    ino = ns.create(ROOT, ns.root_ino, "pipelined").ino
    ns.write(ino, 0, data)
    ns.commit(ino)
    raw = RawClient(server.port).setup()
    raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
    st, res = raw.session(
        [
            (c.OP_PUTROOTFH, None),
            (c.OP_LOOKUP, "export"),
            (c.OP_LOOKUP, "pipelined"),
            (c.OP_GETFH, None),
        ]
    )
    assert st == 0, res
    fh = res[-1][2]
    anonymous = t.stateid4.cls(0, b"\0" * 12)
    asked = {}  # xid -> (slot, offset)

    def ask(slot, n):
        offset = (n % 4) << 20
        # READ is idempotent: no cached reply asked (1 MiB is past ca_maxresponsesize_cached)
        body = raw.compound_bytes(
            [
                raw.sequence_op(slot, cachethis=False),
                (c.OP_PUTFH, fh),
                (c.OP_READ, t.ARGS[c.OP_READ](anonymous, offset, 1 << 20)),
            ]
        )
        raw.xid += 1
        asked[raw.xid] = (slot, offset)
        head = struct.pack(">IIIIII", raw.xid, 0, 2, c.NFS4_PROGRAM, 4, 1)
        head += (
            struct.pack(">II", 1, len(raw.cred))
            + raw.cred
            + b"\0" * (-len(raw.cred) % 4)
            + b"\0" * 8
        )
        raw.send_record(head + body)

    for slot in range(8):
        ask(slot, slot)
    deadline = time.monotonic() + 10
    while server.stats().get("nfs_ops_read", 0) < 8 and time.monotonic() < deadline:
        time.sleep(0.02)  # every reply made: what the socket did not take waits in the transport
    total, answered = 32, 0
    while answered < total:
        reply = raw.recv_record()
        xid = struct.unpack_from(">I", reply)[0]
        st, res = raw.parse(reply)
        assert st == 0 and res[-1][0] == c.OP_READ, res
        slot, offset = asked.pop(xid)
        assert res[-1][2].data == data[offset : offset + (1 << 20)], f"xid {xid}: wrong bytes"
        answered += 1
        if answered + len(asked) < total:
            ask(slot, answered)  # made while the transport still drains the earlier replies
    assert not asked
    raw.close()


def test_a_session_that_outlives_a_restart_is_told_to_reclaim(stack):
    # the Linux client kept writing into a restarted server forever: its session was restored,
    # its open stateid was not, and nothing in SEQUENCE said that it had to reclaim
    add_export(stack.catalog)
    srv = start_server(stack, grace_seconds=30)
    port = srv.port
    a = RawClient(port).setup(owner=b"keeper")
    st, res = a.session(
        [
            (c.OP_PUTFH, a.root_fh()),
            (c.OP_OPEN, open_args("kept", b"ok", a.clientid)),
            (c.OP_GETFH, None),
        ]
    )
    assert st == 0
    fh = res[-1][2]
    assert a.session([])[1][0][2].status_flags == 0
    a.close()
    srv.stop()
    srv = start_server(stack, port=port, grace_seconds=30)
    try:
        again = RawClient(port)
        again.sessionid, again.seq, again.clientid = a.sessionid, a.seq, a.clientid
        st, res = again.session([])
        assert st == 0
        assert res[0][2].status_flags & c.SEQ4_STATUS_RESTART_RECLAIM_NEEDED
        reclaim = open_args("kept", b"ok", a.clientid, create=False)
        reclaim.claim = (c.CLAIM_PREVIOUS, c.OPEN_DELEGATE_NONE)
        assert again.session([(c.OP_PUTFH, fh), (c.OP_OPEN, reclaim)])[0] == 0
        assert again.session([(c.OP_RECLAIM_COMPLETE, False)])[0] == 0
        st, res = again.session([])
        # reclaimed: no RESTART_RECLAIM_NEEDED; CB_PATH_DOWN stays, since the session had a
        # backchannel and this new connection is not bound to it (RFC 8881 18.46.3)
        assert st == 0 and res[0][2].status_flags == c.SEQ4_STATUS_CB_PATH_DOWN
        again.close()
    finally:
        srv.stop()
