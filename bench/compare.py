"""A/B benchmark: shingle vs NFS-Ganesha, same machine, same run, same clients.

    .venv/bin/python bench/compare.py --quick          # every workload once, a few minutes
    .venv/bin/python bench/compare.py                  # full: 3 repetitions, report + charts
    .venv/bin/python bench/compare.py --reps 5 --no-training --clients nfsrs
    .venv/bin/python bench/compare.py --quick --kerberos   # also sys/krb5/krb5i/krb5p A/B
    .venv/bin/python bench/compare.py --kerberos-only --kerberos-mib 64
    .venv/bin/python bench/compare.py --delegations-only   # the small-file epoch, +/- delegations
    .venv/bin/python bench/compare.py --quick --heads 2    # shingle serve --heads 2 (below)

Both servers run as children of this process on 127.0.0.1: NFS-Ganesha 4.3
(VFS FSAL, pNFS off) exporting a local folder, and ``shingle serve`` on a
fresh ``shingle init`` folder (10 emulated zone-file drives, 8+2 erasure
coding). Every workload runs with each client (nfs-rs 4.1, nfs4fs) against
both servers, A then B, the order flipping every repetition, each in a child
process with a timeout: a workload that fails or hangs on one server is
recorded as an error in the report, and the run goes on.

Cold reads drop the page cache (``echo 3 > /proc/sys/vm/drop_caches``) after
the file is written; where that is not permitted, the backing files are
evicted with posix_fadvise(DONTNEED) and the report says so.

``--heads N`` runs ``shingle serve --heads N`` (docs/heads.md) and makes every client's
connections come from N loopback addresses in turn (bench/srcaddr.py), against both servers
alike, since the listener picks a client's head by its address; server CPU is then the
whole process tree's (the listener and its heads).

Output: a summary table, a markdown report and PNG charts under
bench/results/ (full mode; ``--report`` forces one in quick mode), and as the
last lines one line per metric: ``metric shingle_value ganesha_value ratio``
(``nan`` where a server failed the workload).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
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
from bench.ganesha import ChildServer, GaneshaError, GaneshaServer, free_port, wait_listening  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30
SERVERS = ("shingle", "ganesha")

# shingle's emulated drives per mode: 10 drives (8+2), preallocated zone files.
SHINGLE_LAYOUT = {
    "full": dict(drive_size=2 * GiB, zone_size=128 * MiB),
    "quick": dict(drive_size=1536 * MiB, zone_size=64 * MiB),
    "smoke": dict(drive_size=256 * MiB, zone_size=16 * MiB),
}
TIMEOUT_S = {"full": 900, "quick": 300, "smoke": 60}

# (metric, unit, goal of issue 8 for the ratio shingle/Ganesha or None)
METRICS = [
    ("seq_write_MBps", "MB/s", 1.0),
    ("seq_write_linux_MBps", "MB/s", 1.0),
    ("seq_read_cold_MBps", "MB/s", 1.0),
    ("seq_read_warm_MBps", "MB/s", 1.0),
    ("create_per_s", "ops/s", 0.7),
    ("stat_per_s", "ops/s", 0.7),
    ("remove_per_s", "ops/s", 0.7),
    ("randwrite_iops", "IOPS", 0.7),
    ("ckpt8_write_MBps", "MB/s", None),
    ("shard16_read_MBps", "MB/s", None),
]
TRAINING_METRICS = [
    ("torch_save_MBps", "MB/s"),
    ("torch_load_MBps", "MB/s"),
    ("safetensors_save_MBps", "MB/s"),
    ("zarr_write_MBps", "MB/s"),
    ("dataloader_samples_per_s", "samples/s"),
    ("dataloader_local_samples_per_s", "samples/s"),
    ("dataloader_vs_local", "x local"),
]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


WORKLOAD_ORDER = (
    "sequential",
    "linux_write",
    "small_files",
    "random_write",
    "checkpoint_writers",
    "shard_readers",
)


# -- shingle as a child process --------------------------------------------------------
class ShingleServer(ChildServer):
    """``shingle init`` a fresh folder, then ``shingle serve --no-web`` on 127.0.0.1:port."""

    name = "shingle"
    stop_timeout_s = 30  # a graceful stop flushes and closes the data path

    def __init__(
        self,
        workdir: Path,
        port: int | None = None,
        *,
        drive_size: int,
        zone_size: int,
        drives: int = 10,
        nfs_options: str = "",
        sec: str = "sys",
        heads: int = 1,
    ):
        """``nfs_options``: lines added to the config's [nfs] table (a keytab); ``sec``: the
        export's flavours."""
        self.workdir = Path(workdir).resolve()
        self.port = port or free_port()
        self.drive_size, self.zone_size, self.drives = drive_size, zone_size, drives
        self.nfs_options, self.sec = nfs_options, sec
        self.heads = heads
        self.proc: subprocess.Popen | None = None
        self.log = self.workdir / "serve.log"
        self.config = self.workdir / "shingle.toml"
        self.catalog_url = f"sqlite:///{self.workdir}/catalog.db"
        self.restarts = 0

    @property
    def backing_dir(self) -> Path:
        return self.workdir / "drives"

    def cli(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "appliance.cli", *args]

    def init(self) -> None:
        if self.config.exists():
            return
        proc = subprocess.run(
            self.cli(
                "init",
                str(self.workdir),
                "--nfs-port",
                str(self.port),
                "--drives",
                str(self.drives),
                "--drive-size",
                str(self.drive_size),
                "--zone-size",
                str(self.zone_size),
            ),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"shingle init {self.workdir} failed (exit {proc.returncode}): "
                f"{(proc.stderr or proc.stdout).strip()[-800:]}"
            )
        # The benchmark's clients speak NFSv4 and need no port mapper: port 111 stays free for
        # a kernel-client test running beside it (its NFSv3 locking needs one there)
        text = self.config.read_text()
        self.config.write_text(
            text.replace("[nfs]\n", f'[nfs]\nportmap = "off"\n{self.nfs_options}', 1)
        )
        # Same export semantics as the Ganesha side (No_Root_Squash, this host only):
        # the benchmark connects as root, as the Ganesha export allows.
        from engine.catalog import Catalog
        from engine.catalog.models import Export

        catalog = Catalog(self.catalog_url)
        try:
            table = Export.__table__
            catalog.run(
                lambda conn: conn.execute(
                    table.update().values(
                        squash="no_root_squash", clients="127.0.0.0/8", sec=self.sec
                    )
                )
            )
        finally:
            catalog.close()

    def start(self, timeout: float = 60.0) -> ShingleServer:
        self.init()
        out = open(self.log, "ab")
        self.proc = subprocess.Popen(
            self.cli(
                "-c",
                str(self.config),
                "serve",
                "--nfs-port",
                str(self.port),
                "--no-web",
                *(("--heads", str(self.heads)) if self.heads > 1 else ()),
            ),
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        out.close()
        try:
            wait_listening(self.port, self.proc, timeout, self.log)
            if self.heads > 1:
                self.wait_heads(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_heads(self, timeout: float) -> None:
        """Until every head serves: the listener listens before its heads have started, and
        their start's CPU would count in the first workload."""
        from appliance.heads import read_status

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = read_status(self.workdir)
            heads = (status or {}).get("heads", [])
            if len(heads) == self.heads and all(h.get("serving") for h in heads):
                return
            if self.proc is not None and self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError(f"the {self.heads} heads of {self.workdir} did not all serve")

    def restart(self) -> None:
        self.stop()
        self.restarts += 1
        self.start()

    def version(self) -> str:
        try:
            rev = subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
            ).stdout.strip()
        except OSError:
            rev = "?"
        return f"git {rev}"


def server_pid(server) -> int | None:
    return server.proc.pid if server.proc is not None and server.proc.poll() is None else None


def cpu_seconds(pid: int | None) -> float | None:
    """CPU seconds of the process and its children (a `serve --heads N` listener's heads)."""
    if pid is None:
        return None
    try:
        import psutil

        top = psutil.Process(pid)
        t = top.cpu_times()
        total = t.user + t.system
    except Exception:  # noqa: BLE001 (a server gone is reported elsewhere)
        return None
    for child in top.children(recursive=True):
        try:
            t = child.cpu_times()
        except Exception:  # noqa: BLE001 (a child that just exited)
            continue
        total += t.user + t.system
    return total


# -- one workload in a child process ---------------------------------------------------------
def run_child(cmd: list[str], timeout: float, env: dict | None = None) -> dict:
    try:
        proc = subprocess.run(
            cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env
        )
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {timeout:.0f} s"}
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    try:
        out = json.loads(last)
    except ValueError:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"ok": False, "error": f"exit {proc.returncode}: " + " | ".join(tail)[-500:]}
    if not out.get("ok") and proc.stderr:
        out["traceback"] = proc.stderr[-2000:]
    return out


