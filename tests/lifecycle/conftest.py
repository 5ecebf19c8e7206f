"""Fixtures for lifecycle tests on real emulated zoned drives (folders of zone files)."""

from __future__ import annotations

import hashlib
import os
import shutil

import pytest
from sqlalchemy import func, select

from engine.base import errors
from engine.catalog.models import Extent, Fragment, Stripe, Zone
from engine.coding.erasure import load_policies
from engine.datapath import DataPath
from engine.drives import format_emulated
from engine.namespace import ROOT, Namespace

KiB, MiB = 1 << 10, 1 << 20
# small geometry: warm/cold 4+2 stripes of 4 x 16 KiB, hot 3 copies, zones of 256 KiB
SMALL = {
    "hot": {"fragment_size": 16 * KiB},
    "warm": {"k": 4, "m": 2, "fragment_size": 16 * KiB},
    "cold": {"k": 4, "m": 2, "fragment_size": 16 * KiB, "compression": None},
}


class Rig:
    """Catalog + emulated drives + DataPath + Namespace, restartable."""

    def __init__(
        self,
        catalog,
        root,
        *,
        drives=8,
        zones=24,
        zone_size=256 * KiB,
        policies=SMALL,
        reserve_zones=2,
    ):
        self.catalog = catalog
        self.root = root
        self.policies = load_policies(policies)
        self.reserve_zones = reserve_zones
        self.drive_ids = format_emulated(catalog, root, drives, zones * zone_size, zone_size)
        self.start()

    def start(self):
        self.data = DataPath(self.catalog, self.policies, reserve_zones=self.reserve_zones)
        self.ns = Namespace(self.catalog, data=self.data)
        return self

    def restart(self):
        self.data.close()
        return self.start()

    def close(self):
        if self.data is not None:
            self.data.close()
            self.data = None
        # zone files are preallocated: do not leave hundreds of MiB per test in
        # pytest's kept temp dirs
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.rmtree(self.root.parent / "spare", ignore_errors=True)

    # -- helpers -------------------------------------------------------------------
    def write_file(self, path: str, data: bytes, chunk: int = 1 << 20):
        parts = [p for p in path.split("/") if p]
        attr = self.ns.getattr(self.ns.root_ino)
        for part in parts[:-1]:
            try:
                attr = self.ns.lookup(ROOT, attr.ino, part)
            except errors.NotFound:
                attr = self.ns.mkdir(ROOT, attr.ino, part)
        made = self.ns.create(ROOT, attr.ino, parts[-1], exclusive=False)
        for pos in range(0, len(data), chunk):
            self.ns.write(made.ino, pos, data[pos : pos + chunk])
        self.ns.commit(made.ino)
        return made

    def read_file(self, path: str) -> bytes:
        attr = self.ns.resolve(path)
        return self.ns.read(attr.ino, 0, attr.size)

    def fragments(self):
        table = Fragment.__table__
        return self.catalog.read(lambda c: c.execute(select(table)).all())


def random_bytes(n: int, seed: int) -> bytes:
    """Incompressible, reproducible bytes."""
    out = bytearray()
    block = hashlib.sha256(seed.to_bytes(8, "little")).digest()
    while len(out) < n:
        block = hashlib.sha256(block).digest()
        out += block * 8
    return bytes(out[:n])


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check_accounting(catalog):
    """Every zone: write_pointer == live + garbage, live == recount of its fragments' live shares;
    every stripe: live_bytes == the bytes its extents reference."""
    zones, stripes, extents, fragments = (
        Zone.__table__,
        Stripe.__table__,
        Extent.__table__,
        Fragment.__table__,
    )

    def work(conn):
        zone_rows = conn.execute(
            select(zones.c.id, zones.c.write_pointer, zones.c.live_bytes, zones.c.garbage_bytes)
        ).all()
        live = dict(
            conn.execute(
                select(extents.c.stripe_id, func.sum(extents.c.length)).group_by(
                    extents.c.stripe_id
                )
            ).all()
        )
        stripe_rows = {
            r.id: r
            for r in conn.execute(select(stripes.c.id, stripes.c.live_bytes, stripes.c.data_length))
        }
        frag_rows = conn.execute(
            select(fragments.c.stripe_id, fragments.c.zone_id, fragments.c.length)
        ).all()
        return zone_rows, live, stripe_rows, frag_rows

    zone_rows, live, stripe_rows, frag_rows = catalog.read(work)
    bad = [
        z
        for z in zone_rows
        if z.write_pointer != z.live_bytes + z.garbage_bytes or z.garbage_bytes < 0
    ]
    assert not bad, f"zones whose write pointer != live + garbage: {bad[:5]}"
    assert {k: int(v) for k, v in live.items()} == {
        k: r.live_bytes for k, r in stripe_rows.items()
    }, "stripe live_bytes differ from their extents"
    recount: dict[int, int] = {}
    for f in frag_rows:
        s = stripe_rows[f.stripe_id]
        # shared extents: references past the stripe's size count it as full (accounting.share)
        live_share = f.length * min(s.live_bytes, s.data_length) // s.data_length
        recount[f.zone_id] = recount.get(f.zone_id, 0) + live_share
    mismatched = [
        (z.id, z.live_bytes, recount.get(z.id, 0))
        for z in zone_rows
        if z.live_bytes != recount.get(z.id, 0)
    ]
    assert not mismatched, (
        f"zone live bytes differ from a recount (zone, recorded, recount): {mismatched[:5]}"
    )


def flip_bits(rig, fragment_row, at: int = 100):
    """Corrupt a fragment on the medium: flip a byte in its zone file."""
    drive = rig.data.space.drives[fragment_row.drive_id]
    zone = rig.data.space.zones[fragment_row.zone_id]
    path = os.path.join(drive.path, f"zone-{zone.idx:06d}")
    with open(path, "r+b") as fh:
        fh.seek(fragment_row.zone_offset + at)
        byte = fh.read(1)
        fh.seek(fragment_row.zone_offset + at)
        fh.write(bytes([byte[0] ^ 0xFF]))
    rig.data.invalidate_stripes([fragment_row.stripe_id])


@pytest.fixture
def rig(sqlite_catalog, tmp_path):
    r = Rig(sqlite_catalog, tmp_path / "drives")
    yield r
    r.close()


@pytest.fixture
def rig_factory(sqlite_catalog, tmp_path):
    made = []

    def make(**kwargs):
        r = Rig(sqlite_catalog, tmp_path / f"drives{len(made)}", **kwargs)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()
