"""Retries on an NFSv4.1 session slot (RFC 8881 2.10.6), with a raw peer resending the same
SEQUENCE slot and seqid, on the same connection or a new one: a retry of a COMPOUND that
changed nothing runs again (its reply is never kept); one that changed something gets its
first reply, kept with or without sa_cachethis; one whose reply was not kept gets
NFS4ERR_RETRY_UNCACHED_REP on the operation after SEQUENCE, never on SEQUENCE; one of a
COMPOUND still running gets NFS4ERR_DELAY. A request with the slot's seqid from another
principal, or with other arguments than one that changed something, is a false retry:
NFS4ERR_SEQ_FALSE_RETRY, never the kept reply. What the slots keep stays within the server's
budget. And nfs-rs, resending its READs after a stall, gets its file."""

from __future__ import annotations

import fcntl
import struct
import termios
import threading
import time
from collections import Counter
from types import SimpleNamespace

import pytest
from nfs4_rawclient import RawClient, auth_sys, open_args, stateid
from nfs4_support import every_worker_busy, nfsrs

from appliance.nfs.onc.rpc import RPCSEC_GSS, UNMAPPED, Credential
from appliance.nfs.state import NfsError
from appliance.nfs.state.model import Slot
from appliance.nfs.v4 import attrs as fattr
from appliance.nfs.v4 import compound
from appliance.nfs.v4 import const as c
from appliance.nfs.v4 import types as t
from engine.namespace import ROOT

CHANGE = (c.OP_GETATTR, [1 << c.FATTR4_CHANGE])


def _write(sid, offset: int, data: bytes):
    return (
        c.OP_WRITE,
        t.ARGS[c.OP_WRITE](stateid(sid.seqid, sid.other), offset, c.FILE_SYNC4, data),
    )


def _read(sid, offset: int, count: int):
    return (c.OP_READ, t.ARGS[c.OP_READ](stateid(sid.seqid, sid.other), offset, count))


def _send(raw: RawClient, slot: int, ops, *, bump=True, cachethis=False) -> bytes:
    """The COMPOUND's raw reply, SEQUENCE on ``slot`` (``bump`` False: the same seqid again)."""
    seq = raw.sequence_op(slot, bump=bump, cachethis=cachethis)
    return raw.call_raw(1, raw.compound_bytes([seq, *ops]))


def _change(raw: RawClient, fh: bytes) -> bytes:
    st, res = raw.session([(c.OP_PUTFH, fh), CHANGE], slot=7)
    assert st == 0
    return res[-1][2].attr_vals


def test_retries_on_a_slot(stack, server, monkeypatch):
    """One server for the raw checks below (a server start costs a second)."""
    _run_again_replay_or_say_uncached(server)
    _a_retry_of_a_running_compound_is_delayed(server)
    _false_retries_and_misordered_seqids(server)
    _another_caller_never_gets_a_kept_reply(stack, server)
    _sessions_share_the_budget(server, monkeypatch)


