"""CPU of one call the NFS event loop answers from the caches, A/B between trees.

    .venv/bin/python bench/loop_call.py /work/main-before /work/main --pairs 6

Each run (a child process, importing the server from its tree) starts the server in process on
a small catalog and 10 zone-file drives, writes and stats one file with nfs-rs, keeps the
stat's SEQUENCE+PUTFH+GETATTR record, and feeds it to the connection's record handler
(``RpcConnection._record``: dispatch, the COMPOUND from the caches, the reply written, here to
/dev/null) 4,000 times, 7 passes; it prints the median thread CPU per call of the passes. Runs
alternate between the trees, the order flipping every pair (on a shared machine single runs
swing 10-30 %). The last lines give each tree's median over the pairs. ``--child TREE`` runs one
measurement (what the driver starts).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CALLS = 4000
PASSES = 7


def child(tree: str) -> dict:
    sys.path[:0] = [f"{tree}/tests/nfs", f"{tree}/tests", tree]
    from nfs4_support import MiB, Stack, add_export, start_server

    from appliance.nfs.onc import rpc
    from appliance.nfs.v4 import program
    from bench import workloads

    caught: dict = {}
    original = program.Nfs4Program.call

    def call(self, conn, header, cred, record, pos):
        result = original(self, conn, header, cred, record, pos)
        if not isinstance(result, rpc.InWorker):
            caught.setdefault(len(record), (conn, bytes(record)))
        return result

    program.Nfs4Program.call = call  # type: ignore[method-assign]  # the record is kept
    tmp = Path(tempfile.mkdtemp(prefix="shingle-loop-call-", dir="/var/tmp"))
    stack = Stack(tmp, drive_size=64 * MiB, zone_size=4 * MiB, fragment_size=64 * 1024)
    add_export(stack.catalog)
    srv = start_server(stack)
    try:
        client = workloads.NfsRs(srv.port)
        client.write_small("/keep", b"x" * 4096)
        client.stat_size("/keep")
        caught.clear()
        client.stat_size("/keep")  # the path walk, then GETATTR alone: the shortest record
        conn, record = caught[min(caught)]
        conn.fd = os.open("/dev/null", os.O_WRONLY)  # replies go nowhere; the client is idle
        passes = []
        for _ in range(PASSES):
            started = time.thread_time()
            for _ in range(CALLS):
                conn._record(record)
            passes.append(1e6 * (time.thread_time() - started) / CALLS)
        client.close()
        return {"us_per_call": statistics.median(passes), "record_bytes": len(record)}
    finally:
        srv.stop()
        stack.close()
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trees", nargs="*")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--child")
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child)))
        return 0
    trees = args.trees or [str(Path(__file__).resolve().parent.parent)]
    got: dict[str, list[float]] = {tree: [] for tree in trees}
    for pair in range(args.pairs):
        for tree in trees if pair % 2 == 0 else trees[::-1]:
            out = subprocess.run(
                [sys.executable, __file__, "--child", tree],
                capture_output=True,
                text=True,
                timeout=600,
                check=True,
            )
            result = json.loads(out.stdout.strip().splitlines()[-1])
            got[tree].append(result["us_per_call"])
            load = os.getloadavg()[0]
            print(f"pair {pair} {tree}: {result['us_per_call']:.1f} us/call (load {load:.1f})")
    for tree, values in got.items():
        print(f"{tree}: median {statistics.median(values):.1f} us/call over {len(values)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
