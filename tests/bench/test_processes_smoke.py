"""Smoke run of bench/processes.py (one and two `shingle serve` processes side by side) so the
harness cannot rot: tiny sizes, both layouts, their summary lines with positive numbers, and
the per-client numbers of two processes adding up to their printed sum."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LINE = re.compile(r"^(1_process|2_processes) (.*) cpu_per_work=(\S+) cpu_per_wall=(\S+)$")


def test_processes_smoke_reports_both_layouts(tmp_path):
    samples_file = tmp_path / "samples.json"
    proc = subprocess.run(
        [
            sys.executable,
            "bench/processes.py",
            "--smoke",
            "--reps",
            "2",
            "--json",
            str(samples_file),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = {}
    for line in proc.stdout.splitlines():
        match = LINE.match(line)
        if match:
            metrics = dict(pair.split("=") for pair in match.group(2).split())
            found[match.group(1)] = (metrics, float(match.group(3)), float(match.group(4)))
    assert set(found) == {"1_process", "2_processes"}, proc.stdout
    for metrics, cpu_per_work, cpu_per_wall in found.values():
        assert float(metrics["ckpt8_write_MBps"]) > 0
        assert cpu_per_work > 0 and cpu_per_wall > 0
    samples = json.loads(samples_file.read_text())
    for run in samples["2 processes"]:
        assert len(run["per_client"]) == 2  # one client per process, at the same time
        total = sum(c["ckpt8_write_MBps"] for c in run["per_client"])
        assert abs(total - run["sum"]["ckpt8_write_MBps"]) < 1e-6
        # the checkpoint writers are split between the processes: the same work in all
        assert run["work"][0] == samples["1 process"][0]["work"][0]
