"""Asynchronous COPY (RFC 7862 15.2, 15.8, 15.9, 16.1) by raw NFSv4.2 requests over a session
with a backchannel: the COPY is answered at once with a copy stateid and the client is sent
CB_OFFLOAD with the result; OFFLOAD_STATUS says how far it got; OFFLOAD_CANCEL stops it (no
CB_OFFLOAD then); bad stateids; a client without a backchannel, or a copy too small, gets a
synchronous copy; credentials are checked at the COPY and for every piece (a copy refused
midway reports its error and the bytes it copied); a server restart during a copy never
reports it complete; a client that goes has its copies dropped."""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
import time

import pytest
from nfs4_rawclient import auth_sys, open_args, stateid
from nfs4_support import Stack, add_export, start_server
from test_delegations import CallbackClient

from appliance.nfs.onc.xdr import UInt
from appliance.nfs.v4 import backchannel as cb
from appliance.nfs.v4 import const as c
from appliance.nfs.v4 import offload
from appliance.nfs.v4 import types as t
from engine.namespace import ROOT

A = t.ARGS
MiB = 1 << 20
SIZE = 8 * MiB  # above offload.ASYNC_MIN


class OffloadClient(CallbackClient):
    """A raw NFSv4.2 client that answers callbacks and reads the CB_OFFLOADs among them."""

    def __init__(self, port: int, *, back_channel: bool = True, uid: int = 0):
        super().__init__(port, back_channel=back_channel)
        self.minor = 2
        self.cred = auth_sys(uid, uid)

    def offloads(self) -> list:
        out = []
        for _, proc, args in self.callbacks:
            if proc != cb.CB_COMPOUND:
                continue
            _, pos = cb.CB_COMPOUND4args_head.unpack(args, 0)
            count, pos = UInt.unpack(args, pos)
            for _ in range(count):
                op, pos = UInt.unpack(args, pos)
                if op == cb.OP_CB_SEQUENCE:
                    _, pos = cb.CB_SEQUENCE4args.unpack(args, pos)
                elif op == cb.OP_CB_OFFLOAD:
                    found, pos = cb.CB_OFFLOAD4args.unpack(args, pos)
                    out.append(found)
                else:
                    break
        return out

    def wait_for_offload(self, n: int = 1, timeout: float = 20.0) -> list:
        """The CB_OFFLOADs received once there are ``n`` (or the timeout passed)."""
        deadline = time.monotonic() + timeout
        while len(self.offloads()) < n and time.monotonic() < deadline:
            self.session([])  # the callback arrives among the replies
            time.sleep(0.05)
        return self.offloads()

    def next_callback(self) -> None:
        """Block until the server's next callback arrives, and answer it."""
        while True:
            record = self.recv_record()
            if struct.unpack_from(">I", record, 4)[0] == 0:  # a CALL, not a late reply
                self._callback(record)
                return

    def new_file(self, name: str, data: bytes = b""):
        """(handle, open stateid) of a new file opened for read and write, holding ``data``."""
        st, res = self.session(
            [
                (c.OP_PUTFH, self.root_fh()),
                (c.OP_OPEN, open_args(name, name.encode(), self.clientid)),
                (c.OP_GETFH, None),
            ]
        )
        assert st == 0, res
        fh, sid = res[-1][2], res[2][2].stateid
        for pos in range(0, len(data), MiB):
            write = A[c.OP_WRITE](sid, pos, c.FILE_SYNC4, data[pos : pos + MiB])
            st, res = self.session([(c.OP_PUTFH, fh), (c.OP_WRITE, write)])
            assert st == 0, res
        return fh, sid

    def copy(self, src, dst, count=0, synchronous=False, src_offset=0, dst_offset=0):
        """(status, COPY4resok) of COPY from ``src`` to ``dst`` ((handle, stateid) pairs)."""
        args = A[c.OP_COPY](src[1], dst[1], src_offset, dst_offset, count, False, synchronous, [])
        st, res = self.session(
            [(c.OP_PUTFH, src[0]), (c.OP_SAVEFH, None), (c.OP_PUTFH, dst[0]), (c.OP_COPY, args)]
        )
        return st, res[-1][2]

    def on_file(self, fh, op, args):
        st, res = self.session([(c.OP_PUTFH, fh), (op, args)])
        return st, res[-1][2]

    def read_all(self, fh, sid, size: int) -> bytes:
        out = b""
        while len(out) < size:
            st, got = self.on_file(fh, c.OP_READ, A[c.OP_READ](sid, len(out), 128 << 10))
            assert st == 0, st
            out += bytes(got.data)
            if got.eof:
                break
        return out


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One stack and server for the module's tests (the restart test has its own)."""
    folder = tmp_path_factory.mktemp("offload")
    stack = Stack(folder, drive_size=48 * MiB, zone_size=2 * MiB, fragment_size=64 * 1024)
    add_export(stack.catalog)
    srv = start_server(stack)
    yield stack, srv
    srv.stop()
    stack.close()
    shutil.rmtree(folder / "drives", ignore_errors=True)


