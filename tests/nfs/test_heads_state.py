"""NFSv4 locks and share reservations across heads (appliance/nfs/state/holdings.py,
docs/nfs-state.md): two NFS servers of one process, each a head of its own ([heads] index 0
and 1) over one catalog, SQLite and PostgreSQL, with raw NFSv4.1 requests: a lock through one
head denies a conflicting LOCK and LOCKT through the other until it is released; an OPEN that
denies writing refuses the other head's OPEN for writing until it is closed; a head that
stops beating is expired by the other after a lease, its locks with it, and its client
reclaims through the other head in the cluster-wide grace period."""

from __future__ import annotations

import json
import shutil
import time

import pytest
from nfs4_rawclient import RawClient, open_args
from nfs4_support import MiB, Stack, add_export, start_server
from sqlalchemy import select

from appliance.nfs.v4 import const as c
from appliance.nfs.v4 import types as t
from engine.catalog.models import NfsHolding, Setting

LEASE = 2


@pytest.fixture
def two_heads(tmp_path, catalog_url):
    stack = Stack(
        tmp_path, drive_size=24 * MiB, zone_size=2 * MiB, fragment_size=64 * 1024, url=catalog_url
    )
    add_export(stack.catalog)
    heads = [
        start_server(stack, head_index=i, lease_seconds=LEASE, grace_seconds=30) for i in (0, 1)
    ]
    yield heads
    for head in heads:
        head.stop()
    stack.close()
    shutil.rmtree(tmp_path / "drives", ignore_errors=True)


def _lock(raw, fh, open_sid, start, length, owner, locktype=c.WRITE_LT):
    locker = (
        True,
        t.open_to_lock_owner4.cls(0, open_sid, 0, t.state_owner4.cls(raw.clientid, owner)),
    )
    return raw.session(
        [(c.OP_PUTFH, fh), (c.OP_LOCK, t.ARGS[c.OP_LOCK](locktype, False, start, length, locker))]
    )


def _published(attempt):
    """``attempt()``'s (status, results) once not NFS4ERR_DELAY: what a client does while the
    other head publishes the locks it kept in memory (within about a second)."""
    deadline = time.monotonic() + 5
    while (got := attempt())[0] == c.NFS4ERR_DELAY:
        assert time.monotonic() < deadline, "the other head never published its locks"
        time.sleep(0.05)
    return got


def _session_heads(catalog) -> set[str]:
    settings = Setting.__table__
    rows = catalog.read(
        lambda conn: conn.execute(
            select(settings.c.value).where(settings.c.key.like("nfs_session_%"))
        ).all()
    )
    return {json.loads(row.value)["head"] for row in rows}


def _open(raw, name, owner, *, deny=0, create=False):
    st, res = raw.session(
        [
            (c.OP_PUTFH, raw.root_fh()),
            (c.OP_OPEN, open_args(name, owner, raw.clientid, deny=deny, create=create)),
            (c.OP_GETFH, None),
        ]
    )
    if st:
        return st, None, None
    return st, res[-1][2], res[2][2].stateid


def test_a_lock_through_one_head_denies_the_other_until_released(two_heads):
    a = RawClient(two_heads[0].port).setup()
    b = RawClient(two_heads[1].port).setup()
    try:
        fh, sid_a = a.open_new("locked", b"oa")
        _, fh_b, sid_b = _open(b, "locked", b"ob")
        assert fh_b == fh  # one namespace, one handle
        st, res = _lock(a, fh, sid_a, 0, 100, b"la")
        assert st == 0, st
        lock_sid = res[-1][2]
        # B's conflicting LOCK: DENIED, naming A's lock; a range beside it is granted
        st, res = _lock(b, fh, sid_b, 50, 10, b"lb")
        assert st == c.NFS4ERR_DENIED
        denied = res[-1][2]
        assert (denied.offset, denied.length, denied.locktype) == (0, 100, c.WRITE_LT)
        assert denied.owner.owner == b"la"
        lockt = (
            c.OP_LOCKT,
            t.ARGS[c.OP_LOCKT](c.READ_LT, 99, 1, t.state_owner4.cls(b.clientid, b"lb")),
        )
        assert b.session([(c.OP_PUTFH, fh), lockt])[0] == c.NFS4ERR_DENIED
        st, res = _lock(b, fh, sid_b, 100, 10, b"lb")
        assert st == 0, st
        # and A is refused B's range
        lockt_a = (
            c.OP_LOCKT,
            t.ARGS[c.OP_LOCKT](c.WRITE_LT, 105, 1, t.state_owner4.cls(a.clientid, b"la")),
        )
        assert a.session([(c.OP_PUTFH, fh), lockt_a])[0] == c.NFS4ERR_DENIED
        # released through A: B gets it at once (LOCKU writes the holdings before its reply)
        locku = (c.OP_LOCKU, t.ARGS[c.OP_LOCKU](c.WRITE_LT, 0, lock_sid, 0, 100))
        assert a.session([(c.OP_PUTFH, fh), locku])[0] == 0
        assert b.session([(c.OP_PUTFH, fh), lockt])[0] == 0
        st, _ = _lock(b, fh, sid_b, 0, 100, b"lb2")
        assert st == 0, st
    finally:
        a.close()
        b.close()


