"""Smoke run of bench/cluster.py so the harness cannot rot: tiny sizes, 3 agents' hosts of 4
drives (in network namespaces where the run may make them, else on 127.0.0.x), both layouts
reported with figures that follow from what ran: every 8+2 stripe's 10 fragments cross the
agent protocol once on a write (frames of at least 1.25 client bytes each, a little over for
the headers), reads fetch the data fragments (at least 1.0), one round trip per fragment,
and the one-host layout sends nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_cluster_bench_smoke(tmp_path):
    summary_file = tmp_path / "summary.json"
    done = subprocess.run(
        [sys.executable, "bench/cluster.py", "--smoke", "--hosts", "3", "--json", summary_file],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "3 hosts / one host: write" in done.stdout
    assert "one host: read in" in done.stderr  # progress goes to stderr
    summary = json.loads(summary_file.read_text())
    local, hosts = summary["one_host"], summary["hosts"]
    assert summary["setup"]["hosts"] == 3 and summary["setup"]["drives"] == 12
    for part in ("write", "read"):
        assert local[part]["MBps"] > 0 and hosts[part]["MBps"] > 0
        assert local[part]["round_trips_per_stripe"] == 0
        assert local[part]["frame_bytes_per_client_byte"] == 0
    write, read = hosts["write"], hosts["read"]
    assert 1.25 <= write["frame_bytes_per_client_byte"] < 1.3
    assert write["round_trips_per_stripe"] == 10 and write["round_trips_by_op"] == {
        "append": 10 * hosts["stripes"]
    }
    assert 1.0 <= read["frame_bytes_per_client_byte"] < 1.05
    assert read["round_trips_per_stripe"] == 8  # the data fragments; parity is not read
    assert 0 < write["commits_per_stripe"] <= 2 and read["commits_per_stripe"] == 0
    assert hosts["write"]["agents_cpu_ms_per_MiB"] > 0
    if summary["setup"]["layout"] == "netns":  # the head's interface: headers and acks too
        assert write["wire_bytes_per_client_byte"] >= write["frame_bytes_per_client_byte"]
        assert read["wire_bytes_per_client_byte"] >= read["frame_bytes_per_client_byte"]