def _run_again_replay_or_say_uncached(server):
    slots = server.server.state.sessions
    raw = RawClient(server.port).setup()
    fh, sid = raw.open_new("f")
    assert raw.session([(c.OP_PUTFH, fh), _write(sid, 0, b"a" * 100)])[0] == 0

    # the same session on a new connection, as a client that reconnected
    other = RawClient(server.port)
    other.sessionid, other.seq = raw.sessionid, raw.seq
    # a READ, with and without sa_cachethis: nothing kept; its retry (on the new connection for
    # one) runs again, and so reads what another request wrote in between
    for slot, cachethis in ((1, False), (2, True)):
        read = [(c.OP_PUTFH, fh), _read(sid, 0, 100)]
        assert raw.parse(_send(raw, slot, read, cachethis=cachethis))[0] == 0
        assert slots[raw.sessionid].slots[slot].reply is None
        fill = bytes([ord("b") + slot]) * 100
        assert raw.session([(c.OP_PUTFH, fh), _write(sid, 0, fill)], slot=0)[0] == 0
        peer = other if cachethis else raw
        st, res = raw.parse(_send(peer, slot, read, bump=False, cachethis=cachethis))
        assert st == 0 and bytes(res[-1][2].data) == fill
        assert res[0][2].sequenceid == raw.seq[slot]
        assert raw.session(read, slot=slot)[0] == 0  # the slot goes on with the next seqid

    # a WRITE (with GETATTR change), with and without sa_cachethis: the retry gets the first
    # reply byte for byte, and the WRITE ran once (the change attribute moved once)
    for slot, cachethis in ((3, False), (4, True)):
        ops = [(c.OP_PUTFH, fh), _write(sid, 0, b"w" * 100), CHANGE]
        first = _send(raw, slot, ops, cachethis=cachethis)
        st, res = raw.parse(first)
        assert st == 0
        for peer in (raw, raw, other):  # replays of a kept reply keep nothing more
            used = server.server.state.slot_replies.used
            again = _send(peer, slot, ops, bump=False, cachethis=cachethis)
            assert again[4:] == first[4:]  # (all but the xid)
            assert server.server.state.slot_replies.used == used
        assert _change(raw, fh) == res[-1][2].attr_vals

    # a session whose slots keep replies of at most 600 bytes: a WRITE with a READ of 2 KiB
    # without sa_cachethis is answered, not kept; its retry runs nothing
    small = RawClient(server.port).setup(cached=600)
    fh2, sid2 = small.open_new("g")
    ops = [(c.OP_PUTFH, fh2), _write(sid2, 0, b"x" * 4096), _read(sid2, 0, 2048)]
    st, res = small.parse(_send(small, 1, ops))
    assert st == 0 and len(res[-1][2].data) == 2048
    before = _change(small, fh2)
    st, res = small.parse(_send(small, 1, ops, bump=False))
    assert st == c.NFS4ERR_RETRY_UNCACHED_REP
    assert res[0][:2] == (c.OP_SEQUENCE, 0) and res[0][2].sequenceid == small.seq[1]
    assert res[1:] == [(c.OP_PUTFH, c.NFS4ERR_RETRY_UNCACHED_REP, None)]
    assert _change(small, fh2) == before
    assert small.session([(c.OP_PUTFH, fh2), _read(sid2, 0, 10)], slot=1)[0] == 0
    # with sa_cachethis the reply must fit: REP_TOO_BIG_TO_CACHE, the slot still usable
    st, res = small.parse(_send(small, 2, ops, cachethis=True))
    assert st == c.NFS4ERR_REP_TOO_BIG_TO_CACHE
    assert small.session([(c.OP_PUTFH, fh2)], slot=2)[0] == 0
    small.close()
    other.close()
    raw.close()


def _a_retry_of_a_running_compound_is_delayed(server):
    raw = RawClient(server.port).setup()
    root = raw.root_fh()
    readdir = (c.OP_READDIR, t.ARGS[c.OP_READDIR](0, b"\0" * 8, 8192, 32768, [1 << c.FATTR4_TYPE]))
    ops = [(c.OP_PUTFH, root), readdir]  # READDIR needs a worker: the slot stays taken
    with every_worker_busy(server):
        raw.send_call(1, raw.compound_bytes([raw.sequence_op(3), *ops]))
        original = raw.xid
        # the retry, answered by the event loop while the original waits for a worker
        reply = _send(raw, 3, ops, bump=False)
        assert struct.unpack_from(">I", reply)[0] == raw.xid
        assert raw.parse(reply) == (c.NFS4ERR_DELAY, [(c.OP_SEQUENCE, c.NFS4ERR_DELAY, None)])
        # the next seqid before the reply came: misordered, the slot untouched
        st, _ = raw.parse(_send(raw, 3, ops))
        assert st == c.NFS4ERR_SEQ_MISORDERED
        raw.seq[3] -= 1
    reply = raw.recv_record()
    assert struct.unpack_from(">I", reply)[0] == original and raw.parse(reply)[0] == 0
    # now done: the retry runs again (READDIR changes nothing)
    st, res = raw.parse(_send(raw, 3, ops, bump=False))
    assert st == 0 and res[0][2].sequenceid == raw.seq[3]
    raw.close()