def run_workload(
    server, client: str, workload: str, params: dict, timeout: float, env: dict | None = None
) -> dict:
    cmd = [
        sys.executable,
        str(REPO / "bench" / "workloads.py"),
        "--client",
        client,
        "--port",
        str(server.port),
        "--workload",
        workload,
        "--params",
        json.dumps(params),
    ]
    pid = server_pid(server)
    cpu0 = cpu_seconds(pid)
    t = time.perf_counter()
    out = run_child(cmd, timeout, env)
    out["wall_s"] = round(time.perf_counter() - t, 2)
    cpu1 = cpu_seconds(pid)
    if cpu0 is not None and cpu1 is not None:
        out["server_cpu_s"] = round(cpu1 - cpu0, 3)
    if not out.get("ok") and not server.alive():
        out["error"] = f"{out.get('error')} (server process exited: see {server.log})"
    return out


# -- the run --------------------------------------------------------------------------------
class Run:
    def __init__(self, args, servers: dict):
        self.args = args
        self.servers = servers
        self.params = dict(workloads.SIZES[args.mode])
        self.timeout = TIMEOUT_S[args.mode]
        self.samples: dict[str, dict[str, list[float]]] = {}
        self.errors: list[dict] = []
        self.cpu: dict[str, dict[str, list[float]]] = {}
        # CLIENT.WORKLOAD -> server -> CPU seconds per unit of work, and the unit
        self.cpu_per_work: dict[str, dict[str, list[float]]] = {}
        self.work_unit: dict[str, str] = {}
        self.cache_drop = None
        self.env: dict | None = None  # the clients' environment (bench/srcaddr.py with --heads)

    def add(self, server: str, metric: str, value: float) -> None:
        self.samples.setdefault(metric, {s: [] for s in SERVERS})[server].append(value)

    def error(self, server: str, client: str, workload: str, rep: int, out: dict) -> None:
        entry = {
            "server": server,
            "client": client,
            "workload": workload,
            "rep": rep,
            "error": out.get("error", "?"),
        }
        if out.get("traceback"):
            entry["traceback"] = out["traceback"]
        self.errors.append(entry)
        log(f"  {server} {client} {workload}: FAILED {entry['error']}")

    def ensure_up(self, name: str) -> bool:
        server = self.servers[name]
        if server.alive():
            return True
        try:
            log(f"  {name} is not running: restarting it")
            if hasattr(server, "restart"):
                server.restart()
            else:
                server.stop()
                server.start()
            return True
        except Exception as exc:  # noqa: BLE001 (recorded; the other server goes on)
            self.errors.append(
                {
                    "server": name,
                    "client": "-",
                    "workload": "restart",
                    "rep": -1,
                    "error": f"{type(exc).__name__}: {exc}"[:500],
                }
            )
            return False

    def step(
        self,
        name: str,
        client: str,
        workload: str,
        rep: int,
        metric_map: dict | None = None,
        label: str | None = None,
    ) -> dict | None:
        if not self.servers[name].backing_dir.is_dir():
            raise RuntimeError(
                f"{self.servers[name].backing_dir} vanished during the run (removed by another "
                "process?): the numbers from here on would be meaningless"
            )
        if not self.ensure_up(name):
            return None
        server = self.servers[name]
        out = run_workload(server, client, workload, self.params, self.timeout, self.env)
        if not out.get("ok"):
            self.error(name, client, workload, rep, out)
            return None
        metrics = out["metrics"]
        work, cpu = out.get("work"), out.get("server_cpu_s")
        if work and cpu is not None and work[0] > 0:
            key = f"{client}.{label or workload}"
            self.work_unit[key] = work[1]
            per = self.cpu_per_work.setdefault(key, {s: [] for s in SERVERS})
            per[name].append(cpu / work[0])
        for key, value in metrics.items():
            metric = f"{client}.{(metric_map or {}).get(key, key)}"
            self.add(name, metric, value)
            if out.get("server_cpu_s") is not None:
                self.cpu.setdefault(metric, {s: [] for s in SERVERS})[name].append(
                    out["server_cpu_s"]
                )
        log(
            f"  {name:8} {client:6} {workload:18} {metrics}  ({out['wall_s']} s, "
            f"server cpu {out.get('server_cpu_s', '?')} s)"
        )
        return metrics

    def sequential(self, name: str, client: str, rep: int) -> None:
        if self.step(name, client, "seq_write", rep) is None:
            return
        self.cache_drop = workloads.evict_page_cache([s.backing_dir for s in self.servers.values()])
        self.step(
            name, client, "seq_read", rep, {"seq_read_MBps": "seq_read_cold_MBps"}, "seq_read_cold"
        )
        self.step(
            name, client, "seq_read", rep, {"seq_read_MBps": "seq_read_warm_MBps"}, "seq_read_warm"
        )
        if self.ensure_up(name):
            run_workload(
                self.servers[name], client, "seq_cleanup", self.params, self.timeout, self.env
            )

    def run(self) -> None:
        for rep in range(self.args.reps):
            order = list(SERVERS) if rep % 2 == 0 else list(reversed(SERVERS))
            log(f"repetition {rep + 1}/{self.args.reps}: order {' then '.join(order)}")
            for client in self.args.clients:
                for workload in WORKLOAD_ORDER:
                    if self.args.workloads and workload not in self.args.workloads:
                        continue
                    for name in order:
                        if workload == "sequential":
                            self.sequential(name, client, rep)
                        else:
                            self.step(name, client, workload, rep)

    def training(self, workdir: Path) -> dict:
        """Training workloads (nfs4fs + torch) against each server, in a child process."""
        results = {}
        for name in SERVERS:
            server = self.servers[name]
            if not self.ensure_up(name):
                results[name] = {"ok": False, "error": "server not running"}
                continue
            cmd = [
                sys.executable,
                str(REPO / "bench" / "training.py"),
                "--port",
                str(server.port),
                "--mode",
                self.args.mode,
                "--server",
                name,
                "--local-dir",
                str(workdir / f"local-{name}"),
                "--json",
            ]
            if name == "shingle":
                cmd += ["--catalog-url", server.catalog_url]
            log(f"training workloads on {name}")
            out = run_child(cmd, self.timeout * 2, self.env)
            results[name] = out
            if out.get("ok"):
                for key, value in out["metrics"].items():
                    if isinstance(value, (int, float)):
                        self.add(name, f"train.{key}", value)
                log(f"  {name}: {out['metrics']}")
            else:
                self.errors.append(
                    {
                        "server": name,
                        "client": "nfs4fs",
                        "workload": "training",
                        "rep": 0,
                        "error": out.get("error", "?"),
                        "traceback": out.get("traceback", ""),
                    }
                )
                log(f"  {name} training FAILED: {out.get('error')}")
        return results

    def summary(self) -> list[dict]:
        goals = {m: (u, g) for m, u, g in METRICS}
        units = dict(TRAINING_METRICS)
        rows = []
        for metric, per in self.samples.items():
            base = metric.split(".", 1)[1]
            unit, goal = goals.get(base, (units.get(base, ""), None))
            s = median(per["shingle"])
            g = median(per["ganesha"])
            ratio = s / g if s is not None and g else None
            rows.append(
                {
                    "metric": metric,
                    "unit": unit,
                    "shingle": s,
                    "ganesha": g,
                    "ratio": ratio,
                    "goal": goal,
                    "n": {k: len(v) for k, v in per.items()},
                    "samples": per,
                }
            )
        # metrics where one server produced nothing still get a line
        return rows


