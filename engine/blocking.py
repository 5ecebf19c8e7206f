"""Refusing to block: for callers that must not wait on disk or the catalog.

The NFS event loop first tries a COMPOUND of read-only operations from the
in-memory caches (appliance/nfs/v4/compound.py). Inside ``no_blocking()``, every
call that would wait (a catalog transaction, a lock held across one, a
statfs, a fragment read from a drive) raises ``WouldBlock`` instead, and the
loop hands the call to a worker thread, as it does every other call."""

from __future__ import annotations

import threading
from contextlib import contextmanager

_state = threading.local()


class WouldBlock(BaseException):
    """The work needs to wait. A BaseException so that no ``except Exception`` on the way turns
    it into an error reply: it must reach the caller that forbade blocking."""


@contextmanager
def no_blocking():
    """Within this block (in this thread), ``may_block`` raises WouldBlock."""
    previous = getattr(_state, "forbidden", False)
    _state.forbidden = True
    try:
        yield
    finally:
        _state.forbidden = previous


def may_block(what: str) -> None:
    """Call before anything that can wait; raises WouldBlock inside ``no_blocking()``."""
    if blocking_forbidden():
        raise WouldBlock(what)


def blocking_forbidden() -> bool:
    return getattr(_state, "forbidden", False)


@contextmanager
def holding(lock, what: str):
    """``with lock``, except that inside ``no_blocking()`` a lock someone holds raises WouldBlock
    (its holder may be in the middle of catalog work)."""
    if not lock.acquire(blocking=not blocking_forbidden()):
        raise WouldBlock(what)
    try:
        yield
    finally:
        lock.release()
