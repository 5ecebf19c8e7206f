"""NLM v4, NSM and the port mapper, with raw requests: locks between NLM owners, blocked
locks and their NLM_GRANTED callback, NLM locks against NFSv4.1 locks on the same file, the
grace period and SM_NOTIFY after a restart, FREE_ALL, DOS shares, PMAP/rpcbind answers.
A small fake "client host" (port mapper + NLM + NSM on one TCP port) receives the
callbacks the server makes."""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest
from nfs3_helpers import Rpc3, add_export, start_server

from appliance.nfs import portmap as pm
from appliance.nfs.nlm import types as n
from appliance.nfs.onc.xdr import LinkedList, String, UInt
from appliance.nfs.state import nsm_hosts_key
from appliance.nfs.v3 import types as t
from appliance.nfs.v4 import const as c
from appliance.nfs.v4 import types as t4


def _load_rawclient():
    """tests/nfs/nfs4_rawclient.py (that folder is not on this folder's import path)."""
    path = Path(__file__).resolve().parent.parent / "nfs" / "nfs4_rawclient.py"
    spec = importlib.util.spec_from_file_location("nfs4_rawclient", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


rawclient = _load_rawclient()

GRACE = 30


class FakeClientHost:
    """One TCP port answering PMAP GETPORT (with its own port, for any program), NLM
    GRANTED and the _RES calls, and NSM SM_NOTIFY; every call is recorded."""

    def __init__(self):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.calls: list[tuple[int, int, bytes]] = []  # (prog, proc, args)
        self.grant_answer = n.NLM4_GRANTED
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def close(self):
        self.listener.close()

    def wait_for(self, prog: int, proc: int, timeout: float = 15.0) -> bytes:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for call in self.calls:
                if call[:2] == (prog, proc):
                    return call[2]
            time.sleep(0.05)
        raise AssertionError(f"no call of prog {prog} proc {proc}; got {self.calls}")

    def _serve(self):
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connection, args=(sock,), daemon=True).start()

    def _connection(self, sock):
        with sock:
            try:
                while True:
                    head = _recv_exact(sock, 4)
                    record = _recv_exact(sock, struct.unpack(">I", head)[0] & 0x7FFFFFFF)
                    sock.sendall(self._reply(record))
            except (OSError, ConnectionError):
                return

    def _reply(self, record: bytes) -> bytes:
        xid, _, _, prog, vers, proc = struct.unpack_from(">IIIIII", record, 0)
        pos = 24
        for _ in range(2):  # credential and verifier
            length = struct.unpack_from(">I", record, pos + 4)[0]
            pos += 8 + length + (-length % 4)
        args = record[pos:]
        self.calls.append((prog, proc, args))
        if prog == pm.PMAP_PROGRAM:
            result = UInt.encode(self.port)
        elif prog == n.NLM_PROGRAM and proc == n.NLMPROC4_GRANTED:
            cookie = n.nlm4_testargs.decode(args).cookie
            result = n.nlm4_res.encode((cookie, self.grant_answer))
        else:
            result = b""
        body = struct.pack(">IIIIII", xid, 1, 0, 0, 0, 0) + result
        return struct.pack(">I", 0x80000000 | len(body)) + body


