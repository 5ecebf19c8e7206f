"""Drive writers: the one writer thread (and its syncer) of each drive.

Everything that changes a drive goes through its writer's queue, in order: appends of
fragments (``Append``, durable before their ticket counts them), band ends (``Finish``),
repaired fragments (``RepairWrite``) and zone resets (``Reset``). A zone therefore only ever
sees appends at its write pointer (invariant 1), and a reset never overtakes a fragment queued
for the zone before it.

A ``WriteTicket`` is what a waiter holds: it counts down as its appends become durable and sets
``written`` when the last one is. The data path's stripes are tickets; the lifecycle jobs use
plain ones (engine/lifecycle/media.py).

Two implementations of the writer, one behaviour: where the compiled module is built
(engine/native/drivewriters.pyx) and the drive's backend can hand out a file descriptor for an
append (``claim_append``: zone files), a drive's appends and fdatasyncs run in a C thread that
takes the GIL only to finish a ticket, report an error or run a queued call (Finish, Reset,
RepairWrite, Retire run as such calls, in queue order, after every earlier append is durable).
Elsewhere (no compiler at install time, ``SHINGLE_NATIVE=0``, other backends) a Python writer
thread and its syncer do the same work."""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from engine.base import errors
from engine.base.ordered_lock import lock
from engine.coding.erasure import fragment_bytes
from engine.datapath.drivestate import DriveState
from engine.drives import ZonedDrive, ZoneFileDrive
from engine.native import driveio

# a build of the compiled writers from before append_parts joins the two parts (a copy)
_APPEND_PARTS = driveio is not None and hasattr(driveio.DriveQueue, "append_parts")


class PyCountdown:
    """The count of a ticket where the compiled module is not built (its ``Ticket`` is the
    same count behind a C mutex, so the C writer threads can count without the GIL)."""

    __slots__ = ("lock", "remaining")

    def __init__(self, *args, **kwargs):
        self.lock = lock("datapath.ticket")
        self.remaining = 0

    def fragment_done(self, count: int = 1) -> None:
        """``count`` appends are durable (or failed: see ``error``), or will never be queued."""
        with self.lock:
            self.remaining -= count
            last = self.remaining == 0
        if last:
            self.all_written()

    def all_written(self) -> None:
        pass


if TYPE_CHECKING or driveio is None:
    Countdown = PyCountdown
else:
    Countdown = driveio.Ticket


class WriteTicket(Countdown):
    """Appends on their way to durable media; ``written`` is set once the last one is."""

    __slots__ = ("written", "error")

    def __init__(self, count: int = 0):
        super().__init__()
        self.remaining = count
        self.written = threading.Event()
        self.error: BaseException | None = None

    def fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc

    def fragment_failed(self, drive: DriveState, exc: BaseException) -> None:
        """The append (or its fsync) of this ticket on ``drive`` failed: the whole ticket fails
        (a stripe may do without the fragment, PendingStripe)."""
        self.fail(exc)

    def all_written(self) -> None:
        self.written.set()


class Latch:
    """Counts down arrivals of queued drive operations; ``done`` is set when all arrived."""

    __slots__ = ("count", "lock", "done", "errors")

    def __init__(self, count: int):
        self.count = count
        self.lock = lock("datapath.ticket")
        self.done = threading.Event()
        self.errors: list = []
        if count == 0:
            self.done.set()

    def arrive(self, exc: BaseException | None = None) -> None:
        with self.lock:
            if exc is not None:
                self.errors.append(exc)
            self.count -= 1
            if self.count == 0:
                self.done.set()


class Append(NamedTuple):
    zone_idx: int
    offset: int
    data: object  # bytes-like
    ticket: WriteTicket


class Finish(NamedTuple):
    zone_idx: int


class RepairWrite(NamedTuple):
    zone_idx: int
    offset: int
    data: bytes
    latch: Latch


class Reset(NamedTuple):
    zone_idx: int
    latch: Latch


class Retire(NamedTuple):
    backend: object  # a drive's backend replaced by a reopened one: closed behind earlier items


