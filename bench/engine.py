"""Benchmark of the data path alone (no NFS): the workloads of issue 3.

a. 8 concurrent writers, each a checkpoint shard in 1 MiB writes, then commit:
   user MB/s; from the SMR model (drive-managed, band = zone), per-drive
   write amplification and the share of appends landing at a band's write
   pointer; the share of write time spent in pyeclib.
b. 4 KiB random overwrites of one file, committed every 256 writes: media
   bytes on the SMR model for shingle vs an in-place baseline (the same
   writes sent to one drive-managed SMR drive holding the file).
c. Sequential read MB/s, healthy and with 2 of 10 drives failed; the zone
   files' pages are dropped from the page cache first (POSIX_FADV_DONTNEED
   on our own files only), so reads come from the disk.
References measured in the same run: plain sequential file write + fsync of
the same bytes on the same filesystem, and pyeclib encode speed on one core.

    .venv/bin/python bench/engine.py [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import update  # noqa: E402

from engine.catalog import Catalog, upgrade  # noqa: E402
from engine.catalog.models import Drive  # noqa: E402
from engine.coding.erasure import load_policies  # noqa: E402
from engine.datapath import DataPath  # noqa: E402
from engine.drives import SmrModel, format_emulated  # noqa: E402
from engine.namespace import ROOT, Namespace  # noqa: E402

MiB = 1 << 20
WRITERS = 8
DRIVES = 10


def sizes(quick: bool) -> dict:
    if quick:
        return {
            "shard": 48 * MiB,
            "zone": 64 * MiB,
            "drive": 512 * MiB,
            "random_file": 64 * MiB,
            "overwrites": 4096,
        }
    # 10 x 1 GiB drives (one zone kept for cleaning) hold the 4 GiB checkpoint, 5 GiB with parity
    return {
        "shard": 512 * MiB,
        "zone": 256 * MiB,
        "drive": 1024 * MiB,
        "random_file": 1024 * MiB,
        "overwrites": 32768,
    }


def drop_cache(root: Path) -> None:
    for path in root.rglob("zone-*"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def reference_disk_write(folder: Path, total: int) -> float:
    """MB/s of a plain sequential write + fsync of ``total`` bytes, 1 MiB at a time."""
    chunk = os.urandom(MiB)
    path = folder / "reference.bin"
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for _ in range(total // MiB):
            os.write(fd, chunk)
        os.fsync(fd)
    finally:
        os.close(fd)
    elapsed = time.perf_counter() - start
    os.unlink(path)
    return total / elapsed / 1e6


def reference_encode(policy) -> float:
    data = os.urandom(policy.stripe_size)
    policy.encode(data)
    start = time.perf_counter()
    n = 0
    while time.perf_counter() - start < 0.5:
        policy.encode(data)
        n += 1
    return n * len(data) / (time.perf_counter() - start) / 1e6


def checkpoint(ns: Namespace, data: DataPath, shard: int) -> tuple[list[int], float]:
    chunk = os.urandom(MiB)
    inos = [ns.create(ROOT, ns.root_ino, f"shard-{i}").ino for i in range(WRITERS)]
    barrier = threading.Barrier(WRITERS + 1)
    failures = []

    def writer(ino):
        barrier.wait()
        try:
            for off in range(0, shard, MiB):
                ns.write(ino, off, chunk)
            ns.commit(ino)
        except Exception as exc:  # noqa: BLE001 - reported below
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
    return inos, elapsed


def read_all(ns: Namespace, inos: list[int], size: int, readers: int = 4) -> float:
    """MB/s of sequential 1 MiB reads of every file, ``readers`` files at a time."""
    todo = list(inos)
    lock = threading.Lock()
    total = [0]

    def reader():
        while True:
            with lock:
                if not todo:
                    return
                ino = todo.pop()
            for off in range(0, size, MiB):
                got = ns.read(ino, off, MiB)
                with lock:
                    total[0] += len(got)

    start = time.perf_counter()
    threads = [threading.Thread(target=reader) for _ in range(readers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    if total[0] != size * len(inos):
        raise RuntimeError(f"read {total[0]} bytes, expected {size * len(inos)}")
    return total[0] / elapsed / 1e6


def random_overwrites(ns: Namespace, model: SmrModel, size: int, count: int, zone: int) -> dict:
    ino = ns.create(ROOT, ns.root_ino, "random.bin").ino
    chunk = os.urandom(MiB)
    for off in range(0, size, MiB):
        ns.write(ino, off, chunk)
    ns.commit(ino)
    model.reset()
    rng = random.Random(7)
    block = os.urandom(4096)
    baseline = SmrModel(band_size=model.params.band_size, drive_managed=True)
    baseline.prefill("in-place", 0, size)
    start = time.perf_counter()
    for i in range(count):
        off = rng.randrange(size // 4096) * 4096
        ns.write(ino, off, block)
        baseline.on_write("in-place", off, 4096)
        if i % 256 == 255:
            ns.commit(ino)
    ns.commit(ino)
    elapsed = time.perf_counter() - start
    ours, theirs = model.report(), baseline.report()
    return {
        "random_overwrite_media_bytes": ours["media_write_bytes"],
        "random_overwrite_baseline_media_bytes": theirs["media_write_bytes"],
        "random_overwrite_media_ratio": theirs["media_write_bytes"]
        / max(ours["media_write_bytes"], 1),
        "random_overwrite_band_rewrites": ours["band_rewrites"],
        "random_overwrite_iops": count / elapsed,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, under a minute")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--dir", default=None, help="where to put the drives (default: a temp folder in /var/tmp)"
    )
    args = parser.parse_args()
    s = sizes(args.quick)
    work = Path(tempfile.mkdtemp(prefix="shingle-bench-", dir=args.dir or "/var/tmp"))
    result: dict = {
        "quick": args.quick,
        "shard_bytes": s["shard"],
        "writers": WRITERS,
        "drives": DRIVES,
        "zone_bytes": s["zone"],
    }
    try:
        url = f"sqlite:///{work}/catalog.db"
        upgrade(url)
        catalog = Catalog(url)
        drives = work / "drives"
        # preallocating every zone is what an install does; on a crowded scratch
        # disk zones grow as written
        free = shutil.disk_usage(work).free
        preallocate = free > 3 * DRIVES * s["drive"]
        result["preallocated"] = preallocate
        ids = format_emulated(
            catalog, drives, DRIVES, s["drive"], s["zone"], preallocate=preallocate
        )
        policies = load_policies()
        model = SmrModel(band_size=s["zone"], drive_managed=True)
        data = DataPath(catalog, policies, smr_model=model, reserve_zones=1)
        ns = Namespace(catalog, data=data)

        cpu = time.process_time()
        inos, elapsed = checkpoint(ns, data, s["shard"])
        cpu = time.process_time() - cpu
        user = WRITERS * s["shard"]
        report = model.report()
        native = data.writers.counters()
        result.update(
            {
                "write_MBps": user / elapsed / 1e6,
                "write_seconds": elapsed,
                "write_amplification": report["max_drive_write_amplification"],
                "write_amplification_mean": report["write_amplification"],
                "erasure_overhead": report["host_write_bytes"] / user,
                "sequential_append_share": report["sequential_append_share"],
                "smr_predicted_busy_s": report["busy_s"],
                "pyeclib_cpu_seconds": data.stats["encode_cpu_s"],
                "process_cpu_seconds": cpu,
                # CPU time inside the erasure coder over all CPU time the process spent writing
                "pyeclib_share_of_write_time": data.stats["encode_cpu_s"] / cpu if cpu else 0.0,
                "commit_batches": data.stats["batches"],
                # the Python writers count in stats, the compiled ones in their own counters
                "fsyncs": data.stats["fsyncs"] + native.get("syncs", 0),
                "fsync_seconds_all_drives": data.stats["fsync_s"] + native.get("sync_s", 0.0),
            }
        )

        drop_cache(drives)
        data.reader.drop_cache()
        result["read_MBps"] = read_all(ns, inos, s["shard"])

        catalog.run(
            lambda c: c.execute(
                update(Drive.__table__)
                .where(Drive.__table__.c.id.in_(ids[2:4]))
                .values(state="failed")
            )
        )
        data.refresh_drive_states()
        drop_cache(drives)
        data.reader.drop_cache()
        result["degraded_read_MBps"] = read_all(ns, inos, s["shard"])
        result["degraded_stripes_decoded"] = data.reader.stats["degraded_stripes"]
        catalog.run(
            lambda c: c.execute(
                update(Drive.__table__)
                .where(Drive.__table__.c.id.in_(ids[2:4]))
                .values(state="online")
            )
        )
        data.refresh_drive_states()

        for i in range(WRITERS):
            ns.unlink(ROOT, ns.root_ino, f"shard-{i}")
        result.update(random_overwrites(ns, model, s["random_file"], s["overwrites"], s["zone"]))
        data.close()
        catalog.close()

        result["reference_disk_write_MBps"] = reference_disk_write(work, min(user, 1024 * MiB))
        result["reference_pyeclib_encode_MBps"] = reference_encode(policies["warm"])
        result["write_vs_disk_ratio"] = result["write_MBps"] / result["reference_disk_write_MBps"]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(
            json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in result.items()})
        )
    else:
        for key, value in result.items():
            print(f"{key:40s} {value:.4g}" if isinstance(value, float) else f"{key:40s} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
