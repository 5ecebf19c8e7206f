"""A commit batch records the zones whose state changed (opened, filled, given back) from the set
the placements keep, not by walking every zone of every drive (hundreds of thousands on real
SMR drives, in every COMMIT's batch)."""

from __future__ import annotations

from dphelpers import MiB

from engine.catalog.database import in_list, sql_all
from engine.namespace import ROOT


def test_opened_zones_are_recorded_by_the_next_batch(sqlite_engine):
    eng = sqlite_engine
    space = eng.data.space
    assert space.dirty == {}
    ns = eng.ns
    ino = ns.create(ROOT, ns.root_ino, "f").ino
    ns.write(ino, 0, b"x" * MiB)
    ns.commit(ino)
    opened = {z.id for z in space.zones.values() if z.state == "open"}
    assert len(opened) == 10  # one stripe of 8 + 2 fragments
    assert space.dirty == {}  # recorded by the flush's batch
    rows = eng.catalog.read(
        lambda conn: sql_all(
            conn,
            f"SELECT id, state, band_class FROM zones WHERE id IN {in_list(opened)}",
            tuple(opened),
        )
    )
    assert sorted(rows) == sorted((z, "open", "warm") for z in opened)
    assert not any(z.dirty for z in space.zones.values())
