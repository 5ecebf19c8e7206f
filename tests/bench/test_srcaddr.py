"""bench/srcaddr.py: a child's loopback TCP connections come from 127.0.0.1 upwards in turn,
bound first to 0.0.0.0 (as nfs-rs does) or not, which is what spreads bench/compare.py
--heads N's clients over the heads."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench import srcaddr  # noqa: E402

CHILD = """
import socket, sys
for i in range(5):
    with socket.socket() as conn:
        if i % 2:
            conn.bind(("0.0.0.0", 0))  # as nfs-rs does before it connects
        conn.connect(("127.0.0.1", int(sys.argv[1])))
        print(conn.getsockname()[0])
"""


def sources(env: dict, port: int) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(port)],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return out.stdout.split()


def test_connections_take_the_sources_in_turn(tmp_path):
    with socket.create_server(("127.0.0.1", 0), backlog=16) as server:
        port = server.getsockname()[1]
        spread = sources(srcaddr.environ(3, tmp_path), port)
        plain = sources(srcaddr.environ(1, tmp_path), port)
    assert spread == ["127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.1", "127.0.0.2"]
    assert plain == ["127.0.0.1"] * 5


def test_compare_heads_spreads_writers_and_counts_every_head(tmp_path):
    """bench/compare.py --heads 2 as its run does it: the shingle server waits until both heads
    serve, the checkpoint writers' connections reach both (each head's own CPU moves), and the
    server CPU counted is the listener's and its heads' together."""
    import psutil

    from bench import compare, workloads

    server = compare.ShingleServer(tmp_path / "shingle", heads=2, **compare.SHINGLE_LAYOUT["smoke"])
    server.start()
    try:
        listener = psutil.Process(server.proc.pid)
        heads = [p for p in listener.children() if "serve" in " ".join(p.cmdline())]
        assert len(heads) == 2, [p.cmdline() for p in listener.children()]

        def own_cpu(proc) -> float:
            times = proc.cpu_times()
            return times.user + times.system

        before = [own_cpu(h) for h in heads]
        params = dict(workloads.SIZES["smoke"], ckpt_bytes=4 * workloads.MiB)
        out = compare.run_workload(
            server,
            "nfsrs",
            "checkpoint_writers",
            params,
            120,
            srcaddr.environ(2, tmp_path),
        )
        grew = [own_cpu(h) - b for h, b in zip(heads, before, strict=True)]
    finally:
        server.stop()
    assert out.get("ok"), out
    # 4 writers of 4 MiB each took well over 0.05 s of a head's CPU (an idle head: ~0.01 s)
    assert min(grew) > 0.05, grew
    assert out["server_cpu_s"] >= sum(grew) * 0.9, (out["server_cpu_s"], grew)
