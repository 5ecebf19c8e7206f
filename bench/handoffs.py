"""Server CPU, thread switches and page faults per MiB of a write workload, A/B between trees.

    .venv/bin/python bench/handoffs.py                       # this tree, 2 rounds
    .venv/bin/python bench/handoffs.py --trees /work/a /work/b --pairs 4 --runs 3
    .venv/bin/python bench/handoffs.py --by-thread            # split by thread (needs py-spy)
    .venv/bin/python bench/handoffs.py --setup seq_write --workload seq_read  # warm reads
    .venv/bin/python bench/handoffs.py --heads 2              # shingle serve --heads 2

Each round starts ``shingle serve`` from each tree in turn (bench/compare.py's ShingleServer:
10 zone-file drives, 8+2), the order flipping every round (the tree that runs first in a pair
gains 5-15 % on a shared machine), and runs bench/workloads.py against it ``--runs`` times
(the first run after a start pays the heap's page faults). Per run it reads the server's
utime and stime (/proc/PID/stat) and the voluntary and involuntary context switches of every
one of its threads (/proc/PID/task/*/status) before and after, and prints them per MiB moved.
Thread switches are the hand-offs: a wake-up of an idle worker, a wait for the GIL after a
call that let it go, a drive thread's wait for its next append or for the device. With
``--by-thread`` the threads are named by ``py-spy dump`` (Python threads; the compiled drive
writers and syncers show as ``native``). The last lines give the median of each tree.
With ``--heads N`` each tree runs ``shingle serve --heads N`` and the figures cover the
listener and every head (their threads' switches, their CPU), the clients' connections coming
from N loopback addresses in turn (bench/srcaddr.py) so that every head gets writers.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# first, even when PYTHONPATH has it: bench/ (this script's folder) holds an engine.py too
sys.path.insert(0, str(REPO))

from bench import srcaddr, workloads  # noqa: E402

MiB = 1 << 20
SERVER = """
import json, sys
from pathlib import Path
sys.path.insert(0, {tree!r})
from bench.compare import ShingleServer, MiB
server = ShingleServer(
    Path({work!r}), drive_size={drive_mib} * MiB, zone_size={zone_mib} * MiB{heads}
)
server.start()
print(json.dumps({{"pid": server.proc.pid, "port": server.port}}), flush=True)
sys.stdin.read()
server.stop()
"""


def server_pids(pid: int) -> list[int]:
    """The server and its children (a `serve --heads N` listener's heads), and theirs."""
    pids, i = [pid], 0
    while i < len(pids):
        for tid in os.listdir(f"/proc/{pids[i]}/task"):
            try:
                children = Path(f"/proc/{pids[i]}/task/{tid}/children").read_text().split()
            except OSError:
                continue
            pids.extend(int(c) for c in children if int(c) not in pids)
        i += 1
    return pids


def process_times(pid: int) -> tuple[float, float, int]:
    """utime and stime in seconds and minor page faults of the process and its children."""
    tick = os.sysconf("SC_CLK_TCK")
    utime = stime = faults = 0
    for one in server_pids(pid):
        try:
            fields = Path(f"/proc/{one}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # it just ended
        utime, stime, faults = (
            utime + int(fields[11]),
            stime + int(fields[12]),
            faults + int(fields[7]),
        )
    return utime / tick, stime / tick, faults


def thread_switches(pid: int) -> dict[str, tuple[int, int]]:
    """Thread id -> (voluntary, involuntary) context switches so far, of the server's threads
    and its children's."""
    out = {}
    for one in server_pids(pid):
        try:
            tids = os.listdir(f"/proc/{one}/task")
        except OSError:
            continue
        for tid in tids:
            vol = invol = 0
            try:
                for line in Path(f"/proc/{one}/task/{tid}/status").read_text().splitlines():
                    if line.startswith("voluntary_ctxt_switches"):
                        vol = int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches"):
                        invol = int(line.split()[1])
            except OSError:
                continue  # the thread ended
            out[tid] = (vol, invol)
    return out


def thread_groups(pid: int, spy: str | None) -> dict[str, str]:
    """Thread id -> its Python thread's name without the number (py-spy dump), if py-spy runs;
    the threads of the server's children too."""
    if spy is None:
        return {}
    out = {}
    for one in server_pids(pid):
        proc = subprocess.run(
            [spy, "dump", "--json", "--nonblocking", "-p", str(one)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        try:
            threads = json.loads(proc.stdout)
        except ValueError:
            continue
        out.update(
            {
                str(t["os_thread_id"]): re.sub(r"[-_]?\d+$", "", t.get("thread_name") or "python")
                for t in threads
            }
        )
    return out


def workload_params(args) -> dict:
    """bench/workloads.py's quick sizes, with the checkpoint and sequential sizes of ``args``."""
    params = dict(workloads.SIZES["quick"])
    params.update(
        ckpt_writers=args.writers,
        ckpt_bytes=args.mib * MiB,
        seq_bytes=args.mib * MiB * args.writers,
    )
    return params


def run_workload(tree: str, port: int, workload: str, args) -> dict:
    proc = subprocess.run(
        [
            sys.executable,
            str(Path(tree) / "bench" / "workloads.py"),
            "--client",
            args.client,
            "--port",
            str(port),
            "--workload",
            workload,
            "--params",
            json.dumps(workload_params(args)),
        ],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=900,
        env=args.env,
    )
    lines = proc.stdout.strip().splitlines()
    out = json.loads(lines[-1]) if lines else {"ok": False, "error": proc.stderr[-500:]}
    if not out.get("ok"):
        raise SystemExit(f"{tree}: {workload} failed: {out.get('error')}")
    return out


def run_once(tree: str, port: int, pid: int, args) -> dict:
    t0, s0 = process_times(pid), thread_switches(pid)
    started = time.perf_counter()
    out = run_workload(tree, port, args.workload, args)
    wall = time.perf_counter() - started
    t1, s1 = process_times(pid), thread_switches(pid)
    mib = out["work"][0]
    groups = thread_groups(pid, args.py_spy) if args.by_thread else {}
    by_group: dict[str, list[float]] = {}
    for tid, (vol, invol) in s1.items():
        before = s0.get(tid, (0, 0))
        group = groups.get(tid, "native" if groups else "all")
        acc = by_group.setdefault(group, [0.0, 0.0])
        acc[0] += (vol - before[0]) / mib
        acc[1] += (invol - before[1]) / mib
    return {
        "MBps": mib * MiB / wall / 1e6,
        "cpu_ms": 1000 * (t1[0] - t0[0] + t1[1] - t0[1]) / mib,
        "user_ms": 1000 * (t1[0] - t0[0]) / mib,
        "sys_ms": 1000 * (t1[1] - t0[1]) / mib,
        "faults": (t1[2] - t0[2]) / mib,
        "switches": sum(v + i for v, i in by_group.values()),
        "by_group": by_group,
    }


def one_server(tree: str, args) -> list[dict]:
    work = tempfile.mkdtemp(prefix="handoffs-", dir="/var/tmp")
    server = subprocess.Popen(
        [
            sys.executable,
            "-c",
            SERVER.format(
                tree=tree,
                work=work,
                drive_mib=args.drive_mib,
                zone_mib=args.zone_mib,
                # only then: a tree from before --heads has no such argument
                heads=f", heads={args.heads}" if args.heads > 1 else "",
            ),
        ],
        cwd=tree,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None and server.stdin is not None
        info = json.loads(server.stdout.readline())
        if args.setup:
            run_workload(tree, info["port"], args.setup, args)
        return [run_once(tree, info["port"], info["pid"], args) for _ in range(args.runs)]
    finally:
        if server.stdin is not None:
            server.stdin.close()
        server.wait(120)
        shutil.rmtree(work, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trees", nargs="+", default=[str(REPO)], help="checkouts to compare")
    ap.add_argument("--pairs", type=int, default=2, help="rounds (each tree once per round)")
    ap.add_argument("--runs", type=int, default=2, help="workload runs per server start")
    ap.add_argument("--mib", type=int, default=32, help="MiB per writer")
    ap.add_argument("--writers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=1, help="shingle serve --heads N")
    ap.add_argument("--drive-mib", type=int, default=1536, help="size of each of the 10 drives")
    ap.add_argument("--zone-mib", type=int, default=64)
    ap.add_argument("--workload", default="checkpoint_writers")
    ap.add_argument("--client", default="nfsrs")
    ap.add_argument("--setup", help="a workload run once after each start, not measured")
    ap.add_argument("--by-thread", action="store_true", help="switches per thread group")
    ap.add_argument("--py-spy", default=shutil.which("py-spy"), help="py-spy for --by-thread")
    args = ap.parse_args(argv)
    preload = tempfile.mkdtemp(prefix="handoffs-srcaddr-", dir="/var/tmp")
    try:
        args.env = srcaddr.environ(args.heads, Path(preload))
        return run_pairs(args)
    finally:
        shutil.rmtree(preload, ignore_errors=True)


def run_pairs(args) -> int:
    results: dict[str, list[dict]] = {tree: [] for tree in args.trees}
    for round_ in range(args.pairs):
        order = args.trees if round_ % 2 == 0 else list(reversed(args.trees))
        for tree in order:
            for r in one_server(tree, args):
                results[tree].append(r)
                print(
                    f"{tree}: {r['MBps']:6.1f} MB/s, server CPU {r['cpu_ms']:.2f} ms/MiB "
                    f"(user {r['user_ms']:.2f}, system {r['sys_ms']:.2f}), "
                    f"{r['switches']:.1f} thread switches/MiB, {r['faults']:.0f} faults/MiB, "
                    f"load {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
                if args.by_thread:
                    print(
                        "    "
                        + ", ".join(
                            f"{g} {v + i:.1f} ({i:.1f} involuntary)"
                            for g, (v, i) in sorted(
                                r["by_group"].items(), key=lambda kv: -sum(kv[1])
                            )
                            if v + i >= 0.5
                        ),
                        flush=True,
                    )
    for tree, rows in results.items():
        med = {k: statistics.median(r[k] for r in rows) for k in ("MBps", "cpu_ms", "switches")}
        print(
            f"median {tree}: {med['MBps']:.1f} MB/s, {med['cpu_ms']:.2f} ms of server CPU and "
            f"{med['switches']:.1f} thread switches per MiB ({len(rows)} runs)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
