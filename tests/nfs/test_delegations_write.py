"""Write delegations (RFC 8881 10.4, 10.4.3, 20.1), by raw requests: a client that opens a file
for writing while no other client has it open or locked gets one (the checkpoint writer); its
stateid writes and sets the size. Another client's GETATTR of size or change first asks the
holder (CB_GETATTR) and answers the holder's size with a change attribute that moves on when
the holder's does; a holder that does not answer is recalled (DELAY meanwhile). Any access by
another client recalls it: an OPEN for reading, an NFSv3 READ, a shared NLM lock."""

from __future__ import annotations

import struct
import threading
import time
from contextlib import contextmanager

import pytest
from nfs4_rawclient import RawClient
from nfs4_support import add_export, start_server
from test_delegations import CallbackClient, make_file
from test_delegations_v3 import nlm_lock

from appliance.nfs.nlm import types as n
from appliance.nfs.state import delegations as deleg_mod
from appliance.nfs.state.delegations import held_in_catalog
from appliance.nfs.v3 import types as t3
from appliance.nfs.v4 import const as c
from appliance.nfs.v4 import types as t

LEASE = 3
BOTH, READ = c.OPEN4_SHARE_ACCESS_BOTH, c.OPEN4_SHARE_ACCESS_READ
CHANGE_SIZE = [1 << c.FATTR4_CHANGE | 1 << c.FATTR4_SIZE]


@pytest.fixture
def deleg_server(stack):
    add_export(stack.catalog)
    srv = start_server(stack, lease_seconds=LEASE, grace_seconds=0)
    yield srv
    srv.stop()


@contextmanager
def answering(client: CallbackClient):
    """The holder answers callbacks meanwhile (it hears them among the replies of its own
    calls): a thread keeps calling SEQUENCE; the block must not use ``client`` itself."""
    stop = threading.Event()

    def poll():
        while not stop.is_set():
            client.session([])
            time.sleep(0.02)

    thread = threading.Thread(target=poll)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)


def _write_delegation(holder: CallbackClient, name: str):
    """OPEN ``name`` for reading and writing: (handle, open stateid, delegation stateid)."""
    st, res = holder.open_file(name, BOTH)
    assert st == 0, (st, res)
    ok = res[2][2]
    kind, deleg = ok.delegation
    assert kind == c.OPEN_DELEGATE_WRITE, ok.delegation
    assert deleg.space_limit == (c.NFS_LIMIT_SIZE, c.NFS4_UINT64_MAX)
    return res[3][2], ok.stateid, deleg.stateid


def _change_size(client: CallbackClient, fh: bytes) -> tuple[int, int]:
    st, res = client.session([(c.OP_PUTFH, fh), (c.OP_GETATTR, CHANGE_SIZE)])
    assert st == 0, (st, res)
    return struct.unpack(">QQ", bytes(res[2][2].attr_vals))


def test_checkpoint_writer_gets_a_write_delegation(deleg_server, stack):
    port = deleg_server.port
    make_file(port, "ckpt", b"0123456789")
    holder = CallbackClient(port).setup()
    fh, osid, dsid = _write_delegation(holder, "ckpt")
    ino = deleg_server.server.state.delegations.core.states[dsid.other].ino
    assert [r["type"] for r in held_in_catalog(stack.catalog, ino)] == ["write"]
    # the delegation's stateid writes and sets the size
    write = t.ARGS[c.OP_WRITE](dsid, 0, c.FILE_SYNC4, b"abc")
    st, _ = holder.session([(c.OP_PUTFH, fh), (c.OP_WRITE, write)])
    assert st == 0, st
    size = (1 << c.FATTR4_SIZE, struct.pack(">Q", 20))
    setattr_args = t.ARGS[c.OP_SETATTR](dsid, t.fattr4.cls([size[0]], size[1]))
    st, _ = holder.session([(c.OP_PUTFH, fh), (c.OP_SETATTR, setattr_args)])
    assert st == 0, st
    # a second opener of its own keeps it; another client's open would not get one
    st, res = holder.open_file("ckpt", READ, owner=b"o2")
    assert st == 0 and res[2][2].delegation[0] == c.OPEN_DELEGATE_NONE
    assert holder.recalls() == []
    # none beside another client's open
    make_file(port, "shared")
    other = CallbackClient(port, back_channel=False).setup()
    st, _ = other.open_file("shared", READ)
    assert st == 0
    st, res = holder.open_file("shared", BOTH, owner=b"o4")
    assert st == 0 and res[2][2].delegation[0] == c.OPEN_DELEGATE_NONE
    # a client that asks for a read delegation only gets none for writing
    make_file(port, "solo")
    st, res = holder.open_file("solo", BOTH | c.OPEN4_SHARE_ACCESS_WANT_READ_DELEG, owner=b"o3")
    assert st == 0 and res[2][2].delegation[0] == c.OPEN_DELEGATE_NONE_EXT
    other.close()
    holder.close()