# -- profile: py-spy attached to the shingle daemon while one workload runs ------------------------
PROFILED = (
    ("nfsrs", "seq_write"),
    ("nfsrs", "seq_read"),
    ("nfsrs", "small_files"),
    ("nfsrs", "random_write"),
)


def pyspy_binary() -> str | None:
    found = shutil.which("py-spy")
    local = Path(sys.executable).parent / "py-spy"
    return found or (str(local) if local.exists() else None)


IDLE_LEAVES = (
    "select (selectors.py)",
    "wait (threading.py)",
    "acquire (threading.py)",
    "_worker (concurrent/",
    "get (queue.py)",
    "_wait_for_tstate_lock",
    "run_forever",
    "_run_once (asyncio/base_events.py)",
)


def parse_collapsed(text: str) -> dict:
    """py-spy raw (collapsed) stacks -> top functions by self and inclusive share of the busy
    samples (stacks whose leaf is a thread waiting - selector, condition, pool queue - are idle)."""
    import re

    self_n: dict[str, int] = {}
    total_n: dict[str, int] = {}
    samples = 0
    strip_line = re.compile(r":\d+\)$")
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        samples += n
        frames = [
            strip_line.sub(")", f.strip())
            for f in stack.split(";")
            if f.strip() and not f.startswith(("process ", "thread "))
        ]
        if not frames or any(idle in frames[-1] for idle in IDLE_LEAVES):
            samples -= n
            continue
        self_n[frames[-1]] = self_n.get(frames[-1], 0) + n
        for f in set(frames):
            total_n[f] = total_n.get(f, 0) + n

    def top(counts: dict) -> list:
        ranked = sorted(counts.items(), key=lambda kv: -kv[1])[:20]
        return [(f, 100.0 * c / max(samples, 1)) for f, c in ranked]

    return {"samples": samples, "top_self": top(self_n), "top_total": top(total_n)}


