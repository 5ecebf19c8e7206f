"""Delegations across heads (appliance/nfs/state/head_delegations.py, docs/delegations.md):
two NFS servers of one process, heads 0 and 1 over one catalog, SQLite and PostgreSQL, raw
clients. A read delegation granted through head 0 is recorded under head 0's name; a
conflicting request through head 1 (an NFSv4.1 OPEN for writing, an NFSv3 REMOVE, an
exclusive NLM lock, a SETATTR) gets DELAY / JUKEBOX / DENIED_GRACE_PERIOD while head 0 sends
the holder CB_RECALL over its own backchannel, and goes through once the holder returned it,
or once head 0 revoked it a lease after an ignored recall. The safety poll is off here
(SAFETY_POLL_S 60 s): every recall across heads comes through the wake-up (a datagram on
SQLite, a notification on PostgreSQL). On PostgreSQL a grant waits for the other head's
change watch to answer its fence, and a head that does not answer means no delegation. A head
that stops beating has its delegations taken by the head that expires it: its client reclaims
the delegation there (CLAIM_PREVIOUS) while another client's change waits."""

from __future__ import annotations

import shutil
import struct
import threading
import time

import pytest
from nfs4_rawclient import RawClient
from nfs4_support import MiB, Stack, add_export, nfsrs, start_server
from test_delegations import CallbackClient, _mode, _v3_remove, make_file, read_delegation
from test_delegations40 import CB_IDENT, CallbackService, Client40
from test_delegations_v3 import _retrying, nlm_lock
from test_delegations_write import CHANGE_SIZE, _change_size, _write_delegation, answering

from appliance.nfs.nlm import types as n
from appliance.nfs.state import head_delegations as hd
from appliance.nfs.state.delegations import held_in_catalog
from appliance.nfs.v3 import types as t3
from appliance.nfs.v4 import backchannel as cb
from appliance.nfs.v4 import const as c
from appliance.nfs.v4 import types as t

LEASE = 2


@pytest.fixture
def two_heads(tmp_path, catalog_url, monkeypatch):
    # no safety poll while the test runs: a recall across heads must come through the wake-up
    monkeypatch.setattr(hd, "SAFETY_POLL_S", 60.0)
    monkeypatch.setattr(hd, "SILENT_HOLD_S", 0.3)
    stack = Stack(
        tmp_path, drive_size=24 * MiB, zone_size=2 * MiB, fragment_size=64 * 1024, url=catalog_url
    )
    add_export(stack.catalog)
    heads = [
        start_server(stack, head_index=i, lease_seconds=LEASE, grace_seconds=30) for i in (0, 1)
    ]
    yield stack, heads
    for head in heads:
        head.stop()
    stack.close()
    shutil.rmtree(tmp_path / "drives", ignore_errors=True)


def _ino(head, sid) -> int:
    return head.server.state.delegations.core.states[sid.other].ino


def _until_not(status: int, attempt, timeout: float = 4 * LEASE):
    """``attempt()`` retried (as a client retries DELAY) until it answers other than
    ``status``: (that answer, seconds waited)."""
    start = time.monotonic()
    while (got := attempt()) == status:
        assert time.monotonic() - start < timeout, f"still {status} after {timeout} s"
        time.sleep(0.05)
    return got, time.monotonic() - start


def _setattr(raw: RawClient, fh: bytes) -> int:
    anonymous = t.stateid4.cls(0, b"\0" * 12)
    return raw.session(
        [(c.OP_PUTFH, fh), (c.OP_SETATTR, t.ARGS[c.OP_SETATTR](anonymous, _mode(0o600)))]
    )[0]