def test_cb_getattr_before_another_clients_getattr(deleg_server, monkeypatch):
    port = deleg_server.port
    make_file(port, "big", b"x" * 10)
    holder = CallbackClient(port).setup()
    fh, _, dsid = _write_delegation(holder, "big")
    other = CallbackClient(port, back_channel=False).setup()
    granted = deleg_server.server.state.delegations.core.states[dsid.other].granted_change
    # the holder has changed nothing: its change is the grant's, the server's own attributes
    holder.attrs = (10, granted)
    with answering(holder):
        change0, size0 = _change_size(other, fh)
    assert (change0, size0) == (granted, 10)
    assert holder.getattrs() == 1
    # it wrote 1 MiB into its cache: its size, and a change attribute past any before
    holder.attrs = (1 << 20, granted + 1)
    with answering(holder):
        change1, size1 = _change_size(other, fh)
        again = _change_size(other, fh)  # nothing more changed: the same answer
    assert size1 == 1 << 20 and change1 > change0
    assert again == (change1, size1)
    holder.attrs = (2 << 20, granted + 2)
    with answering(holder):
        change2, size2 = _change_size(other, fh)
    assert size2 == 2 << 20 and change2 > change1
    # a listing with sizes asks the holder too (ls -l in another client)
    holder.attrs = (3 << 20, granted + 3)
    with answering(holder):
        listed = _listed_change_size(other, "big")
    assert listed[1] == 3 << 20 and listed[0] > change2, listed
    # NFSv3: GETATTR asks the holder; LOOKUP and ACCESS carry no attributes (the stored
    # size, which the Linux client would take over GETATTR's), so the client asks GETATTR
    holder.attrs = (4 << 20, granted + 4)
    v3 = RawClient(port)
    try:
        with answering(holder):
            status, got = _v3(v3, t3.NFSPROC3_GETATTR, fh)
        assert status == t3.NFS3_OK and got.size == 4 << 20
        status, found = _v3(v3, t3.NFSPROC3_LOOKUP, t3.diropargs3.cls(holder.root_fh(), "big"))
        assert status == t3.NFS3_OK and found.object == fh and found.obj_attributes is None
        status, checked = _v3(v3, t3.NFSPROC3_ACCESS, t3.ACCESS3args.cls(fh, 1))
        assert status == t3.NFS3_OK and checked.obj_attributes is None
    finally:
        v3.close()
    assert holder.recalls() == []  # CB_GETATTR, never a recall
    assert deleg_server.server.state.delegations.counts["cb_getattr"] == 6
    holder.close()
    other.close()
    _unanswered_cb_getattr_recalls(deleg_server, monkeypatch)  # (one server start for both)


def _v3(raw: RawClient, proc: int, args):
    """(status, result) of an NFSv3 call."""
    reply = raw.call_raw(proc, t3.ARGS3[proc].encode(args), prog=t3.NFS_PROGRAM, vers=3)
    verf_len = struct.unpack_from(">I", reply, 16)[0]
    pos = 20 + verf_len + (-verf_len % 4)
    assert struct.unpack_from(">I", reply, pos)[0] == 0  # accepted
    return t3.RESULTS3[proc][0].decode(reply[pos + 4 :])


