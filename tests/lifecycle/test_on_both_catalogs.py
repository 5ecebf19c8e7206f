"""Scrub, rebuild, cleaning and tiering once more on both catalogs (SQLite and PostgreSQL)."""

from __future__ import annotations

from engine.lifecycle import drives as drive_states
from engine.lifecycle.cleaning import Cleaner
from engine.lifecycle.rebuild import rebuild
from engine.lifecycle.scrub import Scrubber
from engine.lifecycle.tiering import Tiering, TieringPolicy
from engine.namespace import ROOT

from .conftest import KiB, Rig, check_accounting, flip_bits, random_bytes, sha


def test_lifecycle_round_on_each_catalog(catalog, tmp_path):
    rig = Rig(catalog, tmp_path / "drives")
    try:
        files = {f"/m/f{i}": random_bytes(140 * KiB, 40 + i) for i in range(10)}
        for path, data in files.items():
            rig.write_file(path, data)
        for path in sorted(files)[::2]:
            rig.ns.unlink(ROOT, rig.ns.resolve("/m").ino, path.rsplit("/", 1)[1])
            files.pop(path)
        flip_bits(rig, rig.fragments()[-1])
        assert Scrubber(rig.data, rig.catalog).run().repaired == 1
        assert Cleaner(rig.data, rig.catalog).run().zones_cleaned > 0
        pinned = sorted(files)[0]
        from engine.catalog.models import Inode

        table = Inode.__table__
        ino = rig.ns.resolve(pinned).ino
        rig.catalog.run(
            lambda c: c.execute(table.update().where(table.c.ino == ino).values(band_class="cold"))
        )
        assert Tiering(rig.ns, rig.data, rig.catalog, TieringPolicy()).run().moves == {
            "warm->cold": 1
        }
        drive_states.fail_drive(rig.catalog, rig.drive_ids[0])
        assert rebuild(rig.data, rig.catalog).status["reduced"] == 0
        check_accounting(rig.catalog)
        rig.restart()
        for path, data in files.items():
            assert sha(rig.read_file(path)) == sha(data), path
    finally:
        rig.close()
