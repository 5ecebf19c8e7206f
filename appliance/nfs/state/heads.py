"""The heads over one catalog and their cluster-wide grace period (docs/nfs-state.md).

Liveness: each live head has a row in nfs_heads that it beats (a counter raised every
``lease / 6``); the others watch the counter with their own monotonic clocks, so no two
hosts' clocks are compared. A head whose counter stood still for a lease is dead: the first
head to see it deletes its row and its holdings in one transaction that also checks the
counter has not moved (compare and delete, no consensus), and takes its client records, so
those clients reclaim through it. A head that finds its own row gone was declared dead while
it could not beat (a catalog outage, a stopped process): its state may have been granted to
others meanwhile, so it drops every client's state and joins again as a new instance.

Grace, as NFS-Ganesha's rados_cluster recovery backend: one nfs_grace row holds the current
epoch C and the recovery epoch R (0: no cluster-wide grace). A head with clients to let
reclaim (its restart with previous clients that held state, or a dead head's clients taken
over) starts a grace period (R = C, C = C + 1, unless R is set already: it joins) and sets its
NEED flag; every head refuses new locks and opens while R is not 0 and says so with its
ENFORCING flag. A head whose clients have reclaimed (or whose grace time ran out) clears NEED;
the transaction that finds no NEED left sets R = 0. Ganesha waits at start until every head
enforces, because its heads grant from local state; here every grant is a catalog transaction
that reads R (appliance.nfs.state.holdings), so a grace period binds every head from the
commit that starts it, and ENFORCING only reports what each head's cached view is."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from sqlalchemy import delete, func, select, update

from engine.admin.nfs_clients import DELEG_PREFIX
from engine.catalog.database import sql_all, sql_one
from engine.catalog.models import NfsClient, NfsGrace, NfsHead, NfsHolding, Setting

log = logging.getLogger("shingle.nfs.state")

HEADS = NfsHead.__table__
HOLDINGS = NfsHolding.__table__
GRACE = NfsGrace.__table__
CLIENTS = NfsClient.__table__
SETTINGS = Setting.__table__


RECALL_PREFIX = "nfs_recall_"  # recall requests (appliance.nfs.state.head_delegations)
# this process's commits that may give a head a delegation row another head of this process has
# to see (a grant, a head joining, a takeover): with heads of one process over one Catalog (the
# tests) these are tracked commits, which ``Catalog.only_tracked`` lets head_delegations skip
DELEGATION_MOVES = [0]


def head_name(index: int) -> str:
    return f"head{index}"


def nsm_hosts_key(name: str) -> str:
    """The settings row of the NLM hosts head ``name`` monitors (appliance.nfs.nlm.nsm's
    ``nsm_monitored_head<i>``)."""
    return f"nsm_monitored_{name}"


@dataclass
class Takeover:
    """What a head took from a dead one: its NFSv4 clients that held state (owner, recorded
    principal), its NLM hosts (caller name -> address), the NSM name they know it by, and its
    delegations' rows, now this head's ((client owner hex, inode) -> (row key, type))."""

    head: str
    clients: list = field(default_factory=list)
    nlm_hosts: dict = field(default_factory=dict)
    delegations: dict = field(default_factory=dict)
    nsm_name: str = ""


class Holding(NamedTuple):
    """Another head's row of its opens' modes and locks of one file (``holdings_of_live``)."""

    head: str
    instance: str
    access: int
    deny: int
    locks: str


# plain SQL (engine.catalog.database.sql): these run in every open, close and lock grant of a
# head of several, where building the SQLAlchemy statements cost more than SQLite's work
_RECOVERY_SQL = "SELECT recovery_epoch FROM nfs_grace WHERE id = 1"
_HOLDINGS_OF_LIVE_SQL = (
    "SELECT h.head, h.instance, h.access, h.deny, h.locks FROM nfs_holdings h JOIN nfs_heads d "
    "ON d.name = h.head AND d.instance = h.instance WHERE h.ino = ? AND h.head <> ?"
)


def recovery_epoch(conn) -> int:
    """In a transaction: R, the epoch whose clients may reclaim (0: no cluster-wide grace)."""
    row = sql_one(conn, _RECOVERY_SQL)
    assert row is not None, "nfs_grace has its one row from the migration that made it"
    return int(row[0])


def _start_grace(conn, name: str) -> int:
    """In a transaction: start a cluster-wide grace period, or join the one in force; ``name``
    needs it and enforces it. R."""
    row = conn.execute(select(GRACE).where(GRACE.c.id == 1)).one()
    current, recovery = int(row.current_epoch), int(row.recovery_epoch)
    if not recovery:
        recovery, current = current, current + 1
        conn.execute(
            update(GRACE)
            .where(GRACE.c.id == 1)
            .values(current_epoch=current, recovery_epoch=recovery)
        )
    conn.execute(update(HEADS).where(HEADS.c.name == name).values(need_grace=True, enforcing=True))
    return recovery


def _settle_grace(conn) -> int:
    """In a transaction: R, set to 0 first when no head needs the grace period any more."""
    recovery = recovery_epoch(conn)
    if recovery:
        needing = conn.execute(
            select(func.count()).select_from(HEADS).where(HEADS.c.need_grace.is_(True))
        ).scalar_one()
        if not needing:
            conn.execute(update(GRACE).where(GRACE.c.id == 1).values(recovery_epoch=0))
            return 0
    return recovery


class HeadRegistry:
    def __init__(self, catalog, name: str, lease_seconds: float):
        self.catalog = catalog
        self.name = name
        self.lease_seconds = lease_seconds
        self.instance = os.urandom(8).hex()
        # other heads as last seen: name -> (instance, beat, monotonic time the beat moved)
        self.seen: dict[str, tuple[str, int, float]] = {}
        self.recovery = 0  # R as this head last read it
        self.need = False  # this head's NEED flag
        self.address = ""  # this head's NSM name (its row's address: SM_NOTIFY after a takeover)
        # whether this head may expire dead heads now (with a floating metadata server
        # address only its holder does, so the dead head's clients find their records where
        # the address leads them: appliance/mds_address.py); None: always
        self.takes_over: Callable[[], bool] | None = None

    @property
    def beat_period(self) -> float:
        return max(0.2, self.lease_seconds / 6)

    @property
    def cluster_grace(self) -> bool:
        """Whether a cluster-wide grace period was in force at this head's last look."""
        return bool(self.recovery)

    def join(self, need_grace: bool = False) -> None:
        """At start: this name's earlier instance is dead (it is us), its holdings go; the row
        now names this instance. ``need_grace``: this head has previous clients to let
        reclaim: the grace period starts (or is joined) in the same transaction, so no head
        grants what they held."""
        name, instance, address = self.name, self.instance, self.address

        def work(conn):
            conn.execute(delete(HOLDINGS).where(HOLDINGS.c.head == name))
            conn.execute(delete(HEADS).where(HEADS.c.name == name))
            conn.execute(
                HEADS.insert().values(
                    name=name,
                    instance=instance,
                    beat=0,
                    address=address[:128],
                    started_ns=time.time_ns(),
                    need_grace=False,
                    enforcing=False,
                )
            )
            if need_grace:
                return _start_grace(conn, name)
            recovery = _settle_grace(conn)
            if recovery:
                conn.execute(update(HEADS).where(HEADS.c.name == name).values(enforcing=True))
            return recovery

        self.recovery = self.catalog.run(work, tracked=True)
        DELEGATION_MOVES[0] += 1
        self.need = need_grace
        if need_grace:
            log.info("head %s: cluster-wide grace period, recovery epoch %d", name, self.recovery)

    def beat(self) -> bool:
        """Raise this head's counter and read the grace period (ending it when nobody needs
        it); False when this head's row is gone (declared dead)."""
        name, instance = self.name, self.instance

        def work(conn):
            alive = conn.execute(
                update(HEADS)
                .where(HEADS.c.name == name, HEADS.c.instance == instance)
                .values(beat=HEADS.c.beat + 1)
            ).rowcount
            recovery = _settle_grace(conn)
            if alive and bool(recovery) != bool(self.recovery):
                conn.execute(
                    update(HEADS).where(HEADS.c.name == name).values(enforcing=bool(recovery))
                )
            return bool(alive), recovery

        # published: other heads' namespace caches keep their entries (on PostgreSQL this
        # unsignalled table moves no other head's epoch: nothing to publish)
        alive, recovery = self.catalog.run(work, tracked=True, published=self.catalog.is_sqlite)
        if bool(recovery) != bool(self.recovery):
            log.info("head %s: cluster-wide grace period %s", name, "on" if recovery else "over")
        self.recovery = recovery
        return alive

    def lift(self) -> None:
        """This head's clients have reclaimed (or its grace time is over): NEED cleared, and
        the grace period ends if no other head needs it."""
        name = self.name

        def work(conn):
            conn.execute(update(HEADS).where(HEADS.c.name == name).values(need_grace=False))
            return _settle_grace(conn)

        self.recovery = self.catalog.run(work, tracked=True, published=self.catalog.is_sqlite)
        self.need = False

    def observe(self, rows) -> list[tuple[str, str, int]]:
        """Note the other heads' counters (rows of nfs_heads); (name, instance, beat) of those
        whose counter stood still for a lease."""
        now = time.monotonic()
        dead = []
        present = set()
        for row in rows:
            if row.name == self.name:
                continue
            present.add(row.name)
            last = self.seen.get(row.name)
            if last is None or last[0] != row.instance or last[1] != row.beat:
                self.seen[row.name] = (row.instance, row.beat, now)
            elif now - last[2] > self.lease_seconds:
                dead.append((row.name, row.instance, row.beat))
        for gone in set(self.seen) - present:
            del self.seen[gone]
        return dead

    def _expire(self, conn, dead: tuple[str, str, int], adopt: bool) -> Takeover | None:
        """In a transaction: a dead head's row and holdings go, if its counter is still the one
        watched (it did not come back meanwhile). ``adopt``: its client records that held
        state and its NLM hosts become this head's, and the grace period starts for them.
        None when it was not expired."""
        name, instance, beat = dead
        address = conn.execute(
            select(HEADS.c.address).where(
                HEADS.c.name == name, HEADS.c.instance == instance, HEADS.c.beat == beat
            )
        ).scalar()
        gone = conn.execute(
            delete(HEADS).where(
                HEADS.c.name == name, HEADS.c.instance == instance, HEADS.c.beat == beat
            )
        ).rowcount
        if not gone:
            return None
        conn.execute(
            delete(HOLDINGS).where(HOLDINGS.c.head == name, HOLDINGS.c.instance == instance)
        )
        taken = Takeover(name, nsm_name=address or "")
        if adopt:
            taken.clients = self._take_clients(conn, name)
            taken.nlm_hosts = self._take_nlm_hosts(conn, name)
        taken.delegations = self._take_delegations(conn, name, adopt and bool(taken.clients))
        # recalls other heads asked of it: they ask this head next, if its rows are taken
        prefix = f"{RECALL_PREFIX}{name}_"
        asked = conn.execute(
            select(SETTINGS.c.key).where(SETTINGS.c.key.like(prefix + "%"))
        ).scalars()
        stale = [key for key in asked if key.startswith(prefix)]
        if stale:
            conn.execute(delete(SETTINGS).where(SETTINGS.c.key.in_(stale)))
        conn.execute(delete(CLIENTS).where(CLIENTS.c.head == name))
        conn.execute(delete(SETTINGS).where(SETTINGS.c.key == nsm_hosts_key(name)))
        # its sessions' rows (appliance.nfs.state.sessions): nobody restores them any more
        conn.execute(
            delete(SETTINGS).where(
                SETTINGS.c.key.like("nfs_session_%"),
                SETTINGS.c.value.like(f'%"head": "{name}"%'),
            )
        )
        if taken.clients or taken.nlm_hosts:
            self.recovery = _start_grace(conn, self.name)
        else:
            self.recovery = _settle_grace(conn)
        return taken

    def _take_clients(self, conn, dead: str) -> list[tuple[bytes, str | None]]:
        """The dead head's client records that held state become this head's."""
        mine = {
            bytes(o)
            for o in conn.execute(select(CLIENTS.c.owner).where(CLIENTS.c.head == self.name))
            .scalars()
            .all()
        }
        rows = conn.execute(
            select(CLIENTS.c.clientid, CLIENTS.c.owner, CLIENTS.c.principal).where(
                CLIENTS.c.head == dead,
                CLIENTS.c.held_state.is_(True),
                CLIENTS.c.confirmed.is_(True),
            )
        ).all()
        adopted = []
        for row in rows:
            owner = bytes(row.owner)
            if owner in mine:  # the client has a record here too: it now holds state
                conn.execute(
                    update(CLIENTS)
                    .where(CLIENTS.c.owner == owner, CLIENTS.c.head == self.name)
                    .values(held_state=True)
                )
            else:
                conn.execute(
                    update(CLIENTS).where(CLIENTS.c.clientid == row.clientid).values(head=self.name)
                )
            adopted.append((owner, row.principal))
        return adopted

    def _take_delegations(self, conn, dead: str, adopt: bool) -> dict:
        """In a transaction: the dead head's delegation rows become this head's (under a key of
        its own, so that the dead head's instance, should it come back, drops none of them)
        when its clients are taken (``adopt``); they go otherwise."""
        rows = conn.execute(
            select(SETTINGS.c.key, SETTINGS.c.value).where(SETTINGS.c.key.like(DELEG_PREFIX + "%"))
        ).all()
        taken: dict = {}
        for row in rows:
            try:
                rec = json.loads(row.value)
                if not row.key.startswith(DELEG_PREFIX) or rec.get("head") != dead:
                    continue
                ino = int(row.key[len(DELEG_PREFIX) :].split("_")[0])
                owner, kind = str(rec["owner"]), str(rec["type"])
            except (ValueError, AttributeError, KeyError, TypeError):
                continue
            conn.execute(delete(SETTINGS).where(SETTINGS.c.key == row.key))
            if adopt:
                key = f"{row.key}_{self.name}"
                rec["head"] = self.name
                conn.execute(SETTINGS.insert().values(key=key, value=json.dumps(rec)))
                taken[(owner, ino)] = (key, kind)
        return taken

    def _take_nlm_hosts(self, conn, dead: str) -> dict[str, str]:
        """The NLM hosts the dead head monitored join this head's list (they are told to
        reclaim through it)."""

        def hosts(key: str) -> dict[str, str]:
            raw = conn.execute(select(SETTINGS.c.value).where(SETTINGS.c.key == key)).scalar()
            try:
                return {str(k): str(v) for k, v in json.loads(raw).items()} if raw else {}
            except (ValueError, AttributeError):
                return {}

        theirs = hosts(nsm_hosts_key(dead))
        if theirs:
            mine_key = nsm_hosts_key(self.name)
            merged = {**theirs, **hosts(mine_key)}
            conn.execute(delete(SETTINGS).where(SETTINGS.c.key == mine_key))
            conn.execute(
                SETTINGS.insert().values(key=mine_key, value=json.dumps(merged, sort_keys=True))
            )
        return theirs

    def expire_dead(self, adopt: bool) -> list[Takeover]:
        """Housekeeping: watch the other heads, expire those dead (``adopt``: taking their
        clients and NLM hosts, see ``_expire``); what was taken from each."""
        rows = self.catalog.read(lambda conn: conn.execute(select(HEADS)).all())
        taken: list[Takeover] = []
        found = self.observe(rows)
        if found and self.takes_over is not None and not self.takes_over():
            return taken  # still watched: expired at once if this head takes the address
        for dead in found:
            takeover = self.catalog.run(
                lambda conn, d=dead: self._expire(conn, d, adopt), tracked=True
            )
            DELEGATION_MOVES[0] += 1
            if takeover is not None:
                log.warning(
                    "head %s (instance %s) silent for %.0f s: its NFS state is released, %d "
                    "clients and %d NLM hosts may reclaim through this head",
                    dead[0],
                    dead[1],
                    self.lease_seconds,
                    len(takeover.clients),
                    len(takeover.nlm_hosts),
                )
                if takeover.clients or takeover.nlm_hosts:
                    self.need = True
                taken.append(takeover)
            self.seen.pop(dead[0], None)
        return taken

    def holdings_of_live(self, conn, ino: int) -> list[Holding]:
        """In a transaction: the other heads' holdings of ``ino`` (of the instances that still
        have a row: a dead head's stay until the heartbeat expires it, as a lock of a client
        whose lease ran out stays until its head expires it)."""
        return [Holding(*row) for row in sql_all(conn, _HOLDINGS_OF_LIVE_SQL, (ino, self.name))]
