"""A deterministic cost model of a 7200 rpm SMR drive.

Attached to drives (``drive.model``), it sees every I/O and computes what it
would cost on a real drive: a seek (average seek + half a rotation) whenever
an I/O does not start where the head is, transfer at the sequential rate,
and, in drive-managed mode, the band rewrite that a write anywhere but a
band's write pointer forces (the "write cliff": the drive reads the band,
merges, and writes the whole band back). It reports host bytes, media
bytes, write amplification, seeks, band rewrites and predicted busy time,
per drive and in total. This is how the scheduler is judged on machines
without SMR drives. The model has no media cache: it shows the worst case
a sustained random-write load reaches once a real drive's cache is full."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.base.ordered_lock import lock

MiB = 1 << 20


@dataclass(frozen=True)
class SmrParams:
    seek_ms: float = 8.0
    rotational_ms: float = 4.2
    sequential_MiBps: float = 235.0
    band_size: int = 256 * MiB
    drive_managed: bool = False


@dataclass
class DriveCost:
    host_write_bytes: int = 0
    media_write_bytes: int = 0
    read_bytes: int = 0
    writes: int = 0
    sequential_writes: int = 0  # writes landing at their band's write pointer
    seeks: int = 0
    band_rewrites: int = 0
    busy_s: float = 0.0
    head: int = -1
    band_wp: dict = field(default_factory=dict)

    @property
    def write_amplification(self) -> float:
        return self.media_write_bytes / self.host_write_bytes if self.host_write_bytes else 1.0

    def summary(self) -> dict:
        return {
            "host_write_bytes": self.host_write_bytes,
            "media_write_bytes": self.media_write_bytes,
            "read_bytes": self.read_bytes,
            "writes": self.writes,
            "sequential_writes": self.sequential_writes,
            "seeks": self.seeks,
            "band_rewrites": self.band_rewrites,
            "busy_s": round(self.busy_s, 6),
            "write_amplification": round(self.write_amplification, 6),
        }


class SmrModel:
    def __init__(self, params: SmrParams | None = None, **overrides):
        base = params or SmrParams()
        self.params = SmrParams(**{**base.__dict__, **overrides})
        if self.params.band_size <= 0 or self.params.sequential_MiBps <= 0:
            raise ValueError(
                f"SMR model: band_size and sequential_MiBps must be > 0, got {self.params}"
            )
        self._bytes_per_s = self.params.sequential_MiBps * MiB
        self._position_s = (self.params.seek_ms + self.params.rotational_ms) / 1000
        self.drives: dict[object, DriveCost] = {}
        self._lock = lock("drives.smr_model")

    def _drive(self, key) -> DriveCost:
        cost = self.drives.get(key)
        if cost is None:
            cost = self.drives[key] = DriveCost()
        return cost

    def _move(self, cost: DriveCost, position: int, length: int) -> None:
        if position != cost.head:
            cost.seeks += 1
            cost.busy_s += self._position_s
        cost.busy_s += length / self._bytes_per_s
        cost.head = position + length

    def prefill(self, key, position: int, length: int) -> None:
        """Mark a region as already written (a file laid out before the measured run)."""
        with self._lock:
            cost = self._drive(key)
            band = self.params.band_size
            first, last = position // band, (position + length - 1) // band
            for b in range(first, last + 1):
                cost.band_wp[b] = max(
                    cost.band_wp.get(b, 0), min(position + length - b * band, band)
                )

    def on_write(self, key, position: int, length: int) -> None:
        if length <= 0:
            return
        band = self.params.band_size
        with self._lock:
            cost = self._drive(key)
            cost.writes += 1
            cost.host_write_bytes += length
            b = position // band
            offset = position - b * band
            wp = cost.band_wp.get(b, 0)
            if offset == wp:
                cost.sequential_writes += 1
                cost.media_write_bytes += length
                self._move(cost, position, length)
            elif not self.params.drive_managed:
                # a host-managed drive rejects this write; the drive layer never sends one
                cost.media_write_bytes += length
                self._move(cost, position, length)
            else:
                # read the band, merge, write it back: the write cliff
                cost.band_rewrites += 1
                cost.media_write_bytes += band
                cost.busy_s += 2 * self._position_s + 2 * band / self._bytes_per_s
                cost.head = (b + 1) * band
            end = min(offset + length, band)
            cost.band_wp[b] = max(wp, end)
            # a write spilling into following bands appends there
            rest = offset + length - band
            nb = b + 1
            while rest > 0:
                cost.band_wp[nb] = max(cost.band_wp.get(nb, 0), min(rest, band))
                rest -= band
                nb += 1

    def on_reset(self, key, position: int, length: int) -> None:
        """A zone reset empties the bands it covers: the next write at their start is an append."""
        band = self.params.band_size
        with self._lock:
            cost = self._drive(key)
            for b in range(position // band, (position + max(length, 1) - 1) // band + 1):
                cost.band_wp[b] = 0

    def on_read(self, key, position: int, length: int) -> None:
        if length <= 0:
            return
        with self._lock:
            cost = self._drive(key)
            cost.read_bytes += length
            self._move(cost, position, length)

    def reset(self) -> None:
        """Zero the counters; heads and band write pointers stay (the media still
        hold what was written)."""
        with self._lock:
            for key, cost in list(self.drives.items()):
                self.drives[key] = DriveCost(head=cost.head, band_wp=cost.band_wp)

    def report(self) -> dict:
        with self._lock:
            per_drive = {str(k): c.summary() for k, c in self.drives.items()}
            host = sum(c.host_write_bytes for c in self.drives.values())
            media = sum(c.media_write_bytes for c in self.drives.values())
            writes = sum(c.writes for c in self.drives.values())
            sequential = sum(c.sequential_writes for c in self.drives.values())
            return {
                "host_write_bytes": host,
                "media_write_bytes": media,
                "write_amplification": media / host if host else 1.0,
                "max_drive_write_amplification": max(
                    (c.write_amplification for c in self.drives.values()), default=1.0
                ),
                "writes": writes,
                "sequential_append_share": sequential / writes if writes else 1.0,
                "seeks": sum(c.seeks for c in self.drives.values()),
                "band_rewrites": sum(c.band_rewrites for c in self.drives.values()),
                "busy_s": max((c.busy_s for c in self.drives.values()), default=0.0),
                "drives": per_drive,
            }