def _false_retries_and_misordered_seqids(server):
    raw = RawClient(server.port).setup()
    root = raw.root_fh()
    mkdir = (c.OP_CREATE, t.ARGS[c.OP_CREATE]((c.NF4DIR, None), "once", t.fattr4.cls([], b"")))
    first = raw.session([(c.OP_PUTFH, root), mkdir], slot=1, raw_reply=True)
    assert raw.parse(first)[0] == 0
    # a retransmit (same slot, same seqid, same bytes) gets the kept reply, not a second CREATE
    again = raw.session([(c.OP_PUTFH, root), mkdir], slot=1, bump=False, raw_reply=True)
    assert again[4:] == first[4:] and raw.parse(again)[0] == 0
    # same slot and seqid, other contents than the CREATE: a false retry, neither the kept
    # reply nor a run; the slot keeps its reply for the genuine retransmit
    retries = server.server.state.slot_replies.retries
    false_before = retries["false"]
    st, res = raw.session([(c.OP_PUTFH, root), (c.OP_GETFH, None)], slot=1, bump=False)
    assert (st, res) == (c.NFS4ERR_SEQ_FALSE_RETRY, [(c.OP_SEQUENCE, st, None)])
    assert retries["false"] == false_before + 1
    again = raw.session([(c.OP_PUTFH, root), mkdir], slot=1, bump=False, raw_reply=True)
    assert again[4:] == first[4:]
    # other contents than a request that changed nothing (nfs-rs after EOF reads, which fails
    # on SEQ_FALSE_RETRY): run as a new request, nothing kept to give away
    assert raw.session([(c.OP_PUTFH, root), CHANGE], slot=2)[0] == 0
    getfh = raw.session(
        [(c.OP_PUTFH, root), (c.OP_GETFH, None)], slot=2, bump=False, raw_reply=True
    )
    st, res = raw.parse(getfh)
    assert st == 0 and res[-1][2] == root and retries["reused"] >= 1
    # ... and that request is now the one a retransmit repeats (it changed nothing: run again)
    again = raw.session(
        [(c.OP_PUTFH, root), (c.OP_GETFH, None)], slot=2, bump=False, raw_reply=True
    )
    assert again[4:] == getfh[4:]
    # skipping a seqid is misordered; the next one in order works
    raw.seq[1] += 5
    st, _ = raw.session([(c.OP_PUTFH, root)], slot=1, bump=False)
    assert st == c.NFS4ERR_SEQ_MISORDERED
    raw.seq[1] -= 5
    st, res = raw.session([(c.OP_PUTFH, root), mkdir], slot=1)
    assert st == c.NFS4ERR_EXIST
    st, _ = raw.session([(c.OP_PUTFH, root)], slot=99)
    assert st == c.NFS4ERR_BADSLOT
    raw.close()


def _another_caller_never_gets_a_kept_reply(stack, server):
    """One client's session used by several users (as the Linux client shares it): the same
    bytes on the same slot and seqid under another credential are a false retry, never the
    first caller's kept reply. Before, the slot compared uid and gid only, so a caller of the
    same uid and gid without the file's group got the reply with the group's data."""
    raw = RawClient(server.port).setup()  # no_root_squash: root makes the file
    fh, sid = raw.open_new("team", owner=b"root")
    secret = b"the team's secret"
    write = (c.OP_WRITE, t.ARGS[c.OP_WRITE](sid, 0, c.FILE_SYNC4, secret))
    assert raw.session([(c.OP_PUTFH, fh), write])[0] == 0
    ino = stack.namespace.resolve("/team").ino
    stack.namespace.setattr(ROOT, ino, mode=0o640, gid=2000)
    member = auth_sys(1001, 1001, gids=[2000])
    # an OPEN (it changes something: the reply is kept) and a READ of the current stateid
    current = stateid(1, b"\0" * 12)
    ops = [
        (c.OP_PUTFH, raw.root_fh()),
        (c.OP_OPEN, open_args("team", b"member", raw.clientid, c.OPEN4_SHARE_ACCESS_READ, False)),
        (c.OP_READ, t.ARGS[c.OP_READ](current, 0, 100)),
    ]
    raw.cred = member
    first = _send(raw, 5, ops, cachethis=True)
    st, res = raw.parse(first)
    assert st == 0 and bytes(res[-1][2].data) == secret
    assert server.server.state.sessions[raw.sessionid].slots[5].reply is not None
    for other in (
        auth_sys(1001, 1001),  # the same uid and gid, not in group 2000
        auth_sys(1002, 1002, gids=[2000]),  # another member
    ):
        raw.cred = other
        reply = _send(raw, 5, ops, bump=False, cachethis=True)
        assert secret not in reply
        assert raw.parse(reply) == (
            c.NFS4ERR_SEQ_FALSE_RETRY,
            [(c.OP_SEQUENCE, c.NFS4ERR_SEQ_FALSE_RETRY, None)],
        )
    # the caller who sent it still gets its reply, byte for byte
    raw.cred = member
    assert _send(raw, 5, ops, bump=False, cachethis=True)[4:] == first[4:]
    # the caller outside the group, on the next seqid: its own answer, ACCESS
    raw.cred = auth_sys(1001, 1001)
    st, res = raw.parse(_send(raw, 5, ops, cachethis=True))
    assert st == c.NFS4ERR_ACCESS and res[-1][0] == c.OP_OPEN
    raw.cred = auth_sys(0, 0)
    raw.close()


