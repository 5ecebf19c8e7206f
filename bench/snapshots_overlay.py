"""Prototype measurement of the overlay design chosen for constant-time snapshots
(docs/snapshots.md, "Constant-time snapshots and writable clones: the design chosen"), on SQLite
or PostgreSQL, at each dataset size given. Not wired into the engine: it measures the parts the
engine version would be made of, in a throwaway catalog.

a. record: what create would write (the inode range reserved past MAX(ino), one snapshot row),
   in one durable transaction; timed for each of --held snapshots;
b. membership: whether a live inode is in a snapshot's view, by the design's upward walk (the
   copied names pointing at ``f``, and the live names pointing at ``f - delta`` whose
   directory is not copied), for files inside /ds and outside it: a query per level on SQLite,
   one recursive statement on PostgreSQL;
c. copy-up: a file's rows copied to ``ino + delta`` (inode, extents adding their stripe
   references, xattrs, symlink), and a folder's (its inode, and every name in it into a table
   of frozen names without the foreign key on the child: a copied folder names children not
   copied yet);
d. live 4 KiB durable writes to old files of /ds: with no snapshot, then with --held
   snapshots recorded, each first write preceded by the check and copy-up for every snapshot
   (in a transaction of its own: the engine would run it in the write's commit), then a second
   pass over the same files (the probe finds them copied). Rounds alternate.

    .venv/bin/python bench/snapshots_overlay.py [--files N[,N...]] [--held H] [--postgres]
        [--json] [--explain]
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from snapshots import build_dataset  # noqa: E402

from engine.catalog import Catalog, upgrade  # noqa: E402
from engine.catalog.database import sql, sql_all, sql_one  # noqa: E402
from engine.catalog.models import DIR  # noqa: E402
from engine.coding.erasure import load_policies  # noqa: E402
from engine.datapath import DataPath  # noqa: E402
from engine.datapath.sharing import add_references  # noqa: E402
from engine.drives import format_emulated  # noqa: E402
from engine.namespace import ROOT, Namespace  # noqa: E402
from engine.snapshots.service import _INODE_COLUMNS, _reserve_inodes  # noqa: E402

MiB = 1 << 20
WRITES = 200


class View:
    """One recorded snapshot: frozen ino = live ino + delta for live inos <= live_hi."""

    def __init__(self, dataset: int, delta: int, live_hi: int):
        self.dataset, self.delta, self.live_hi = dataset, delta, live_hi
        self.root = dataset + delta
        self.members: dict[int, bool] = {}  # the view never changes: a verdict holds for good


def record(catalog: Catalog, dataset: int, name: str) -> View:
    def work(conn):
        live_hi = sql_one(conn, "SELECT MAX(ino) FROM inodes")[0]
        delta = _reserve_inodes(conn, 1, live_hi)
        sql(
            conn,
            "INSERT INTO snapshots (name, source_ino, root_ino, ino_lo, ino_hi, created_ns, "
            "deleting) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (name, dataset, dataset, 1 + delta, live_hi + delta, time.time_ns(), False),
        ).close()
        return View(dataset, delta, live_hi)

    return catalog.run(work, durable=True)


def create_frozen_dirents(conn) -> None:
    """Names copied into a view: a table of their own, as a copied directory names children not
    copied yet, which the dirents' foreign key on the child refuses (PostgreSQL checks it)."""
    sql(
        conn,
        "CREATE TABLE frozen_dirents (parent BIGINT NOT NULL, name VARCHAR(255) NOT NULL, "
        "child BIGINT NOT NULL, PRIMARY KEY (parent, name))",
    ).close()
    sql(conn, "CREATE INDEX ix_frozen_dirents_child ON frozen_dirents (child)").close()


def copied(conn, ino: int) -> bool:
    return sql_one(conn, "SELECT 1 FROM inodes WHERE ino = ?", (ino,)) is not None


