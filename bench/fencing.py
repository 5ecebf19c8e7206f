"""The maintenance leader: takeover time after a kill -9, and what the fence costs a transaction.

    .venv/bin/python bench/fencing.py [--trials 7] [--ttls 2,5] [--txns 3000] [--json]

Takeover: a real etcd (one member, tests/etcdserver.py); a leader campaigns in a child process
and takes office, a second one campaigns in this process; the child is killed -9 at a random
moment of its keepalive cycle and the time until the second holds office is measured. The
dead leader's lease has between 2/3 of the TTL and the whole TTL left (keepalives every TTL/3),
etcd checks expiry every 500 ms, and the successor's watch sees the key go.

Fence cost: one write transaction (a settings row deleted and inserted, as small as a
maintenance write gets: the worst case for the ratio) and one of 50 rows, run unfenced and
inside ``catalog.fenced(token)``, alternating in rounds, on SQLite (synchronous=NORMAL) and on
a throw-away PostgreSQL 15 (fsync off, as the test server runs). Wall and this process's CPU per
transaction (PostgreSQL's own CPU is not in it). ``contextvar_ns``: what every write transaction
of a single host pays for the fence's existence (one ContextVar.get).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
import timeit
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from engine.catalog import Catalog, upgrade  # noqa: E402
from engine.catalog import fence as leader_fence  # noqa: E402
from engine.catalog.database import _FENCE, sql  # noqa: E402
from engine.cluster.etcd import EtcdClient  # noqa: E402
from engine.cluster.leader import FencedLeader  # noqa: E402


def takeover(ttl_s: int, trials: int) -> dict:
    from etcdserver import EtcdCluster, LeaderProcess

    times = []
    with EtcdCluster(1) as etcd:
        for trial in range(trials):
            doomed = LeaderProcess(etcd.endpoints, f"doomed{trial}", ttl_s)
            successor = FencedLeader(EtcdClient(etcd.endpoints), f"next{trial}", ttl_s=ttl_s)
            try:
                doomed.wait_elected()
                successor.start()
                time.sleep(ttl_s / 3 + random.uniform(0, ttl_s / 3))  # a random keepalive phase
                killed = time.monotonic()
                doomed.kill()
                if successor.wait_elected(3 * ttl_s) is None:
                    raise RuntimeError(f"no takeover within {3 * ttl_s} s (TTL {ttl_s} s)")
                times.append(time.monotonic() - killed)
            finally:
                doomed.kill()
                successor.stop(resign=True)
    return {
        "ttl_s": ttl_s,
        "trials": trials,
        "median_s": round(statistics.median(times), 3),
        "min_s": round(min(times), 3),
        "max_s": round(max(times), 3),
    }


def fence_cost(catalog: Catalog, txns: int, rows: int) -> dict:
    token = 7
    assert leader_fence.advance(catalog, token, "bench")

    def write(conn):
        for i in range(rows):
            key = f"bench.fence.{i}"
            sql(conn, "DELETE FROM settings WHERE key = ?", (key,)).close()
            sql(conn, "INSERT INTO settings (key, value) VALUES (?, ?)", (key, "1")).close()

    def plain(count):
        for _ in range(count):
            catalog.run(write, tracked=True)

    def fenced(count):
        with catalog.fenced(token, lambda: True):
            for _ in range(count):
                catalog.run(write, tracked=True)

    plain(50)  # warm: connections, statement caches
    fenced(50)
    measured: dict[str, list[float]] = {"plain": [0.0, 0.0], "fenced": [0.0, 0.0]}
    rounds = 10
    for _ in range(rounds):  # alternating, so drift of the machine hits both alike
        for name, fn in (("plain", plain), ("fenced", fenced)):
            wall, cpu = time.perf_counter(), time.process_time()
            fn(txns // rounds)
            measured[name][0] += time.perf_counter() - wall
            measured[name][1] += time.process_time() - cpu
    per = {name: (w / txns * 1e6, c / txns * 1e6) for name, (w, c) in measured.items()}
    return {
        "rows_per_txn": rows,
        "plain_wall_us": round(per["plain"][0], 1),
        "fenced_wall_us": round(per["fenced"][0], 1),
        "plain_cpu_us": round(per["plain"][1], 1),
        "fenced_cpu_us": round(per["fenced"][1], 1),
        "wall_ratio": round(per["fenced"][0] / per["plain"][0], 2),
        "cpu_ratio": round(per["fenced"][1] / per["plain"][1], 2),
    }


def catalog_costs(url: str, txns: int) -> list[dict]:
    upgrade(url)
    catalog = Catalog(url)
    try:
        return [fence_cost(catalog, txns, 1), fence_cost(catalog, max(txns // 10, 100), 50)]
    finally:
        catalog.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=7)
    parser.add_argument("--ttls", default="2,5")
    parser.add_argument("--txns", type=int, default=3000)
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results: dict = {"takeover": [], "fence": {}}
    results["contextvar_ns"] = round(
        min(timeit.repeat(_FENCE.get, number=200_000, repeat=5)) / 200_000 * 1e9, 1
    )
    with tempfile.TemporaryDirectory() as tmp:
        results["fence"]["sqlite"] = catalog_costs(f"sqlite:///{tmp}/catalog.db", args.txns)
    if not args.no_postgres:
        from pgserver import PostgresServer

        server = PostgresServer().start()
        try:
            results["fence"]["postgresql"] = catalog_costs(server.create_database(), args.txns)
        finally:
            server.stop()
    for ttl in (int(t) for t in args.ttls.split(",")):
        results["takeover"].append(takeover(ttl, args.trials))
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(
        f"single host: a write transaction reads the fence context in {results['contextvar_ns']} ns"
    )
    for db, runs in results["fence"].items():
        for r in runs:
            print(
                f"{db:<10} {r['rows_per_txn']:>2} rows/txn: plain {r['plain_wall_us']} us "
                f"(CPU {r['plain_cpu_us']}), fenced {r['fenced_wall_us']} us "
                f"(CPU {r['fenced_cpu_us']}): x{r['wall_ratio']} wall, x{r['cpu_ratio']} CPU"
            )
    for t in results["takeover"]:
        print(
            f"takeover after kill -9, TTL {t['ttl_s']} s: median {t['median_s']} s "
            f"(range {t['min_s']}-{t['max_s']}, {t['trials']} trials)"
        )


if __name__ == "__main__":
    main()
