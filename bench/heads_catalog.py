"""Several heads on one host over one SQLite catalog: does the embedded default serve them?

    .venv/bin/python bench/heads_catalog.py [--heads 1,2,4] [--rounds 3] [--cycles 200]
        [--smoke] [--json FILE]

The work of a head's metadata hot path, run by N workers at once in four layouts, all in the
same run, alternated (the order reversed every round) so a change of the machine's load falls
on all alike:

- ``1 process``: one worker, the baseline (N = 1);
- ``N shared``: N processes, each its own Catalog and Namespace over ONE SQLite catalog file
  (WAL, as the embedded default configures it): what ``shingle serve --heads N`` would be;
- ``N queued``: the same, with the processes' writers queued on an flock of a file beside the
  catalog (held from before BEGIN IMMEDIATE to after COMMIT): a writer waiting for another
  process sleeps in the kernel until it is let go, as the Catalog's writer queue does for
  threads, instead of polling in SQLite's busy handler (1, 2, 5 ... 100 ms sleeps);
- ``N separate``: N processes, each on its own catalog file: the same processes with nothing
  shared, the upper bound;
- ``N threads``: one process, N threads over one Catalog and one Namespace: today's server.

A worker makes its own directory of ``--files`` files, waits for the others (a barrier), then
runs ``--cycles`` cycles of: a small file (create, write 4 KiB, commit: one inline stripe, so
the drives are not written) and ``--reads`` lookups and as many getattrs of its own files,
picked at random. Each operation is timed (p50, p99); the layout's operations per second are
all workers' operations over the wall time from the barrier to the last one done; CPU per
operation is every worker process's CPU (time.process_time: every thread, the data path's too)
over the operations. The Catalog keeps no counters of its own, so the bench counts, on each
worker's engine: write transactions whose BEGIN IMMEDIATE took 1 ms or more (SQLite's busy
handler sleeps at least 1 ms after an SQLITE_BUSY: another process held the write lock; the
writer queue inside a process is passed before BEGIN, so threads do not show here),
transient errors ``Catalog.run`` retried, and how often the namespace cache was emptied
because a commit it could not account for moved the epoch (another process's commit).

Then the cross-process visibility delay: process A creates a file, then renames it, in a
directory process B keeps looking up through its cached Namespace (B's lookups of the name
answer from a complete-directory cache between A's commits). The delay is from A's call
returning to B's lookup first seeing the change (both on CLOCK_MONOTONIC); negative: B saw the
commit before A's call had returned.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import multiprocessing as mp
import os
import queue
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from engine.catalog.database import AFTER_COMMIT  # noqa: E402

KiB, MiB = 1 << 10, 1 << 20
BUSY_WAIT_S = 0.001  # SQLite's busy handler sleeps 1 ms first: a BEGIN this slow met SQLITE_BUSY
WORKER_TIMEOUT_S = 900.0
OPS = ("small_file", "lookup", "getattr")
SIZES = {
    "full": {"files": 200, "cycles": 200, "reads": 8, "visibility": 200},
    "smoke": {"files": 20, "cycles": 10, "reads": 4, "visibility": 10},
}


# -- one catalog with its drives ---------------------------------------------------
def make_catalog(folder: Path) -> str:
    """A fresh catalog with 10 zone-file drives under ``folder``; returns its URL."""
    from engine.catalog import Catalog, upgrade
    from engine.drives import format_emulated

    folder.mkdir(parents=True)
    url = f"sqlite:///{folder}/catalog.db"
    upgrade(url)
    catalog = Catalog(url)
    try:
        format_emulated(catalog, folder / "drives", 10, 16 * MiB, MiB, preallocate=False)
    finally:
        catalog.close()
    return url


class Head:
    """One head's engine: a Catalog, a DataPath and a Namespace, with the bench's counters."""

    def __init__(self, url: str, queued: bool = False):
        from sqlalchemy import event

        from engine.catalog import Catalog
        from engine.coding.erasure import load_policies
        from engine.datapath import DataPath
        from engine.namespace import Namespace

        self.counts = {"busy_begins": 0, "busy_wait_s": 0.0, "retries": 0, "cache_clears": 0}
        self.catalog = Catalog(url)
        # "queued": every write transaction holds an flock of a file beside the catalog from
        # before BEGIN IMMEDIATE to after COMMIT, so a writer of another process sleeps in the
        # kernel until it is let go instead of polling in SQLite's busy handler
        self.queue_fd = None
        if queued:
            database = self.catalog.engine.url.database
            assert database is not None
            self.queue_fd = os.open(database + "-writers", os.O_RDWR | os.O_CREAT, 0o600)
        # the Catalog's begin listener (it runs BEGIN IMMEDIATE) swapped for one that times it
        event.remove(self.catalog.engine, "begin", Catalog._sqlite_begin)
        event.listen(self.catalog.engine, "begin", self._timed_begin)
        event.listen(self.catalog.engine, "rollback", self._rolled_back)
        transient = self.catalog._transient

        def counted_transient(exc: Exception) -> bool:
            retried = transient(exc)
            self.counts["retries"] += retried
            return retried

        self.catalog._transient = counted_transient  # type: ignore[method-assign]
        small = {name: {"fragment_size": 64 * KiB} for name in ("warm", "cold", "hot")}
        self.data = DataPath(self.catalog, load_policies(small), reserve_zones=2)
        self.ns = Namespace(self.catalog, data=self.data)
        cache = self.ns.cache
        clear = cache.clear

        def counted_clear(epoch):
            self.counts["cache_clears"] += 1
            clear(epoch)

        cache.clear = counted_clear  # type: ignore[method-assign]

    def _timed_begin(self, conn) -> None:
        from engine.catalog import Catalog

        started = time.perf_counter()
        if self.queue_fd is not None and conn.info.get("begin") == "BEGIN IMMEDIATE":
            fcntl.flock(self.queue_fd, fcntl.LOCK_EX)
            # let go after COMMIT (the Catalog's after-commit callbacks) or before a rollback
            info = conn.info
            info["bench.queued"] = True

            def committed() -> None:
                info.pop("bench.queued", None)
                self._let_writers_go()

            info[AFTER_COMMIT].append(committed)
        Catalog._sqlite_begin(conn)
        waited = time.perf_counter() - started
        if waited >= BUSY_WAIT_S and conn.info.get("begin") == "BEGIN IMMEDIATE":
            self.counts["busy_begins"] += 1
            self.counts["busy_wait_s"] += waited

    def _let_writers_go(self) -> None:
        fcntl.flock(self.queue_fd, fcntl.LOCK_UN)  # type: ignore[arg-type]

    def _rolled_back(self, conn) -> None:
        if conn.info.pop("bench.queued", False):
            self._let_writers_go()

    def close(self) -> None:
        self.data.close()
        self.catalog.close()
        if self.queue_fd is not None:
            os.close(self.queue_fd)


# -- the hot path ----------------------------------------------------------------
def prepare(ns, name: str, files: int) -> tuple[int, list[str]]:
    """A worker's directory of ``files`` empty files: (its inode, the names)."""
    from engine.namespace import ROOT

    top = ns.mkdir(ROOT, ns.root_ino, name).ino
    names = [f"f-{i:05d}" for i in range(files)]
    for file_name in names:
        ns.create(ROOT, top, file_name)
    return top, names


