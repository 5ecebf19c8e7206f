"""Zoned drives: the model, the zone-file, zoned-block and agent backends, the SMR cost model.

``format_emulated`` makes drives as folders of zone files (tests, the default
install, and drive-managed SMR / CMR disks with XFS or ext4);
``add_agent_drives`` records the drives a drive agent on another host serves (remote.py);
``open_drive`` opens the backend named by a Drive catalog row. The catalog is imported only by
the functions that write rows: the drive agent (appliance/agent/) uses the backends without it."""

from __future__ import annotations

import os
import time
import uuid as uuidlib
from pathlib import Path

from engine.base.errors import ConfigError
from engine.drives.smr import SmrModel, SmrParams
from engine.drives.zoned import DriveMissing, ZonedDrive, ZoneError, ZoneInfo
from engine.drives.zonefile import ZoneFileDrive

__all__ = [
    "format_emulated",
    "add_emulated",
    "add_zoned_block",
    "check_zoned_block",
    "add_agent_drives",
    "open_drive",
    "ZonedDrive",
    "ZoneFileDrive",
    "ZoneInfo",
    "ZoneError",
    "DriveMissing",
    "SmrModel",
    "SmrParams",
    "MIN_ZONES",
    "SECTOR",
]

SECTOR = 4096
MIN_ZONES = 4  # a drive needs room for open bands plus the cleaning reserve


def format_emulated(
    catalog,
    root: Path,
    count: int,
    drive_size: int,
    zone_size: int,
    *,
    max_open_zones: int = 0,
    preallocate: bool = True,
    write_granularity: int = 1,
) -> list[int]:
    """Create ``count`` zone-file drives under ``root`` and their catalog
    rows; returns the drive ids.

    ``preallocate=False`` skips fallocate (a crowded scratch disk); zones then grow as written."""
    root = Path(root)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ConfigError("drives.count", count, "an integer >= 1")
    if (
        isinstance(zone_size, bool)
        or not isinstance(zone_size, int)
        or zone_size <= 0
        or zone_size % SECTOR
    ):
        raise ConfigError("drives.zone_size", zone_size, f"a positive multiple of {SECTOR} bytes")
    if (
        isinstance(drive_size, bool)
        or not isinstance(drive_size, int)
        or drive_size < MIN_ZONES * zone_size
    ):
        raise ConfigError(
            "drives.drive_size",
            drive_size,
            f"at least {MIN_ZONES} zones of {zone_size} bytes ({MIN_ZONES * zone_size} bytes)",
        )
    if write_granularity not in (1, 512, 4096):
        raise ConfigError("drives.write_granularity", write_granularity, "1, 512 or 4096 bytes")
    zone_count = drive_size // zone_size
    folders = []
    existing = sorted(p.name for p in root.glob("drive-*")) if root.exists() else []
    start = len(existing)
    for n in range(start, start + count):
        folder = root / f"drive-{n:03d}"
        if folder.exists():
            raise ConfigError("drives.root", str(folder), "a folder that does not exist yet")
        folders.append(folder)
    made = []
    for folder in folders:
        drive_uuid = str(uuidlib.uuid4())
        drive = ZoneFileDrive.format(
            folder,
            zone_size,
            zone_count,
            drive_uuid,
            max_open_zones=max_open_zones,
            preallocate_zones=preallocate,
            write_granularity=write_granularity,
        )
        drive.close()
        made.append((folder, drive_uuid))

    def work(conn):
        return [
            _insert_drive(
                conn,
                drive_uuid,
                str(folder.resolve()),
                "zonefile",
                zone_size,
                zone_count,
                max_open_zones,
                "zone-file emulation",
            )
            for folder, drive_uuid in made
        ]

    return catalog.run(work)


def _insert_drive(
    conn,
    drive_uuid: str,
    path: str,
    backend: str,
    zone_size: int,
    zone_count: int,
    max_open_zones: int,
    model: str | None,
    serial: str | None = None,
    host: str | None = None,
) -> int:
    """A Drive row and its empty Zone rows, inside the caller's transaction; returns its id.
    ``host`` None: a drive of the host the head runs on."""
    from engine.catalog.models import Drive, Zone

    drive_id = conn.execute(
        Drive.__table__.insert().values(
            uuid=drive_uuid,
            path=path,
            backend=backend,
            state="online",
            zone_size=zone_size,
            zone_count=zone_count,
            max_open_zones=max_open_zones,
            model=model,
            serial=serial,
            host=host,
            added_ns=time.time_ns(),
        )
    ).inserted_primary_key[0]
    conn.execute(
        Zone.__table__.insert(),
        [
            {
                "drive_id": drive_id,
                "idx": i,
                "state": "empty",
                "band_class": None,
                "write_pointer": 0,
                "live_bytes": 0,
                "garbage_bytes": 0,
                "resets": 0,
            }
            for i in range(zone_count)
        ],
    )
    return drive_id


