"""Crash recovery: each zone's medium write pointer against the catalog's (run at start)."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.catalog.models import Zone
from engine.drives.zoned import CLOSED, EXPLICIT_OPEN, IMPLICIT_OPEN, OFFLINE, READ_ONLY

ZONES = Zone.__table__


@dataclass
class RecoveryReport:
    drives: int = 0
    missing_drives: list = field(default_factory=list)
    zones_checked: int = 0
    zones_with_garbage: int = 0
    garbage_bytes: int = 0
    short_zones: list = field(default_factory=list)  # (drive id, zone idx, catalog wp, medium wp)
    zones_reset: int = 0
    zones_finished: int = 0  # full in the catalog, still open on the device: finished now
    # (drive id, zone idx, condition): zones the device reports read-only or offline (a zoned
    # block device's fault): never written again; their drive becomes degraded (core.py)
    faulty_zones: list = field(default_factory=list)

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def recover(catalog, space) -> RecoveryReport:
    """Bytes past the committed write pointer come from a flush that never committed: they
    become garbage of the zone, never referenced, and new appends go after them. A zone shorter
    than the catalog says is reported (and never appended to again)."""
    report = RecoveryReport(drives=len(space.drives))
    updates = []
    with space.lock:
        for drive in space.drives.values():
            if drive.backend is None or not drive.present():
                report.missing_drives.append(drive.id)
                continue
            updates += recover_drive(space, drive, report)
    record_updates(catalog, updates)
    return report


def recover_drive(space, drive, report: RecoveryReport) -> list[tuple[int, dict]]:
    """Compare one drive's zones with the catalog (caller holds ``space.lock``; the drive takes
    no writes meanwhile): at start, and when a missing drive comes back (drivewatch.py).
    Returns the zone rows to update (``record_updates``)."""
    updates = []
    drive.open.clear()
    drive.empty.clear()
    condition = getattr(drive.backend, "condition", None)  # zoned block devices report one
    for zone in drive.zones:
        if not space.owns(zone.idx):
            # another head's zone (heads.count > 1): that head appends to it and recovers it;
            # this one only reads the fragments the catalog names there
            zone.wp = max(zone.wp, zone.committed_wp)
            continue
        report.zones_checked += 1
        faulty = condition(zone.idx) if condition is not None else None
        medium = drive.backend.write_pointer(zone.idx)
        values = {}
        if medium > zone.committed_wp:
            extra = medium - zone.committed_wp
            report.zones_with_garbage += 1
            report.garbage_bytes += extra
            values = {
                "write_pointer": medium,
                "garbage_bytes": ZONES.c.garbage_bytes + extra,
            }
            if zone.state == "empty":
                values["state"] = zone.state = "full"  # only garbage: reclaimable
            zone.committed_wp = medium
        elif medium < zone.committed_wp:
            report.short_zones.append((drive.id, zone.idx, zone.committed_wp, medium))
            zone.state = "full"  # never append where the catalog believes data lives
            values = {"state": "full"}
        zone.wp = max(medium, zone.committed_wp)
        if faulty in (READ_ONLY, OFFLINE):
            report.faulty_zones.append((drive.id, zone.idx, faulty))
            if zone.state != "full":
                values["state"] = zone.state = "full"
        if values:
            updates.append((zone.id, values))
        if zone.state == "empty" and zone.wp == 0:
            drive.empty.add(zone.idx)
        elif (
            zone.state == "open"
            and zone.band_class in space.policies
            and zone.band_class not in drive.open
            and zone.wp < drive.zone_size
        ):
            drive.open[zone.band_class] = zone
        elif zone.state == "open":
            zone.state = "full"
            updates.append((zone.id, {"state": "full"}))
        if zone.state == "full" and _still_open(drive.backend, zone.idx):
            # a zoned device counts an open or closed zone against its active-zone limit
            # until it is finished (the crash came between "full" and the finish)
            drive.backend.finish_zone(zone.idx)
            report.zones_finished += 1
    return updates


def _still_open(backend, idx: int) -> bool:
    condition = getattr(backend, "condition", None)
    return condition is not None and condition(idx) in (IMPLICIT_OPEN, EXPLICIT_OPEN, CLOSED)


def record_updates(catalog, updates: list[tuple[int, dict]]) -> None:
    def work(conn):
        for zone_id, values in updates:
            conn.execute(ZONES.update().where(ZONES.c.id == zone_id).values(**values))

    if updates:
        catalog.run(work, durable=True)
