"""Rate limiting and progress for background jobs (like Swift's auditor: bytes/s and items/s).

A job calls ``limiter.spend(nbytes)`` after each unit of work; the limiter sleeps
just enough to keep the average at the configured rate. ``Tracker`` turns
(done, total) into the ``progress(done, total, message)`` callbacks the CLI and web
UI show, with an ETA from the measured rate."""

from __future__ import annotations

import time
from collections.abc import Callable

from engine.base.ordered_lock import lock
from engine.base.units import format_duration, format_size

Progress = Callable[[int, int, str], None]


class RateLimiter:
    """Keeps the long-run average of ``spend`` at or below ``bytes_per_s`` and ``items_per_s``.

    A rate of 0 or None means unlimited. ``burst_s`` lets a job run ahead by that much
    time after an idle spell, and no more."""

    def __init__(
        self,
        bytes_per_s: float | None = None,
        items_per_s: float | None = None,
        *,
        burst_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        for name, value in (("bytes_per_s", bytes_per_s), ("items_per_s", items_per_s)):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0
            ):
                raise ValueError(f"{name} {value!r}: expected a number >= 0 (0 or None: unlimited)")
        self.bytes_per_s = bytes_per_s or 0
        self.items_per_s = items_per_s or 0
        self.burst_s = burst_s
        self._clock = clock
        self._sleep = sleep
        self._next = clock()  # when the budget spent so far is paid off
        self._lock = lock("lifecycle.rate_limiter")
        self.slept_s = 0.0

    def spend(self, nbytes: int = 0, items: int = 1) -> float:
        """Account for work done; sleep if it ran ahead of the rate. Returns seconds slept."""
        cost = 0.0
        if self.bytes_per_s:
            cost = max(cost, nbytes / self.bytes_per_s)
        if self.items_per_s:
            cost = max(cost, items / self.items_per_s)
        if not cost:
            return 0.0
        with self._lock:
            now = self._clock()
            self._next = max(self._next, now - self.burst_s) + cost
            wait = self._next - now
        if wait > 0:
            self._sleep(wait)
            self.slept_s += wait
            return wait
        return 0.0


class Tracker:
    """Counts done work against a total and reports it with throughput and ETA."""

    def __init__(
        self,
        total: int,
        progress: Progress | None,
        what: str,
        *,
        unit: str = "bytes",
        every_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.total = total
        self.done = 0
        self.progress = progress
        self.what = what
        self.unit = unit
        self.every_s = every_s
        self._clock = clock
        self.started = clock()
        self._last = float("-inf")

    @property
    def elapsed_s(self) -> float:
        return max(self._clock() - self.started, 1e-9)

    @property
    def rate(self) -> float:
        return self.done / self.elapsed_s

    @property
    def eta_s(self) -> float | None:
        if not self.done:
            return None
        return max(self.total - self.done, 0) / self.rate

    def message(self) -> str:
        if self.unit == "bytes":
            text = (
                f"{self.what}: {format_size(self.done)} of {format_size(self.total)}, "
                f"{self.rate / 1e6:.1f} MB/s"
            )
        else:
            text = f"{self.what}: {self.done}/{self.total} {self.unit}"
        eta = self.eta_s
        if eta is not None and self.done < self.total:
            text += f", ETA {format_duration(eta)}"
        return text

    def add(self, amount: int, force: bool = False) -> None:
        self.done += amount
        now = self._clock()
        if self.progress and (force or now - self._last >= self.every_s or self.done >= self.total):
            self._last = now
            self.progress(self.done, self.total, self.message())

    def finish(self, message: str | None = None) -> None:
        if self.progress:
            self.progress(self.done, max(self.total, self.done), message or self.message())
