"""Host-managed zoned block devices through the kernel's zoned-block ioctls.

Structures and request numbers follow include/uapi/linux/blkzoned.h:
``struct blk_zone`` (64 bytes), ``struct blk_zone_report`` (16-byte header
followed by the zone array), ``struct blk_zone_range`` (16 bytes). Sizes on
the wire are 512-byte sectors; this module speaks bytes to its callers.
Geometry comes from sysfs (queue/zoned, queue/chunk_sectors,
queue/max_open_zones). Writes go through O_DIRECT at the write pointer."""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
from pathlib import Path

from engine.drives.zoned import (
    CLOSED,
    EMPTY,
    EXPLICIT_OPEN,
    FULL,
    IMPLICIT_OPEN,
    NOT_WP,
    OFFLINE,
    READ_ONLY,
    DriveMissing,
    ZonedDrive,
    ZoneError,
    ZoneInfo,
)
from engine.ordered_lock import lock

SECTOR = 512

# struct blk_zone: start, len, wp (u64); type, cond, non_seq, reset (u8); resv[4];
# capacity (u64); reserved[24]
BLK_ZONE = struct.Struct("=QQQBBBB4xQ24x")
# struct blk_zone_report: sector (u64), nr_zones (u32), flags (u32), zones[]
BLK_ZONE_REPORT = struct.Struct("=QII")
# struct blk_zone_range: sector, nr_sectors (u64)
BLK_ZONE_RANGE = struct.Struct("=QQ")

BLK_ZONE_TYPE_CONVENTIONAL, BLK_ZONE_TYPE_SEQWRITE_REQ, BLK_ZONE_TYPE_SEQWRITE_PREF = 0x1, 0x2, 0x3
BLK_ZONE_REP_CAPACITY = 1 << 0
CONDITIONS = {
    0x0: NOT_WP,
    0x1: EMPTY,
    0x2: IMPLICIT_OPEN,
    0x3: EXPLICIT_OPEN,
    0x4: CLOSED,
    0xD: READ_ONLY,
    0xE: FULL,
    0xF: OFFLINE,
}

_IOC_NRBITS, _IOC_TYPEBITS, _IOC_SIZEBITS = 8, 8, 14
_IOC_WRITE, _IOC_READ = 1, 2


def _ioc(direction: int, kind: int, nr: int, size: int) -> int:
    return (
        (direction << (_IOC_NRBITS + _IOC_TYPEBITS + _IOC_SIZEBITS))
        | (size << (_IOC_NRBITS + _IOC_TYPEBITS))
        | (kind << _IOC_NRBITS)
        | nr
    )


BLKREPORTZONE = _ioc(_IOC_READ | _IOC_WRITE, 0x12, 130, BLK_ZONE_REPORT.size)
BLKRESETZONE = _ioc(_IOC_WRITE, 0x12, 131, BLK_ZONE_RANGE.size)
BLKGETZONESZ = _ioc(_IOC_READ, 0x12, 132, 4)
BLKGETNRZONES = _ioc(_IOC_READ, 0x12, 133, 4)
BLKOPENZONE = _ioc(_IOC_WRITE, 0x12, 134, BLK_ZONE_RANGE.size)
BLKCLOSEZONE = _ioc(_IOC_WRITE, 0x12, 135, BLK_ZONE_RANGE.size)
BLKFINISHZONE = _ioc(_IOC_WRITE, 0x12, 136, BLK_ZONE_RANGE.size)


def pack_report_request(sector: int, nr_zones: int) -> bytearray:
    """A BLKREPORTZONE buffer: header plus room for ``nr_zones`` descriptors."""
    buf = bytearray(BLK_ZONE_REPORT.size + nr_zones * BLK_ZONE.size)
    BLK_ZONE_REPORT.pack_into(buf, 0, sector, nr_zones, 0)
    return buf


def unpack_report(buf) -> tuple[int, list[dict]]:
    """(flags, zone descriptors) of a filled BLKREPORTZONE buffer; values in sectors."""
    _sector, count, flags = BLK_ZONE_REPORT.unpack_from(buf, 0)
    zones = []
    for i in range(count):
        start, length, wp, ztype, cond, non_seq, reset, capacity = BLK_ZONE.unpack_from(
            buf, BLK_ZONE_REPORT.size + i * BLK_ZONE.size
        )
        zones.append(
            {
                "start": start,
                "len": length,
                "wp": wp,
                "type": ztype,
                "cond": cond,
                "non_seq": non_seq,
                "reset": reset,
                "capacity": capacity if flags & BLK_ZONE_REP_CAPACITY else length,
            }
        )
    return flags, zones


def pack_range(sector: int, nr_sectors: int) -> bytes:
    return BLK_ZONE_RANGE.pack(sector, nr_sectors)


def sysfs_queue(device: str) -> Path:
    return Path("/sys/block") / Path(os.path.realpath(device)).name / "queue"


