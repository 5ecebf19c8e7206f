"""Limits of one COMPOUND (operations, reply size) in every minor version, and the grace
period after a restart, which only restored clients that held state keep."""

from __future__ import annotations

from nfs4_rawclient import RawClient
from nfs4_support import add_export, start_server

from appliance.nfs.onc.limits import NetLimits
from appliance.nfs.v4 import const as c
from appliance.nfs.v4 import types as t

ANONYMOUS = t.stateid4.cls(0, b"\0" * 12)
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
