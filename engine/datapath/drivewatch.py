"""The drive watch: a drive that disappears or fails I/O becomes a drive state and an event.

Faults reach it three ways:
- the I/O paths report errors (``note_io_error``: the drive writers' appends and fsyncs, the
  reader's fragment reads);
- a drive's presence check (``DriveState.present``, at most twice a second, on every placement
  and read, and by this watch's thread every ``PRESENCE_TTL_S`` for the NFS event loop, which
  never stats) sees its folder or device gone and calls ``on_gone``;
- ``check``, run by the daemon's maintenance loop (``maintenance.drive_check_interval_s``),
  looks at every drive even when no I/O touches it.
Errors saying the drive is gone (ENOENT on a zone file, ENODEV, ENXIO, ESTALE, or a folder no
longer there) make it ``missing`` (neither read nor written); other I/O errors make it
``degraded`` (still read, no new fragments). Both take effect in memory at once (a missing
folder fails ``present``; a failed write sets ``write_failed``) and reach the catalog (state and
``drive.state`` event) from the watch's thread, which never runs on an I/O path.

A missing drive whose folder comes back is taken back only when that is safe: its label names
the same drive (``open_drive`` checks the uuid), no fragment is still on its way to the old
files, and each zone is compared with the catalog as at start (recovery.recover_drive: bytes
past the committed pointer become garbage). It then returns to the state it had before it went
missing. A zone shorter than the catalog's pointer lost committed fragments: the drive comes
back ``degraded`` (read, never written; the reads of those fragments fail and decode from the
other drives, scrub repairs them). The contents are not read here: every fragment read checks
its crc32c anyway. A folder that cannot be taken back (another drive's label, unreadable) is
reported once as a ``drive.refused`` event and the drive stays missing."""

from __future__ import annotations

import errno
import json
import logging
import os
import queue
import threading
from typing import NamedTuple

from sqlalchemy import select

from engine.admin.events import record
from engine.base.errors import ConfigError
from engine.base.ordered_lock import lock
from engine.base.ratelog import RateLimitedLog
from engine.catalog.database import CatalogUnreachable
from engine.catalog.models import Drive, Event
from engine.datapath.drivestate import PRESENCE_TTL_S, DriveState
from engine.datapath.recovery import RecoveryReport, record_updates, recover_drive
from engine.drives import DriveMissing, ZoneError, open_drive
from engine.lifecycle.drives import (
    DEGRADED,
    DRAINING,
    FAILED,
    MISSING,
    ONLINE,
    REMOVED,
    TRANSITIONS,
    set_drive_state_in,
)

DRIVES = Drive.__table__
EVENTS = Event.__table__
GONE_ERRNOS = frozenset({errno.ENOENT, errno.ENODEV, errno.ENXIO, errno.ESTALE})
RECENT_STATE_EVENTS = 1000  # drive.state events searched for a missing drive's earlier state

log = logging.getLogger("shingle.drives")


def gone_reason(drive: DriveState) -> str:
    """Why a drive is missing, for its event and log line: its folder or device is gone, or its
    agent does not answer (a storage host down or cut off)."""
    if drive.backend_kind == "agent":
        return f"{drive.medium} does not answer"
    return f"{drive.medium} is gone"


class DriveChange(NamedTuple):
    drive_id: int
    old: str
    new: str
    reason: str