def test_an_open_that_denies_through_one_head_refuses_the_other(two_heads):
    a = RawClient(two_heads[0].port).setup()
    b = RawClient(two_heads[1].port).setup()
    try:
        a.open_new("shared", b"first")  # made, then opened again with a deny
        st, _, _ = _open(a, "shared", b"denier", deny=c.OPEN4_SHARE_DENY_WRITE)
        assert st == c.NFS4ERR_SHARE_DENIED  # its own first open writes: the rule, locally
        st, _ = a.session([(c.OP_PUTFH, a.root_fh()), (c.OP_REMOVE, "shared")])
        assert st == 0
        st, fh, sid = _open(a, "held", b"denier", deny=c.OPEN4_SHARE_DENY_WRITE, create=True)
        assert st == 0, st
        # B's OPEN for writing: SHARE_DENIED; for reading only: granted
        assert _open(b, "held", b"writer")[0] == c.NFS4ERR_SHARE_DENIED
        read_only = open_args(
            "held", b"reader", b.clientid, access=c.OPEN4_SHARE_ACCESS_READ, create=False
        )
        assert b.session([(c.OP_PUTFH, b.root_fh()), (c.OP_OPEN, read_only)])[0] == 0
        # B's reader now holds READ: A may not deny reading any more
        st, _, _ = _open(a, "held", b"deny-read", deny=c.OPEN4_SHARE_DENY_READ)
        assert st == c.NFS4ERR_SHARE_DENIED
        # A closes: B's writer gets through
        close = (c.OP_CLOSE, t.ARGS[c.OP_CLOSE](0, sid))
        assert a.session([(c.OP_PUTFH, fh), close])[0] == 0
        assert _open(b, "held", b"writer")[0] == 0
    finally:
        a.close()
        b.close()


def test_a_head_that_stops_beating_loses_its_locks_and_its_client_reclaims_elsewhere(two_heads):
    """Head A stops beating (as a killed process would): B refuses A's lock for about a lease,
    then expires A, takes its client and starts the cluster-wide grace period; the client
    reclaims through B while B's own client waits with NFS4ERR_GRACE; RECLAIM_COMPLETE ends
    it and the reclaimed lock holds."""
    head_a, head_b = two_heads
    a = RawClient(head_a.port).setup(owner=b"host-a")
    b = RawClient(head_b.port).setup()
    again = None
    try:
        fh, sid_a = a.open_new("orphan", b"oa")
        assert _lock(a, fh, sid_a, 0, 10, b"la")[0] == 0
        _, _, sid_b = _open(b, "orphan", b"ob")
        # A locked alone on the file: its ranges were in memory (ENVELOPE), B waits for them
        assert _lock(b, fh, sid_b, 0, 10, b"lb")[0] == c.NFS4ERR_DELAY
        assert _published(lambda: _lock(b, fh, sid_b, 0, 10, b"lb"))[0] == c.NFS4ERR_DENIED
        head_a.server.state.heads.beat = lambda: True  # the row stays as it was
        stopped = time.monotonic()
        while (st := _lock(b, fh, sid_b, 0, 10, b"lb")[0]) == c.NFS4ERR_DENIED:
            assert time.monotonic() - stopped < 4 * LEASE, "head A never expired"
            a.session([])  # (head A still runs: its lease expiry must not drop the client)
            time.sleep(0.05)  # (half the wait past the expiry pays for the grace OPEN below)
        assert st == c.NFS4ERR_GRACE, st
        # not before B watched A's counter stand still for a lease (B notices a beat at its
        # own beat, up to two periods of lease / 6 apart)
        assert time.monotonic() - stopped >= LEASE / 2
        assert head_b.server.state.heads.recovery  # the recovery epoch is set
        # A's session rows went with it (nobody would restore them), B's stay
        assert _session_heads(head_b.server.catalog) == {"head1"}

        again = RawClient(head_b.port).setup(owner=b"host-a", reclaim_complete=False)
        reclaim = open_args("orphan", b"oa", again.clientid, create=False)
        reclaim.claim = (c.CLAIM_PREVIOUS, c.OPEN_DELEGATE_NONE)
        st, res = again.session([(c.OP_PUTFH, fh), (c.OP_OPEN, reclaim)])
        assert st == 0, st
        locker = (
            True,
            t.open_to_lock_owner4.cls(
                0, res[-1][2].stateid, 0, t.state_owner4.cls(again.clientid, b"la")
            ),
        )
        relock = t.ARGS[c.OP_LOCK](c.WRITE_LT, True, 0, 10, locker)
        assert again.session([(c.OP_PUTFH, fh), (c.OP_LOCK, relock)])[0] == 0
        assert _lock(b, fh, sid_b, 50, 10, b"lb")[0] == c.NFS4ERR_GRACE
        # it binds head A too (not in a grace period of its own): an OPEN that would create
        # is refused in the transaction that would make the file, so none is made
        late = RawClient(head_a.port).setup()
        try:
            assert _open(late, "late", b"ol", create=True)[0] == c.NFS4ERR_GRACE
        finally:
            late.close()
        lookup = b.session([(c.OP_PUTFH, b.root_fh()), (c.OP_LOOKUP, "late")])
        assert lookup[0] == c.NFS4ERR_NOENT, lookup[0]
        # a client that held nothing on A may not reclaim through B
        stranger = RawClient(head_b.port).setup(reclaim_complete=False)
        st, _ = stranger.session([(c.OP_PUTFH, fh), (c.OP_OPEN, reclaim)])
        stranger.close()
        assert st == c.NFS4ERR_RECLAIM_BAD, st
        assert again.session([(c.OP_RECLAIM_COMPLETE, False)])[0] == 0
        assert not head_b.server.state.heads.recovery  # the last NEED lifted: R = 0
        assert _lock(b, fh, sid_b, 50, 10, b"lb")[0] == 0
        st, res = _lock(b, fh, sid_b, 0, 10, b"lb2")
        assert st == c.NFS4ERR_DENIED
        assert res[-1][2].owner.owner == b"la"
    finally:
        for raw in (a, b, again):
            if raw is not None:
                raw.close()


