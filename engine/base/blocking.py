"""Refusing to block: for callers that must not wait on disk or the catalog.

The NFS event loop first tries a COMPOUND of read-only operations from the
in-memory caches (appliance/nfs/v4/compound.py). Inside ``no_blocking()``, every
call that would wait (a catalog transaction, a lock held across one, a
statfs, a fragment read from a drive) raises ``WouldBlock`` instead, and the
loop hands the call to a worker thread, as it does every other call."""

from __future__ import annotations

import threading

_state = threading.local()


class WouldBlock(BaseException):
    """The work needs to wait. A BaseException so that no ``except Exception`` on the way turns
    it into an error reply: it must reach the caller that forbade blocking."""


class _NoBlocking:
    """The context of ``no_blocking()``: a class, not a generator (the event loop enters one per
    COMPOUND it tries; contextlib's costs several times as much)."""

    __slots__ = ("previous",)

    def __enter__(self) -> None:
        self.previous = getattr(_state, "forbidden", False)
        _state.forbidden = True

    def __exit__(self, *exc) -> None:
        _state.forbidden = self.previous


def no_blocking() -> _NoBlocking:
    """Within this block (in this thread), ``may_block`` raises WouldBlock."""
    return _NoBlocking()


def may_block(what: str) -> None:
    """Call before anything that can wait; raises WouldBlock inside ``no_blocking()``."""
    if blocking_forbidden():
        raise WouldBlock(what)


def blocking_forbidden() -> bool:
    return getattr(_state, "forbidden", False)


class holding:  # noqa: N801 - used as a function: ``with holding(lock, what):``
    """``with lock``, except that inside ``no_blocking()`` a lock someone holds raises WouldBlock
    (its holder may be in the middle of catalog work)."""

    __slots__ = ("lock", "what")

    def __init__(self, lock, what: str):
        self.lock, self.what = lock, what

    def __enter__(self) -> None:
        if not self.lock.acquire(blocking=not getattr(_state, "forbidden", False)):
            raise WouldBlock(self.what)

    def __exit__(self, *exc) -> None:
        self.lock.release()