class DriveWriters:
    """Starts, feeds and stops the writer and syncer threads of every drive."""

    def __init__(self, drives: dict[int, DriveState], stats):
        self.drives = drives
        self.stats = stats
        self.threads: list[threading.Thread] = []
        # on_io_error(drive, exc, during): an append or fsync failed (the drive watch listens)
        self.on_io_error: Callable[[DriveState, BaseException, str], None] | None = None

    def start(self) -> None:
        for drive in self.drives.values():
            self.start_drive(drive)

    def start_drive(self, drive: DriveState) -> None:
        """Start one drive's writer thread (at start, and for a drive added while running)."""
        # only zone files hand out a file descriptor for an append (claim_append)
        if driveio is not None and isinstance(drive.backend, ZoneFileDrive):
            drive.native = driveio.DriveQueue(
                lambda ticket, idx, err, during: self._native_failed(
                    drive, ticket, idx, err, during
                )
            )
            return
        drive.thread = threading.Thread(
            target=self._run, args=(drive,), daemon=True, name=f"shingle-drive-{drive.id}"
        )
        self.threads.append(drive.thread)
        drive.thread.start()

    def stop(self) -> None:
        for drive in self.drives.values():
            if drive.native is None:
                drive.queue.put(None)
        for drive in self.drives.values():
            if drive.native is not None:
                drive.native.stop()
            elif drive.thread is not None:
                drive.thread.join()
            if drive.backend is not None:
                drive.backend.close()

    # -- what callers queue ---------------------------------------------------------------
    def append(
        self, drive: DriveState, zone_idx: int, offset: int, data, ticket: WriteTicket
    ) -> None:
        """Queue an append; ``ticket.fragment_done()`` runs once it is durable (or failed)."""
        native = drive.native
        if native is None:
            drive.queue.put(Append(zone_idx, offset, fragment_bytes(data), ticket))
            return
        claimed = False
        try:
            backend = _zone_file(drive)
            # the range is claimed here, in queue order (callers queue a zone's appends in
            # offset order): the C thread then only writes
            fd, data = backend.claim_append(zone_idx, offset, data)
            claimed = True
            if isinstance(data, tuple):  # a fragment of the slice encoder: header, payload
                if _APPEND_PARTS:
                    native.append_parts(fd, offset, data[0], data[1], ticket, zone_idx)
                else:
                    native.append(fd, offset, fragment_bytes(data), ticket, zone_idx)
            else:
                native.append(fd, offset, data, ticket, zone_idx)
        except BaseException as exc:  # noqa: BLE001 - the ticket carries it, as in _run
            if claimed:
                backend.append_failed(zone_idx)
            drive.write_failed = True
            ticket.fragment_failed(
                drive, errors.IOFailure(f"drive {drive.id} zone {zone_idx}: write failed: {exc}")
            )
            ticket.fragment_done()
            self._io_error(drive, exc, "write")

    def _native_failed(
        self, drive: DriveState, ticket: WriteTicket, zone_idx: int, err: int, during: str
    ) -> None:
        """In the C writer thread, with the GIL: an append or its fdatasync failed."""
        exc = OSError(err, os.strerror(err))
        drive.write_failed = True
        if during == "write":
            _zone_file(drive).append_failed(zone_idx)
        ticket.fragment_failed(
            drive, errors.IOFailure(f"drive {drive.id} zone {zone_idx}: {during} failed: {exc}")
        )
        self._io_error(drive, exc, during)

    def _queue_item(self, drive: DriveState, item) -> None:
        """Queue a Finish, RepairWrite, Reset or Retire behind the drive's earlier appends."""
        if drive.native is None:
            drive.queue.put(item)
        else:
            drive.native.call(lambda: self._do_item(drive, item))

    def finish(self, drive: DriveState, zone_idx: int) -> None:
        """The band is done: tell the drive once every append queued for it has landed."""
        self._queue_item(drive, Finish(zone_idx))

    def write_repair(self, drive: DriveState, zone_idx: int, offset: int, data: bytes) -> Latch:
        """Append and fsync a repaired fragment; wait on the returned latch's ``done``."""
        latch = Latch(1)
        self._queue_item(drive, RepairWrite(zone_idx, offset, data, latch))
        return latch

    def retire(self, drive: DriveState, backend) -> None:
        """Close a backend the drive no longer uses, once everything queued before is done."""
        if backend is not None:
            self._queue_item(drive, Retire(backend))

    def reset_zones(self, zones: list[tuple[DriveState, int]]) -> None:
        """Reset each (drive, zone idx) through its writer's queue; wait for all of them."""
        latch = Latch(len(zones))
        for drive, zone_idx in zones:
            self._queue_item(drive, Reset(zone_idx, latch))
        latch.done.wait()
        if latch.errors:
            raise errors.IOFailure(f"zone reset failed: {latch.errors[0]}")

    def counters(self) -> dict[str, float]:
        """The compiled writers' totals (appends, bytes, syncs, batches, write_s, sync_s)."""
        out: dict[str, float] = {}
        for drive in self.drives.values():
            if drive.native is not None:
                for key, value in drive.native.counters().items():
                    out[key] = out.get(key, 0) + value
        return out

    # -- the threads ------------------------------------------------------------------------
    def _run(self, drive: DriveState) -> None:
        """The one writer of a drive: appends fragments in arrival order.

        fsync runs in the drive's syncer thread (group commit): while one fsync
        is under way the writer keeps appending, and the next fsync covers
        everything appended meanwhile. When nothing else waits, the writer
        fsyncs itself (a lone flush pays no hand-off). A fragment counts as
        written only once it is durable."""
        synced: queue.SimpleQueue = queue.SimpleQueue()
        syncer = threading.Thread(
            target=self._sync_loop,
            args=(drive, synced),
            daemon=True,
            name=f"shingle-sync-{drive.id}",
        )
        syncer.start()
        stats, pending = self.stats, drive.queue
        try:
            while True:
                item = pending.get()
                kind = type(item)
                if kind is Append:
                    idx, offset, data, ticket = item
                    try:
                        backend = _opened(drive)  # a drive that came back has a reopened backend
                        started = time.perf_counter()
                        if pending.empty() and synced.empty():
                            # nothing else to append meanwhile: no hand-off to the syncer (it would
                            # add latency), and the write is durable in the same call
                            backend.append(idx, offset, data, durable=True)
                            stats["fsync_s"] += time.perf_counter() - started
                            stats["fsyncs"] += 1
                            ticket.fragment_done()
                            continue
                        backend.append(idx, offset, data)
                        stats["append_s"] += time.perf_counter() - started
                        if pending.empty() and synced.empty():
                            self._sync_batch(drive, [(idx, ticket)])
                        else:
                            backend.start_writeback(idx, offset, len(data))
                            synced.put((idx, ticket))
                    except BaseException as exc:  # noqa: BLE001
                        drive.write_failed = True
                        ticket.fragment_failed(
                            drive,
                            errors.IOFailure(f"drive {drive.id} zone {idx}: write failed: {exc}"),
                        )
                        ticket.fragment_done()
                        self._io_error(drive, exc, "write")
                elif item is None:
                    return
                else:
                    self._do_item(drive, item)
        finally:
            synced.put(None)
            syncer.join()

    @staticmethod
    def _do_item(drive: DriveState, item) -> None:
        """In the drive's writer thread, in queue order: a Finish, RepairWrite, Reset or Retire."""
        kind = type(item)
        # a drive that came back has a reopened backend: _opened(drive) looks each time
        if kind is Finish:
            try:
                _opened(drive).finish_zone(item.zone_idx)
            except BaseException:  # noqa: BLE001 - a later append to it fails loudly anyway
                pass
        elif kind is RepairWrite:
            try:
                backend = _opened(drive)
                backend.append(item.zone_idx, item.offset, item.data)
                backend.sync(item.zone_idx)
                item.latch.arrive()
            except BaseException as exc:  # noqa: BLE001
                item.latch.arrive(exc)
        elif kind is Reset:
            try:
                _opened(drive).reset(item.zone_idx)
                item.latch.arrive()
            except BaseException as exc:  # noqa: BLE001
                item.latch.arrive(exc)
        elif kind is Retire:
            try:
                item.backend.close()
            except OSError:
                pass  # its files may be gone with the folder it named

    def _sync_loop(self, drive: DriveState, synced: queue.SimpleQueue) -> None:
        """fsync what the writer appended, as many fragments per fsync as arrived meanwhile."""
        stop = False
        while not stop:
            batch = [synced.get()]
            while True:
                try:
                    batch.append(synced.get_nowait())
                except queue.Empty:
                    break
            if batch[-1] is None:
                stop = True
                batch.pop()
            if batch:
                self._sync_batch(drive, batch)

    def _sync_batch(self, drive: DriveState, batch: list) -> None:
        """fsync the zones of ``batch`` [(zone idx, ticket)]; then each fragment counts."""
        started = time.perf_counter()
        error = None
        for idx in sorted({idx for idx, _ticket in batch}):
            try:
                _opened(drive).sync(idx)
            except BaseException as exc:  # noqa: BLE001
                drive.write_failed = True
                error = errors.IOFailure(f"drive {drive.id} zone {idx}: fsync failed: {exc}")
                self._io_error(drive, exc, "fsync")
        self.stats["fsync_s"] += time.perf_counter() - started
        self.stats["fsyncs"] += 1
        for _idx, ticket in batch:
            if error is not None:
                ticket.fragment_failed(drive, error)
            ticket.fragment_done()

    def _io_error(self, drive: DriveState, exc: BaseException, during: str) -> None:
        if self.on_io_error is not None and isinstance(exc, OSError):
            self.on_io_error(drive, exc, during)


def _opened(drive: DriveState) -> ZonedDrive:
    """The backend of a drive that is queued writes (or a reset, a band end, a retired backend)."""
    backend = drive.backend
    # only writable drives are queued anything (placement, repair and reclaim check writable(),
    # and a Retire follows adopt_backend), and a backend once opened is only ever replaced by a
    # reopened one, never dropped
    assert backend is not None, f"drive {drive.id} was queued I/O without an open backend"
    return backend


def _zone_file(drive: DriveState) -> ZoneFileDrive:
    """The backend of a drive with a compiled writer (start_drive gives one only to zone files;
    a drive that comes back reopens the same kind of backend, open_drive of the same row)."""
    backend = drive.backend
    assert isinstance(backend, ZoneFileDrive), f"drive {drive.id}: compiled writer, no zone files"
    return backend
