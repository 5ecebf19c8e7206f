"""Prototype measurement of a lazily materialized snapshot (copy-on-write of rows), A/B against
today's copy (engine/snapshots/service.py), for docs/snapshots.md.

Not wired into the engine. It measures the two halves such a design would have:
a. "record": what create would do before returning: walk the tree for its inode numbers,
   reserve the range of the copy and record the snapshot and the tree's inodes durably (a
   narrow table of inode numbers, created here in the throwaway catalog);
b. "materialize": the copy of the frozen rows afterwards, CHUNK inodes per durable
   transaction (the statements of today's copy, restricted to a chunk), then publishing the
   view's name; the longest chunk is how long one holds the catalog's write lock.
What the prototype leaves out (the work an engine version needs) is listed in the document.
After the run the lazy snapshot is diffed against an eager one of the same tree: they match.

    .venv/bin/python bench/snapshots_lazy.py [--files N] [--rounds R] [--json]
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

from snapshots import build_dataset  # noqa: E402

from engine.catalog import Catalog, upgrade  # noqa: E402
from engine.catalog.database import sql, sql_one  # noqa: E402
from engine.coding.erasure import load_policies  # noqa: E402
from engine.datapath import DataPath  # noqa: E402
from engine.datapath.sharing import add_references  # noqa: E402
from engine.drives import format_emulated  # noqa: E402
from engine.namespace import Namespace  # noqa: E402
from engine.snapshots.service import _INODE_COLUMNS, Snapshots, _fill_tree, _reserve_inodes  # noqa: E402

MiB = 1 << 20
CHUNK = 4096
PENDING = (
    "CREATE TABLE IF NOT EXISTS snapshot_pending "
    "(snapshot_id INTEGER NOT NULL, ino INTEGER NOT NULL, PRIMARY KEY (snapshot_id, ino))"
)


def record(catalog: Catalog, snaps: Snapshots, dataset: int, name: str) -> tuple:
    """Phase a: (snapshot id, delta, lo, hi, inode count), durable."""

    def work(conn):
        snapdir = snaps._snapshot_dir(conn, dataset)
        _fill_tree(conn, dataset, with_root=True)
        lo_old, hi_old, count = sql_one(
            conn, "SELECT MIN(ino), MAX(ino), COUNT(*) FROM snapshot_tree"
        )
        delta = _reserve_inodes(conn, lo_old, hi_old)
        now = time.time_ns()
        # the view's name comes when it is whole (the prototype's stand-in for a state column)
        sid = sql_one(
            conn,
            "INSERT INTO snapshots (name, source_ino, root_ino, ino_lo, ino_hi, created_ns, "
            "deleting) VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING id",
            (name, dataset, dataset, lo_old + delta, hi_old + delta, now, False),
        )[0]
        sql(
            conn,
            "INSERT INTO snapshot_pending (snapshot_id, ino) SELECT ?, ino FROM snapshot_tree",
            (sid,),
        ).close()
        sql(conn, "DELETE FROM snapshot_tree").close()
        return sid, delta, lo_old, hi_old, count, snapdir

    return catalog.run(work, durable=True)


def materialize(catalog: Catalog, sid: int, delta: int, lo: int, hi: int) -> list[float]:
    """Phase b: copy the rows of the pending inodes, CHUNK inode numbers per transaction;
    returns each chunk's seconds."""
    times = []
    for start in range(lo, hi + 1, CHUNK):
        end = min(start + CHUNK - 1, hi)

        def work(conn, a=start, b=end):
            chunk = (
                "(SELECT ino FROM snapshot_pending WHERE snapshot_id = ? AND ino BETWEEN ? AND ?)"
            )
            keys = (sid, a, b)
            sql(
                conn,
                f"INSERT INTO inodes (ino, {_INODE_COLUMNS}) SELECT ino + ?, {_INODE_COLUMNS} "
                f"FROM inodes WHERE ino IN {chunk}",
                (delta, *keys),
            ).close()
            # names in a directory of the chunk whose child is pending (the root's name in
            # .snapshots comes at publish)
            sql(
                conn,
                "INSERT INTO dirents (parent, name, child) SELECT parent + ?, name, child + ? "
                f"FROM dirents WHERE parent IN {chunk} AND child IN "
                "(SELECT ino FROM snapshot_pending WHERE snapshot_id = ?)",
                (delta, delta, *keys, sid),
            ).close()
            for table, columns in (("symlinks", "target"), ("xattrs", "name, value")):
                sql(
                    conn,
                    f"INSERT INTO {table} (ino, {columns}) SELECT ino + ?, {columns} "
                    f"FROM {table} WHERE ino IN {chunk}",
                    (delta, *keys),
                ).close()
            sql(
                conn,
                "INSERT INTO extents (ino, file_offset, length, stripe_id, stripe_offset) "
                "SELECT ino + ?, file_offset, length, stripe_id, stripe_offset FROM extents "
                f"WHERE ino IN {chunk}",
                (delta, *keys),
            ).close()
            add_references(conn, a + delta, b + delta)

        began = time.perf_counter()
        # a directory's names may point at children of later chunks: checks off, as the
        # copy's references are whole once the last chunk is in
        catalog.run(work, durable=True, foreign_keys=False)
        times.append(time.perf_counter() - began)
    return times