class DriveWatch:
    def __init__(self, catalog, space, writers, reader):
        self.catalog = catalog
        self.space = space
        self.writers = writers
        self._faults: queue.SimpleQueue = queue.SimpleQueue()  # (drive id, state, reason)
        self._pending: dict[int, tuple[str, str]] = {}  # noted, not yet in the catalog
        self._before: dict[int, str] = {}  # drive id -> its state before it went missing
        self._refused: dict[int, str] = {}  # drive id -> why its folder was not taken back
        self._lock = lock("datapath.drive_watch")  # one check at a time; guards the dicts
        self._wake = threading.Event()
        self._stopping = False
        self._warn = RateLimitedLog(log)
        for drive in space.drives.values():
            drive.on_gone = self._gone
        writers.on_io_error = reader.on_io_error = self.note_io_error
        self.thread = threading.Thread(target=self._run, daemon=True, name="shingle-drive-watch")

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        self.thread.join()

    # -- what the I/O paths report (any thread, any lock held: only queues) -------------------
    def note_io_error(self, drive: DriveState, exc: OSError, during: str) -> None:
        """An I/O error of ``drive`` during "write", "fsync" or "read"."""
        if during == "read" and isinstance(exc, ZoneError):
            return  # a read past the write pointer: a map older than a zone reset, not the drive
        gone = isinstance(exc, DriveMissing) or exc.errno in GONE_ERRNOS
        if gone or not drive.check_presence():
            self._faults.put((drive.id, MISSING, f"{during} failed: {exc}"))
        else:
            self._faults.put((drive.id, DEGRADED, f"{during} failed: {exc}"))
        self._wake.set()

    def note_faulty_zones(self, zones: list[tuple[int, int, str]]) -> None:
        """Zones a zoned device reports read-only or offline, found at start (recovery.py): their
        drive becomes degraded (read, never written)."""
        by_drive: dict[int, list[str]] = {}
        for drive_id, idx, condition in zones:
            by_drive.setdefault(drive_id, []).append(f"zone {idx} {condition}")
        for drive_id, found in by_drive.items():
            reason = (
                f"the device reports {len(found)} zones read-only or offline "
                f"({', '.join(found[:4])})"
            )
            self._faults.put((drive_id, DEGRADED, reason))
        if by_drive:
            self._wake.set()

    def note_gone(self, drive: DriveState) -> None:
        """``DriveState.on_gone``: the drive's folder or device went away."""
        self._gone(drive)

    def _gone(self, drive: DriveState) -> None:
        self._faults.put((drive.id, MISSING, gone_reason(drive)))
        self._wake.set()

    def _run(self) -> None:
        while True:
            woken = self._wake.wait(PRESENCE_TTL_S)
            if self._stopping:
                return
            if not woken:
                self._look_at_drives()
                continue
            self._wake.clear()
            try:
                self.check()
            except CatalogUnreachable:
                pass  # the faults stay pending; the catalog's outage log counts the failure
            except Exception as exc:  # the faults stay pending
                self._warn.error("check failed", "drive check failed: %s", exc)

    def _look_at_drives(self) -> None:
        """Every drive's presence, looked at again: the NFS event loop never stats (a hung
        filesystem would hang it) and goes by these looks. A drive seen gone wakes the check."""
        for drive in list(self.space.drives.values()):
            if drive.backend is None or drive.state in (MISSING, FAILED, REMOVED):
                continue
            try:
                drive.check_presence()  # calls _gone when it was there at the last look
            except Exception as exc:  # noqa: BLE001 - a look that fails is retried next time
                self._warn.error(
                    "presence failed", "drive %d presence check failed: %s", drive.id, exc
                )

    # -- the check ------------------------------------------------------------------------------
    def check(self) -> list[DriveChange]:
        """Look at every drive now; record the faults noted since the last check; take back the
        missing drives whose folder is back. Returns the state changes made."""
        with self._lock:
            changes: list[DriveChange] = []
            for drive in self.space.drives.values():
                if drive.state in (MISSING, FAILED, REMOVED):
                    continue
                if not drive.check_presence():  # calls _gone when it was there at the last look
                    why = drive.open_error or gone_reason(drive)
                    self._pending.setdefault(drive.id, (MISSING, why))
            while True:
                try:
                    drive_id, state, reason = self._faults.get_nowait()
                except queue.Empty:
                    break
                if state == MISSING or drive_id not in self._pending:
                    self._pending[drive_id] = (state, reason)
            for drive_id, (state, reason) in list(self._pending.items()):
                drive = self.space.drives.get(drive_id)
                if drive is not None:
                    was = drive.state
                    change = self._change(drive, state, reason)
                    if change is not None:
                        changes.append(change)
                        if state == MISSING:
                            self._before[drive_id] = was
                    if drive.state != ONLINE:
                        # the state keeps writes off it now; an admin may set it online again
                        drive.write_failed = False
                del self._pending[drive_id]
            for drive in self.space.drives.values():
                if drive.state == MISSING and self._folder_there(drive):
                    change = self._take_back(drive)
                    if change is not None:
                        changes.append(change)
            return changes

    def _change(self, drive: DriveState, new: str, reason: str) -> DriveChange | None:
        """Move the drive to ``new`` in the catalog (event included) if its state allows it."""

        def work(conn):
            old = conn.execute(select(DRIVES.c.state).where(DRIVES.c.id == drive.id)).scalar_one()
            if old == new or new not in TRANSITIONS.get(old, ()):
                return old, None
            set_drive_state_in(conn, drive.id, new, reason=reason)
            return old, new

        old, done = self.catalog.run(work)
        drive.state = done or old
        if done is None:
            return None
        level = logging.INFO if new in (ONLINE, DRAINING) else logging.ERROR
        log.log(level, "drive %d (%s): %s -> %s: %s", drive.id, drive.path, old, new, reason)
        return DriveChange(drive.id, old, new, reason)

    @staticmethod
    def _folder_there(drive: DriveState) -> bool:
        if drive.backend is not None:
            return drive.check_presence()
        return os.path.exists(drive.path)  # missing since start: no backend to ask

    def _take_back(self, drive: DriveState) -> DriveChange | None:
        row = self.catalog.read(
            lambda conn: conn.execute(select(DRIVES).where(DRIVES.c.id == drive.id)).one()
        )
        try:
            backend = open_drive(row)
        except (DriveMissing, ConfigError, OSError) as exc:
            self._refuse(drive, f"{drive.medium} is back but cannot be used: {exc}")
            return None
        try:
            for zone in drive.zones:  # every zone there and readable, before anything changes
                backend.write_pointer(zone.idx)
        except OSError as exc:
            backend.close()
            self._refuse(drive, f"{drive.medium} is back but cannot be used: {exc}")
            return None
        with self.space.lock:
            if any(zone.inflight for zone in drive.zones):
                backend.close()  # fragments still on their way to the old files: next round
                return None
            old_backend = drive.adopt_backend(backend)
            report = RecoveryReport(drives=1)
            updates = recover_drive(self.space, drive, report)
            drive.write_failed = False
        self.writers.retire(drive, old_backend)
        record_updates(self.catalog, updates)
        before = self._before.get(drive.id) or self._state_before_missing(drive.id)
        if report.short_zones:
            drive_id, idx, committed, medium = report.short_zones[0]
            target = DRAINING if before == DRAINING else DEGRADED
            reason = (
                f"{drive.medium} is back, but {len(report.short_zones)} zones are "
                f"shorter than the catalog says (zone {idx}: {medium} of {committed} bytes): "
                "their fragments are decoded from the other drives; run a scrub"
            )
        else:
            target = before
            reason = f"{drive.medium} is back: same drive label, write pointers as the catalog's"
        change = self._change(drive, target, reason)
        self._refused.pop(drive.id, None)
        self._before.pop(drive.id, None)
        return change

    def _refuse(self, drive: DriveState, why: str) -> None:
        if self._refused.get(drive.id) == why:
            return
        self._refused[drive.id] = why
        log.error("drive %d stays missing: %s", drive.id, why)
        record(
            self.catalog,
            "drive.refused",
            f"drive {drive.id} stays missing: {why}",
            severity="error",
            details={"drive_id": drive.id, "reason": why},
        )

    def _state_before_missing(self, drive_id: int) -> str:
        """The state a missing drive had (from its drive.state events; online if none says)."""

        def work(conn):
            return (
                conn.execute(
                    select(EVENTS.c.details)
                    .where(EVENTS.c.kind == "drive.state")
                    .order_by(EVENTS.c.id.desc())
                    .limit(RECENT_STATE_EVENTS)
                )
                .scalars()
                .all()
            )

        for text in self.catalog.read(work):
            details = json.loads(text) if text else {}
            if details.get("drive_id") == drive_id and details.get("to") == MISSING:
                before = details.get("from")
                return before if before in TRANSITIONS[MISSING] else ONLINE
        return ONLINE
