"""Catalog benchmark: namespace ops/s on SQLite and PostgreSQL.

    .venv/bin/python bench/catalog.py [--files N] [--json] [--no-postgres]

For each database: create, lookup, getattr (warm cache), rename, readdir
(entries/s) and unlink, through the namespace API, and the CPU of one catalog
transaction (read, write, durable write of one row: ``txn_*_cpu_us``). The reference in the
same run is the bare minimum a create costs on SQLite: one transaction
inserting an inode row and a directory entry with the sqlite3 module and no
checks at all; ``create_vs_bare_sqlite`` is namespace creates/s divided by
that. Targets (issue 2): >= 5,000 creates/s and >= 20,000 getattrs/s on
SQLite, so the catalog leaves room under NFS-Ganesha's 600-1,600 creates/s
and 3,000-5,000 getattrs/s through NFS.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from engine.catalog import Catalog, upgrade  # noqa: E402
from engine.catalog.database import sql, sql_one  # noqa: E402
from engine.namespace import ROOT, Namespace  # noqa: E402


def rate(count: int, seconds: float) -> float:
    return round(count / seconds, 1) if seconds > 0 else float("inf")


def timed(fn, items) -> float:
    start = time.perf_counter()
    for item in items:
        fn(item)
    return time.perf_counter() - start


def transaction_cpu_us(catalog: Catalog, count: int = 2000) -> dict:
    """CPU microseconds of one ``Catalog.run`` in one thread: a read of one row, a write of one
    row, the same write made durable. What the catalog layer adds to the SQL shows here."""

    def read(conn):
        return sql_one(conn, "SELECT value FROM settings WHERE key = ?", ("bench.txn",))

    def write(conn):
        sql(conn, "DELETE FROM settings WHERE key = ?", ("bench.txn",)).close()
        sql(conn, "INSERT INTO settings (key, value) VALUES (?, ?)", ("bench.txn", "1")).close()

    runs = {
        "txn_read_cpu_us": lambda: catalog.read(read),
        "txn_write_cpu_us": lambda: catalog.run(write, tracked=True),
        "txn_durable_cpu_us": lambda: catalog.run(write, durable=True, tracked=True),
    }
    out = {}
    for key, once in runs.items():
        once()
        start = time.process_time()
        for _ in range(count):
            once()
        out[key] = round((time.process_time() - start) / count * 1e6, 1)
    return out


def run_namespace(url: str, files: int) -> dict:
    upgrade(url)
    catalog = Catalog(url)
    ns = Namespace(catalog)
    d = ns.mkdir(ROOT, ns.root_ino, "bench").ino
    names = [f"file-{i:06d}" for i in range(files)]
    result = {}
    result["create_per_s"] = rate(files, timed(lambda n: ns.create(ROOT, d, n), names))
    attrs = [ns.lookup(ROOT, d, n) for n in names]  # warm the caches
    result["lookup_per_s"] = rate(files, timed(lambda n: ns.lookup(ROOT, d, n), names))
    inos = [a.ino for a in attrs] * 3
    result["getattr_per_s"] = rate(len(inos), timed(ns.getattr, inos))

    def list_all(_):
        cookie = 0
        while True:
            page, eof = ns.readdir(ROOT, d, cookie, limit=1024)
            if eof:
                return
            cookie = page[-1].cookie

    result["readdir_entries_per_s"] = rate(files * 3, timed(list_all, range(3)))
    result["rename_per_s"] = rate(files, timed(lambda n: ns.rename(ROOT, d, n, d, n + ".r"), names))
    result["unlink_per_s"] = rate(files, timed(lambda n: ns.unlink(ROOT, d, n + ".r"), names))
    result.update(transaction_cpu_us(catalog))
    catalog.close()
    return result


def run_bare_sqlite(path: Path, files: int) -> float:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute(
        "CREATE TABLE inodes (ino INTEGER PRIMARY KEY AUTOINCREMENT, mode INT, size INT, mtime INT)"
    )
    conn.execute(
        "CREATE TABLE dirents (id INTEGER PRIMARY KEY AUTOINCREMENT, parent INT, name TEXT, child "
        "INT, UNIQUE(parent, name))"
    )
    start = time.perf_counter()
    for i in range(files):
        conn.execute("BEGIN IMMEDIATE")
        ino = conn.execute(
            "INSERT INTO inodes (mode, size, mtime) VALUES (420, 0, ?)", (i,)
        ).lastrowid
        conn.execute("INSERT INTO dirents (parent, name, child) VALUES (1, ?, ?)", (f"f{i}", ino))
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - start
    conn.close()
    return rate(files, elapsed)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=5000)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args()
    report = {"files": args.files}
    with tempfile.TemporaryDirectory(prefix="shingle-bench-") as tmp:
        report["bare_sqlite_create_per_s"] = run_bare_sqlite(Path(tmp) / "bare.db", args.files)
        report["sqlite"] = run_namespace(f"sqlite:///{tmp}/catalog.db", args.files)
        report["sqlite"]["create_vs_bare_sqlite"] = round(
            report["sqlite"]["create_per_s"] / report["bare_sqlite_create_per_s"], 3
        )
        if not args.no_postgres:
            from pgserver import PostgresServer

            server = PostgresServer().start()
            try:
                report["postgresql"] = run_namespace(server.create_database(), args.files)
            finally:
                server.stop()
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{'operation':<24}{'sqlite':>12}{'postgresql':>12}")
        for key in report["sqlite"]:
            pg = report.get("postgresql", {}).get(key, "")
            print(f"{key:<24}{report['sqlite'][key]:>12}{pg:>12}")
        print(f"{'bare sqlite create/s':<24}{report['bare_sqlite_create_per_s']:>12}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
