"""NFSv4.1 server benchmark: the issue's workloads through real clients.

    .venv/bin/python bench/nfs.py [--mode full|quick|smoke] [--clients nfsrs,nfs4fs] [--dir DIR]
                                  [--catalog sqlite|postgres|URL] [--workloads small_files,...]

Starts shingle's NFS server in this process on a fresh catalog and ten
emulated zone-file drives (8+2 erasure coding, 1 MiB fragments), then runs
each workload of bench/workloads.py in a child process per client:
sequential write and read (cold: first read; warm: the second) in 1 MiB
I/O, small files created/stat'ed/removed, 4 KiB random writes. The
reference in the same run is the namespace API driven in-process (the same
data path without NFS): ``*_vs_namespace`` ratios say what the protocol
layer costs. Prints one JSON summary on the last line; bench/compare.py
compares shingle with NFS-Ganesha on the same workloads.

``--catalog postgres`` puts the catalog on a throw-away PostgreSQL 15 (tests/pgserver.py),
``--catalog URL`` on that database (upgraded to head first); SQLite in the work folder by
default. ``--workloads`` runs only those steps (seq_write, seq_read, seq_cleanup, small_files,
random_write; seq_read needs seq_write).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from appliance.nfs.server import NfsServerThread  # noqa: E402
from bench.workloads import SIZES  # noqa: E402
from engine.catalog import Catalog, upgrade  # noqa: E402
from engine.catalog.models import Export  # noqa: E402
from engine.coding.erasure import policy_from_dict  # noqa: E402
from engine.datapath import DataPath  # noqa: E402
from engine.drives import format_emulated  # noqa: E402
from engine.namespace import ROOT, Namespace  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30


def build(workdir: Path, seq_bytes: int, url: str | None = None):
    url = url or f"sqlite:///{workdir}/catalog.db"
    upgrade(url)
    catalog = Catalog(url)
    # room for two clients' sequential files (8+2: 1.25x over ten drives), the reference
    # file and the garbage random writes leave (no cleaning runs during the bench)
    zone = 64 * MiB if seq_bytes >= GiB else 16 * MiB
    need = seq_bytes * 2 * 10 // 8 // 10 + seq_bytes // 8 + 256 * MiB
    drive_size = -(-need // zone) * zone
    format_emulated(catalog, workdir / "drives", 10, drive_size, zone)
    catalog.run(
        lambda conn: conn.execute(
            Export.__table__.insert().values(
                name="/export",
                path="/",
                clients="127.0.0.1/32",
                access="rw",
                squash="no_root_squash",
                anon_uid=65534,
                anon_gid=65534,
                trash_days=7,
                enabled=True,
            )
        )
    )
    data = DataPath(catalog, {"warm": policy_from_dict("warm", {})}, reserve_zones=2)
    return catalog, data, Namespace(catalog, data)


def namespace_reference(ns: Namespace, nbytes: int) -> dict:
    """Sequential write (durable every 8 MiB) and read in 1 MiB through the namespace API."""
    f = ns.create(ROOT, ns.root_ino, "reference.bin")
    block = os.urandom(MiB)
    t = time.perf_counter()
    for i in range(nbytes // MiB):
        ns.write(f.ino, i * MiB, block)
        if i % 8 == 7:
            ns.commit(f.ino)
    ns.commit(f.ino)
    w = time.perf_counter() - t
    t = time.perf_counter()
    for i in range(nbytes // MiB):
        ns.read(f.ino, i * MiB, MiB)
    r = time.perf_counter() - t
    # kept, not unlinked: freeing its stripes before the NFS runs would exercise stripe-id
    # reuse in the data path (reported separately), which is not what this bench measures
    return {
        "seq_write_MBps": round(nbytes / w / 1e6, 1),
        "seq_read_MBps": round(nbytes / r / 1e6, 1),
    }


def workload(client: str, port: int, name: str, params: dict, timeout: float = 1800) -> dict:
    cmd = [
        sys.executable,
        str(REPO / "bench" / "workloads.py"),
        "--client",
        client,
        "--port",
        str(port),
        "--workload",
        name,
        "--params",
        json.dumps(params),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        return {"ok": False, "error": (proc.stderr or "no output")[-500:]}
    return json.loads(lines[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=sorted(SIZES), default="full")
    ap.add_argument("--clients", default="nfsrs,nfs4fs")
    ap.add_argument("--dir", default=None, help="work directory (default: a temp dir on /var/tmp)")
    ap.add_argument("--catalog", default="sqlite", help="sqlite, postgres or a database URL")
    ap.add_argument("--workloads", default=None, help="comma-separated steps (default: all)")
    args = ap.parse_args(argv)
    params = dict(SIZES[args.mode])
    workdir = Path(args.dir or tempfile.mkdtemp(prefix="shingle-bench-nfs-", dir="/var/tmp"))
    workdir.mkdir(parents=True, exist_ok=True)
    pg_server = None
    url = None if args.catalog == "sqlite" else args.catalog
    if args.catalog == "postgres":
        sys.path.insert(0, str(REPO / "tests"))
        from pgserver import PostgresServer

        pg_server = PostgresServer().start()
        url = pg_server.create_database()
    catalog, data, ns = build(workdir, params["seq_bytes"], url)
    only = set(args.workloads.split(",")) if args.workloads else None
    summary: dict = {
        "mode": args.mode,
        "catalog": args.catalog.split("://")[0],
        "params": params,
        "clients": {},
        "errors": [],
    }
    summary["namespace_reference"] = (
        namespace_reference(ns, min(params["seq_bytes"], 512 * MiB))
        if only is None or "seq_write" in only or "seq_read" in only
        else {}
    )
    server = NfsServerThread(ns, catalog, port=0).start()
    try:
        for client in args.clients.split(","):
            figures: dict = {}
            steps = [
                ("seq_write", {}),
                ("seq_read", {"seq_read_MBps": "seq_read_cold_MBps"}),
                ("seq_read", {"seq_read_MBps": "seq_read_warm_MBps"}),
                ("seq_cleanup", {}),
                ("small_files", {}),
                ("random_write", {}),
            ]
            for name, rename in steps:
                if only is not None and name not in only:
                    continue
                out = workload(client, server.port, name, params)
                if not out.get("ok"):
                    summary["errors"].append(
                        {"client": client, "workload": name, "error": out.get("error")}
                    )
                    continue
                for key, value in out["metrics"].items():
                    figures[rename.get(key, key)] = value
                print(f"{client} {name}: {out['metrics']}", file=sys.stderr, flush=True)
            ref = summary["namespace_reference"]
            for key, ref_key in (
                ("seq_write_MBps", "seq_write_MBps"),
                ("seq_read_cold_MBps", "seq_read_MBps"),
            ):
                if key in figures and ref.get(ref_key):
                    figures[f"{key}_vs_namespace"] = round(figures[key] / ref[ref_key], 3)
            summary["clients"][client] = figures
    finally:
        for step in (server.stop, data.close, catalog.close):
            try:
                step()
            except Exception as exc:  # noqa: BLE001 - the figures are printed whatever teardown does
                summary["errors"].append({"teardown": step.__qualname__, "error": repr(exc)[:300]})
        if pg_server is not None:
            pg_server.stop()
        if not args.dir:
            shutil.rmtree(workdir, ignore_errors=True)
        print(json.dumps(summary), flush=True)
    return 0 if not summary["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
