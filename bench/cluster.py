"""Benchmark: aggregate write and read through one head on one host and on 12 hosts, same run.

    .venv/bin/python bench/cluster.py [--quick | --smoke] [--rounds N] [--hosts N]
                                      [--layout auto|netns|loopback] [--json FILE]

Two layouts of 12 drives under one head process, 8+2 stripes of the warm class:
- ``one host``: 12 local zone-file drives (no network);
- ``12 hosts``: 12 `shingle agent` processes with one drive each. With ``--layout netns`` (the
  default when this runs as root and can make network namespaces) each agent is a host of the
  cluster test bed (tests/cluster/bed.py: a network namespace on a bridge, 10.131.0.0/24 inside
  the bed only) and the head runs in a namespace of its own, so every byte between them crosses
  a veth pair and its interface counters; ``--layout loopback`` puts the agents on 127.0.0.2-13
  and counts only the agent protocol's frames.
Workload: 8 writers each write a shard in 1 MiB writes and commit; then 16 readers read it all
back (each shard in two halves; the head's fragment cache dropped and the zone files' pages
evicted first), checking every byte.

On 2 cores this measures overhead, not scale: the agents share the head's cores and disk. So
the figures are per MiB of client data: CPU of the head process (which also runs the writers
and readers, the same in both layouts) and of the agents; bytes on the wire per client byte
(the floor is 1.25 for 8+2 writes, 1.0 for reads of the data fragments); catalog commits and
agent round trips per stripe. bench/cluster_model.py --measured FILE carries them to the
pilot cluster. Progress goes to stderr, the table (or ``--json``) to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MiB = 1 << 20
KiB = 1 << 10
DRIVES = 12  # under the head in both layouts
HOSTS = 12  # the agents' hosts (--hosts: fewer, with more drives each, for a smoke run)
WRITERS = 8
READERS = 16
AGENT_PORT = 7100  # in the bed every host has its own ports
LOOPBACK_PORTS = range(46520, 46600)  # past bench/agents.py's and the agent tests' ports
SERVING = "shingle agent: serving"
SIZES = {  # shard = bytes per writer
    "smoke": {"shard": 1 * MiB, "fragment": 64 * KiB, "zone": 4 * MiB, "drive": 64 * MiB},
    "quick": {"shard": 16 * MiB, "fragment": 1 * MiB, "zone": 64 * MiB, "drive": 512 * MiB},
    "full": {"shard": 64 * MiB, "fragment": 1 * MiB, "zone": 64 * MiB, "drive": 1024 * MiB},
}


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (/proc/PID/stat)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- the head: a worker process that runs one layout's write and read --------------------------


class Counts:
    """What the head sends and receives over the agent protocol, and its catalog commits,
    counted by wrapping the functions that do them (engine/drives/agentwire.py, Catalog.run)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.requests: Counter = Counter()
        self.sent = 0
        self.received = 0
        self.commits = 0

    def install(self) -> None:
        from engine.catalog.database import Catalog
        from engine.drives import agentwire as wire

        send, read, run = wire.send_frame, wire.read_frame, Catalog.run

        def send_frame(sock, op, request_id, *parts, status=0):
            with self.lock:
                self.requests[wire.OP_NAMES.get(op, str(op))] += 1
                self.sent += wire.HEADER.size + sum(len(p) for p in parts)
            return send(sock, op, request_id, *parts, status=status)

        def read_frame(sock):
            frame = read(sock)
            with self.lock:
                self.received += wire.HEADER.size + len(frame.body)
            return frame

        def counted_run(catalog, work, *, write=True, **kwargs):
            if write:
                with self.lock:
                    self.commits += 1
            return run(catalog, work, write=write, **kwargs)

        wire.send_frame, wire.read_frame = send_frame, read_frame
        Catalog.run = counted_run  # type: ignore[method-assign]

    def snapshot(self) -> dict:
        with self.lock:
            return {
                "requests": dict(self.requests),
                "sent": self.sent,
                "received": self.received,
                "commits": self.commits,
            }


