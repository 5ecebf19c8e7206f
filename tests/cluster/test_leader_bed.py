"""A maintenance leader cut off from etcd cannot commit, on the test bed: real etcd members and
PostgreSQL under Patroni, each in a network namespace of its own, and two leader processes in
hosts of their own (tests/cluster/leader_writer.py).

The first leader reaches only one etcd member, and that member's link is cut: its lease runs
out in etcd and the second leader (reaching the other two members) takes office and raises the
catalog's fence. The first one keeps writing as a leader that never noticed (it ignores its
lease clock) and still reaches PostgreSQL: from the moment its successor took office, every
write it starts fails on the fence, and every write it was told committed is in the catalog."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg
from test_catalog_failover import new_database

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
WRITER = HERE / "leader_writer.py"
TTL_S = 4


def records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line being written
    return out


def wait_for(predicate, timeout_s: float, what: str, procs=()):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        for proc in procs:
            if proc.poll() is not None:
                raise AssertionError(f"{what}: a leader process exited ({proc.returncode})")
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout_s} s: {what}")


def test_a_leader_cut_off_from_etcd_cannot_commit(healed_bed, tmp_path):
    bed = healed_bed
    primary = bed.wait_primary()
    bed.wait_healthy()
    database = new_database(bed, primary)
    with psycopg.connect(bed.socket_conninfo(primary, database), autocommit=True) as conn:
        conn.execute("CREATE TABLE leader_writes (holder text, seq integer)")
    for host in ("lead1", "lead2"):
        if host not in bed.hosts:
            bed.add_host(host)
    cut_member = bed.etcd_names[0]
    first_endpoints = bed.etcd_endpoints[:1]
    other_endpoints = bed.etcd_endpoints[1:]
    url = bed.postgres_url(database)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    logs = {name: tmp_path / f"{name}.jsonl" for name in ("lead1", "lead2")}
    procs: dict[str, subprocess.Popen] = {}

    def start(name: str, endpoints: list[str], *extra: str) -> None:
        procs[name] = bed.run(
            name,
            [sys.executable, str(WRITER), ",".join(endpoints), name, url, str(logs[name]),
             "--ttl", str(TTL_S), *extra],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip

    try:
        start("lead1", first_endpoints, "--ignore-lease")
        wait_for(
            lambda: sum("ok" in r for r in records(logs["lead1"])) >= 10,
            60,
            "the first leader writing",
            procs.values(),
        )
        start("lead2", other_endpoints)
        time.sleep(1.0)
        assert not any("elected" in r for r in records(logs["lead2"])), "two leaders at once"
        cut_at = time.time()
        bed.cut_link(cut_member)
        elected = wait_for(
            lambda: next((r for r in records(logs["lead2"]) if "elected" in r), None),
            TTL_S + 20,  # the lease, and a raft election if the cut member led etcd
            "the second leader taking office",
            procs.values(),
        )
        wait_for(
            lambda: sum("fenced" in r for r in records(logs["lead1"])) >= 10,
            30,
            "the cut-off leader's writes failing on the fence",
            procs.values(),
        )
    finally:
        for proc in procs.values():
            try:
                proc.communicate(timeout=30)  # closes stdin: the writer stops
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
    for name, proc in procs.items():
        assert proc.returncode == 0, f"{name}: {proc.stderr and proc.stderr.read()}"

    first, second = records(logs["lead1"]), records(logs["lead2"])
    took_office = elected["t"]
    assert elected["elected"] > first[0]["elected"], "the successor's token must be higher"
    late = [r for r in first if "ok" in r and r["t0"] >= took_office]
    assert not late, f"the cut-off leader committed after its successor took office: {late[:3]}"
    errors = [r for r in first + second if "error" in r]
    assert not errors, f"writes failed with other than the fence: {errors[:3]}"
    assert any("ok" in r for r in second), "the new leader did not write"
    assert took_office - cut_at < TTL_S + 20

    acknowledged = {(name, r["ok"]) for name, recs in (("lead1", first), ("lead2", second))
                    for r in recs if "ok" in r}  # fmt: skip
    with psycopg.connect(bed.socket_conninfo(bed.wait_primary(), database)) as conn:
        rows = set(conn.execute("SELECT holder, seq FROM leader_writes").fetchall())
    assert rows == acknowledged, "the catalog holds other writes than those acknowledged"