def hot_path(ns, top: int, names: list[str], cycles: int, reads: int, seed: int) -> dict:
    """``cycles`` cycles of a small file and ``reads`` lookups and getattrs; per-op latencies."""
    from engine.namespace import ROOT

    rng = random.Random(seed)
    block = os.urandom(4 * KiB)
    times: dict[str, list[float]] = {op: [] for op in OPS}
    clock = time.perf_counter
    for cycle in range(cycles):
        start = clock()
        ino = ns.create(ROOT, top, f"s-{seed}-{cycle:06d}").ino
        ns.write(ino, 0, block)
        ns.commit(ino)
        times["small_file"].append(clock() - start)
        for _ in range(reads):
            name = rng.choice(names)
            start = clock()
            attr = ns.lookup(ROOT, top, name)
            times["lookup"].append(clock() - start)
            start = clock()
            ns.getattr(attr.ino)
            times["getattr"].append(clock() - start)
    return times


def process_worker(url: str, index: int, sizes: dict, barrier, results, queued: bool) -> None:
    """One head process: prepare, wait for the others, run the hot path, report."""
    head = Head(url, queued)
    try:
        top, names = prepare(head.ns, f"w{index}", sizes["files"])
        for key in head.counts:
            head.counts[key] = 0
        barrier.wait(WORKER_TIMEOUT_S)
        cpu, started = time.process_time(), time.perf_counter()
        times = hot_path(head.ns, top, names, sizes["cycles"], sizes["reads"], index)
        ended = time.perf_counter()
        results.put(
            {
                "times": times,
                "cpu_s": time.process_time() - cpu,
                "started": started,
                "ended": ended,
                "counts": dict(head.counts),
            }
        )
    finally:
        head.close()


