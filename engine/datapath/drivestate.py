"""In-memory state of the drives and zones the data path writes to.

The catalog's Zone rows are the committed truth; this mirror adds what only
the running process knows: the on-disk append position of each zone, the
fragments written but not yet committed (``inflight``), the open band of each
class, and whether the drive's folder is still there."""
from __future__ import annotations

import os
import queue
import threading
import time

from engine.drives import DriveMissing, open_drive

READABLE_STATES = ("online", "degraded", "draining")
WRITABLE_STATES = ("online",)
PRESENCE_TTL_S = 0.5


class ZoneMem:
    __slots__ = (
        "id",
        "idx",
        "state",
        "band_class",
        "wp",
        "committed_wp",
        "inflight",
        "dirty",
        "opened_ns",
    )

    def __init__(self, row):
        self.id = row.id
        self.idx = row.idx
        self.state = row.state
        self.band_class = row.band_class
        self.wp = row.write_pointer  # next append offset on the medium
        self.committed_wp = row.write_pointer
        self.inflight = 0  # fragments placed here and not yet committed
        self.dirty = False  # state/class changed since the last commit
        self.opened_ns = row.opened_ns


class DriveState:
    def __init__(self, row, zone_rows):
        self.id = row.id
        self.uuid = row.uuid
        self.path = row.path
        self.state = row.state
        self.zone_size = row.zone_size
        self.zone_count = row.zone_count
        self.zones = [ZoneMem(z) for z in sorted(zone_rows, key=lambda z: z.idx)]
        self.by_id = {z.id: z for z in self.zones}
        self.open: dict[str, ZoneMem] = {}
        self.empty: set[int] = set()
        self.write_failed = False
        self.backend = None
        self.open_error: str | None = None
        try:
            self.backend = open_drive(row)
        except (DriveMissing, OSError) as exc:
            self.open_error = str(exc)
        self.granularity = getattr(self.backend, "write_granularity", 1) or 1
        self._present = self.backend is not None
        self._present_at = time.monotonic()
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.thread: threading.Thread | None = None

    def present(self) -> bool:
        if self.backend is None:
            return False
        now = time.monotonic()
        if now - self._present_at > PRESENCE_TTL_S:
            # open file descriptors survive an rm -rf: look at the folder itself
            self._present = os.path.isdir(self.path)
            self._present_at = now
        return self._present

    def readable(self) -> bool:
        return self.state in READABLE_STATES and self.present()

    def writable(self) -> bool:
        return self.state in WRITABLE_STATES and not self.write_failed and self.present()

    def usable_bytes(self, reserve_zones: int, max_fragment: int, reclaimable: int = 0) -> int:
        """Bytes new fragments can surely take (each zone may waste a tail
        shorter than a fragment)."""
        per_zone = max(self.zone_size - max_fragment, 0)
        total = max(len(self.empty) + reclaimable - reserve_zones, 0) * per_zone
        for zone in self.open.values():
            total += max(self.zone_size - zone.wp - max_fragment, 0)
        return total
