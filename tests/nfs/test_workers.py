"""NfsWorkers.call_soon: the event loop's hand-off of a COMPOUND to a worker thread."""

from __future__ import annotations

import threading

import pytest

from appliance.nfs.server import NfsWorkers


def test_a_failing_call_is_logged_and_the_worker_goes_on(caplog):
    pool = NfsWorkers(1, thread_name_prefix="test-worker")
    done = threading.Event()
    try:
        pool.call_soon(lambda: 1 / 0)
        pool.call_soon(done.set)
        assert done.wait(10), "the one worker died with the first call's error"
    finally:
        pool.shutdown(wait=True)
    assert "unexpected error in an NFS worker" in caplog.text


def test_no_call_after_shutdown_and_queued_ones_are_dropped():
    pool = NfsWorkers(1, thread_name_prefix="test-worker")
    hold, ran = threading.Event(), []
    pool.call_soon(hold.wait, 10)
    pool.call_soon(ran.append, "queued")  # waits behind the first, then is cancelled
    stopper = threading.Thread(target=lambda: pool.shutdown(wait=True, cancel_futures=True))
    stopper.start()
    with pytest.raises(RuntimeError):
        for _ in range(1000):  # shutdown is under way in the other thread
            pool.call_soon(ran.append, "late")
            threading.Event().wait(0.01)
    hold.set()
    stopper.join(10)
    assert "late" not in ran and "queued" not in ran
