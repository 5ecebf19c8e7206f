"""Locks with a rank: the one order in which the engine's locks may be taken.

``RANKS`` is that order (docs/ARCHITECTURE.md, "Locks", has the same table with what each lock
guards). A thread may only take a lock of a higher rank than every lock it holds. With checking
off (the default) the factories return plain ``threading`` objects, so a production lock costs
nothing extra. With checking on (``SHINGLE_CHECK_LOCK_ORDER=1`` in the environment, or
``enable()`` before the locks are made: tests/conftest.py does it), each lock records per
thread what is held and a blocking acquire out of order raises ``LockOrderError``: a deadlock
that might happen once a month shows up in every test run that takes the two locks that way.
Non-blocking acquires are not checked (a try-lock cannot deadlock)."""

from __future__ import annotations

import os
import threading
from typing import cast

# name -> rank; lower ranks are taken first (outermost)
RANKS: dict[str, int] = {
    "snapshot_schedules.run": 9,
    "retention.run": 10,
    "lifecycle.tiering": 11,
    "lifecycle.media": 12,
    "datapath.dispatch": 14,
    "datapath.commit": 16,
    "datapath.file": 20,
    "datapath.inline_budget": 22,
    "datapath.seq": 24,
    "datapath.file_inflight": 26,
    "datapath.dispatch_queue": 28,
    "datapath.commit_queue": 30,
    "datapath.drive_watch": 34,
    "datapath.space": 40,
    "datapath.reserve": 42,
    "lifecycle.media_closed": 44,
    "datapath.files": 50,
    "datapath.maps": 52,
    "agent.drive": 58,
    "datapath.reader_cache": 60,
    "datapath.ticket": 62,
    "lifecycle.read_tracker": 70,
    "lifecycle.rate_limiter": 71,
    "lifecycle.media_shared": 72,
    "lifecycle.stripe_pool": 73,
    "erasure.library": 75,
    "erasure.headers": 76,
    "drives.zone_file": 80,
    "drives.zoned_block": 81,
    "drives.remote": 82,
    "drives.remote_connection": 83,
    "drives.remote_send": 84,
    "drives.smr_model": 85,
    "quotas.tracker": 86,
    "namespace.ancestry": 87,
    "namespace.cache": 88,
    "catalog.changes": 89,
    "catalog.watch": 90,
    "catalog.wal_index": 91,
    "catalog.tracked": 92,
    "catalog.checkpoint": 93,
    "catalog.writer_queue": 95,
    "catalog.idle_connections": 96,
    "namespace.open_refs": 97,
    "log.rate_limit": 98,
}

_checking = os.environ.get("SHINGLE_CHECK_LOCK_ORDER", "") not in ("", "0")
_held = threading.local()  # .locks: list of CheckedLock held by this thread, in acquire order


class LockOrderError(RuntimeError):
    pass


def enable(on: bool = True) -> None:
    """Check the order of locks made from now on (tests); locks made before stay as they are."""
    global _checking
    _checking = on


def checking() -> bool:
    return _checking


def lock(name: str) -> threading.Lock | CheckedLock:
    """A mutex of rank ``RANKS[name]``."""
    rank = RANKS[name]
    return (
        CheckedLock(name, rank, threading.Lock(), reentrant=False)
        if _checking
        else threading.Lock()
    )


def rlock(name: str) -> threading.RLock | CheckedLock:
    """A re-entrant mutex of rank ``RANKS[name]`` (taking it again while held is no order error)."""
    rank = RANKS[name]
    return (
        CheckedLock(name, rank, threading.RLock(), reentrant=True)
        if _checking
        else threading.RLock()
    )


def condition(name: str) -> threading.Condition:
    """A condition variable over a (non-re-entrant) mutex of rank ``RANKS[name]``."""
    # CheckedLock has the acquire/release/locked Condition uses
    return threading.Condition(cast(threading.Lock, lock(name)))


def _stack() -> list:
    stack = getattr(_held, "locks", None)
    if stack is None:
        stack = _held.locks = []
    return stack


class CheckedLock:
    """A lock that refuses a blocking acquire below or at the rank of a lock its thread holds."""

    __slots__ = ("name", "rank", "inner", "reentrant", "owner", "depth")

    def __init__(self, name: str, rank: int, inner, *, reentrant: bool):
        self.name = name
        self.rank = rank
        self.inner = inner
        self.reentrant = reentrant
        self.owner: int | None = None
        self.depth = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        me = threading.get_ident()
        if self.reentrant and self.owner == me:
            self.inner.acquire()
            self.depth += 1
            return True
        stack = _stack()
        if blocking and stack:
            if any(held is self for held in stack):
                raise LockOrderError(f"{self.name} taken again by the thread that holds it")
            top = max(stack, key=lambda held: held.rank)
            if top.rank >= self.rank:
                raise LockOrderError(
                    f"{self.name} (rank {self.rank}) taken while holding {top.name} "
                    f"(rank {top.rank}): expected ranks to increase "
                    "(engine/base/ordered_lock.py RANKS)"
                )
        got = self.inner.acquire(blocking, timeout)
        if got:
            self.owner = me
            self.depth = 1
            stack.append(self)
        return got

    def release(self) -> None:
        if self.reentrant and self.depth > 1:
            self.depth -= 1
            self.inner.release()
            return
        self.owner = None
        self.depth = 0
        stack = _stack()
        for i in range(len(stack) - 1, -1, -1):
            if stack[i] is self:
                del stack[i]
                break
        self.inner.release()

    def locked(self) -> bool:
        return self.owner is not None

    def _is_owned(self) -> bool:  # threading.Condition asks this of its lock
        return self.owner == threading.get_ident()

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"<CheckedLock {self.name} rank {self.rank}>"
