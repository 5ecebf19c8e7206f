"""Dropping the emulated drives' zone files from the page cache, for tests of what a read does
when its fragments are not in memory."""

from __future__ import annotations

import os


def evict_zone_files(drives) -> None:
    """Drop the zone files of ``drives`` (DriveState objects) from the page cache, after an
    fdatasync so that their pages are clean: the next read of them waits for the medium."""
    for drive in drives:
        for name in os.listdir(drive.path):
            if name.startswith("zone-"):
                fd = os.open(os.path.join(drive.path, name), os.O_RDONLY)
                try:
                    os.fdatasync(fd)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
