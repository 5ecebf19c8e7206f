"""The drive folders an agent serves: made (formatted) where they do not exist yet.

Shared by `shingle agent --format` and `shingle install --role storage`, which formats once at
install time so that the unit never formats: a drive whose mount failed shows as an empty
folder, and an agent that formatted it at start would serve a blank drive in its place."""

from __future__ import annotations

import uuid as uuidlib
from dataclasses import dataclass
from pathlib import Path


class DriveFolderError(ValueError):
    """A folder that holds no drive and may not be made one (the text says which and why)."""


@dataclass(frozen=True)
class DriveFormat:
    """The geometry of drives made by --format: the agent's --drive-size and --zone-size."""

    drive_size: int
    zone_size: int
    preallocate: bool = True


def holds_drive(folder: Path) -> bool:
    return (folder / "drive.json").is_file()


def check_format(fmt: DriveFormat) -> None:
    from engine.drives import MIN_ZONES, SECTOR

    if fmt.zone_size % SECTOR or fmt.drive_size < MIN_ZONES * fmt.zone_size:
        raise DriveFolderError(
            f"--zone-size must be a multiple of {SECTOR} and --drive-size at least "
            f"{MIN_ZONES} zones"
        )


def missing_drives(folders: list[Path]) -> list[Path]:
    """The folders that hold no drive yet; refuses one that holds something else."""
    missing = []
    for folder in folders:
        if holds_drive(folder):
            continue
        if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
            raise DriveFolderError(f"{folder} is neither a drive nor empty")
        missing.append(folder)
    return missing


def format_drives(folders: list[Path], fmt: DriveFormat) -> list[Path]:
    """Make a drive in each folder that holds none (absent or empty); returns those made."""
    from engine.drives import ZoneFileDrive

    missing = missing_drives(folders)
    if missing:
        check_format(fmt)
    for folder in missing:
        if folder.exists():
            folder.rmdir()  # ZoneFileDrive.format makes the folder itself
        ZoneFileDrive.format(
            folder,
            fmt.zone_size,
            fmt.drive_size // fmt.zone_size,
            str(uuidlib.uuid4()),
            preallocate_zones=fmt.preallocate,
        ).close()
    return missing
