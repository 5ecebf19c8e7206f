"""A flush places its own stripe (it wakes no dispatcher thread), so whoever holds the dispatch lock
must look at the queue again after letting go: a stripe queued just before that is not stranded."""

from __future__ import annotations

import threading
import time

from engine.namespace import ROOT


class HookedLock:
    """The dispatch lock, with a hook run by its holder just before it lets go."""

    def __init__(self):
        self.lock = threading.Lock()
        self.before_release = None
        self.refused = 0  # non-blocking acquires that found it held

    def acquire(self, blocking=True):
        got = self.lock.acquire(blocking)
        if not got:
            self.refused += 1
        return got

    def release(self):
        hook, self.before_release = self.before_release, None
        if hook is not None:
            hook()
        self.lock.release()


def test_a_stripe_queued_while_the_lock_is_being_let_go_is_still_placed(sqlite_engine):
    ns, dp = sqlite_engine.ns, sqlite_engine.data
    first = ns.create(ROOT, ns.root_ino, "first").ino
    second = ns.create(ROOT, ns.root_ino, "second").ino
    ns.write(first, 0, b"1" * 200_000)
    ns.write(second, 0, b"2" * 200_000)
    lock = HookedLock()
    dp.dispatcher.lock = lock
    flushed = threading.Event()
    other = threading.Thread(target=lambda: (ns.commit(second), flushed.set()))

    def queue_the_second_flush():  # runs after the holder's last look at the queue
        other.start()
        deadline = time.monotonic() + 10
        while lock.refused == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert lock.refused == 1, "the second flush found the lock held and left its stripe"

    lock.before_release = queue_the_second_flush
    try:
        ns.commit(first)
        assert flushed.wait(10), "the second flush's stripe was never placed"
    finally:
        if not flushed.is_set():
            dp.dispatcher.dispatch_ready(
                blocking=True
            )  # let the stuck flush finish before the engine closes
        other.join(10)
    assert ns.read(second, 0, 200_000) == b"2" * 200_000
    assert ns.read(first, 0, 200_000) == b"1" * 200_000
