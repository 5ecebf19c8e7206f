"""Placement rules a kernel zoned device imposes, checked on zone-file drives that emulate them:
appends padded to whole blocks (the committed write pointer included) and a limit on the zones
open at once per drive (tests/kernel/test_zoned.py runs the same on real zoned devices)."""

from __future__ import annotations

import os

from dphelpers import Engine, KiB, check_accounting
from sqlalchemy import select, update

from engine.catalog.models import Drive, Fragment
from engine.lifecycle.cleaning import clean
from engine.namespace import ROOT

STRIPE = 8 * 64 * KiB


def make(engine, name: str, data: bytes) -> int:
    ns = engine.ns
    ino = ns.create(ROOT, ns.root_ino, name).ino
    for off in range(0, len(data), 7000):
        ns.write(ino, off, data[off : off + 7000])
    ns.commit(ino)
    return ino


def test_padded_appends_leave_no_uncommitted_tail_for_recovery(sqlite_catalog, tmp_path):
    # the device's pointer ends past the padding of the last fragment: the catalog's must too,
    # or every restart finds a "garbage" tail of padding in every zone written
    eng = Engine(sqlite_catalog, tmp_path / "blk", write_granularity=4096)
    try:
        files = {make(eng, f"b{i}", os.urandom(STRIPE // 3 + 1001 * i)): i for i in range(3)}
        eng.restart()
        report = eng.data.recovery_report
        assert (report.zones_with_garbage, report.garbage_bytes, report.short_zones) == (0, 0, [])
        assert len(files) == 3
    finally:
        eng.close()


def test_cleaning_appends_on_the_block_grid(sqlite_catalog, tmp_path):
    # cleaning's appends (lifecycle media) take their offsets through Space.take: they must be
    # padded as the data path's are, else the next append lands off the device's pointer
    eng = Engine(sqlite_catalog, tmp_path / "blk", write_granularity=4096)
    try:
        ns = eng.ns
        data = {f"c{i}": os.urandom(STRIPE + 3333 * i) for i in range(24)}  # zones fill up
        for name, payload in data.items():
            make(eng, name, payload)
        for name in list(data)[::2]:
            ns.unlink(ROOT, ns.root_ino, name)
            del data[name]
        eng.data.flush_all()
        report = clean(eng.data, eng.catalog)
        assert report.fragments_copied > 0, report
        offsets = eng.catalog.read(
            lambda c: c.execute(select(Fragment.__table__.c.zone_offset)).scalars().all()
        )
        assert all(off % 4096 == 0 for off in offsets)
        check_accounting(eng.catalog)
        eng.restart()
        assert eng.data.recovery_report.garbage_bytes == 0
        for name, payload in data.items():
            ino = eng.ns.lookup(ROOT, eng.ns.root_ino, name).ino
            assert eng.ns.read(ino, 0, len(payload)) == payload
    finally:
        eng.close()


def test_a_drive_never_has_more_zones_open_than_its_limit(sqlite_catalog, tmp_path):
    eng = Engine(sqlite_catalog, tmp_path / "lim")
    try:
        make(eng, "warm", os.urandom(STRIPE))  # opens a warm band on every drive
        drives = Drive.__table__
        eng.catalog.run(lambda c: c.execute(update(drives).values(max_open_zones=1)))
        eng.restart()
        space = eng.data.space
        drive = next(iter(space.drives.values()))
        with space.lock:
            assert drive.open_zones() == 1
            assert space.zone_for(drive, "cold", 4096) is None  # a second band would pass it
            drive.max_open_zones = 2
            second = space.zone_for(drive, "cold", 4096)
            assert second is not None and drive.open_zones() == 2
    finally:
        eng.close()
