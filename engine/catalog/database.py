"""Opening the catalog and running transactions on it.

One URL picks the database: ``sqlite:///path`` (the embedded default) or
``postgresql+psycopg://...``. Every caller runs its work as a function in
``Catalog.run``, which retries the transient conflicts each database has
(SQLite "database is locked", PostgreSQL serialization failures) so that
none of them ever reaches a namespace caller.

SQLite settings, and why:
- journal_mode=WAL: readers never block the writer and vice versa.
- foreign_keys=ON: the schema's cascades and references are enforced (a transaction
  run with ``foreign_keys=False`` skips them: bulk copies of rows that hold onto rows inserted
  first, and bulk deletes that remove every referencing row first, where the lookups of each
  row cost more than the rows).
- busy_timeout: a writer waits for the lock instead of failing at once.
- Write transactions start with BEGIN IMMEDIATE, so the write lock is taken
  up front; a deferred transaction that upgrades later can fail with
  SQLITE_BUSY without the busy handler ever running.
- synchronous=NORMAL for metadata (atomic and consistent after any crash;
  a power cut may lose the last few commits), and FULL for transactions
  that must be durable before a reply (``durable=True``: data flushes behind
  a stable WRITE or a COMMIT, invariant 2).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import sqlite3
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import TypeVar

from sqlalchemy import create_engine, event, make_url, select
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, DisconnectionError
from sqlalchemy.exc import InterfaceError as SqlInterfaceError
from sqlalchemy.exc import OperationalError as SqlOperationalError
from sqlalchemy.exc import TimeoutError as SqlTimeout

from engine.base.blocking import may_block
from engine.base.ordered_lock import lock
from engine.base.ratelog import OutageLog
from engine.catalog.changes import CHANNEL, KEEPALIVE, WRITER_SETTING
from engine.catalog.epoch import (
    CHANGE_RECORD,
    COMMIT_NUMBER,
    SLOT_NUMBER,
    WAL_INDEX_FRAMES,
    WAL_INDEX_U32,
    CommitEpoch,
    database_closed,
    database_opened,
)
from engine.catalog.models import Setting

T = TypeVar("T")

SQLITE_BUSY_TIMEOUT_MS = 5000
RETRY_DEADLINE_S = 120.0
PG_RETRY_SQLSTATES = {"40001", "40P01"}  # serialization failure, deadlock
AFTER_COMMIT = "shingle.after_commit"
CHECKPOINT_FRAMES = 1000  # SQLite's own wal_autocheckpoint default
IDLE_SINCE = "shingle.idle_since"
# set in a SQLite connection's info while it is at synchronous=FULL (after a durable transaction)
SYNCHRONOUS_FULL = "shingle.synchronous_full"
PG_PING_IDLE_S = 1.0  # a pooled PostgreSQL connection idle this long is pinged before use
PG_CONNECT_TIMEOUT_S = 3  # per host of a multi-host URL (psycopg tries each in turn)

log = logging.getLogger("shingle.catalog")
# (catalog, wrapper of write work) while a maintenance leader's work runs (Catalog.fenced); a
# context variable, so threads started with a copy of the context are fenced too
_FENCE: ContextVar[tuple[Catalog, Callable] | None] = ContextVar("shingle_fence", default=None)


# -- plain SQL on the hot paths ----------------------------------------------------
_PG_SQL: dict[str, str] = {}


def _dialect_sql(conn: Connection, sql: str) -> str:
    if conn.dialect.name == "sqlite":
        return sql
    pg = _PG_SQL.get(sql)
    if pg is None:
        pg = _PG_SQL[sql] = sql.replace("?", "%s")
    return pg


def sql(conn: Connection, text: str, params: tuple = ()):
    """Plain SQL with ? placeholders on the DB-API cursor of the transaction's
    connection, for the hot paths: building SQLAlchemy statements and results
    costs several times what SQLite needs to run them. Returns the cursor."""
    # a connection inside a transaction always has its DB-API connection
    cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
    cursor.execute(_dialect_sql(conn, text), params)
    return cursor


def sql_one(conn: Connection, text: str, params: tuple = ()):
    """The first row of ``sql(...)``, or None."""
    cursor = sql(conn, text, params)
    row = cursor.fetchone()
    cursor.close()
    return row


def sql_all(conn: Connection, text: str, params: tuple = ()) -> list:
    cursor = sql(conn, text, params)
    rows = cursor.fetchall()
    cursor.close()
    return rows


def sql_many(conn: Connection, text: str, rows: list) -> None:
    """``executemany`` of one statement over ``rows`` (tuples)."""
    if rows:
        cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]  # as above
        cursor.executemany(_dialect_sql(conn, text), rows)
        cursor.close()


def in_list(ids) -> str:
    """ "(?, ?, ...)" for an IN clause of len(ids) parameters (chunk big lists)."""
    return "(" + ", ".join("?" * len(ids)) + ")"


def _pg_connect_defaults(url: str) -> dict[str, object]:
    """libpq settings of a PostgreSQL catalog's connections that its URL does not set itself.

    A head must notice a primary that is gone and reach the next one by itself (a URL may name
    every member of a Patroni cluster, ``?host=A:5432&host=B:5432&target_session_attrs=
    read-write``, and libpq takes the first writable one): without a connect timeout an
    attempt at a host cut off waits for TCP's own (minutes) before the next host is tried, and
    without keepalives a connection to a primary cut off mid-transaction waits forever."""
    query = make_url(url).query
    wanted = {"connect_timeout": PG_CONNECT_TIMEOUT_S, **KEEPALIVE}
    return {key: value for key, value in wanted.items() if key not in query}


class LeaderFenced(RuntimeError):
    """A write of a maintenance leader that is no longer the leader (never retried):
    engine/catalog/fence.py."""


def _fence_guard(is_sqlite: bool, token: int, still_leader: Callable[[], bool]):
    """A wrapper of write work that checks the leader fence around it (engine/catalog/fence.py:
    the row first, FOR SHARE on PostgreSQL so a successor's raise waits for this transaction,
    and the lease clock before the commit)."""
    query = "SELECT token FROM leader_fence WHERE id = 1" + ("" if is_sqlite else " FOR SHARE")

    def wrap(work: Callable[[Connection], T]) -> Callable[[Connection], T]:
        def fenced(conn: Connection) -> T:
            row = sql_one(conn, query)
            held = None if row is None else int(row[0])
            if held != token:
                raise LeaderFenced(
                    f"leader token {token} is fenced: the catalog's leader token is {held} "
                    "(another leader took office)"
                )
            result = work(conn)
            if not still_leader():
                raise LeaderFenced(f"leader token {token}: the lease was lost before the commit")
            return result

        return fenced

    return wrap


class CatalogUnavailable(RuntimeError):
    """The catalog could not be reached or stayed locked past the deadline."""


class CatalogUnreachable(CatalogUnavailable):
    """PostgreSQL is down, restarting or cut off. The catalog's outage log (``Catalog.outage``)
    has counted it: a caller that meets it logs nothing of its own."""


def from_outage(exc: BaseException) -> bool:
    """Whether ``exc`` is, or was raised while handling, a CatalogUnreachable (a job that failed
    because the catalog went away, say): told by the outage log, so no traceback is due."""
    seen = 0
    cause: BaseException | None = exc
    while cause is not None and seen < 16:
        if isinstance(cause, CatalogUnreachable):
            return True
        cause = cause.__cause__ or cause.__context__
        seen += 1
    return False


def _one_line(exc: BaseException) -> str:
    """The first line of a DB-API error (psycopg's go on with hints; SQLAlchemy's with a link)."""
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    text = str(orig).strip().splitlines()
    return f"{type(orig).__name__}: {text[0] if text else ''}"[:300]


class _WriterQueue:
    """First come, first served among this process's SQLite writers.

    SQLite's busy handler polls with growing sleeps (1, 2, 5, ... 100 ms), so a writer that
    waits misses the short gaps between another thread's transactions: a remove freeing a big
    file a chunk per transaction kept a 4 KiB COMMIT waiting 80 ms, as long as one big
    transaction did. Here the lock is handed to the oldest waiter on release. Other processes
    still meet SQLite's own lock and busy handler."""

    def __init__(self):
        self._mutex = lock("catalog.writer_queue")
        self._waiters: deque = deque()
        self._held = False

    def acquire(self, timeout: float) -> bool:
        with self._mutex:
            if not self._held:
                self._held = True
                return True
            turn = threading.Lock()
            turn.acquire()
            self._waiters.append(turn)
        if turn.acquire(timeout=timeout):
            return True  # handed over by release(): we hold it
        with self._mutex:
            try:
                self._waiters.remove(turn)
                return False
            except ValueError:
                pass  # handed over just now
        turn.acquire()
        return True

    def release(self) -> None:
        with self._mutex:
            if self._waiters:
                self._waiters.popleft().release()  # still held: it passes to that waiter
            else:
                self._held = False


