"""Smoke run of bench/fencing.py so the harness cannot rot: one takeover at a 2 s lease and the
fence's cost on SQLite, with the shape and the bounds of the numbers it prints."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

from etcdserver import etcd_installed  # noqa: E402


@pytest.mark.skipif(not etcd_installed(), reason="etcd-server is not installed")
def test_fencing_bench_reports_takeover_and_fence_cost():
    run = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "fencing.py"),
            "--trials=1",
            "--ttls=2",
            "--txns=200",
            "--no-postgres",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    results = json.loads(run.stdout)
    [takeover] = results["takeover"]
    assert takeover["ttl_s"] == 2 and takeover["trials"] == 1
    # the dead lease had 2/3 to all of its 2 s left; etcd checks expiry every 0.5 s
    assert 0.5 < takeover["median_s"] < 4
    assert takeover["min_s"] == takeover["median_s"] == takeover["max_s"]
    small, batch = results["fence"]["sqlite"]
    assert (small["rows_per_txn"], batch["rows_per_txn"]) == (1, 50)
    for row in (small, batch):
        assert row["plain_wall_us"] > 0 and row["fenced_wall_us"] > 0
        assert row["wall_ratio"] > 0 and row["cpu_ratio"] > 0
    assert 0 < results["contextvar_ns"] < 10_000