def interface_bytes(iface: str | None) -> int:
    """Bytes both ways through the head's interface (inside its namespace); 0 without one."""
    if not iface:
        return 0
    base = Path("/sys/class/net") / iface / "statistics"
    return int((base / "tx_bytes").read_text()) + int((base / "rx_bytes").read_text())


def evict(folders: list[str]) -> None:
    for folder in folders:
        for path in Path(folder).rglob("zone-*"):
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def write_shards(ns, shard: int) -> tuple[list[int], bytes, float]:
    from engine.namespace import ROOT as NS_ROOT

    chunk = os.urandom(MiB)
    inos = [ns.create(NS_ROOT, ns.root_ino, f"shard-{i}").ino for i in range(WRITERS)]
    barrier = threading.Barrier(WRITERS + 1)
    failures: list[BaseException] = []

    def writer(ino: int) -> None:
        barrier.wait()
        try:
            for off in range(0, shard, MiB):
                ns.write(ino, off, chunk)
            ns.commit(ino)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=writer, args=(ino,)) for ino in inos]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    if failures:
        raise failures[0]
    return inos, chunk, elapsed


def read_shards(ns, inos: list[int], shard: int, chunk: bytes) -> float:
    """16 readers, each one half of a shard in reads of up to 1 MiB; every byte checked."""
    pieces = [(ino, half * shard // 2) for ino in inos for half in (0, 1)]
    assert len(pieces) == READERS
    failures: list[BaseException] = []

    step = min(MiB, shard // 2)  # the writers' 1 MiB chunk repeats: reads stay inside one

    def reader(ino: int, start: int) -> None:
        try:
            for off in range(start, start + shard // 2, step):
                got = ns.read(ino, off, step)
                if got != chunk[off % MiB : off % MiB + step]:
                    raise RuntimeError(f"inode {ino} at {off}: wrong bytes read back")
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=reader, args=piece) for piece in pieces]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    if failures:
        raise failures[0]
    return elapsed


def phase(counts: Counts, agent_pids: list[int], iface: str | None) -> dict:
    times = os.times()
    return {
        "head_cpu": times.user + times.system,
        "agents_cpu": sum(cpu_seconds(pid) for pid in agent_pids),
        "iface": interface_bytes(iface),
        **counts.snapshot(),
    }


def per_mib(before: dict, after: dict, client: int, stripes: int, seconds: float) -> dict:
    mib = client / MiB
    requests = Counter(after["requests"])
    requests.subtract(before["requests"])
    frames = after["sent"] - before["sent"] + after["received"] - before["received"]
    return {
        "MBps": client / seconds / 1e6,
        "seconds": seconds,
        "head_cpu_ms_per_MiB": (after["head_cpu"] - before["head_cpu"]) * 1000 / mib,
        "agents_cpu_ms_per_MiB": (after["agents_cpu"] - before["agents_cpu"]) * 1000 / mib,
        "frame_bytes_per_client_byte": frames / client,
        "wire_bytes_per_client_byte": (after["iface"] - before["iface"]) / client,
        "commits_per_stripe": (after["commits"] - before["commits"]) / stripes,
        "round_trips_per_stripe": sum(requests.values()) / stripes,
        "round_trips_by_op": {op: n for op, n in sorted(requests.items()) if n},
    }


def worker(spec: dict) -> dict:
    """One layout's run inside the head process (see the module docstring)."""
    from sqlalchemy import func, select

    from engine.catalog import Catalog, upgrade
    from engine.catalog.models import Stripe
    from engine.coding.erasure import load_policies
    from engine.datapath import DataPath
    from engine.drives import add_agent_drives, format_emulated
    from engine.namespace import Namespace

    counts = Counts()
    counts.install()
    sizes, folder = spec["sizes"], Path(spec["folder"])
    url = f"sqlite:///{folder}/catalog.db"
    upgrade(url)
    catalog = Catalog(url)
    if spec["agents"]:
        for address in spec["agents"]:
            add_agent_drives(catalog, address)
    else:
        format_emulated(
            catalog, folder / "drives", DRIVES, sizes["drive"], sizes["zone"], preallocate=False
        )
    fragment = {"fragment_size": sizes["fragment"]}
    policies = load_policies({"hot": fragment, "warm": fragment, "cold": fragment})
    data = DataPath(catalog, policies, reserve_zones=2)
    label, pids, iface = spec["label"], spec["agent_pids"], spec["iface"]
    client = WRITERS * sizes["shard"]
    try:
        ns = Namespace(catalog, data=data)
        say(f"  {label}: {WRITERS} writers x {sizes['shard'] // MiB} MiB")
        before = phase(counts, pids, iface)
        inos, chunk, write_s = write_shards(ns, sizes["shard"])
        after_write = phase(counts, pids, iface)
        committer = {key: data.stats[key] for key in ("commit_s", "batches", "stripes_committed")}
        stripes = catalog.read(
            lambda conn: conn.execute(
                select(func.count()).select_from(Stripe.__table__).where(Stripe.__table__.c.k > 1)
            ).scalar_one()
        )
        data.reader.drop_cache()
        evict(spec["evict"])
        say(f"  {label}: wrote in {write_s:.1f} s; {READERS} readers")
        mid = phase(counts, pids, iface)
        read_s = read_shards(ns, inos, sizes["shard"], chunk)
        after_read = phase(counts, pids, iface)
        say(f"  {label}: read in {read_s:.1f} s")
    finally:
        data.close()
        catalog.close()
    write = per_mib(before, after_write, client, stripes, write_s)
    # the data path's committer: its durable catalog transactions, each holding a batch of stripes
    write["catalog_commit_ms_per_stripe"] = committer["commit_s"] * 1000 / stripes
    batches = max(committer["batches"], 1)
    write["stripes_per_commit_batch"] = committer["stripes_committed"] / batches
    return {
        "stripes": stripes,
        "write": write,
        "read": per_mib(mid, after_read, client, stripes, read_s),
    }


# -- the layouts -------------------------------------------------------------------------------


def agent_argv(address: str, host: str, folder: Path, sizes: dict, hosts: int) -> list[str]:
    """`shingle agent` serving this host's share of the 12 drives."""
    drives = [str(folder / f"drive-{n}") for n in range(DRIVES // hosts)]
    return [
        sys.executable, "-m", "appliance.cli", "agent", "--listen", address, "--host", host,
        "--format", "--no-preallocate", "--drive-size", str(sizes["drive"]),
        "--zone-size", str(sizes["zone"]), "--drives", *drives,
    ]  # fmt: skip


def wait_serving(procs: list[subprocess.Popen], logs: list[Path]) -> None:
    """An agent is ready once it printed that it serves (a connect can meet itself)."""
    deadline = time.monotonic() + 120
    for proc, log in zip(procs, logs, strict=True):
        while SERVING not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"agent did not start: {log.read_text(errors='replace')}")
            time.sleep(0.05)


def stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_worker(spec: dict, prefix: list[str]) -> dict:
    """The head as a process of its own (in a namespace: ``prefix``); its result."""
    spec_path = Path(spec["folder"]) / "spec.json"
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [*prefix, sys.executable, str(Path(__file__).resolve()), "--worker", str(spec_path)],
        stdout=subprocess.PIPE,
        env=env,
        cwd=ROOT,
        timeout=1800,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{spec['label']}: the head exited with {done.returncode}")
    return json.loads(done.stdout.decode().strip().splitlines()[-1])


def one_host(work: Path, sizes: dict) -> dict:
    folder = work / f"one-host-{time.monotonic_ns()}"
    folder.mkdir()
    try:
        spec = {
            "label": "one host",
            "folder": str(folder),
            "sizes": sizes,
            "agents": [],
            "agent_pids": [],
            "evict": [str(folder / "drives")],
            "iface": None,
        }
        return run_worker(spec, [])
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def hosts_on_loopback(work: Path, sizes: dict, hosts: int) -> dict:
    import socket

    folder = work / f"loopback-{time.monotonic_ns()}"
    folder.mkdir()
    procs: list[subprocess.Popen] = []
    logs, addresses = [], []
    ports = iter(LOOPBACK_PORTS)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        for n in range(hosts):
            ip = f"127.0.0.{n + 2}"
            while True:  # a port nobody holds on that address
                port = next(ports)
                with socket.socket() as probe:
                    if probe.connect_ex((ip, port)) != 0:
                        break
            host = folder / f"n{n:02d}"
            host.mkdir()
            logs.append(host / "agent.log")
            with open(logs[-1], "ab") as log:
                procs.append(
                    subprocess.Popen(
                        agent_argv(f"{ip}:{port}", f"n{n:02d}", host, sizes, hosts),
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env=env,
                        cwd=ROOT,
                    )
                )
            addresses.append(f"{ip}:{port}")
        say(f"  {hosts} hosts: {hosts} agents starting on 127.0.0.2-{hosts + 1}")
        wait_serving(procs, logs)
        spec = {
            "label": f"{hosts} hosts",
            "folder": str(folder),
            "sizes": sizes,
            "agents": addresses,
            "agent_pids": [p.pid for p in procs],
            "evict": [str(folder)],
            "iface": None,
        }
        return run_worker(spec, [])
    finally:
        stop(procs)
        shutil.rmtree(folder, ignore_errors=True)


def hosts_in_bed(sizes: dict, hosts: int) -> dict:
    sys.path.insert(0, str(ROOT / "tests" / "cluster"))
    from bed import Bed  # tests/cluster/bed.py

    bed = Bed(etcd_members=0, postgres_members=0)
    bed.start()
    procs: list[subprocess.Popen] = []
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        logs, addresses = [], []
        for n in range(hosts):
            host = bed.add_host(f"n{n:02d}")
            logs.append(host.folder / "agent.log")
            with open(logs[-1], "ab") as log:
                argv = agent_argv(
                    f"{host.address}:{AGENT_PORT}", host.name, host.folder, sizes, hosts
                )
                out = {"stdout": log, "stderr": subprocess.STDOUT}
                procs.append(bed.run(host.name, argv, env=env, cwd=ROOT, **out))
            addresses.append(f"{host.address}:{AGENT_PORT}")
        head = bed.add_host("head")
        say(f"  {hosts} hosts: agents starting in network namespaces ({addresses[0]}...)")
        wait_serving(procs, logs)
        spec = {
            "label": f"{hosts} hosts",
            "folder": str(head.folder),
            "sizes": sizes,
            "agents": addresses,
            # `ip netns exec` execs the agent in place: the process we started is the agent
            "agent_pids": [p.pid for p in procs],
            "evict": [str(bed.folder)],
            "iface": "eth0",
        }
        return run_worker(spec, ["ip", "netns", "exec", head.netns])
    finally:
        stop(procs)
        bed.close()


def choose_layout(asked: str) -> str:
    if asked != "auto":
        return asked
    sys.path.insert(0, str(ROOT / "tests" / "cluster"))
    from bed import BedUnavailable, check_netns

    try:
        check_netns()
    except BedUnavailable as exc:
        say(f"no network namespaces here ({exc}): agents on 127.0.0.x")
        return "loopback"
    return "netns"


# -- report ------------------------------------------------------------------------------------

FIGURES = (
    ("MBps", "MB/s", "{:.0f}"),
    ("head_cpu_ms_per_MiB", "head CPU ms/MiB", "{:.2f}"),
    ("agents_cpu_ms_per_MiB", "agents CPU ms/MiB", "{:.2f}"),
    ("wire_bytes_per_client_byte", "wire B/client B", "{:.3f}"),
    ("frame_bytes_per_client_byte", "frame B/client B", "{:.3f}"),
    ("commits_per_stripe", "commits/stripe", "{:.2f}"),
    ("round_trips_per_stripe", "round trips/stripe", "{:.1f}"),
)


def median_of(runs: list[dict]) -> dict:
    out: dict = {"stripes": runs[0]["stripes"]}
    for part in ("write", "read"):
        out[part] = {
            key: statistics.median(r[part][key] for r in runs)
            for key, _label, _fmt in FIGURES + (("seconds", "", ""),)
        }
        out[part]["round_trips_by_op"] = runs[-1][part]["round_trips_by_op"]
    for key in ("catalog_commit_ms_per_stripe", "stripes_per_commit_batch"):
        out["write"][key] = statistics.median(r["write"][key] for r in runs)
    return out


def table(summary: dict) -> list[str]:
    many = f"{summary['setup']['hosts']} hosts"
    lines = [
        f"{WRITERS} writers x {summary['setup']['shard_MiB']} MiB, {READERS} readers, 8+2 of "
        f"{summary['setup']['fragment_KiB']} KiB fragments, {DRIVES} drives; {many}: "
        f"{summary['setup']['layout']}; median of {summary['setup']['rounds']}",
        f"{'':22}" + "".join(f"{name:>13}" for name in ("one host", many)),
    ]
    for part in ("write", "read"):
        for key, label, fmt in FIGURES:
            cells = [fmt.format(summary[layout][part][key]) for layout in ("one_host", "hosts")]
            if key == "wire_bytes_per_client_byte" and summary["setup"]["layout"] != "netns":
                cells = ["-", "-"]  # no interface of the head's own to count
            lines.append(f"{part + ' ' + label:22}" + "".join(f"{c:>13}" for c in cells))
    lines.append(
        "write catalog commit ms/stripe (committer)"
        + "".join(
            f" {summary[layout]['write']['catalog_commit_ms_per_stripe']:.2f}"
            f" ({summary[layout]['write']['stripes_per_commit_batch']:.1f} stripes a batch)"
            for layout in ("one_host", "hosts")
        )
    )
    for part in ("write", "read"):
        ops = summary["hosts"][part]["round_trips_by_op"].items()
        lines.append(f"{many} {part} requests: " + ", ".join(f"{op} {n}" for op, n in ops))
    ratio = summary["ratio_hosts_to_one"]
    lines.append(f"{many} / one host: write {ratio['write']:.2f}, read {ratio['read']:.2f}")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="16 MiB per writer (default 64)")
    size.add_argument("--smoke", action="store_true", help="tiny sizes: the harness only")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of each layout (median)")
    parser.add_argument(
        "--hosts", type=int, default=HOSTS, choices=(2, 3, 4, 6, 12), help="agents' hosts (12)"
    )
    parser.add_argument("--layout", choices=("auto", "netns", "loopback"), default="auto")
    parser.add_argument("--json", help="also write the summary to this file")
    parser.add_argument("--dir", help="scratch folder (default: a temporary one)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # the head process of one layout
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(Path(args.worker).read_text()))))
        return 0
    sizes = SIZES["smoke" if args.smoke else "quick" if args.quick else "full"]
    layout = choose_layout(args.layout)
    work = Path(tempfile.mkdtemp(prefix="shingle-cluster-", dir=args.dir))
    runs: dict[str, list[dict]] = {"one_host": [], "hosts": []}
    try:
        for n in range(args.rounds):
            say(f"round {n + 1} of {args.rounds}: one host ({DRIVES} local drives)")
            runs["one_host"].append(one_host(work, sizes))
            say(f"round {n + 1} of {args.rounds}: {args.hosts} hosts ({layout})")
            if layout == "netns":
                many = hosts_in_bed(sizes, args.hosts)
            else:
                many = hosts_on_loopback(work, sizes, args.hosts)
            runs["hosts"].append(many)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary: dict = {name: median_of(found) for name, found in runs.items()}
    summary["ratio_hosts_to_one"] = {
        part: summary["hosts"][part]["MBps"] / summary["one_host"][part]["MBps"]
        for part in ("write", "read")
    }
    summary["setup"] = {
        "layout": layout,
        "writers": WRITERS,
        "readers": READERS,
        "hosts": args.hosts,
        "drives": DRIVES,
        "shard_MiB": sizes["shard"] / MiB,
        "fragment_KiB": sizes["fragment"] // KiB,
        "rounds": args.rounds,
        "load_average": round(os.getloadavg()[0], 1),
        "cores": os.cpu_count(),
    }
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))
    print("\n".join(table(summary)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
