"""NfsWorkers: the event loop's hand-off of a COMPOUND to a worker thread (call_soon), submit, the
worker idle last taking the next call."""

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


def test_idle_while_no_handed_over_call_is_queued_or_running():
    pool = NfsWorkers(1, thread_name_prefix="test-worker")
    hold, done = threading.Event(), threading.Event()
    try:
        assert pool.idle()
        pool.call_soon(hold.wait, 10)
        pool.call_soon(lambda: 1 / 0)  # a failing call counts as done too
        pool.call_soon(done.set)
        assert not pool.idle()
        hold.set()
        assert done.wait(10)
        for _ in range(1000):  # done.set() returned; the call's bookkeeping follows it
            if pool.idle():
                break
            threading.Event().wait(0.01)
        assert pool.idle()
    finally:
        pool.shutdown(wait=True)


def test_a_call_goes_to_the_worker_idle_last():
    """Waking a thread idle for long costs several times what waking a warm one does: the pool
    hands each call to the worker that finished last, so one client's calls stay on one thread."""
    pool = NfsWorkers(3, thread_name_prefix="test-worker")
    try:
        releases = [threading.Event() for _ in range(3)]
        started = threading.Barrier(4)

        def hold(release):
            started.wait(10)
            release.wait(10)
            return threading.current_thread().name

        held = [pool.submit(hold, release) for release in releases]
        started.wait(10)  # three threads, each holding a call
        for release, future in zip(releases, held, strict=True):
            release.set()
            future.result(10)
            threading.Event().wait(0.05)  # the worker is back among the idle ones
        last = held[-1].result()

        def note(names, ran):
            names.append(threading.current_thread().name)
            ran.set()

        for _ in range(5):
            names: list[str] = []
            ran = threading.Event()
            pool.call_soon(note, names, ran)
            assert ran.wait(10)
            assert names == [last]
            threading.Event().wait(0.02)
        assert pool.submit(threading.current_thread).result(10).name == last
    finally:
        pool.shutdown(wait=True)


def test_calls_wait_for_a_worker_when_every_one_is_busy_and_run_in_order():
    pool = NfsWorkers(2, thread_name_prefix="test-worker")
    release, ran = threading.Event(), []
    try:
        busy = [pool.submit(release.wait, 10) for _ in range(2)]
        for i in range(20):
            pool.call_soon(ran.append, i)
        assert not ran and not pool.idle()
        release.set()
        assert all(future.result(10) for future in busy)
        done = threading.Event()
        pool.call_soon(done.set)
        assert done.wait(10)
        assert sorted(ran) == list(range(20))
    finally:
        pool.shutdown(wait=True)


def test_a_big_write_goes_to_a_worker_while_another_call_is_there(server):
    """The event loop takes an UNSTABLE WRITE itself only while the workers have nothing of
    its (with several writers, they copy the data while the loop reads the sockets)."""
    from nfs4_rawclient import RawClient, stateid

    from appliance.nfs.v4 import const as c
    from appliance.nfs.v4 import types as t

    raw = RawClient(server.port).setup()
    fh, sid = raw.open_new("f", b"writer")
    write = (
        c.OP_WRITE,
        t.ARGS[c.OP_WRITE](stateid(sid.seqid, sid.other), 0, c.UNSTABLE4, b"x" * 65536),
    )
    nfs = server.server
    getattr_size = (c.OP_GETATTR, [1 << c.FATTR4_SIZE])
    assert raw.session([(c.OP_PUTFH, fh), getattr_size])[0] == 0  # its attributes are cached
    before = nfs.counters.snapshot()["nfs_compounds_from_cache"]
    assert raw.session([(c.OP_PUTFH, fh), write])[0] == 0
    assert nfs.counters.snapshot()["nfs_compounds_from_cache"] == before + 1
    hold = threading.Event()
    nfs.pool.call_soon(hold.wait, 10)
    try:
        assert raw.session([(c.OP_PUTFH, fh), write])[0] == 0  # the second worker wrote it
        assert nfs.counters.snapshot()["nfs_compounds_from_cache"] == before + 1
    finally:
        hold.set()
    raw.close()
