"""A namespace transaction that frees a file must never wait for a lock that a data-path
thread holds while it waits for the catalog: that deadlock stalled writers for the
catalog's whole retry deadline (120 s) in the soak."""
from __future__ import annotations

import threading

from sqlalchemy import update

from engine.catalog.models import Setting


def test_unreserve_inside_a_transaction_does_not_wait_for_the_space_lock(sqlite_engine):
    dp, catalog = sqlite_engine.data, sqlite_engine.catalog
    in_transaction, space_held, b_done = threading.Event(), threading.Event(), threading.Event()

    def namespace_side(conn):  # stands for Namespace._free -> DataPath.release -> _unreserve
        in_transaction.set()
        space_held.wait(10)
        dp._unreserve(1)
        b_done.set()

    def data_path_side():  # stands for write -> _reserve -> _reclaim_zones -> catalog.run
        in_transaction.wait(10)
        with dp._space_lock:
            space_held.set()
            settings = Setting.__table__
            catalog.run(lambda conn: conn.execute(update(settings).where(settings.c.key == "none").values(value="")))

    other = threading.Thread(target=data_path_side)
    other.start()
    b = threading.Thread(target=lambda: catalog.run(namespace_side))
    b.start()
    assert b_done.wait(20), "the transaction waited for the space lock held by a thread waiting for it"
    b.join(20)
    other.join(30)
    assert not other.is_alive() and not b.is_alive()