def publish(catalog: Catalog, snaps: Snapshots, sid: int, name: str, root: int, snapdir: int):
    def work(conn):
        sql(
            conn,
            "INSERT INTO dirents (parent, name, child) VALUES (?, ?, ?)",
            (snapdir, name, root),
        ).close()
        sql(conn, "UPDATE snapshots SET root_ino = ? WHERE id = ?", (root, sid)).close()
        # kept until now: a chunk's names may point at children of earlier chunks
        sql(conn, "DELETE FROM snapshot_pending WHERE snapshot_id = ?", (sid,)).close()
        snaps._touch(conn, snapdir, nlink_delta=1)

    catalog.run(work, durable=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="shingle-bench-lazy-"))
    try:
        url = f"sqlite:///{folder}/catalog.db"
        upgrade(url)
        catalog = Catalog(url)
        catalog.run(lambda conn: sql(conn, PENDING).close())
        format_emulated(catalog, folder / "drives", 10, 512 * MiB, 64 * MiB)
        data = DataPath(catalog, load_policies({}), reserve_zones=1)
        ns = Namespace(catalog, data=data)
        snaps = Snapshots(ns)
        dataset = build_dataset(ns, catalog, args.files)
        out: dict = {"files": args.files, "chunk_inodes": CHUNK, "rounds": []}
        for i in range(args.rounds):  # alternated: eager, then lazy
            row: dict = {}
            start = time.perf_counter()
            snaps.create("/ds", f"eager{i}")
            row["eager_create_s"] = round(time.perf_counter() - start, 3)
            start = time.perf_counter()
            sid, delta, lo, hi, _count, snapdir = record(catalog, snaps, dataset, f"lazy{i}")
            row["lazy_record_s"] = round(time.perf_counter() - start, 3)
            start = time.perf_counter()
            chunks = materialize(catalog, sid, delta, lo, hi)
            publish(catalog, snaps, sid, f"lazy{i}", dataset + delta, snapdir)
            ns.forget_read_only()
            ns.invalidate()
            row["lazy_materialize_s"] = round(time.perf_counter() - start, 3)
            row["lazy_longest_chunk_s"] = round(max(chunks), 3)
            row["lazy_vs_eager_diff"] = len(snaps.diff("/ds", f"eager{i}", f"lazy{i}"))
            row["load_average"] = [round(x, 2) for x in os.getloadavg()]
            out["rounds"].append(row)
            snaps.delete("/ds", f"eager{i}")
            snaps.delete("/ds", f"lazy{i}")
        data.close()
        catalog.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(json.dumps(out, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
