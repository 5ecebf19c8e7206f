"""Read delegations and the NFSv4.1 backchannel, by raw requests: a client whose session has
a backchannel gets a delegation on OPEN for read; another client's conflicting request gets
DELAY while the holder is sent CB_RECALL over its own connection; DELEGRETURN lets it through;
a holder that ignores the recall is revoked after a lease (DELEG_REVOKED, and SEQUENCE says
RECALLABLE_STATE_REVOKED); NFSv3 changes meet the same recall (JUKEBOX); an export can turn
delegations off."""

from __future__ import annotations

import json
import os
import struct
import time

import pytest
from nfs4_rawclient import RawClient, open_args
from nfs4_support import add_export, start_server

from appliance.nfs.onc.xdr import Packer, UInt
from appliance.nfs.state.delegations import held_in_catalog
from appliance.nfs.v3 import types as t3
from appliance.nfs.v4 import backchannel as cb
from appliance.nfs.v4 import const as c
from appliance.nfs.v4 import types as t
from engine.admin import nfs_clients

LEASE = 3
CB_PROGRAM = 0x40000123


class CallbackClient(RawClient):
    """A raw NFSv4.1 client whose session takes callbacks on its connection: calls from the
    server met while waiting for a reply are kept (``callbacks``) and answered (unless
    ``answer`` is False)."""

    def __init__(self, port: int, *, back_channel: bool = True, **kwargs):
        super().__init__(port, **kwargs)
        self.back_channel = back_channel
        self.callbacks: list[tuple[int, int, bytes]] = []  # (prog, proc, args)
        self.answer = True
        # CB_GETATTR's answer: (size, change) of its cached file (a write delegation's)
        self.attrs: tuple[int, int] = (0, 0)

    def call_raw(self, proc, body, prog=c.NFS4_PROGRAM, vers=4, flavor=1, cred=None) -> bytes:
        self.send_call(proc, body, prog, vers, flavor, cred)
        while True:
            record = self.recv_record()
            xid, mtype = struct.unpack_from(">II", record, 0)
            if mtype == 1 and xid == self.xid:
                return record
            if mtype == 0:
                self._callback(record)

    def _callback(self, record: bytes) -> None:
        xid, _, _, prog, vers, proc = struct.unpack_from(">IIIIII", record, 0)
        flavor, clen = struct.unpack_from(">II", record, 24)
        pos = 32 + clen + (-clen % 4)
        vlen = struct.unpack_from(">I", record, pos + 4)[0]
        pos += 8 + vlen + (-vlen % 4)
        self.callbacks.append((prog, proc, record[pos:]))
        if not self.answer:
            return
        results = b""
        if proc == cb.CB_COMPOUND:
            _, apos = cb.CB_COMPOUND4args_head.unpack(record, pos)
            _, apos = UInt.unpack(record, apos)  # the count
            _, apos = UInt.unpack(record, apos)  # OP_CB_SEQUENCE
            seq, apos = cb.CB_SEQUENCE4args.unpack(record, apos)
            op, apos = UInt.unpack(record, apos)
            # status, empty tag, two results: CB_SEQUENCE's resok, then CB_RECALL's NFS4_OK or
            # CB_GETATTR's change and size
            results = struct.pack(">IIIII", 0, 0, 2, cb.OP_CB_SEQUENCE, 0) + seq.sessionid
            results += struct.pack(
                ">IIII", seq.sequenceid, seq.slotid, seq.highest_slotid, seq.highest_slotid
            )
            if op == cb.OP_CB_GETATTR:
                size, change = self.attrs
                results += struct.pack(">IIII", op, 0, 1, cb.GETATTR_WORDS[0])
                results += struct.pack(">IQQ", 16, change, size)
            else:
                results += struct.pack(">II", op, 0)
        self.send_record(struct.pack(">IIIIII", xid, 1, 0, 0, 0, 0) + results)

    def setup(self, owner=None, reclaim_complete=True):
        owner = owner or os.urandom(8)
        st, res = self.compound(
            [
                (
                    c.OP_EXCHANGE_ID,
                    t.ARGS[c.OP_EXCHANGE_ID](os.urandom(8), owner, 0, (c.SP4_NONE, None), []),
                )
            ]
        )
        assert st == 0, st
        eid = res[0][2]
        self.clientid = eid.clientid
        chan = t.channel_attrs4.cls(0, 1 << 21, 1 << 21, 1 << 20, 16, 8, [])
        back = t.channel_attrs4.cls(0, 4096, 4096, 0, 2, 1, [])
        flags = c.CREATE_SESSION4_FLAG_CONN_BACK_CHAN if self.back_channel else 0
        sec = [(c.AUTH_SYS, t.authsys_parms.cls(0, "raw", 0, 0, []))]
        st, res = self.compound(
            [
                (
                    c.OP_CREATE_SESSION,
                    t.ARGS[c.OP_CREATE_SESSION](
                        eid.clientid, eid.sequenceid, flags, chan, back, CB_PROGRAM, sec
                    ),
                )
            ]
        )
        assert st == 0, st
        assert res[0][2].flags == flags
        self.sessionid = res[0][2].sessionid
        self.seq = {i: 0 for i in range(8)}
        if reclaim_complete:
            st, _ = self.session([(c.OP_RECLAIM_COMPLETE, False)])
            assert st == 0, st
        return self

    def open_file(self, name: str, access: int, owner: bytes = b"o", create: bool = False):
        """(status, results) of PUTFH root, OPEN, GETFH."""
        return self.session(
            [
                (c.OP_PUTFH, self.root_fh()),
                (c.OP_OPEN, open_args(name, owner, self.clientid, access=access, create=create)),
                (c.OP_GETFH, None),
            ]
        )

    def getattrs(self) -> int:
        """How many CB_GETATTRs came."""
        return sum(
            struct.unpack_from(">I", args, _first_op_at(args))[0] == cb.OP_CB_GETATTR
            for prog, proc, args in self.callbacks
            if proc == cb.CB_COMPOUND
        )

    def recalls(self) -> list[t.stateid4.cls]:
        out = []
        for prog, proc, args in self.callbacks:
            assert prog == CB_PROGRAM, prog
            if proc != cb.CB_COMPOUND:
                continue
            head, pos = cb.CB_COMPOUND4args_head.unpack(args, 0)
            count, pos = UInt.unpack(args, pos)
            for _ in range(count):
                op, pos = UInt.unpack(args, pos)
                if op == cb.OP_CB_SEQUENCE:
                    _, pos = cb.CB_SEQUENCE4args.unpack(args, pos)
                elif op == cb.OP_CB_RECALL:
                    recall, pos = cb.CB_RECALL4args.unpack(args, pos)
                    out.append(recall.stateid)
                else:
                    break
        return out

    def sequence_flags(self) -> int:
        st, res = self.session([])
        assert st == 0, st
        return res[0][2].status_flags

    def wait_for_recall(self, timeout: float = 10.0) -> list:
        deadline = time.monotonic() + timeout
        while not self.recalls() and time.monotonic() < deadline:
            self.session([])  # the callback arrives among the replies
            time.sleep(0.05)
        return self.recalls()