def test_a_change_through_one_head_recalls_the_others_delegation(two_heads, monkeypatch):
    stack, (head0, head1) = two_heads
    for name in ("opened", "removed", "locked", "written", "ignored", "v40"):
        make_file(head1.port, name)
    holder = CallbackClient(head0.port).setup()
    writer = CallbackClient(head1.port, back_channel=False).setup()
    v3 = RawClient(head1.port)
    try:
        delegs = {
            name: read_delegation(holder, name)
            for name in ("opened", "removed", "locked", "written")
        }
        fh, sid = delegs["opened"]
        (row,) = held_in_catalog(stack.catalog, _ino(head0, sid))
        assert row["head"] == "head0"  # by the head's name, not the address all heads share

        # an NFSv4.1 OPEN for writing through head 1: DELAY; head 0 recalls over its backchannel
        asked = time.monotonic()
        assert writer.open_file("opened", c.OPEN4_SHARE_ACCESS_WRITE)[0] == c.NFS4ERR_DELAY
        assert [s.other for s in holder.wait_for_recall()] == [sid.other]
        recall_s = time.monotonic() - asked
        assert recall_s < 3, recall_s  # woken at once (it would poll only after 60 s)
        assert writer.open_file("opened", c.OPEN4_SHARE_ACCESS_WRITE)[0] == c.NFS4ERR_DELAY
        assert holder.session([(c.OP_PUTFH, fh), (c.OP_DELEGRETURN, sid)])[0] == 0
        st, res = writer.open_file("opened", c.OPEN4_SHARE_ACCESS_WRITE)
        assert st == 0, st
        # head 0 grants no new delegation of a file another head's client writes
        st, res = holder.open_file("opened", c.OPEN4_SHARE_ACCESS_READ, owner=b"o2")
        assert st == 0 and res[2][2].delegation[0] == c.OPEN_DELEGATE_NONE

        # an NFSv3 REMOVE through head 1: JUKEBOX until the return
        fh, sid = delegs["removed"]
        root = holder.root_fh()
        assert _v3_remove(v3, root, "removed") == t3.NFS3ERR_JUKEBOX
        holder.callbacks.clear()
        assert [s.other for s in holder.wait_for_recall()] == [sid.other]
        assert holder.session([(c.OP_PUTFH, fh), (c.OP_DELEGRETURN, sid)])[0] == 0
        assert _until_not(t3.NFS3ERR_JUKEBOX, lambda: _v3_remove(v3, root, "removed"))[0] == 0

        # an exclusive NLM lock through head 1: DENIED_GRACE_PERIOD (lockd retries) meanwhile
        fh, sid = delegs["locked"]
        assert nlm_lock(v3, fh, exclusive=True) == n.NLM4_DENIED_GRACE_PERIOD
        holder.callbacks.clear()
        assert [s.other for s in holder.wait_for_recall()] == [sid.other]
        assert holder.session([(c.OP_PUTFH, fh), (c.OP_DELEGRETURN, sid)])[0] == 0
        got, _ = _until_not(n.NLM4_DENIED_GRACE_PERIOD, lambda: nlm_lock(v3, fh, exclusive=True))
        assert got == n.NLM4_GRANTED

        # nfs-rs (a real NFSv3 client) writing through head 1: it retries JUKEBOX until the
        # holder returned the delegation recalled through head 0, then reads what it wrote
        fh, sid = delegs["written"]
        holder.callbacks.clear()
        with nfsrs(head1.port, version="3") as client:
            outcome: dict = {}

            def write() -> None:
                def once() -> None:
                    with client.open("written", "r+b") as f:
                        f.write(b"through head 1")

                try:
                    outcome["tries"] = _retrying(once)
                except Exception as exc:  # noqa: BLE001 - reported by the assertion below
                    outcome["error"] = exc

            worker = threading.Thread(target=write)
            worker.start()
            assert [s.other for s in holder.wait_for_recall()] == [sid.other]
            time.sleep(0.3)
            assert worker.is_alive(), f"the write did not wait: {outcome}"
            assert holder.session([(c.OP_PUTFH, fh), (c.OP_DELEGRETURN, sid)])[0] == 0
            worker.join(40)
            assert "error" not in outcome and outcome["tries"][0] > 1, outcome
            with client.open("written", "rb") as f:
                assert f.read() == b"through head 1"

        # a holder that ignores the recall: head 0 revokes it a lease later, the SETATTR
        # through head 1 waits until then and never fails (a new writer: the first one sent
        # nothing during nfs-rs's write, longer than a lease on a loaded machine)
        writer.close()
        writer = CallbackClient(head1.port, back_channel=False).setup()
        holder.answer = False
        fh, sid = read_delegation(holder, "ignored")
        ino = _ino(head0, sid)
        assert _setattr(writer, fh) == c.NFS4ERR_DELAY
        holder.callbacks.clear()
        assert holder.wait_for_recall()
        # when head 0 sent the recall (its clock is this process's): the holder may hear it
        # a while later on a loaded machine
        recalled_at = head0.server.state.delegations.core.states[sid.other].recalled_at

        def setattr_renewing() -> int:
            holder.session([])  # the holder stays alive: only its recall runs out
            return _setattr(writer, fh)

        got, waited = _until_not(c.NFS4ERR_DELAY, setattr_renewing, timeout=4 * LEASE)
        assert got == 0 and waited >= LEASE / 2, (got, waited)
        assert time.monotonic() - recalled_at >= LEASE  # revoked a lease after, not sooner
        st, _ = holder.session([(c.OP_PUTFH, fh), (c.OP_READ, t.ARGS[c.OP_READ](sid, 0, 10))])
        assert st == c.NFS4ERR_DELEG_REVOKED
        assert head0.server.state.delegations.counts["revoked"] == 1
        # what /metrics says: head 1's requests waited, head 0 took up its recall requests
        waits = head1.server.stats()["nfs_delegations_other_head_waits"]
        assert waits >= 5, waits
        assert head0.server.stats()["nfs_delegations_other_head_recalls"] >= 5
        _v40_holder_recalled_across_heads(head0, writer)
        assert held_in_catalog(stack.catalog, ino) == []
        _write_delegation_recalled_by_another_heads_reads(stack, head0, head1, monkeypatch)
        if not stack.catalog.is_sqlite:
            _a_grant_waits_for_the_other_heads_fence_answer(stack, head0, head1)
    finally:
        for raw in (holder, writer, v3):
            raw.close()


