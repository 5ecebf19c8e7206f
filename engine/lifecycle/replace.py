"""Adding and replacing drives while the data path runs, then rebuilding onto them.

``add_drive`` makes the drive (a new folder becomes an emulated zone-file drive, as
``shingle init`` makes them; an existing zoned block device is taken as it is), records it in
the catalog, hands it to the running data path (``DataPath.add_drive``) and runs a rebuild,
so stripes that lost a fragment get it back on the new drive. ``replace_drive`` does the same
and retires the old drive: a readable one (online, degraded) is drained onto the others, a
missing one is marked failed and its fragments rebuilt from redundancy; once it holds no
fragment it becomes ``removed``.

Both end with the redundancy status. Stripes still under-protected afterwards (too few drives
for a stripe's width, no room, fewer than k fragments left) are reported as ``warnings``, and
the job that ran this ends "done with warnings" (engine/admin/jobs.py), saying how many and why."""

from __future__ import annotations

import os
import stat
from collections import Counter
from pathlib import Path

from sqlalchemy import func, select

from engine.admin.events import record
from engine.base import errors
from engine.catalog.database import Catalog
from engine.catalog.models import Drive, Fragment
from engine.drives import add_emulated, add_zoned_block
from engine.lifecycle import drives as drive_states
from engine.lifecycle.rebuild import Rebuilder, RebuildReport

DRIVES = Drive.__table__
FRAGMENTS = Fragment.__table__


def default_geometry(catalog: Catalog) -> tuple[int, int]:
    """(drive size, zone size) of the drives in use: a new emulated drive matches them."""
    rows = catalog.read(
        lambda conn: conn.execute(
            select(DRIVES.c.zone_size, DRIVES.c.zone_count).where(
                DRIVES.c.state != drive_states.REMOVED
            )
        ).all()
    )
    if not rows:
        raise errors.InvalidArgument(
            "no drive to copy the geometry of: give --size and --zone-size"
        )
    zone_size, zone_count = Counter((r.zone_size, r.zone_count) for r in rows).most_common(1)[0][0]
    return zone_size * zone_count, zone_size


def make_drive(
    catalog: Catalog,
    path: str,
    *,
    size: int | None = None,
    zone_size: int | None = None,
    preallocate: bool = True,
    min_zone_size: int = 0,
) -> int:
    """A new drive in the catalog from PATH: a block device, or a new folder of zone files.
    ``min_zone_size``: the largest fragment of the band classes (each must fit a zone)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if os.path.abspath(path).startswith("/dev/"):
            raise errors.NotFound(f"{path}: no such device") from None
        mode = None
    if mode is not None and stat.S_ISBLK(mode):
        return add_zoned_block(catalog, path, min_zone_size)
    taken = catalog.read(
        lambda conn: conn.execute(
            select(DRIVES.c.id).where(DRIVES.c.path == str(Path(path).resolve()))
        ).scalar()
    )
    if taken is not None:
        raise errors.InvalidArgument(f"{path} is already drive {taken}")
    if size and zone_size:
        drive_size, zone = size, zone_size
    else:
        default_size, default_zone = default_geometry(catalog)
        drive_size, zone = size or default_size, zone_size or default_zone
    if zone < min_zone_size:
        raise errors.InvalidArgument(
            f"zone size {zone}: expected at least {min_zone_size} bytes (the largest fragment)"
        )
    return add_emulated(catalog, Path(path), drive_size, zone, preallocate=preallocate)


def under_protection_warnings(datapath, report: RebuildReport) -> list[str]:
    """Why stripes are still under-protected after a rebuild, one line per cause."""
    status = report.status or drive_states.redundancy_status(datapath.catalog).to_dict()
    reduced = status.get("reduced", 0)
    if not reduced and not report.unrecoverable:
        return []
    writable = sum(1 for d in datapath.space.drives.values() if d.writable())
    widest = max(p.width for p in datapath.policies.values())
    why = []
    if writable < widest:
        why.append(
            f"only {writable} drives take writes and the widest stripe needs {widest} "
            "different drives: add drives (`shingle drives add PATH`)"
        )
    if report.unplaced and writable >= widest:
        why.append(
            f"{report.unplaced} fragments found no drive with room: free space or add drives"
        )
    if report.unrecoverable:
        why.append(
            f"{len(report.unrecoverable)} stripes have fewer readable fragments than they "
            "need and cannot be rebuilt"
        )
    if not why:
        why.append(
            "their fragments' drives are missing or degraded (not rebuilt until failed: "
            "`shingle drives fail ID` or `drives replace`)"
        )
    return [f"{reduced} stripes still under-protected: " + "; ".join(why)]


def rebuild_report(datapath, report: RebuildReport, **extra) -> dict:
    """A rebuild's report as a job result, with ``warnings`` when redundancy is not full."""
    out = {**extra, **report.to_dict()}
    out["warnings"] = under_protection_warnings(datapath, report)
    return out


