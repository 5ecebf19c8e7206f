"""This process's SQLite writers take turns first come, first served, and checkpoints run outside
the turn: a writer never waits in SQLite's busy handler behind a stream of short transactions."""

from __future__ import annotations

import os
import struct
import threading
import time

import pytest

from engine.catalog import database, epoch
from engine.catalog.database import CatalogUnavailable, sql


def _note(conn, i):
    sql(conn, "INSERT INTO settings (key, value) VALUES (?, ?)", (f"n{i}", "x" * 100)).close()


def test_a_writer_gets_its_turn_between_another_threads_transactions(sqlite_catalog):
    catalog = sqlite_catalog
    stop = threading.Event()
    streamed = []

    def stream():  # back-to-back write transactions of 10 ms each, like a remove freeing chunks
        i = 0
        while not stop.is_set():
            i += 1

            def work(conn, i=i):
                _note(conn, f"s{i}")
                time.sleep(0.01)

            catalog.run(work)
            streamed.append(i)

    thread = threading.Thread(target=stream)
    thread.start()
    try:
        time.sleep(0.05)
        passed_by = []
        for i in range(10):
            before = len(streamed)
            catalog.run(lambda conn, i=i: _note(conn, f"w{i}"))
            passed_by.append(len(streamed) - before)
    finally:
        stop.set()
        thread.join()
    assert len(streamed) > 10, "the stream kept writing meanwhile"
    # counted in the stream's transactions, not in seconds (a loaded machine stretches those):
    # first come, first served means at most the one in progress and one that queued just
    # before us finish while we wait; SQLite's busy handler, polling at 1, 3, 8, 18, 33, ... ms,
    # mostly found the stream's next transaction already begun, so it let several pass
    assert max(passed_by) <= 2, f"stream transactions that went first: {passed_by}"


def test_the_wal_is_checkpointed_outside_the_writers_turn(sqlite_catalog):
    catalog = sqlite_catalog
    catalog.epoch()  # maps the WAL index
    index = catalog.epochs.wal_index
    assert index is not None
    for i in range(3 * database.CHECKPOINT_FRAMES):
        catalog.run(lambda conn, i=i: _note(conn, i))
    frames = struct.unpack_from("=I", index, epoch.WAL_INDEX_FRAMES)[0]
    # each commit adds a frame or two; without our checkpoints (SQLite's are off) it passes 3,000
    assert frames < database.CHECKPOINT_FRAMES + 50, f"{frames} frames in the WAL"
    wal = catalog.engine.url.database + "-wal"
    assert os.path.getsize(wal) < 2 * database.CHECKPOINT_FRAMES * 4200


def test_a_writer_held_up_past_the_deadline_gets_a_clear_error(sqlite_catalog, monkeypatch):
    catalog = sqlite_catalog
    monkeypatch.setattr(database, "RETRY_DEADLINE_S", 0.2)
    holding, release = threading.Event(), threading.Event()

    def hold(conn):
        _note(conn, "held")
        holding.set()
        release.wait(5)

    thread = threading.Thread(target=lambda: catalog.run(hold))
    thread.start()
    try:
        assert holding.wait(5)
        with pytest.raises(CatalogUnavailable, match="busy"):
            catalog.run(lambda conn: _note(conn, "late"))
    finally:
        release.set()
        thread.join()
    catalog.run(lambda conn: _note(conn, "after"))  # the turn was given back: writing works again
