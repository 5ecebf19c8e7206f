"""SQLite transactions reuse one connection per thread: nested transactions get another, the
connections of ended threads go back to the pool, a closed catalog and a forked child never
use them."""

from __future__ import annotations

import gc
import os
import threading

from engine.catalog.database import sql_one


def _one(conn):
    return sql_one(conn, "SELECT 1")[0]


def _in_thread(fn) -> None:
    thread = threading.Thread(target=fn)
    thread.start()
    thread.join()


def test_a_thread_keeps_its_connection_and_a_nested_transaction_gets_another(sqlite_catalog):
    catalog = sqlite_catalog
    seen = []
    catalog.read(lambda conn: seen.append(conn))
    catalog.read(lambda conn: seen.append(conn))
    assert seen[0] is seen[1]

    def outer(conn):
        return catalog.read(lambda inner: (inner is not conn, _one(inner)))

    assert catalog.run(outer) == (True, 1)
    catalog.read(lambda conn: seen.append(conn))
    assert seen[2] is seen[0]  # the nested one was given back, this thread's is still its own


def test_ended_threads_give_their_connections_back(sqlite_catalog):
    catalog = sqlite_catalog
    catalog.read(_one)
    for _ in range(5):
        _in_thread(lambda: catalog.read(_one))
        gc.collect()
    # this thread's, and the last thread's (freed when the next thread takes one)
    assert len(catalog._threads._open) <= 2
    pool = catalog.engine.pool
    assert pool.checkedout() <= 2


def test_a_closed_catalog_and_a_forked_child_do_not_reuse_them(sqlite_catalog):
    catalog = sqlite_catalog
    catalog.read(_one)
    pid = os.fork()
    if pid == 0:  # the child: the parent's connection must not serve it
        os._exit(0 if catalog._threads.take() is None else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert catalog._threads.take() is not None  # the parent's still does
    catalog._threads.give_back(catalog._threads._local.conn)
    catalog.close()
    assert catalog._threads.take() is None