def threads_worker(url: str, threads: int, sizes: dict, barrier, results) -> None:
    """One process, ``threads`` threads over one Namespace: today's server."""
    head = Head(url)
    try:
        prepared = [prepare(head.ns, f"w{i}", sizes["files"]) for i in range(threads)]
        for key in head.counts:
            head.counts[key] = 0
        outs: list[dict] = [{} for _ in range(threads)]
        start_line = threading.Barrier(threads + 1)

        def run(i: int) -> None:
            start_line.wait()
            top, names = prepared[i]
            outs[i] = hot_path(head.ns, top, names, sizes["cycles"], sizes["reads"], i)

        pool = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
        for thread in pool:
            thread.start()
        barrier.wait(WORKER_TIMEOUT_S)
        cpu, started = time.process_time(), time.perf_counter()
        start_line.wait()
        for thread in pool:
            thread.join()
        ended = time.perf_counter()
        times = {op: [t for out in outs for t in out[op]] for op in OPS}
        results.put(
            {
                "times": times,
                "cpu_s": time.process_time() - cpu,
                "started": started,
                "ended": ended,
                "counts": dict(head.counts),
            }
        )
    finally:
        head.close()


def run_layout(layout: str, heads: int, sizes: dict, scratch: Path) -> dict:
    """One run of ``layout`` ("process", "shared", "queued", "separate", "threads")."""
    ctx = mp.get_context("spawn")  # a fresh interpreter each: no catalog handed through a fork
    folder = Path(tempfile.mkdtemp(prefix=f"{layout}-{heads}-", dir=scratch))
    if layout == "separate":  # the others share one
        urls = [make_catalog(folder / f"c{i}") for i in range(heads)]
    else:
        urls = [make_catalog(folder / "c")] * heads
    barrier = ctx.Barrier(1 if layout == "threads" else heads)
    results = ctx.Queue()
    if layout == "threads":
        procs = [ctx.Process(target=threads_worker, args=(urls[0], heads, sizes, barrier, results))]
    else:
        procs = [
            ctx.Process(
                target=process_worker,
                args=(urls[i], i, sizes, barrier, results, layout == "queued"),
            )
            for i in range(heads)
        ]
    return summarize(gather(procs, [results] * len(procs), f"{layout} x{heads}"))


def gather(procs: list, queues: list, what: str) -> list[dict]:
    """Start ``procs`` and take one result from each of ``queues``; a worker that dies fails the
    run at once (the others are killed) instead of leaving the rest waiting at the barrier."""
    for proc in procs:
        proc.start()
    outs: list[dict] = []
    deadline = time.monotonic() + WORKER_TIMEOUT_S
    try:
        for source in queues:
            while True:
                try:
                    outs.append(source.get(timeout=0.5))
                    break
                except queue.Empty:
                    dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                    if dead or time.monotonic() > deadline:
                        raise RuntimeError(
                            f"{what}: a worker exited with {dead[0]}"
                            if dead
                            else f"{what}: timed out"
                        ) from None
        for proc in procs:
            proc.join(timeout=60)
            if proc.exitcode != 0:
                raise RuntimeError(f"{what}: a worker exited with {proc.exitcode}")
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join()
    return outs


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def summarize(outs: list[dict]) -> dict:
    """All workers of one run: ops/s, per-op p50/p99 (us), CPU per op (us), the counters."""
    wall = max(o["ended"] for o in outs) - min(o["started"] for o in outs)
    ops = sum(len(o["times"][op]) for o in outs for op in OPS)
    cpu = sum(o["cpu_s"] for o in outs)
    latency = {}
    for op in OPS:
        values = [t for o in outs for t in o["times"][op]]
        latency[op] = {
            "p50_us": percentile(values, 0.5) * 1e6,
            "p99_us": percentile(values, 0.99) * 1e6,
        }
    counts = {key: sum(o["counts"][key] for o in outs) for key in outs[0]["counts"]}
    small_files = sum(len(o["times"]["small_file"]) for o in outs)
    return {
        "ops_per_s": ops / wall,
        "small_files_per_s": small_files / wall,
        "cpu_us_per_op": cpu / ops * 1e6,
        "cpu_per_wall": cpu / wall,
        "latency": latency,
        "counts": counts,
        "wall_s": wall,
    }