def _v40_holder_recalled_across_heads(head0, writer) -> None:
    """An NFSv4.0 holder through head 0 is recalled over its SETCLIENTID callback address
    before an OPEN for writing through head 1."""
    service = CallbackService()
    holder = None
    try:
        holder = Client40(head0.port, service.uaddr)
        assert service.wait(lambda: any(proc == cb.CB_NULL for proc, _, _ in service.calls))
        time.sleep(0.2)  # the probe's reply is being read
        ok, fh, sid = holder.open_read("v40", b"reader40")
        kind, deleg = ok.delegation
        assert kind == c.OPEN_DELEGATE_READ, ok.delegation
        holder.close_open(fh, sid)
        assert writer.open_file("v40", c.OPEN4_SHARE_ACCESS_WRITE)[0] == c.NFS4ERR_DELAY
        recalled = service.wait(service.recalls)
        assert [(ident, r.stateid.other) for ident, r in recalled] == [
            (CB_IDENT, deleg.stateid.other)
        ]
        st, _ = holder.raw.v40([(c.OP_PUTFH, fh), (c.OP_DELEGRETURN, deleg.stateid)])
        assert st == 0, st
        assert writer.open_file("v40", c.OPEN4_SHARE_ACCESS_WRITE, owner=b"w40")[0] == 0
    finally:
        if holder is not None:
            holder.raw.close()
        service.close()