def _listed_change_size(client: CallbackClient, name: str) -> tuple[int, int]:
    """(change, size) of ``name`` in a READDIR of the export's root."""
    args = t.ARGS[c.OP_READDIR](0, b"\0" * 8, 4096, 65536, CHANGE_SIZE)
    st, res = client.session([(c.OP_PUTFH, client.root_fh()), (c.OP_READDIR, args)])
    assert st == 0, (st, res)
    (entry,) = [e for e in res[2][2].entries if e.name == name]
    return struct.unpack(">QQ", bytes(entry.attrs.attr_vals))


def _unanswered_cb_getattr_recalls(deleg_server, monkeypatch):
    monkeypatch.setattr(deleg_mod, "CB_GETATTR_WAIT", 0.5)
    port = deleg_server.port
    make_file(port, "mute")
    holder = CallbackClient(port).setup()
    fh, _, dsid = _write_delegation(holder, "mute")
    holder.answer = False  # it hears callbacks and answers none
    other = CallbackClient(port, back_channel=False).setup()
    st, _ = other.session([(c.OP_PUTFH, fh), (c.OP_GETATTR, CHANGE_SIZE)])
    assert st == c.NFS4ERR_DELAY
    # recalled (its one back channel slot still waits for the CB_GETATTR's answer, so the
    # CB_RECALL queues behind it) and revoked a lease later: the GETATTR goes through
    deadline = time.monotonic() + 4 * LEASE
    while st == c.NFS4ERR_DELAY and time.monotonic() < deadline:
        time.sleep(0.5)
        holder.session([])  # its lease stays; only the recall runs out
        st, _ = other.session([(c.OP_PUTFH, fh), (c.OP_GETATTR, CHANGE_SIZE)])
    assert st == 0, st
    assert holder.getattrs() == 1
    counts = deleg_server.server.state.delegations.counts
    assert (counts["recalled"], counts["revoked"]) == (1, 1)
    st, _ = holder.session([(c.OP_PUTFH, fh), (c.OP_DELEGRETURN, dsid)])
    assert st == c.NFS4ERR_DELEG_REVOKED
    holder.close()
    other.close()


def _v3_read_status(client: RawClient, fh: bytes) -> int:
    args = t3.ARGS3[t3.NFSPROC3_READ].encode(t3.ARGS3[t3.NFSPROC3_READ].cls(fh, 0, 10))
    reply = client.call_raw(t3.NFSPROC3_READ, args, prog=t3.NFS_PROGRAM, vers=3)
    vlen = struct.unpack_from(">I", reply, 16)[0]
    pos = 20 + vlen + (-vlen % 4)
    return struct.unpack_from(">I", reply, pos + 4)[0]


def test_any_access_recalls(deleg_server):
    port = deleg_server.port
    holder = CallbackClient(port).setup()
    other = CallbackClient(port, back_channel=False).setup()
    waiting = {
        "v4-open-read": c.NFS4ERR_DELAY,
        "v3-read": t3.NFS3ERR_JUKEBOX,
        "nlm-shared-lock": n.NLM4_DENIED_GRACE_PERIOD,
    }
    for access, status in waiting.items():
        make_file(port, f"f-{access}")
        fh, _, dsid = _write_delegation(holder, f"f-{access}")

        def attempt(access=access, fh=fh) -> int:
            if access == "v4-open-read":
                return other.open_file(f"f-{access}", READ)[0]
            if access == "v3-read":
                return _v3_read_status(other, fh)
            return nlm_lock(other, fh, exclusive=False)

        assert attempt() == status, access
        assert [s.other for s in holder.wait_for_recall()] == [dsid.other], access
        st, _ = holder.session([(c.OP_PUTFH, fh), (c.OP_DELEGRETURN, dsid)])
        assert st == 0, st
        assert attempt() == 0, access
        holder.callbacks.clear()
    holder.close()
    other.close()
