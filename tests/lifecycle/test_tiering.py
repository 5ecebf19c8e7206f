"""Tiering between hot, warm and cold classes end to end on emulated zoned drives."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from engine.admin.events import recent
from engine.base import errors
from engine.catalog.models import Extent, Inode, Stripe
from engine.lifecycle.tiering import ReadTracker, Tiering, TieringPolicy
from engine.namespace import ROOT, Namespace
from engine.snapshots.retention import RetentionService

from .conftest import KiB, check_accounting, random_bytes, sha


def pin(rig, path, band_class):
    ino = rig.ns.resolve(path).ino
    table = Inode.__table__
    rig.catalog.run(
        lambda c: c.execute(table.update().where(table.c.ino == ino).values(band_class=band_class))
    )
    return ino


def classes_of(rig, path):
    ino = rig.ns.resolve(path).ino
    ext, st = Extent.__table__, Stripe.__table__
    rows = rig.catalog.read(
        lambda c: c.execute(
            select(st.c.id, st.c.band_class)
            .select_from(ext.join(st, st.c.id == ext.c.stripe_id))
            .where(ext.c.ino == ino)
        ).all()
    )
    return {r.band_class for r in rows}, len({r.id for r in rows})


def write_hot(rig, path, data, chunk):
    """A file written in small pieces while pinned hot (as small writes land), then unpinned."""
    made = rig.write_file(path, b"")
    pin(rig, path, "hot")
    for pos in range(0, len(data), chunk):
        rig.ns.write(made.ino, pos, data[pos : pos + chunk], stable=True)
    pin(rig, path, None)
    return made


def test_hot_to_warm_coalesces_small_writes_and_keeps_times(rig):
    data = random_bytes(150 * KiB, 1)
    write_hot(rig, "/ds/shard0", data, 10 * KiB)
    before_classes, before_stripes = classes_of(rig, "/ds/shard0")
    assert before_classes == {"hot"} and before_stripes >= 15
    attr = rig.ns.resolve("/ds/shard0")
    tiering = Tiering(rig.ns, rig.data, rig.catalog, TieringPolicy(hot_to_warm_after_s=3600))
    assert tiering.plan() == []  # changed just now
    tiering = Tiering(rig.ns, rig.data, rig.catalog, TieringPolicy(hot_to_warm_after_s=0))
    [move] = tiering.plan()
    assert (move.source, move.target, move.nbytes) == ("hot", "warm", len(data))
    seen = []
    report = tiering.run(progress=lambda d, t, m: seen.append((d, t)), actor="cron")
    assert (
        report.files_moved == 1
        and report.moves == {"hot->warm": 1}
        and report.bytes_moved == len(data)
    )
    after_classes, after_stripes = classes_of(rig, "/ds/shard0")
    stripe_size = rig.data.policies["warm"].stripe_size
    assert after_classes == {"warm"} and after_stripes == -(-len(data) // stripe_size)
    assert sha(rig.read_file("/ds/shard0")) == sha(data)
    same = rig.ns.resolve("/ds/shard0")
    assert (same.mtime_ns, same.ctime_ns, same.size) == (attr.mtime_ns, attr.ctime_ns, attr.size)
    check_accounting(rig.catalog)
    assert seen[-1][0] == seen[-1][1]
    assert recent(rig.catalog, kind_prefix="tier.run")[0].details["moves"] == {"hot->warm": 1}
    rig.restart()
    assert sha(rig.read_file("/ds/shard0")) == sha(data)
    assert Tiering(rig.ns, rig.data, rig.catalog, TieringPolicy(hot_to_warm_after_s=0)).plan() == []


def test_retention_cold_pin_and_path_rules_move_data_to_cold(rig):
    for step in range(1, 4):
        rig.write_file(f"/ckpt/step-{step}/model.pt", random_bytes(90 * KiB, step))
        rig.ns.setattr(ROOT, rig.ns.resolve(f"/ckpt/step-{step}").ino, mtime_ns=step * 10**9)
    archive = random_bytes(70 * KiB, 9)
    rig.write_file("/archive/old/run.tar", archive)
    retention = RetentionService(rig.ns, rig.catalog)
    retention.add_rule("/ckpt/step-*", keep=1, action="cold")
    assert [r.outcome for r in retention.run()] == ["done", "done"]
    policy = TieringPolicy(hot_to_warm_after_s=0, path_rules=[("/archive", "cold")])
    report = Tiering(rig.ns, rig.data, rig.catalog, policy).run()
    assert report.moves == {"warm->cold": 3}
    assert classes_of(rig, "/ckpt/step-1/model.pt")[0] == {"cold"}
    assert classes_of(rig, "/ckpt/step-2/model.pt")[0] == {"cold"}
    assert classes_of(rig, "/ckpt/step-3/model.pt")[0] == {"warm"}
    assert classes_of(rig, "/archive/old/run.tar")[0] == {"cold"}
    assert sha(rig.read_file("/archive/old/run.tar")) == sha(archive)
    check_accounting(rig.catalog)
    with pytest.raises(errors.InvalidArgument, match="path rule"):
        TieringPolicy(path_rules=[("archive", "cold")]).validate()


def test_cold_files_read_often_come_back_to_warm(rig):
    data = random_bytes(80 * KiB, 4)
    rig.write_file("/old/ds", data)
    pin(rig, "/old/ds", "cold")
    Tiering(rig.ns, rig.data, rig.catalog, TieringPolicy()).run()
    assert classes_of(rig, "/old/ds")[0] == {"cold"}
    pin(rig, "/old/ds", None)
    clock = [1000.0]
    reads = ReadTracker(rig.data, clock=lambda: clock[0])  # the data path's read hook from now on
    ns = Namespace(rig.catalog, data=rig.data)
    ino = ns.resolve("/old/ds").ino
    tiering = Tiering(
        ns, rig.data, rig.catalog, TieringPolicy(promote_reads=3, promote_window_s=600), reads=reads
    )
    for _ in range(2):
        assert ns.read(ino, 0, 4096) == data[:4096]
        ns.read(ino, 4096, 4096)  # same burst: counted once
        clock[0] += 10
    assert tiering.plan() == []
    ns.read(ino, 0, 10)
    [move] = tiering.plan()
    assert (move.source, move.target) == ("cold", "warm") and "read 3 times" in move.reason
    counted = reads.reads_since(ino, 600)
    assert tiering.run().moves == {"cold->warm": 1}
    assert reads.reads_since(ino, 600) == counted, "tiering's own reads of the file were counted"
    assert classes_of(rig, "/old/ds")[0] == {"warm"}
    assert sha(ns.read(ino, 0, len(data))) == sha(data)


def test_a_file_changed_during_the_move_keeps_its_new_data(rig):
    data = random_bytes(100 * KiB, 5)
    made = write_hot(rig, "/f", data, 20 * KiB)
    tiering = Tiering(rig.ns, rig.data, rig.catalog, TieringPolicy(hot_to_warm_after_s=0))
    real_read = rig.data.read
    patch = b"X" * 5000

    def read_then_write(ino, offset, length, size, **how):
        out = real_read(ino, offset, length, size, **how)
        if offset == 0:  # a client overwrites the start while the mover copies
            rig.ns.write(made.ino, 0, patch, stable=True)
        return out

    rig.data.read = read_then_write
    try:
        moved, _written = tiering.move_file(made.ino, "warm")
    finally:
        rig.data.read = real_read
    assert moved == 0
    assert rig.read_file("/f") == patch + data[len(patch) :]
    check_accounting(rig.catalog)
    # next round it moves
    assert tiering.run().files_moved == 1
    assert rig.read_file("/f") == patch + data[len(patch) :]
    assert classes_of(rig, "/f")[0] == {"warm"}
    check_accounting(rig.catalog)


def test_full_volume_ends_the_round_instead_of_failing(rig_factory):
    """ENOSPC ends a tiering round (cleaning must free zones first); the job does not fail."""
    rig = rig_factory(drives=8, zones=12)
    data = random_bytes(150 * KiB, 7)
    write_hot(rig, "/ds/shard0", data, 10 * KiB)
    filler, n = random_bytes(256 * KiB, 8), 0
    with pytest.raises(errors.NoSpace):
        while True:  # fill the volume with warm data until the data path refuses
            rig.write_file(f"/fill/{n}", filler)
            n += 1
    report = Tiering(rig.ns, rig.data, rig.catalog, TieringPolicy(hot_to_warm_after_s=0)).run()
    assert report.files_moved == 0 and report.files_skipped >= 1
    assert sha(rig.read_file("/ds/shard0")) == sha(data)  # still whole, still hot
    assert classes_of(rig, "/ds/shard0")[0] == {"hot"}
