"""Smoke run of bench/heads_catalog.py (several head processes over one SQLite catalog) so the
harness cannot rot: tiny sizes, one round of every layout for 1 and 2 heads, their summary lines
with positive numbers, and what tells the layouts apart: only processes sharing a catalog empty
each other's namespace caches; plus the cross-process visibility line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LINE = re.compile(r"^(1_process|2_shared|2_queued|2_separate|2_threads) (.*)$")
VISIBILITY = re.compile(r"^visibility (.*)$")


def test_heads_catalog_smoke_reports_every_layout(tmp_path):
    samples_file = tmp_path / "runs.json"
    proc = subprocess.run(
        [sys.executable, "bench/heads_catalog.py", "--smoke", "--heads", "1,2", "--rounds", "1"]
        + ["--json", str(samples_file)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    found, visibility = {}, None
    for line in proc.stdout.splitlines():
        if match := LINE.match(line):
            found[match.group(1)] = {
                k: float(v) for k, v in (pair.split("=") for pair in match.group(2).split())
            }
        elif match := VISIBILITY.match(line):
            visibility = {
                k: float(v) for k, v in (pair.split("=") for pair in match.group(1).split())
            }
    assert set(found) == {"1_process", "2_shared", "2_queued", "2_separate", "2_threads"}, (
        proc.stdout
    )
    for row in found.values():
        assert row["ops_per_s"] > 0 and row["cpu_us_per_op"] > 0
        assert row["small_file_p99_us"] >= row["small_file_p50_us"] > 0
        assert row["retries"] == 0  # busy waits stay inside SQLite's busy handler
    # another head's commit drops only what its change record names (docs/heads.md "Change
    # records"): a cache is emptied only when a record is lapped or a thread reads the epoch
    # between a commit and its record, so a handful of clears at most, never one per commit
    for name, row in found.items():
        assert row["cache_clears"] <= 3, (name, proc.stdout)
    assert visibility is not None, proc.stdout
    assert visibility["rounds"] == 10
    # the reader sees 20 foreign commits (a create and a rename per round): emptying its cache
    # for each, as before the change records, would clear about 20 times
    assert visibility["reader_cache_clears"] < visibility["rounds"], proc.stdout
    # a change shows in the other process's next lookup: within seconds even on a loaded machine
    assert visibility["create_max_us"] < 5e6 and visibility["rename_max_us"] < 5e6
    runs = json.loads(samples_file.read_text())["runs"]
    assert len(runs["2 shared"]) == 1
    lookups = runs["2 shared"][0]["latency"]["lookup"]
    assert lookups["p99_us"] >= lookups["p50_us"] > 0
