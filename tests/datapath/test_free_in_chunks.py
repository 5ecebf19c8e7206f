"""Removing a big file frees its extents a chunk per transaction, so the catalog's write lock is
never held for the whole file (a 100 GB checkpoint written in 1 MiB commits has 100,000 extents)."""

from __future__ import annotations

import logging

import pytest
from dphelpers import KiB, check_accounting
from sqlalchemy import event, text

from engine import namespace
from engine.admin import fsck
from engine.base import errors
from engine.namespace import ROOT

CHUNK = 8


def pieces(ns, ino, count):
    """``count`` separately flushed writes: one stripe and one extent each (the
    holes keep them apart)."""
    for i in range(count):
        size = 4 * KiB if i % 2 else 96 * KiB  # inline stripes and stripes on drives
        ns.write(ino, i * 128 * KiB, bytes([i % 251 + 1]) * size, stable=True)


def extents_of(catalog, ino):
    return catalog.read(
        lambda conn: conn.execute(
            text("SELECT count(*) FROM extents WHERE ino = :i"), {"i": ino}
        ).scalar()
    )


def test_removing_a_big_file_frees_it_a_chunk_per_transaction(engine, monkeypatch):
    monkeypatch.setattr(namespace.transactions, "FREE_CHUNK_EXTENTS", CHUNK)
    ns, catalog = engine.ns, engine.catalog
    big = ns.create(ROOT, ns.root_ino, "big").ino
    small = ns.create(ROOT, ns.root_ino, "small").ino
    pieces(ns, big, 5 * CHUNK + 3)
    pieces(ns, small, CHUNK)
    assert extents_of(catalog, big) == 5 * CHUNK + 3
    left_at_commit = []

    def on_commit(conn):
        left_at_commit.append(
            conn.execute(text("SELECT count(*) FROM extents WHERE ino = :i"), {"i": big}).scalar()
        )

    event.listen(catalog.engine, "commit", on_commit)
    try:
        ns.unlink(ROOT, ns.root_ino, "big")
    finally:
        event.remove(catalog.engine, "commit", on_commit)
    # the unlink's own transaction removed the name and the first chunk; each later one a chunk
    assert left_at_commit == [5 * CHUNK + 3 - CHUNK * n for n in range(1, 6)] + [0]
    with_name = catalog.read(
        lambda conn: conn.execute(
            text("SELECT count(*) FROM inodes WHERE ino = :i"), {"i": big}
        ).scalar()
    )
    assert with_name == 0, "the inode row goes with the last chunk"

    left_at_commit.clear()
    event.listen(catalog.engine, "commit", on_commit)
    try:
        ns.unlink(
            ROOT, ns.root_ino, "small"
        )  # exactly one chunk: freed in the unlink's transaction
    finally:
        event.remove(catalog.engine, "commit", on_commit)
    assert len(left_at_commit) == 1 and extents_of(catalog, small) == 0
    check_accounting(catalog)
    assert fsck.check(catalog, ns.root_ino).clean


def test_an_open_big_file_is_freed_in_chunks_at_its_last_close(engine, monkeypatch):
    monkeypatch.setattr(namespace.transactions, "FREE_CHUNK_EXTENTS", CHUNK)
    ns, catalog = engine.ns, engine.catalog
    ino = ns.create(ROOT, ns.root_ino, "open").ino
    pieces(ns, ino, 3 * CHUNK)
    expected = ns.read(ino, 0, ns.getattr(ino).size)
    ns.open_ref(ino)
    ns.unlink(ROOT, ns.root_ino, "open")
    assert extents_of(catalog, ino) == 3 * CHUNK, "nothing is freed while it is open"
    assert ns.read(ino, 0, len(expected)) == expected
    left_at_commit = []

    def on_commit(conn):
        left_at_commit.append(
            conn.execute(text("SELECT count(*) FROM extents WHERE ino = :i"), {"i": ino}).scalar()
        )

    event.listen(catalog.engine, "commit", on_commit)
    try:
        ns.close_ref(ino)
    finally:
        event.remove(catalog.engine, "commit", on_commit)
    # (PostgreSQL: close_ref's own read of the attributes is a transaction too, before any change)
    assert [n for n in left_at_commit if n != 3 * CHUNK] == [2 * CHUNK, CHUNK, 0]
    with pytest.raises(errors.StaleHandle):
        ns.getattr(ino)
    check_accounting(catalog)


def test_an_interrupted_free_is_finished_at_the_next_start(sqlite_engine, monkeypatch, caplog):
    monkeypatch.setattr(namespace.transactions, "FREE_CHUNK_EXTENTS", CHUNK)
    eng = sqlite_engine
    ns, catalog = eng.ns, eng.catalog
    ino = ns.create(ROOT, ns.root_ino, "big").ino
    pieces(ns, ino, 4 * CHUNK)
    real_release, calls = eng.data.release, []

    def failing_release(conn, victim, limit=None):
        calls.append(victim)
        if len(calls) == 2:
            raise errors.IOFailure("the catalog went away")  # a fault we cannot cause for real here
        return real_release(conn, victim, limit)

    monkeypatch.setattr(eng.data, "release", failing_release)
    with caplog.at_level(logging.WARNING, logger="shingle.namespace"):
        ns.unlink(ROOT, ns.root_ino, "big")  # the name is gone: that part committed
    assert "freed at the next start" in caplog.text
    with pytest.raises(errors.NotFound):
        ns.lookup(ROOT, ns.root_ino, "big")
    assert extents_of(catalog, ino) == 3 * CHUNK  # one chunk went with the unlink, then the fault
    # what is left is being freed: its handle is stale, it never reads as the
    # holes freed extents left
    with pytest.raises(errors.StaleHandle):
        ns.read(ino, 0, 4 * KiB)
    with pytest.raises(errors.StaleHandle):
        ns.write(ino, 0, b"late")
    report = fsck.check(catalog, ns.root_ino)
    assert any("orphan" in p for p in report.problems)
    monkeypatch.undo()
    monkeypatch.setattr(namespace.transactions, "FREE_CHUNK_EXTENTS", CHUNK)
    eng.restart()
    assert eng.ns.reclaim_orphans() == 1
    assert extents_of(catalog, ino) == 0
    check_accounting(catalog)
    assert fsck.check(catalog, eng.ns.root_ino).clean
