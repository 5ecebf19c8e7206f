"""A head lost under its clients (docs/nfs-state.md): two `shingle serve` heads over one SQLite
catalog; a client locks through head 0, which is killed (kill -9). Head 1 keeps refusing the
lock until it has watched head 0's heartbeat stand still for a lease, then expires it, takes
its client records and starts the cluster-wide grace period: the client reclaims its open and
lock through head 1 (CLAIM_PREVIOUS, LOCK reclaim) while another client's new LOCK waits with
NFS4ERR_GRACE; its RECLAIM_COMPLETE ends the grace period, and the reclaimed lock holds. The
client also held a read delegation through head 0: another client's REMOVE through head 1
waits (DELAY) from the kill until the client reclaimed it through head 1 (CLAIM_PREVIOUS) and
returned it at head 1's recall."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from nfs4_rawclient import RawClient, open_args
from pgserver import free_port
from test_delegations import CallbackClient, make_file, read_delegation

from appliance.nfs.v4 import const as c
from appliance.nfs.v4 import types as t

REPO = Path(__file__).resolve().parents[2]
LEASE = 5  # the smallest the configuration takes


def _set(text: str, section: str, lines: str) -> str:
    return text.replace(f"[{section}]\n", f"[{section}]\n{lines}", 1)


@pytest.fixture
def heads(tmp_path):
    """Two `shingle serve` heads over one catalog: [(process, port, log path)]."""
    ports = [free_port(), free_port()]
    homes = [tmp_path / "head0", tmp_path / "head1"]
    subprocess.run(
        [sys.executable, "-m", "appliance.cli", "init", str(homes[0]), "--drive-size", "32MiB"]
        + ["--zone-size", "4MiB", "--nfs-port", str(ports[0])],
        check=True,
        capture_output=True,
        cwd=REPO,
    )
    nfs = f'lease_seconds = {LEASE}\ngrace_seconds = 60\nportmap = "off"\n'
    text = (homes[0] / "shingle.toml").read_text()
    (homes[0] / "shingle.toml").write_text(
        _set(_set(text, "nfs", nfs), "heads", "count = 2\nindex = 0\n")
    )
    homes[1].mkdir()
    (homes[1] / "shingle.toml").write_text(
        f'[catalog]\nurl = "sqlite:///{(homes[0] / "catalog.db").resolve()}"\n'
        f"[nfs]\nport = {ports[1]}\n{nfs}[heads]\ncount = 2\nindex = 1\n"
    )
    started = []
    try:
        for home, port in zip(homes, ports, strict=True):
            log = home / "serve.log"
            with open(log, "w") as out:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "appliance.cli", "-c", str(home / "shingle.toml")]
                    + ["serve", "--no-web", "--nfs-port", str(port)],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=REPO,
                )
            started.append((proc, port, log))
            deadline = time.monotonic() + 120
            while "nfs://" not in log.read_text(errors="replace"):
                assert proc.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, "the head did not start"
                time.sleep(0.2)
        yield started
    finally:
        for proc, _, _ in started:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, _, _ in started:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(tmp_path, ignore_errors=True)  # the drives are preallocated


def _lock_args(open_sid, clientid, owner, start=0, length=100, reclaim=False, locktype=None):
    locker = (True, t.open_to_lock_owner4.cls(0, open_sid, 0, t.state_owner4.cls(clientid, owner)))
    return t.ARGS[c.OP_LOCK](locktype or c.WRITE_LT, reclaim, start, length, locker)


def test_a_killed_heads_client_reclaims_through_another_head_in_grace(heads):
    (proc0, port0, _), (_, port1, log1) = heads
    make_file(port1, "delegated")  # (through head 1: head 0 has one client only)
    holder = CallbackClient(port0).setup(owner=b"holder-host")
    other = RawClient(port1).setup(owner=b"other-host")
    again = None
    try:
        root = holder.root_fh()
        st, res = holder.session(
            [
                (c.OP_PUTFH, root),
                (c.OP_OPEN, open_args("locked", b"o", holder.clientid)),
                (c.OP_GETFH, None),
            ]
        )
        assert st == 0, st
        open_sid, fh = res[2][2].stateid, res[3][2]
        lock = _lock_args(open_sid, holder.clientid, b"l")
        assert holder.session([(c.OP_PUTFH, fh), (c.OP_LOCK, lock)])[0] == 0
        lockt = (
            c.OP_LOCKT,
            t.ARGS[c.OP_LOCKT](c.WRITE_LT, 0, 1, t.state_owner4.cls(other.clientid, b"x")),
        )
        # head 0 kept the lock's range in memory (alone on the file): the LOCKT waits (DELAY)
        # for head 0 to publish it
        deadline = time.monotonic() + 5
        while (st := other.session([(c.OP_PUTFH, fh), lockt])[0]) == c.NFS4ERR_DELAY:
            assert time.monotonic() < deadline, "head 0 never published its lock"
            time.sleep(0.05)
        assert st == c.NFS4ERR_DENIED, st
        deleg_fh, _ = read_delegation(holder, "delegated")
        remove = [(c.OP_PUTFH, root), (c.OP_REMOVE, "delegated")]

        proc0.send_signal(signal.SIGKILL)
        proc0.wait()
        killed = time.monotonic()
        # head 1 refuses the lock until head 0 has been silent for a lease, then the cluster
        # is in grace
        while (st := other.session([(c.OP_PUTFH, fh), lockt])[0]) == c.NFS4ERR_DENIED:
            assert time.monotonic() - killed < 4 * LEASE, "head 0 never expired"
            # the dead head's delegation stands until it is expired, then until reclaimed
            assert other.session(remove)[0] == c.NFS4ERR_DELAY
            time.sleep(0.2)
        waited = time.monotonic() - killed
        assert st == c.NFS4ERR_GRACE, st
        assert waited >= LEASE / 2, waited
        assert (
            "its NFS state is released, 1 clients and 0 NLM hosts may reclaim" in log1.read_text()
        )

        # the lost head's client reclaims through head 1 (no RECLAIM_COMPLETE yet)
        assert other.session(remove)[0] == c.NFS4ERR_DELAY
        again = CallbackClient(port1).setup(owner=b"holder-host", reclaim_complete=False)
        reclaim = open_args("locked", b"o", again.clientid, create=False)
        reclaim.claim = (c.CLAIM_PREVIOUS, c.OPEN_DELEGATE_NONE)
        st, res = again.session([(c.OP_PUTFH, fh), (c.OP_OPEN, reclaim)])
        assert st == 0, st
        new_sid = res[-1][2].stateid
        lock = _lock_args(new_sid, again.clientid, b"l", reclaim=True)
        assert again.session([(c.OP_PUTFH, fh), (c.OP_LOCK, lock)])[0] == 0
        reclaim = open_args("delegated", b"d", again.clientid, create=False)
        reclaim.share_access = c.OPEN4_SHARE_ACCESS_READ
        reclaim.claim = (c.CLAIM_PREVIOUS, c.OPEN_DELEGATE_READ)
        st, res = again.session([(c.OP_PUTFH, deleg_fh), (c.OP_OPEN, reclaim)])
        assert st == 0, st
        kind, deleg = res[-1][2].delegation
        assert kind == c.OPEN_DELEGATE_READ, kind
        close = (c.OP_CLOSE, t.ARGS[c.OP_CLOSE](0, res[-1][2].stateid))
        assert again.session([(c.OP_PUTFH, deleg_fh), close])[0] == 0
        # meanwhile a new lock waits for the grace period, whatever its range
        st, res = other.session(
            [
                (c.OP_PUTFH, root),
                (c.OP_OPEN, open_args("locked", b"n", other.clientid, create=False)),
            ]
        )
        assert st == c.NFS4ERR_GRACE, st
        assert again.session([(c.OP_RECLAIM_COMPLETE, False)])[0] == 0
        # the grace period is over (its only reclaimer is done); the reclaimed lock holds
        deadline = time.monotonic() + 2 * LEASE
        while (st := other.session([(c.OP_PUTFH, fh), lockt])[0]) == c.NFS4ERR_GRACE:
            assert time.monotonic() < deadline, "the grace period did not end"
            time.sleep(0.2)
        assert st == c.NFS4ERR_DENIED, st
        st, res = other.session(
            [
                (c.OP_PUTFH, root),
                (c.OP_OPEN, open_args("locked", b"n", other.clientid, create=False)),
            ]
        )
        assert st == 0, st
        other_sid = res[-1][2].stateid
        locked = _lock_args(other_sid, other.clientid, b"n")
        assert other.session([(c.OP_PUTFH, fh), (c.OP_LOCK, locked)])[0] == c.NFS4ERR_DENIED
        beside = _lock_args(other_sid, other.clientid, b"n", start=100, length=10)
        assert other.session([(c.OP_PUTFH, fh), (c.OP_LOCK, beside)])[0] == 0
        # the reclaimed delegation is recalled through head 1 before the REMOVE
        assert other.session(remove)[0] == c.NFS4ERR_DELAY
        assert [s.other for s in again.wait_for_recall()] == [deleg.stateid.other]
        assert again.session([(c.OP_PUTFH, deleg_fh), (c.OP_DELEGRETURN, deleg.stateid)])[0] == 0
        assert other.session(remove)[0] == 0
    finally:
        for raw in (holder, other, again):
            if raw is not None:
                raw.close()