def profile_shingle(run: Run, outdir: Path) -> dict:
    import signal

    binary = pyspy_binary()
    server = run.servers["shingle"]
    out = {}
    if binary is None:
        return {"all": {"error": "py-spy is not installed (pip install -e '.[bench]')"}}
    outdir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    for client, workload in PROFILED:
        key = f"{client}.{workload}"
        if not run.ensure_up("shingle"):
            out[key] = {"error": "shingle is not running"}
            continue
        if workload == "seq_read":  # needs its file; the write is not profiled here
            run_workload(server, client, "seq_write", run.params, run.timeout, run.env)
        raw = outdir / f"{stamp}-profile-{client}-{workload}.txt"
        spy = subprocess.Popen(
            [
                binary,
                "record",
                "--pid",
                str(server.proc.pid),
                "--rate",
                "200",
                "--format",
                "raw",
                "--output",
                str(raw),
                "--nonblocking",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(1.0)  # attach before the load starts
        res = run_workload(server, client, workload, run.params, run.timeout, run.env)
        spy.send_signal(signal.SIGINT)
        try:
            _, err = spy.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            spy.kill()
            _, err = spy.communicate()
        if workload == "seq_read":
            run_workload(server, client, "seq_cleanup", run.params, run.timeout, run.env)
        if not raw.exists():
            out[key] = {
                "error": f"py-spy wrote nothing (exit {spy.returncode}): "
                f"{(err or '').strip()[-300:]}"
            }
            continue
        prof = parse_collapsed(raw.read_text(errors="replace"))
        prof["raw"] = raw.name
        prof["workload_result"] = res.get("metrics") or res.get("error")
        out[key] = prof
        log(
            f"  profiled shingle {key}: {prof['samples']} samples; top self "
            f"{', '.join(f'{f} {p:.0f}%' for f, p in prof['top_self'][:3])}"
        )
    return out


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def fmt(value, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "nan"
    return f"{value:.{digits}f}"


def metric_order(rows: list[dict], clients, training: bool) -> list[dict]:
    want = [f"{c}.{m}" for c in clients for m, _u, _g in METRICS]
    if training:
        want += [f"train.{m}" for m, _u in TRAINING_METRICS]
    by = {r["metric"]: r for r in rows}
    ordered = [
        by.pop(m)
        if m in by
        else {
            "metric": m,
            "unit": "",
            "shingle": None,
            "ganesha": None,
            "ratio": None,
            "goal": None,
            "n": {},
            "samples": {},
        }
        for m in want
    ]
    return ordered + sorted(by.values(), key=lambda r: r["metric"])


def print_table(rows: list[dict]) -> None:
    print(f"{'metric':36} {'unit':10} {'shingle':>12} {'ganesha':>12} {'ratio':>7}  goal")
    for r in rows:
        goal = (
            ""
            if r["goal"] is None
            else (
                f">= {r['goal']}"
                + ("  ok" if r["ratio"] is not None and r["ratio"] >= r["goal"] else "  MISSED")
            )
        )
        print(
            f"{r['metric']:36} {r['unit']:10} {fmt(r['shingle']):>12} {fmt(r['ganesha']):>12} "
            f"{fmt(r['ratio'], 2):>7}  {goal}"
        )


def metric_lines(rows: list[dict]) -> list[str]:
    return [
        f"{r['metric']} {fmt(r['shingle'], 2)} {fmt(r['ganesha'], 2)} {fmt(r['ratio'], 3)}"
        for r in rows
    ]


def cpu_per_work_rows(run: Run) -> list[dict]:
    """Per CLIENT.WORKLOAD: the servers' median CPU seconds per unit of work, and the ratio."""
    rows = []
    for key, per in run.cpu_per_work.items():
        s, g = median(per["shingle"]), median(per["ganesha"])
        rows.append(
            {
                "workload": key,
                "unit": f"cpu s/{run.work_unit[key]}",
                "shingle": s,
                "ganesha": g,
                "ratio": s / g if s is not None and g else None,
                "samples": per,
            }
        )
    return rows


def cpu_per_work_lines(rows: list[dict]) -> list[str]:
    return [
        f"{r['workload']}.cpu_per_work {fmt(r['shingle'], 5)} {fmt(r['ganesha'], 5)} "
        f"{fmt(r['ratio'], 3)}"
        for r in rows
    ]


def torch_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="shingle vs NFS-Ganesha A/B benchmark")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument(
        "--quick",
        dest="mode",
        action="store_const",
        const="quick",
        help="every workload once, reduced sizes (a few minutes)",
    )
    mode.add_argument(
        "--smoke",
        dest="mode",
        action="store_const",
        const="smoke",
        help="tiny sizes, for the test suite",
    )
    ap.set_defaults(mode="full")
    ap.add_argument("--reps", type=int, help="repetitions (default 3 in full mode, 1 otherwise)")
    ap.add_argument(
        "--heads",
        type=int,
        default=1,
        help="shingle serve --heads N, the clients' connections from N loopback addresses",
    )
    ap.add_argument(
        "--clients",
        default=",".join(workloads.CLIENTS),
        help="comma-separated clients (default nfsrs,nfs4fs)",
    )
    ap.add_argument(
        "--no-training", action="store_true", help="skip the torch/fsspec training workloads"
    )
    ap.add_argument("--no-cluster", action="store_true", help="skip the cluster-scale model")
    ap.add_argument(
        "--report",
        action="store_true",
        help="write the markdown report and charts in quick mode too",
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        default=None,
        help="profile shingle with py-spy after the measured runs (default in full mode)",
    )
    ap.add_argument("--no-profile", dest="profile", action="store_false")
    ap.add_argument("--results", default=str(REPO / "bench" / "results"), help="report folder")
    ap.add_argument(
        "--workdir", help="where the servers keep their data (default: a temp folder, removed)"
    )
    ap.add_argument("--json", help="also write every sample and error to this JSON file")
    ap.add_argument(
        "--kerberos",
        action="store_true",
        help="also sequential write/read under sys, krb5, krb5i, krb5p on both servers "
        "(bench/krb5ab.py: a KDC and a second pair of servers with its key)",
    )
    ap.add_argument(
        "--kerberos-only", action="store_true", help="the Kerberos A/B alone (implies --kerberos)"
    )
    ap.add_argument("--kerberos-mib", type=int, default=32, help="MiB per Kerberos pass")
    ap.add_argument(
        "--delegations-only",
        action="store_true",
        help="the small-file epoch with and without delegations alone (bench/delegations.py: "
        "the Linux client in the kernel rig's VM, one boot per setting; calls and files/s)",
    )
    ap.add_argument(
        "--delegation-files", type=int, default=1000, help="files of the small-file epoch"
    )
    ap.add_argument(
        "--workloads",
        help=f"comma-separated subset of {','.join(WORKLOAD_ORDER)} (default: all)",
    )
    args = ap.parse_args(argv)
    args.workloads = [w.strip() for w in (args.workloads or "").split(",") if w.strip()]
    for w in args.workloads:
        if w not in WORKLOAD_ORDER:
            ap.error(f"--workloads: {w!r} is not one of {', '.join(WORKLOAD_ORDER)}")
    args.clients = [c.strip() for c in args.clients.split(",") if c.strip()]
    for c in args.clients:
        if c not in workloads.CLIENTS:
            ap.error(f"--clients: {c!r} is not one of {', '.join(workloads.CLIENTS)}")
    args.kerberos = args.kerberos or args.kerberos_only
    if args.reps is None:
        args.reps = 3 if args.mode == "full" else 1
    if args.profile is None:
        args.profile = args.mode == "full"
    if args.reps < 1:
        ap.error(f"--reps {args.reps}: expected at least 1")
    if not 1 <= args.heads <= 254:
        ap.error(f"--heads {args.heads}: expected 1 to 254 (one loopback address each)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.kerberos_only:
        return kerberos_only(args)
    if args.delegations_only:
        return delegations_only(args)
    started = time.time()
    # /var/tmp, not /tmp: a crowded /tmp gets swept by other jobs mid-run on shared machines
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="shingle-ab-bench-", dir="/var/tmp"))
    workdir.mkdir(parents=True, exist_ok=True)
    layout = SHINGLE_LAYOUT[args.mode]
    need = 10 * layout["drive_size"] + 4 * workloads.SIZES[args.mode]["seq_bytes"]
    free = shutil.disk_usage(workdir).free
    if free < need:
        print(
            f"compare: {workdir} has {free / GiB:.1f} GiB free; the {args.mode} mode needs about "
            f"{need / GiB:.1f} GiB (shingle's preallocated drives + Ganesha's files)",
            file=sys.stderr,
        )
        return 2
    servers = {
        "shingle": ShingleServer(workdir / "shingle", heads=args.heads, **layout),
        "ganesha": GaneshaServer(workdir / "ganesha"),
    }
    run = Run(args, servers)
    run.env = srcaddr.environ(args.heads, workdir)
    training = cluster = profile = kerberos = None
    server_info = {}
    try:
        for name, server in servers.items():
            server.workdir.mkdir(parents=True, exist_ok=True)
            try:
                server.start()
                log(f"{name} listening on 127.0.0.1:{server.port} ({server.version()})")
            except (GaneshaError, RuntimeError, OSError) as exc:
                log(f"{name} did not start: {exc}")
                run.errors.append(
                    {
                        "server": name,
                        "client": "-",
                        "workload": "start",
                        "rep": -1,
                        "error": str(exc)[:800],
                    }
                )
            server_info[name] = {
                "version": server.version(),
                "port": server.port,
                "backing_dir": str(server.backing_dir),
            }
        server_info["shingle"].update(
            {
                "drives": 10,
                "drive_size": layout["drive_size"],
                "zone_size": layout["zone_size"],
                "redundancy": "8+2 (warm class)",
                "heads": args.heads,
            }
        )

        def guarded(what, fn):
            # one part failing must not cost the numbers of the others
            try:
                return fn()
            except Exception as exc:  # noqa: BLE001 (recorded and reported)
                log(f"{what} failed: {type(exc).__name__}: {exc}")
                run.errors.append(
                    {
                        "server": "-",
                        "client": "-",
                        "workload": what,
                        "rep": -1,
                        "error": f"{type(exc).__name__}: {exc}"[:500],
                    }
                )
                return None

        guarded("workloads", run.run)
        if args.kerberos:
            from bench import krb5ab

            kerberos = guarded(
                "kerberos",
                lambda: krb5ab.run(workdir / "kerberos", args.kerberos_mib, args.reps, log),
            )
        if args.profile:
            log("profiling shingle (py-spy)")
            profile = guarded("profile", lambda: profile_shingle(run, Path(args.results)))
        if not args.no_training:
            if torch_available():
                training = guarded("training", lambda: run.training(workdir))
            else:
                training = {"skipped": "torch is not installed (pip install -e '.[bench]')"}
                print("training workloads skipped: torch is not installed", flush=True)
        if not args.no_cluster:
            from bench import cluster_model

            cluster = guarded("cluster model", lambda: cluster_model.run(quick=args.mode != "full"))
    finally:
        for server in servers.values():
            server.stop()
        if getattr(servers["shingle"], "restarts", 0):
            server_info.setdefault("shingle", {})["restarts"] = servers["shingle"].restarts
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)

    rows = metric_order(
        run.summary(), args.clients, training is not None and "skipped" not in training
    )
    cpu_rows = cpu_per_work_rows(run)
    result = {
        "mode": args.mode,
        "reps": args.reps,
        "clients": args.clients,
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)),
        "duration_s": round(time.time() - started, 1),
        "host": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        "cache_drop": run.cache_drop,
        "params": run.params,
        "servers": server_info,
        "rows": rows,
        "errors": run.errors,
        "server_cpu_s": run.cpu,
        "cpu_per_work": cpu_rows,
        "training": training,
        "cluster": cluster,
        "profile": profile,
        "kerberos": kerberos,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, default=str))
    if args.mode == "full" or args.report:
        from bench import report

        path = report.write(result, Path(args.results))
        print(f"report: {path}")
    if cluster and cluster.get("summary_lines"):
        for line in cluster["summary_lines"]:
            print(line)
    if run.cache_drop and run.cache_drop != "drop_caches":
        print(
            "note: /proc/sys/vm/drop_caches was not permitted: cold reads evicted the backing "
            "files with posix_fadvise(DONTNEED)"
        )
    if run.errors:
        print(f"{len(run.errors)} workload error(s):")
        for e in run.errors:
            print(f"  {e['server']} {e['client']} {e['workload']} (rep {e['rep']}): {e['error']}")
    print_table(rows)
    print(f"# {len(rows)} metrics: metric shingle_value ganesha_value ratio", flush=True)
    for line in metric_lines(rows):
        print(line)
    print(
        f"# {len(cpu_rows)} workloads: CLIENT.WORKLOAD.cpu_per_work shingle ganesha ratio "
        "(server CPU s per MiB moved, or per 1,000 operations: kop)",
        flush=True,
    )
    for line in cpu_per_work_lines(cpu_rows):
        print(line)
    if kerberos:
        print_kerberos(kerberos)
    return 0


