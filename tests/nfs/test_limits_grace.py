"""Limits of one COMPOUND (operations, reply size) in every minor version, and the grace
period after a restart, which only restored clients that held state keep."""

from __future__ import annotations

import time

from nfs4_rawclient import RawClient, open_args
from nfs4_support import add_export, nfsrs, start_server

from appliance.nfs.onc.limits import NetLimits
from appliance.nfs.v4 import const as c
from appliance.nfs.v4 import types as t

ANONYMOUS = t.stateid4.cls(0, b"\0" * 12)
GRACE = 90  # the default: the lease
TYPE_AND_SIZE = [(1 << c.FATTR4_TYPE) | (1 << c.FATTR4_SIZE), 0]


# -- operations per COMPOUND ---------------------------------------------------------------------
def test_an_nfsv40_compound_past_the_operation_limit_gets_resource(server):
    """The operations up to nfs.max_compound_ops run; the next answers NFS4ERR_RESOURCE and
    nothing after it runs (the reply no longer grows with what a record can hold)."""
    raw = RawClient(server.port, minor=0)
    ops = [(c.OP_PUTROOTFH, None)] + [(c.OP_GETATTR, TYPE_AND_SIZE)] * 1000
    st, res = raw.compound(ops)
    assert st == c.NFS4ERR_RESOURCE
    limit = server.server.limits.max_compound_ops
    assert len(res) == limit + 1
    assert all(status == 0 for _, status, _ in res[:limit])
    assert res[-1][:2] == (c.OP_GETATTR, c.NFS4ERR_RESOURCE)
    # a COMPOUND of exactly the limit is answered whole
    st, res = raw.compound(ops[:limit])
    assert st == 0 and len(res) == limit
    raw.close()


def test_an_nfsv41_session_offers_the_configured_operation_limit(stack):
    """ca_maxoperations is at most nfs.max_compound_ops; a COMPOUND past the session's
    limit gets NFS4ERR_TOO_MANY_OPS in SEQUENCE, before anything runs."""
    add_export(stack.catalog)
    srv = start_server(stack, limits=NetLimits(max_compound_ops=8))
    try:
        raw = RawClient(srv.port).setup()  # asks for 16
        assert srv.server.state.sessions[raw.sessionid].fore.maxoperations == 8
        st, res = raw.session([(c.OP_PUTROOTFH, None)] * 7)
        assert st == 0 and len(res) == 8
        st, res = raw.session([(c.OP_PUTROOTFH, None)] * 8)
        assert st == c.NFS4ERR_TOO_MANY_OPS
        assert res == [(c.OP_SEQUENCE, c.NFS4ERR_TOO_MANY_OPS, None)]
        raw.close()
    finally:
        srv.stop()


# -- reply size --------------------------------------------------------------------------------
def test_an_nfsv40_reply_stops_at_the_record_size(stack):
    """An NFSv4.0 COMPOUND has no session to bound its reply: the operation whose result
    would take it past nfs.max_record_size answers NFS4ERR_RESOURCE, the results before it
    kept (as REP_TOO_BIG in an NFSv4.1 session)."""
    from engine.namespace import ROOT

    add_export(stack.catalog)
    ns = stack.namespace
    data = bytes(range(256)) * 4096  # 1 MiB
    ino = ns.create(ROOT, ns.root_ino, "mib").ino
    ns.write(ino, 0, data)
    ns.commit(ino)
    srv = start_server(stack, limits=NetLimits(max_record_size=4 << 20))
    try:
        raw = RawClient(srv.port, minor=0)
        head = [(c.OP_PUTROOTFH, None), (c.OP_LOOKUP, "export"), (c.OP_LOOKUP, "mib")]
        read = (c.OP_READ, t.ARGS[c.OP_READ](ANONYMOUS, 0, 1 << 20))
        reply = raw.compound(head + [read] * 6, raw_reply=True)
        assert len(reply) <= 4 << 20
        st, res = raw.parse(reply)
        assert st == c.NFS4ERR_RESOURCE
        # three 1 MiB results and the headers fit in 4 MiB; the fourth does not
        assert [status for _, status, _ in res] == [0, 0, 0, 0, 0, 0, c.NFS4ERR_RESOURCE]
        assert all(value.data == data for _, _, value in res[3:6])
        assert res[-1][0] == c.OP_READ
        # what fits is answered whole
        st, res = raw.compound(head + [read] * 3)
        assert st == 0 and len(res) == 6
        raw.close()
    finally:
        srv.stop()


