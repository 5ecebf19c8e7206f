"""Counters of the NFS server, cumulative since start, for /metrics and the web UI's charts.

Names follow engine/metrics.py: nfs_ops, nfs_ops_<op>, nfs_read_bytes,
nfs_write_bytes, nfs_latency_le_<ms> (cumulative histogram buckets of whole
RPC calls), nfs_latency_le_inf and nfs_latency_sum_s, nfs_compounds_from_cache and
nfs_compounds_handed_off (the event loop's attempts: answered, passed to a worker)."""

from __future__ import annotations

import bisect
import threading
from collections import Counter

LATENCY_BUCKETS_MS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 5000)


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

    def op(self, name: str) -> None:
        with self._lock:
            self._ops[name] += 1

    def read(self, nbytes: int) -> None:
        with self._lock:
            self.read_bytes += nbytes

    def write(self, nbytes: int) -> None:
        with self._lock:
            self.write_bytes += nbytes

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
            return out