def _first_op_at(args: bytes) -> int:
    """Where the operation after CB_SEQUENCE starts in CB_COMPOUND4args."""
    _, pos = cb.CB_COMPOUND4args_head.unpack(args, 0)
    _, pos = UInt.unpack(args, pos)
    _, pos = UInt.unpack(args, pos)
    _, pos = cb.CB_SEQUENCE4args.unpack(args, pos)
    return pos


@pytest.fixture
def deleg_server(stack):
    add_export(stack.catalog)
    srv = start_server(stack, lease_seconds=LEASE)
    yield srv
    srv.stop()


def make_file(port: int, name: str, data: bytes = b"shard") -> None:
    maker = CallbackClient(port, back_channel=False).setup()
    st, res = maker.open_file(name, c.OPEN4_SHARE_ACCESS_BOTH, create=True)
    assert st == 0, st
    fh, sid = res[3][2], res[2][2].stateid
    st, _ = maker.session(
        [(c.OP_PUTFH, fh), (c.OP_WRITE, t.ARGS[c.OP_WRITE](sid, 0, c.FILE_SYNC4, data))]
    )
    assert st == 0, st
    st, _ = maker.session([(c.OP_PUTFH, fh), (c.OP_CLOSE, t.ARGS[c.OP_CLOSE](0, sid))])
    assert st == 0, st
    maker.close()