def _gss(principal: str) -> Credential:
    # a Kerberos principal the name service does not map (each export's anonymous identity)
    return Credential(RPCSEC_GSS, UNMAPPED, UNMAPPED, (), principal=principal, sec=390003)


@pytest.mark.parametrize("kept", [True, False])
def test_two_unmapped_principals_are_two_callers(kept):
    """Two Kerberos principals that both map to no uid have the same uid and gid: the slot
    tells them apart by the principal, whether its reply was kept or not."""
    record = b"\0" * 8 + b"the same COMPOUND arguments"
    alice = compound._fingerprint(_gss("alice@REALM"), record, 8)
    bob = compound._fingerprint(_gss("bob@REALM"), record, 8)
    slot = Slot(seqid=3, fingerprint=alice)
    slot.reply = [b"alice's reply"] if kept else None
    retry = SimpleNamespace(sequenceid=3, slotid=0)
    retries: Counter = Counter()
    with pytest.raises(NfsError) as refused:
        compound._retry_uncached(slot, retry, bob, retries)
    assert refused.value.status == c.NFS4ERR_SEQ_FALSE_RETRY and retries["false"] == 1
    if kept:
        with pytest.raises(compound.Replay) as replay:
            compound._retry_uncached(slot, retry, alice, retries)
        assert replay.value.chunks == [b"alice's reply"]
    else:
        assert compound._retry_uncached(slot, retry, alice, retries) is True  # uncached


def _create_session(raw: RawClient, slots: int = 8, cached: int = 4096):
    """Another session of ``raw``'s client: (status, CREATE_SESSION4resok or None)."""
    fore = t.channel_attrs4.cls(0, 1 << 20, 1 << 20, cached, 16, slots, [])
    back = t.channel_attrs4.cls(0, 4096, 4096, 0, 2, 1, [])
    args = t.ARGS[c.OP_CREATE_SESSION](
        raw.clientid, raw.cs_sequence, 0, fore, back, 0x40000000, [(0, None)]
    )
    st, res = raw.compound([(c.OP_CREATE_SESSION, args)])
    if st == 0:
        raw.cs_sequence += 1
    return st, res[0][2]


