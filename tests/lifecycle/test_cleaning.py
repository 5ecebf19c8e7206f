"""Band cleaning end to end on emulated zoned drives."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from engine.admin.events import recent
from engine.base import errors
from engine.catalog.models import Zone
from engine.lifecycle.cleaning import Cleaner, cost_benefit, pick_victims
from engine.namespace import ROOT

from .conftest import KiB, check_accounting, flip_bits, random_bytes, sha


def test_cost_benefit_prefers_old_and_empty_bands():
    assert cost_benefit(0, 100, 10) == 10
    assert cost_benefit(50, 100, 10) == pytest.approx(0.5 * 10 / 1.5)
    assert cost_benefit(100, 100, 1000) == 0
    # an old half-live band beats a young nearly-dead one
    assert cost_benefit(50, 100, 3600) > cost_benefit(10, 100, 60)
    assert cost_benefit(10, 0, 5) == 0.0


def zone_states(catalog):
    table = Zone.__table__
    return catalog.read(
        lambda c: c.execute(select(table.c.state, table.c.write_pointer, table.c.live_bytes)).all()
    )


def fill(rig, prefix, count, size):
    files = {}
    for i in range(count):
        data = random_bytes(size, hash((prefix, i)) & 0xFFFF)
        rig.write_file(f"/{prefix}/f{i:03d}", data)
        files[f"/{prefix}/f{i:03d}"] = data
    return files


def delete(rig, paths):
    for path in paths:
        parent, name = path.rsplit("/", 1)
        rig.ns.unlink(ROOT, rig.ns.resolve(parent or "/").ino, name)


def test_cleaning_frees_half_dead_zones_and_keeps_every_byte(rig):
    files = fill(rig, "a", 24, 128 * KiB)
    doomed = sorted(files)[::2]
    delete(rig, doomed)
    kept = {p: d for p, d in files.items() if p not in doomed}
    check_accounting(rig.catalog)
    victims = pick_victims(rig.catalog)
    assert victims and all(0 < v.utilization < 0.9 for v in victims)
    assert [v.score for v in victims] == sorted((v.score for v in victims), reverse=True)
    empty_before = sum(1 for z in zone_states(rig.catalog) if z.state == "empty")
    seen = []
    report = Cleaner(rig.data, rig.catalog).run(
        progress=lambda d, t, m: seen.append(m), actor="cron"
    )
    assert report.zones_cleaned == len(victims) and report.zones_reset >= report.zones_cleaned
    assert report.bytes_copied > 0 and report.bytes_freed > report.bytes_copied
    empty_after = sum(1 for z in zone_states(rig.catalog) if z.state == "empty")
    # cleaning frees zones net of the bands it filled with the copies
    assert empty_after > empty_before
    assert not [
        z
        for z in zone_states(rig.catalog)
        if z.state == "full" and z.live_bytes == 0 and z.write_pointer
    ]
    check_accounting(rig.catalog)
    for path, data in kept.items():
        assert sha(rig.read_file(path)) == sha(data), path
    rig.restart()
    for path, data in kept.items():
        assert sha(rig.read_file(path)) == sha(data), path
    assert recent(rig.catalog, kind_prefix="clean.run")[0].actor == "cron"
    assert seen and "cleaning" in seen[-1]


def test_full_volume_recovers_through_cleaning_not_deadlock(rig_factory):
    rig = rig_factory(drives=7, zones=10)
    files = {}
    i = 0
    with pytest.raises(errors.NoSpace):
        while True:  # fill the volume until a write is refused
            data = random_bytes(96 * KiB, 1000 + i)
            rig.write_file(f"/v/f{i:03d}", data)
            files[f"/v/f{i:03d}"] = data
            i += 1
    doomed = sorted(files)[::2]
    delete(rig, doomed)
    for path in doomed:
        files.pop(path)
    # half of every band is garbage but no band is empty: writes still fail
    with pytest.raises(errors.NoSpace):
        rig.write_file("/v/more", random_bytes(400 * KiB, 5))
    report = Cleaner(rig.data, rig.catalog).run()
    assert report.zones_reset > 0
    more = random_bytes(400 * KiB, 6)
    rig.write_file("/v/more2", more)
    assert sha(rig.read_file("/v/more2")) == sha(more)
    for path, data in files.items():
        assert sha(rig.read_file(path)) == sha(data), path
    check_accounting(rig.catalog)


def test_cleaning_rebuilds_a_bad_fragment_instead_of_copying_it(rig):
    files = fill(rig, "b", 10, 128 * KiB)
    delete(rig, sorted(files)[1::2])
    victim = pick_victims(rig.catalog)[0]
    bad = next(f for f in rig.fragments() if f.zone_id == victim.zone_id)
    flip_bits(rig, bad)
    report = Cleaner(rig.data, rig.catalog).run(max_zones=1)
    assert report.zones_cleaned == 1
    moved = next(f for f in rig.fragments() if f.id == bad.id)
    assert moved.zone_id != victim.zone_id and moved.checksum == bad.checksum
    for path, data in files.items():
        if path in sorted(files)[::2]:
            assert sha(rig.read_file(path)) == sha(data)
    check_accounting(rig.catalog)