def read_delegation(client: CallbackClient, name: str):
    """OPEN ``name`` for read, CLOSE it: (its handle, the delegation's stateid)."""
    st, res = client.open_file(name, c.OPEN4_SHARE_ACCESS_READ)
    assert st == 0, (st, res)
    ok = res[2][2]
    kind, deleg = ok.delegation
    assert kind == c.OPEN_DELEGATE_READ, ok.delegation
    fh = res[3][2]
    st, _ = client.session([(c.OP_PUTFH, fh), (c.OP_CLOSE, t.ARGS[c.OP_CLOSE](0, ok.stateid))])
    assert st == 0, st
    return fh, deleg.stateid


def test_recall_then_return_lets_the_writer_in(deleg_server, stack):
    port = deleg_server.port
    make_file(port, "shard0")
    reader = CallbackClient(port).setup()
    fh, dsid = read_delegation(reader, "shard0")
    ino = deleg_server.server.state.delegations.core.states[dsid.other].ino
    assert [r["type"] for r in held_in_catalog(stack.catalog, ino)] == ["read"]
    # what the web UI and the API show: the client, who made it, the delegation it holds
    (shown,) = [cl for cl in nfs_clients.list_clients(stack.catalog) if cl["delegations"]]
    assert shown["clientid"] == f"{reader.clientid:x}" and shown["principal"] == "sys uid 0"
    assert [(d["type"], d["path"], d["inode"], d["recalled_ns"]) for d in shown["delegations"]] == [
        ("read", "/shard0", ino, None)
    ]
    # a client without a backchannel gets none, and says why when it asks
    plain = CallbackClient(port, back_channel=False).setup()
    st, res = plain.open_file("shard0", c.OPEN4_SHARE_ACCESS_READ | 0x0100)  # WANT_READ_DELEG
    assert st == 0 and res[2][2].delegation[0] == c.OPEN_DELEGATE_NONE_EXT
    plain.close()

    writer = CallbackClient(port, back_channel=False).setup()
    st, res = writer.open_file("shard0", c.OPEN4_SHARE_ACCESS_WRITE)
    assert st == c.NFS4ERR_DELAY, (st, res)
    recalled = reader.wait_for_recall()
    assert [s.other for s in recalled] == [dsid.other]
    st, res = writer.open_file("shard0", c.OPEN4_SHARE_ACCESS_WRITE)
    assert st == c.NFS4ERR_DELAY  # not returned yet
    # the web UI and the API say it is recalled (who holds up the writer)
    (shown,) = [cl for cl in nfs_clients.list_clients(stack.catalog) if cl["delegations"]]
    assert shown["delegations"][0]["recalled_ns"] > shown["delegations"][0]["granted_ns"]
    st, _ = reader.session([(c.OP_PUTFH, fh), (c.OP_DELEGRETURN, dsid)])
    assert st == 0, st
    assert held_in_catalog(stack.catalog, ino) == []
    st, res = writer.open_file("shard0", c.OPEN4_SHARE_ACCESS_WRITE)
    assert st == 0, (st, res)
    # the file is open for writing now: a reader gets no delegation
    st, res = reader.open_file("shard0", c.OPEN4_SHARE_ACCESS_READ, owner=b"o2")
    assert st == 0 and res[2][2].delegation[0] == c.OPEN_DELEGATE_NONE
    counts = deleg_server.server.state.delegations.counts
    assert (counts["granted"], counts["recalled"], counts["returned"]) == (1, 1, 1)
    reader.close()
    writer.close()