def _locks_of(catalog, head: str) -> list:
    holdings = NfsHolding.__table__
    rows = catalog.read(
        lambda conn: conn.execute(
            select(holdings.c.locks).where(holdings.c.head == head, holdings.c.locks != "[]")
        ).all()
    )
    return [json.loads(row.locks) for row in rows]


def test_a_head_alone_on_a_file_keeps_its_ranges_in_memory_until_another_wants_them(two_heads):
    """The uncontended case costs no catalog write per LOCK and LOCKU: the first lock of a
    file no other head has a row of publishes ENVELOPE (any range); the ranges then change in
    memory; another head's request gets NFS4ERR_DELAY and makes the holder publish them."""
    head_a, head_b = two_heads
    catalog = head_a.server.catalog
    a = RawClient(head_a.port).setup()
    b = RawClient(head_b.port).setup()
    try:
        fh, sid_a = a.open_new("alone", b"oa")
        st, res = _lock(a, fh, sid_a, 0, 10, b"la")
        assert st == 0, st
        lock_sid = t.stateid4.cls(0, res[-1][2].other)
        published = _locks_of(catalog, "head0")
        assert [entry[3] for entry in published[0]] == [-1]  # ENVELOPE: client id -1
        for start in (20, 40, 60):  # more locks and unlocks: in memory only
            relock = (False, t.exist_lock_owner4.cls(lock_sid, 0))
            lock = t.ARGS[c.OP_LOCK](c.WRITE_LT, False, start, 5, relock)
            assert a.session([(c.OP_PUTFH, fh), (c.OP_LOCK, lock)])[0] == 0
            unlock = t.ARGS[c.OP_LOCKU](c.WRITE_LT, 0, lock_sid, start, 5)
            assert a.session([(c.OP_PUTFH, fh), (c.OP_LOCKU, unlock)])[0] == 0
        assert _locks_of(catalog, "head0") == published
        # B wants the file: A publishes its one lock, B is refused it and gets the rest
        _, _, sid_b = _open(b, "alone", b"ob")
        st, res = _published(lambda: _lock(b, fh, sid_b, 5, 1, b"lb"))
        assert st == c.NFS4ERR_DENIED
        assert (res[-1][2].offset, res[-1][2].length, res[-1][2].owner.owner) == (0, 10, b"la")
        assert [entry[:2] for entry in _locks_of(catalog, "head0")[0]] == [[0, 10]]
        assert _lock(b, fh, sid_b, 10, 10, b"lb")[0] == 0
    finally:
        a.close()
        b.close()
