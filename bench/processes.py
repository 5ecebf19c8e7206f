"""What several shingle processes side by side buy: an upper bound for a multi-process design.

The same work runs on one `shingle serve` and, alternated with it, split over N independent ones
(bench/compare.py's ShingleServer: each its own drives, catalog and port), each driven by its own
bench/workloads.py client at the same time. Workloads with several clients of their own
(checkpoint_writers, shard_readers) have those split between the processes; a single-client
workload (small_files, seq_write, random_write) runs whole against each process, so the N
processes do N times the work and the question is whether each keeps its single-process rate.

Nothing is shared between the processes (a real design must share the NFSv4 state: clients,
sessions, opens, locks; and split each drive's zones between the processes' writers), so the
figures bound what such a design could gain on this machine. Printed per layout: each
client's metrics, their sum, the servers' CPU seconds per unit of work and per wall second.

    .venv/bin/python bench/processes.py [--processes 2] [--workload checkpoint_writers]
        [--client nfsrs] [--reps 2] [--smoke] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.compare import ShingleServer, cpu_seconds, log, server_pid  # noqa: E402
from bench.workloads import CLIENTS, SIZES, WORKLOADS  # noqa: E402

MiB = 1 << 20
# workloads whose clients are split between the processes: the parameter that counts them
SPLIT = {"checkpoint_writers": "ckpt_writers", "shard_readers": "shard_readers"}
SIZES_HERE = {
    "full": dict(SIZES["quick"], ckpt_bytes=64 * MiB, small_files=1000, shard_bytes=64 * MiB),
    "smoke": dict(SIZES["smoke"]),
}


def params_for(workload: str, base: dict, processes: int) -> dict:
    """One process's share of the work (the whole of a single-client workload)."""
    key = SPLIT.get(workload)
    if key is None:
        return dict(base)
    if base[key] % processes:
        raise SystemExit(f"{key} = {base[key]} does not split over {processes} processes")
    return dict(base, **{key: base[key] // processes})


def run_layout(servers: list, client: str, workload: str, params: dict, timeout: float) -> dict:
    """One client per server, all at once; the servers' CPU and the wall time around them."""
    pids = [server_pid(s) for s in servers]
    cpu0 = [cpu_seconds(p) for p in pids]
    cmd = [sys.executable, str(REPO / "bench" / "workloads.py"), "--client", client]
    spec = ["--workload", workload, "--params", json.dumps(params)]
    started = time.perf_counter()
    procs = [
        subprocess.Popen(
            [*cmd, "--port", str(s.port), *spec],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for s in servers
    ]
    outs = []
    for proc in procs:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        last = stdout.strip().splitlines()[-1] if stdout.strip() else ""
        try:
            outs.append(json.loads(last))
        except ValueError:
            outs.append({"ok": False, "error": (stderr or stdout).strip()[-300:]})
    wall = time.perf_counter() - started
    cpu1 = [cpu_seconds(p) for p in pids]
    failed = [o.get("error") for o in outs if not o.get("ok")]
    if failed:
        raise RuntimeError(f"{workload} failed: {failed[0]}")
    cpu = sum(b - a for a, b in zip(cpu0, cpu1, strict=True) if a is not None and b is not None)
    work = sum(o["work"][0] for o in outs)
    metrics: dict[str, float] = {}
    for o in outs:
        for name, value in o["metrics"].items():
            metrics[name] = metrics.get(name, 0.0) + value
    return {
        "per_client": [o["metrics"] for o in outs],
        "sum": metrics,
        "work": [work, outs[0]["work"][1]],
        "server_cpu_s": round(cpu, 3),
        "cpu_per_work": cpu / work if work else None,
        "cpu_per_wall": cpu / wall,
        "wall_s": round(wall, 2),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--workload", default="checkpoint_writers", choices=sorted(WORKLOADS))
    ap.add_argument("--client", default="nfsrs", choices=CLIENTS)
    ap.add_argument("--reps", type=int, default=2, help="alternated repetitions of both layouts")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: proves the harness works")
    ap.add_argument("--json", help="also write every sample to this JSON file")
    args = ap.parse_args(argv)
    if args.processes < 2:
        ap.error("--processes: at least 2 (one process is the layout compared against)")
    mode = "smoke" if args.smoke else "full"
    base = SIZES_HERE[mode]
    drive_size, zone_size = (32 * MiB, 4 * MiB) if args.smoke else (256 * MiB, 16 * MiB)
    timeout = 120.0 if args.smoke else 900.0
    split = params_for(args.workload, base, args.processes)  # checked before anything starts
    workdir = Path(tempfile.mkdtemp(prefix="shingle-processes-"))
    servers = [
        ShingleServer(workdir / f"p{i}", drive_size=drive_size, zone_size=zone_size)
        for i in range(args.processes)
    ]
    layouts = {"1 process": (servers[:1], base), f"{args.processes} processes": (servers, split)}
    samples: dict[str, list[dict]] = {name: [] for name in layouts}
    try:
        for server in servers:
            server.workdir.mkdir(parents=True)
            server.start()
        for rep in range(args.reps):
            order = list(layouts) if rep % 2 == 0 else list(reversed(layouts))
            for name in order:
                on, params = layouts[name]
                result = run_layout(on, args.client, args.workload, params, timeout)
                samples[name].append(result)
                log(
                    f"rep {rep + 1} {name}: {result['sum']} per client {result['per_client']}, "
                    f"server CPU {result['server_cpu_s']} s, {result['cpu_per_wall']:.2f} "
                    f"CPU s per wall s"
                )
    finally:
        for server in servers:
            server.stop()
        shutil.rmtree(workdir, ignore_errors=True)  # zone files are preallocated
    unit = samples["1 process"][0]["work"][1]
    print(f"# {args.workload} with {args.client}, medians of {args.reps} alternated repetitions")
    print(f"# layout metric_sum... cpu_per_work(s per {unit}) cpu_per_wall")
    for name, runs in samples.items():
        sums = {m: statistics.median(r["sum"][m] for r in runs) for m in runs[0]["sum"]}
        cpu_work = statistics.median(r["cpu_per_work"] for r in runs)
        cpu_wall = statistics.median(r["cpu_per_wall"] for r in runs)
        shown = " ".join(f"{m}={v:.1f}" for m, v in sums.items())
        layout = name.replace(" ", "_")
        print(f"{layout} {shown} cpu_per_work={cpu_work:.5f} cpu_per_wall={cpu_wall:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(samples, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