# -- grace after a restart -----------------------------------------------------------------------
def _lock_args(open_sid, clientid: int, owner: bytes, *, reclaim=False, open_seqid=0):
    locker = (
        True,
        t.open_to_lock_owner4.cls(open_seqid, open_sid, 0, t.state_owner4.cls(clientid, owner)),
    )
    return t.ARGS[c.OP_LOCK](c.WRITE_LT, reclaim, 0, 10, locker)


def test_no_grace_period_when_no_previous_client_held_state(stack):
    """nfs-rs wrote and closed a file, so it holds no open or lock when the server stops
    cleanly: right after the restart its next OPEN goes (it gives up on NFS4ERR_GRACE), and
    so does a new client's."""
    add_export(stack.catalog)
    srv = start_server(stack, grace_seconds=GRACE)
    port = srv.port
    try:
        with nfsrs(port) as cl:
            with cl.open("written.bin", "wb") as f:
                f.write(b"before the restart")
            srv.stop()
            srv = start_server(stack, port=port, grace_seconds=GRACE)
            started = time.monotonic()
            with cl.open("written.bin", "rb") as f:
                assert f.read() == b"before the restart"
            with cl.open("new.bin", "wb") as f:
                f.write(b"after")
            assert time.monotonic() - started < 10
            assert not srv.server.state.grace.in_grace()
        raw = RawClient(port).setup()
        opened = [
            (c.OP_PUTFH, raw.root_fh()),
            (c.OP_OPEN, open_args("raw.bin", b"o", raw.clientid)),
        ]
        assert raw.session(opened)[0] == 0
        raw.close()
    finally:
        srv.stop()


