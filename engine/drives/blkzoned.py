"""Host-managed zoned block devices through the kernel's zoned-block ioctls.

Structures and request numbers follow include/uapi/linux/blkzoned.h:
``struct blk_zone`` (64 bytes), ``struct blk_zone_report`` (16-byte header
followed by the zone array), ``struct blk_zone_range`` (16 bytes). Sizes on
the wire are 512-byte sectors; this module speaks bytes to its callers.
Geometry comes from the zone report and sysfs (queue/zoned, queue/max_open_zones,
queue/max_active_zones, queue/logical_block_size). Writes go through O_DIRECT at the write
pointer, padded to whole blocks.

shingle's zones of such a drive are the device's sequential-write-required zones, numbered
from 0 in device order: conventional zones (an SMR drive's conventional region, null_blk's
zone_nr_conv) are left alone, as are sequential-write-preferred zones (host-aware drives
take any write there; shingle writes them only in host-managed mode, so never). A zone
holds the device's zone *capacity* (NVMe ZNS and null_blk may give a capacity below the zone
size): ``zone_size`` here is the smallest capacity of the used zones, and
``device_zone_size`` the spacing of zones on the device."""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from engine.base.ordered_lock import lock
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


def _queue_int(queue: Path, name: str) -> int:
    try:
        return int((queue / name).read_text())
    except (OSError, ValueError):
        return 0  # attribute absent (an older kernel): no limit known


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


def report_zones(fd: int) -> list[dict]:
    """Every zone of the device open at ``fd`` (BLKREPORTZONE, 256 zones a call)."""
    zones: list[dict] = []
    sector = 0
    while True:
        buf = pack_report_request(sector, 256)
        fcntl.ioctl(fd, BLKREPORTZONE, buf, True)
        _flags, batch = unpack_report(buf)
        if not batch:
            return zones
        zones.extend(batch)
        sector = batch[-1]["start"] + batch[-1]["len"]


@dataclass(frozen=True)
class Geometry:
    """What shingle needs to know of a host-managed device, read from the device itself."""

    device: str
    device_zone_size: int  # bytes between zone starts
    zone_capacity: int  # smallest writable bytes of a sequential zone
    sequential_zones: int
    conventional_zones: int
    max_open_zones: int  # 0: no limit
    max_active_zones: int  # 0: no limit
    logical_block_size: int
    scheduler: str  # the I/O scheduler in use ("mq-deadline", "none", ...)
    written_zones: int  # sequential zones not empty (written, full, read-only or offline)

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def scheduler(queue: Path) -> str:
    """The I/O scheduler in use: the bracketed name of queue/scheduler."""
    try:
        text = (queue / "scheduler").read_text()
    except OSError:
        return "unknown"
    for word in text.split():
        if word.startswith("["):
            return word.strip("[]")
    return text.strip() or "unknown"


def read_geometry(device: str) -> Geometry:
    """The geometry of a host-managed zoned block device (its zone report and sysfs)."""
    if not os.path.exists(device):
        raise DriveMissing(f"zoned block device {device} does not exist")
    if not is_host_managed(device):
        raise ZoneError(f"{device} is not a host-managed zoned block device (sysfs queue/zoned)")
    queue = sysfs_queue(device)
    fd = os.open(device, os.O_RDONLY)
    try:
        zones = report_zones(fd)
    finally:
        os.close(fd)
    sequential = [z for z in zones if z["type"] == BLK_ZONE_TYPE_SEQWRITE_REQ]
    if not sequential:
        raise ZoneError(f"{device} has no sequential-write-required zones")
    return Geometry(
        device=device,
        device_zone_size=sequential[0]["len"] * SECTOR,
        zone_capacity=min(z["capacity"] for z in sequential) * SECTOR,
        sequential_zones=len(sequential),
        conventional_zones=sum(1 for z in zones if z["type"] == BLK_ZONE_TYPE_CONVENTIONAL),
        max_open_zones=_queue_int(queue, "max_open_zones"),
        max_active_zones=_queue_int(queue, "max_active_zones"),
        logical_block_size=_queue_int(queue, "logical_block_size") or SECTOR,
        scheduler=scheduler(queue),
        written_zones=sum(1 for z in sequential if z["cond"] != 0x1),
    )


