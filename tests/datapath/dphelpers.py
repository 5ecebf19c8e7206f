"""Helpers of the data path tests: an engine a test can restart, accounting checks."""

from __future__ import annotations

from sqlalchemy import func, select

from engine.catalog.models import Extent, Stripe, Zone
from engine.coding.erasure import load_policies
from engine.datapath import DataPath
from engine.drives import format_emulated
from engine.namespace import Namespace

KiB, MiB = 1 << 10, 1 << 20
# small geometry keeps tests fast: 8+2 stripes of 8 x 64 KiB, zones of 1 MiB
SMALL = {
    "warm": {"fragment_size": 64 * KiB},
    "cold": {"fragment_size": 64 * KiB},
    "hot": {"fragment_size": 64 * KiB},
}


class Engine:
    """A catalog + drives + DataPath + Namespace that a test can restart."""

    def __init__(
        self,
        catalog,
        root,
        *,
        drives=10,
        drive_size=16 * MiB,
        zone_size=MiB,
        policies=SMALL,
        reserve_zones=2,
        smr_model=None,
        write_granularity=1,
        datapath_options=None,
    ):
        self.catalog = catalog
        self.root = root
        self.policies = load_policies(policies)
        self.reserve_zones = reserve_zones
        self.smr_model = smr_model
        self.datapath_options = dict(datapath_options or {})  # more DataPath keyword arguments
        self.drive_ids = format_emulated(
            catalog, root, drives, drive_size, zone_size, write_granularity=write_granularity
        )
        self.data = None
        self.ns = None
        self.start()

    def start(self):
        self.data = DataPath(
            self.catalog,
            self.policies,
            reserve_zones=self.reserve_zones,
            smr_model=self.smr_model,
            **self.datapath_options,
        )
        self.ns = Namespace(self.catalog, data=self.data)
        return self

    def restart(self):
        self.data.close()
        return self.start()

    def close(self):
        if self.data is not None:
            self.data.close()
            self.data = None


def check_accounting(catalog):
    """Zone and stripe accounting: wp == live + garbage per zone; stripe live
    == its extents' bytes; on SQLite, no row references a row that is gone."""
    zones, stripes, extents = Zone.__table__, Stripe.__table__, Extent.__table__

    def work(conn):
        bad_zones = conn.execute(
            select(
                zones.c.id, zones.c.write_pointer, zones.c.live_bytes, zones.c.garbage_bytes
            ).where(zones.c.write_pointer != zones.c.live_bytes + zones.c.garbage_bytes)
        ).all()
        live = dict(
            conn.execute(
                select(extents.c.stripe_id, func.sum(extents.c.length)).group_by(
                    extents.c.stripe_id
                )
            ).all()
        )
        recorded = dict(conn.execute(select(stripes.c.id, stripes.c.live_bytes)).all())
        negative = conn.execute(
            select(zones.c.id).where((zones.c.live_bytes < 0) | (zones.c.garbage_bytes < 0))
        ).all()
        orphans = []
        if conn.dialect.name == "sqlite":  # rows a bulk delete without the checks left behind
            orphans = conn.exec_driver_sql("PRAGMA foreign_key_check").all()
        return bad_zones, live, recorded, negative, orphans

    bad_zones, live, recorded, negative, orphans = catalog.read(work)
    assert not orphans, f"rows referencing rows that are gone: {orphans[:10]}"
    assert not bad_zones, f"zones whose write pointer != live + garbage: {bad_zones}"
    assert not negative, f"zones with negative accounting: {negative}"
    assert {k: int(v) for k, v in live.items()} == recorded, (
        "stripe live_bytes differ from their extents"
    )