# -- cross-process visibility ---------------------------------------------------
def visibility_writer(url: str, rounds: int, ready, turn, done, results) -> None:
    """Process A: create then rename a file per round, once B is watching; the times its calls
    returned."""
    from engine.namespace import ROOT

    head = Head(url)
    try:
        ready.wait(WORKER_TIMEOUT_S)  # B made the directory
        top = _wait_for_directory(head.ns, "vis")
        made, moved = [], []
        for i in range(rounds):
            turn.wait()  # B is polling for v-i
            turn.clear()
            head.ns.create(ROOT, top, f"v-{i}")
            made.append(time.perf_counter())
            done.wait()  # B saw it and polls for the rename now
            done.clear()
            head.ns.rename(ROOT, top, f"v-{i}", top, f"r-{i}")
            moved.append(time.perf_counter())
            done.wait()
            done.clear()
        results.put({"made": made, "moved": moved})
    finally:
        head.close()


def _wait_for_directory(ns, name: str) -> int:
    """The inode of ``name`` under the root, looked up until it shows: once, in a CI run, the
    first lookup right after the other process's mkdir answered NotFound (not explained yet; the
    rounds below measure how long such a change takes to show)."""
    from engine.base import errors
    from engine.namespace import ROOT

    deadline = time.monotonic() + WORKER_TIMEOUT_S
    while True:
        try:
            return ns.lookup(ROOT, ns.root_ino, name).ino
        except errors.NotFound:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.001)


def visibility_reader(url: str, rounds: int, ready, turn, done, results) -> None:
    """Process B: look the names up through its cached Namespace until A's change shows."""
    from engine.base import errors
    from engine.namespace import ROOT

    head = Head(url)
    ns = head.ns
    try:
        top = ns.mkdir(ROOT, ns.root_ino, "vis").ino
        ready.set()
        seen_made, seen_moved, lookups = [], [], 0

        def poll(name: str) -> float:
            nonlocal lookups
            while True:
                lookups += 1
                try:
                    ns.lookup(ROOT, top, name)
                    return time.perf_counter()
                except errors.NotFound:
                    continue

        for i in range(rounds):
            with contextlib.suppress(errors.NotFound):
                ns.lookup(ROOT, top, f"v-{i}")  # the directory's names cached: complete
            turn.set()
            seen_made.append(poll(f"v-{i}"))
            done.set()
            seen_moved.append(poll(f"r-{i}"))
            try:
                ns.lookup(ROOT, top, f"v-{i}")
                raise AssertionError(f"v-{i} still found after r-{i} appeared")
            except errors.NotFound:
                pass
            done.set()
        results.put(
            {
                "seen_made": seen_made,
                "seen_moved": seen_moved,
                "lookups": lookups,
                "counts": dict(head.counts),
            }
        )
    finally:
        head.close()


def measure_visibility(rounds: int, scratch: Path) -> dict:
    ctx = mp.get_context("spawn")
    url = make_catalog(Path(tempfile.mkdtemp(prefix="visibility-", dir=scratch)) / "c")
    ready, turn, done = ctx.Event(), ctx.Event(), ctx.Event()
    writes, reads = ctx.Queue(), ctx.Queue()
    procs = [
        ctx.Process(target=visibility_reader, args=(url, rounds, ready, turn, done, reads)),
        ctx.Process(target=visibility_writer, args=(url, rounds, ready, turn, done, writes)),
    ]
    wrote, read = gather(procs, [writes, reads], "visibility")
    create = [(s - m) * 1e6 for m, s in zip(wrote["made"], read["seen_made"], strict=True)]
    rename = [(s - m) * 1e6 for m, s in zip(wrote["moved"], read["seen_moved"], strict=True)]
    return {
        "create_us": {
            "p50": percentile(create, 0.5),
            "p99": percentile(create, 0.99),
            "max": max(create),
        },
        "rename_us": {
            "p50": percentile(rename, 0.5),
            "p99": percentile(rename, 0.99),
            "max": max(rename),
        },
        "rounds": rounds,
        "reader_lookups": read["lookups"],
        "reader_cache_clears": read["counts"]["cache_clears"],
    }


