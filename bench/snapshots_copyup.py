"""What a copy-on-change snapshot pays at the first change of a folder (docs/snapshots.md,
"Snapshot create in constant time: reusing the lazy clones, evaluated").

A folder of /ds (bench/snapshots.py's ``build_dataset``: each file 4 KiB in an inline stripe of
its own) is copied, in one durable transaction with foreign keys on as in a live change, three
ways: its names and its children's rows (inode, extents counted in their stripes, xattrs,
symlinks: what the lazy clones' ``materialize`` copies), its names only (into a table without
the foreign key on the child, the overlay's frozen names), and one file's rows. Each is run on
three folders not copied before; wall time and this process's CPU time, in ms. Nothing is wired
into the engine: the copies land at ``ino + delta`` numbers above every inode.

    .venv/bin/python bench/snapshots_copyup.py [--files N[,N...]] [--folders F] [--postgres]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import snapshots as bench  # noqa: E402

from engine.catalog import Catalog, upgrade  # noqa: E402
from engine.catalog.database import sql, sql_all, sql_one  # noqa: E402
from engine.coding.erasure import load_policies  # noqa: E402
from engine.datapath import DataPath  # noqa: E402
from engine.drives import format_emulated  # noqa: E402
from engine.namespace import Namespace  # noqa: E402
from engine.namespace.lazyclones import INODE_COLUMNS, copy_rows  # noqa: E402

REPEAT = 3  # folders copied per way


def _above_all(conn) -> int:
    """A delta that puts a copy above every inode (and above earlier copies of this run)."""
    return int(sql_one(conn, "SELECT COALESCE(MAX(ino), 0) FROM inodes")[0]) + 1_000_000


def _folder_and_rows(folder: int):
    def work(conn):
        delta = _above_all(conn)
        children = [
            r[0] for r in sql_all(conn, "SELECT child FROM dirents WHERE parent = ?", (folder,))
        ]
        sql(
            conn,
            f"INSERT INTO inodes (ino, {INODE_COLUMNS}) SELECT ino + ?, {INODE_COLUMNS} "
            "FROM inodes WHERE ino = ?",
            (delta, folder),
        ).close()
        copy_rows(conn, children, delta)
        sql(
            conn,
            "INSERT INTO dirents (parent, name, child) SELECT parent + ?, name, child + ? "
            "FROM dirents WHERE parent = ?",
            (delta, delta, folder),
        ).close()

    return work


def _names_only(folder: int):
    def work(conn):
        delta = _above_all(conn)
        sql(
            conn,
            "INSERT INTO bench_frozen_names (parent, name, child) SELECT parent + ?, name, "
            "child + ? FROM dirents WHERE parent = ?",
            (delta, delta, folder),
        ).close()

    return work


def _one_file(folder: int):
    def work(conn):
        delta = _above_all(conn)
        child = sql_one(conn, "SELECT child FROM dirents WHERE parent = ? LIMIT 1", (folder,))[0]
        copy_rows(conn, [int(child)], delta)

    return work


def run_one(files: int, folders: int, postgres: bool) -> dict:
    bench.FOLDERS = folders
    folder = Path(tempfile.mkdtemp(prefix="shingle-bench-copyup-"))
    server = None
    try:
        url = f"sqlite:///{folder}/catalog.db"
        if postgres:
            from pgserver import PostgresServer

            server = PostgresServer().start()
            url = server.create_database()
        upgrade(url)
        catalog = Catalog(url)
        format_emulated(catalog, folder / "drives", 10, 512 << 20, 64 << 20)
        data = DataPath(catalog, load_policies({}), reserve_zones=1)
        ns = Namespace(catalog, data=data)
        start = time.perf_counter()
        ds = bench.build_dataset(ns, catalog, files)
        out: dict = {
            "files": files,
            "files_per_folder": files // folders,
            "catalog": "postgresql" if postgres else "sqlite",
            "build_s": round(time.perf_counter() - start, 1),
        }
        dirs = [
            int(r[0])
            for r in catalog.read(
                lambda conn: sql_all(
                    conn, "SELECT child FROM dirents WHERE parent = ? ORDER BY child", (ds,)
                )
            )
        ]
        integer = "BIGINT" if postgres else "INTEGER"
        catalog.run(
            lambda conn: sql(
                conn,
                f"CREATE TABLE bench_frozen_names (parent {integer}, name TEXT, "
                f"child {integer}, PRIMARY KEY (parent, name))",
            ).close()
        )

        def timed(work) -> list[float]:
            wall, cpu = time.perf_counter(), time.process_time()
            catalog.run(work, durable=True)
            return [
                round((time.perf_counter() - wall) * 1e3, 2),
                round((time.process_time() - cpu) * 1e3, 2),
            ]

        ways = (
            ("names_and_rows_ms", _folder_and_rows),
            ("names_only_ms", _names_only),
            ("one_file_ms", _one_file),
        )
        for n, (key, way) in enumerate(ways):
            out[key] = [timed(way(f)) for f in dirs[n * REPEAT : (n + 1) * REPEAT]]
        data.close()
        catalog.close()
        return out
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", default="10000,100000", help="files in /ds, comma-separated")
    parser.add_argument("--folders", type=int, default=10, help="folders of /ds (at least 9)")
    parser.add_argument("--postgres", action="store_true")
    args = parser.parse_args()
    for files in sorted(int(n) for n in args.files.split(",")):
        print(json.dumps(run_one(files, max(args.folders, 3 * REPEAT), args.postgres)), flush=True)


if __name__ == "__main__":
    main()
