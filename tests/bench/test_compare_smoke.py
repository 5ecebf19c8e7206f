"""Smoke run of the A/B benchmark (bench/compare.py --smoke) so the harness cannot rot.

Tiny sizes, one repetition, both clients, both servers (NFS-Ganesha from the
Debian packages nfs-ganesha and nfs-ganesha-vfs, and shingle), the training
workloads when torch is installed (the `bench` extra; skipped with a printed
line otherwise), the cluster model and the markdown report. It checks the
output contract other checks rely on, not speed: the last lines are
``metric shingle_value ganesha_value ratio``, NFS-Ganesha produced a number
for every metric, shingle produced numbers, and every metric shingle has no
number for is explained by a recorded failure."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench import compare  # noqa: E402
from bench.ganesha import ensure_installed  # noqa: E402

# metric suffix -> the workloads whose failure leaves it without a number
WORKLOAD_OF = {
    "seq_write_MBps": {"seq_write"},
    "seq_write_linux_MBps": {"linux_write"},
    "seq_read_cold_MBps": {"seq_write", "seq_read"},
    "seq_read_warm_MBps": {"seq_write", "seq_read"},
    "create_per_s": {"small_files"},
    "stat_per_s": {"small_files"},
    "remove_per_s": {"small_files"},
    "randwrite_iops": {"random_write"},
    "ckpt8_write_MBps": {"checkpoint_writers"},
    "shard16_read_MBps": {"shard_readers"},
}
LINE = re.compile(r"^(\S+) (nan|\d+\.\d+) (nan|\d+\.\d+) (nan|\d+\.\d+)$")


def number(text: str) -> float:
    return float(text)


def failures_of(run_json: Path) -> set:
    result = json.loads(run_json.read_text())
    return {(e["server"], e["client"], e["workload"]) for e in result["errors"]}


def test_compare_smoke_prints_one_line_per_metric_with_both_servers(tmp_path):
    ensure_installed()
    has_torch = importlib.util.find_spec("torch") is not None
    results, run_json = tmp_path / "results", tmp_path / "run.json"
    proc = subprocess.run(
        [
            sys.executable,
            "bench/compare.py",
            "--smoke",
            "--report",
            "--results",
            str(results),
            "--json",
            str(run_json),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    print(proc.stdout)
    print(proc.stderr[-4000:], file=sys.stderr)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout.strip().splitlines()

    marker = next(
        i
        for i, line in enumerate(out)
        if line.startswith("# ")
        and line.endswith("metrics: metric shingle_value ganesha_value ratio")
    )
    declared = int(out[marker].split()[1])
    cpu_marker = next(
        i
        for i, line in enumerate(out)
        if line.startswith("# ") and "workloads: CLIENT.WORKLOAD.cpu_per_work" in line
    )
    assert cpu_marker == marker + 1 + declared, out[marker:]
    tail = out[marker + 1 : cpu_marker]
    cpu_tail = out[cpu_marker + 1 :]
    assert len(cpu_tail) == int(out[cpu_marker].split()[1]), cpu_tail
    expected = {f"{c}.{m}" for c in ("nfsrs", "nfs4fs") for m, _u, _g in compare.METRICS}
    if has_torch:
        expected |= {f"train.{m}" for m, _u in compare.TRAINING_METRICS}
    else:
        assert "training workloads skipped: torch is not installed" in proc.stdout
    rows = {}
    for line in tail:
        m = LINE.match(line)
        assert m, f"not 'metric shingle_value ganesha_value ratio': {line!r}"
        rows[m.group(1)] = tuple(number(x) for x in m.group(2, 3, 4))
    assert set(rows) == expected

    # one CPU-per-work line per client and workload, both servers measured (psutil)
    cpu_rows = {}
    for line in cpu_tail:
        m = LINE.match(line)
        assert m and m.group(1).endswith(".cpu_per_work"), line
        cpu_rows[m.group(1)] = tuple(number(x) for x in m.group(2, 3, 4))
    per_client = {
        "seq_write",
        "seq_read_cold",
        "seq_read_warm",
        "linux_write",
        "small_files",
        "random_write",
        "checkpoint_writers",
        "shard_readers",
    }
    assert set(cpu_rows) == {
        f"{c}.{w}.cpu_per_work" for c in ("nfsrs", "nfs4fs") for w in per_client
    } - {f"{c}.{w}.cpu_per_work" for s, c, w in failures_of(run_json) if s == "shingle"}
    for key, (shingle, ganesha, _ratio) in cpu_rows.items():
        # smoke sizes: a few ms of CPU, below psutil's clock tick for Ganesha now and then
        assert ganesha >= 0 and shingle >= 0, key
    assert any(s > 0 for s, _g, _r in cpu_rows.values()), cpu_rows

    result = json.loads(run_json.read_text())
    failures = {(e["server"], e["client"], e["workload"]) for e in result["errors"]}
    assert not [f for f in failures if f[0] == "ganesha"], result["errors"]
    for metric, (shingle, ganesha, ratio) in rows.items():
        assert not math.isnan(ganesha) and ganesha > 0, f"NFS-Ganesha has no number for {metric}"
        if math.isnan(shingle):
            client, name = metric.split(".", 1)
            workloads = {"training"} if client == "train" else WORKLOAD_OF[name]
            recorded = {
                w for s, c, w in failures if s == "shingle" and (c == client or client == "train")
            }
            assert recorded & (workloads | {"start", "restart"}), (
                f"shingle has no number for {metric} and no recorded failure of {workloads}: "
                f"{failures}"
            )
            assert math.isnan(ratio)
        else:
            assert shingle > 0
            # printed with 2 decimals (ratio 3): allow for that rounding of tiny smoke values
            slack = (shingle / ganesha) * (0.006 / shingle + 0.006 / ganesha) + 0.0015
            assert abs(ratio - shingle / ganesha) <= slack, (metric, shingle, ganesha, ratio)
    for client in ("nfsrs", "nfs4fs"):
        assert any(not math.isnan(v[0]) for k, v in rows.items() if k.startswith(client + ".")), (
            f"shingle produced no number at all with {client}"
        )

    report = (results / "latest.md").read_text()
    assert "## Results (median; ratio = shingle / NFS-Ganesha)" in report
    assert all(f"| {metric} |" in report for metric in rows)
    assert "## Cluster-scale model" in report and "measured (pilot)" in report
    cluster = result["cluster"]["prediction"]
    assert 0 < cluster["gateway"]["read_GBps"] <= cluster["scale-out"]["read_GBps"]
    assert cluster["gateway"]["ckpt80_write_s"] >= cluster["scale-out"]["ckpt80_write_s"] > 0


def test_profile_parser_ranks_busy_frames_and_drops_idle_ones():
    text = "\n".join(
        [
            'process 1:"shingle";thread (0x1);main (cli.py:10);write (engine/datapath/core.py:400) '
            "30",
            'process 1:"shingle";thread (0x1);main (cli.py:10);encode '
            "(engine/coding/erasure.py:130) 10",
            'process 1:"shingle";thread (0x2);run_forever (asyncio/base_events.py:600);select '
            "(selectors.py:468) 60",
        ]
    )
    prof = compare.parse_collapsed(text)
    assert prof["samples"] == 40  # the 60 samples waiting in select are idle
    assert prof["top_self"][0] == ("write (engine/datapath/core.py)", 75.0)
    assert ("main (cli.py)", 100.0) in prof["top_total"]
