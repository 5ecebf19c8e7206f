"""What NFSv4 state across heads costs (docs/nfs-state.md): LOCK/LOCKU and OPEN/CLOSE cycles
through `shingle serve` heads over one SQLite catalog, in the same run, rounds alternated:

- one head: a head alone ([heads] count 1): no holdings table, the state table only;
- two heads: the same clients split over two heads ([heads] count 2): every LOCK, LOCKU, OPEN
  that adds share modes and CLOSE is a catalog transaction that checks the other head's
  holdings and writes this head's.

Each client is a process of the project's raw NFSv4.1 client with one request in flight and a
file of its own (a head alone on a file keeps its ranges in memory), or with --shared its own
byte of one file all clients use (each head then publishes every range change). No request
conflicts: the cost is the bookkeeping, not waiting. Printed per layout:
cycles per second of all clients together, and the heads' CPU per cycle (every head's).

    .venv/bin/python bench/heads_locks.py [--clients 4] [--cycles 300] [--rounds 3] [--shared]
        [--json F]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "nfs"))

from nfs4_rawclient import RawClient, open_args  # noqa: E402

from appliance.nfs.v4 import const as c  # noqa: E402
from appliance.nfs.v4 import types as t  # noqa: E402
from bench.serveheads import (  # noqa: E402
    HeadProcesses,
    alternated,
    free_port,
    init_head,
    medians,
    set_options,
)


class Heads(HeadProcesses):
    """``count`` `shingle serve` heads over the catalog of ``folder``/head0."""

    def __init__(self, folder: Path, count: int, catalog: str | None = None):
        """``catalog``: a catalog URL (PostgreSQL) instead of SQLite in head0's folder."""
        super().__init__(
            [folder / f"head{i}" for i in range(count)], [free_port() for _ in range(count)]
        )
        first = self.homes[0]
        if not first.exists():
            more = ("--catalog", catalog) if catalog else ()
            init_head(first, "--drive-size", "32MiB", "--zone-size", "4MiB", *more)
            (first / "shingle.sample").write_text((first / "shingle.toml").read_text())
        nfs = 'grace_seconds = 0\nportmap = "off"\n'
        text = set_options((first / "shingle.sample").read_text(), "nfs", nfs)
        (first / "shingle.toml").write_text(
            set_options(text, "heads", f"count = {count}\nindex = 0\n")
        )
        url = catalog or f"sqlite:///{(first / 'catalog.db').resolve()}"
        for index, home in enumerate(self.homes[1:], start=1):
            home.mkdir(exist_ok=True)
            (home / "shingle.toml").write_text(
                f'[catalog]\nurl = "{url}"\n[nfs]\n{nfs}[heads]\ncount = {count}\nindex = {index}\n'
            )


def _retried(raw, ops):
    """A request again while the server answers NFS4ERR_DELAY (as clients do): with a file
    shared by heads, the other head publishes the locks it kept in memory first."""
    while (got := raw.session(ops))[0] == c.NFS4ERR_DELAY:
        time.sleep(0.01)
    return got


def _client(port: int, name: str, cycles: int, start, out, offset: int) -> None:
    raw = RawClient(port).setup()
    fh, open_sid = raw.open_new(name, b"bench-open")
    owner = t.state_owner4.cls(raw.clientid, b"bench-lock")
    locker = (True, t.open_to_lock_owner4.cls(0, open_sid, 0, owner))
    st, res = _retried(
        raw,
        [(c.OP_PUTFH, fh), (c.OP_LOCK, t.ARGS[c.OP_LOCK](c.WRITE_LT, False, offset, 1, locker))],
    )
    assert st == 0, st
    lock_sid = res[-1][2]
    unlock = (c.OP_LOCKU, t.ARGS[c.OP_LOCKU](c.WRITE_LT, 0, lock_sid, offset, 1))
    assert raw.session([(c.OP_PUTFH, fh), unlock])[0] == 0
    root = raw.root_fh()
    start.wait()
    began = time.monotonic()
    for _ in range(cycles):  # LOCK then LOCKU under the lock stateid
        relock = (False, t.exist_lock_owner4.cls(t.stateid4.cls(0, lock_sid.other), 0))
        lock = (c.OP_LOCK, t.ARGS[c.OP_LOCK](c.WRITE_LT, False, offset, 1, relock))
        st, _ = _retried(raw, [(c.OP_PUTFH, fh), lock])
        assert st == 0, st
        unlock = (
            c.OP_LOCKU,
            t.ARGS[c.OP_LOCKU](c.WRITE_LT, 0, t.stateid4.cls(0, lock_sid.other), offset, 1),
        )
        assert raw.session([(c.OP_PUTFH, fh), unlock])[0] == 0
    locks_done = time.monotonic()
    for _ in range(cycles):  # OPEN with a new open-owner, CLOSE
        opening = open_args(name, b"cycle", raw.clientid, create=False)
        st, res = raw.session([(c.OP_PUTFH, root), (c.OP_OPEN, opening), (c.OP_GETFH, None)])
        assert st == 0, st
        close = (c.OP_CLOSE, t.ARGS[c.OP_CLOSE](0, res[2][2].stateid))
        assert raw.session([(c.OP_PUTFH, fh), close])[0] == 0
    out.put((locks_done - began, time.monotonic() - locks_done))
    raw.close()


def run(heads: Heads, clients: int, cycles: int, tag: str, shared: bool) -> dict:
    ctx = multiprocessing.get_context("fork")
    start, out = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(
            target=_client,
            args=(
                heads.ports[i % len(heads.ports)],
                f"{tag}-shared" if shared else f"{tag}-{i}",
                cycles,
                start,
                out,
                10 * i if shared else 0,
            ),
        )
        for i in range(clients)
    ]
    for p in procs:
        p.start()
    time.sleep(2.0)  # every client set up
    cpu0, wall0 = heads.cpu(), time.monotonic()
    start.set()
    spans = [out.get(timeout=600) for _ in procs]
    wall, cpu = time.monotonic() - wall0, heads.cpu() - cpu0
    for p in procs:
        p.join()
    lock_s, open_s = max(s[0] for s in spans), max(s[1] for s in spans)
    total = clients * cycles
    return {
        "lock_cycles_s": total / lock_s,
        "open_cycles_s": total / open_s,
        "cpu_us_per_cycle": cpu / (2 * total) * 1e6,
        "wall_s": wall,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--cycles", type=int, default=300, help="of each kind per client")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--shared",
        action="store_true",
        help="every client locks its own byte of one file (the heads share the file: their "
        "ranges are published and checked at every LOCK and LOCKU)",
    )
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="shingle-bench-heads-locks-"))

    def measure(layout: str, round_: int) -> dict:
        heads = Heads(folder, 1 if layout == "one head" else 2)
        heads.start()
        try:
            tag = f"r{round_}-{len(heads.ports)}"
            return run(heads, args.clients, args.cycles, tag, args.shared)
        finally:
            heads.stop()

    try:
        results = alternated(["one head", "two heads"], args.rounds, measure, digits=1)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"# {args.clients} clients x {args.cycles} cycles of each, median of {args.rounds}")
    summary = medians(results, digits=1)
    one, two = summary["one head"], summary["two heads"]
    print(
        f"two heads / one head: LOCK+LOCKU {two['lock_cycles_s'] / one['lock_cycles_s']:.2f}x, "
        f"OPEN+CLOSE {two['open_cycles_s'] / one['open_cycles_s']:.2f}x, CPU per cycle "
        f"{two['cpu_us_per_cycle'] / one['cpu_us_per_cycle']:.2f}x"
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": results, "median": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