def is_host_managed(device: str) -> bool:
    try:
        return (sysfs_queue(device) / "zoned").read_text().strip() == "host-managed"
    except OSError:
        return False


def host_managed_devices() -> list[str]:
    """Block devices the kernel reports as host-managed zoned."""
    found = []
    for queue in Path("/sys/block").glob("*/queue/zoned"):
        try:
            if queue.read_text().strip() == "host-managed":
                found.append(f"/dev/{queue.parent.parent.name}")
        except OSError:
            continue
    return found


class ZonedBlockDrive(ZonedDrive):
    write_granularity = 4096  # O_DIRECT: appends are padded to whole logical blocks

    def __init__(self, device: str):
        self.device = device
        if not os.path.exists(device):
            raise DriveMissing(f"zoned block device {device} does not exist")
        if not is_host_managed(device):
            raise ZoneError(
                f"{device} is not a host-managed zoned block device (sysfs queue/zoned)"
            )
        queue = sysfs_queue(device)
        chunk = int((queue / "chunk_sectors").read_text())
        self.zone_size = chunk * SECTOR
        try:
            self.max_open_zones = int((queue / "max_open_zones").read_text())
        except OSError:
            self.max_open_zones = 0
        self.fd = os.open(device, os.O_RDWR | os.O_DIRECT)
        self._lock = lock("drives.zoned_block")
        self._zones = self._report_all()
        self.zone_count = len(self._zones)

    def present(self) -> bool:
        return os.path.exists(self.device)

    def _report_all(self) -> list[dict]:
        zones: list[dict] = []
        sector = 0
        while True:
            buf = pack_report_request(sector, 256)
            fcntl.ioctl(self.fd, BLKREPORTZONE, buf, True)
            _flags, batch = unpack_report(buf)
            if not batch:
                return zones
            zones.extend(batch)
            sector = batch[-1]["start"] + batch[-1]["len"]

    def report(self) -> list[ZoneInfo]:
        with self._lock:
            self._zones = self._report_all()
        return [
            ZoneInfo(
                i,
                z["start"] * SECTOR,
                z["capacity"] * SECTOR,
                (z["wp"] - z["start"]) * SECTOR,
                CONDITIONS.get(z["cond"], OFFLINE),
            )
            for i, z in enumerate(self._zones)
        ]

    def write_pointer(self, idx: int) -> int:
        self.check_idx(idx)
        z = self._zones[idx]
        return (z["wp"] - z["start"]) * SECTOR

    def _range(self, op: int, idx: int) -> None:
        self.check_idx(idx)
        z = self._zones[idx]
        fcntl.ioctl(self.fd, op, pack_range(z["start"], z["len"]))

    def append(self, idx: int, offset: int, data, durable: bool = False) -> None:
        self.check_idx(idx)
        with self._lock:
            z = self._zones[idx]
            wp = (z["wp"] - z["start"]) * SECTOR
            self._check_append(
                idx,
                offset,
                len(data),
                wp,
                z["capacity"] * SECTOR,
                CONDITIONS.get(z["cond"], OFFLINE),
            )
            length = -(-len(data) // 4096) * 4096
            # O_DIRECT wants aligned memory and lengths: pad the tail (the zone
            # moves by the padded length)
            buf = mmap.mmap(-1, length)
            buf[: len(data)] = bytes(data)
            try:
                os.pwrite(self.fd, buf, z["start"] * SECTOR + offset)
            except OSError:
                self.write_errors += 1
                raise
            z["wp"] += length // SECTOR
            self.bytes_written += length
        if durable:
            self.sync(idx)
        if self.model is not None:
            self.model.on_write(self.model_key, z["start"] * SECTOR + offset, length)

    def read_into(self, idx: int, offset: int, buffers: list) -> int:
        z = self._zones[idx]
        want = sum(len(b) for b in buffers)
        try:
            with open(self.device, "rb", buffering=0) as raw:
                got = os.preadv(raw.fileno(), buffers, z["start"] * SECTOR + offset)
        except OSError:
            self.read_errors += 1
            raise
        self.bytes_read += min(got, want)
        if self.model is not None:
            self.model.on_read(self.model_key, z["start"] * SECTOR + offset, got)
        return min(got, want)

    def sync(self, idx: int) -> None:
        os.fsync(self.fd)

    def reset(self, idx: int) -> None:
        self._range(BLKRESETZONE, idx)
        self._zones[idx]["wp"] = self._zones[idx]["start"]
        if self.model is not None:
            self.model.on_reset(self.model_key, self._zones[idx]["start"] * SECTOR, self.zone_size)

    def open_zone(self, idx: int) -> None:
        self._range(BLKOPENZONE, idx)

    def close_zone(self, idx: int) -> None:
        self._range(BLKCLOSEZONE, idx)

    def finish_zone(self, idx: int) -> None:
        self._range(BLKFINISHZONE, idx)

    def close(self) -> None:
        os.close(self.fd)