# the walk in one statement on PostgreSQL (a round trip per level costs more than the walk);
# the recursive term names ``up`` once, the two kinds of parent come from a LATERAL union
_IN_VIEW_PG = (
    "WITH RECURSIVE up(f) AS (SELECT CAST(? AS BIGINT) UNION SELECT p.parent FROM up, LATERAL "
    "(SELECT parent FROM frozen_dirents WHERE child = up.f UNION ALL SELECT d.parent + ? "
    "FROM dirents d WHERE d.child = up.f - ? AND d.parent + 0 <= ? AND NOT EXISTS (SELECT 1 FROM "
    "inodes c WHERE c.ino = d.parent + ?)) p WHERE up.f <> ?) SELECT 1 FROM up WHERE f = ? LIMIT 1"
)


def in_view(conn, view: View, ino: int) -> bool:
    """Whether live ``ino`` is in the view: walk up from ``ino + delta`` to the view's root."""
    if ino > view.live_hi:
        return False
    known = view.members.get(ino)
    if known is not None:
        return known
    if conn.dialect.name == "postgresql":
        d = view.delta
        found = (
            sql_one(conn, _IN_VIEW_PG, (ino + d, d, d, view.live_hi, d, view.root, view.root))
            is not None
        )
        view.members[ino] = found
        return found
    frontier, seen, found = {ino + view.delta}, set(), False
    while frontier and not found:
        nxt = set()
        for f in frontier:
            seen.add(f)
            parents = [
                row[0] for row in sql_all(conn, "SELECT parent FROM dirents WHERE child = ?", (f,))
            ]
            for (parent,) in sql_all(
                conn,
                "SELECT parent FROM dirents WHERE child = ? AND parent <= ?",
                (f - view.delta, view.live_hi),
            ):
                if not copied(conn, parent + view.delta):
                    parents.append(parent + view.delta)
            for p in parents:
                if p == view.root:
                    found = True
                elif p not in seen:
                    nxt.add(p)
        frontier = nxt
    view.members[ino] = found
    return found


def copy_up(conn, view: View, ino: int) -> bool:
    """Copy live ``ino``'s rows into the view (a directory: its names too); False if done."""
    frozen = ino + view.delta
    if copied(conn, frozen):
        return False
    sql(
        conn,
        f"INSERT INTO inodes (ino, {_INODE_COLUMNS}) SELECT ino + ?, {_INODE_COLUMNS} "
        "FROM inodes WHERE ino = ?",
        (view.delta, ino),
    ).close()
    for table, columns in (("symlinks", "target"), ("xattrs", "name, value")):
        sql(
            conn,
            f"INSERT INTO {table} (ino, {columns}) SELECT ino + ?, {columns} FROM {table} "
            "WHERE ino = ?",
            (view.delta, ino),
        ).close()
    sql(
        conn,
        "INSERT INTO extents (ino, file_offset, length, stripe_id, stripe_offset) "
        "SELECT ino + ?, file_offset, length, stripe_id, stripe_offset FROM extents WHERE ino = ?",
        (view.delta, ino),
    ).close()
    add_references(conn, frozen, frozen)
    if sql_one(conn, "SELECT type FROM inodes WHERE ino = ?", (ino,))[0] == DIR:
        sql(
            conn,
            "INSERT INTO frozen_dirents (parent, name, child) SELECT parent + ?, name, child + ? "
            "FROM dirents WHERE parent = ? AND child NOT IN (SELECT dir_ino FROM snapshot_dirs)",
            (view.delta, view.delta, ino),
        ).close()
    return True


def preserve(catalog: Catalog, views: list[View], ino: int) -> None:
    """What the engine's change would run first: for each view holding ``ino``, copy it up."""

    def work(conn):
        for view in views:
            if (
                ino <= view.live_hi
                and not copied(conn, ino + view.delta)
                and in_view(conn, view, ino)
            ):
                copy_up(conn, view, ino)

    catalog.run(work, foreign_keys=False)


def timed(step) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def writes(ns: Namespace, inos: list[int], before=None) -> dict:
    """Rate and this process's CPU per write (the figure that survives a loaded machine)."""
    block = b"o" * 4096
    start, cpu = time.perf_counter(), time.process_time()
    for ino in inos:
        if before is not None:
            before(ino)
        ns.write(ino, 0, block, stable=True)
    return {
        "per_s": round(len(inos) / (time.perf_counter() - start)),
        "cpu_us": round((time.process_time() - cpu) / len(inos) * 1e6),
    }


