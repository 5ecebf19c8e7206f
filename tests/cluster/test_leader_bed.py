"""A maintenance leader cut off from etcd cannot commit, on the test bed: real etcd members and
PostgreSQL under Patroni, each in a network namespace of its own, and two leader processes in
hosts of their own (tests/cluster/leader_writer.py).

The first leader reaches only one etcd member (a raft follower), and that member's link is cut
once the second leader (reaching the other two members) campaigns: the first one's lease runs
out in etcd, and the second takes office and raises the catalog's fence. The first one keeps
writing as a leader that never noticed (it ignores its lease clock) and still reaches
PostgreSQL: from the moment its successor took office, every write it starts fails on the
fence, and every write it was told committed is in the catalog."""

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
STARTED_WITHIN_S = 120  # a writer process's start-up (imports, its first campaign) at load
# the cut-off leader's lease (TTL_S), a raft election that load may bring (each renews every
# lease for a TTL), then the watch, a campaign and the fence's raise: ~5 s quiet, 6-8 s at a
# load of 30 once both processes are up
ELECTED_WITHIN_S = 30


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
    # the first leader's member is a raft follower: cutting etcd's leader would add a raft
    # election, and a new raft leader renews every lease for a whole TTL (etcd 3.4 keeps no
    # remaining TTL), which is etcd's timing, not what this test is about
    leader = wait_for(bed.etcd_leader, 60, "etcd's members agreeing on a raft leader")
    cut = next(i for i, name in enumerate(bed.etcd_names) if name != leader)
    cut_member = bed.etcd_names[cut]
    first_endpoints = [bed.etcd_endpoints[cut]]
    other_endpoints = [e for i, e in enumerate(bed.etcd_endpoints) if i != cut]
    url = bed.postgres_url(database)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    logs = {name: tmp_path / f"{name}.jsonl" for name in ("lead1", "lead2")}
    errs = {name: tmp_path / f"{name}.err" for name in ("lead1", "lead2")}
    procs: dict[str, subprocess.Popen] = {}

    def start(name: str, endpoints: list[str], *extra: str) -> None:
        with open(errs[name], "ab") as err:
            procs[name] = bed.run(
                name,
                [sys.executable, str(WRITER), ",".join(endpoints), name, url, str(logs[name]),
                 "--ttl", str(TTL_S), *extra],
                env=env, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=err,
            )  # fmt: skip

    def explain(what: str) -> str:
        tails = {name: errs[name].read_text(errors="replace")[-3000:] for name in errs}
        try:
            patroni = [(m["name"], m.get("role"), m.get("state")) for m in bed.cluster()]
        except RuntimeError as exc:
            patroni = [str(exc)]
        return (
            f"{what}\netcd: {bed.etcd_status()}\nelections: {bed.etcd_elections()[-9:]}\n"
            f"patroni: {patroni}\n"
        ) + "\n".join(f"--- {name} stderr\n{tail}" for name, tail in tails.items())

    try:
        start("lead1", first_endpoints, "--ignore-lease")
        wait_for(
            lambda: sum("ok" in r for r in records(logs["lead1"])) >= 10,
            STARTED_WITHIN_S,
            "the first leader writing",
            procs.values(),
        )
        start("lead2", other_endpoints)
        # the second is up and campaigning once it lost a round to the first (a Python process
        # importing the catalog's modules takes 10-20 s at a CI load of 30: cut before that,
        # and the election measured its start-up)
        following = wait_for(
            lambda: next((r for r in records(logs["lead2"]) if "following" in r), None),
            STARTED_WITHIN_S,
            "the second leader campaigning",
            procs.values(),
        )
        assert following["following"] == "lead1", following
        assert not any("elected" in r for r in records(logs["lead2"])), "two leaders at once"
        cut_at = time.time()
        bed.cut_link(cut_member)
        elected = wait_for(
            lambda: next((r for r in records(logs["lead2"]) if "elected" in r), None),
            ELECTED_WITHIN_S,
            "the second leader taking office",
            procs.values(),
        )
        print(f"\nthe second leader took office {elected['t'] - cut_at:.2f} s after the cut")
        wait_for(
            lambda: sum("fenced" in r for r in records(logs["lead1"])) >= 10,
            30,
            "the cut-off leader's writes failing on the fence",
            procs.values(),
        )
    except AssertionError as exc:
        raise AssertionError(explain(str(exc))) from None
    finally:
        for proc in procs.values():
            try:
                proc.communicate(timeout=30)  # closes stdin: the writer stops
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
    for name, proc in procs.items():
        assert proc.returncode == 0, explain(f"{name} exited {proc.returncode}")

    first, second = records(logs["lead1"]), records(logs["lead2"])
    took_office = elected["t"]
    assert elected["elected"] > first[0]["elected"], "the successor's token must be higher"
    late = [r for r in first if "ok" in r and r["t0"] >= took_office]
    assert not late, f"the cut-off leader committed after its successor took office: {late[:3]}"
    errors = [r for r in first + second if "error" in r]
    assert not errors, f"writes failed with other than the fence: {errors[:3]}"
    assert any("ok" in r for r in second), "the new leader did not write"

    acknowledged = {(name, r["ok"]) for name, recs in (("lead1", first), ("lead2", second))
                    for r in recs if "ok" in r}  # fmt: skip
    with psycopg.connect(bed.socket_conninfo(bed.wait_primary(), database)) as conn:
        rows = set(conn.execute("SELECT holder, seq FROM leader_writes").fetchall())
    assert rows == acknowledged, "the catalog holds other writes than those acknowledged"
