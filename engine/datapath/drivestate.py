"""In-memory state of the drives and zones the data path writes to.

The catalog's Zone rows are the committed truth; this mirror adds what only
the running process knows: the on-disk append position of each zone, the
fragments written but not yet committed (``inflight``), the open band of each
class, and whether the drive's folder is still there (``present``: a folder seen gone calls
``on_gone``, which the drive watch, drivewatch.py, turns into the state "missing")."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

from engine.base.blocking import blocking_forbidden
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


def describe_medium(row) -> str:
    """What holds a drive, as messages name it: "its folder PATH", "its device DEV" or "its
    agent at HOST:PORT" (an agent's drive has no folder on this host)."""
    backend = getattr(row, "backend", None)
    if backend == "agent":
        return f"its agent at {row.path}"
    if backend == "zoned-block":
        return f"its device {getattr(row, 'device', None) or row.path}"
    return f"its folder {row.path}"


class DriveState:
    def __init__(self, row, zone_rows):
        self.id = row.id
        self.uuid = row.uuid
        self.path = row.path
        # the failure domain placement spreads over ("" for the head's own host)
        self.host: str = getattr(row, "host", None) or ""
        self.backend_kind: str = getattr(row, "backend", None) or "zonefile"
        # what holds the drive, for messages: a folder of zone files, a device, or an agent
        self.medium = describe_medium(row)
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
        # zones open at once, at most: a zoned device refuses more active zones (max_active)
        # and closes an implicitly open one past max_open; 0: no limit
        self.max_open_zones = row.max_open_zones or 0
        # a backend may open while its medium is away (an agent's drive whose agent is down)
        self._present = self.backend is not None and self.backend.present()
        self._present_at = time.monotonic()
        self.on_gone: Callable[[DriveState], None] | None = None
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self.native = None  # the compiled writer (engine.native.driveio.DriveQueue), if used

    def present(self) -> bool:
        if self.backend is None:
            return False
        # a stat of a hung filesystem hangs as well: the NFS event loop (reading from the page
        # cache) goes by the last look, which the drive watch renews every PRESENCE_TTL_S
        if time.monotonic() - self._present_at > PRESENCE_TTL_S and not blocking_forbidden():
            self.check_presence()
        return self._present

    def check_presence(self) -> bool:
        """Look now whether the drive's folder (or device) is there; ``on_gone`` is called when
        it was there at the last look and is not any more."""
        was = self._present
        # open file descriptors survive an rm -rf or a rename: look at the folder itself
        self._present = self.backend is not None and self.backend.present()
        self._present_at = time.monotonic()
        if was and not self._present and self.on_gone is not None:
            self.on_gone(self)
        return self._present

    def adopt_backend(self, backend) -> object:
        """Use ``backend`` (a reopened drive) from now on; returns the one it replaces."""
        old, self.backend = self.backend, backend
        self.granularity = getattr(backend, "write_granularity", 1) or 1
        self.open_error = None
        self._present, self._present_at = True, time.monotonic()
        return old

    def readable(self) -> bool:
        return self.state in READABLE_STATES and self.present()

    def writable(self) -> bool:
        return self.state in WRITABLE_STATES and not self.write_failed and self.present()

    def condition(self) -> str:
        """Why the drive takes writes or not, in a word or three (for error messages)."""
        if self.backend is None or not self.present():
            return "missing"
        if self.write_failed:
            return "failed a write"
        return self.state

    def open_zones(self) -> int:
        """Zones open for appends (bands and lifecycle jobs' zones)."""
        return sum(1 for zone in self.zones if zone.state == "open")

    def at_open_limit(self) -> bool:
        """Whether opening one more zone would pass the drive's open-zone limit."""
        return bool(self.max_open_zones) and self.open_zones() >= self.max_open_zones

    def usable_bytes(self, reserve_zones: int, max_fragment: int, reclaimable: int = 0) -> int:
        """Bytes new fragments can surely take (each zone may waste a tail
        shorter than a fragment)."""
        per_zone = max(self.zone_size - max_fragment, 0)
        total = max(len(self.empty) + reclaimable - reserve_zones, 0) * per_zone
        for zone in self.open.values():
            total += max(self.zone_size - zone.wp - max_fragment, 0)
        return total
