"""CPU per MiB of the data path alone under 8 checkpoint writers, A/B between trees.

    .venv/bin/python bench/datapath_cpu.py --trees /work/main . --pairs 3 --mib 16

Each tree runs in a child process of its own (its engine, its compiled modules): 10 zone-file
drives of 1.5 GiB in a temporary folder under /var/tmp, the default policies, then 8 threads
each writing ``--mib`` MiB the way nfs-rs does (1,044,480 bytes, then 4,096, then a commit, per
MiB) through the Namespace, twice after a warm-up. Per run it prints the process's CPU per MiB
(user and system), the encode step's thread CPU per MiB (``Dispatcher.stats["encode_cpu_s"]``),
the compiled drive writers' fdatasyncs per append (0 with the Python writers) and MB/s; trees
alternate, the order flipping every round. ``--encode`` instead times ``Policy.encode_stripe``
of one stripe in a loop (CPU per MiB), in each tree.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = """
import json, os, resource, shutil, sys, tempfile, threading, time
sys.path[:0] = [{tree!r}, {tree!r} + "/tests/datapath"]
from dphelpers import Engine
from engine.catalog.database import Catalog
from engine.catalog.migrate import upgrade
from engine.namespace import ROOT

MiB, SPLIT = 1 << 20, 1_044_480
tmp = tempfile.mkdtemp(dir="/var/tmp", prefix="datapath-cpu-")
try:
    url = f"sqlite:///{{tmp}}/catalog.db"
    upgrade(url)
    engine = Engine(Catalog(url), tmp + "/drives", drive_size=1536 * MiB, zone_size=64 * MiB,
                    policies={{}})
    ns, data = engine.ns, os.urandom(MiB)
    inos = [ns.create(ROOT, ns.root_ino, f"f{{i}}").ino for i in range(8)]

    def writer(ino, first, count):
        for i in range(first, first + count):
            ns.write(ino, i * MiB, data[:SPLIT])
            ns.write(ino, i * MiB + SPLIT, data[SPLIT:])
            ns.commit(ino)

    def run(first, count):
        stats = engine.data.dispatcher.stats
        threads = [threading.Thread(target=writer, args=(ino, first, count)) for ino in inos]
        e0, r0 = stats["encode_cpu_s"], resource.getrusage(resource.RUSAGE_SELF)
        c0 = engine.data.writers.counters()
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        c1 = engine.data.writers.counters()
        mib = 8 * count
        appends = c1.get("appends", 0) - c0.get("appends", 0)
        return {{
            # the compiled drive writers' fdatasyncs per append (0 with the Python writers)
            "syncs_per_append": (c1.get("syncs", 0) - c0.get("syncs", 0)) / max(appends, 1),
            "MBps": mib * MiB / (t1 - t0) / 1e6,
            "cpu_ms": 1000 * (r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime) / mib,
            "user_ms": 1000 * (r1.ru_utime - r0.ru_utime) / mib,
            "sys_ms": 1000 * (r1.ru_stime - r0.ru_stime) / mib,
            "encode_ms": 1000 * (stats["encode_cpu_s"] - e0) / mib,
        }}

    run(0, 4)
    print(json.dumps([run(4 + k * {mib}, {mib}) for k in range(2)]))
    engine.close()
finally:
    shutil.rmtree(tmp, ignore_errors=True)
"""

ENCODE = """
import json, os, resource, sys
sys.path.insert(0, {tree!r})
from engine.coding.erasure import load_policies
policy = load_policies()["warm"]
out = {{}}
for length in (1 << 20, policy.stripe_size):
    data = bytearray(os.urandom(length))
    policy.encode_stripe(data).release()  # the slice encoder learns this length's headers
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(200):
        policy.encode_stripe(data).release()
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
    out[f"{{length >> 20}} MiB stripe"] = 1000 * cpu / 200 / (length / (1 << 20))
print(json.dumps({{"encoder": type(policy._native).__name__, "cpu_ms_per_MiB": out}}))
"""


def child(tree: str, code: str) -> object:
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tree, capture_output=True, text=True, timeout=900
    )
    if proc.returncode != 0:
        raise SystemExit(f"{tree}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trees", nargs="+", default=[str(Path(__file__).resolve().parent.parent)])
    ap.add_argument("--pairs", type=int, default=2, help="rounds (each tree once per round)")
    ap.add_argument("--mib", type=int, default=16, help="MiB per writer and run")
    ap.add_argument("--encode", action="store_true", help="time encode_stripe alone")
    args = ap.parse_args(argv)
    trees = [str(Path(t).resolve()) for t in args.trees]
    if args.encode:
        for tree in trees:
            print(tree, json.dumps(child(tree, ENCODE.format(tree=tree))), flush=True)
        return 0
    runs: dict[str, list[dict]] = {t: [] for t in trees}
    for round_ in range(args.pairs):
        for tree in trees if round_ % 2 == 0 else trees[::-1]:
            for run in child(tree, CHILD.format(tree=tree, mib=args.mib)):
                runs[tree].append(run)
                print(f"{tree}: " + ", ".join(f"{k} {v:.3f}" for k, v in run.items()), flush=True)
    for tree, got in runs.items():
        med = {k: statistics.median(r[k] for r in got) for k in got[0]}
        print(f"median {tree}: " + ", ".join(f"{k} {v:.3f}" for k, v in med.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
