"""Smoke run of the SMB benchmark (bench/smb.py --smoke) so the harness cannot rot: both servers
(shingle's smbd over its FUSE mount, a reference smbd over a plain folder) start, every workload
gives a number for both, and the last lines keep the contract other checks rely on:
``smb.METRIC SHINGLE REFERENCE RATIO``. Speed is not checked."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench import smb as smb_bench  # noqa: E402

LINE = re.compile(r"^smb\.(\S+) (\d+\.\d+) (\d+\.\d+) (nan|\d+\.\d+)$")


def test_smb_smoke_prints_one_line_per_metric_for_both_servers(tmp_path):
    run_json = tmp_path / "run.json"
    proc = subprocess.run(
        [sys.executable, "bench/smb.py", "--smoke", "--json", str(run_json)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    print(proc.stdout)
    print(proc.stderr[-4000:], file=sys.stderr)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout.strip().splitlines()
    marker = next(
        i
        for i, line in enumerate(out)
        if line.startswith("# ") and "metrics: smb.METRIC shingle reference ratio" in line
    )
    tail = out[marker + 1 :]
    assert len(tail) == int(out[marker].split()[1]) == len(smb_bench.METRICS)
    rows = {}
    for line in tail:
        m = LINE.match(line)
        assert m, f"not 'smb.METRIC shingle reference ratio' with numbers: {line!r}"
        rows[m.group(1)] = tuple(float(x) for x in m.group(2, 3, 4))
    assert set(rows) == set(smb_bench.METRICS)
    result = json.loads(run_json.read_text())
    assert result["errors"] == {} and (result["size_mib"], result["files"]) == (16, 50)
    for metric, (ours, ref, ratio) in rows.items():
        cpu = metric.endswith(("_cpu_ms_per_MiB", "_cpu_ms_per_file"))
        reference = result["results"]["reference"][metric]
        if cpu and reference == 0:  # a tiny run may use under a clock tick of server CPU
            assert ratio != ratio, (metric, ratio)  # nan: no ratio to a zero
            continue
        assert cpu or (ours > 0 and ref > 0), metric
        exact = result["results"]["shingle"][metric] / reference
        assert abs(ratio - exact) <= 0.006 + exact * 0.01, (metric, ours, ref, ratio)
    assert not list(Path("/tmp").glob("shingle-smb-bench-*/shingle/smb/mount")), (
        "the benchmark left a folder (and maybe a mount) behind"
    )
