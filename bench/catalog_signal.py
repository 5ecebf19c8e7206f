"""What PostgreSQL's change signal costs writers: creates/s of several writer processes.

    .venv/bin/python bench/catalog_signal.py [--writers 1,4] [--files 500] [--durable] [--json]

Each writer is a process with its own Catalog and Namespace creating ``--files`` files in a
directory of its own (SERIALIZABLE, as the catalog always runs), on a throw-away PostgreSQL 15.
Signals compared on the same server:
- ``none``: the change triggers disabled (no cache could be kept: the cost floor);
- ``notify``: what shingle ships, a statement trigger NOTIFYing with the writer's token;
- ``counter``: the same triggers bumping one counter row instead (a reader that sees the counter
  unchanged knows nothing changed): every two overlapping writers conflict on that row.
NOTIFY takes a cluster-wide lock from just before commit until the commit is done, so the
commits of notifying transactions do not overlap: ``--durable`` (fsync and synchronous_commit
on; the test server has them off) shows what that costs when each commit waits for a flush.
``rollbacks`` is PostgreSQL's count of rolled-back transactions in the run (serialization
failures that Catalog.run retried).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from engine.catalog import Catalog, upgrade  # noqa: E402
from engine.namespace import ROOT, Namespace  # noqa: E402

TRIGGER = "shingle_catalog_changed"
COUNTER_FUNCTION = """
CREATE OR REPLACE FUNCTION shingle_catalog_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE bench_change_counter SET n = n + 1 WHERE id = 1;
    RETURN NULL;
END
$$
"""


def _libpq(url: str) -> str:
    from sqlalchemy import make_url

    return make_url(url).set(drivername="postgresql").render_as_string(False)


def _set_signal(url: str, signal: str, notify_function: str) -> None:
    import psycopg

    with psycopg.connect(_libpq(url), autocommit=True) as conn:
        tables = [
            row[0]
            for row in conn.execute(
                "SELECT c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
                "WHERE t.tgname = %s",
                (TRIGGER,),
            )
        ]
        conn.execute(
            "CREATE TABLE IF NOT EXISTS bench_change_counter (id int PRIMARY KEY, n bigint)"
        )
        conn.execute("INSERT INTO bench_change_counter VALUES (1, 0) ON CONFLICT DO NOTHING")
        conn.execute(COUNTER_FUNCTION if signal == "counter" else notify_function)
        action = "DISABLE" if signal == "none" else "ENABLE"
        for table in tables:
            conn.execute(f'ALTER TABLE "{table}" {action} TRIGGER {TRIGGER}')


def _notify_function(url: str) -> str:
    """The shipped trigger function's definition, to put back after the counter variant."""
    import psycopg

    with psycopg.connect(_libpq(url)) as conn:
        row = conn.execute("SELECT pg_get_functiondef(%s::regprocedure)", (f"{TRIGGER}()",))
        return row.fetchone()[0]


def _rollbacks(url: str) -> int:
    import psycopg

    with psycopg.connect(_libpq(url)) as conn:
        return conn.execute(
            "SELECT xact_rollback FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()[0]


def _writer(url: str, name: str, files: int, start, results) -> None:
    catalog = Catalog(url)
    ns = Namespace(catalog)
    d = ns.mkdir(ROOT, ns.root_ino, name).ino
    start.wait()
    began = time.perf_counter()
    for i in range(files):
        ns.create(ROOT, d, f"f{i:06d}")
    results.put(time.perf_counter() - began)
    catalog.close()


def run(url: str, writers: int, files: int, tag: str) -> dict:
    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Barrier(writers + 1), ctx.Queue()
    procs = [
        ctx.Process(target=_writer, args=(url, f"{tag}-{k}", files, start, results))
        for k in range(writers)
    ]
    for proc in procs:
        proc.start()
    before = _rollbacks(url)
    start.wait()
    began = time.perf_counter()
    times = [results.get(timeout=600) for _ in procs]
    wall = time.perf_counter() - began
    for proc in procs:
        proc.join()
    return {
        "creates_per_s": round(writers * files / wall, 1),
        "slowest_writer_s": round(max(times), 2),
        "rollbacks": _rollbacks(url) - before,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writers", default="1,4")
    parser.add_argument("--files", type=int, default=500)
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--durable", action="store_true", help="fsync and synchronous_commit on (off by default)"
    )
    args = parser.parse_args()
    from pgserver import PostgresServer

    durable = {"fsync": "on", "synchronous_commit": "on"} if args.durable else {}
    server = PostgresServer(durable).start()
    report: dict = {"files_per_writer": args.files, "durable": args.durable}
    try:
        url = server.create_database()
        upgrade(url)
        notify_function = _notify_function(url)
        for writers in [int(w) for w in args.writers.split(",")]:
            for signal in ("none", "notify", "counter"):
                _set_signal(url, signal, notify_function)
                result = run(url, writers, args.files, f"{signal}-{writers}")
                report[f"{signal}.writers_{writers}"] = result
                print(f"{signal:8} writers={writers}: {result}", file=sys.stderr, flush=True)
        _set_signal(url, "notify", notify_function)
    finally:
        server.stop()
    print(json.dumps(report, indent=2 if args.json else None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