class _IdleConnections:
    """SQLite: connections kept open between transactions; a transaction takes the one given
    back last.

    A pool checkout, a new SQLAlchemy Connection and the pool's reset on return cost about 60 us
    of CPU per transaction, more than SQLite needs for a small one, so connections are checked
    out of the catalog's pool once (the engine's events see them as any other) and kept. Last
    in, first out: in WAL mode SQLite drops a connection's whole page cache when another
    connection has committed since its last transaction, and with one connection per thread the
    NFS workers, which take calls in turn, paid that at nearly every transaction (about 30
    page reads for an unlink). The connection that committed last is usually the one given back
    last, so a client's next transaction finds its pages cached. A transaction run inside
    another (nested ``run``) takes a second one. All go back to the pool at ``close()``."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._idle: list[Connection] = []
        self._open: dict[int, Connection] = {}  # id -> every connection taken and not closed
        self._lock = lock("catalog.idle_connections")
        self._pid = os.getpid()
        self.closed = False

    def take(self) -> Connection | None:
        """The connection given back last, or a new one; None when closed, or in the child of a
        fork (the parent's are never used there: SQLite forbids it)."""
        if self.closed or os.getpid() != self._pid:
            return None
        with self._lock:
            if self._idle:
                return self._idle.pop()
        conn = self.engine.connect()
        with self._lock:
            self._open[id(conn)] = conn
        return conn

    def give_back(self, conn: Connection) -> None:
        if conn.invalidated or conn.closed:
            self._forget(conn)
            return
        if conn.in_transaction():  # a failed COMMIT SQLAlchemy could not roll back
            try:
                conn.rollback()
            except Exception:  # noqa: BLE001 - the connection is unusable: a new one next time
                self._forget(conn)
                return
        with self._lock:
            if not self.closed:
                self._idle.append(conn)
                return
        self._forget(conn)  # closed meanwhile

    def _forget(self, conn: Connection) -> None:
        with self._lock:
            self._open.pop(id(conn), None)
        try:
            conn.close()
        except Exception as exc:  # noqa: BLE001 - it is dropped either way
            log.debug("catalog: closing a broken connection: %s", exc)

    def close(self) -> None:
        """Every connection back to the pool (the catalog disposes of the pool next)."""
        with self._lock:
            self.closed = True
            conns = list(self._open.values())
            self._open.clear()
            self._idle.clear()
        for conn in conns:
            try:
                conn.close()
            except Exception as exc:  # noqa: BLE001 - closing anyway
                log.debug("catalog: closing a connection: %s", exc)


class Catalog:
    def __init__(self, url: str, *, sqlite_synchronous: str = "normal", pool_size: int = 8):
        self.url = url
        self.is_sqlite = url.startswith("sqlite")
        self._sqlite_synchronous = sqlite_synchronous.upper()
        self._writers = _WriterQueue()
        self._checkpointing = lock("catalog.checkpoint")
        self._writer_token = uuid.uuid4().hex
        # PostgreSQL gone: one line when it starts, a count per interval, one when it is back
        self.outage = OutageLog(log, "catalog")
        self.epochs = CommitEpoch(
            self.is_sqlite,
            make_url(url).database if self.is_sqlite else None,
            conninfo=self.pg_conninfo,
            send_ping=self._send_ping,
            writer_token=self._writer_token,
            outage=self.outage,
        )
        # bound once: the NFS event loop reads the epoch on every cached lookup
        self.epoch = self.epochs.epoch
        self.catch_up = self.epochs.catch_up
        self.subscribe = self.epochs.subscribe
        self.unsubscribe = self.epochs.unsubscribe
        self.only_tracked = self.epochs.only_tracked
        self.changes_since = self.epochs.changes_since
        self._database: str | None = None  # SQLite: the file, counted in _open_databases
        if self.is_sqlite:
            self.engine: Engine = create_engine(
                url,
                pool_size=pool_size,
                # kept checked out (_IdleConnections): as many as transactions ever ran at once
                max_overflow=-1,
                connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000},
            )
            # a file's WAL index map is closed when its last Catalog here closes (see above)
            database = self.engine.url.database
            self._database = database if database and database != ":memory:" else None
            if self._database is not None:
                database_opened(self._database)
            event.listen(self.engine, "connect", self._sqlite_connect)
            event.listen(self.engine, "begin", self._sqlite_begin)
            self._kept: _IdleConnections | None = _IdleConnections(self.engine)
        else:
            self.engine = create_engine(
                url,
                pool_size=pool_size,
                max_overflow=32,
                isolation_level="SERIALIZABLE",
                connect_args={
                    **_pg_connect_defaults(url),
                    # the change triggers name this Catalog as the writer (changes.py)
                    "options": f"-c {WRITER_SETTING}={self._writer_token}",
                },
            )
            event.listen(self.engine, "checkin", self._pg_checkin)
            event.listen(self.engine, "checkout", self._pg_checkout)
            self._kept = None

    # -- SQLite connection set-up ------------------------------------------
    def _sqlite_connect(self, dbapi_conn, _record):
        # Take transaction control away from pysqlite; _sqlite_begin emits BEGIN.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cur.execute(f"PRAGMA synchronous={self._sqlite_synchronous}")
        if self.epochs.open_watch() is not None:
            # run() checkpoints once it has let go of the writer queue: SQLite's automatic
            # checkpoint runs inside COMMIT, and this process's other writers would wait for it
            cur.execute("PRAGMA wal_autocheckpoint=0")
        cur.close()

    @staticmethod
    def _sqlite_begin(conn: Connection):
        # on the DB-API connection: a SQLAlchemy statement execution here
        # cost ~10 us per transaction
        # (a connection being begun always has its DB-API connection)
        conn.connection.driver_connection.execute(  # type: ignore[union-attr]
            conn.info.get("begin", "BEGIN")
        )

    # -- PostgreSQL connection checks --------------------------------------
    # SQLAlchemy's pre-ping costs a round trip per transaction (a read was 4 trips, 3 without it).
    # A connection in steady use needs none: if the server went away, the next statement fails,
    # run() says CatalogUnavailable and SQLAlchemy renews the whole pool. So only a connection
    # idle for PG_PING_IDLE_S (PostgreSQL may have restarted meanwhile) is pinged at checkout.
    @staticmethod
    def _pg_checkin(_dbapi_conn, record) -> None:
        record.info[IDLE_SINCE] = time.monotonic()

    @staticmethod
    def _pg_checkout(dbapi_conn, record, _proxy) -> None:
        if dbapi_conn.closed or dbapi_conn.broken:  # psycopg saw it die: no ping needed
            raise DisconnectionError("catalog connection was lost")
        if time.monotonic() - record.info.get(IDLE_SINCE, 0.0) <= PG_PING_IDLE_S:
            return
        try:
            dbapi_conn.cursor().execute("SELECT 1")
            dbapi_conn.rollback()
        except Exception as exc:  # noqa: BLE001 - any failure: the pool opens a new connection
            raise DisconnectionError(f"catalog connection lost while idle: {exc}") from exc

    # -- transactions --------------------------------------------------------
    def run(  # noqa: C901 - every transaction's hot path: one frame, no helper calls
        self,
        work: Callable[[Connection], T],
        *,
        write: bool = True,
        durable: bool = False,
        tracked: bool = False,
        published: bool = False,
        foreign_keys: bool = True,
    ) -> T:
        """Run ``work(conn)`` in one transaction, retrying transient conflicts.

        ``durable``: the commit is on stable storage when this returns. ``tracked``: this process
        accounts for the commit in its caches itself (it evicts what it changed, or it changes
        nothing that is cached), so ``only_tracked`` may let caches keep their entries.
        ``published`` (with ``tracked``): other processes learn what the commit changed of what
        caches hold, what ``work`` passes to ``Catalog.changes`` (nothing, if it passes
        nothing), and evict just that (engine/catalog/changelog.py); without it their caches
        empty themselves at this commit.
        ``foreign_keys=False`` (SQLite; PostgreSQL always checks): SQLite's per-row checks and
        cascades are skipped, for work that keeps the references whole itself (it inserts rows
        copied from valid ones onto rows it inserted first, or deletes every referencing row
        before what they reference)."""
        may_block("catalog transaction")
        deadline = time.monotonic() + RETRY_DEADLINE_S
        delay = 0.001
        if write:
            work = self._write_work(work, tracked=tracked, published=published and tracked)
        while True:
            queued = self.is_sqlite and write
            try:
                if queued and not self._writers.acquire(
                    timeout=max(deadline - time.monotonic(), 0)
                ):
                    raise CatalogUnavailable(
                        f"catalog busy for {RETRY_DEADLINE_S:.0f} s: this process's "
                        f"writers did not let go"
                    )
                try:
                    conn, own = self._take_connection()
                    try:
                        info = conn.info
                        if self.is_sqlite:
                            info["begin"] = "BEGIN IMMEDIATE" if write else "BEGIN"
                        # conn.info lives with the DB-API connection: never let callbacks
                        # outlive this try
                        callbacks: list[Callable[[], object]] = []
                        info[AFTER_COMMIT] = callbacks
                        try:
                            if self.is_sqlite and (
                                durable
                                or not foreign_keys
                                or (write and info.get(SYNCHRONOUS_FULL))
                            ):
                                result = self._run_sqlite_pragmas(
                                    conn, work, durable=durable, foreign_keys=foreign_keys
                                )
                            else:
                                with conn.begin():
                                    result = work(conn)
                            # set by CommitEpoch.counting: the commit went through
                            number = info.get(COMMIT_NUMBER)
                            info.pop(SLOT_NUMBER, None)
                        finally:
                            del info[AFTER_COMMIT]
                            info.pop(COMMIT_NUMBER, None)
                            if (slot := info.pop(SLOT_NUMBER, None)) is not None:
                                self.epochs.commit_failed(slot)  # its record is not true
                    finally:
                        self._let_go(conn, own)
                finally:
                    if queued:
                        self._writers.release()
                if number is not None:
                    self.epochs.tracked_commit(number)
                elif write and not tracked and self.epochs.changes is not None:
                    self.epochs.changes.moved()  # our own notification is ignored: move it here
                for callback in callbacks:
                    callback()
                if write and self.is_sqlite:
                    self._checkpoint_if_due()
                if self.outage.down_since is not None:  # an attribute read per transaction
                    self.outage.recovered()
                return result
            except (
                Exception
            ) as exc:  # DB-API errors arrive wrapped (SQLAlchemy) or raw (hot-path cursors)
                if not self._transient(exc):
                    if self._unreachable(exc):  # not retried here: the commit may have happened
                        self.outage.failed(_one_line(exc))
                        raise CatalogUnreachable(f"catalog unreachable: {_one_line(exc)}") from exc
                    raise
                if time.monotonic() > deadline:
                    raise CatalogUnavailable(
                        f"catalog busy for {RETRY_DEADLINE_S:.0f} s: {exc}"
                    ) from exc
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 0.05)

    def _write_work(self, work, *, tracked: bool, published: bool):
        """``work`` of a write transaction, checked against the leader fence (``fenced``),
        counted (SQLite: its commit number, its change record's ring slot) or publishing its
        change record (PostgreSQL)."""
        if (fence := _FENCE.get()) is not None and fence[0] is self:
            work = fence[1](work)
        if self.epochs.wal_index is not None:
            return self.epochs.counting(work, tracked=tracked, published=published)
        if published and not self.is_sqlite:
            return self.epochs.publishing(work)
        return work

    @contextlib.contextmanager
    def fenced(self, token: int, still_leader: Callable[[], bool] = lambda: True) -> Iterator[None]:
        """Every write transaction run in this context (this thread, and threads started with a
        copy of its context) commits only while the catalog's leader fence holds ``token`` and
        ``still_leader()`` says yes; else it fails with ``LeaderFenced`` (engine/catalog/fence.py).
        Reads are not checked."""
        reset = _FENCE.set((self, _fence_guard(self.is_sqlite, token, still_leader)))
        try:
            yield
        finally:
            _FENCE.reset(reset)

    @staticmethod
    def changes(conn: Connection, inos=(), names=(), topics: int = 0) -> None:
        """In a ``run(published=True)`` work: its commit changes the attributes (and extended
        attributes, and extents) of ``inos``, the (directory inode, name) entries ``names``, and
        the tables of ``topics`` (changelog.QUOTAS, ...), as far as caches are concerned; other
        processes evict them (changelog.py). Nothing outside a published write."""
        found = conn.info.get(CHANGE_RECORD)
        if found is not None:
            found[0].extend(inos)
            found[1].extend(names)
            found[2] |= topics

    @staticmethod
    def after_commit(conn: Connection, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once the transaction of ``conn`` has committed (not on rollback)."""
        conn.info[AFTER_COMMIT].append(callback)

    def _checkpoint_if_due(self) -> None:
        """What SQLite's automatic checkpoint does (PASSIVE, once the WAL holds 1000 frames), run
        by the writer that crossed the mark once its commit is done: outside the writer queue and
        after the commit's callbacks, so neither other writers nor cache evictions wait for it."""
        index = self.epochs.wal_index
        if (
            index is None
            or WAL_INDEX_U32.unpack_from(index, WAL_INDEX_FRAMES)[0] < CHECKPOINT_FRAMES
        ):
            return
        # the connection first: opening one takes catalog.watch, ranked below catalog.checkpoint
        conn, own = self._take_connection()
        try:
            if not self._checkpointing.acquire(blocking=False):
                return  # another thread is checkpointing right now
            try:
                raw = conn.connection.dbapi_connection
                assert raw is not None  # an open connection has its DB-API connection
                raw.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            except Exception as exc:  # noqa: BLE001 - busy or failed: the next commit tries again
                log.debug("catalog: checkpoint skipped: %s", exc)
            finally:
                self._checkpointing.release()
        finally:
            self._let_go(conn, own)

    def _take_connection(self) -> tuple[Connection, bool]:
        """A kept connection (SQLite, _IdleConnections), else a pooled one; and which."""
        kept = self._kept
        mine = kept.take() if kept is not None else None
        if mine is not None:
            return mine, True
        return self.engine.connect(), False

    def _let_go(self, conn: Connection, own: bool) -> None:
        if own:
            self._kept.give_back(conn)  # type: ignore[union-attr]  # own: connections are kept
        else:
            conn.close()

    def _run_sqlite_pragmas(self, conn: Connection, work, *, durable: bool, foreign_keys: bool):
        """``work`` with synchronous=FULL if ``durable`` (else the catalog's level) and/or
        foreign_keys=OFF; both are set outside the transaction (SQLite ignores foreign_keys
        inside one). foreign_keys is put back after it; synchronous stays at FULL until a write
        that is not durable takes the connection: a flush's commits follow one another, and
        two statements more per commit cost about 60 us of CPU, GIL hand-offs included
        (docs/performance.md). The connection's info says which level it is at; SQLAlchemy
        clears it when the DB-API connection is replaced."""
        raw = conn.connection.dbapi_connection
        assert raw is not None  # an open connection has its DB-API connection
        info = conn.info
        if durable != bool(info.get(SYNCHRONOUS_FULL)):
            level = "FULL" if durable else self._sqlite_synchronous
            raw.execute(f"PRAGMA synchronous={level}")
            info[SYNCHRONOUS_FULL] = durable
        if not foreign_keys:
            raw.execute("PRAGMA foreign_keys=OFF")
        try:
            with conn.begin():
                return work(conn)
        finally:
            if not foreign_keys:
                raw.execute("PRAGMA foreign_keys=ON")

    def _transient(self, exc: Exception) -> bool:
        orig = exc.orig if isinstance(exc, DBAPIError) else exc
        if self.is_sqlite:
            text = str(orig).lower()
            return isinstance(orig, sqlite3.OperationalError) and (
                "locked" in text or "busy" in text
            )
        return getattr(orig, "sqlstate", None) in PG_RETRY_SQLSTATES

    def _unreachable(self, exc: Exception) -> bool:
        """PostgreSQL is down, restarting or cut off (a connection refused or lost, the pool out
        of connections): callers may retry later, once the pool has reconnected."""
        if self.is_sqlite:
            return False
        if isinstance(exc, SqlTimeout) or (
            isinstance(exc, DBAPIError) and exc.connection_invalidated
        ):
            return True
        orig = exc.orig if isinstance(exc, DBAPIError) else exc
        try:
            import psycopg
        except ImportError:  # another driver: SQLAlchemy's classes of the same errors
            return isinstance(exc, (SqlOperationalError, SqlInterfaceError))
        return isinstance(orig, (psycopg.OperationalError, psycopg.InterfaceError))

    def read(self, work: Callable[[Connection], T]) -> T:
        return self.run(work, write=False)

    # -- cache validation (CommitEpoch)
    @property
    def epoch_is_exact(self) -> bool:
        """Whether ``epoch()`` has moved for every commit made before it is read, by any process
        (SQLite: the WAL index is read in place). PostgreSQL's moves when a notification arrives,
        a moment later: fit for bounding how stale a cached fact may be, not for proving that a
        name is missing."""
        return self.is_sqlite

    def pg_conninfo(self) -> str:
        """The libpq connection string of this PostgreSQL catalog, every host of a multi-host
        URL and every query parameter (target_session_attrs, ...) included: what the pool's
        connections use, so the change watch follows a failover as they do (a URL rendered
        back as a libpq URI keeps only the last of several ``host=`` parameters)."""
        from psycopg import pq
        from psycopg.conninfo import make_conninfo

        _args, params = self.engine.dialect.create_connect_args(self.engine.url)
        # the dialect adds psycopg's own arguments (its adapters' context): libpq's keys only
        libpq_keys = {option.keyword.decode() for option in pq.Conninfo.get_defaults()}
        return make_conninfo("", **{k: v for k, v in params.items() if k in libpq_keys})

    def notify(self, conn, payload: str) -> None:
        """In a write transaction on PostgreSQL: a notification on the change channel, delivered
        at the commit to every process's watch (``subscribe``); nothing on SQLite."""
        if not self.is_sqlite:
            conn.exec_driver_sql("SELECT pg_notify(%s, %s)", (CHANNEL, payload))

    def _send_ping(self, payload: str) -> None:
        with self.engine.connect() as conn:
            conn.exec_driver_sql("SELECT pg_notify(%s, %s)", (CHANNEL, payload))
            conn.commit()

    # -- settings --------------------------------------------------------------
    def get_setting(self, key: str, default: str | None = None) -> str | None:
        table = Setting.__table__
        value = self.read(
            lambda c: c.execute(select(table.c.value).where(table.c.key == key)).scalar()
        )
        return default if value is None else value

    def set_setting(self, key: str, value: str) -> None:
        table = Setting.__table__

        def work(conn):
            done = conn.execute(
                table.update().where(table.c.key == key).values(value=value)
            ).rowcount
            if not done:
                conn.execute(table.insert().values(key=key, value=value))

        self.run(work, tracked=True)  # settings are cached nowhere

    def close(self) -> None:
        self.epochs.close()
        if self._kept is not None:
            self._kept.close()
        self.engine.dispose()
        if self._database is not None:  # once: a second close() must not count again
            database, self._database = self._database, None
            database_closed(database)
