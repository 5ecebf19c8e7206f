"""SQLite transactions reuse kept connections, the one given back last first (so a commit's
connection, whose page cache SQLite keeps, serves the next transaction whatever thread runs
it); nested and concurrent transactions get connections of their own; a closed catalog and a
forked child never use them."""

from __future__ import annotations

import os
import threading

from engine.catalog.database import sql_one


def _one(conn):
    return sql_one(conn, "SELECT 1")[0]


def _in_thread(fn) -> None:
    thread = threading.Thread(target=fn)
    thread.start()
    thread.join()


def _raw(conn):
    return conn.connection.dbapi_connection


def test_transactions_reuse_a_connection_and_a_nested_one_gets_another(sqlite_catalog):
    catalog = sqlite_catalog
    seen = []
    catalog.read(lambda conn: seen.append(_raw(conn)))
    catalog.read(lambda conn: seen.append(_raw(conn)))
    assert seen[0] is seen[1]

    def outer(conn):
        return catalog.read(lambda inner: (_raw(inner) is not _raw(conn), _one(inner)))

    assert catalog.run(outer) == (True, 1)
    catalog.read(lambda conn: seen.append(_raw(conn)))
    # the outer one was given back last (the nested one before it): it is taken first
    assert seen[2] is seen[0]


def test_the_connection_given_back_last_serves_the_next_thread(sqlite_catalog):
    """The NFS workers take calls in turn: a connection per thread lost SQLite's page cache to
    the other threads' commits at nearly every transaction."""
    catalog = sqlite_catalog
    seen = []
    catalog.run(lambda conn: seen.append(_raw(conn)), tracked=True)
    for _ in range(5):
        _in_thread(lambda: catalog.run(lambda conn: seen.append(_raw(conn))))
    assert all(raw is seen[0] for raw in seen), "another thread's transaction took another one"
    assert len(catalog._kept._open) == 1
    assert catalog.engine.pool.checkedout() == 1


def test_concurrent_transactions_never_share_a_connection(sqlite_catalog):
    catalog = sqlite_catalog
    both_inside = threading.Barrier(3, timeout=10)
    seen = []

    def read():
        def work(conn):
            seen.append(_raw(conn))
            both_inside.wait()
            return _one(conn)

        catalog.read(work)

    threads = [threading.Thread(target=read) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({id(raw) for raw in seen}) == 3
    assert len(catalog._kept._idle) == 3  # all kept, for the next ones


def test_a_closed_catalog_and_a_forked_child_do_not_reuse_them(sqlite_catalog):
    catalog = sqlite_catalog
    catalog.read(_one)
    pid = os.fork()
    if pid == 0:  # the child: the parent's connection must not serve it
        os._exit(0 if catalog._kept.take() is None else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    conn = catalog._kept.take()
    assert conn is not None  # the parent's still does
    catalog._kept.give_back(conn)
    catalog.close()
    assert catalog._kept.take() is None
    assert conn.closed


def test_durable_transactions_run_at_full_and_others_at_the_catalogs_level(sqlite_catalog):
    """A connection stays at synchronous=FULL from one durable commit to the next (a flush's
    commits follow one another) and goes back to the catalog's level (NORMAL, 1) before any
    write that is not durable; a read leaves it as it is. 2 is FULL."""
    catalog = sqlite_catalog

    def level(conn):
        return sql_one(conn, "PRAGMA synchronous")[0]

    levels = [
        catalog.run(level, durable=True),
        catalog.run(level, durable=True),
        catalog.read(level),
        catalog.run(level),
        catalog.run(level, durable=True),
        catalog.run(level, foreign_keys=False),
        catalog.run(level, durable=True, foreign_keys=False),
        catalog.run(level),
    ]
    assert levels == [2, 2, 2, 1, 2, 1, 2, 1]
    # every one of them ran on the one kept connection, so each level above was its own
    assert len(catalog._kept._open) == 1
