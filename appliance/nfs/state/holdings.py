"""Locks and share reservations across heads (docs/nfs-state.md). Each head keeps its own
state table and publishes, per file its clients hold anything on, one nfs_holdings row: the
union of its opens' access and deny modes and every byte-range lock. A head about to grant a
lock or an open checks the other heads' rows of that file and writes its own new row in ONE
catalog transaction (SQLite: one writer at a time; PostgreSQL: SERIALIZABLE, retried), so two
heads cannot both grant conflicting state. What only releases (LOCKU, CLOSE, a client gone)
marks the file and is written soon after (at once by the operations that release on
purpose): a row a moment too big only refuses a request a client retries, never grants a
conflict. A single head (no [heads] count above 1) has no ``Holdings`` and touches no table."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import select

from appliance.nfs.state.core import StateCore
from appliance.nfs.state.head_delegations import HeadDelegations
from appliance.nfs.state.heads import HOLDINGS, HeadRegistry, recovery_epoch
from appliance.nfs.state.model import NfsError
from appliance.nfs.v4 import const as c
from engine.base.blocking import may_block
from engine.catalog.database import sql

log = logging.getLogger("shingle.nfs.state")

_WRITES = (c.WRITE_LT, c.WRITEW_LT)
_GRACE = "grace"  # a grant refused: the cluster is in its grace period
_NONE: tuple = (0, 0, [])  # the holdings of a file without a row
_ALONE = "alone"  # no other head has a row of the file
# plain SQL (engine.catalog.database.sql): a head writes its row at every open and close
_DELETE_SQL = "DELETE FROM nfs_holdings WHERE head = ? AND ino = ?"
_INSERT_SQL = (
    "INSERT INTO nfs_holdings (head, ino, instance, access, deny, locks) VALUES (?, ?, ?, ?, ?, ?)"
)
_ENVELOPE_HIT = "envelope"  # another head holds locks of the file it has not published
_DELEGATED = "delegated"  # another head's delegation of the file conflicts with the open
# the lock entry of a head alone on a file: "any range, ranges kept in memory" (client id -1)
ENVELOPE = [0, 1 << 64, c.WRITE_LT, -1, False, ""]


@dataclass(frozen=True)
class ForeignClient:
    clientid: int
    owner: bytes  # b"nlm:" for an NLM host (what NlmManager.holder looks at), else b""


@dataclass(frozen=True)
class ForeignLock:
    """A lock held through another head, shaped as a LockState for LOCK4denied and
    nlm4_holder."""

    client: ForeignClient
    owner: bytes
    head: str


class Holdings:
    def __init__(self, core: StateCore, registry: HeadRegistry, shares, locks):
        """``shares``, ``locks``: the table's Shares and Locks, whose holdings this publishes."""
        self.core, self.registry, self.shares, self.locks = core, registry, shares, locks
        self.catalog = core.catalog
        self.dirty: set[int] = set()  # files whose row is bigger than what is held
        # each file's row as this head last wrote it: a grant that leaves it as it is, or a
        # release back to it, writes nothing (an OPEN and CLOSE of a file held open)
        self.written: dict[int, tuple] = {}
        # runs a flush in a worker (the server's pool), when set
        self.submit: Callable[..., object] | None = None
        # files this head alone holds state on: its row says ENVELOPE for their locks, which
        # change in memory only, until another head shows interest (``poll_interest``)
        self.envelope: set[int] = set()
        # the NLM DOS shares (NLM_SHARE) this head holds on a file, as (access, deny) in
        # NFSv4's bits (the same numbers): published in its row beside its opens' modes
        self.nlm_shares: Callable[[int], tuple[int, int]] | None = None
        # the other heads' delegations (appliance.nfs.state.head_delegations), checked in the
        # transaction that publishes an open: a grant there and this open cannot both commit
        self.delegations: HeadDelegations | None = None

    # -- what this head holds -------------------------------------------------------------------
    def summary(self, ino: int, open_st=None, open_modes=(0, 0), lock_st=None, ranges=()):
        """(access, deny, locks) this head holds on ``ino``, with ``open_st`` at
        ``open_modes`` and ``lock_st`` holding ``ranges`` (what a grant would make them)."""
        states = self.core.states
        access, deny = open_modes if open_st is not None else (0, 0)
        if self.nlm_shares is not None:
            nlm_access, nlm_deny = self.nlm_shares(ino)
            access, deny = access | nlm_access, deny | nlm_deny
        for st in self.shares.by_file.get(ino, ()):
            if st is not open_st and st.other in states:
                access, deny = access | st.access, deny | st.deny
        locks = []
        held = [(lk, lk.ranges) for lk in self.locks.by_file.get(ino, ()) if lk is not lock_st]
        if lock_st is not None:
            held.append((lock_st, ranges))
        for lk, lk_ranges in held:
            if lk is not lock_st and lk.other not in states:
                continue
            nlm = lk.client.owner.startswith(b"nlm:")
            for r0, r1, rtype in lk_ranges:
                locks.append([r0, r1, rtype, lk.client.clientid, nlm, lk.owner.hex()])
        if ino in self.envelope and (access or deny or locks):
            locks = [ENVELOPE]
        return access, deny, locks

    def _write(self, conn, ino: int, summary) -> None:
        access, deny, locks = summary
        reg = self.registry
        sql(conn, _DELETE_SQL, (reg.name, ino)).close()
        if access or deny or locks:
            row = (reg.name, ino, reg.instance, access, deny, json.dumps(locks))
            sql(conn, _INSERT_SQL, row).close()

    # -- grants: check the other heads and publish in one transaction ---------------------------
    def grant_lock(self, lk, start: int, end: int, locktype: int, ranges, reclaim: bool):
        """Before ``lk`` gets [start, end) of ``locktype`` (its ranges then ``ranges``): the
        other heads' conflicting lock (a hit as ``Locks.conflict`` returns it) or None, and
        this head's row written with the new ranges. Under the state lock. NFS4ERR_GRACE
        unless ``reclaim`` while the cluster is in grace."""
        if lk.ino in self.envelope:
            return None  # this head alone holds state on the file: its locks stay in memory
        summary = self.summary(lk.ino, lock_st=lk, ranges=ranges)
        alone = (summary[0], summary[1], [ENVELOPE])
        return self._grant(
            lk.ino, lambda rows: _lock_hit(rows, start, end, locktype), summary, reclaim, alone
        )

    def grant_open(self, st, ino: int, access: int, deny: int, reclaim: bool) -> bool:
        """Before an open of ``ino`` gets ``access``/``deny`` (``st`` the open state it merges
        into, or None): False when another head's opens conflict (nothing written)."""
        held_access, held_deny, locks = self.summary(ino)
        if (held_access | access, held_deny | deny) == (held_access, held_deny):
            # this head's row already has these modes, checked when they were granted: no
            # other head can have got a conflicting open since (the row is never smaller than
            # what is held)
            return True
        if st is None:
            summary = (held_access | access, held_deny | deny, locks)
        else:
            summary = self.summary(ino, st, (st.access | access, st.deny | deny))

        def check(rows):
            return any((access & r.deny) or (deny & r.access) for r in rows) or None

        heads = self.delegations
        writes = bool(access & c.OPEN4_SHARE_ACCESS_WRITE or deny & c.OPEN4_SHARE_DENY_READ)

        def delegated(conn) -> bool:
            # another head's delegation granted after this open's conflict() looked (a read
            # one for an open that writes, a write one for any): the client retries, and its
            # next conflict() asks for the recall
            return heads is not None and bool(heads.foreign(conn, ino, write=writes))

        hit = self._grant(
            ino, check, summary, reclaim, delegated=None if heads is None or reclaim else delegated
        )
        if hit is _DELEGATED:
            assert heads is not None
            heads.note_foreign(ino)  # (a write one, or a read one: either way asked next time)
            raise NfsError(c.NFS4ERR_DELAY, f"inode {ino}: another head's delegation stands")
        return hit is None

    def _grant(self, ino: int, check, summary, reclaim: bool, alone=None, delegated=None):
        """``alone``: the row to write instead when no other head has a row of the file (its
        locks then go into envelope mode); ``delegated(conn)``: whether another head's
        delegation refuses it (_DELEGATED, nothing written)."""
        if self.written.get(ino) == summary:
            # granted already as it stands in the row: no other head got a conflict since
            self.dirty.discard(ino)
            return None
        may_block("checking the other heads' holdings")
        registry = self.registry

        def work(conn):
            # the grace period binds every head from the commit that starts it
            if not reclaim and recovery_epoch(conn):
                return _GRACE
            rows = registry.holdings_of_live(conn, ino)
            if alone is not None and not rows:
                self._write(conn, ino, alone)
                return _ALONE
            hit = check(rows)
            if hit is None and delegated is not None and delegated(conn):
                return _DELEGATED
            if hit is _ENVELOPE_HIT:
                self._interest(conn, ino)
            elif hit is None:
                self._write(conn, ino, summary)
            return hit

        hit = self.catalog.run(work, tracked=True, published=self.catalog.is_sqlite)
        if hit is _GRACE:
            registry.recovery = registry.recovery or 1  # seen before the next beat reads it
            raise NfsError(c.NFS4ERR_GRACE, "the cluster of heads is in its grace period")
        if hit is _ENVELOPE_HIT:
            raise NfsError(c.NFS4ERR_DELAY, "another head is publishing its locks of the file")
        if hit is _ALONE:
            self.envelope.add(ino)
            summary = alone
            hit = None
        if hit is None:
            self.dirty.discard(ino)
            self._wrote(ino, summary)
        return hit

    def created(self, access: int, deny: int):
        """For an OPEN that creates its file: ``work(conn, attr)`` for the transaction that
        makes it (Namespace.create's ``also``), which writes this head's row of the new file
        there, saving the OPEN's grant a transaction of its own (its ``written`` matches then).
        No other head can hold anything of a file not yet made; the cluster's grace period is
        checked as a grant checks it (NFS4ERR_GRACE: the file is not made)."""
        summary: tuple[int, int, list] = (access, deny, [])
        registry = self.registry

        def work(conn, attr) -> None:
            if recovery_epoch(conn):
                registry.recovery = registry.recovery or 1
                raise NfsError(c.NFS4ERR_GRACE, "the cluster of heads is in its grace period")
            if registry.holdings_of_live(conn, attr.ino):
                return  # a row of this number already (a dead head's): the grant checks it
            self._write(conn, attr.ino, summary)
            self.catalog.after_commit(conn, lambda: self._created(attr.ino, summary))

        return work

    def _created(self, ino: int, summary) -> None:
        with self.core.lock:
            self._wrote(ino, summary)

    def _interest(self, conn, ino: int) -> None:
        """In a transaction: this head wants the locks of ``ino`` another head keeps in
        memory: a row of its own (empty, unless it has one) tells that head to publish them."""
        reg = self.registry
        mine = conn.execute(
            select(HOLDINGS.c.ino).where(HOLDINGS.c.head == reg.name, HOLDINGS.c.ino == ino)
        ).first()
        if mine is None:
            conn.execute(
                HOLDINGS.insert().values(
                    head=reg.name, ino=ino, instance=reg.instance, access=0, deny=0, locks="[]"
                )
            )

    def poll_interest(self) -> None:
        """Every half second while this head has files in envelope mode: those another head
        has a row of now leave it (their exact locks are written, and checked from then on)."""
        envelope = sorted(self.envelope)
        if not envelope:
            return
        name = self.registry.name
        wanted = self.catalog.read(
            lambda conn: set(
                conn.execute(
                    select(HOLDINGS.c.ino).where(
                        HOLDINGS.c.ino.in_(envelope), HOLDINGS.c.head != name
                    )
                ).scalars()
            )
        )
        if not wanted:
            return
        with self.core.lock:
            for ino in wanted:
                self.envelope.discard(ino)
            summaries = [(ino, self.summary(ino)) for ino in sorted(wanted)]

            def work(conn):
                for ino, summary in summaries:
                    self._write(conn, ino, summary)

            try:
                self.catalog.run(work, tracked=True, published=self.catalog.is_sqlite)
            except BaseException:
                self.envelope.update(wanted)  # the row still says ENVELOPE
                raise
            for ino, summary in summaries:
                self._wrote(ino, summary)
                self.dirty.discard(ino)

    def _wrote(self, ino: int, summary) -> None:
        if summary[0] or summary[1] or summary[2]:
            self.written[ino] = summary
        else:
            self.written.pop(ino, None)
            self.envelope.discard(ino)  # holding nothing: the next lock checks again

    def test_lock(self, ino: int, start: int, end: int, locktype: int):
        """LOCKT, NLM_TEST: another head's conflicting lock, or None (nothing written);
        NFS4ERR_DELAY when another head keeps its locks of the file in memory (told to
        publish them)."""
        may_block("reading the other heads' holdings")
        registry = self.registry
        hit = self.catalog.read(
            lambda conn: _lock_hit(registry.holdings_of_live(conn, ino), start, end, locktype)
        )
        if hit is _ENVELOPE_HIT:
            self.catalog.run(
                lambda conn: self._interest(conn, ino),
                tracked=True,
                published=self.catalog.is_sqlite,
            )
            raise NfsError(c.NFS4ERR_DELAY, "another head is publishing its locks of the file")
        return hit

    def special_io_denied(self, ino: int, want: int) -> bool:
        """READ or WRITE with a special stateid against another head's deny modes."""
        may_block("reading the other heads' holdings")
        registry = self.registry
        return self.catalog.read(
            lambda conn: any(r.deny & want for r in registry.holdings_of_live(conn, ino))
        )

    # -- releases -------------------------------------------------------------------------------
    def changed(self, ino: int) -> None:
        """What this head holds on ``ino`` shrank: its row is written by the next flush."""
        first = not self.dirty
        self.dirty.add(ino)
        if first and self.submit is not None:
            try:
                self.submit(self.flush_quietly)
            except RuntimeError:  # the server is stopping; the row goes with the head's
                pass

    def flush(self) -> None:
        """Write the rows of the files whose holdings shrank (one transaction)."""
        core = self.core
        with core.lock:
            if not self.dirty:
                return
            inos = sorted(self.dirty)
            summaries = [(ino, self.summary(ino)) for ino in inos]
            summaries = [(ino, s) for ino, s in summaries if self.written.get(ino, _NONE) != s]

            def work(conn):
                for ino, summary in summaries:
                    self._write(conn, ino, summary)

            if summaries:
                self.catalog.run(work, tracked=True, published=self.catalog.is_sqlite)
            for ino, summary in summaries:
                self._wrote(ino, summary)
            self.dirty.difference_update(inos)

    def flush_quietly(self) -> None:
        try:
            self.flush()
        except Exception as exc:  # noqa: BLE001 - the housekeeping flushes again
            log.info("holdings not written yet (%s): retried by the housekeeping", exc)


def _lock_hit(rows, start: int, end: int, locktype: int):
    write = locktype in _WRITES
    for row in rows:
        for r0, r1, rtype, clientid, nlm, owner in json.loads(row.locks):
            if clientid == -1:  # ENVELOPE: that head alone knows its ranges
                return _ENVELOPE_HIT
            if start < r1 and r0 < end and (write or rtype in _WRITES):
                holder = ForeignLock(
                    ForeignClient(clientid, b"nlm:" if nlm else b""), bytes.fromhex(owner), row.head
                )
                return holder, r0, r1, rtype
    return None
