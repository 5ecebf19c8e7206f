"""Benchmark: a lost host rebuilt onto the others, and a host drained, over drive agents.

N `shingle agent` processes on 127.0.0.1 (one drive each, a host each), a head in this process
with 4+2 stripes of 256 KiB fragments (so 8 hosts leave room for one lost and one drained with
one fragment per host). One writer writes the data set in 4 MiB files; then host00's agent is
killed and the host removed (declared gone: its fragments rebuilt from the others, unpaced);
then host01 is drained at --rate MiB/s. After each, every file is read back and its sha256
compared. Reported: the write rate of client data, the rebuild's and the drain's rates in the
same run (bytes written onto the other hosts per second), their ratio to the write rate, the
drain's achieved rate against the one it was given, and CPU per MiB moved (the head, and the
agents' processes).

On one machine this measures the head's and the protocol's costs, not a network's: the agents
share the head's cores and disk.

    .venv/bin/python bench/hostops.py [--hosts 8] [--mib 48] [--rate 8] [--json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import socket
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
from engine.drives import add_agent_drives  # noqa: E402
from engine.lifecycle import hostops  # noqa: E402
from engine.namespace import ROOT as ROOT_INO  # noqa: E402
from engine.namespace import Namespace  # noqa: E402

MiB = 1 << 20
FIRST_PORT = 46600
POLICIES = {name: {"k": 4, "m": 2, "fragment_size": 256 << 10} for name in ("warm", "cold")} | {
    "hot": {"fragment_size": 256 << 10}
}


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def self_cpu() -> float:
    times = os.times()
    return times.user + times.system


def free_port(start: int) -> int:
    for port in range(start, start + 100):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {start}-{start + 99}")


def start_agents(work: Path, count: int) -> list[tuple[subprocess.Popen, str]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    agents, port = [], FIRST_PORT
    for i in range(count):
        port = free_port(port) + 1
        address = f"127.0.0.1:{port - 1}"
        log = open(work / f"agent-{i}.log", "ab")  # noqa: SIM115 - the child holds it
        argv = [sys.executable, "-m", "appliance.cli", "agent", "--listen", address]
        argv += ["--host", f"host{i:02d}", "--format", "--no-preallocate"]
        argv += ["--drive-size", "256MiB", "--zone-size", "4MiB"]
        argv += ["--drives", str(work / f"host{i:02d}")]
        agents.append(
            (subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env), address)
        )
        log.close()
    for i, (process, address) in enumerate(agents):
        deadline = time.monotonic() + 120
        log_path = work / f"agent-{i}.log"
        while "shingle agent: serving" not in log_path.read_text(errors="replace"):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"agent {address} did not start: {log_path.read_text()}")
            time.sleep(0.05)
    return agents


def agents_cpu(agents) -> float:
    return sum(cpu_seconds(p.pid) for p, _a in agents if p.poll() is None)


def check(ns, data_path, files) -> None:
    data_path.reader.drop_cache()
    for ino, digest, size in files:
        if hashlib.sha256(ns.read(ino, 0, size + 1)).hexdigest() != digest:
            raise AssertionError(f"inode {ino}: bytes differ after the move")


def measured(what, action, agents, mib_before: float | None = None) -> dict:
    head0, agents0, t0 = self_cpu(), agents_cpu(agents), time.monotonic()
    result = action()
    seconds = time.monotonic() - t0
    moved = result["bytes_written"] / MiB if isinstance(result, dict) else mib_before
    head, agent = self_cpu() - head0, agents_cpu(agents) - agents0
    return {
        "what": what,
        "mib": round(moved, 2),
        "seconds": round(seconds, 2),
        "mib_per_s": round(moved / seconds, 2),
        "head_cpu_ms_per_mib": round(1000 * head / moved, 2),
        "agents_cpu_ms_per_mib": round(1000 * agent / moved, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--mib", type=int, default=48, help="client data written first")
    parser.add_argument("--rate", type=float, default=8.0, help="the drain's pace, MiB/s")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="shingle-hostops-"))
    agents = start_agents(work, args.hosts)
    url = f"sqlite:///{work}/catalog.db"
    upgrade(url)
    catalog = Catalog(url)
    data_path = None
    try:
        for _process, address in agents:
            add_agent_drives(catalog, address)
        data_path = DataPath(catalog, load_policies(POLICIES), reserve_zones=2)
        ns = Namespace(catalog, data=data_path)
        files = []

        def write():
            for n in range(args.mib // 4):
                data = os.urandom(4 * MiB)
                ino = ns.create(ROOT_INO, ns.root_ino, f"f{n}").ino
                ns.write(ino, 0, data)
                ns.commit(ino)
                files.append((ino, hashlib.sha256(data).hexdigest(), len(data)))
            return None

        rows = [measured("write (client data)", write, agents, mib_before=args.mib // 4 * 4)]
        agents[0][0].send_signal(signal.SIGKILL)
        agents[0][0].wait()
        deadline = time.monotonic() + 60
        while not any(c.new == "missing" for c in data_path.check_drives()):
            if time.monotonic() > deadline:
                raise RuntimeError("host00's drive not seen missing")
            time.sleep(0.1)
        rows.append(
            measured(
                "rebuild of a lost host (unpaced)",
                lambda: hostops.remove_host(data_path, catalog, "host00", actor="bench"),
                agents,
            )
        )
        check(ns, data_path, files)
        rows.append(
            measured(
                f"drain of a host (paced at {args.rate:g} MiB/s)",
                lambda: hostops.drain_host(
                    data_path, catalog, "host01", actor="bench", bytes_per_s=args.rate * MiB
                ),
                agents,
            )
        )
        check(ns, data_path, files)
        write_rate = rows[0]["mib_per_s"]
        for row in rows[1:]:
            row["ratio_to_write"] = round(row["mib_per_s"] / write_rate, 2)
        rows[2]["configured_mib_per_s"] = args.rate
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            for row in rows:
                print(
                    f"{row['what']:<38} {row['mib']:>7.2f} MiB {row['seconds']:>7.2f} s "
                    f"{row['mib_per_s']:>7.2f} MiB/s  head {row['head_cpu_ms_per_mib']:>6.2f} "
                    f"ms/MiB  agents {row['agents_cpu_ms_per_mib']:>6.2f} ms/MiB"
                    + (f"  x{row['ratio_to_write']} of write" if "ratio_to_write" in row else "")
                )
            print("every file's sha256 matched after the rebuild and after the drain")
    finally:
        if data_path is not None:
            data_path.close()
        catalog.close()
        for process, _address in agents:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process, _address in agents:
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