def test_ignored_recall_is_revoked_after_a_lease(deleg_server):
    port = deleg_server.port
    make_file(port, "shard1")
    holder = CallbackClient(port).setup()
    holder.answer = False  # it hears the recall and does nothing
    fh, dsid = read_delegation(holder, "shard1")
    writer = CallbackClient(port, back_channel=False).setup()
    st, _ = writer.session(
        [
            (c.OP_PUTFH, fh),
            (c.OP_SETATTR, t.ARGS[c.OP_SETATTR](t.stateid4.cls(0, b"\0" * 12), _mode(0o600))),
        ]
    )
    assert st == c.NFS4ERR_DELAY
    assert holder.wait_for_recall()
    deadline = time.monotonic() + 4 * LEASE
    while st == c.NFS4ERR_DELAY and time.monotonic() < deadline:
        time.sleep(0.5)
        holder.session([])  # the holder renews its lease: only the recall runs out
        st, _ = writer.session(
            [
                (c.OP_PUTFH, fh),
                (c.OP_SETATTR, t.ARGS[c.OP_SETATTR](t.stateid4.cls(0, b"\0" * 12), _mode(0o600))),
            ]
        )
    assert st == 0, st
    assert holder.sequence_flags() & c.SEQ4_STATUS_RECALLABLE_STATE_REVOKED
    st, res = holder.session([(c.OP_PUTFH, fh), (c.OP_READ, t.ARGS[c.OP_READ](dsid, 0, 10))])
    assert st == c.NFS4ERR_DELEG_REVOKED, (st, res)
    st, res = holder.session([(c.OP_TEST_STATEID, [dsid])])
    assert st == 0 and res[1][2] == [c.NFS4ERR_DELEG_REVOKED]
    st, _ = holder.session([(c.OP_FREE_STATEID, dsid)])
    assert st == 0, st
    assert not holder.sequence_flags() & c.SEQ4_STATUS_RECALLABLE_STATE_REVOKED
    stats = deleg_server.server.stats()  # what the daemon samples for /metrics
    assert (stats["nfs_delegations_recalled"], stats["nfs_delegations_revoked"]) == (1, 1)
    holder.close()
    writer.close()


def _mode(mode: int):
    from appliance.nfs.v4 import attrs as fattr

    p = Packer()
    UInt.pack(p, mode)
    return t.fattr4.cls(fattr.to_bitmap([c.FATTR4_MODE]), p.getvalue())


def _v3_remove(client: RawClient, dir_fh: bytes, name: str) -> int:
    args = t3.ARGS3[t3.NFSPROC3_REMOVE].encode(t3.ARGS3[t3.NFSPROC3_REMOVE].cls(dir_fh, name))
    reply = client.call_raw(t3.NFSPROC3_REMOVE, args, prog=t3.NFS_PROGRAM, vers=3)
    verf_len = struct.unpack_from(">I", reply, 16)[0]
    pos = 20 + verf_len + (-verf_len % 4)
    assert struct.unpack_from(">I", reply, pos)[0] == 0  # accepted
    return struct.unpack_from(">I", reply, pos + 4)[0]