def run_one(args, files: int) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="shingle-bench-overlay-"))
    server = None
    try:
        url = f"sqlite:///{folder}/catalog.db"
        if args.postgres:
            from pgserver import PostgresServer

            server = PostgresServer().start()
            url = server.create_database()
        upgrade(url)
        catalog = Catalog(url)
        catalog.run(create_frozen_dirents)
        format_emulated(catalog, folder / "drives", 10, 512 * MiB, 64 * MiB)
        data = DataPath(catalog, load_policies({}), reserve_zones=1)
        ns = Namespace(catalog, data=data)
        out: dict = {"files": files, "catalog": "postgresql" if args.postgres else "sqlite"}
        dataset = build_dataset(ns, catalog, files)
        other = ns.mkdir(ROOT, ns.root_ino, "other").ino
        outside = [ns.create(ROOT, other, f"o{i}").ino for i in range(100)]
        folders = [e.attr.ino for e in ns.readdir(ROOT, dataset, limit=1000)[0]]
        inside = [e.attr.ino for e in ns.readdir(ROOT, folders[0], limit=WRITES * 4)[0]]
        base = [writes(ns, inside[:WRITES])]
        views: list[View] = []
        record_s = []
        for i in range(args.held):
            record_s.append(timed(lambda i=i: views.append(record(catalog, dataset, f"v{i}"))))
        out["record_s"] = [round(t, 4) for t in record_s]
        view = views[-1]

        def verdicts(inos):
            return catalog.read(lambda conn: [in_view(conn, view, i) for i in inos])

        view.members.clear()
        n = min(100, len(inside))
        t_in = timed(lambda: verdicts(inside[:n]))
        view.members.clear()
        t_out = timed(lambda: verdicts(outside))
        assert all(verdicts(inside[:n])) and not any(verdicts(outside))
        out["membership_us"] = {
            "inside_depth_2": round(t_in / n * 1e6, 1),
            "outside": round(t_out / len(outside) * 1e6, 1),
        }
        if args.explain and args.postgres:  # the server's plan and time of one check
            d = view.delta
            plan = catalog.read(
                lambda conn: sql_all(
                    conn,
                    "EXPLAIN (ANALYZE, FORMAT JSON) " + _IN_VIEW_PG,
                    (inside[0] + d, d, d, view.live_hi, d, view.root, view.root),
                )
            )[0][0][0]
            scans = []
            todo = [plan["Plan"]]
            while todo:
                node = todo.pop()
                scans += [f"{node['Node Type']} {node.get('Index Name', '')}".strip()]
                todo += node.get("Plans", [])
            out["membership_plan"] = {
                "execution_ms": plan["Execution Time"],
                "scans": sorted(x for x in scans if "Scan" in x),
            }
        t_dir = timed(lambda: preserve(catalog, [view], folders[1]))
        t_file = timed(lambda: preserve(catalog, [view], inside[-1]))
        out["copy_up_s"] = {
            "folder_of_names": files // 100,
            "folder": round(t_dir, 4),
            "file": round(t_file, 4),
        }
        rounds = []
        for r in range(2):  # alternated: none, overlay first writes, overlay probes
            targets = inside[WRITES * (r + 1) : WRITES * (r + 2)] or inside[:WRITES]
            none = writes(ns, inside[:WRITES])
            first = writes(ns, targets, lambda ino: preserve(catalog, views, ino))
            again = writes(ns, targets, lambda ino: preserve(catalog, views, ino))
            rounds.append(
                {"none": none, f"first_with_{args.held}": first, f"again_with_{args.held}": again}
            )
        out["write_4k_stable"] = {"base": base[0], "rounds": rounds}
        out["load_average"] = [round(x, 2) for x in os.getloadavg()]
        data.close()
        catalog.close()
        return out
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", default="1000,100000")
    parser.add_argument("--held", type=int, default=10)
    parser.add_argument("--postgres", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--explain", action="store_true", help="with --postgres: the membership check's plan"
    )
    args = parser.parse_args()
    runs = [run_one(args, int(n)) for n in sorted(int(x) for x in args.files.split(","))]
    print(json.dumps(runs, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
