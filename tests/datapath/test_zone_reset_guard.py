"""Invariant 6: a zone is reset only when no committed extent points into it.

A stripe whose live bytes are few can round its fragments' live share down to
zero, so a zone's live_bytes counter alone must not decide a reset."""

from __future__ import annotations

from dphelpers import MiB
from sqlalchemy import select

from engine.catalog.models import Zone
from engine.namespace import ROOT


def test_tiny_live_remainder_keeps_its_zones(sqlite_engine):
    eng = sqlite_engine
    ns = eng.ns
    f = ns.create(ROOT, ns.root_ino, "f")
    payload = bytes(range(256)) * (2 * MiB // 256)
    ns.write(f.ino, 0, payload, stable=True)
    ns.setattr(ROOT, f.ino, size=1)  # one live byte left in the first stripe
    zones = Zone.__table__
    zero_live_but_referenced = eng.catalog.read(
        lambda c: (
            c.execute(select(zones.c.id).where(zones.c.live_bytes == 0, zones.c.write_pointer > 0))
            .scalars()
            .all()
        )
    )
    assert zero_live_but_referenced, "the rounding case this test guards did not arise"
    eng.data.space.reclaim_zones()
    assert ns.read(f.ino, 0, 10) == payload[:1]
    eng.restart()
    assert eng.ns.read(f.ino, 0, 10) == payload[:1]