def _write_delegation_recalled_by_another_heads_reads(stack, head0, head1, monkeypatch) -> None:
    """A checkpoint writer through head 0 gets a write delegation (its client alone has the
    file open in the cluster), and head 1 knows of it before the OPEN is answered (the grant's
    fence). Head 1's GETATTRs of change and size are answered through head 0 (CB_GETATTR to
    the holder, RFC 8881 10.4.3), with the size it holds in its cache and a change attribute
    that moves when its own does, and no recall; a holder that does not answer is recalled
    (DELAY until the return) and head 1 then sees what it wrote. nfs-rs's NFSv3 read through
    head 1 recalls it (JUKEBOX until the return). A file another head's client has open gets no
    write delegation."""
    for name in ("ckpt", "ckpt-v3", "shared"):
        make_file(head1.port, name, b"0123456789")
    holder = CallbackClient(head0.port).setup()
    reader = CallbackClient(head1.port, back_channel=False).setup()
    try:
        fh, osid, dsid = _write_delegation(holder, "ckpt")
        ino = _ino(head0, dsid)
        assert [r["type"] for r in held_in_catalog(stack.catalog, ino)] == ["write"]
        assert ino in head1.server.state.delegations.heads.foreign_writes
        write = t.ARGS[c.OP_WRITE](dsid, 0, c.FILE_SYNC4, b"written under it")
        assert holder.session([(c.OP_PUTFH, fh), (c.OP_WRITE, write)])[0] == 0
        granted = head0.server.state.delegations.core.states[dsid.other].granted_change
        getattr_ = [(c.OP_PUTFH, fh), (c.OP_GETATTR, CHANGE_SIZE)]
        # CB_GETATTR across heads: the holder has 1 MiB in its cache, then 2 MiB
        seen = []
        for size, step in ((1 << 20, 1), (1 << 20, 1), (2 << 20, 2)):
            holder.attrs = (size, granted + step)
            with answering(holder):
                started = time.monotonic()
                seen.append((*_change_size(reader, fh), time.monotonic() - started))
        (change1, size1, _), again, (change2, size2, _) = seen
        assert size1 == 1 << 20 and size2 == 2 << 20, seen
        assert again[:2] == (change1, size1)  # nothing more changed: the same answer
        assert change2 > change1 > 0, seen
        assert holder.getattrs() == 3 and holder.recalls() == []
        assert head1.server.state.delegations.counts["other_head_cb_getattr"] == 3
        assert head0.server.state.delegations.counts["cb_getattr"] == 3
        print(f"CB_GETATTR across heads: {[round(s[2] * 1000, 1) for s in seen]} ms")
        # a holder that does not answer: recalled through head 0, DELAY until the return
        monkeypatch.setattr(head0.server.state.delegations.heads, "holder_wait", 0.3)
        assert reader.session(getattr_)[0] == c.NFS4ERR_DELAY
        assert [s.other for s in holder.wait_for_recall()] == [dsid.other]
        close = (c.OP_CLOSE, t.ARGS[c.OP_CLOSE](0, osid))
        assert holder.session([(c.OP_PUTFH, fh), close, (c.OP_DELEGRETURN, dsid)])[0] == 0
        st, res = reader.session(getattr_)
        assert st == 0, st
        assert struct.unpack(">QQ", bytes(res[2][2].attr_vals))[1] == len(b"written under it")

        # nfs-rs over NFSv3 through head 1: JUKEBOX (retried) until the holder returned it
        fh, osid, dsid = _write_delegation(holder, "ckpt-v3")
        write = t.ARGS[c.OP_WRITE](dsid, 0, c.FILE_SYNC4, b"checkpoint v3")
        assert holder.session([(c.OP_PUTFH, fh), (c.OP_WRITE, write)])[0] == 0
        holder.callbacks.clear()
        outcome: dict = {}
        with nfsrs(head1.port, version="3") as client:

            def read() -> None:
                def once() -> None:
                    with client.open("ckpt-v3", "rb") as f:
                        outcome["data"] = f.read()

                try:
                    outcome["tries"] = _retrying(once)
                except Exception as exc:  # noqa: BLE001 - reported by the assertion below
                    outcome["error"] = exc

            worker = threading.Thread(target=read)
            worker.start()
            assert [s.other for s in holder.wait_for_recall()] == [dsid.other]
            assert worker.is_alive(), f"the read did not wait: {outcome}"
            close = (c.OP_CLOSE, t.ARGS[c.OP_CLOSE](0, osid))
            assert holder.session([(c.OP_PUTFH, fh), close, (c.OP_DELEGRETURN, dsid)])[0] == 0
            worker.join(40)
        assert "error" not in outcome and outcome["data"] == b"checkpoint v3", outcome

        # another head's client has the file open: no write delegation here
        st, _ = reader.open_file("shared", c.OPEN4_SHARE_ACCESS_READ, owner=b"reader")
        assert st == 0, st
        st, res = holder.open_file("shared", c.OPEN4_SHARE_ACCESS_BOTH, owner=b"o4")
        assert st == 0 and res[2][2].delegation[0] == c.OPEN_DELEGATE_NONE, res[2][2]
    finally:
        holder.close()
        reader.close()


