"""What the admin sees of drives and zones (bands): devices, band maps, usage by band class.

Read-only catalog queries for the web UI's dashboard, drives, tiers and /metrics
pages, grouped in SQL so that an 80,000-zone drive costs a few thousand rows.
Drive states and their changes are engine.lifecycle.drives; SMART is
engine.admin.health."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import and_, case, func, select

from engine.base import errors
from engine.catalog.database import Catalog
from engine.catalog.models import Drive, Stripe, Zone

DRIVES = Drive.__table__
ZONES = Zone.__table__
STRIPES = Stripe.__table__
ZONE_KINDS = ("empty", "open", "full", "garbage", "offline")


def drive_devices(catalog: Catalog) -> dict[int, str | None]:
    """drive id -> its block device as configured (None for most emulated drives)."""
    return dict(catalog.read(lambda c: c.execute(select(DRIVES.c.id, DRIVES.c.device)).all()))


def drive_device(catalog: Catalog, drive_id: int) -> str | None:
    """One drive's configured block device (None if it has none); NotFound for no such drive."""
    query = select(DRIVES.c.device).where(DRIVES.c.id == drive_id)
    row = catalog.read(lambda c: c.execute(query).first())
    if row is None:
        raise errors.NotFound(f"no drive with id {drive_id}")
    return row[0]


def _kind_column():
    """A zone's kind as the band map shows it: a full zone with more garbage than live data is
    "garbage"; empty, open and full as they are; anything else "offline"."""
    mostly_garbage = and_(ZONES.c.state == "full", ZONES.c.garbage_bytes > ZONES.c.live_bytes)
    return case(
        (mostly_garbage, "garbage"),
        (ZONES.c.state.in_(("empty", "open", "full")), ZONES.c.state),
        else_="offline",
    )


@dataclass(frozen=True)
class BandMapRows:
    """The rows of a drive's band map: with ``group`` None one row per zone (idx, state,
    band_class, write_pointer, live_bytes, garbage_bytes, zone_size); else runs of ``group``
    zones, one row per (cell, kind, band_class) with the count ``n`` and the bytes ``written``."""

    group: int | None
    zone_size: int
    rows: list


def band_map_rows(catalog: Catalog, drive_id: int, max_cells: int) -> BandMapRows:
    def work(conn):
        row = conn.execute(
            select(DRIVES.c.zone_count, DRIVES.c.zone_size).where(DRIVES.c.id == drive_id)
        ).first()
        if row is None:
            raise errors.NotFound(f"no drive with id {drive_id}")
        if row.zone_count <= max_cells:
            return BandMapRows(
                None,
                row.zone_size,
                [
                    dict(r._mapping)
                    for r in conn.execute(
                        select(
                            ZONES.c.idx,
                            ZONES.c.state,
                            ZONES.c.band_class,
                            ZONES.c.write_pointer,
                            ZONES.c.live_bytes,
                            ZONES.c.garbage_bytes,
                            DRIVES.c.zone_size,
                        )
                        .select_from(ZONES.join(DRIVES, DRIVES.c.id == ZONES.c.drive_id))
                        .where(ZONES.c.drive_id == drive_id)
                        .order_by(ZONES.c.idx)
                    )
                ],
            )
        group = -(-row.zone_count // max_cells)
        # floor division: SQLAlchemy 2 makes "/" true division
        cell = (ZONES.c.idx // group).label("cell")
        kind = _kind_column().label("kind")
        rows = conn.execute(
            select(
                cell,
                kind,
                ZONES.c.band_class,
                func.count().label("n"),
                func.sum(ZONES.c.write_pointer).label("written"),
            )
            .where(ZONES.c.drive_id == drive_id)
            .group_by(cell, kind, ZONES.c.band_class)
        ).all()
        return BandMapRows(group, row.zone_size, rows)

    return catalog.read(work)


def band_counts(catalog: Catalog, drive_id: int) -> dict[str, dict[str, int]]:
    """kind (empty/open/full/garbage/offline) -> band class ("-" for none) -> zones."""
    kind = _kind_column().label("kind")

    def work(conn):
        return conn.execute(
            select(kind, ZONES.c.band_class, func.count())
            .where(ZONES.c.drive_id == drive_id)
            .group_by(kind, ZONES.c.band_class)
        ).all()

    out: dict[str, dict[str, int]] = {}
    for k, cls, n in catalog.read(work):
        out.setdefault(k, {})[cls or "-"] = int(n)
    return out


def usage_by_class(catalog: Catalog) -> dict[str, dict[str, int]]:
    """band class -> zones, written_bytes, live_bytes, garbage_bytes of the zones it holds."""

    def work(conn):
        return conn.execute(
            select(
                ZONES.c.band_class,
                func.count(),
                func.sum(ZONES.c.write_pointer),
                func.sum(ZONES.c.live_bytes),
                func.sum(ZONES.c.garbage_bytes),
            )
            .where(ZONES.c.band_class.is_not(None))
            .group_by(ZONES.c.band_class)
        ).all()

    return {
        r[0]: {
            "zones": int(r[1]),
            "written_bytes": int(r[2] or 0),
            "live_bytes": int(r[3] or 0),
            "garbage_bytes": int(r[4] or 0),
        }
        for r in catalog.read(work)
    }


def bands_by_state(catalog: Catalog) -> list[tuple[str, str | None, int, int, int]]:
    """(zone state, band class or None, zones, live bytes, garbage bytes) for every pair."""

    def work(conn):
        return conn.execute(
            select(
                ZONES.c.state,
                ZONES.c.band_class,
                func.count(),
                func.sum(ZONES.c.live_bytes),
                func.sum(ZONES.c.garbage_bytes),
            ).group_by(ZONES.c.state, ZONES.c.band_class)
        ).all()

    return [(r[0], r[1], int(r[2]), int(r[3] or 0), int(r[4] or 0)) for r in catalog.read(work)]


def compression_by_class(catalog: Catalog) -> dict[str, dict]:
    """band class -> stripes, compressed (how many are), data_bytes (user bytes they hold),
    stored_bytes (what their fragments encode: compressed frames and raw stripes) and ratio
    (data per stored byte, 1.0 where nothing is compressed), over the stripes that exist."""
    stored = func.coalesce(STRIPES.c.stored_length, STRIPES.c.data_length)

    def work(conn):
        return conn.execute(
            select(
                STRIPES.c.band_class,
                func.count(),
                func.sum(case((STRIPES.c.compression.is_not(None), 1), else_=0)),
                func.sum(STRIPES.c.data_length),
                func.sum(stored),
            ).group_by(STRIPES.c.band_class)
        ).all()

    out = {}
    for band_class, count, compressed, data, kept in catalog.read(work):
        data, kept = int(data or 0), int(kept or 0)
        out[band_class] = {
            "stripes": int(count),
            "compressed": int(compressed or 0),
            "data_bytes": data,
            "stored_bytes": kept,
            "ratio": data / kept if kept else 1.0,
        }
    return out