class ZonedBlockDrive(ZonedDrive):
    def __init__(self, device: str):
        self.device = device
        geometry = read_geometry(device)
        self.geometry = geometry
        self.zone_size = geometry.zone_capacity
        self.device_zone_size = geometry.device_zone_size
        self.max_open_zones = geometry.max_open_zones
        self.max_active_zones = geometry.max_active_zones
        # O_DIRECT: appends are padded to whole logical blocks (at least a page, which the
        # aligned buffer is anyway)
        self.write_granularity = max(4096, geometry.logical_block_size)
        self.fd = os.open(device, os.O_RDWR | os.O_DIRECT)
        # reads go through the page cache (the data path reads fragments of any length);
        # a reset drops the zone's cached pages (the kernel does, in BLKRESETZONE)
        self.read_fd = os.open(device, os.O_RDONLY)
        self._lock = lock("drives.zoned_block")
        self._zones = self._report_sequential()
        self.zone_count = len(self._zones)
        # errors the device returned (EIO, EREMOTEIO, ...: bad sectors, a zone gone read-only
        # or offline), each a fault of the drive; off_pointer_errors are those of them that were
        # writes off the device's pointer, which shingle must never issue (zero expected)
        self.device_errors = 0
        self.off_pointer_errors = 0

    def io_counters(self) -> dict[str, int]:
        return {
            **super().io_counters(),
            "device_errors": self.device_errors,
            "off_pointer_errors": self.off_pointer_errors,
        }

    def present(self) -> bool:
        return os.path.exists(self.device)

    def _report_sequential(self) -> list[dict]:
        return [z for z in report_zones(self.fd) if z["type"] == BLK_ZONE_TYPE_SEQWRITE_REQ]

    def report(self) -> list[ZoneInfo]:
        with self._lock:
            self._zones = self._report_sequential()
        return [
            ZoneInfo(
                i,
                z["start"] * SECTOR,
                min(z["capacity"] * SECTOR, self.zone_size),
                self._pointer(z)
                if self._condition(z) in (READ_ONLY, OFFLINE)
                else (z["wp"] - z["start"]) * SECTOR,
                self._condition(z),
            )
            for i, z in enumerate(self._zones)
        ]

    @staticmethod
    def _condition(zone: dict) -> str:
        return CONDITIONS.get(zone["cond"], OFFLINE)

    def condition(self, idx: int) -> str:
        """The zone's condition as the device reported it last (``report`` asks again)."""
        self.check_idx(idx)
        return self._condition(self._zones[idx])

    def write_pointer(self, idx: int) -> int:
        self.check_idx(idx)
        return self._pointer(self._zones[idx])

    def _pointer(self, z: dict) -> int:
        """A zone's write pointer in bytes. A read-only or offline zone has none (the device
        reports an invalid one): read-only counts as full (it is read as it is, never written
        again), offline as empty (nothing of it can be read: recovery finds the catalog's
        fragments there missing)."""
        condition = self._condition(z)
        if condition in (FULL, READ_ONLY):
            return self.zone_size  # nothing more fits
        if condition == OFFLINE:
            return 0
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
            length = -(-len(data) // self.write_granularity) * self.write_granularity
            self._check_append(idx, offset, length, wp, self.zone_size, self._condition(z))
            # O_DIRECT wants aligned memory and lengths: an anonymous map is page-aligned;
            # the tail is padded with zeros (the zone moves by the padded length)
            buf = mmap.mmap(-1, length)
            try:
                buf[: len(data)] = bytes(data)
                os.pwrite(self.fd, buf, z["start"] * SECTOR + offset)
            except OSError as exc:
                self.write_errors += 1
                faulty = self._write_refused(idx, offset)
                if faulty is not None:
                    raise ZoneError(
                        f"{self.device} zone {idx} is {faulty}: the device refused a write "
                        f"({exc.strerror})"
                    ) from exc
                raise
            finally:
                buf.close()
            z["wp"] += length // SECTOR
            if z["cond"] in (0x1, 0x4):
                z["cond"] = 0x2  # a write opens an empty or closed zone implicitly
            if z["wp"] - z["start"] >= z["capacity"]:
                z["cond"] = 0xE  # the device reports the zone full once its capacity is written
            self.bytes_written += length
        if durable:
            self.sync(idx)
        if self.model is not None:
            self.model.on_write(self.model_key, z["start"] * SECTOR + offset, length)

    def _write_refused(self, idx: int, offset: int) -> str | None:
        """The device refused a write at ``offset`` of zone ``idx`` (lock held): its own zone
        report is the truth now. The pointer still where shingle wrote: a fault of the medium or
        the zone (a bad sector, a zone gone read-only or offline); elsewhere: an off-pointer
        write, which means shingle's view of the zone was wrong. Returns the zone's condition
        when it went read-only or offline, else None."""
        self.device_errors += 1
        try:
            self._zones = self._report_sequential()
        except OSError:
            return None  # the device answers nothing now: the drive watch finds it gone or failing
        z = self._zones[idx]
        condition = self._condition(z)
        if condition in (READ_ONLY, OFFLINE):
            return condition
        if (z["wp"] - z["start"]) * SECTOR != offset:
            self.off_pointer_errors += 1
        return None

    def read_into(self, idx: int, offset: int, buffers: list) -> int:
        self.check_idx(idx)
        z = self._zones[idx]
        want = sum(len(b) for b in buffers)
        try:
            got = os.preadv(self.read_fd, buffers, z["start"] * SECTOR + offset)
        except OSError as exc:
            self.read_errors += 1
            self.device_errors += 1
            # an OSError, not a ZoneError: the drive watch takes this for a fault of the drive
            raise OSError(
                exc.errno,
                f"read of {want} bytes at {offset} of zone {idx} of {self.device} failed "
                f"({exc.strerror}; the device reports the zone {self._condition_now(idx)})",
            ) from exc
        self.bytes_read += min(got, want)
        if self.model is not None:
            self.model.on_read(self.model_key, z["start"] * SECTOR + offset, got)
        return min(got, want)

    def _condition_now(self, idx: int) -> str:
        """The zone's condition in a new zone report (after an error: offline, say)."""
        try:
            with self._lock:
                self._zones = self._report_sequential()
                return self._condition(self._zones[idx])
        except OSError:
            return "unreported (the device answers no zone report)"

    def will_read(self, idx: int, offset: int, length: int) -> None:
        z = self._zones[idx]
        os.posix_fadvise(self.read_fd, z["start"] * SECTOR + offset, length, os.POSIX_FADV_WILLNEED)

    def sync(self, idx: int) -> None:
        try:
            os.fsync(self.fd)  # a cache flush to the device
        except OSError:
            self.device_errors += 1
            raise

    def reset(self, idx: int) -> None:
        with self._lock:
            self._range(BLKRESETZONE, idx)
            z = self._zones[idx]
            z["wp"], z["cond"] = z["start"], 0x1
        if self.model is not None:
            self.model.on_reset(self.model_key, z["start"] * SECTOR, self.device_zone_size)

    def open_zone(self, idx: int) -> None:
        with self._lock:
            self._range(BLKOPENZONE, idx)
            self._zones[idx]["cond"] = 0x3

    def close_zone(self, idx: int) -> None:
        with self._lock:
            self._range(BLKCLOSEZONE, idx)
            z = self._zones[idx]
            z["cond"] = 0x1 if z["wp"] == z["start"] else 0x4

    def finish_zone(self, idx: int) -> None:
        with self._lock:
            self._range(BLKFINISHZONE, idx)
            self._zones[idx]["cond"] = 0xE

    def close(self) -> None:
        os.close(self.fd)
        os.close(self.read_fd)
