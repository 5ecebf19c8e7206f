"""Single-client metadata work through `shingle serve --heads 2` against one head and
NFS-Ganesha, in the same run (docs/heads.md, "One client's metadata on a head of several").

The workloads are bench/compare.py's, run the same way (bench/workloads.py in a child
process, one client, one request in flight): small files (creates of 4 KiB, stats, removes)
and 4 KiB random writes. Servers, all up through the whole run, driven in turn, the order
reversed every round:

- ``h1``: `shingle serve` (one head), ``h2``: `shingle serve --heads 2` (the client's address
  picks one head; the other is idle but for its own background work), both of this checkout;
- ``h2-base`` with ``--base REPO``: `shingle serve --heads 2` of another checkout (main before
  a change), for a before/after in the same run;
- ``ganesha``: NFS-Ganesha over a local folder, as compare.py runs it (``--no-ganesha`` skips).

Server CPU is the whole process tree's (listener and heads), per thousand operations.

    .venv/bin/python bench/heads_meta.py [--rounds 3] [--client nfsrs] [--base /work/main]
        [--files 500] [--rand-seconds 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench import workloads  # noqa: E402
from bench.compare import SHINGLE_LAYOUT, ShingleServer, run_child  # noqa: E402
from bench.ganesha import GaneshaServer  # noqa: E402
from bench.serveheads import alternated, medians  # noqa: E402


class HeadsServer(ShingleServer):
    """compare.py's shingle server, as `serve --heads N` of the checkout at ``repo``."""

    def __init__(self, workdir: Path, heads: int, repo: Path, **layout):
        super().__init__(workdir, **layout)
        self.heads, self.repo = heads, repo

    def cli(self, *args: str) -> list[str]:
        if args and args[0] == "-c" and self.heads > 1:
            args = (*args, "--heads", str(self.heads))
        # the checkout's code: `python -m` puts the working folder first on sys.path
        return [sys.executable, "-m", "appliance.cli", *args]

    def start(self, timeout: float = 60.0) -> HeadsServer:
        self.init()
        out = open(self.log, "ab")
        self.proc = subprocess.Popen(
            self.cli("-c", str(self.config), "serve", "--nfs-port", str(self.port), "--no-web"),
            cwd=self.repo,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        out.close()
        from bench.ganesha import wait_listening

        try:
            wait_listening(self.port, self.proc, timeout, self.log)
        except BaseException:
            self.stop()
            raise
        return self


def tree_cpu(pid: int) -> float:
    """CPU seconds of a process and its live descendants."""
    proc = psutil.Process(pid)
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def measure(server, client: str, workload: str, params: dict) -> dict:
    cmd = [sys.executable, str(REPO / "bench" / "workloads.py"), "--client", client]
    cmd += ["--port", str(server.port), "--workload", workload, "--params", json.dumps(params)]
    assert server.proc is not None
    cpu0 = tree_cpu(server.proc.pid)
    out = run_child(cmd, 300)
    cpu = tree_cpu(server.proc.pid) - cpu0
    if not out.get("ok"):
        raise SystemExit(f"{workload} failed: {out}")
    metrics = dict(out["metrics"])
    metrics[f"{workload}_cpu_ms_per_op"] = cpu / out["work"][0]  # work is in thousands
    return metrics


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--client", default="nfsrs", choices=workloads.CLIENTS)
    ap.add_argument("--base", help="another checkout to run as h2-base (--heads 2)")
    ap.add_argument("--no-ganesha", action="store_true")
    ap.add_argument("--files", type=int, default=500)
    ap.add_argument("--rand-seconds", type=float, default=3.0)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    params = dict(workloads.SIZES["quick"], small_files=args.files, rand_seconds=args.rand_seconds)
    workdir = Path(tempfile.mkdtemp(prefix="shingle-heads-meta-", dir="/var/tmp"))
    layout = dict(SHINGLE_LAYOUT["smoke"], drive_size=512 << 20)
    servers: dict = {
        "h1": HeadsServer(workdir / "h1", 1, REPO, **layout),
        "h2": HeadsServer(workdir / "h2", 2, REPO, **layout),
    }
    if args.base:
        servers["h2-base"] = HeadsServer(workdir / "h2-base", 2, Path(args.base), **layout)
    if not args.no_ganesha:
        servers["ganesha"] = GaneshaServer(workdir / "ganesha")
    try:
        for server in servers.values():
            server.workdir.mkdir(parents=True, exist_ok=True)
            server.start()

        def one(name: str, _round: int) -> dict:
            got = measure(servers[name], args.client, "small_files", params)
            got.update(measure(servers[name], args.client, "random_write", params))
            return got

        results = alternated(list(servers), args.rounds, one)
        summary = medians(results)
        if "ganesha" in summary:
            g = summary["ganesha"]
            for name in servers:
                if name == "ganesha":
                    continue
                s = summary[name]
                shown = " ".join(
                    f"{k}={s[k] / g[k]:.2f}x" for k in s if g.get(k) and not k.endswith("per_op")
                )
                cpu = " ".join(
                    f"{k}={s[k] / g[k]:.2f}x" for k in s if g.get(k) and k.endswith("per_op")
                )
                print(f"{name} / ganesha: {shown} cpu: {cpu}")
        for name in servers:
            if name not in ("h1", "ganesha"):
                s, one_head = summary[name], summary["h1"]
                shown = " ".join(f"{k}={s[k] / one_head[k]:.2f}x" for k in s if one_head.get(k))
                print(f"{name} / h1: {shown}")
        if args.json:
            Path(args.json).write_text(json.dumps({"rounds": results, "medians": summary}))
    finally:
        for server in servers.values():
            server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