@pytest.fixture
def server(shared):
    """The shared server, its copier at full pace and its counters at zero for each test; the
    test's files and copies go after it."""
    stack, srv = shared
    offloads = srv.server.offloads
    offloads.counts = dict.fromkeys(offloads.counts, 0)
    yield srv
    for st in list(offloads.copies.values()):
        st.stop.set()
    offloads.copies.clear()
    offloads.piece, offloads.rate_bytes_s = offload.PIECE, 0.0
    ns = stack.namespace
    root = ns.resolve("/").ino
    for entry in ns.readdir(ROOT, root)[0]:
        ns.unlink(ROOT, root, entry.name)


@pytest.fixture
def shared_stack(shared):
    return shared[0]


@pytest.fixture
def client(server):
    cl = OffloadClient(server.port).setup()
    yield cl
    cl.close()


def _slow(server, bytes_per_s: float) -> None:
    """Pace the server's copier so that a test can watch it run."""
    server.server.offloads.piece = 256 << 10
    server.server.offloads.rate_bytes_s = bytes_per_s


def test_async_copy_answers_at_once_and_reports_by_cb_offload(server, client, shared_stack):
    data = os.urandom(SIZE)
    src = client.new_file("from", data)
    dst = client.new_file("to")
    st, ok = client.copy(src, dst)
    assert st == 0, st
    assert (ok.requirements.consecutive, ok.requirements.synchronous) == (True, False)
    [sid] = ok.response.callback_id
    (found,) = client.wait_for_offload()
    assert (bytes(found.fh), found.stateid) == (dst[0], sid)
    status, result = found.info
    assert status == c.NFS4_OK
    assert (result.callback_id, result.count) == ([], SIZE)
    assert result.committed == c.FILE_SYNC4
    assert bytes(result.writeverf) == server.server.write_verifier
    got = client.read_all(dst[0], dst[1], SIZE)
    assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest()
    # OFFLOAD_STATUS of a finished copy: all of it, with its status; it cannot be cancelled
    st, res = client.on_file(dst[0], c.OP_OFFLOAD_STATUS, sid)
    assert st == 0 and (res.count, res.complete) == (SIZE, [c.NFS4_OK])
    st, _ = client.on_file(dst[0], c.OP_OFFLOAD_CANCEL, sid)
    assert st == c.NFS4ERR_COMPLETE_ALREADY
    counts = server.server.offloads.counts
    assert (counts["started"], counts["completed"], counts["callbacks_answered"]) == (1, 1, 1)
    # a second copy into the middle of the file, from an offset of the source
    st, ok = client.copy(src, dst, count=5 * MiB, src_offset=MiB, dst_offset=2 * MiB)
    assert st == 0 and ok.requirements.synchronous is False
    assert len(client.wait_for_offload(2)) == 2
    want = data[: 2 * MiB] + data[MiB : 6 * MiB] + data[7 * MiB :]
    assert client.read_all(dst[0], dst[1], SIZE) == want
    assert shared_stack.namespace.getattr(shared_stack.namespace.resolve("/to").ino).size == SIZE


