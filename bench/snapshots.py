"""Benchmark of versioned datasets (engine only, no NFS), for docs/snapshots.md.

a. Snapshot create and delete of a dataset of N files (100,000 by default) in 100 folders, each
   file 4 KiB in an inline stripe of its own (the rows durable 4 KiB writes leave; a snapshot
   copies rows and never reads data, so bytes per file do not matter, rows do).
b. Live create, stat (getattr from the catalog: the cache is cleared first), rename, 4 KiB
   durable write and listing rates in another folder of the same catalog, before any snapshot
   and with --held snapshots (10) of the big dataset held, and again after they are deleted and
   reclaimed, with this process's CPU per operation beside each rate (``cpu_us``: a shared
   machine's load moves it far less than the wall rates); each snapshot's create and delete
   time and this process's CPU time, then the reclaim of what the deletes left to the
   background.
   The same kinds of change on old files inside the dataset (``dataset_rates``): the first
   change of each file after the snapshots, where any lazily copied version pays its copy (the
   live folder above lies outside /ds, so a design that copies on change pays nothing there).
   Then --clones (3) writable dataset clones of the first snapshot (`shingle dataset clone`),
   each timed, before the deletes.
c. CLONE of a large file written in 1 MiB commits (one extent per MiB): the time per extent,
   and the stripes written (none); then CLONE of a file of --clone-extents 1 MiB extents
   (10,240: a 10 GiB file), built as rows copied from the written file's stripes and fragments
   (every stripe fully referenced, as a 1 MiB commit leaves it), into a new file and again over
   that clone (which first frees the range it replaces).

    .venv/bin/python bench/snapshots.py [--files N[,N...]] [--held H] [--clones C] [--clone-mib M]
        [--clone-extents E] [--no-clone] [--postgres] [--json]

With several --files sizes each runs in a catalog of its own and the output ends with the
ratios of the largest to the smallest (create, delete and dataset clone time and CPU, medians)
and of each live rate, and each live operation's CPU, with snapshots held to none.

--postgres runs on a throwaway PostgreSQL server (tests/pgserver.py) instead of SQLite.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import crc32c

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from engine.catalog import Catalog, upgrade  # noqa: E402
from engine.catalog.database import sql, sql_many  # noqa: E402
from engine.coding.erasure import load_policies  # noqa: E402
from engine.datapath import DataPath  # noqa: E402
from engine.drives import format_emulated  # noqa: E402
from engine.namespace import ROOT, Namespace, lazyviews  # noqa: E402
from engine.snapshots.service import Snapshots  # noqa: E402

MiB = 1 << 20
FOLDERS = 100
LIVE_FILES = 1000


def build_dataset(ns: Namespace, catalog: Catalog, files: int) -> int:
    """/ds with ``files`` files of 4 KiB in FOLDERS folders, each file one extent of its own
    inline stripe: the rows a durable 4 KiB write of each would leave (written as rows here, a
    write each would take minutes)."""
    ds = ns.mkdir(ROOT, ns.root_ino, "ds").ino
    block = b"s" * 4096
    checksum = crc32c.crc32c(block)
    per_folder = files // FOLDERS
    now = time.time_ns()
    for f in range(FOLDERS):
        folder = ns.mkdir(ROOT, ds, f"d{f:03d}").ino

        def work(conn, folder=folder):
            rows = []
            for i in range(per_folder):
                ino = sql(
                    conn,
                    "INSERT INTO inodes (generation, type, mode, uid, gid, size, "
                    "nlink, rdev, atime_ns, mtime_ns, ctime_ns, btime_ns, change) "
                    "VALUES (1, 1, 420, 0, 0, 4096, 1, 0, ?, ?, ?, ?, 1) "
                    "RETURNING ino",
                    (now, now, now, now),
                ).fetchone()[0]
                stripe = sql(
                    conn,
                    "INSERT INTO stripes (band_class, layout, k, m, backend, "
                    "data_length, fragment_length, compression, live_bytes, "
                    "created_ns) VALUES ('hot', 'inline', 1, 0, NULL, 4096, 4096, "
                    "NULL, 4096, ?) RETURNING id",
                    (now,),
                ).fetchone()[0]
                rows.append((folder, f"f{i:05d}", ino, stripe))
            sql_many(
                conn,
                "INSERT INTO dirents (parent, name, child) VALUES (?, ?, ?)",
                [r[:3] for r in rows],
            )
            sql_many(
                conn,
                "INSERT INTO inline_data (stripe_id, length, checksum, data) "
                "VALUES (?, 4096, ?, ?)",
                [(r[3], checksum, block) for r in rows],
            )
            sql_many(
                conn,
                "INSERT INTO extents (ino, file_offset, length, stripe_id, "
                "stripe_offset) VALUES (?, 0, 4096, ?, 0)",
                [r[2:] for r in rows],
            )

        catalog.run(work)
    ns.invalidate()
    return ds


def build_big_file(ns: Namespace, catalog: Catalog, model: int, extents: int) -> int:
    """/huge: ``extents`` extents of 1 MiB, each its own stripe, copied as rows from the stripes
    and fragments of file ``model`` (zone counters are not updated: a clone never reads them)."""
    huge = ns.create(ROOT, ns.root_ino, "huge").ino

    def work(conn):
        models = sql(
            conn, "SELECT stripe_id FROM extents WHERE ino = ? AND length = ?", (model, MiB)
        ).fetchall()
        rows = []
        for i in range(extents):
            source = models[i % len(models)][0]
            stripe = sql(
                conn,
                "INSERT INTO stripes (band_class, layout, k, m, backend, data_length, "
                "fragment_length, compression, live_bytes, created_ns) SELECT band_class, "
                "layout, k, m, backend, data_length, fragment_length, compression, live_bytes, "
                "created_ns FROM stripes WHERE id = ? RETURNING id",
                (source,),
            ).fetchone()[0]
            sql(
                conn,
                "INSERT INTO fragments (stripe_id, idx, drive_id, zone_id, zone_offset, length, "
                "checksum) SELECT ?, idx, drive_id, zone_id, zone_offset, length, checksum "
                "FROM fragments WHERE stripe_id = ?",
                (stripe, source),
            )
            rows.append((huge, i * MiB, MiB, stripe, 0))
        sql_many(
            conn,
            "INSERT INTO extents (ino, file_offset, length, stripe_id, stripe_offset) "
            "VALUES (?, ?, ?, ?, ?)",
            rows,
        )
        sql(conn, "UPDATE inodes SET size = ? WHERE ino = ?", (extents * MiB, huge))

    catalog.run(work)
    ns.invalidate()
    return huge


def live_rates(ns: Namespace, label: str) -> dict:
    """Rates of the live operations a dataset's users run, in a folder of its own: create, stat
    (getattr from the catalog: the cache is cleared first), rename, 4 KiB durable write and
    listing (readdir of the folder's LIVE_FILES entries, the cache cleared first); and this
    process's CPU per operation (``cpu_us``), which a shared machine's load moves far less than
    the wall rates (on PostgreSQL it leaves out the server's part)."""
    folder = ns.mkdir(ROOT, ns.root_ino, f"live-{label}").ino
    rates: dict = {}
    cpu: dict = {}

    def phase(name: str, count: int, step) -> None:
        start, start_cpu = time.perf_counter(), time.process_time()
        step()
        rates[name] = count / (time.perf_counter() - start)
        cpu[name.removesuffix("_per_s")] = round((time.process_time() - start_cpu) / count * 1e6, 1)

    inos: list[int] = []
    phase(
        "create_per_s",
        LIVE_FILES,
        lambda: inos.extend(ns.create(ROOT, folder, f"f{i}").ino for i in range(LIVE_FILES)),
    )
    ns.invalidate()

    def stat() -> None:
        for ino in inos:
            ns.invalidate()
            ns.getattr(ino)

    phase("stat_per_s", LIVE_FILES, stat)

    def rename() -> None:
        for i in range(LIVE_FILES):
            ns.rename(ROOT, folder, f"f{i}", folder, f"r{i}")

    phase("rename_per_s", LIVE_FILES, rename)
    block = b"w" * 4096

    def write() -> None:
        for ino in inos[:300]:
            ns.write(ino, 0, block, stable=True)

    phase("write_4k_stable_per_s", 300, write)

    def listing() -> None:
        for _ in range(20):
            ns.invalidate()
            cookie, eof = 0, False
            while not eof:
                entries, eof = ns.readdir(ROOT, folder, cookie)
                cookie = entries[-1].cookie if entries else cookie

    phase("list_1000_per_s", 20, listing)
    out: dict = {k: round(v) for k, v in rates.items()}
    out["list_1000_per_s"] = round(rates["list_1000_per_s"], 1)
    out["cpu_us"] = cpu
    return out


DATASET_SAMPLE = 100  # old files of /ds changed per phase by dataset_rates


def dataset_rates(ns: Namespace, label: str, first_folder: int) -> dict:
    """The first change of old files inside /ds: stat (cache cleared), 4 KiB durable overwrite,
    rename, create beside them and listing of their folders, DATASET_SAMPLE files from folders
    ``d{first_folder:03d}`` on that no phase touched before (each call passes folders of its
    own), with this process's CPU per operation (``cpu_us``)."""
    files: list[tuple[int, str, int]] = []  # (folder, name, ino)
    folders: list[int] = []
    f = first_folder
    while len(files) < DATASET_SAMPLE and f < FOLDERS:
        folder = ns.resolve(f"/ds/d{f:03d}").ino
        folders.append(folder)
        cookie, eof = 0, False
        while not eof and len(files) < DATASET_SAMPLE:
            entries, eof = ns.readdir(ROOT, folder, cookie)
            files += [(folder, e.name, e.attr.ino) for e in entries if e.name not in (".", "..")]
            cookie = entries[-1].cookie if entries else cookie
        f += 1
    files = files[:DATASET_SAMPLE]
    ns.invalidate()
    rates: dict = {}
    cpu: dict = {}

    def phase(name: str, count: int, step) -> None:
        start, start_cpu = time.perf_counter(), time.process_time()
        step()
        rates[name] = count / (time.perf_counter() - start)
        cpu[name.removesuffix("_per_s")] = round((time.process_time() - start_cpu) / count * 1e6, 1)

    def stat() -> None:
        for _folder, _name, ino in files:
            ns.invalidate()
            ns.getattr(ino)

    phase("stat_per_s", len(files), stat)
    block = b"o" * 4096
    phase(
        "write_4k_stable_per_s",
        len(files),
        lambda: [ns.write(ino, 0, block, stable=True) for _f, _n, ino in files],
    )
    phase(
        "rename_per_s",
        len(files),
        lambda: [ns.rename(ROOT, fo, n, fo, f"{n}-{label}") for fo, n, _i in files],
    )
    phase(
        "create_per_s",
        len(files),
        lambda: [ns.create(ROOT, fo, f"new-{label}-{i}") for i, (fo, _n, _i) in enumerate(files)],
    )

    def listing() -> None:
        ns.invalidate()
        for folder in folders:
            cookie, eof = 0, False
            while not eof:
                entries, eof = ns.readdir(ROOT, folder, cookie)
                cookie = entries[-1].cookie if entries else cookie

    phase("list_folder_per_s", len(folders), listing)
    out: dict = {k: round(v, 1) for k, v in rates.items()}
    out["cpu_us"] = cpu
    out["folders"] = len(folders)
    return out


def dataset_folders() -> int:
    """Folders of /ds one dataset_rates call takes."""
    return max(1, -(-DATASET_SAMPLE // max(1, PER_FOLDER[0])))


PER_FOLDER = [1]  # files per folder of the current run's /ds (set by run_one)


def timed(step) -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds) of ``step()``: on a shared machine the wall
    time also holds other processes' turns."""
    start, start_cpu = time.perf_counter(), time.process_time()
    step()
    return time.perf_counter() - start, time.process_time() - start_cpu


def snapshot_steps(ns: Namespace, snaps: Snapshots, held: int, clones: int) -> dict:
    """Create ``held`` snapshots of /ds (each timed), the live rates with them held, ``clones``
    dataset clones of the first (each timed), then delete the snapshots (each timed)."""
    out: dict = {}
    create = [timed(lambda i=i: snaps.create("/ds", f"s{i}")) for i in range(held)]
    out["snapshot_create_s"] = [round(t, 4) for t, _ in create]
    out["snapshot_create_cpu_s"] = [round(c, 4) for _, c in create]
    out[f"live_with_{held}_snapshots"] = live_rates(ns, "after")
    out[f"dataset_with_{held}_snapshots"] = dataset_rates(ns, "after", dataset_folders())
    out["load_average"] = [round(x, 2) for x in os.getloadavg()]
    start = time.perf_counter()
    listed = snaps.list("/ds")
    out["list_s"] = round(time.perf_counter() - start, 3)
    out["referenced_bytes"] = listed[0].referenced_bytes
    start = time.perf_counter()
    snaps.diff("/ds", "s0")
    out["diff_vs_live_s"] = round(time.perf_counter() - start, 3)
    # writable clones of the first snapshot (`shingle dataset clone`), each a new tree of files
    clone = [timed(lambda i=i: snaps.clone("/ds", "s0", f"/clone{i}")) for i in range(clones)]
    out["dataset_clone_s"] = [round(t, 4) for t, _ in clone]
    out["dataset_clone_cpu_s"] = [round(c, 4) for _, c in clone]
    delete = [timed(lambda i=i: snaps.delete("/ds", f"s{i}")) for i in range(held)]
    out["snapshot_delete_s"] = [round(t, 4) for t, _ in delete]
    out["snapshot_delete_cpu_s"] = [round(c, 4) for _, c in delete]
    start = time.perf_counter()
    snaps.finish_deletions()  # what a delete left to the background, if anything
    out["reclaim_after_delete_s"] = round(time.perf_counter() - start, 3)
    # none held again: with the rates before, it brackets the run with snapshots held (the
    # machine's load changes during a run)
    out["live_after_delete"] = live_rates(ns, "none-again")
    out["dataset_after_delete"] = dataset_rates(ns, "none-again", 2 * dataset_folders())
    return out


def clone_steps(ns: Namespace, catalog: Catalog, args) -> dict:
    out: dict = {}
    big = ns.create(ROOT, ns.root_ino, "big").ino
    chunk = b"b" * MiB
    start = time.perf_counter()
    for i in range(args.clone_mib):
        ns.write(big, i * MiB, chunk, stable=True)
    out["big_write_MBps"] = round(args.clone_mib * MiB / 1e6 / (time.perf_counter() - start), 1)
    extents = catalog.read(
        lambda c: sql(c, "SELECT COUNT(*) FROM extents WHERE ino = ?", (big,)).fetchone()[0]
    )
    stripes_before = catalog.read(lambda c: sql(c, "SELECT COUNT(*) FROM stripes").fetchone()[0])
    target = ns.create(ROOT, ns.root_ino, "big-clone").ino
    start = time.perf_counter()
    ns.clone_range(ROOT, big, 0, target, 0, 0)
    clone_s = time.perf_counter() - start
    stripes_after = catalog.read(lambda c: sql(c, "SELECT COUNT(*) FROM stripes").fetchone()[0])
    out["clone"] = {
        "mib": args.clone_mib,
        "extents": extents,
        "seconds": round(clone_s, 4),
        "us_per_extent": round(clone_s / extents * 1e6, 1),
        "stripes_written": stripes_after - stripes_before,
        "extrapolated_10GiB_1MiB_extents_s": round(clone_s / extents * 10240, 3),
    }
    huge = build_big_file(ns, catalog, big, args.clone_extents)
    copy = ns.create(ROOT, ns.root_ino, "huge-clone").ino
    times = []
    for _ in range(2):  # into an empty file, then over that clone
        start = time.perf_counter()
        ns.clone_range(ROOT, huge, 0, copy, 0, 0)
        times.append(time.perf_counter() - start)
    stripes_end = catalog.read(lambda c: sql(c, "SELECT COUNT(*) FROM stripes").fetchone()[0])
    out["clone_rows"] = {
        "extents": args.clone_extents,
        "into_empty_s": round(times[0], 4),
        "over_clone_s": round(times[1], 4),
        "stripes_written": stripes_end - stripes_after - args.clone_extents,
    }
    return out


def run_one(args, files: int) -> dict:
    """One throwaway catalog (SQLite, or PostgreSQL with --postgres) with /ds of ``files``."""
    folder = Path(tempfile.mkdtemp(prefix="shingle-bench-snap-"))
    server = None
    try:
        url = f"sqlite:///{folder}/catalog.db"
        if args.postgres:
            from pgserver import PostgresServer

            server = PostgresServer().start()
            url = server.create_database()
        upgrade(url)
        catalog = Catalog(url)
        format_emulated(
            catalog, folder / "drives", 10, 4 * args.clone_mib * MiB // 10 + 512 * MiB, 64 * MiB
        )
        data = DataPath(catalog, load_policies({}), reserve_zones=1)
        ns = Namespace(catalog, data=data)
        snaps = Snapshots(ns)
        out: dict = {"files": files, "catalog": "postgresql" if args.postgres else "sqlite"}
        start = time.perf_counter()
        build_dataset(ns, catalog, files)
        out["build_s"] = round(time.perf_counter() - start, 2)
        PER_FOLDER[0] = files // FOLDERS
        out["live_before"] = live_rates(ns, "before")
        out["dataset_before"] = dataset_rates(ns, "before", 0)
        out.update(snapshot_steps(ns, snaps, args.held, args.clones))
        if not args.no_clone:
            out.update(clone_steps(ns, catalog, args))
        data.close()
        catalog.close()
        return out
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(folder, ignore_errors=True)


def median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def ratios(runs: list[dict]) -> dict:
    """Largest over smallest dataset: median create, delete and dataset clone time and CPU (the
    goal of constant-time versions is at most 2), and each live rate with snapshots held over
    none."""
    small, large = runs[0], runs[-1]
    out = {"files": [small["files"], large["files"]]}
    for key in (
        "snapshot_create_s",
        "snapshot_create_cpu_s",
        "snapshot_delete_s",
        "snapshot_delete_cpu_s",
        "dataset_clone_s",
        "dataset_clone_cpu_s",
    ):
        if large.get(key) and small.get(key):
            out[key] = round(median(large[key]) / max(median(small[key]), 1e-6), 1)
    held = next(k for k in large if k.startswith("live_with_"))
    rates = [k for k in large["live_before"] if k != "cpu_us"]
    out["live_held_over_none"] = {  # none: the mean of the runs before and after
        k: round(2 * large[held][k] / (large["live_before"][k] + large["live_after_delete"][k]), 2)
        for k in rates
    }
    none_cpu = [large["live_before"]["cpu_us"], large["live_after_delete"]["cpu_us"]]
    out["live_cpu_per_op_held_over_none"] = {  # the goal: within 10 % (0.9-1.1)
        k: round(2 * large[held]["cpu_us"][k] / max(none_cpu[0][k] + none_cpu[1][k], 1e-6), 2)
        for k in large[held]["cpu_us"]
    }
    held_ds = next((k for k in large if k.startswith("dataset_with_")), None)
    if held_ds is not None:  # old files inside /ds, first change after the snapshots
        ds_none = [large["dataset_before"]["cpu_us"], large["dataset_after_delete"]["cpu_us"]]
        out["dataset_cpu_per_op_held_over_none"] = {
            k: round(2 * large[held_ds]["cpu_us"][k] / max(ds_none[0][k] + ds_none[1][k], 1e-6), 2)
            for k in large[held_ds]["cpu_us"]
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--files",
        default="100000",
        help="files in the dataset; several, comma-separated, give the ratio",
    )
    parser.add_argument("--held", type=int, default=10, help="snapshots taken and held")
    parser.add_argument(
        "--clones", type=int, default=3, help="dataset clones of the first snapshot, each timed"
    )
    parser.add_argument("--clone-mib", type=int, default=512)
    parser.add_argument("--clone-extents", type=int, default=10_240)
    parser.add_argument("--no-clone", action="store_true", help="skip the CLONE part")
    parser.add_argument("--postgres", action="store_true")
    parser.add_argument(
        "--lazy",
        action="store_true",
        help="lazy snapshots (lazyviews.ENABLED, off on main): create writes the view's root, "
        "live changes copy up",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.lazy:
        lazyviews.ENABLED = True
    sizes = sorted(int(n) for n in args.files.split(","))
    runs = []
    for n in sizes:  # each run to stderr as it ends: a large size cut short keeps the others
        runs.append(run_one(args, n))
        print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    out = runs[0] if len(runs) == 1 else {"runs": runs, "ratio_largest_smallest": ratios(runs)}
    print(json.dumps(out, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
