"""How a cache tells that the catalog changed: the commit epoch (see CommitEpoch), and on
SQLite the WAL index header it is read from, mapped once per file per process."""

from __future__ import annotations

import logging
import mmap
import os
import sqlite3
import struct
import time
from collections import deque
from collections.abc import Callable

from engine.base.blocking import may_block
from engine.base.ordered_lock import lock
from engine.base.ratelog import OutageLog
from engine.catalog.changelog import NOTHING, Change, ChangeRing
from engine.catalog.changes import CHANNEL, RECORD, ChangeWatch

log = logging.getLogger("shingle.catalog")

# WAL index header: two 48-byte copies of WalIndexHdr; byte 12 is isInit
WAL_INDEX_HEADER = 48
WAL_INDEX_INIT = 12
WAL_INDEX_U32 = struct.Struct("=I")  # its fields are native byte order
WAL_INDEX_CHANGE = 8  # offset of iChange: the commit counter
WAL_INDEX_FRAMES = 16  # offset of mxFrame: frames in the WAL
TRACKED_KEEP = 4096  # tracked commit numbers remembered; a longer gap clears the caches
COMMIT_NUMBER = "shingle.commit_number"
SLOT_NUMBER = "shingle.slot_number"  # the ring slot a write filled, until its COMMIT is done
CHANGE_RECORD = "shingle.change_record"  # [inos, names, topics] a published write passes on
# only if the transaction wrote a row: a record of a transaction that changed nothing would be
# paired with another transaction's notification (changes.py)
PG_RECORD_SQL = (
    "SELECT pg_notify(%s, %s), pg_notify(%s, %s) WHERE pg_current_xact_id_if_assigned() IS NOT NULL"
)
PG_RECORD_MAX = 7000  # NOTIFY payloads stop at 8000 bytes; a longer record is not sent


# -shm path -> (inode, map, descriptor). Closing any descriptor of a file drops every POSIX lock
# this process holds on it, SQLite's own included, and another process that then finds the index
# unlocked truncates and rebuilds it under our connections (they die of SIGBUS). So a map and its
# descriptor are closed only once no Catalog of that database is open in this process any more
# (``_open_databases`` counts them): then no connection of ours holds a lock there to lose.
_wal_index_maps: dict[str, tuple[int, mmap.mmap, int]] = {}
# maps of a -shm file that was replaced, kept (with their descriptors) until the database closes
_wal_index_kept: dict[str, list[tuple[mmap.mmap, int]]] = {}
_open_databases: dict[str, int] = {}  # SQLite database path -> open Catalogs in this process
_wal_index_lock = lock("catalog.wal_index")


def map_wal_index(shm_path: str) -> mmap.mmap:
    """A read-only map of the WAL index header of ``shm_path``, one per file per process."""
    with _wal_index_lock:
        known = _wal_index_maps.get(shm_path)
        if known is not None and known[0] == os.stat(shm_path).st_ino:
            return known[1]
        fd = os.open(shm_path, os.O_RDONLY)  # closed with the last Catalog of it (see above)
        index = mmap.mmap(fd, WAL_INDEX_HEADER * 2, prot=mmap.PROT_READ)
        if known is not None:
            _wal_index_kept.setdefault(shm_path, []).append((known[1], known[2]))
        _wal_index_maps[shm_path] = (os.fstat(fd).st_ino, index, fd)
        return index


def database_opened(path: str) -> None:
    with _wal_index_lock:
        _open_databases[path] = _open_databases.get(path, 0) + 1


def database_closed(path: str) -> None:
    """The last Catalog of ``path`` in this process closed: its WAL index maps go too (a test
    run opens a catalog per test and would otherwise keep a descriptor of each)."""
    with _wal_index_lock:
        left = _open_databases.get(path, 0) - 1
        if left > 0:
            _open_databases[path] = left
            return
        _open_databases.pop(path, None)
        maps = _wal_index_kept.pop(path + "-shm", [])
        known = _wal_index_maps.pop(path + "-shm", None)
        if known is not None:
            maps.append((known[1], known[2]))
    for index, fd in maps:
        index.close()
        os.close(fd)


def commits_between(old: int, new: int) -> int:
    """How many commits epoch ``new`` is past ``old`` (negative: ``new`` was read before ``old``);
    the WAL index counter is 32 bits and wraps."""
    ahead = (new - old) & 0xFFFFFFFF
    return ahead - (1 << 32) if ahead > 0x7FFFFFFF else ahead


def change_counter(index: mmap.mmap) -> int:
    """The commit counter of a WAL index header, read until both copies agree."""
    tries = 0
    while True:
        header = index[: WAL_INDEX_HEADER * 2]
        if header[:WAL_INDEX_HEADER] == header[WAL_INDEX_HEADER:] and header[WAL_INDEX_INIT]:
            return WAL_INDEX_U32.unpack_from(header, WAL_INDEX_CHANGE)[0]
        tries += 1  # a commit is rewriting the header right now (nanoseconds): read again
        if tries % 100 == 0:
            time.sleep(0)


