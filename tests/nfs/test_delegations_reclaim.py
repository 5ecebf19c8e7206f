"""Delegations over a server restart (RFC 8881 9.11, 10.2.1), by raw requests: the holder's
session outlives the restart and gets its backchannel back when it binds a connection
(SEQUENCE says CB_PATH_DOWN until then); its reclaim OPEN (CLAIM_PREVIOUS naming a write
delegation) gets the delegation again from the previous instance's catalog row, and it can
be recalled as before. A delegation nobody reclaims holds off other clients' changes while
the grace period lasts and its row goes when it ends."""

from __future__ import annotations

import struct
import time

from nfs4_rawclient import RawClient
from nfs4_support import add_export, start_server
from test_delegations import CallbackClient, make_file, read_delegation

from appliance.nfs.state.delegations import held_in_catalog
from appliance.nfs.v3 import types as t3
from appliance.nfs.v4 import const as c
from appliance.nfs.v4 import types as t

LEASE = 3
GRACE = 30  # ended early by the one reclaiming client's RECLAIM_COMPLETE


def _v3_remove(client: RawClient, dir_fh: bytes, name: str) -> int:
    args = t3.ARGS3[t3.NFSPROC3_REMOVE].encode(t3.ARGS3[t3.NFSPROC3_REMOVE].cls(dir_fh, name))
    reply = client.call_raw(t3.NFSPROC3_REMOVE, args, prog=t3.NFS_PROGRAM, vers=3)
    vlen = struct.unpack_from(">I", reply, 16)[0]
    return struct.unpack_from(">I", reply, 20 + vlen + (-vlen % 4) + 4)[0]


def test_write_delegation_reclaimed_after_restart(stack):
    add_export(stack.catalog)
    srv = start_server(stack, lease_seconds=LEASE, grace_seconds=GRACE)
    port = srv.port
    make_file(port, "ckpt")
    make_file(port, "other")
    holder = CallbackClient(port).setup()
    st, res = holder.open_file("ckpt", c.OPEN4_SHARE_ACCESS_BOTH)  # kept open over the restart
    assert st == 0 and res[2][2].delegation[0] == c.OPEN_DELEGATE_WRITE, (st, res)
    fh, old = res[3][2], res[2][2].delegation[1].stateid
    ino = srv.server.state.delegations.core.states[old.other].ino
    other_fh, other_sid = read_delegation(holder, "other")  # closed: not reclaimed
    other_ino = srv.server.state.delegations.core.states[other_sid.other].ino
    root = holder.root_fh()
    sessionid, clientid, seq = holder.sessionid, holder.clientid, holder.seq
    holder.close()
    srv.stop()

    srv = start_server(stack, port=port, lease_seconds=LEASE, grace_seconds=GRACE)
    try:
        again = CallbackClient(port)
        again.sessionid, again.clientid, again.seq = sessionid, clientid, seq
        flags = again.sequence_flags()
        assert flags & c.SEQ4_STATUS_RESTART_RECLAIM_NEEDED and flags & c.SEQ4_STATUS_CB_PATH_DOWN
        bind = t.ARGS[c.OP_BIND_CONN_TO_SESSION](sessionid, c.CDFC4_BACK_OR_BOTH, False)
        st, res = again.compound([(c.OP_BIND_CONN_TO_SESSION, bind)])
        assert st == 0 and res[0][2].dir == c.CDFS4_BOTH
        assert not again.sequence_flags() & c.SEQ4_STATUS_CB_PATH_DOWN
        # the unreclaimed read delegation holds off an NFSv3 REMOVE while it may come back
        v3 = RawClient(port)
        assert _v3_remove(v3, root, "other") == t3.NFS3ERR_JUKEBOX
        reclaim = t.ARGS[c.OP_OPEN](
            0,
            c.OPEN4_SHARE_ACCESS_BOTH,
            0,
            t.state_owner4.cls(clientid, b"o"),
            (c.OPEN4_NOCREATE, None),
            (c.CLAIM_PREVIOUS, c.OPEN_DELEGATE_WRITE),
        )
        st, res = again.session([(c.OP_PUTFH, fh), (c.OP_OPEN, reclaim)])
        assert st == 0, (st, res)
        kind, deleg = res[2][2].delegation
        assert kind == c.OPEN_DELEGATE_WRITE and not deleg.recall
        rows = held_in_catalog(stack.catalog, ino)
        assert [(r["type"], r["clientid"]) for r in rows] == [("write", clientid)]
        # a file it did not hold a delegation of: none
        st, res = again.session(
            [
                (c.OP_PUTFH, other_fh),
                (
                    c.OP_OPEN,
                    t.ARGS[c.OP_OPEN](
                        0,
                        c.OPEN4_SHARE_ACCESS_READ,
                        0,
                        t.state_owner4.cls(clientid, b"o2"),
                        (c.OPEN4_NOCREATE, None),
                        (c.CLAIM_PREVIOUS, c.OPEN_DELEGATE_WRITE),
                    ),
                ),
            ]
        )
        assert st == 0 and res[2][2].delegation[0] == c.OPEN_DELEGATE_NONE, (st, res)
        # CLAIM_DELEGATE_PREV (a client that kept delegations over its own restart, which the
        # Linux client never does): not supported, as knfsd
        prev = t.ARGS[c.OP_OPEN](
            0,
            c.OPEN4_SHARE_ACCESS_READ,
            0,
            t.state_owner4.cls(clientid, b"o3"),
            (c.OPEN4_NOCREATE, None),
            (c.CLAIM_DELEGATE_PREV, "other"),
        )
        st, _ = again.session([(c.OP_PUTFH, root), (c.OP_OPEN, prev)])
        assert st == c.NFS4ERR_NOTSUPP, st
        st, _ = again.session([(c.OP_RECLAIM_COMPLETE, False)])
        assert st == 0, st
        # the grace period is over (its only client completed): the other row goes
        assert _v3_remove(v3, root, "other") == t3.NFS3_OK
        deadline = time.monotonic() + 10
        while held_in_catalog(stack.catalog, other_ino) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert held_in_catalog(stack.catalog, other_ino) == []
        # the reclaimed delegation is recalled over the bound connection
        reader = CallbackClient(port, back_channel=False).setup()
        assert reader.open_file("ckpt", c.OPEN4_SHARE_ACCESS_READ)[0] == c.NFS4ERR_DELAY
        assert [s.other for s in again.wait_for_recall()] == [deleg.stateid.other]
        st, _ = again.session([(c.OP_PUTFH, fh), (c.OP_DELEGRETURN, deleg.stateid)])
        assert st == 0, st
        assert reader.open_file("ckpt", c.OPEN4_SHARE_ACCESS_READ)[0] == 0
        reader.close()
        v3.close()
        again.close()
    finally:
        srv.stop()