def _sessions_share_the_budget(server, monkeypatch):
    """One client makes session after session, each asking 8 slots keeping 4 KiB: CREATE_SESSION
    grants what the budget allows and reserves it (a session takes at most an eighth of what is
    left): 7 slots, then fewer, then one slot of a smaller cached size, then NOSPC; the
    reservations never pass the budget. A reply that fits its session's cached size is always
    kept, however full the budget; with sa_cachethis a bigger one is REP_TOO_BIG_TO_CACHE. A
    destroyed session gives its room back."""
    replies = server.server.state.slot_replies
    assert replies.max_bytes == server.server.limits.slot_replies_bytes == 64 << 20
    monkeypatch.setattr(replies, "max_bytes", replies.reserved + (256 << 10))
    raw = RawClient(server.port).setup(cached=4096)  # the first session: 7 slots
    root = raw.root_fh()
    assert len(server.server.state.sessions[raw.sessionid].slots) == 7
    grants, refused = [], replies.sessions["refused"]
    while len(grants) < 100:
        st, ok = _create_session(raw)
        assert replies.reserved <= replies.max_bytes
        if st == c.NFS4ERR_NOSPC:
            break
        assert st == 0
        fore = ok.fore_chan_attrs
        grants.append((ok.sessionid, fore.maxrequests, fore.maxresponsesize_cached))
        sess = server.server.state.sessions[ok.sessionid]
        assert sess.reserved == fore.maxrequests * (fore.maxresponsesize_cached + 256)
        assert len(sess.slots) == fore.maxrequests
    assert st == c.NFS4ERR_NOSPC and replies.sessions["refused"] == refused + 1
    slots = [n for _, n, _ in grants]
    cached = [size for _, _, size in grants]
    assert slots == sorted(slots, reverse=True) and cached == sorted(cached, reverse=True)
    assert slots[0] == 6 and 1 < slots[len(slots) // 4] < 6  # fewer and fewer slots
    assert cached[0] == 4096 and cached[-1] == 1024  # then one slot of a smaller size
    assert any(n == 1 and 1024 < size < 4096 for _, n, size in grants)
    assert replies.max_bytes - replies.reserved < 1024 + 256  # not one more slot fits

    # the last session, one slot of 1 KiB, with the budget spent: a CREATE's reply of about
    # 250 bytes is kept and replayed; with sa_cachethis a reply past 1 KiB is refused
    last = RawClient(server.port)
    last.sessionid, last.seq = grants[-1][0], {0: 0}

    def mkdir(name, extra=()):
        create = t.ARGS[c.OP_CREATE]((c.NF4DIR, None), name, t.fattr4.cls([], b""))
        return [(c.OP_PUTFH, root), (c.OP_CREATE, create), (c.OP_GETFH, None), CHANGE, *extra]

    first = _send(last, 0, mkdir("small"), cachethis=True)
    assert last.parse(first)[0] == 0
    assert _send(last, 0, mkdir("small"), bump=False, cachethis=True)[4:] == first[4:]
    # every readable attribute of words 0 and 1 (a write-only one is INVAL)
    everything = (c.OP_GETATTR, [0xFFFFFFFF, 0xFFFFFFFF & ~fattr.WRITE_ONLY_BITMAP[1], 0])
    st, res = last.parse(_send(last, 0, mkdir("big", [everything] * 4), cachethis=True))
    assert st == c.NFS4ERR_REP_TOO_BIG_TO_CACHE and res[-1][0] == c.OP_GETATTR
    # a destroyed session gives its room back: the refused CREATE_SESSION now gets a slot
    reserved = replies.reserved
    last.close()
    st, _ = raw.compound([(c.OP_DESTROY_SESSION, grants[0][0])])
    assert st == 0 and replies.reserved == reserved - 6 * (4096 + 256)
    st, ok = _create_session(raw)
    assert st == 0 and ok.fore_chan_attrs.maxrequests >= 1
    raw.close()


STALL_MAX_S = 60.0  # nfs-rs 0.8.7 resends the READs of a 3 MiB read after about 10 s


def _bytes_waiting(server) -> int:
    """Request bytes the server's connections have received and not read yet."""
    waiting = 0
    for conn in list(server.server.connections):
        sock = conn.transport.get_extra_info("socket")
        waiting += struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0" * 4))[0]
    return waiting


def _stall_until_resent(server) -> None:
    """On the event loop: nothing is answered until the requests waiting when they stopped
    coming (the first ones, steady for a second) are followed by more (the client resends)."""
    began = steady_since = time.monotonic()
    first = last = 0
    while time.monotonic() - began < STALL_MAX_S:
        time.sleep(0.05)
        waiting = _bytes_waiting(server)
        if waiting != last:
            last, steady_since = waiting, time.monotonic()
        if not first and waiting and time.monotonic() - steady_since > 1.0:
            first = waiting
        if first and waiting > first:
            time.sleep(0.5)  # the rest of the resent requests
            return


def test_nfs_rs_survives_a_resent_read(server):
    """The server's event loop stalls (as under load) while nfs-rs reads, until nfs-rs resends
    its READs on the same connection with the same slots and seqids (it drops the first replies
    when they come). The loop then answers each first READ and, after it, its retry, which runs
    again: the read returns the file (it failed with NFS4ERR_RETRY_UNCACHED_REP when the slots
    kept READ replies up to 256 KiB, and these are 384 KiB), and the client goes on."""
    data = bytes(range(256)) * (3 << 12)  # 3 MiB: eight READs of 384 KiB at once
    retries = server.server.state.slot_replies.retries
    with nfsrs(server.port) as client:
        with client.open("/big", "wb") as f:
            f.write(data)
        with client.open("/big", "rb") as f:
            stalled = threading.Event()

            def stall():
                stalled.set()
                _stall_until_resent(server)

            server.server.loop.call_soon_threadsafe(stall)
            assert stalled.wait(10)
            before = retries["rerun"] + retries["delayed"]
            assert f.read() == data
        assert retries["rerun"] + retries["delayed"] > before  # it did resend
        assert client.stat("/big").size == len(data)
