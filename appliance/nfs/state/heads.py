"""The heads over one catalog (docs/nfs-state.md): each live head has a row in nfs_heads
that it beats (a counter raised every ``lease / 6``); the others watch the counter with their
own monotonic clocks, so no two hosts' clocks are compared. A head whose counter stood still
for a lease is dead: the first head to see it deletes its row and its holdings in one
transaction that also checks the counter has not moved (compare and delete, no consensus).
A head that finds its own row gone was declared dead while it could not beat (a catalog
outage, a stopped process): its state may have been granted to others meanwhile, so it drops
every client's state (they reclaim or start over) and joins again as a new instance."""

from __future__ import annotations

import logging
import os
import time

from sqlalchemy import and_, delete, select, update

from engine.catalog.models import NfsHead, NfsHolding

log = logging.getLogger("shingle.nfs.state")

HEADS = NfsHead.__table__
HOLDINGS = NfsHolding.__table__


def head_name(index: int) -> str:
    return f"head{index}"


class HeadRegistry:
    def __init__(self, catalog, name: str, lease_seconds: float):
        self.catalog = catalog
        self.name = name
        self.lease_seconds = lease_seconds
        self.instance = os.urandom(8).hex()
        # other heads as last seen: name -> (instance, beat, monotonic time the beat moved)
        self.seen: dict[str, tuple[str, int, float]] = {}

    @property
    def beat_period(self) -> float:
        return max(0.2, self.lease_seconds / 6)

    def join(self, address: str = "") -> None:
        """At start: this name's earlier instance is dead (it is us), its holdings go; the row
        now names this instance."""
        name, instance = self.name, self.instance

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

        self.catalog.run(work, tracked=True)

    def leave(self) -> None:
        """A clean stop: this head's row and holdings go (its clients' state goes with it)."""
        name, instance = self.name, self.instance

        def work(conn):
            conn.execute(
                delete(HOLDINGS).where(HOLDINGS.c.head == name, HOLDINGS.c.instance == instance)
            )
            conn.execute(delete(HEADS).where(HEADS.c.name == name, HEADS.c.instance == instance))

        self.catalog.run(work, tracked=True)

    def beat(self) -> bool:
        """Raise this head's counter; False when its row is gone (declared dead)."""
        name, instance = self.name, self.instance
        rows = self.catalog.run(
            lambda conn: (
                conn.execute(
                    update(HEADS)
                    .where(HEADS.c.name == name, HEADS.c.instance == instance)
                    .values(beat=HEADS.c.beat + 1)
                ).rowcount
            ),
            tracked=True,
        )
        return bool(rows)

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

    def stale(self, name: str, instance: str, beat: int) -> bool:
        """Whether this head has watched ``name``'s ``instance`` stand still at ``beat`` (its
        counter in the catalog now) for a lease."""
        last = self.seen.get(name)
        return (
            last is not None
            and last[:2] == (instance, beat)
            and time.monotonic() - last[2] > self.lease_seconds
        )

    @staticmethod
    def expire(conn, name: str, instance: str, beat: int) -> bool:
        """In a transaction: a dead head's row and holdings go, if its counter is still
        ``beat`` (it did not come back meanwhile); True when they went."""
        gone = conn.execute(
            delete(HEADS).where(
                HEADS.c.name == name, HEADS.c.instance == instance, HEADS.c.beat == beat
            )
        ).rowcount
        if gone:
            conn.execute(
                delete(HOLDINGS).where(HOLDINGS.c.head == name, HOLDINGS.c.instance == instance)
            )
        return bool(gone)

    def expire_dead(self) -> list[str]:
        """Housekeeping: watch the other heads, expire those dead; the names expired."""
        rows = self.catalog.read(lambda conn: conn.execute(select(HEADS)).all())
        dead = self.observe(rows)
        expired = []
        for name, instance, beat in dead:
            if self.catalog.run(
                lambda conn, n=name, i=instance, b=beat: self.expire(conn, n, i, b),
                tracked=True,
            ):
                log.warning(
                    "head %s (instance %s) silent for %.0f s: its NFS state is released",
                    name,
                    instance,
                    self.lease_seconds,
                )
                expired.append(name)
            self.seen.pop(name, None)
        return expired

    def last_beat(self, name: str) -> int | None:
        """The counter of ``name`` as last seen (tests)."""
        last = self.seen.get(name)
        return None if last is None else last[1]

    def holdings_of_live(self, conn, ino: int):
        """In a transaction: the other heads' holdings of ``ino``, of the instances that still
        have a row; those of a head this one saw dead are expired here first."""
        rows = conn.execute(
            select(
                HOLDINGS.c.head,
                HOLDINGS.c.instance,
                HOLDINGS.c.access,
                HOLDINGS.c.deny,
                HOLDINGS.c.locks,
                HEADS.c.beat,
            )
            .select_from(
                HOLDINGS.join(
                    HEADS,
                    and_(HEADS.c.name == HOLDINGS.c.head, HEADS.c.instance == HOLDINGS.c.instance),
                )
            )
            .where(HOLDINGS.c.ino == ino, HOLDINGS.c.head != self.name)
        ).all()
        live = []
        for row in rows:
            if self.stale(row.head, row.instance, row.beat) and self.expire(
                conn, row.head, row.instance, row.beat
            ):
                continue
            live.append(row)
        return live
