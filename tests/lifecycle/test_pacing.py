"""Rate limiter and progress tracker of the background jobs."""

from __future__ import annotations

import pytest

from engine.lifecycle.pacing import RateLimiter, Tracker


class FakeTime:
    def __init__(self):
        self.now = 100.0

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def test_rate_limiter_keeps_the_average_rate():
    t = FakeTime()
    limiter = RateLimiter(
        bytes_per_s=1000, items_per_s=None, burst_s=1, clock=t.clock, sleep=t.sleep
    )
    for _ in range(10):
        limiter.spend(500)
        t.now += 0.1  # the work itself took 0.1 s
    # 5000 bytes at 1000 B/s: 5 s in all, of which 1 s was work
    assert t.now == pytest.approx(100 + 5.1, abs=0.01)
    assert limiter.slept_s == pytest.approx(4.1, abs=0.01)


def test_rate_limiter_items_and_unlimited():
    t = FakeTime()
    items = RateLimiter(items_per_s=4, burst_s=0, clock=t.clock, sleep=t.sleep)
    for _ in range(8):
        items.spend(10**9)
    assert t.now == pytest.approx(102.0)
    free = RateLimiter(clock=t.clock, sleep=t.sleep)
    assert free.spend(10**12) == 0.0
    with pytest.raises(ValueError, match="bytes_per_s -1"):
        RateLimiter(bytes_per_s=-1)


def test_tracker_reports_rate_and_eta():
    t = FakeTime()
    seen = []
    tracker = Tracker(
        4_000_000, lambda d, n, m: seen.append((d, n, m)), "rebuild", every_s=0, clock=t.clock
    )
    t.now += 1
    tracker.add(1_000_000)
    assert seen[-1][:2] == (1_000_000, 4_000_000)
    assert "1.0 MB/s" in seen[-1][2] and "ETA 3.0 s" in seen[-1][2]
    t.now += 3
    tracker.add(3_000_000)
    assert "ETA" not in seen[-1][2]
