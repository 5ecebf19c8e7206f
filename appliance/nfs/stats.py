"""Counters of the NFS server, cumulative since start, for /metrics and the web UI's charts.

Names follow engine/admin/metrics.py: nfs_ops, nfs_ops_<op>, nfs_read_bytes,
nfs_write_bytes, nfs_latency_le_<ms> (cumulative histogram buckets of whole
RPC calls), nfs_latency_le_inf and nfs_latency_sum_s, nfs_compounds_from_cache and
nfs_compounds_handed_off (the event loop's attempts: answered, passed to a worker).

Per operation (``op_done``/``ops_done``): nfs_latency_<op>_le_<ms> (cumulative buckets of
OP_LATENCY_BUCKETS_MS, "0_25" for 0.25 ms), nfs_latency_<op>_le_inf, nfs_latency_<op>_sum_s,
with <op> as in nfs_ops_<op>; per export: export_<id>_ops, export_<id>_read_bytes and
export_<id>_write_bytes. A COMPOUND's operations are recorded as one list appended to a queue
(``ops_done``: no lock, no per-operation work on the request's path), folded into the counters
under the lock the other counters take every FOLD_BATCH COMPOUNDs and at each ``snapshot``, so
a snapshot holds every COMPOUND answered before it; buckets are summed into cumulative ones only
in ``snapshot``."""

from __future__ import annotations

import bisect
import threading
from collections import Counter, deque

LATENCY_BUCKETS_MS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 5000)
# finer at the low end: a GETATTR from the caches takes a few hundred microseconds
OP_LATENCY_BUCKETS_MS = (0.1, 0.25, 0.5, 1, 2.5, 10, 50, 250, 1000)
FOLD_BATCH = 64  # COMPOUNDs recorded by ops_done between two folds into the counters


class NfsStats:
    def __init__(self):
        self._lock = threading.Lock()
        self._ops: Counter = Counter()
        self._buckets = [0] * (len(LATENCY_BUCKETS_MS) + 1)
        self.read_bytes = 0
        self.write_bytes = 0
        self.latency_sum_s = 0.0
        self.from_cache = 0
        self.handed_off = 0
        # op -> [count per OP_LATENCY_BUCKETS_MS bucket..., overflow count, sum of seconds]
        self._op_latency: dict[str, list] = {}
        # export id -> [operations, bytes read, bytes written]
        self._exports: dict[int, list[int]] = {}
        self._unfolded: deque = deque()  # ops_done's lists not yet counted (appends are atomic)

    def op(self, name: str) -> None:
        with self._lock:
            self._ops[name] += 1

    def read(self, nbytes: int, export_id: int | None = None) -> None:
        with self._lock:
            self.read_bytes += nbytes
            if export_id is not None:
                self._export(export_id)[1] += nbytes

    def write(self, nbytes: int, export_id: int | None = None) -> None:
        with self._lock:
            self.write_bytes += nbytes
            if export_id is not None:
                self._export(export_id)[2] += nbytes

    def _export(self, export_id: int) -> list[int]:
        found = self._exports.get(export_id)
        if found is None:
            found = self._exports[export_id] = [0, 0, 0]
        return found

    def _op_latency_add(self, name: str, seconds: float) -> None:
        row = self._op_latency.get(name)
        if row is None:
            row = self._op_latency[name] = [0] * (len(OP_LATENCY_BUCKETS_MS) + 1) + [0.0]
        row[bisect.bisect_left(OP_LATENCY_BUCKETS_MS, seconds * 1000)] += 1
        row[-1] += seconds

    def op_done(self, name: str, seconds: float, export_id: int | None = None) -> None:
        """One operation answered in ``seconds``: counted, timed, and counted for its export
        (an NFSv3 procedure, an NFSv4.0 operation)."""
        with self._lock:
            self._ops[name] += 1
            self._op_latency_add(name, seconds)
            if export_id is not None:
                self._export(export_id)[0] += 1

    def ops_done(self, done: list) -> None:
        """The operations of one COMPOUND: (name, seconds, current file handle) each, the handle
        anything with an ``export`` (an ExportRule, or None) or None. Counted at the next fold;
        ``done`` must not change afterwards."""
        unfolded = self._unfolded
        unfolded.append(done)
        if len(unfolded) >= FOLD_BATCH:
            with self._lock:
                self._fold()

    def _fold(self) -> None:
        """Count what ops_done queued (the caller holds the lock)."""
        unfolded, ops, latency = self._unfolded, self._ops, self._op_latency
        bounds, where = OP_LATENCY_BUCKETS_MS, bisect.bisect_left
        while unfolded:  # only holders of the lock take from it
            done = unfolded.popleft()
            for name, seconds, node in done:
                ops[name] += 1
                row = latency.get(name)
                if row is None:
                    row = latency[name] = [0] * (len(bounds) + 1) + [0.0]
                row[where(bounds, seconds * 1000)] += 1
                row[-1] += seconds
                export = node.export if node is not None else None
                if export is not None:
                    self._export(export.id)[0] += 1

    def attempt(self, answered: bool) -> None:
        """The event loop tried a COMPOUND from the caches: answered it, or handed it off."""
        with self._lock:
            if answered:
                self.from_cache += 1
            else:
                self.handed_off += 1

    def call_done(self, seconds: float) -> None:
        index = bisect.bisect_left(LATENCY_BUCKETS_MS, seconds * 1000)
        with self._lock:
            self._buckets[index] += 1
            self.latency_sum_s += seconds

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            self._fold()
            out = {
                "nfs_ops": sum(self._ops.values()),
                "nfs_read_bytes": self.read_bytes,
                "nfs_write_bytes": self.write_bytes,
                "nfs_latency_sum_s": self.latency_sum_s,
                "nfs_compounds_from_cache": self.from_cache,
                "nfs_compounds_handed_off": self.handed_off,
            }
            out.update({f"nfs_ops_{name}": count for name, count in self._ops.items()})
            running = 0
            # _buckets has one more (the overflow bucket), counted below
            for bound, count in zip(LATENCY_BUCKETS_MS, self._buckets, strict=False):
                running += count
                out[f"nfs_latency_le_{bound}"] = running
            out["nfs_latency_le_inf"] = running + self._buckets[-1]
            for name, row in self._op_latency.items():
                running = 0
                for ms, count in zip(OP_LATENCY_BUCKETS_MS, row, strict=False):
                    running += count
                    out[f"nfs_latency_{name}_le_{bound_name(ms)}"] = running
                out[f"nfs_latency_{name}_le_inf"] = running + row[-2]
                out[f"nfs_latency_{name}_sum_s"] = row[-1]
            for export_id, (ops, read, written) in self._exports.items():
                out[f"export_{export_id}_ops"] = ops
                out[f"export_{export_id}_read_bytes"] = read
                out[f"export_{export_id}_write_bytes"] = written
            return out


def bound_name(ms: float) -> str:
    """A bucket bound as a metric name part: 1 -> "1", 0.25 -> "0_25"."""
    return f"{ms:g}".replace(".", "_")