# -- the driver ----------------------------------------------------------------------
def layouts_for(heads: list[int]) -> list[tuple[str, int]]:
    out = [("process", 1)] if 1 in heads else []
    for n in heads:
        if n > 1:
            out += [("shared", n), ("queued", n), ("separate", n), ("threads", n)]
    return out


def label(layout: str, n: int) -> str:
    return "1 process" if layout == "process" else f"{n} {layout}"


def median_row(runs: list[dict]) -> dict:
    """The medians over a layout's rounds."""
    med = statistics.median
    return {
        "ops_per_s": med(r["ops_per_s"] for r in runs),
        "small_files_per_s": med(r["small_files_per_s"] for r in runs),
        "cpu_us_per_op": med(r["cpu_us_per_op"] for r in runs),
        "cpu_per_wall": med(r["cpu_per_wall"] for r in runs),
        "latency": {
            op: {q: med(r["latency"][op][q] for r in runs) for q in ("p50_us", "p99_us")}
            for op in OPS
        },
        "counts": {k: med(r["counts"][k] for r in runs) for k in runs[0]["counts"]},
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", default="1,2,4", help="comma-separated worker counts")
    ap.add_argument("--rounds", type=int, default=3, help="alternated runs of every layout")
    ap.add_argument("--cycles", type=int, help="small files per worker (reads follow each)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: proves the harness works")
    ap.add_argument("--json", help="also write every run to this JSON file")
    args = ap.parse_args(argv)
    try:
        heads = sorted({int(n) for n in args.heads.split(",")})
    except ValueError:
        ap.error(f"--heads: comma-separated whole numbers, not {args.heads!r}")
    if not heads or heads[0] < 1:
        ap.error("--heads: every count at least 1")
    if args.rounds < 1:
        ap.error("--rounds: at least 1")
    sizes = dict(SIZES["smoke" if args.smoke else "full"])
    if args.cycles is not None:
        sizes["cycles"] = args.cycles
    layouts = layouts_for(heads)
    runs: dict[str, list[dict]] = {label(*lay): [] for lay in layouts}
    with tempfile.TemporaryDirectory(prefix="shingle-heads-") as scratch:
        for rnd in range(args.rounds):
            order = layouts if rnd % 2 == 0 else list(reversed(layouts))
            for layout, n in order:
                result = run_layout(layout, n, sizes, Path(scratch))
                runs[label(layout, n)].append(result)
                print(
                    f"# round {rnd + 1} {label(layout, n)}: {result['ops_per_s']:.0f} ops/s, "
                    f"{result['cpu_us_per_op']:.0f} us CPU/op, {result['counts']}",
                    file=sys.stderr,
                    flush=True,
                )
        visibility = measure_visibility(sizes["visibility"], Path(scratch))
    rows = {name: median_row(samples) for name, samples in runs.items()}
    print(f"# medians of {args.rounds} alternated rounds; {sizes}")
    for name, row in rows.items():
        lat = " ".join(
            f"{op}_p50_us={row['latency'][op]['p50_us']:.0f} "
            f"{op}_p99_us={row['latency'][op]['p99_us']:.0f}"
            for op in OPS
        )
        counts = " ".join(f"{k}={v:g}" for k, v in row["counts"].items())
        print(
            f"{name.replace(' ', '_')} ops_per_s={row['ops_per_s']:.0f} "
            f"small_files_per_s={row['small_files_per_s']:.0f} "
            f"cpu_us_per_op={row['cpu_us_per_op']:.1f} cpu_per_wall={row['cpu_per_wall']:.2f} "
            f"{lat} {counts}"
        )
    vis = visibility
    print(
        f"visibility rounds={vis['rounds']} create_p50_us={vis['create_us']['p50']:.0f} "
        f"create_p99_us={vis['create_us']['p99']:.0f} create_max_us={vis['create_us']['max']:.0f} "
        f"rename_p50_us={vis['rename_us']['p50']:.0f} rename_p99_us={vis['rename_us']['p99']:.0f} "
        f"rename_max_us={vis['rename_us']['max']:.0f} "
        f"reader_cache_clears={vis['reader_cache_clears']}"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"sizes": sizes, "runs": runs, "medians": rows, "visibility": vis}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
