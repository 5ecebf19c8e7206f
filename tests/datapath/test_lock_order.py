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

    def namespace_side(conn):  # stands for Transactions.free -> DataPath.release -> Space.unreserve
        in_transaction.set()
        space_held.wait(10)
        dp.space.unreserve(1)
        b_done.set()

    def data_path_side():  # stands for write -> Space.reserve -> reclaim_zones -> catalog.run
        in_transaction.wait(10)
        with dp.space.lock:
            space_held.set()
            settings = Setting.__table__
            catalog.run(
                lambda conn: conn.execute(
                    update(settings).where(settings.c.key == "none").values(value="")
                )
            )

    other = threading.Thread(target=data_path_side)
    other.start()
    b = threading.Thread(target=lambda: catalog.run(namespace_side))
    b.start()
    assert b_done.wait(20), (
        "the transaction waited for the space lock held by a thread waiting for it"
    )
    b.join(20)
    other.join(30)
    assert not other.is_alive() and not b.is_alive()


def test_a_flush_places_its_stripe_without_holding_the_file_lock(sqlite_engine):
    """Placing may reset zones in a catalog transaction (Space.place -> reclaim_zones); a namespace
    transaction that frees the same file (release) waits for the file's lock. So a flush must not
    hold that lock while it places: the soak stalled 120 s on exactly this after flushes began
    placing their own stripes."""
    from engine.namespace import ROOT

    dp, catalog, ns = sqlite_engine.data, sqlite_engine.catalog, sqlite_engine.ns
    ino = ns.create(ROOT, ns.root_ino, "f", 0o644).ino
    ns.write(ino, 0, b"x" * 100 * 1024)  # more than an inline stripe takes: placed on drives
    released = threading.Event()
    in_time = []
    original = dp.space.place

    def place(stripe):
        if stripe.fb.ino == ino and not released.is_set():
            # stands for a namespace transaction freeing the file while this placement runs
            t = threading.Thread(
                target=lambda: (catalog.run(lambda conn: dp.release(conn, ino)), released.set())
            )
            t.start()
            in_time.append(released.wait(5))
        return original(stripe)

    dp.space.place = place
    ns.commit(ino)
    assert in_time == [True], "release waited for the file lock held by the flush that was placing"


def test_lifecycle_record_inside_a_transaction_does_not_wait_for_the_media_lock(sqlite_engine):
    """Media.append holds the media lock while it may wait for the catalog (_claim ->
    _reclaim_zones); Media.record runs inside a catalog transaction (cleaning's relocate), so
    it must not take that lock: the soak stalled 120 s on this, cleaning against tiering."""
    from engine.lifecycle.media import Media

    dp, catalog = sqlite_engine.data, sqlite_engine.catalog
    media = Media(dp)
    in_transaction, media_held, recorded = threading.Event(), threading.Event(), threading.Event()

    def cleaning_side(conn):  # stands for relocate's transaction -> Media.record
        in_transaction.set()
        media_held.wait(10)
        media.record(conn, [])
        recorded.set()

    def tiering_side():  # stands for Media.append -> _claim -> _reclaim_zones -> catalog.run
        in_transaction.wait(10)
        with media._lock:
            media_held.set()
            settings = Setting.__table__
            catalog.run(
                lambda conn: conn.execute(
                    update(settings).where(settings.c.key == "none").values(value="")
                )
            )

    other = threading.Thread(target=tiering_side)
    other.start()
    b = threading.Thread(target=lambda: catalog.run(cleaning_side))
    b.start()
    assert recorded.wait(20), (
        "record waited for the media lock held by a thread waiting for the catalog"
    )
    b.join(20)
    other.join(30)
    assert not other.is_alive() and not b.is_alive()