def print_kerberos(result: dict) -> None:
    from bench import krb5ab

    print("\n".join(krb5ab.table_lines(result)))
    print(
        "# kerberos: FLAVOUR.OP_MBps shingle ganesha ratio; FLAVOUR.OP.cpu_ms_per_MiB "
        "shingle ganesha ratio (server CPU ms per MiB)",
        flush=True,
    )
    for line in krb5ab.metric_lines(result):
        print(line)


def kerberos_only(args) -> int:
    from bench import krb5ab

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="shingle-krb5ab-", dir="/var/tmp"))
    try:
        result = krb5ab.run(workdir, args.kerberos_mib, args.reps, log)
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, default=str))
    print_kerberos(result)
    return 0


def delegations_only(args) -> int:
    """bench/delegations.py in a process of its own (it puts tests/kernel on its path): the
    calls per epoch and files per second with and without delegations, at shingle's default
    lease."""
    run = subprocess.run(
        [sys.executable, str(REPO / "bench" / "delegations.py"), "--json"]
        + ["--files", str(args.delegation_files)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    if run.returncode != 0:
        print(run.stderr, file=sys.stderr)
        return run.returncode
    report = json.loads(run.stdout)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    print(f"# delegations: {report['files']} files, lease {report['lease_seconds']} s")
    for key in ("calls_per_epoch", "files_per_s"):
        print(f"{key}_with {report[key + '_with']}")
        print(f"{key}_without {report[key + '_without']}")
    print(f"ratio_epoch2 {report['ratio_epoch2']:.2f}")
    print(f"ratio_epoch3 {report['ratio_epoch3']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