def test_nfsv3_remove_waits_for_the_return(deleg_server):
    port = deleg_server.port
    make_file(port, "shard2")
    holder = CallbackClient(port).setup()
    fh, dsid = read_delegation(holder, "shard2")
    root = holder.root_fh()  # a v4 handle names the same file in v3
    v3 = RawClient(port)
    assert _v3_remove(v3, root, "shard2") == t3.NFS3ERR_JUKEBOX
    assert holder.wait_for_recall()
    st, _ = holder.session([(c.OP_PUTFH, fh), (c.OP_DELEGRETURN, dsid)])
    assert st == 0, st
    assert _v3_remove(v3, root, "shard2") == t3.NFS3_OK
    holder.close()
    v3.close()


def test_backchannel_lost_means_cb_path_down_and_no_delegation(deleg_server):
    port = deleg_server.port
    make_file(port, "shard3")
    holder = CallbackClient(port).setup()
    assert not holder.sequence_flags() & c.SEQ4_STATUS_CB_PATH_DOWN
    sessionid, clientid, seq = holder.sessionid, holder.clientid, holder.seq
    holder.close()  # the only backchannel connection goes
    again = CallbackClient(port)
    again.sessionid, again.clientid, again.seq = sessionid, clientid, seq
    assert again.sequence_flags() & c.SEQ4_STATUS_CB_PATH_DOWN
    st, res = again.open_file("shard3", c.OPEN4_SHARE_ACCESS_READ)
    assert st == 0 and res[2][2].delegation[0] == c.OPEN_DELEGATE_NONE
    # BIND_CONN_TO_SESSION offers this connection for callbacks: delegations again
    bind = t.ARGS[c.OP_BIND_CONN_TO_SESSION](sessionid, c.CDFC4_BACK_OR_BOTH, False)
    st, res = again.compound([(c.OP_BIND_CONN_TO_SESSION, bind)])
    assert st == 0 and res[0][2].dir == c.CDFS4_BOTH
    assert not again.sequence_flags() & c.SEQ4_STATUS_CB_PATH_DOWN
    st, res = again.open_file("shard3", c.OPEN4_SHARE_ACCESS_READ, owner=b"o2")
    assert st == 0 and res[2][2].delegation[0] == c.OPEN_DELEGATE_READ
    again.close()


def test_export_without_delegations(stack):
    add_export(stack.catalog)
    stack.catalog.run(
        lambda conn: conn.execute(
            __import__("engine.catalog.models", fromlist=["Export"])
            .Export.__table__.update()
            .values(delegations=False)
        )
    )
    srv = start_server(stack, lease_seconds=LEASE)
    try:
        make_file(srv.port, "plain")
        reader = CallbackClient(srv.port).setup()
        st, res = reader.open_file("plain", c.OPEN4_SHARE_ACCESS_READ)
        assert st == 0 and res[2][2].delegation[0] == c.OPEN_DELEGATE_NONE
        reader.close()
    finally:
        srv.stop()


def test_a_restart_forgets_its_own_unreclaimed_rows_not_another_heads(stack):
    add_export(stack.catalog)
    srv = start_server(stack, lease_seconds=LEASE)
    port = srv.port
    make_file(port, "shard4")
    holder = CallbackClient(port).setup()
    _, dsid = read_delegation(holder, "shard4")
    ino = srv.server.state.delegations.core.states[dsid.other].ino
    (mine,) = held_in_catalog(stack.catalog, ino)
    assert mine["head"] == f"127.0.0.1:{port}" and mine["clientid"] == holder.clientid
    # another head's delegation of the same file, as it would record it
    theirs = {**mine, "head": "head2.example:2049"}
    stack.catalog.set_setting(f"nfs_delegation_{ino}_{'ab' * 12}", json.dumps(theirs))
    holder.close()
    srv.stop()
    srv = start_server(stack, port=port, lease_seconds=LEASE)
    try:
        # its own row may be reclaimed while a grace period lasts (test_delegations_reclaim),
        # and goes at its end; the other head's stays
        deadline = time.monotonic() + 4 * LEASE
        while len(held_in_catalog(stack.catalog, ino)) > 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert held_in_catalog(stack.catalog, ino) == [theirs]
    finally:
        srv.stop()