def test_a_client_that_held_a_lock_keeps_grace_until_its_reclaim_complete(stack):
    """Of the previous clients only the one that held an open and a lock holds the grace
    period (a client with a session and no state does not): others' OPENs get
    NFS4ERR_GRACE until it has reclaimed and sent RECLAIM_COMPLETE, then go at once; its
    reclaimed lock still conflicts."""
    add_export(stack.catalog)
    srv = start_server(stack, grace_seconds=GRACE)
    port = srv.port
    try:
        holder = RawClient(port).setup(owner=b"lock-holder")
        idle = RawClient(port).setup(owner=b"idle-client")  # a session, no state
        root = holder.root_fh()
        st, res = holder.session(
            [
                (c.OP_PUTFH, root),
                (c.OP_OPEN, open_args("locked", b"o", holder.clientid)),
                (c.OP_GETFH, None),
            ]
        )
        assert st == 0
        open_sid, fh = res[2][2].stateid, res[3][2]
        assert (
            holder.session(
                [(c.OP_PUTFH, fh), (c.OP_LOCK, _lock_args(open_sid, holder.clientid, b"l"))]
            )[0]
            == 0
        )
        holder.close()
        idle.close()
        srv.stop()
        srv = start_server(stack, port=port, grace_seconds=GRACE)
        newcomer = RawClient(port).setup(owner=b"newcomer")
        new_open = [(c.OP_PUTFH, root), (c.OP_OPEN, open_args("new", b"n", newcomer.clientid))]
        assert newcomer.session(new_open)[0] == c.NFS4ERR_GRACE
        # the holder carries on in its restored session and reclaims its open and its lock
        again = RawClient(port)
        again.sessionid, again.seq, again.clientid = holder.sessionid, holder.seq, holder.clientid
        st, res = again.session([])
        assert res[0][2].status_flags & c.SEQ4_STATUS_RESTART_RECLAIM_NEEDED
        reclaim = open_args("locked", b"o", again.clientid, create=False)
        reclaim.claim = (c.CLAIM_PREVIOUS, c.OPEN_DELEGATE_NONE)
        st, res = again.session([(c.OP_PUTFH, fh), (c.OP_OPEN, reclaim)])
        assert st == 0
        new_sid = res[-1][2].stateid
        lock = _lock_args(new_sid, again.clientid, b"l", reclaim=True)
        assert again.session([(c.OP_PUTFH, fh), (c.OP_LOCK, lock)])[0] == 0
        assert newcomer.session(new_open)[0] == c.NFS4ERR_GRACE  # not before RECLAIM_COMPLETE
        assert again.session([(c.OP_RECLAIM_COMPLETE, False)])[0] == 0
        assert not srv.server.state.grace.in_grace()
        st, res = newcomer.session(new_open + [(c.OP_GETFH, None)])
        assert st == 0
        # the reclaimed lock holds against the newcomer
        st, res = newcomer.session(
            [
                (c.OP_PUTFH, root),
                (c.OP_OPEN, open_args("locked", b"n", newcomer.clientid, create=False)),
            ]
        )
        assert st == 0
        lock = _lock_args(res[-1][2].stateid, newcomer.clientid, b"nl")
        assert newcomer.session([(c.OP_PUTFH, fh), (c.OP_LOCK, lock)])[0] == c.NFS4ERR_DENIED
        again.close()
        newcomer.close()
    finally:
        srv.stop()


def test_an_nfsv40_client_ends_its_reclaim_with_its_first_new_open(stack):
    """NFSv4.0 has no RECLAIM_COMPLETE: a previous client that held an open has reclaimed
    once it holds state again and asks for a new open, and the grace period ends then
    (before that, its own new OPEN waits like anyone's)."""
    add_export(stack.catalog)
    srv = start_server(stack, grace_seconds=GRACE)
    port = srv.port
    try:
        raw = RawClient(port).setup40(ident=b"host-40", verifier=b"boot-one")
        root = raw.root_fh40()
        args = open_args("held40", b"owner", raw.clientid, seqid=1)
        st, res = raw.v40([(c.OP_PUTFH, root), (c.OP_OPEN, args), (c.OP_GETFH, None)])
        assert st == 0
        ok, fh = res[1][2], res[2][2]
        confirm = t.ARGS[c.OP_OPEN_CONFIRM](ok.stateid, 2)
        assert raw.v40([(c.OP_PUTFH, fh), (c.OP_OPEN_CONFIRM, confirm)])[0] == 0
        raw.close()
        srv.stop()
        srv = start_server(stack, port=port, grace_seconds=GRACE)
        raw = RawClient(port).setup40(ident=b"host-40", verifier=b"boot-one")
        new_open = [(c.OP_PUTFH, root), (c.OP_OPEN, open_args("new40", b"other", raw.clientid))]
        new_open[1][1].seqid = 1
        assert raw.v40(new_open)[0] == c.NFS4ERR_GRACE  # nothing reclaimed yet
        reclaim = open_args("held40", b"owner", raw.clientid, create=False, seqid=1)
        reclaim.claim = (c.CLAIM_PREVIOUS, c.OPEN_DELEGATE_NONE)
        assert raw.v40([(c.OP_PUTFH, fh), (c.OP_OPEN, reclaim)])[0] == 0
        assert srv.server.state.grace.in_grace()
        new_open[1][1].seqid = 2
        assert raw.v40(new_open)[0] == 0
        assert not srv.server.state.grace.in_grace()
        raw.close()
    finally:
        srv.stop()
