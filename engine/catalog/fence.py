"""The maintenance leader's fence: a deposed leader cannot commit.

etcd elects the leader (engine/cluster/leader.py), but a lease is a promise about time: a leader
paused or cut off from etcd may go on working after its lease has gone and another host has taken
office. So the catalog itself refuses such a leader's writes. The row ``leader_fence`` (id 1)
holds the token of the leader that took office last; a token is the leader key's etcd create
revision, which only grows from one leader to the next.

- ``advance(catalog, token, holder)``: a new leader raises the row to its token before it runs
  anything; a token below the row's is refused (that leader is already stale).
- ``Catalog.fenced(token, still_leader)`` (engine/catalog/database.py, which holds the check so
  that it imports nothing of this module): every write transaction run in that context first
  reads the row, in the same transaction, and fails with ``LeaderFenced`` unless it holds
  ``token``; before the commit it asks ``still_leader()`` (the local lease clock), so a leader
  that knows its lease is gone stops at once, and one that does not is stopped by the row.

Why the check cannot be raced: on PostgreSQL the row is read ``FOR SHARE`` as the transaction's
first statement, so the new leader's raise waits for a running leader transaction to end, and a
leader transaction whose snapshot predates a committed raise fails with a serialization error
(retried by ``Catalog.run``, it then reads the new token and fails for good). On SQLite every
write transaction holds the write lock from BEGIN IMMEDIATE, so the read is the latest row.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.engine import Connection

from engine.admin.events import record_in
from engine.catalog.database import LeaderFenced
from engine.catalog.models import LeaderFence

FENCE = LeaderFence.__table__
FENCE_ID = 1
__all__ = ["FenceState", "LeaderFenced", "advance", "current"]


@dataclass(frozen=True)
class FenceState:
    token: int
    holder: str
    since_ns: int

    def to_dict(self) -> dict:
        return {"token": self.token, "holder": self.holder, "since_ns": self.since_ns}


def current(catalog) -> FenceState | None:
    """The row as it stands (None in a catalog older than the fence's migration)."""
    row = catalog.read(
        lambda conn: conn.execute(
            select(FENCE.c.token, FENCE.c.holder, FENCE.c.since_ns).where(FENCE.c.id == FENCE_ID)
        ).first()
    )
    return None if row is None else FenceState(int(row.token), row.holder, int(row.since_ns))


def advance(catalog, token: int, holder: str) -> bool:
    """Raise the fence to ``token`` for ``holder`` taking office; False when the row already holds
    a higher token, or the same one for another holder (then this leader is stale: it must step
    down). Taking office again with the token it holds is allowed (a restart of the same term)."""
    if token <= 0:
        raise ValueError(f"fence token {token}: expected a positive etcd revision")

    def work(conn: Connection) -> bool:
        before = conn.execute(select(FENCE.c.holder).where(FENCE.c.id == FENCE_ID)).scalar()
        raised = conn.execute(
            FENCE.update()
            .where(FENCE.c.id == FENCE_ID, FENCE.c.token < token)
            .values(token=token, holder=holder, since_ns=time.time_ns())
        ).rowcount
        if raised:
            record_in(
                conn,
                "cluster.leader",
                f"{holder} took office as the maintenance leader (token {token}"
                + (f"; after {before})" if before else ")"),
                actor=holder[:64],
                details={"token": token, "holder": holder, "previous": before or None},
            )
            return True
        row = conn.execute(
            select(FENCE.c.token, FENCE.c.holder).where(FENCE.c.id == FENCE_ID)
        ).first()
        if row is None:
            raise RuntimeError("the catalog has no leader_fence row: run `shingle upgrade`")
        return int(row.token) == token and row.holder == holder

    return catalog.run(work, tracked=True)  # the fence is cached nowhere
