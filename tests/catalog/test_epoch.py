"""Catalog.epoch, the change signal behind every in-process cache (SQLite): it moves
with every commit of any connection or process, stays put otherwise, and never
blocks, so the NFS event loop may use it inside no_blocking()."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest

from engine.base.blocking import WouldBlock, no_blocking
from engine.catalog import Catalog
from engine.catalog.database import sql


def _commit_elsewhere(url: str) -> None:
    """A commit by another process, through the sqlite3 module alone."""
    path = url.removeprefix("sqlite:///")
    code = (
        "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
        "c.execute(\"INSERT INTO settings (key, value) VALUES ('epoch-test', 'x') "
        "ON CONFLICT(key) DO UPDATE SET value = value || 'x'\"); c.commit()"
    )
    subprocess.run([sys.executable, "-c", code, path], check=True)


def test_epoch_moves_with_every_commit_and_only_then(sqlite_catalog):
    first = sqlite_catalog.epoch()
    assert sqlite_catalog.epochs.wal_index is not None, "the WAL index was not mapped"
    assert sqlite_catalog.epoch() == first
    sqlite_catalog.read(lambda conn: sql(conn, "SELECT COUNT(*) FROM inodes").fetchall())
    assert sqlite_catalog.epoch() == first, "a read moved the epoch"
    sqlite_catalog.set_setting("a", "1")  # this catalog's own commit
    second = sqlite_catalog.epoch()
    assert second != first
    other = Catalog(sqlite_catalog.url)  # another engine: to SQLite, another process
    try:
        other.set_setting("a", "2")
    finally:
        other.close()
    third = sqlite_catalog.epoch()
    assert third != second
    _commit_elsewhere(sqlite_catalog.url)
    fourth = sqlite_catalog.epoch()
    assert fourth not in (first, second, third)
    assert sqlite_catalog.epoch() == fourth


def test_epoch_never_repeats_across_wal_restarts(sqlite_catalog):
    seen = {sqlite_catalog.epoch()}
    checkpointer = sqlite3.connect(
        sqlite_catalog.url.removeprefix("sqlite:///"), isolation_level=None
    )
    for i in range(300):
        sqlite_catalog.set_setting("k", "v" * (i % 7) + str(i))
        if i % 50 == 0:  # the WAL is emptied and the next commit writes it from its start again
            checkpointer.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        epoch = sqlite_catalog.epoch()
        assert epoch not in seen, f"commit {i} left an epoch seen before"
        seen.add(epoch)
    checkpointer.close()


def test_epoch_is_allowed_where_blocking_is_not(sqlite_catalog):
    before = sqlite_catalog.epoch()
    with no_blocking():
        assert sqlite_catalog.epoch() == before
        with pytest.raises(WouldBlock):
            sqlite_catalog.read(lambda conn: None)
        with pytest.raises(WouldBlock):
            sqlite_catalog.set_setting("a", "1")
    assert sqlite_catalog.get_setting("a") is None, "a refused transaction ran anyway"
    sqlite_catalog.set_setting("a", "1")  # outside, the same call works
    assert sqlite_catalog.epoch() != before


def test_without_the_wal_index_the_epoch_still_moves(sqlite_catalog):
    sqlite_catalog.epoch()
    # a filesystem that cannot map the index is not at hand: take the map away (not closing it:
    # that would drop this process's locks on the index)
    sqlite_catalog.epochs.wal_index = None
    first = sqlite_catalog.epoch()
    assert sqlite_catalog.epoch() == first
    _commit_elsewhere(sqlite_catalog.url)
    assert sqlite_catalog.epoch() != first
    with no_blocking(), pytest.raises(WouldBlock):
        sqlite_catalog.epoch()  # the fallback is a query: not on the event loop


def test_postgresql_has_no_epoch(catalog):
    if catalog.is_sqlite:
        pytest.skip("SQLite has one")
    assert catalog.epoch() is None


_PROBE_DMS = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
try:
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 128)  # SQLite's "dead man switch" byte
    print("unlocked")
except OSError:
    print("held")
"""


def test_mapping_the_wal_index_keeps_sqlites_locks(sqlite_catalog):
    # Closing a descriptor of the -shm file would drop every POSIX lock this process holds on
    # it, SQLite's included; the next process to open the database would then find the index
    # unused, truncate and rebuild it under our connections (they died of SIGBUS that way).
    sqlite_catalog.read(
        lambda conn: sql(conn, "SELECT COUNT(*) FROM settings").fetchall()
    )  # opens the WAL
    shm = sqlite_catalog.url.removeprefix("sqlite:///") + "-shm"

    def probe():
        return subprocess.run(
            [sys.executable, "-c", _PROBE_DMS, shm], capture_output=True, text=True, check=True
        ).stdout.strip()

    assert probe() == "held"  # the probe itself is sound
    sqlite_catalog.epoch()  # maps the index
    other = Catalog(sqlite_catalog.url)
    other.epoch()  # and once more for the same file
    other.close()
    assert probe() == "held", "mapping the WAL index dropped SQLite's lock on it"
