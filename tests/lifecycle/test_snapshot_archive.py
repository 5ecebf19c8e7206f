"""Archiving a snapshot to the cold tier: the stripes only it references move to cold stripes
(tiering's mover), shared ones stay; every byte reads back, live and through the snapshot."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from engine.admin import fsck
from engine.base import errors
from engine.catalog.models import Extent, Stripe
from engine.namespace import ROOT
from engine.snapshots.archive import archive_snapshot
from engine.snapshots.service import Snapshots
from tests.lifecycle.conftest import check_accounting, random_bytes

KiB = 1 << 10


def classes(rig, path: str) -> set[str]:
    ino = rig.ns.resolve(path).ino
    ext, st = Extent.__table__, Stripe.__table__
    return set(
        rig.catalog.read(
            lambda c: c.execute(
                select(st.c.band_class)
                .select_from(ext.join(st, st.c.id == ext.c.stripe_id))
                .where(ext.c.ino == ino)
            ).scalars()
        )
    )


def test_archive_moves_the_unique_stripes_to_cold_and_every_byte_reads_back(rig):
    old_a, b, c = random_bytes(300 * KiB, 1), random_bytes(200 * KiB, 2), random_bytes(90 * KiB, 3)
    rig.write_file("/ds/a", old_a)
    rig.write_file("/ds/b", b)
    rig.write_file("/ds/sub/c", c)
    snaps = Snapshots(rig.ns)
    snaps.create("/ds", "s1")
    new_a = random_bytes(300 * KiB, 4)
    rig.write_file("/ds/a", new_a)  # a's old stripes are the snapshot's alone now
    rig.ns.unlink(ROOT, rig.ns.resolve("/ds/sub").ino, "c")  # so are c's
    [info] = snaps.list("/ds", recount=True)
    assert info.unique_bytes >= len(old_a) + len(c)
    assert "cold" not in classes(rig, "/ds/.snapshots/s1/a")

    seen = []
    report = archive_snapshot(
        rig.ns, rig.data, "/ds", "s1", progress=lambda d, t, m: seen.append((d, t, m))
    )
    assert report.files == 3 and report.files_moved == 2
    assert report.bytes_moved == len(old_a) + len(c) == report.unique_bytes
    assert report.shared_bytes == len(b)  # shared with the live b: left where it is
    assert seen and "archived" in seen[-1][2]
    assert classes(rig, "/ds/.snapshots/s1/a") == {"cold"}
    assert classes(rig, "/ds/.snapshots/s1/sub/c") == {"cold"}
    assert "cold" not in classes(rig, "/ds/.snapshots/s1/b")
    assert classes(rig, "/ds/.snapshots/s1/b") == classes(rig, "/ds/b")
    assert "cold" not in classes(rig, "/ds/a")  # the live file was not touched

    def check_bytes():
        assert rig.read_file("/ds/.snapshots/s1/a") == old_a
        assert rig.read_file("/ds/.snapshots/s1/b") == b
        assert rig.read_file("/ds/.snapshots/s1/sub/c") == c
        assert rig.read_file("/ds/a") == new_a
        assert rig.read_file("/ds/b") == b

    check_bytes()
    check_accounting(rig.catalog)
    assert fsck.check(rig.catalog, rig.ns.root_ino).clean
    # a second archive finds nothing left to move; the space a delete frees is the same
    again = archive_snapshot(rig.ns, rig.data, "/ds", "s1")
    assert again.bytes_moved == 0 and again.already_cold_bytes == report.unique_bytes
    assert snaps.list("/ds", recount=True)[0].unique_bytes == info.unique_bytes
    rig.restart()
    check_bytes()  # from the cold stripes on the drives, not from a cache
    snaps = Snapshots(rig.ns)
    snaps.delete("/ds", "s1")
    check_accounting(rig.catalog)
    assert fsck.check(rig.catalog, rig.ns.root_ino).clean
    snaps.finish_deletions()
    check_accounting(rig.catalog)
    assert fsck.check(rig.catalog, rig.ns.root_ino).clean
    with pytest.raises(errors.NotFound):
        archive_snapshot(rig.ns, rig.data, "/ds", "s1")