def test_offload_status_shows_progress_and_cancel_stops_the_copy(server, client, shared_stack):
    _slow(server, 2 * MiB)
    src = client.new_file("from", os.urandom(SIZE))
    dst = client.new_file("to")
    st, ok = client.copy(src, dst)
    assert st == 0 and ok.requirements.synchronous is False
    [sid] = ok.response.callback_id
    seen = []
    for _ in range(3):
        time.sleep(0.4)
        st, res = client.on_file(dst[0], c.OP_OFFLOAD_STATUS, sid)
        assert st == 0 and res.complete == [], (st, res)
        seen.append(res.count)
    assert seen == sorted(seen) and 0 < seen[-1] < SIZE and seen[0] < seen[-1], seen
    st, _ = client.on_file(dst[0], c.OP_OFFLOAD_CANCEL, sid)
    assert st == 0
    st, _ = client.on_file(dst[0], c.OP_OFFLOAD_STATUS, sid)
    assert st == c.NFS4ERR_BAD_STATEID
    ino = shared_stack.namespace.resolve("/to").ino
    time.sleep(0.3)  # the piece under way ends
    size = shared_stack.namespace.getattr(ino).size
    time.sleep(1.0)
    client.session([])
    assert shared_stack.namespace.getattr(ino).size == size < SIZE  # the copier stopped
    assert client.offloads() == []  # no CB_OFFLOAD after a cancel
    assert server.server.offloads.counts["cancelled"] == 1
    assert server.server.offloads.copies == {}


def test_bad_stateids_are_refused(server, client):
    _slow(server, 1 * MiB)
    src = client.new_file("from", os.urandom(SIZE))
    dst = client.new_file("to")
    st, ok = client.copy(src, dst)
    assert st == 0
    [sid] = ok.response.callback_id
    made_up = stateid(1, server.server.state.boot.to_bytes(4, "big") + os.urandom(8))
    for op in (c.OP_OFFLOAD_STATUS, c.OP_OFFLOAD_CANCEL):
        assert client.on_file(dst[0], op, made_up)[0] == c.NFS4ERR_BAD_STATEID
        assert client.on_file(dst[0], op, dst[1])[0] == c.NFS4ERR_BAD_STATEID  # an open's
        assert client.on_file(src[0], op, sid)[0] == c.NFS4ERR_BAD_STATEID  # another file
        st, res = client.session([(op, sid)])
        assert st == c.NFS4ERR_NOFILEHANDLE, res
    # another client cannot see or cancel this one's copy
    other = OffloadClient(server.port).setup()
    for op in (c.OP_OFFLOAD_STATUS, c.OP_OFFLOAD_CANCEL):
        assert other.on_file(dst[0], op, sid)[0] == c.NFS4ERR_BAD_STATEID
    other.close()
    st, res = client.on_file(dst[0], c.OP_OFFLOAD_STATUS, sid)
    assert st == 0 and res.complete == []
    assert client.on_file(dst[0], c.OP_OFFLOAD_CANCEL, sid)[0] == 0
    # COPY with a bad source stateid fails at once, as a synchronous one does
    st, _ = client.copy((src[0], made_up), dst)
    assert st == c.NFS4ERR_BAD_STATEID


def test_synchronous_without_a_backchannel_or_for_a_small_copy(server):
    plain = OffloadClient(server.port, back_channel=False).setup()
    src = plain.new_file("from", os.urandom(SIZE))
    dst = plain.new_file("to")
    st, ok = plain.copy(src, dst)
    assert st == 0 and ok.requirements.synchronous is True
    assert (ok.response.callback_id, ok.response.count) == ([], SIZE)
    plain.close()
    with_back = OffloadClient(server.port).setup()
    small = with_back.new_file("small", os.urandom(offload.ASYNC_MIN - 1))
    st, ok = with_back.copy(small, with_back.new_file("small.copy"))
    assert st == 0 and ok.requirements.synchronous is True
    assert ok.response.count == offload.ASYNC_MIN - 1
    with_back.close()
    counts = server.server.offloads.counts
    assert (counts["started"], counts["synchronous"]) == (0, 1)


