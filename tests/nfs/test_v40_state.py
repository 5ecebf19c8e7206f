"""NFSv4.0 state rules (RFC 7530) where a conformance run against NFS-Ganesha found shingle
different: special stateids where an open's or a lock's is needed, share reservations (the
same open-owner's OPENs, I/O with the anonymous stateid, OPEN_DOWNGRADE to modes opened),
the change attribute and mtime of buffered writes, merged byte-range locks, and the
duplicate request cache of NFSv4.0 COMPOUNDs."""

from __future__ import annotations

from nfs4_rawclient import RawClient
from test_v40 import lock40, open40, open_confirmed

from appliance.nfs.v4 import const as c
from appliance.nfs.v4 import types as t

BOTH, READ, WRITE = c.OPEN4_SHARE_ACCESS_BOTH, c.OPEN4_SHARE_ACCESS_READ, c.OPEN4_SHARE_ACCESS_WRITE
DENY_NONE, DENY_READ, DENY_WRITE = (
    c.OPEN4_SHARE_DENY_NONE,
    c.OPEN4_SHARE_DENY_READ,
    c.OPEN4_SHARE_DENY_WRITE,
)
ANONYMOUS = t.stateid4.cls(0, b"\0" * 12)
BYPASS = t.stateid4.cls(0xFFFFFFFF, b"\xff" * 12)


def v40_client(server) -> tuple[RawClient, bytes]:
    raw = RawClient(server.port).setup40()
    return raw, raw.root_fh40()


# -- special stateids -----------------------------------------------------------------------------
def test_special_stateids_where_an_open_or_lock_is_needed_are_bad(server):
    raw, root = v40_client(server)
    sid, fh = open_confirmed(raw, root, "special", b"owner")
    for special in (ANONYMOUS, BYPASS):
        # the open-owner's seqid stays at 2: BAD_STATEID does not advance it (RFC 7530 9.1.7)
        ops = {
            c.OP_OPEN_CONFIRM: t.ARGS[c.OP_OPEN_CONFIRM](special, 3),
            c.OP_OPEN_DOWNGRADE: t.ARGS[c.OP_OPEN_DOWNGRADE](special, 3, READ, DENY_NONE),
            c.OP_CLOSE: t.ARGS[c.OP_CLOSE](3, special),
            c.OP_LOCKU: t.ARGS[c.OP_LOCKU](c.WRITE_LT, 1, special, 0, 10),
        }
        for opnum, args in ops.items():
            st, res = raw.v40([(c.OP_PUTFH, fh), (opnum, args)])
            assert (st, res[-1][:2]) == (c.NFS4ERR_BAD_STATEID, (opnum, c.NFS4ERR_BAD_STATEID))
        # LOCK from an open (a new lock-owner) and with an existing lock-owner's stateid
        st, res = lock40(raw, fh, c.WRITE_LT, 0, 10, open_sid=special, open_seqid=3)
        assert (st, res[-1][:2]) == (c.NFS4ERR_BAD_STATEID, (c.OP_LOCK, c.NFS4ERR_BAD_STATEID))
        st, res = lock40(raw, fh, c.WRITE_LT, 0, 10, lock_sid=special, lock_seqid=1)
        assert (st, res[-1][:2]) == (c.NFS4ERR_BAD_STATEID, (c.OP_LOCK, c.NFS4ERR_BAD_STATEID))
    # the owner goes on at its next seqid: nothing above was sequenced
    st, res = raw.v40([(c.OP_PUTFH, fh), (c.OP_CLOSE, t.ARGS[c.OP_CLOSE](3, sid))])
    assert st == 0
    raw.close()
