"""The namespace's hot path, old tree against new: CPU per operation on the SQLite catalog.

    .venv/bin/python bench/namespace_hot.py --old REV [--new REV] [--rounds N] [--json]

Each of the two commits is exported (``git archive``) to a temporary folder, and one child
process per run imports the engine from there; the runs alternate, A B A B ..., so a change of
the machine's load falls on both alike. A run builds a fresh catalog, 10 zone-file drives and a
DataPath, then measures through the public Namespace API, in one thread:

- ``create``: a file in a directory (one write transaction);
- ``lookup``, ``getattr``: of existing names and inodes, from the warm cache (the NFS event
  loop's path: no catalog); ``lookup_cold``: the cache emptied first, so a catalog read;
- ``readdir``: a whole listing of the directory, per entry;
- ``small_file``: create, write 4 KiB, commit (the bytes go inline in the catalog).

The figure is the CPU time per operation of the thread that calls the namespace
(``time.thread_time``; the cached reads and readdir: the least of 7 passes), the median over
the rounds; the ratio is new / old (below 1: the new tree is faster). Process CPU (every thread,
the data path's included: what a small file costs in all) and wall time per operation are
reported too; on a shared machine wall time is the noisiest. ``--child TREE`` runs one
measurement (what the driver starts).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OPS = ("create", "lookup", "getattr", "lookup_cold", "readdir", "small_file")
KiB, MiB = 1 << 10, 1 << 20


def measure(tree: Path, files: int, small_files: int) -> dict:
    """One run in this process, with the engine imported from ``tree``."""
    sys.path.insert(0, str(tree))
    import engine
    from engine.catalog import Catalog, upgrade
    from engine.coding.erasure import load_policies
    from engine.datapath import DataPath
    from engine.drives import format_emulated
    from engine.namespace import ROOT, Namespace

    assert Path(engine.__file__).resolve().is_relative_to(tree.resolve()), engine.__file__
    small = {name: {"fragment_size": 64 * KiB} for name in ("warm", "cold", "hot")}
    results: dict[str, dict[str, float]] = {}

    def timed(name: str, count: int, fn, repeat: int = 1) -> None:
        """Per operation: the least of ``repeat`` runs of ``fn`` (``count`` operations each)."""
        best = {"thread_us": float("inf"), "cpu_us": float("inf"), "wall_us": float("inf")}
        for _ in range(repeat):
            mine, cpu, wall = time.thread_time(), time.process_time(), time.perf_counter()
            fn()
            took = {
                "thread_us": time.thread_time() - mine,
                "cpu_us": time.process_time() - cpu,
                "wall_us": time.perf_counter() - wall,
            }
            best = {key: min(best[key], took[key] / count * 1e6) for key in best}
        results[name] = best

    with tempfile.TemporaryDirectory(prefix="namespace-hot-") as scratch:
        work = Path(scratch)
        url = f"sqlite:///{work}/catalog.db"
        upgrade(url)
        catalog = Catalog(url)
        format_emulated(catalog, work / "drives", 10, 32 * MiB, MiB)
        data = DataPath(catalog, load_policies(small), reserve_zones=2)
        try:
            ns = Namespace(catalog, data=data)
            top = ns.mkdir(ROOT, ns.root_ino, "d").ino
            names = [f"file-{i:06d}" for i in range(files)]
            inos: list[int] = []
            timed("create", files, lambda: inos.extend(ns.create(ROOT, top, n).ino for n in names))
            for name in names:  # warm the cache
                ns.lookup(ROOT, top, name)
            passes = 7

            def lookups():
                for name in names:
                    ns.lookup(ROOT, top, name)

            def getattrs():
                for ino in inos:
                    ns.getattr(ino)

            def cold_lookups():
                for name in names:
                    ns.invalidate()
                    ns.lookup(ROOT, top, name)

            def listing():
                cookie, done = 0, False
                while not done:
                    entries, done = ns.readdir(ROOT, top, cookie)
                    cookie = entries[-1].cookie if entries else cookie

            def small_writes():
                block = os.urandom(4 * KiB)
                for i in range(small_files):
                    ino = ns.create(ROOT, top, f"small-{i:06d}").ino
                    ns.write(ino, 0, block)
                    ns.commit(ino)

            timed("lookup", files, lookups, passes)
            timed("getattr", files, getattrs, passes)
            timed("lookup_cold", files, cold_lookups)
            timed("readdir", files, listing, passes)
            timed("small_file", small_files, small_writes)
        finally:
            data.close()
            catalog.close()
    return results


def export(rev: str, folder: Path) -> str:
    """The tree of ``rev`` under ``folder``; returns the commit id."""
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", rev], capture_output=True, text=True, check=True
    ).stdout.strip()
    folder.mkdir(parents=True)
    archive = subprocess.Popen(["git", "-C", str(REPO), "archive", commit], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(folder)], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise SystemExit(f"git archive {rev} failed")
    return commit


def run_child(tree: Path, files: int, small_files: int) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(tree), "--files", str(files)]
        + ["--small-files", str(small_files)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(tree)},
    )
    if out.returncode != 0:
        raise SystemExit(f"run on {tree} failed:\n{out.stderr}")
    return json.loads(out.stdout)


def compare(old_rev: str, new_rev: str, rounds: int, files: int, small_files: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="namespace-hot-trees-") as scratch:
        trees = {"old": Path(scratch) / "old", "new": Path(scratch) / "new"}
        commits = {"old": export(old_rev, trees["old"]), "new": export(new_rev, trees["new"])}
        runs: dict[str, list[dict]] = {"old": [], "new": []}
        for _ in range(rounds):
            for side in ("old", "new"):  # A B A B: load changes fall on both alike
                runs[side].append(run_child(trees[side], files, small_files))
    report: dict = {"commits": commits, "rounds": rounds, "files": files, "ops": {}}
    for op in OPS:
        row = {}
        for unit in ("thread_us", "cpu_us", "wall_us"):
            for side in ("old", "new"):
                row[f"{side}_{unit}"] = statistics.median(run[op][unit] for run in runs[side])
                row[f"{side}_{unit}_runs"] = [round(run[op][unit], 3) for run in runs[side]]
            row[f"{unit[:-3]}_ratio"] = row[f"new_{unit}"] / row[f"old_{unit}"]
        report["ops"][op] = row
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--old", help="the commit to compare against (required)")
    parser.add_argument("--new", default="HEAD")
    parser.add_argument("--rounds", type=int, default=4, help="runs of each side, alternated")
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--small-files", type=int, default=300)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(measure(args.child, args.files, args.small_files)))
        return
    if args.old is None:
        parser.error("--old REV is required: the commit to compare against")
    report = compare(args.old, args.new, args.rounds, args.files, args.small_files)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"old {report['commits']['old'][:10]}  new {report['commits']['new'][:10]}")
    print(f"{report['rounds']} rounds each, alternated; {report['files']} files; median per op")
    print(f"{'op':<12} {'old us':>8} {'new us':>8} {'ratio':>6} {'process':>8} {'wall':>6}")
    for op, row in report["ops"].items():
        print(
            f"{op:<12} {row['old_thread_us']:>8.2f} {row['new_thread_us']:>8.2f} "
            f"{row['thread_ratio']:>6.3f} {row['cpu_ratio']:>8.3f} {row['wall_ratio']:>6.3f}"
        )


if __name__ == "__main__":
    main()