def _recv_exact(sock, size: int) -> bytes:
    buf = b""
    while len(buf) < size:
        chunk = sock.recv(size - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


@pytest.fixture
def fake_host():
    host = FakeClientHost()
    yield host
    host.close()


@pytest.fixture
def nlm_server(stack, fake_host):
    add_export(stack.catalog)
    srv = start_server(
        stack,
        portmap="serve",
        portmap_port=0,
        grace_seconds=GRACE,
        client_rpcbind_port=fake_host.port,
    )
    yield srv
    srv.stop()


class Nlm:
    """Raw NLM v4 calls of one client host (its caller name) over one connection."""

    def __init__(self, port: int, caller: str, host: str = "127.0.0.1"):
        self.rpc = Rpc3(port, host=host)
        self.caller = caller
        self.cookie = 0

    def close(self):
        self.rpc.close()

    def alock(self, fh, svid, offset, length, oh=None):
        return n.nlm4_lock.cls(
            self.caller, fh, oh or f"{svid}@{self.caller}".encode(), svid, offset, length
        )

    def call(self, proc: int, args):
        self.cookie += 1
        stat, body = self.rpc.call_bytes(
            n.NLM_PROGRAM, n.NLM_V4, proc, n.NLM_ARGS[proc].encode(args)
        )
        assert stat == 0, f"accept_stat {stat}"
        return n.NLM_RESULTS[proc].decode(body)

    def lock(self, fh, svid, offset, length, *, exclusive=True, block=False, reclaim=False):
        return self.call(
            n.NLMPROC4_LOCK,
            n.nlm4_lockargs.cls(
                self._cookie(), block, exclusive, self.alock(fh, svid, offset, length), reclaim, 3
            ),
        ).stat

    def test(self, fh, svid, offset, length, *, exclusive=True):
        return self.call(
            n.NLMPROC4_TEST,
            n.nlm4_testargs.cls(self._cookie(), exclusive, self.alock(fh, svid, offset, length)),
        ).stat

    def unlock(self, fh, svid, offset, length):
        return self.call(
            n.NLMPROC4_UNLOCK,
            n.nlm4_unlockargs.cls(self._cookie(), self.alock(fh, svid, offset, length)),
        ).stat

    def cancel(self, fh, svid, offset, length, *, exclusive=True):
        return self.call(
            n.NLMPROC4_CANCEL,
            n.nlm4_cancargs.cls(
                self._cookie(), True, exclusive, self.alock(fh, svid, offset, length)
            ),
        ).stat

    def _cookie(self) -> bytes:
        return struct.pack(">I", self.cookie)


def v3_file(port: int, name: str, host: str = "127.0.0.1") -> bytes:
    """The NFSv3 handle of /export/name, created when missing."""
    peer = Rpc3(port, host=host)
    try:
        status, ok = peer.mount(t.MOUNTPROC3_MNT, "/export")
        assert status == t.MNT3_OK
        status, res = peer.nfs(t.NFSPROC3_LOOKUP, t.diropargs3.cls(ok.fhandle, name))
        if status == t.NFS3_OK:
            return res.object
        status, res = peer.nfs(
            t.NFSPROC3_CREATE,
            t.CREATE3args.cls(t.diropargs3.cls(ok.fhandle, name), (t.UNCHECKED, t.NO_ATTRS)),
        )
        assert status == t.NFS3_OK, status
        return res.obj
    finally:
        peer.close()


def test_locks_between_two_nlm_owners(nlm_server):
    fh = v3_file(nlm_server.port, "locked")
    a, b = Nlm(nlm_server.port, "host-a"), Nlm(nlm_server.port, "host-b")
    try:
        assert a.lock(fh, 11, 0, 100) == n.NLM4_GRANTED
        status, holder = b.test(fh, 22, 90, 20)
        assert status == n.NLM4_DENIED
        assert (holder.exclusive, holder.svid, holder.oh) == (True, 11, b"11@host-a")
        assert (holder.l_offset, holder.l_len) == (0, 100)
        assert a.lock(fh, 11, 50, 10) == n.NLM4_GRANTED  # an owner's own locks never conflict
        assert b.test(fh, 22, 100, 0) == (n.NLM4_GRANTED, None)  # past A's range, to EOF
        assert b.lock(fh, 22, 99, 1) == n.NLM4_DENIED
        # another owner (svid) of the same host conflicts too
        assert a.lock(fh, 12, 0, 1) == n.NLM4_DENIED
        # read locks are shared; a read lock blocks a write lock
        assert a.lock(fh, 11, 200, 10, exclusive=False) == n.NLM4_GRANTED
        assert b.lock(fh, 22, 205, 10, exclusive=False) == n.NLM4_GRANTED
        assert b.test(fh, 23, 200, 1)[0] == n.NLM4_DENIED
        # A unlocks part of its range (POSIX split): B gets what freed
        assert a.unlock(fh, 11, 0, 50) == n.NLM4_GRANTED
        assert b.lock(fh, 22, 0, 50) == n.NLM4_GRANTED
        assert b.lock(fh, 22, 50, 1) == n.NLM4_DENIED
        # unlocking what is not held is fine
        assert b.unlock(fh, 22, 1000, 5) == n.NLM4_GRANTED
        # a bad handle is NLM4_STALE_FH
        assert b.lock(b"\0" * 32, 22, 0, 1) == n.NLM4_STALE_FH
    finally:
        a.close()
        b.close()


def test_blocked_lock_is_granted_by_callback_and_cancel(nlm_server, fake_host):
    fh = v3_file(nlm_server.port, "blocking")
    a, b = Nlm(nlm_server.port, "host-a"), Nlm(nlm_server.port, "host-b")
    try:
        assert a.lock(fh, 1, 0, 0) == n.NLM4_GRANTED
        assert b.lock(fh, 2, 0, 10, block=True) == n.NLM4_BLOCKED
        assert b.lock(fh, 3, 0, 10, block=True) == n.NLM4_BLOCKED
        assert b.cancel(fh, 3, 0, 10) == n.NLM4_GRANTED  # owner 3 gives up
        assert a.unlock(fh, 1, 0, 0) == n.NLM4_GRANTED
        # the server took the lock for owner 2 and told host-b through its port mapper
        granted = n.nlm4_testargs.decode(fake_host.wait_for(n.NLM_PROGRAM, n.NLMPROC4_GRANTED))
        assert (granted.alock.svid, granted.alock.l_offset, granted.alock.l_len) == (2, 0, 10)
        assert granted.alock.fh == fh and granted.exclusive
        getport = pm.mapping.decode(fake_host.wait_for(pm.PMAP_PROGRAM, pm.PMAPPROC_GETPORT))
        assert (getport.prog, getport.vers, getport.prot) == (n.NLM_PROGRAM, 4, 6)
        status, holder = a.test(fh, 1, 5, 1)
        assert status == n.NLM4_DENIED and holder.svid == 2
        assert a.test(fh, 1, 10, 5) == (n.NLM4_GRANTED, None)  # the cancelled owner got nothing
    finally:
        a.close()
        b.close()


def test_blocked_lock_without_callback_is_picked_up_by_the_retry(stack):
    """A client that cannot be called back (Linux lockd polls every 30 s): its retried
    blocking NLM_LOCK gets the grant the server took for it."""
    add_export(stack.catalog)
    unused = socket.create_server(("127.0.0.1", 0))
    closed_port = unused.getsockname()[1]
    unused.close()
    srv = start_server(stack, client_rpcbind_port=closed_port)
    fh = v3_file(srv.port, "polled")
    a, b = Nlm(srv.port, "host-a"), Nlm(srv.port, "host-b")
    try:
        assert a.lock(fh, 1, 0, 10) == n.NLM4_GRANTED
        assert b.lock(fh, 2, 0, 10, block=True) == n.NLM4_BLOCKED
        assert b.lock(fh, 2, 0, 10, block=True) == n.NLM4_BLOCKED  # a retry stays blocked
        assert a.unlock(fh, 1, 0, 10) == n.NLM4_GRANTED
        assert a.lock(fh, 1, 0, 10) == n.NLM4_DENIED  # taken for the waiter at once
        assert b.lock(fh, 2, 0, 10, block=True) == n.NLM4_GRANTED
        assert b.unlock(fh, 2, 0, 10) == n.NLM4_GRANTED
        assert a.lock(fh, 1, 0, 10) == n.NLM4_GRANTED
    finally:
        a.close()
        b.close()
        srv.stop()


def _v4_client(port: int, name: str):
    cl = rawclient.RawClient(port).setup()
    root = cl.root_fh()
    owner = b"v4-open-owner"
    opening = rawclient.open_args(name, owner, cl.clientid)
    st, res = cl.session([(c.OP_PUTFH, root), (c.OP_OPEN, opening), (c.OP_GETFH, None)])
    assert st == 0, (st, res)
    return cl, res[-2][2].stateid, res[-1][2]


def _v4_lock(cl, fh, open_sid, offset, length, owner=b"v4-lock-owner"):
    locker = (
        True,
        t4.open_to_lock_owner4.cls(0, open_sid, 0, t4.state_owner4.cls(cl.clientid, owner)),
    )
    return cl.session(
        [
            (c.OP_PUTFH, fh),
            (c.OP_LOCK, t4.ARGS[c.OP_LOCK](c.WRITE_LT, False, offset, length, locker)),
        ]
    )


def test_nlm_and_nfsv41_locks_conflict(nlm_server):
    v4, open_sid, fh4 = _v4_client(nlm_server.port, "shared")
    fh3 = v3_file(nlm_server.port, "shared")
    nlm = Nlm(nlm_server.port, "host-a")
    try:
        st, res = _v4_lock(v4, fh4, open_sid, 0, 100)
        assert st == 0, (st, res)
        lock_sid = res[-1][2]
        status, holder = nlm.test(fh3, 7, 50, 1)
        assert status == n.NLM4_DENIED
        assert (holder.svid, holder.oh, holder.l_offset, holder.l_len) == (
            0,
            b"v4-lock-owner",
            0,
            100,
        )
        assert nlm.lock(fh3, 7, 99, 10) == n.NLM4_DENIED
        assert nlm.lock(fh3, 7, 100, 10) == n.NLM4_GRANTED
        # the NLM lock denies the NFSv4.1 client, naming the NLM owner
        st, res = _v4_lock(v4, fh4, open_sid, 105, 1, owner=b"v4-other")
        assert st == c.NFS4ERR_DENIED
        denied = res[-1][2]
        assert (denied.offset, denied.length) == (100, 10)
        assert denied.owner.owner == struct.pack(">I", 7) + b"7@host-a"
        # a blocked NLM lock gets the range once the NFSv4.1 client unlocks (next tick)
        assert nlm.lock(fh3, 8, 0, 10, block=True) == n.NLM4_BLOCKED
        st, _ = v4.session(
            [(c.OP_PUTFH, fh4), (c.OP_LOCKU, t4.ARGS[c.OP_LOCKU](c.WRITE_LT, 0, lock_sid, 0, 100))]
        )
        assert st == 0
        deadline = time.monotonic() + 10
        while nlm.test(fh3, 9, 0, 1)[0] == n.NLM4_GRANTED and time.monotonic() < deadline:
            time.sleep(0.1)
        assert nlm.test(fh3, 9, 0, 1)[1].svid == 8
        assert nlm.lock(fh3, 8, 0, 10, block=True) == n.NLM4_GRANTED
    finally:
        nlm.close()
        v4.close()


def test_nlm_and_nfsv41_locks_conflict_across_heads(stack, fake_host):
    """Two heads over one catalog (docs/nfs-state.md): an NFSv4.1 lock through head 0 denies an
    NLM lock through head 1 (NLM_TEST names it), an NLM lock through head 1 denies head 0's
    NFSv4.1 client, and a blocked NLM lock is granted once the NFSv4.1 client unlocks."""
    add_export(stack.catalog)
    kwargs = dict(grace_seconds=0, client_rpcbind_port=fake_host.port, lease_seconds=10)
    head0 = start_server(stack, head_index=0, **kwargs)
    head1 = start_server(stack, head_index=1, portmap="serve", portmap_port=0, **kwargs)
    v4, open_sid, fh4 = _v4_client(head0.port, "across")
    fh3 = v3_file(head1.port, "across")
    nlm = Nlm(head1.port, "host-b")
    try:
        st, res = _v4_lock(v4, fh4, open_sid, 0, 100)
        assert st == 0, (st, res)
        lock_sid = res[-1][2]
        status, holder = nlm.test(fh3, 7, 50, 1)
        assert status == n.NLM4_DENIED
        assert (holder.oh, holder.l_offset, holder.l_len) == (b"v4-lock-owner", 0, 100)
        assert nlm.lock(fh3, 7, 99, 10) == n.NLM4_DENIED
        assert nlm.lock(fh3, 7, 100, 10) == n.NLM4_GRANTED
        st, res = _v4_lock(v4, fh4, open_sid, 105, 1, owner=b"v4-other")
        assert st == c.NFS4ERR_DENIED
        denied = res[-1][2]
        assert (denied.offset, denied.length) == (100, 10)
        assert denied.owner.owner == struct.pack(">I", 7) + b"7@host-b"
        # a blocked NLM lock on head 1 gets the range once head 0's client unlocks (a tick)
        assert nlm.lock(fh3, 8, 0, 10, block=True) == n.NLM4_BLOCKED
        locku = (c.OP_LOCKU, t4.ARGS[c.OP_LOCKU](c.WRITE_LT, 0, lock_sid, 0, 100))
        assert v4.session([(c.OP_PUTFH, fh4), locku])[0] == 0
        deadline = time.monotonic() + 10
        while nlm.test(fh3, 9, 0, 1)[0] == n.NLM4_GRANTED and time.monotonic() < deadline:
            time.sleep(0.1)
        assert nlm.test(fh3, 9, 0, 1)[1].svid == 8
        # and head 0 sees the NLM lock it granted
        assert _v4_lock(v4, fh4, open_sid, 0, 1, owner=b"v4-third")[0] == c.NFS4ERR_DENIED
        assert nlm.unlock(fh3, 8, 0, 10) == n.NLM4_GRANTED
        assert _v4_lock(v4, fh4, open_sid, 0, 1, owner=b"v4-third")[0] == 0
        _nlm_shares_conflict_across_heads(v4, head0.port, nlm)
    finally:
        nlm.close()
        v4.close()
        head0.stop()
        head1.stop()


def _nlm_shares_conflict_across_heads(v4, port0: int, nlm1) -> None:
    """An NLM_SHARE through head 1 (read, denying writers) refuses an NFSv4.1 OPEN for writing
    and another host's NLM_SHARE for writing through head 0, until NLM_UNSHARE; an NFSv4.1
    open for writing through head 0 then refuses an NLM_SHARE denying writers through head 1."""
    fh3 = v3_file(port0, "dos")
    nlm0 = Nlm(port0, "host-c")
    try:
        share = n.nlm4_share.cls("host-b", fh3, b"share-b", n.FSM_DW, n.FSA_R)
        args = n.nlm4_shareargs.cls(b"1", share, False)
        assert nlm1.call(n.NLMPROC4_SHARE, args).stat == n.NLM4_GRANTED
        writer = rawclient.open_args("dos", b"v4-writer", v4.clientid, create=False)
        put_root = (c.OP_PUTFH, v4.root_fh())
        assert v4.session([put_root, (c.OP_OPEN, writer)])[0] == c.NFS4ERR_SHARE_DENIED
        other = n.nlm4_share.cls("host-c", fh3, b"share-c", n.FSM_DN, n.FSA_W)
        other_args = n.nlm4_shareargs.cls(b"2", other, False)
        assert nlm0.call(n.NLMPROC4_SHARE, other_args).stat == n.NLM4_DENIED
        assert nlm1.call(n.NLMPROC4_UNSHARE, args).stat == n.NLM4_GRANTED
        assert nlm0.call(n.NLMPROC4_SHARE, other_args).stat == n.NLM4_GRANTED
        assert nlm0.call(n.NLMPROC4_UNSHARE, other_args).stat == n.NLM4_GRANTED
        st, res = v4.session([put_root, (c.OP_OPEN, writer), (c.OP_GETFH, None)])
        assert st == 0, st
        assert nlm1.call(n.NLMPROC4_SHARE, args).stat == n.NLM4_DENIED
        close = (c.OP_CLOSE, t4.ARGS[c.OP_CLOSE](0, res[-2][2].stateid))
        assert v4.session([(c.OP_PUTFH, res[-1][2]), close])[0] == 0
        assert nlm1.call(n.NLMPROC4_SHARE, args).stat == n.NLM4_GRANTED
    finally:
        nlm0.close()


def test_a_dead_heads_nlm_hosts_reclaim_through_another_head(stack, fake_host):
    """Head 0 of two stops beating (as a killed process) while an NLM host holds a lock
    through it: head 1 expires it after a lease, takes its monitored hosts and starts the
    cluster-wide grace period; the host is told by SM_NOTIFY (under head 0's NSM name) and
    reclaims through head 1, while a new lock waits with DENIED_GRACE_PERIOD."""
    add_export(stack.catalog)
    kwargs = dict(grace_seconds=GRACE, client_rpcbind_port=fake_host.port, lease_seconds=2)
    head0 = start_server(stack, head_index=0, nsm_name="head-zero", **kwargs)
    head1 = start_server(stack, head_index=1, nsm_name="head-one", **kwargs)
    fh = v3_file(head0.port, "taken")
    a0 = Nlm(head0.port, "host-a")
    a1, b1 = Nlm(head1.port, "host-a"), Nlm(head1.port, "host-b")
    try:
        assert a0.lock(fh, 1, 0, 10) == n.NLM4_GRANTED
        assert b1.lock(fh, 2, 0, 10) == n.NLM4_DENIED
        # head 0's own list of hosts, under the name head 1 takes it by
        assert "host-a" in stack.catalog.get_setting(nsm_hosts_key("head0"))
        head0.server.state.heads.beat = lambda: True  # its row stays as it was
        notify = n.stat_chge.decode(fake_host.wait_for(n.NSM_PROGRAM, n.SM_NOTIFY, timeout=20))
        assert notify.mon_name == "head-zero"
        assert b1.lock(fh, 2, 20, 10) == n.NLM4_DENIED_GRACE_PERIOD
        assert a1.lock(fh, 1, 0, 10, reclaim=True) == n.NLM4_GRANTED
        assert b1.lock(fh, 2, 5, 1, reclaim=True) == n.NLM4_DENIED  # a reclaim still conflicts
        assert "host-a" in stack.catalog.get_setting(nsm_hosts_key("head1"))
        assert stack.catalog.get_setting(nsm_hosts_key("head0")) is None
    finally:
        for nlm in (a0, a1, b1):
            nlm.close()
        head0.stop()
        head1.stop()


def test_an_nlm_lock_outlives_the_nfsv4_lease(stack, fake_host):
    # NLM hosts hold no lease (NSM reports their restarts): an NFSv4 request that conflicts
    # with an NLM lock older than a lease must not take the lock away as from an expired client
    add_export(stack.catalog)
    srv = start_server(
        stack,
        portmap="serve",
        portmap_port=0,
        grace_seconds=0,
        lease_seconds=3,
        client_rpcbind_port=fake_host.port,
    )
    nlm = Nlm(srv.port, "host-old")
    v4 = None
    try:
        fh3 = v3_file(srv.port, "old-lock")
        assert nlm.lock(fh3, 3, 0, 10) == n.NLM4_GRANTED
        time.sleep(3 * 1.2)  # older than a lease
        v4, open_sid, fh4 = _v4_client(srv.port, "old-lock")
        st, _ = _v4_lock(v4, fh4, open_sid, 0, 1)
        assert st == c.NFS4ERR_DENIED
        assert nlm.test(fh3, 4, 0, 1)[0] == n.NLM4_DENIED
    finally:
        nlm.close()
        if v4 is not None:
            v4.close()
        srv.stop()


def test_restart_grace_period_reclaim_and_sm_notify(stack, fake_host):
    add_export(stack.catalog)
    kwargs = dict(grace_seconds=GRACE, client_rpcbind_port=fake_host.port, nsm_name="server-x")
    srv = start_server(stack, **kwargs)
    fh = v3_file(srv.port, "reclaimed")
    a = Nlm(srv.port, "host-a")
    assert a.lock(fh, 1, 0, 10) == n.NLM4_GRANTED
    a.close()
    srv.stop()
    assert fake_host.calls == []  # nothing notified on a first start
    srv = start_server(stack, **kwargs)
    a, b = Nlm(srv.port, "host-a"), Nlm(srv.port, "host-b")
    try:
        # the previous instance's lock client is told to reclaim
        notify = n.stat_chge.decode(fake_host.wait_for(n.NSM_PROGRAM, n.SM_NOTIFY))
        assert notify.mon_name == "server-x" and notify.state % 2 == 1
        getport = pm.mapping.decode(fake_host.wait_for(pm.PMAP_PROGRAM, pm.PMAPPROC_GETPORT))
        assert (getport.prog, getport.vers) == (n.NSM_PROGRAM, 1)
        assert b.lock(fh, 2, 20, 10) == n.NLM4_DENIED_GRACE_PERIOD
        assert b.test(fh, 2, 0, 10)[0] == n.NLM4_DENIED_GRACE_PERIOD
        assert a.lock(fh, 1, 0, 10, reclaim=True) == n.NLM4_GRANTED
        assert b.lock(fh, 2, 5, 1, reclaim=True) == n.NLM4_DENIED  # a reclaim still conflicts
        # SM_STAT reports the server's new state
        stat, body = a.rpc.call_bytes(
            n.NSM_PROGRAM, n.NSM_V1, n.SM_STAT, n.sm_name.encode(("host-a",))
        )
        res = n.sm_stat_res.decode(body)
        assert (stat, res.res_stat, res.state) == (0, n.STAT_SUCC, notify.state)
    finally:
        a.close()
        b.close()
        srv.stop()


def test_free_all_sm_notify_and_shares(nlm_server):
    fh = v3_file(nlm_server.port, "freed")
    a, b = Nlm(nlm_server.port, "host-a"), Nlm(nlm_server.port, "host-b")
    try:
        assert a.lock(fh, 1, 0, 10) == n.NLM4_GRANTED
        b.call(n.NLMPROC4_FREE_ALL, n.nlm4_notify.cls("host-a", 5))
        assert b.lock(fh, 2, 0, 10) == n.NLM4_GRANTED
        # host-b reboots: its status monitor tells ours
        stat, _ = a.rpc.call_bytes(
            n.NSM_PROGRAM, n.NSM_V1, n.SM_NOTIFY, n.stat_chge.encode(("host-b", 7))
        )
        assert stat == 0
        assert a.lock(fh, 1, 0, 10) == n.NLM4_GRANTED
        # DOS shares: read access denying writers, then a writer is refused
        share = n.nlm4_share.cls("host-a", fh, b"share-a", n.FSM_DW, n.FSA_R)
        res = a.call(n.NLMPROC4_SHARE, n.nlm4_shareargs.cls(b"1", share, False))
        assert res.stat == n.NLM4_GRANTED
        other = n.nlm4_share.cls("host-b", fh, b"share-b", n.FSM_DN, n.FSA_W)
        assert (
            b.call(n.NLMPROC4_SHARE, n.nlm4_shareargs.cls(b"2", other, False)).stat == n.NLM4_DENIED
        )
        # and an NFSv4.1 OPEN for writing through the same server, as another open would be
        v4 = rawclient.RawClient(nlm_server.port).setup()
        writer = rawclient.open_args("freed", b"v4-writer", v4.clientid, create=False)
        st, _ = v4.session([(c.OP_PUTFH, v4.root_fh()), (c.OP_OPEN, writer)])
        v4.close()
        assert st == c.NFS4ERR_SHARE_DENIED
        a.call(n.NLMPROC4_UNSHARE, n.nlm4_shareargs.cls(b"3", share, False))
        assert (
            b.call(n.NLMPROC4_SHARE, n.nlm4_shareargs.cls(b"4", other, False)).stat
            == n.NLM4_GRANTED
        )
    finally:
        a.close()
        b.close()


def test_async_msg_requests_are_answered_with_res_calls(nlm_server, fake_host):
    fh = v3_file(nlm_server.port, "async")
    a = Nlm(nlm_server.port, "host-a")
    try:
        assert a.lock(fh, 1, 0, 10) == n.NLM4_GRANTED
        a.call(n.NLMPROC4_TEST_MSG, n.nlm4_testargs.cls(b"msg1", True, a.alock(fh, 2, 5, 1)))
        res = n.nlm4_testres.decode(fake_host.wait_for(n.NLM_PROGRAM, n.NLMPROC4_TEST_RES))
        assert res.cookie == b"msg1" and res.stat[0] == n.NLM4_DENIED
        assert res.stat[1].svid == 1
    finally:
        a.close()


def test_port_mapper_answers_getport_getaddr_and_dump(nlm_server):
    port = nlm_server.port
    for where in (nlm_server.server.portmap_port, port):
        peer = Rpc3(where)
        try:

            def getport(prog, vers, proto=6, peer=peer):
                stat, body = peer.call_bytes(
                    pm.PMAP_PROGRAM,
                    2,
                    pm.PMAPPROC_GETPORT,
                    pm.mapping.encode((prog, vers, proto, 0)),
                )
                assert stat == 0
                return UInt.decode(body)

            assert getport(n.NLM_PROGRAM, 4) == port
            assert getport(n.NSM_PROGRAM, 1) == port
            assert getport(t.NFS_PROGRAM, 3) == port
            assert getport(t.MOUNT_PROGRAM, 3) == port
            assert getport(pm.PMAP_PROGRAM, 2) == nlm_server.server.portmap_port
            assert getport(n.NLM_PROGRAM, 1) == 0  # only NLM v4 is served
            # over UDP: NLM, NSM, MOUNT and the port mapper (on its own port), not NFS
            assert getport(n.NLM_PROGRAM, 4, proto=17) == port
            assert getport(t.MOUNT_PROGRAM, 3, proto=17) == port
            assert getport(pm.PMAP_PROGRAM, 2, proto=17) == nlm_server.server.portmap_port
            assert getport(t.NFS_PROGRAM, 3, proto=17) == 0
            stat, body = peer.call_bytes(
                pm.PMAP_PROGRAM,
                4,
                pm.RPCBPROC_GETADDR,
                pm.rpcb.encode((n.NLM_PROGRAM, 4, "tcp", "", "")),
            )
            assert (stat, String().decode(body)) == (0, f"127.0.0.1.{port >> 8}.{port & 255}")
            stat, body = peer.call_bytes(
                pm.PMAP_PROGRAM, 3, pm.RPCBPROC_GETADDR, pm.rpcb.encode((999999, 1, "tcp", "", ""))
            )
            assert (stat, String().decode(body)) == (0, "")
            stat, body = peer.call_bytes(pm.PMAP_PROGRAM, 2, pm.PMAPPROC_DUMP, b"")
            entries = LinkedList(pm.mapping).decode(body)
            assert (n.NLM_PROGRAM, 4, 6, port) in [tuple(e) for e in entries]
            # SET from others is refused: this is not a general rpcbind
            stat, body = peer.call_bytes(
                pm.PMAP_PROGRAM, 2, pm.PMAPPROC_SET, pm.mapping.encode((300000, 1, 6, 1234))
            )
            assert (stat, body) == (0, b"\0\0\0\0")
        finally:
            peer.close()


def test_a_server_on_ipv6_serves_ipv6_and_ipv4_clients(stack, fake_host):
    """nfs.host "::" takes IPv6 and IPv4 clients (a dual-stack listener; asyncio's alone is
    IPv6 only): the port mapper answers netid tcp6 with an IPv6 universal address over IPv6
    and tcp over IPv4 (a client asks for its own transport's); the client side's rpcbind
    lookup of an IPv6 host (NLM callbacks, SM_NOTIFY) asks GETADDR tcp6; MOUNT, NFSv3 and NLM
    over ::1 conflict with IPv4 ones; nfs-rs writes over IPv6 (NFSv4.1) and reads back over
    IPv4 (NFSv3)."""
    add_export(stack.catalog, clients="127.0.0.1/32,::1/128")
    srv = start_server(
        stack,
        host="::",
        portmap="serve",
        portmap_port=0,
        grace_seconds=0,
        client_rpcbind_port=fake_host.port,
    )
    try:
        port, pmap_port = srv.port, srv.server.portmap_port
        six, four = Rpc3(pmap_port, host="::1"), Rpc3(pmap_port)
        try:

            def getaddr(peer, netid):
                stat, body = peer.call_bytes(
                    pm.PMAP_PROGRAM,
                    4,
                    pm.RPCBPROC_GETADDR,
                    pm.rpcb.encode((n.NLM_PROGRAM, 4, netid, "", "")),
                )
                assert stat == 0
                return String().decode(body)

            where = f"{port >> 8}.{port & 255}"
            assert getaddr(six, "tcp6") == f"::1.{where}"
            assert getaddr(six, "tcp") == ""
            assert getaddr(four, "tcp") == f"127.0.0.1.{where}"  # not ::ffff:127.0.0.1
            assert getaddr(four, "tcp6") == ""
            stat, body = six.call_bytes(pm.PMAP_PROGRAM, 4, pm.RPCBPROC_DUMP, b"")
            rows = {(r.r_prog, r.r_netid, r.r_addr) for r in LinkedList(pm.rpcb).decode(body)}
            assert (t.MOUNT_PROGRAM, "tcp6", f"::1.{where}") in rows
        finally:
            six.close()
            four.close()
        assert pm.getport("::1", n.NLM_PROGRAM, 4, pmap_port=pmap_port) == port
        fh = v3_file(port, "over-ipv6", host="::1")
        assert fh == v3_file(port, "over-ipv6")
        a, b = Nlm(port, "v6-host", host="::1"), Nlm(port, "v4-host")
        try:
            assert a.lock(fh, 1, 0, 10) == n.NLM4_GRANTED
            assert b.lock(fh, 2, 0, 10) == n.NLM4_DENIED
            assert a.unlock(fh, 1, 0, 10) == n.NLM4_GRANTED
            assert b.lock(fh, 2, 0, 10) == n.NLM4_GRANTED
            assert a.test(fh, 1, 0, 10)[0] == n.NLM4_DENIED
        finally:
            a.close()
            b.close()
        import nfs_rs

        payload = os.urandom(70_000)
        options = dict(nfs_port=port, noresvport=True, uid=0, gid=0, connect_timeout=20)
        with nfs_rs.Client.connect(f"nfs://[::1]:{port}/export?version=4.1", **options) as cl:
            with cl.open("/written-over-ipv6", "wb") as f:
                f.write(payload)
        query = f"version=3&nfsport={port}&mountport={port}"
        with nfs_rs.Client.connect(f"nfs://127.0.0.1:{port}/export?{query}", **options) as cl:
            with cl.open("/written-over-ipv6", "rb") as f:
                assert f.read() == payload
    finally:
        srv.stop()


def _port_111_free() -> bool:
    try:
        with socket.create_server(("127.0.0.1", 111)):
            return True
    except OSError:
        return False


def _need_port_111_and(tool: str) -> str:
    exe = shutil.which(tool) or (
        f"/usr/sbin/{tool}" if Path(f"/usr/sbin/{tool}").exists() else None
    )
    if exe is None:
        pytest.skip(f"{tool} not installed (Debian: rpcbind)")
    if not _port_111_free():
        pytest.skip("port 111 is taken (a system rpcbind runs): it is the port these tests need")
    return exe


def test_rpcinfo_lists_and_pings_nlm_through_our_port_mapper(stack):
    """rpcinfo (rpcbind's own client) asks our port mapper on port 111, as the Linux lock
    manager does, and reaches NLM and NSM on the NFS port."""
    rpcinfo = _need_port_111_and("rpcinfo")
    add_export(stack.catalog)
    srv = start_server(stack, portmap="serve", portmap_port=111)
    try:
        out = subprocess.run(
            [rpcinfo, "-p", "127.0.0.1"], capture_output=True, text=True, timeout=30, check=True
        ).stdout
        rows = {tuple(line.split()[:4]) for line in out.splitlines()[1:]}
        port = str(srv.port)
        assert {
            ("100021", "4", "tcp", port),
            ("100024", "1", "tcp", port),
            ("100003", "3", "tcp", port),
            ("100000", "2", "tcp", "111"),
        } <= rows
        for prog, vers in (("nlockmgr", "4"), ("status", "1")):  # rpcbind v4 GETADDR, NULL
            proc = subprocess.run(
                [rpcinfo, "-T", "tcp", "127.0.0.1", prog, vers],
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert "ready and waiting" in proc.stdout, proc
        # clients behind NAT on this host (VMs on user-mode networking) come from 127.0.0.1:
        # a callback there would reach our own port mapper; the grant waits for the retry
        fh = v3_file(srv.port, "nat")
        a, b = Nlm(srv.port, "vm-a"), Nlm(srv.port, "vm-b")
        try:
            assert a.lock(fh, 1, 0, 10) == n.NLM4_GRANTED
            assert b.lock(fh, 2, 0, 10, block=True) == n.NLM4_BLOCKED
            assert a.unlock(fh, 1, 0, 10) == n.NLM4_GRANTED
            time.sleep(1.5)
            assert a.lock(fh, 1, 0, 10) == n.NLM4_DENIED
            assert b.lock(fh, 2, 0, 10, block=True) == n.NLM4_GRANTED
        finally:
            a.close()
            b.close()
    finally:
        srv.stop()


def test_programs_are_registered_with_a_running_rpcbind(stack):
    rpcbind = _need_port_111_and("rpcbind")
    rpcinfo = _need_port_111_and("rpcinfo")
    daemon = subprocess.Popen([rpcbind, "-f"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not pm.rpcbind_answers("127.0.0.1", 111) and time.monotonic() < deadline:
            time.sleep(0.1)
        add_export(stack.catalog)
        srv = start_server(stack, portmap="auto", portmap_port=111)
        try:
            assert srv.server.registered
            out = subprocess.run(
                [rpcinfo, "-p", "127.0.0.1"], capture_output=True, text=True, timeout=30, check=True
            ).stdout
            assert f"100021    4   tcp  {srv.port}" in out
            assert f"100021    4   udp  {srv.port}" in out  # (registering UDP kept TCP's)
        finally:
            srv.stop()
        out = subprocess.run(
            [rpcinfo, "-p", "127.0.0.1"], capture_output=True, text=True, timeout=30, check=True
        ).stdout
        assert "100021" not in out  # unregistered at stop
    finally:
        daemon.terminate()
        daemon.wait(10)
