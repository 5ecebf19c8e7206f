"""Client writes while the server copies: what an asynchronous COPY's pacing leaves them.

One NFS server (in this process, over the tests' stack: SQLite catalog, ten emulated drives of
64 KiB fragments) holds a source file of --source-mib written in 1 MiB pieces. A foreground
client sends 64 KiB FILE_SYNC WRITEs for --seconds while, in turn:

  none          nothing else runs
  async         a second client copies the source over and over with asynchronous COPY
                (answered at once, CB_OFFLOAD awaited), the copier resting as long as each
                64 MiB piece took (the default)
  async-eager   the same without the rests (Offloads.rest_ratio = 0)
  sync          the second client copies with synchronous COPY, back to back

Per setting: the foreground's writes/s and their ratio to ``none``, its p99 latency, the bytes
the copies moved per second, and the server's CPU per GiB copied (the process's CPU time minus
the two client threads'; the copies share stripes, so this is catalog work).

    .venv/bin/python bench/copy_offload.py [--source-mib 256] [--seconds 10] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "nfs"))  # the raw clients and the test stack

MiB = 1 << 20
SETTINGS = ("none", "async", "async-eager", "sync")


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def foreground(port: int, seconds: float, out: dict) -> None:
    from nfs4_rawclient import RawClient

    from appliance.nfs.v4 import const as c
    from appliance.nfs.v4 import types as t

    client = RawClient(port, minor=2).setup()
    fh, sid = client.open_new("foreground")
    block = os.urandom(64 << 10)
    latencies = []
    cpu0 = time.thread_time()
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline:
        write = t.ARGS[c.OP_WRITE](sid, (n % 128) * len(block), c.FILE_SYNC4, block)
        began = time.perf_counter()
        st, _ = client.session([(c.OP_PUTFH, fh), (c.OP_WRITE, write)])
        latencies.append(time.perf_counter() - began)
        assert st == 0, st
        n += 1
    out["client_cpu"] = time.thread_time() - cpu0
    out["writes"] = n
    out["p99_ms"] = statistics.quantiles(latencies, n=100)[98] * 1000
    client.close()


def background(port: int, setting: str, stop: threading.Event, out: dict) -> None:
    from test_copy_offload import OffloadClient

    client = OffloadClient(port).setup()
    src = client.new_file("source")  # opened, not written: the engine wrote it
    dst = client.new_file("copy")
    cpu0 = time.thread_time()
    copied = 0
    while not stop.is_set():
        st, ok = client.copy(src, dst, synchronous=setting == "sync")
        assert st == 0, st
        if ok.requirements.synchronous:
            assert setting == "sync", "an asynchronous COPY was done synchronously"
            copied += ok.response.count
            continue
        client.next_callback()  # CB_OFFLOAD, answered
        copied += client.offloads()[-1].info[1].count
    out["client_cpu"] = time.thread_time() - cpu0
    out["copied"] = copied
    client.close()


def one_setting(server, setting: str, seconds: float, rest: float) -> dict:
    offloads = server.server.offloads
    offloads.rest_ratio = 0.0 if setting == "async-eager" else rest
    fg: dict = {}
    bg: dict = {"copied": 0, "client_cpu": 0.0}
    stop = threading.Event()
    copier = None
    cpu0 = _cpu()
    if setting != "none":
        copier = threading.Thread(target=background, args=(server.port, setting, stop, bg))
        copier.start()
        time.sleep(0.5)  # the copies are under way
    began = time.monotonic()
    foreground(server.port, seconds, fg)
    stop.set()
    if copier is not None:
        copier.join()
    elapsed = time.monotonic() - began
    server_cpu = _cpu() - cpu0 - fg["client_cpu"] - bg["client_cpu"]
    copied_gib = bg["copied"] / (1 << 30)
    return {
        "setting": setting,
        "writes_per_s": fg["writes"] / seconds,
        "p99_ms": fg["p99_ms"],
        "copied_mib_s": bg["copied"] / MiB / elapsed,
        "server_cpu_s_per_gib_copied": server_cpu / copied_gib if copied_gib else None,
    }


def main() -> None:
    from nfs4_support import Stack, add_export, start_server

    from engine.namespace import ROOT as ROOT_CRED

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source-mib", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--rest-ratio",
        type=float,
        help="the async setting's rest per piece (default: the server's)",
    )
    args = parser.parse_args()
    from appliance.nfs.v4.offload import Offloads

    rest = args.rest_ratio if args.rest_ratio is not None else Offloads(None).rest_ratio

    tmp = Path(tempfile.mkdtemp(prefix="shingle-bench-offload-"))
    stack = Stack(tmp, drive_size=128 * MiB, zone_size=2 * MiB, fragment_size=64 * 1024)
    add_export(stack.catalog)
    server = start_server(stack)
    try:
        ns = stack.namespace
        source = ns.create(ROOT_CRED, ns.resolve("/").ino, "source")
        for pos in range(0, args.source_mib * MiB, MiB):
            ns.write(source.ino, pos, os.urandom(MiB), stable=True)
        rows = [one_setting(server, setting, args.seconds, rest) for setting in SETTINGS]
    finally:
        server.stop()
        stack.close()
        shutil.rmtree(tmp, ignore_errors=True)
    base = rows[0]["writes_per_s"]
    for row in rows:
        row["writes_vs_none"] = row["writes_per_s"] / base if base else None
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(
        f"source {args.source_mib} MiB, foreground 64 KiB FILE_SYNC WRITEs for {args.seconds} s, "
        f"async rests {rest}x each piece's time"
    )
    print(
        f"{'setting':<12} {'writes/s':>9} {'vs none':>8} {'p99 ms':>8} {'copied MiB/s':>13} "
        f"{'server CPU s/GiB':>17}"
    )
    for row in rows:
        cpu = row["server_cpu_s_per_gib_copied"]
        print(
            f"{row['setting']:<12} {row['writes_per_s']:>9.1f} {row['writes_vs_none']:>8.2f} "
            f"{row['p99_ms']:>8.1f} {row['copied_mib_s']:>13.0f} "
            f"{'-' if cpu is None else f'{cpu:.2f}':>17}"
        )


if __name__ == "__main__":
    main()