def _a_grant_waits_for_the_other_heads_fence_answer(stack, head0, head1) -> None:
    """PostgreSQL: while head 1 does not answer head 0's grant fences (as if its change watch
    lagged), head 0's OPEN goes without a delegation and leaves no row; once it answers again
    (and SILENT_HOLD_S passed), the next OPEN gets one."""
    answer = head1.server.state.delegations.heads._fence_seen
    stack.catalog.unsubscribe(answer)
    make_file(head1.port, "fenced")
    holder = CallbackClient(head0.port).setup()
    try:
        st, res = holder.open_file("fenced", c.OPEN4_SHARE_ACCESS_READ)
        assert st == 0 and res[2][2].delegation[0] == c.OPEN_DELEGATE_NONE, (st, res)
        left = stack.catalog.read(lambda conn: hd.rows_with_prefix(conn, "nfs_delegation_"))
        assert left == []
        stack.catalog.subscribe(hd.FENCE, answer)
        time.sleep(hd.SILENT_HOLD_S)
        st, res = holder.open_file("fenced", c.OPEN4_SHARE_ACCESS_READ, owner=b"o2")
        assert st == 0 and res[2][2].delegation[0] == c.OPEN_DELEGATE_READ, (st, res)
    finally:
        holder.close()


def test_a_dead_heads_delegation_is_reclaimed_through_the_head_that_expires_it(two_heads):
    stack, (head0, head1) = two_heads
    make_file(head1.port, "kept")
    holder = CallbackClient(head0.port).setup(owner=b"deleg-host")
    v3 = RawClient(head1.port)
    again = None
    try:
        fh, sid = read_delegation(holder, "kept")
        ino = _ino(head0, sid)
        root = holder.root_fh()
        # head 0 stops beating and hears no recall requests, as if killed (its connections
        # stay up: the holder keeps its lease there)
        head0.server.state.heads.beat = lambda: True
        head0.server.state.delegations.poll_recalls = lambda: 0
        stopped = time.monotonic()
        # meanwhile head 1 holds off the REMOVE: head 0's delegation stands until it expires
        assert _v3_remove(v3, root, "kept") == t3.NFS3ERR_JUKEBOX
        deadline = stopped + 4 * LEASE
        while not head1.server.state.heads.recovery:
            assert time.monotonic() < deadline, "head 0 never expired"
            assert _v3_remove(v3, root, "kept") == t3.NFS3ERR_JUKEBOX
            holder.session([])  # (head 0 still runs: its lease expiry must not drop the client)
            time.sleep(0.1)
        (row,) = held_in_catalog(stack.catalog, ino)
        assert row["head"] == "head1"  # taken with its client
        # the recalls head 1 asked of head 0 went with it (it asks itself now)
        assert not stack.catalog.get_setting(f"nfs_recall_head0_{ino}")
        # the unreclaimed delegation still holds off the REMOVE during the grace period
        assert _v3_remove(v3, root, "kept") == t3.NFS3ERR_JUKEBOX

        again = CallbackClient(head1.port).setup(owner=b"deleg-host", reclaim_complete=False)
        reclaim = t.ARGS[c.OP_OPEN](
            0,
            c.OPEN4_SHARE_ACCESS_READ,
            c.OPEN4_SHARE_DENY_NONE,
            t.state_owner4.cls(again.clientid, b"o"),
            (c.OPEN4_NOCREATE, None),
            (c.CLAIM_PREVIOUS, c.OPEN_DELEGATE_READ),
        )
        st, res = again.session([(c.OP_PUTFH, fh), (c.OP_OPEN, reclaim)])
        assert st == 0, st
        ok = res[-1][2]
        kind, deleg = ok.delegation
        assert kind == c.OPEN_DELEGATE_READ, ok.delegation
        assert again.session([(c.OP_RECLAIM_COMPLETE, False)])[0] == 0
        st, _ = again.session([(c.OP_PUTFH, fh), (c.OP_CLOSE, t.ARGS[c.OP_CLOSE](0, ok.stateid))])
        assert st == 0, st
        # the reclaimed delegation is recalled like any other before the REMOVE
        assert _v3_remove(v3, root, "kept") == t3.NFS3ERR_JUKEBOX
        assert [s.other for s in again.wait_for_recall()] == [deleg.stateid.other]
        assert again.session([(c.OP_PUTFH, fh), (c.OP_DELEGRETURN, deleg.stateid)])[0] == 0
        assert _v3_remove(v3, root, "kept") == t3.NFS3_OK
        assert held_in_catalog(stack.catalog, ino) == []
    finally:
        for raw in (holder, v3, again):
            if raw is not None:
                raw.close()