def add_emulated(
    catalog,
    folder: Path,
    drive_size: int,
    zone_size: int,
    *,
    preallocate: bool = True,
    max_open_zones: int = 0,
) -> int:
    """One new zone-file drive in ``folder`` (which must not exist, or be empty) and its catalog
    rows, as ``shingle init`` makes them; returns the drive id. The running data path takes it
    with ``DataPath.add_drive``."""
    folder = Path(folder)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ConfigError("drives add", str(folder), "a new or empty folder (it becomes the drive)")
    if (
        isinstance(zone_size, bool)
        or not isinstance(zone_size, int)
        or zone_size <= 0
        or zone_size % SECTOR
    ):
        raise ConfigError("drives.zone_size", zone_size, f"a positive multiple of {SECTOR} bytes")
    if drive_size < MIN_ZONES * zone_size:
        raise ConfigError(
            "drives.drive_size", drive_size, f"at least {MIN_ZONES} zones of {zone_size} bytes"
        )
    if folder.exists():
        folder.rmdir()  # ZoneFileDrive.format makes the folder itself
    zone_count = drive_size // zone_size
    drive_uuid = str(uuidlib.uuid4())
    drive = ZoneFileDrive.format(
        folder,
        zone_size,
        zone_count,
        drive_uuid,
        max_open_zones=max_open_zones,
        preallocate_zones=preallocate,
    )
    drive.close()
    return catalog.run(
        lambda conn: _insert_drive(
            conn,
            drive_uuid,
            str(folder.resolve()),
            "zonefile",
            zone_size,
            zone_count,
            max_open_zones,
            "zone-file emulation",
        )
    )


def check_zoned_block(device: str, min_zone_size: int = 0):
    """The geometry of a host-managed zoned block device that can become a drive, read from the
    device (engine/drives/blkzoned.py), else ConfigError saying why not: too few sequential
    zones, a zone capacity below the largest fragment, or zones that are not empty (a device
    in use, or data someone may want: shingle never resets a zone it did not write)."""
    from engine.drives.blkzoned import read_geometry

    geometry = read_geometry(device)
    if geometry.sequential_zones < MIN_ZONES:
        raise ConfigError(
            "drives add",
            device,
            f"a zoned device with at least {MIN_ZONES} sequential zones "
            f"(it has {geometry.sequential_zones})",
        )
    if geometry.zone_capacity < min_zone_size:
        raise ConfigError(
            "drives add",
            device,
            f"zones that hold the largest fragment ({min_zone_size} bytes); its zone capacity "
            f"is {geometry.zone_capacity}",
        )
    if geometry.written_zones:
        raise ConfigError(
            "drives add",
            device,
            f"a device whose sequential zones are all empty; {geometry.written_zones} hold data "
            f"or are read-only/offline (if nothing there is wanted: blkzone reset {device})",
        )
    return geometry


def add_zoned_block(catalog, device: str, min_zone_size: int = 0) -> int:
    """A host-managed zoned block device as a new drive (``check_zoned_block`` says whether it
    can be one): shingle's zones are its sequential zones, each holding the zone capacity;
    conventional zones are left alone; the drive's ``max_open_zones`` is the tighter of the
    device's open and active limits (the data path never keeps more open)."""
    from engine.catalog.models import Drive

    geometry = check_zoned_block(device, min_zone_size)
    limits = [n for n in (geometry.max_open_zones, geometry.max_active_zones) if n]
    model = (
        f"zoned block device: {geometry.sequential_zones} sequential zones of "
        f"{geometry.zone_capacity} bytes, {geometry.conventional_zones} conventional (unused)"
    )
    same = os.path.realpath(device)

    def work(conn):
        table = Drive.__table__
        for row in conn.execute(table.select().where(table.c.backend == "zoned-block")):
            if row.state != "removed" and os.path.realpath(row.path) == same:
                raise ConfigError(
                    "drives add", device, f"a device that is no drive yet (drive {row.id})"
                )
        return _insert_drive(
            conn,
            str(uuidlib.uuid4()),
            device,
            "zoned-block",
            geometry.zone_capacity,
            geometry.sequential_zones,
            min(limits, default=0),
            model,
        )

    return catalog.run(work)


def add_agent_drives(catalog, address: str) -> list[int]:
    """Record the drives the agent at ``address`` (HOST:PORT) serves that the catalog does not
    know yet, on the agent's host; returns their new ids. Geometry comes from the agent."""
    from engine.catalog.models import Drive
    from engine.drives.remote import hello

    served = hello(address)
    host = str(served.get("host") or address)

    def work(conn):
        table = Drive.__table__
        known = {r.uuid for r in conn.execute(table.select().with_only_columns(table.c.uuid))}
        return [
            _insert_drive(
                conn,
                d["uuid"],
                address,
                "agent",
                int(d["zone_size"]),
                int(d["zone_count"]),
                int(d.get("max_open_zones", 0)),
                "drive agent",
                host=host,
            )
            for d in served.get("drives", [])
            if d["uuid"] not in known
        ]

    return catalog.run(work)


def open_drive(row) -> ZonedDrive:
    """The backend of a Drive row (``path``, ``backend``, ``uuid``, geometry); an "agent"
    drive's path is its agent's HOST:PORT."""
    if row.backend == "zonefile":
        return ZoneFileDrive(
            row.path,
            row.zone_size,
            row.zone_count,
            max_open_zones=row.max_open_zones,
            uuid=row.uuid,
        )
    if row.backend == "zoned-block":
        from engine.drives.blkzoned import ZonedBlockDrive

        drive = ZonedBlockDrive(row.device or row.path)
        if (drive.zone_size, drive.zone_count) != (row.zone_size, row.zone_count):
            drive.close()
            raise DriveMissing(
                f"{row.device or row.path} has {drive.zone_count} zones of {drive.zone_size} "
                f"bytes, drive {row.id} had {row.zone_count} of {row.zone_size}: another device"
            )
        return drive
    if row.backend == "agent":
        from engine.drives.remote import RemoteDrive

        return RemoteDrive(
            row.path, row.uuid, row.zone_size, row.zone_count, max_open_zones=row.max_open_zones
        )
    raise ConfigError(
        f"drives.{row.id}.backend", row.backend, "'zonefile', 'zoned-block' or 'agent'"
    )