def test_credentials_are_checked_at_the_copy(server, shared_stack):
    ns = shared_stack.namespace
    ns.setattr(ROOT, ns.resolve("/").ino, mode=0o777)
    user = OffloadClient(server.port, uid=1000).setup()
    src = user.new_file("from", os.urandom(SIZE))
    dst = user.new_file("to")
    # the destination becomes read-only to its owner while the open stays
    ns.setattr(ROOT, ns.resolve("/to").ino, mode=0o444)
    st, _ = user.copy(src, dst)
    assert st == c.NFS4ERR_ACCESS
    st, _ = user.copy(src, dst, synchronous=True)
    assert st == c.NFS4ERR_ACCESS
    assert server.server.offloads.counts["started"] == 0
    user.close()


def test_a_copy_that_fails_reports_its_error_and_the_bytes_copied(server, shared_stack):
    ns = shared_stack.namespace
    ns.setattr(ROOT, ns.resolve("/").ino, mode=0o777)
    _slow(server, 2 * MiB)
    user = OffloadClient(server.port, uid=1000).setup()
    src = user.new_file("from", os.urandom(SIZE))
    dst = user.new_file("to")
    st, ok = user.copy(src, dst)
    assert st == 0 and ok.requirements.synchronous is False
    [sid] = ok.response.callback_id
    time.sleep(0.6)
    # its owner takes write permission away: the copier's next piece is refused
    ns.setattr(ROOT, ns.resolve("/to").ino, mode=0o444)
    (found,) = user.wait_for_offload()
    status, copied = found.info
    assert status == c.NFS4ERR_ACCESS and 0 < copied < SIZE, found.info
    st, res = user.on_file(dst[0], c.OP_OFFLOAD_STATUS, sid)
    assert st == 0 and (res.count, res.complete) == (copied, [c.NFS4ERR_ACCESS])
    assert server.server.offloads.counts["failed"] == 1
    user.close()


def test_a_restart_during_a_copy_never_reports_it_complete(stack):
    add_export(stack.catalog)
    srv = start_server(stack)
    try:
        client = OffloadClient(srv.port).setup()
        _slow(srv, 2 * MiB)
        src = client.new_file("from", os.urandom(SIZE))
        dst = client.new_file("to")
        st, ok = client.copy(src, dst)
        assert st == 0
        [sid] = ok.response.callback_id
        time.sleep(0.5)
    finally:
        srv.stop()
    ino = stack.namespace.resolve("/to").ino
    size = stack.namespace.getattr(ino).size
    assert size < SIZE
    counts = srv.server.offloads.counts
    assert counts["completed"] == counts["callbacks_answered"] == counts["callbacks_failed"] == 0
    client.close()
    again = start_server(stack)
    try:
        # the session was restored: the client asks after its copy on a new connection
        back = OffloadClient(again.port)
        back.clientid, back.sessionid, back.seq = client.clientid, client.sessionid, client.seq
        st, res = back.on_file(dst[0], c.OP_OFFLOAD_STATUS, sid)
        assert st == c.NFS4ERR_BAD_STATEID, (st, res)
        assert stack.namespace.getattr(ino).size == size  # nothing copies on
        back.close()
    finally:
        again.stop()


def test_copies_of_a_client_that_goes_are_dropped(server, client):
    _slow(server, 1 * MiB)
    src = client.new_file("from", os.urandom(SIZE))
    dst = client.new_file("to")
    assert client.copy(src, dst)[0] == 0
    offloads = server.server.offloads
    assert len(offloads.copies) == 1
    [st] = offloads.copies.values()
    server.server.state.expire_client(server.server.state.client(client.clientid))
    assert offloads.reap() == 1
    assert offloads.copies == {} and st.stop.is_set()


def test_copies_held_per_client_are_bounded(server, client, monkeypatch):
    monkeypatch.setattr(offload, "MAX_PER_CLIENT", 2)
    _slow(server, 1 * MiB)
    src = client.new_file("from", os.urandom(SIZE))
    kinds = []
    for n in range(3):
        st, ok = client.copy(src, client.new_file(f"to{n}"))
        assert st == 0
        kinds.append(ok.requirements.synchronous)
    assert kinds == [False, False, True]
    for copy in list(server.server.offloads.copies.values()):
        copy.stop.set()
