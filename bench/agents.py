"""Benchmark: the data path over drive agents against local drives, in the same run.

Ten drives either way, 8+2 stripes of the default class (1 MiB fragments): ten local zone-file
drives, or ten `shingle agent` processes on 127.0.0.1 with one drive each (the same zone files
behind the agent protocol, engine/drives/agentwire.py). Workloads (bench/engine.py's): 8
writers each write a shard in 1 MiB writes and commit; then 4 readers read every shard back
(the head's fragment cache dropped and the zone files' pages evicted first). Rounds alternate
local and agents; medians are reported. CPU per MiB of client data: the head (this process,
which also runs the 8 writers and 4 readers, the same in both) and the agents (their
processes' user + system time), so the protocol's cost shows beside the throughput.

On one machine this measures overhead, not scale: the agents share the head's cores and
disk, and the "network" is loopback.

    .venv/bin/python bench/agents.py [--quick] [--rounds N] [--json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.catalog import Catalog, upgrade  # noqa: E402
from engine.coding.erasure import load_policies  # noqa: E402
from engine.datapath import DataPath  # noqa: E402
from engine.drives import add_agent_drives, format_emulated  # noqa: E402
from engine.namespace import Namespace  # noqa: E402

MiB = 1 << 20
DRIVES = 10
FIRST_PORT = 46450  # the agents' ports: 46450-46459 (tests use 46400-46499, one at a time)


def _bench_engine():
    """bench/engine.py's workloads (it cannot be imported by name: ``engine`` is the package)."""
    spec = importlib.util.spec_from_file_location("bench_engine", ROOT / "bench" / "engine.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def self_cpu() -> float:
    times = os.times()
    return times.user + times.system


class Agents:
    def __init__(self, root: Path, drive_size: int, zone_size: int):
        self.processes: list[subprocess.Popen] = []
        self.addresses = []
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        for i in range(DRIVES):
            port = FIRST_PORT + i
            address = f"127.0.0.1:{port}"
            log = open(root / f"agent-{i}.log", "ab")  # noqa: SIM115 - the child holds it
            self.processes.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "appliance.cli",
                        "agent",
                        "--listen",
                        address,
                        "--host",
                        f"host{i:02d}",
                        "--format",
                        "--no-preallocate",
                        "--drive-size",
                        str(drive_size),
                        "--zone-size",
                        str(zone_size),
                        "--drives",
                        str(root / f"host{i:02d}" / "drive"),
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
            )
            log.close()
            self.addresses.append(address)
        # ready once it says so (a connect to a port in the ephemeral range can meet itself)
        for n, (process, address) in enumerate(zip(self.processes, self.addresses, strict=True)):
            deadline = time.monotonic() + 120
            log_path = root / f"agent-{n}.log"
            while "shingle agent: serving" not in log_path.read_text(errors="replace"):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"agent {address} did not start: {log_path.read_text()}")
                time.sleep(0.05)

    def cpu(self) -> float:
        return sum(cpu_seconds(p.pid) for p in self.processes)

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def one_round(kind: str, work: Path, sizes: dict, bench) -> dict:
    """Write and read the checkpoint once on fresh drives; throughput and CPU per MiB."""
    folder = work / f"{kind}-{time.monotonic_ns()}"
    folder.mkdir()
    url = f"sqlite:///{folder}/catalog.db"
    upgrade(url)
    catalog = Catalog(url)
    agents = None
    try:
        if kind == "local":
            format_emulated(
                catalog, folder / "drives", DRIVES, sizes["drive"], sizes["zone"], preallocate=False
            )
        else:
            agents = Agents(folder, sizes["drive"], sizes["zone"])
            for address in agents.addresses:
                add_agent_drives(catalog, address)
        data = DataPath(catalog, load_policies({}), reserve_zones=2)
        try:
            ns = Namespace(catalog, data=data)
            total_mib = bench.WRITERS * sizes["shard"] / MiB
            head0, agents0 = self_cpu(), agents.cpu() if agents else 0.0
            inos, elapsed = bench.checkpoint(ns, data, sizes["shard"])
            head1, agents1 = self_cpu(), agents.cpu() if agents else 0.0
            data.reader.drop_cache()
            bench.drop_cache(folder)
            read_start = time.perf_counter()
            read_mbps = bench.read_all(ns, inos, sizes["shard"])
            read_s = time.perf_counter() - read_start
            head2, agents2 = self_cpu(), agents.cpu() if agents else 0.0
        finally:
            data.close()
    finally:
        if agents is not None:
            agents.stop()
        catalog.close()
        shutil.rmtree(folder, ignore_errors=True)
    return {
        "write_MBps": bench.WRITERS * sizes["shard"] / elapsed / 1e6,
        "read_MBps": read_mbps,
        "write_head_cpu_ms_per_MiB": (head1 - head0) * 1000 / total_mib,
        "write_agents_cpu_ms_per_MiB": (agents1 - agents0) * 1000 / total_mib,
        "read_head_cpu_ms_per_MiB": (head2 - head1) * 1000 / total_mib,
        "read_agents_cpu_ms_per_MiB": (agents2 - agents1) * 1000 / total_mib,
        "read_s": read_s,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="16 MiB shards instead of 64 MiB")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each (default 3)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--dir", help="scratch folder (default: a temporary one)")
    args = parser.parse_args()
    bench = _bench_engine()
    sizes = {
        "shard": (16 if args.quick else 64) * MiB,
        "zone": 64 * MiB,
        "drive": 1024 * MiB,
    }
    work = Path(tempfile.mkdtemp(prefix="shingle-agents-", dir=args.dir))
    results: dict[str, list[dict]] = {"local": [], "agents": []}
    try:
        for _ in range(args.rounds):
            for kind in ("local", "agents"):
                results[kind].append(one_round(kind, work, sizes, bench))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    keys = list(results["local"][0])
    summary = {
        kind: {key: round(statistics.median(r[key] for r in rounds), 2) for key in keys}
        for kind, rounds in results.items()
    }
    summary["agents_vs_local"] = {
        "write": round(summary["agents"]["write_MBps"] / summary["local"]["write_MBps"], 2),
        "read": round(summary["agents"]["read_MBps"] / summary["local"]["read_MBps"], 2),
    }
    summary["setup"] = {
        "writers": bench.WRITERS,
        "shard_MiB": sizes["shard"] // MiB,
        "rounds": args.rounds,
        "drives": DRIVES,
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(
        f"{bench.WRITERS} writers x {sizes['shard'] // MiB} MiB, 8+2 over {DRIVES} drives, "
        f"median of {args.rounds}"
    )
    print(f"{'':8} {'write MB/s':>11} {'read MB/s':>10}   CPU ms/MiB write (head+agents), read")
    for kind in ("local", "agents"):
        r = summary[kind]
        print(
            f"{kind:8} {r['write_MBps']:>11.1f} {r['read_MBps']:>10.1f}   "
            f"{r['write_head_cpu_ms_per_MiB']:.2f}+{r['write_agents_cpu_ms_per_MiB']:.2f}, "
            f"{r['read_head_cpu_ms_per_MiB']:.2f}+{r['read_agents_cpu_ms_per_MiB']:.2f}"
        )
    ratio = summary["agents_vs_local"]
    print(f"agents / local: write {ratio['write']:.2f}, read {ratio['read']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
