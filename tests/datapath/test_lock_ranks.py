"""The lock order check (engine/base/ordered_lock.py) is on in the tests: two ranked locks taken
out of order raise at once, in the thread that does it, instead of deadlocking one day."""

from __future__ import annotations

import threading

import pytest

from engine.base import errors, ordered_lock
from engine.base.ordered_lock import LockOrderError


def test_the_check_is_on_for_the_test_suite(sqlite_engine):
    assert ordered_lock.checking()
    assert isinstance(sqlite_engine.data.space.lock, ordered_lock.CheckedLock)


def test_taking_two_locks_out_of_order_raises():
    space, files = ordered_lock.rlock("datapath.space"), ordered_lock.lock("datapath.files")
    with space, files:  # in RANKS order
        pass
    with files:
        with pytest.raises(LockOrderError, match="datapath.space .* while holding datapath.files"):
            space.acquire()
    assert space.acquire(blocking=False)  # a try-lock cannot deadlock: not refused
    space.release()


def test_the_data_path_space_lock_after_a_file_lock_of_the_data_path_is_refused(sqlite_engine):
    """The order the engine's own objects use: a zone transaction under the space lock must
    not then wait for a file's buffer (the namespace's release does it the other way round)."""
    from engine.namespace import ROOT

    ns, dp = sqlite_engine.ns, sqlite_engine.data
    ino = ns.create(ROOT, ns.root_ino, "f").ino
    ns.write(ino, 0, b"x" * 1000)
    fb = dp.buffers.files[ino]
    with dp.space.lock:
        with pytest.raises(LockOrderError):
            fb.lock.acquire()
    ns.commit(ino)


def test_re_entering_a_plain_lock_raises_instead_of_hanging():
    files = ordered_lock.lock("datapath.files")
    with files:
        with pytest.raises(LockOrderError, match="taken again"):
            files.acquire()


def test_a_re_entrant_lock_may_be_taken_again_and_conditions_wait():
    space = ordered_lock.rlock("datapath.space")
    with space, space:
        pass
    cv, woken = ordered_lock.condition("datapath.commit_queue"), []

    def waiter():
        with cv:
            cv.wait_for(lambda: woken, timeout=10)

    t = threading.Thread(target=waiter)
    t.start()
    with cv:
        woken.append(True)
        cv.notify_all()
    t.join(10)
    assert not t.is_alive()


def test_off_the_factories_return_plain_threading_locks():
    ordered_lock.enable(False)
    try:
        assert type(ordered_lock.lock("datapath.files")) is type(threading.Lock())
        assert type(ordered_lock.rlock("datapath.space")) is type(threading.RLock())
    finally:
        ordered_lock.enable(True)


def test_every_rank_is_in_the_architecture_table():
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "docs" / "ARCHITECTURE.md").read_text()
    missing = [name for name in ordered_lock.RANKS if f"`{name}`" not in doc]
    assert not missing, f"docs/ARCHITECTURE.md's lock table lacks {missing}"


def test_the_namespace_locks_are_ranked_and_taken_in_order(sqlite_engine):
    """The namespace's cache and ancestry locks are taken by change listeners, also under the
    data path's commit lock; its open references inside namespace transactions."""
    from engine.namespace import ROOT

    ns = sqlite_engine.ns
    for held in (ns.cache.lock, ns.ancestry.lock, ns.open_refs.lock):
        assert isinstance(held, ordered_lock.CheckedLock)
    top = ns.mkdir(ROOT, ns.root_ino, "top")
    ino = ns.create(ROOT, top.ino, "f").ino
    assert ns.is_inside(top.ino, ns.getattr(ino))
    ns.open_ref(ino)
    ns.write(ino, 0, b"x" * 1000)
    ns.commit(ino)  # the commit listener caches the new size: under datapath.commit
    assert ns.getattr(ino).size == 1000
    ns.rename(ROOT, top.ino, "f", ns.root_ino, "f")  # the ancestry listener forgets
    assert not ns.is_inside(top.ino, ns.getattr(ino))
    ns.unlink(ROOT, ns.root_ino, "f")  # open: kept until the last close
    assert ns.read(ino, 0, 10) == b"x" * 10
    ns.close_ref(ino)
    with pytest.raises(errors.StaleHandle):
        ns.getattr(ino)
