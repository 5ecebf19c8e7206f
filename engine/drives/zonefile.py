"""A drive emulated as a directory of zone files (host-managed SMR semantics).

One file per zone, ``zone-NNNNNN``; the write pointer is the file's durable
length. Each file is preallocated with fallocate(FALLOC_FL_KEEP_SIZE) so the
filesystem lays the zone out contiguously while its length still says how
much was written. The same backend runs shingle on drive-managed SMR or CMR
disks formatted with XFS/ext4. A ``drive.json`` label names the drive so a
folder is never mistaken for another drive."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import json
import os
from pathlib import Path

from engine.base.ordered_lock import rlock
from engine.drives.zoned import (
    CLOSED,
    EMPTY,
    EXPLICIT_OPEN,
    FULL,
    IMPLICIT_OPEN,
    DriveMissing,
    ZonedDrive,
    ZoneError,
    ZoneInfo,
)
from engine.native import fragmentio

LABEL = "drive.json"
FALLOC_FL_KEEP_SIZE = 1
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
SYNC_FILE_RANGE_WRITE = 2
# Linux 4.14+: a buffered preadv2 that fails with EAGAIN instead of waiting for the medium
_RWF_NOWAIT = getattr(os, "RWF_NOWAIT", None)
_RWF_DSYNC = getattr(os, "RWF_DSYNC", 0)  # Linux 4.7+: pwritev with O_DSYNC semantics for one call
_sync_file_range = getattr(_libc, "sync_file_range", None)
if _sync_file_range is not None:
    _sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]


def preallocate(fd: int, length: int) -> None:
    """Reserve ``length`` bytes without changing the file length (the write pointer)."""
    if _libc.fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, length) != 0:
        err = ctypes.get_errno()
        if err in (errno.EOPNOTSUPP, errno.ENOSYS):
            return  # filesystems without fallocate still work, only less contiguous
        raise OSError(err, f"fallocate of {length} bytes: {os.strerror(err)}")


def zone_path(folder: Path, idx: int) -> Path:
    return folder / f"zone-{idx:06d}"


class ZoneFileDrive(ZonedDrive):
    def __init__(
        self,
        folder: Path | str,
        zone_size: int,
        zone_count: int,
        *,
        max_open_zones: int = 0,
        uuid: str | None = None,
    ):
        self.folder = Path(folder)
        self.zone_size = zone_size
        self.zone_count = zone_count
        self.max_open_zones = max_open_zones
        self._fds: dict[int, int] = {}
        self._wp: dict[int, int] = {}
        self._cond: dict[int, str] = {}
        self._lock = rlock("drives.zone_file")
        if not self.folder.is_dir():
            raise DriveMissing(f"drive folder {self.folder} does not exist")
        label = self.label() if uuid is not None or (self.folder / LABEL).exists() else {}
        if uuid is not None and label.get("uuid") != uuid:
            raise DriveMissing(
                f"drive folder {self.folder} holds drive {label.get('uuid')!r}, expected {uuid}"
            )
        self.preallocate = label.get("preallocate", True)
        # emulate a block device's padding of appends to whole blocks (4096 on a zoned disk)
        self.write_granularity = int(label.get("write_granularity", 1))

    # -- set-up --------------------------------------------------------------
    @classmethod
    def format(
        cls,
        folder: Path,
        zone_size: int,
        zone_count: int,
        uuid: str,
        *,
        max_open_zones: int = 0,
        preallocate_zones: bool = True,
        write_granularity: int = 1,
    ):
        folder.mkdir(parents=True, exist_ok=False)
        for idx in range(zone_count):
            fd = os.open(zone_path(folder, idx), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                if preallocate_zones:
                    preallocate(fd, zone_size)
            finally:
                os.close(fd)
        label = {
            "uuid": uuid,
            "zone_size": zone_size,
            "zone_count": zone_count,
            "max_open_zones": max_open_zones,
            "preallocate": preallocate_zones,
            "write_granularity": write_granularity,
        }
        tmp = folder / (LABEL + ".tmp")
        tmp.write_text(json.dumps(label))
        os.replace(tmp, folder / LABEL)
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        return cls(folder, zone_size, zone_count, max_open_zones=max_open_zones, uuid=uuid)

    def label(self) -> dict:
        try:
            return json.loads((self.folder / LABEL).read_text())
        except FileNotFoundError:
            raise DriveMissing(f"drive folder {self.folder} has no {LABEL} label") from None

    def present(self) -> bool:
        return self.folder.is_dir()

    # -- zone state --------------------------------------------------------------
    def _fd(self, idx: int) -> int:
        fd = self._fds.get(idx)
        if fd is not None:
            return fd
        with self._lock:
            fd = self._fds.get(idx)
            if fd is None:
                self.check_idx(idx)
                try:
                    fd = os.open(zone_path(self.folder, idx), os.O_RDWR)
                except FileNotFoundError:
                    raise DriveMissing(
                        f"zone file {zone_path(self.folder, idx)} is missing"
                    ) from None
                # no kernel readahead: a zone file interleaves the data fragments a sequential
                # reader wants with parity it skips, and the data path reads ahead whole stripes
                # of data fragments itself (with a WILLNEED hint per fragment)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
                # the pointer before the fd: the event loop's read_cached finds the fd without
                # the lock and then reads the pointer (a data server's first READ of a zone
                # another head wrote met a KeyError there: SERVERFAULT)
                self._wp.setdefault(idx, os.fstat(fd).st_size)
                self._fds[idx] = fd
        return fd

    def write_pointer(self, idx: int) -> int:
        self._fd(idx)
        return self._wp[idx]

    def condition(self, idx: int) -> str:
        wp = self.write_pointer(idx)
        cond = self._cond.get(idx)
        if wp >= self.zone_size:
            return FULL
        if cond is not None:
            return cond
        return EMPTY if wp == 0 else CLOSED

    def report(self) -> list[ZoneInfo]:
        return [
            ZoneInfo(
                i, i * self.zone_size, self.zone_size, self.write_pointer(i), self.condition(i)
            )
            for i in range(self.zone_count)
        ]

    def _open_count(self) -> int:
        return sum(1 for c in self._cond.values() if c in (IMPLICIT_OPEN, EXPLICIT_OPEN))

    def _make_open(self, idx: int, how: str) -> None:
        cond = self.condition(idx)
        if cond in (IMPLICIT_OPEN, EXPLICIT_OPEN):
            if how == EXPLICIT_OPEN:
                self._cond[idx] = EXPLICIT_OPEN
            return
        if cond == FULL:
            raise ZoneError(f"zone {idx} is full: reset it before writing")
        if self.max_open_zones and self._open_count() >= self.max_open_zones:
            raise ZoneError(
                f"opening zone {idx} would exceed {self.max_open_zones} open zones", errno.EBUSY
            )
        self._cond[idx] = how

    # -- I/O -------------------------------------------------------------------------
    def claim_append(self, idx: int, offset: int, data) -> tuple[int, object]:
        """Check an append at ``offset`` and reserve its range; returns the zone file's fd and
        the bytes to write there (padded to the write granularity). The caller writes them at
        ``offset`` of that fd and calls ``append_failed`` if that fails (the compiled drive
        writers do the write without the GIL)."""
        fd = self._fd(idx)
        parts = isinstance(data, tuple)  # (header, payload) of the slice encoder: kept apart
        length = len(data[0]) + len(data[1]) if parts else len(data)
        pad = -length % self.write_granularity
        if pad:
            data = b"".join((*data, bytes(pad))) if parts else bytes(data) + bytes(pad)
            length += pad
        with self._lock:
            wp = self._wp[idx]
            self._check_append(idx, offset, length, wp, self.zone_size, self.condition(idx))
            self._make_open(idx, IMPLICIT_OPEN)
            # reserve the range first so two writers can never interleave in one zone
            self._wp[idx] = wp + length
        self.bytes_written += length
        if self.model is not None:
            self.model.on_write(self.model_key, idx * self.zone_size + offset, length)
        return fd, data

    def append_failed(self, idx: int) -> None:
        """A claimed append failed: the zone's real length is now unknown, so believe the file."""
        self.write_errors += 1
        with self._lock:
            self._wp[idx] = os.fstat(self._fd(idx)).st_size

    def append(self, idx: int, offset: int, data, durable: bool = False) -> None:
        fd, data = self.claim_append(idx, offset, data)
        length = len(data)  # type: ignore[arg-type]
        try:
            done = 0
            view = memoryview(data)  # type: ignore[arg-type]
            while done < length:
                if durable and _RWF_DSYNC:
                    # write and fdatasync in one call: one hand-back of the GIL instead of two
                    done += os.pwritev(fd, [view[done:]], offset + done, _RWF_DSYNC)
                else:
                    done += os.pwrite(fd, view[done:], offset + done)
            if durable and not _RWF_DSYNC:
                os.fdatasync(fd)
        except OSError:
            self.append_failed(idx)
            raise

    def _pointer_for_read(self, idx: int, fd: int, end: int) -> int:
        """The zone's pointer for a read up to ``end``: past the one this process knows, the
        file's length, since another process writing the same drive (a head of several,
        [heads] count, docs/pnfs.md) may have appended meanwhile. Never lowered: this
        process's appends may be reserved and not yet written."""
        wp = self._wp[idx]
        if end <= wp:
            return wp
        with self._lock:
            self._wp[idx] = wp = max(self._wp[idx], os.fstat(fd).st_size)
        return wp

    def read_into(self, idx: int, offset: int, buffers: list) -> int:
        fd = self._fd(idx)
        want = sum(len(b) for b in buffers)
        wp = self._pointer_for_read(idx, fd, offset + want)
        if offset < 0 or offset + want > wp:
            raise ZoneError(
                f"read of {want} bytes at {offset} of zone {idx} passes its write pointer {wp}"
            )
        try:
            got = os.preadv(fd, buffers, offset)
        except OSError:
            self.read_errors += 1
            raise
        self.bytes_read += got
        if self.model is not None:
            self.model.on_read(self.model_key, idx * self.zone_size + offset, got)
        return got

    def read_cached(self, idx: int, offset: int, length: int) -> bytearray | None:
        fd = self._fds.get(idx)  # opening a zone file is left to a thread that may block
        if fd is None or _RWF_NOWAIT is None or offset < 0 or offset + length > self._wp[idx]:
            return None
        if fragmentio is not None:
            buf = fragmentio.read_cached(fd, offset, length)
        else:
            buf = bytearray(length)
            try:
                got = os.preadv(fd, [buf], offset, _RWF_NOWAIT)
            except OSError:  # EAGAIN, or an error the blocking read meets and reports
                return None
            if got != length:  # partly in memory: the rest would wait
                return None
        if buf is None:
            return None
        self.bytes_read += length
        if self.model is not None:
            self.model.on_read(self.model_key, idx * self.zone_size + offset, length)
        return buf

    def read_cached_into(self, idx: int, offset: int, buffers: list) -> bool:
        fd = self._fds.get(idx)
        length = sum(len(b) for b in buffers)
        if fd is None or _RWF_NOWAIT is None or offset < 0 or offset + length > self._wp[idx]:
            return False
        if fragmentio is not None:
            if not fragmentio.read_cached_into(fd, offset, buffers):
                return False
        else:
            try:
                if os.preadv(fd, buffers, offset, _RWF_NOWAIT) != length:
                    return False
            except OSError:
                return False
        self.bytes_read += length
        if self.model is not None:
            self.model.on_read(self.model_key, idx * self.zone_size + offset, length)
        return True

    def sync(self, idx: int) -> None:
        os.fdatasync(self._fd(idx))

    def will_read(self, idx: int, offset: int, length: int) -> None:
        os.posix_fadvise(self._fd(idx), offset, length, os.POSIX_FADV_WILLNEED)

    def start_writeback(self, idx: int, offset: int, length: int) -> None:
        """Start writing a range to the medium without waiting, so the later
        fsync finds little to do."""
        if _sync_file_range is not None:
            _sync_file_range(self._fd(idx), offset, length, SYNC_FILE_RANGE_WRITE)

    def reset(self, idx: int) -> None:
        fd = self._fd(idx)
        with self._lock:
            os.ftruncate(fd, 0)
            if self.preallocate:
                preallocate(fd, self.zone_size)
            os.fsync(fd)
            self._wp[idx] = 0
            self._cond.pop(idx, None)
        if self.model is not None:
            self.model.on_reset(self.model_key, idx * self.zone_size, self.zone_size)

    def open_zone(self, idx: int) -> None:
        with self._lock:
            self._make_open(idx, EXPLICIT_OPEN)

    def close_zone(self, idx: int) -> None:
        with self._lock:
            if self._cond.get(idx) in (IMPLICIT_OPEN, EXPLICIT_OPEN):
                self._cond[idx] = EMPTY if self.write_pointer(idx) == 0 else CLOSED

    def finish_zone(self, idx: int) -> None:
        """No more writes until reset. The file stays short: its length is
        still what was written."""
        with self._lock:
            self._fd(idx)
            self._cond[idx] = FULL

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()