class CommitEpoch:
    """A number that moves with every commit to the catalog, by any process, and which of those
    commits were this process's tracked ones: what the namespace's and the quotas' caches check
    before they trust an entry. SQLite: the WAL index's change counter, read in place. PostgreSQL:
    the change watch (engine/catalog/changes.py), started by the first ``epoch()``."""

    def __init__(
        self,
        is_sqlite: bool,
        path: str | None,
        *,
        conninfo: Callable[[], str],
        send_ping: Callable[[str], None],
        writer_token: str,
        outage: OutageLog,
    ):
        self.is_sqlite = is_sqlite
        self._path = path  # SQLite: the database file
        self._conninfo = conninfo  # PostgreSQL: libpq connection string of the catalog
        self._send_ping = send_ping
        self._writer_token = writer_token
        self._outage = outage
        self._watch: sqlite3.Connection | None = None  # SQLite: for the epoch (see epoch())
        self._watch_lock = lock("catalog.watch")
        self.wal_index: mmap.mmap | None = None
        self.ring: ChangeRing | None = None  # SQLite: the change records (changelog.py)
        # commits of other processes whose record was missing: their caches were emptied
        self.records_missing = 0
        self._tracked: set[int] = set()  # commit numbers of this process's tracked commits
        self._tracked_order: deque = deque()
        self._tracked_lock = lock("catalog.tracked")
        self.changes: ChangeWatch | None = None  # PostgreSQL: started by the first epoch()
        self._changes_lock = lock("catalog.changes")

    def epoch(self) -> int | None:
        """A number that moves whenever any connection, of any process, commits; None while it
        cannot be told cheaply (then callers must not cache).

        PostgreSQL: the change watch's counter (engine/catalog/changes.py), moved by other
        writers' notifications and this process's untracked commits, never by its tracked ones;
        None while the watch is down or has not proved within 1 s that it is caught up.

        SQLite: the change counter in the header of the WAL index (the -shm file every
        connection maps). Each commit adds one to it and rewrites the header, second copy first,
        so two equal copies are a consistent header (https://www.sqlite.org/walformat.html).
        Reading it is a memory read: no lock, no query, nothing that lets go of the GIL, so the
        NFS event loop may call it. PRAGMA data_version on a watch connection is the fallback
        where the index cannot be mapped (2 us alone, about 70 us on a busy server)."""
        if not self.is_sqlite:
            changes = self.changes if self.changes is not None else self._start_changes()
            return changes.epoch()
        index = self.wal_index if self._watch is not None else self.open_watch()
        if index is not None:
            return change_counter(index)
        may_block("catalog epoch query")
        with self._watch_lock:
            watch = self._watch
            assert watch is not None  # open_watch opened it
            return watch.execute("PRAGMA data_version").fetchone()[0]

    def _start_changes(self) -> ChangeWatch:
        with self._changes_lock:
            if self.changes is None:
                self.changes = ChangeWatch(
                    self._conninfo(),
                    self._writer_token,
                    self._send_ping,
                    outage=self._outage,
                )
            return self.changes

    def subscribe(self, prefix: str, callback: Callable[[str | None], str | None]) -> bool:
        """PostgreSQL: ``callback`` hears the notifications whose payload starts with ``prefix``
        (ChangeWatch.subscribe); False on SQLite, which has no notifications."""
        if self.is_sqlite:
            return False
        changes = self.changes if self.changes is not None else self._start_changes()
        changes.subscribe(prefix, callback)
        return True

    def unsubscribe(self, callback: Callable[[str | None], str | None]) -> None:
        if self.changes is not None:
            self.changes.unsubscribe(callback)

    def catch_up(self, timeout: float = 5.0) -> bool:
        """Return once ``epoch`` reflects every commit that finished before this call: at once
        on SQLite; on PostgreSQL after a round trip through the change watch (False: it is down
        or slow, and ``epoch`` says None meanwhile)."""
        if self.is_sqlite:
            return True
        changes = self.changes if self.changes is not None else self._start_changes()
        if not changes.wait_ready(timeout):
            return False
        return changes.catch_up(timeout)

    def only_tracked(self, old: int, new: int) -> bool:
        """Whether every commit that moved the epoch from ``old`` to ``new`` was a tracked commit of
        this process (``run(tracked=True)``). A ``new`` older than ``old``
        (read before it) is True."""
        if old == new:
            return True
        if self.wal_index is None:
            return False
        ahead = commits_between(old, new)
        if ahead < 0:
            return True
        if ahead > TRACKED_KEEP:
            return False
        tracked = self._tracked
        return all((old + i) & 0xFFFFFFFF in tracked for i in range(1, ahead + 1))

    def changes_since(self, old: int, new: int) -> list[Change] | None:
        """What the commits that moved the epoch from ``old`` to ``new`` changed of what the
        caches hold: the records of other processes' commits and of this process's
        untracked ones (this process's tracked commits are left out: their writers evict what
        they changed themselves), or None when one of them is unknown (no record, or it is
        gone: the cache must empty itself). A ``new`` older than ``old`` changes nothing."""
        if old == new:
            return []
        if not self.is_sqlite:
            changes = self.changes
            found = changes.records(old, new) if changes is not None else None
        else:
            found = self._ring_records(old, new)
        if found is None:
            self.records_missing += 1
        return found

    def _ring_records(self, old: int, new: int) -> list[Change] | None:
        if self.wal_index is None:
            return None
        ahead = commits_between(old, new)
        if ahead < 0:
            return []
        if ahead > TRACKED_KEEP:
            return None
        ring, tracked = self.ring, self._tracked
        found = []
        for i in range(1, ahead + 1):
            number = (old + i) & 0xFFFFFFFF
            if number in tracked:
                continue
            change = ring.read(number) if ring is not None else None
            if change is None:
                return None
            if change.inos or change.names or change.topics:
                found.append(change)
        return found

    def counting(self, work, *, tracked: bool, published: bool):
        """``work`` that notes, inside its write transaction, which number its commit will get
        (``tracked``), and fills that commit's slot of the change ring: its record if
        ``published`` (what the work passed to ``Catalog.changes``), else unknown."""
        index = self.wal_index
        assert index is not None, "Catalog.run counts commits only with the WAL index mapped"
        ring = self.ring

        def counted(conn):
            raw = conn.connection.driver_connection
            before = raw.total_changes
            if published:
                conn.info[CHANGE_RECORD] = [[], [], 0]
            try:
                result = work(conn)
                change = record_of(conn) if published else None
            finally:
                conn.info.pop(CHANGE_RECORD, None)
            # we hold the write lock: no commit can move the counter until ours; a transaction
            # that changed no row commits no frames and moves nothing
            if raw.total_changes != before:
                number = (change_counter(index) + 1) & 0xFFFFFFFF
                if tracked:
                    conn.info[COMMIT_NUMBER] = number
                if ring is not None:
                    ring.write(number, change)
                    conn.info[SLOT_NUMBER] = number
            return result

        return counted

    def publishing(self, work):
        """PostgreSQL: ``work`` that sends, at the end of its transaction, the record of what it
        changed (``Catalog.changes``) behind the writer's own table notification
        (changes.py pairs them). A record too long for a payload is not sent: the other
        processes then empty their caches."""
        token = self._writer_token

        def published(conn):
            conn.info[CHANGE_RECORD] = [[], [], 0]
            try:
                result = work(conn)
                change = record_of(conn)
            finally:
                conn.info.pop(CHANGE_RECORD, None)
            payload = f"{RECORD}{token}:{change_json(change)}"
            if len(payload) <= PG_RECORD_MAX:
                conn.exec_driver_sql(PG_RECORD_SQL, (CHANNEL, token, CHANNEL, payload))
            return result

        return published

    def commit_failed(self, number: int) -> None:
        """The COMMIT of a write that filled ring slot ``number`` failed."""
        if self.ring is not None:
            self.ring.forget(number)

    def tracked_commit(self, number: int) -> None:
        with self._tracked_lock:
            self._tracked.add(number)
            self._tracked_order.append(number)
            while len(self._tracked_order) > TRACKED_KEEP:
                self._tracked.discard(self._tracked_order.popleft())

    def open_watch(self):
        """Open the watch connection and map the WAL index; returns the map or None."""
        with self._watch_lock:
            if self._watch is None:
                path = self._path
                assert path is not None, "the watch is opened on SQLite catalogs only (a file)"
                watch = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
                watch.execute(
                    "PRAGMA journal_mode=WAL"
                ).fetchone()  # the first connection may be this one
                watch.execute(
                    "PRAGMA data_version"
                ).fetchone()  # reading maps (creates) the WAL index
                # while the watch connection is open, SQLite keeps the -shm file in place
                try:
                    self.wal_index = map_wal_index(path + "-shm")
                except (OSError, ValueError) as exc:
                    log.debug(
                        "catalog: no WAL index to map (%s); cache checks query PRAGMA data_version",
                        exc,
                    )
                    self.wal_index = None
                if self.wal_index is not None and self.ring is None:
                    self.ring = ChangeRing.open_beside(
                        path, os.stat(path + "-shm").st_ino, change_counter(self.wal_index)
                    )
                self._watch = watch
        return self.wal_index

    def close(self) -> None:
        if self.ring is not None:
            self.ring.close()
            self.ring = None
        if self._watch is not None:
            self.wal_index = None  # the map stays open while another Catalog of the file is
            self._watch.close()
            self._watch = None
        if self.changes is not None:
            self.changes.close()
            self.changes = None


def record_of(conn) -> Change:
    """The record a published write's work passed to ``Catalog.changes`` (NOTHING if none)."""
    found = conn.info.get(CHANGE_RECORD)
    if not found or not (found[0] or found[1] or found[2]):
        return NOTHING
    return Change(tuple(found[0]), tuple(found[1]), found[2])


def change_json(change: Change) -> str:
    import json

    return json.dumps(
        [list(change.inos), [list(n) for n in change.names], change.topics], separators=(",", ":")
    )
