"""The zoned drive model shared by every backend (the Linux zoned block model).

A drive is a row of zones. Each zone has a start, a capacity, a write
pointer and a condition. Data is appended only at the write pointer and read
only below it; a zone is reset as a whole (invariant 1 of docs/ARCHITECTURE.md).
Backends: ``ZoneFileDrive`` (a directory of zone files) and
``ZonedBlockDrive`` (a host-managed device through the kernel's ioctls).
An ``SmrModel`` attached as ``drive.model`` sees every I/O."""

from __future__ import annotations

import errno
from dataclasses import dataclass

from engine.base.errors import FsError

# Conditions, named as in linux/blkzoned.h.
EMPTY, IMPLICIT_OPEN, EXPLICIT_OPEN, CLOSED, FULL, READ_ONLY, OFFLINE, NOT_WP = (
    "empty",
    "implicit_open",
    "explicit_open",
    "closed",
    "full",
    "read_only",
    "offline",
    "not_wp",
)
OPEN_CONDITIONS = (IMPLICIT_OPEN, EXPLICIT_OPEN)


class ZoneError(FsError):
    """A zone operation the zoned model forbids (write off the write
    pointer, past capacity, ...)."""

    errno_value = errno.EIO


class DriveMissing(FsError):
    """The drive (or its folder) is gone."""

    errno_value = errno.ENODEV


@dataclass(frozen=True, slots=True)
class ZoneInfo:
    idx: int
    start: int  # byte offset on the drive
    capacity: int  # writable bytes
    write_pointer: int  # bytes written, relative to start
    condition: str


class ZonedDrive:
    """Interface of a zoned drive. Offsets are bytes relative to the zone start."""

    zone_size: int
    zone_count: int
    max_open_zones: int = 0  # 0: no limit
    write_granularity: int = 1  # appends move the write pointer in multiples of this
    model = None  # SmrModel or None
    model_key = None  # how this drive is named in the model's report
    # This drive's own I/O, cumulative since it was opened (for /metrics). Plain int increments, no
    # lock on the hot path: one writer thread per drive appends; concurrent readers may, rarely,
    # lose an increment of bytes_read, which monitoring tolerates (no accounting reads these).
    bytes_read = 0
    bytes_written = 0
    read_errors = 0
    write_errors = 0
    checksum_errors = 0  # fragments whose crc32c did not match, counted by the data path's reader

    def io_counters(self) -> dict[str, int]:
        return {
            "read_bytes": self.bytes_read,
            "written_bytes": self.bytes_written,
            "read_errors": self.read_errors,
            "write_errors": self.write_errors,
            "checksum_errors": self.checksum_errors,
        }

    def report(self) -> list[ZoneInfo]:
        raise NotImplementedError

    def write_pointer(self, idx: int) -> int:
        raise NotImplementedError

    def append(self, idx: int, offset: int, data, durable: bool = False) -> None:
        """Write ``data`` at ``offset``, which must be the zone's write pointer; with ``durable``
        the bytes are on stable storage when this returns (as after ``sync``)."""
        raise NotImplementedError

    def read_into(self, idx: int, offset: int, buffers: list) -> int:
        """Scatter-read below the write pointer; returns bytes read."""
        raise NotImplementedError

    def read_cached(self, idx: int, offset: int, length: int) -> bytearray | None:
        """The ``length`` bytes at ``offset`` only if they are in memory already (the page
        cache), else None: where it would wait for the medium, or the backend cannot tell. For
        a caller that must not block, such as the NFS event loop."""
        return None

    def read_cached_into(self, idx: int, offset: int, buffers: list) -> bool:
        """``read_into`` only if every byte is in memory already: True, else False (the
        buffers' contents are then undefined). As ``read_cached``, for a caller that must not
        block."""
        return False

    def read(self, idx: int, offset: int, length: int) -> bytes:
        buf = bytearray(length)
        got = self.read_into(idx, offset, [buf])
        return bytes(buf[:got])

    def sync(self, idx: int) -> None:
        raise NotImplementedError

    def start_writeback(self, idx: int, offset: int, length: int) -> None:
        """Hint: begin writing this range out now (the later ``sync`` makes it durable)."""

    def will_read(self, idx: int, offset: int, length: int) -> None:
        """Hint: this range is read soon (the kernel may start fetching it now)."""

    def reset(self, idx: int) -> None:
        raise NotImplementedError

    def open_zone(self, idx: int) -> None:
        raise NotImplementedError

    def close_zone(self, idx: int) -> None:
        raise NotImplementedError

    def finish_zone(self, idx: int) -> None:
        raise NotImplementedError

    def present(self) -> bool:
        return True

    def close(self) -> None:
        pass

    # -- shared checks ----------------------------------------------------------
    def check_idx(self, idx: int) -> None:
        if not 0 <= idx < self.zone_count:
            raise ZoneError(f"zone {idx}: expected 0-{self.zone_count - 1}", errno.EINVAL)

    def _check_append(
        self, idx: int, offset: int, length: int, write_pointer: int, capacity: int, condition: str
    ) -> None:
        if condition in (FULL, READ_ONLY, OFFLINE):
            raise ZoneError(f"zone {idx} is {condition}: no writes until it is reset")
        if offset != write_pointer:
            raise ZoneError(
                f"write at offset {offset} of zone {idx}: expected the write pointer "
                f"{write_pointer} (zones are append-only)"
            )
        if offset + length > capacity:
            raise ZoneError(
                f"write of {length} bytes at {offset} of zone {idx} passes its capacity {capacity}",
                errno.ENOSPC,
            )