def add_drive(
    datapath,
    catalog: Catalog,
    path: str,
    *,
    size: int | None = None,
    zone_size: int | None = None,
    preallocate: bool = True,
    progress=None,
    actor: str = "system",
    bytes_per_s: float | None = None,
) -> dict:
    drive_id = make_drive(
        catalog,
        path,
        size=size,
        zone_size=zone_size,
        preallocate=preallocate,
        min_zone_size=datapath.max_fragment,
    )
    datapath.add_drive(drive_id)
    record(
        catalog,
        "drive.added",
        f"drive {drive_id} added ({path})",
        actor=actor,
        details={"drive_id": drive_id, "path": path},
    )
    report = Rebuilder(datapath, catalog, bytes_per_s=bytes_per_s).run(
        progress=progress, actor=actor
    )
    return rebuild_report(datapath, report, drive=drive_id)


def retire_state(state: str) -> str | None:
    """The state an old drive takes when it is replaced (None: it already has it)."""
    if state in (drive_states.ONLINE, drive_states.DEGRADED):
        return drive_states.DRAINING  # still readable: copy its fragments off
    if state == drive_states.MISSING:
        return drive_states.FAILED  # unreadable: rebuild them from redundancy
    if state in (drive_states.DRAINING, drive_states.FAILED):
        return None
    raise errors.InvalidArgument(f"drive is {state}: there is nothing left to replace")


def replace_drive(
    datapath,
    catalog: Catalog,
    old: int | str,
    path: str,
    *,
    size: int | None = None,
    zone_size: int | None = None,
    preallocate: bool = True,
    progress=None,
    actor: str = "system",
    bytes_per_s: float | None = None,
) -> dict:
    current = drive_states.get_drive(catalog, old)
    target = retire_state(current.state)  # refuse before making anything
    drive_id = make_drive(
        catalog,
        path,
        size=size,
        zone_size=zone_size,
        preallocate=preallocate,
        min_zone_size=datapath.max_fragment,
    )
    datapath.add_drive(drive_id)
    if target is not None:
        drive_states.set_drive_state(
            catalog, current.id, target, actor=actor, reason=f"replaced by drive {drive_id}"
        )
    datapath.refresh_drive_states()
    record(
        catalog,
        "drive.replace",
        f"drive {current.id} is being replaced by drive {drive_id} ({path})",
        actor=actor,
        details={"old": current.id, "new": drive_id, "path": path},
    )
    report = Rebuilder(datapath, catalog, bytes_per_s=bytes_per_s).run(
        progress=progress, actor=actor
    )

    def retire(conn):
        state = conn.execute(select(DRIVES.c.state).where(DRIVES.c.id == current.id)).scalar_one()
        left = conn.execute(
            select(func.count()).select_from(FRAGMENTS).where(FRAGMENTS.c.drive_id == current.id)
        ).scalar_one()
        if state == drive_states.FAILED and not left:
            drive_states.set_drive_state_in(
                conn,
                current.id,
                drive_states.REMOVED,
                actor=actor,
                reason=f"replaced by drive {drive_id}",
            )
            return drive_states.REMOVED
        return state

    old_state = catalog.run(retire)
    datapath.refresh_drive_states()
    return rebuild_report(
        datapath, report, drive=drive_id, replaced=current.id, replaced_state=old_state
    )
