"""Smoke run of bench/handoffs.py (server CPU and thread switches per MiB) so the harness cannot
rot: one tiny round against this tree, its per-run line and median line with positive numbers."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUN = re.compile(r"MB/s, server CPU ([\d.]+) ms/MiB .* ([\d.]+) thread switches/MiB")
MEDIAN = re.compile(r"^median .*: ([\d.]+) MB/s, ([\d.]+) ms of server CPU and ([\d.]+) thread")


def test_handoffs_smoke_reports_cpu_and_switches_per_mib():
    proc = subprocess.run(
        [
            sys.executable,
            "bench/handoffs.py",
            "--pairs",
            "1",
            "--runs",
            "1",
            "--mib",
            "2",
            "--drive-mib",
            "256",
            "--zone-mib",
            "16",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = [RUN.search(line) for line in proc.stdout.splitlines()]
    runs = [m for m in runs if m]
    assert len(runs) == 1, proc.stdout
    assert float(runs[0].group(1)) > 0 and float(runs[0].group(2)) > 0
    medians = [MEDIAN.match(line) for line in proc.stdout.splitlines()]
    medians = [m for m in medians if m]
    assert len(medians) == 1, proc.stdout
    assert all(float(v) > 0 for v in medians[0].groups())


def test_handoffs_smoke_with_two_heads_counts_the_heads():
    """--heads 2: the figures are the listener's and its heads' (the listener alone, which runs
    no NFS, costs under 0.1 ms of CPU and a few switches per MiB; a head serving writers, ms)."""
    proc = subprocess.run(
        [
            sys.executable,
            "bench/handoffs.py",
            "--heads",
            "2",
            "--pairs",
            "1",
            "--runs",
            "1",
            "--mib",
            "2",
            "--drive-mib",
            "256",
            "--zone-mib",
            "16",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = [m for m in map(RUN.search, proc.stdout.splitlines()) if m]
    assert len(runs) == 1, proc.stdout
    cpu_ms, switches = float(runs[0].group(1)), float(runs[0].group(2))
    assert cpu_ms > 0.5 and switches > 5, proc.stdout
