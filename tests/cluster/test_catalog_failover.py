"""The catalog on PostgreSQL under Patroni: its primary lost while a head writes.

A head (catalog_writer.py, in a host of its own) creates files through the shingle namespace
with four writers on a catalog URL naming every member (libpq multi-host,
target_session_attrs=read-write). The primary's host is then killed, or its link cut. Every
create the head acknowledged must be in the catalog afterwards, on the new primary and again
once the old one has rejoined; a create that failed must have failed with the catalog's own
error (CatalogUnavailable / CatalogUnreachable), never another; writes must resume on their own
(no restart of the head) on a new primary that has a synchronous standby again, and the head's
change watch must follow. The failover time printed is from the failure to the first
acknowledged create that started after it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psycopg
import psycopg.conninfo
import pytest
from bed import root_network
from pgserver import free_port

from engine.catalog import Catalog, upgrade
from engine.namespace import ROOT, Namespace

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
WRITER = HERE / "catalog_writer.py"
HEAD = "head"
WARM_UP_ACKS = 40  # acknowledged before the failure: the writers are in full swing
AFTER_ACKS = 40  # acknowledged after it: writes resumed on the new primary
RESUME_TIMEOUT_S = 90.0
CATALOG_ERRORS = {"CatalogUnavailable", "CatalogUnreachable"}


@dataclass
class Outcome:
    acked: dict[str, float]  # name -> when acknowledged
    started: dict[str, float]  # name -> when its create started (acknowledged ones)
    errors: list[dict]
    watch_caught_up: bool | None


def new_database(bed, primary: str) -> str:
    """A fresh, migrated catalog database with its namespace root, made through the primary's
    Unix socket."""
    name = "failover_" + uuid.uuid4().hex[:10]
    with psycopg.connect(bed.socket_conninfo(primary), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = bed.socket_url(primary, name)
    upgrade(url)
    catalog = Catalog(url)
    try:
        Namespace(catalog)  # makes the root, which the writers then share
    finally:
        catalog.close()
    return name


def names_in_root(bed, member: str, database: str) -> set[str]:
    catalog = Catalog(bed.socket_url(member, database))
    try:
        namespace = Namespace(catalog)
        names: set[str] = set()
        cookie, done = 0, False
        while not done:
            entries, done = namespace.readdir(ROOT, namespace.root_ino, cookie, 4096)
            names.update(entry.name for entry in entries)
            if entries:
                cookie = entries[-1].cookie
        return names
    finally:
        catalog.close()


def read_outcome(path: Path) -> Outcome:
    acked: dict[str, float] = {}
    started: dict[str, float] = {}
    errors: list[dict] = []
    watch = None
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if "ack" in record:
            acked[record["ack"]] = record["t"]
            started[record["ack"]] = record["t0"]
        elif "error" in record:
            errors.append(record)
        elif record.get("done"):
            watch = record["watch"]
    return Outcome(acked, started, errors, watch)


def count_acks(path: Path, after: float = float("-inf")) -> int:
    if not path.exists():
        return 0
    count = 0
    for line in path.read_text().splitlines():
        if '"ack"' in line:
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line being written
            if record["t0"] > after:
                count += 1
    return count


def wait_acks(path: Path, writer: subprocess.Popen, want: int, after: float, timeout: float):
    deadline = time.monotonic() + timeout
    while count_acks(path, after) < want:
        if writer.poll() is not None:
            raise AssertionError(
                f"the writer exited ({writer.returncode}): {path.read_text()[-2000:]}"
            )
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def fail_primary_under_writes(bed, tmp_path: Path, fail: Callable[[str], None]) -> dict:
    """Run the head's writers, ``fail(primary)`` in the middle, check what the head was told
    against what the catalog holds; returns the figures."""
    if HEAD not in bed.hosts:
        bed.add_host(HEAD)
    primary = bed.wait_primary()
    bed.wait_healthy()
    standby = bed.sync_standby()
    assert standby is not None and standby != primary
    database = new_database(bed, primary)
    out = tmp_path / "writes.jsonl"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    writer = bed.run(
        HEAD,
        [sys.executable, str(WRITER), bed.postgres_url(database), str(out), "--writers", "4"],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert wait_acks(out, writer, WARM_UP_ACKS, float("-inf"), 60.0), "no writes at first"
        failed_at = time.monotonic()
        fail(primary)
        resumed = wait_acks(out, writer, AFTER_ACKS, failed_at, RESUME_TIMEOUT_S)
    finally:
        try:
            _out, err = writer.communicate(timeout=60)  # closes its stdin: the writers stop
        except subprocess.TimeoutExpired:
            writer.kill()
            _out, err = writer.communicate()
    assert resumed, f"writes did not resume within {RESUME_TIMEOUT_S:.0f} s: {bed.cluster()}"
    assert writer.returncode == 0, err.decode(errors="replace")[-2000:]
    outcome = read_outcome(out)

    others = [kind for kind in (e["kind"] for e in outcome.errors) if kind not in CATALOG_ERRORS]
    assert not others, f"writes failed with other than the catalog's errors: {outcome.errors[:5]}"
    new_primary = bed.wait_primary(other_than=primary)
    assert new_primary == standby, "only the synchronous standby may be promoted"
    bed.wait_for(lambda: bed.sync_standby() not in (None, primary), 60.0, "a new sync standby")
    assert outcome.watch_caught_up, "the head's change watch did not follow the failover"

    present = names_in_root(bed, new_primary, database)
    lost = set(outcome.acked) - present
    assert not lost, f"{len(lost)} acknowledged creates lost: {sorted(lost)[:10]}"

    resumed_at = min(t for name, t in outcome.acked.items() if outcome.started[name] > failed_at)
    failed_names = {e["name"] for e in outcome.errors}
    figures = {
        "failover_s": round(resumed_at - failed_at, 1),
        "acknowledged": len(outcome.acked),
        "lost": len(lost),
        "failed": len(failed_names),
        "failed_but_committed": len(failed_names & present),
        "old_primary": primary,
        "new_primary": new_primary,
    }

    bed.heal()  # the old primary rejoins as a replica; nothing acknowledged may go with it
    back = names_in_root(bed, bed.wait_primary(), database)
    assert not set(outcome.acked) - back, "acknowledged creates lost once the old primary rejoined"
    figures["rejoined_after_restart"] = primary in bed.restarted_stuck
    assert root_network() == bed.root_network_before, "the machine's own network was changed"
    return figures


def test_a_multi_host_url_reaches_the_writable_host_for_the_pool_and_the_change_watch(
    postgres_server,
):
    """libpq multi-host without the bed: the first and last hosts refuse, the middle one
    serves; the change watch must take the same way (it once kept only the last ``host=``)."""
    dead = free_port()
    live = postgres_server.create_database()  # postgresql+psycopg://postgres@127.0.0.1:P/DB
    port, database = live.rsplit(":", 1)[1].split("/")
    upgrade(live)
    url = (
        f"postgresql+psycopg://postgres@/{database}?host=127.0.0.1:{dead}&host=127.0.0.1:{port}"
        f"&host=127.0.0.1:{dead}&target_session_attrs=read-write"
    )
    conninfo = psycopg.conninfo.conninfo_to_dict(Catalog(url).pg_conninfo())
    assert conninfo["host"] == "127.0.0.1,127.0.0.1,127.0.0.1"
    assert conninfo["port"] == f"{dead},{port},{dead}"
    assert conninfo["target_session_attrs"] == "read-write"
    catalog = Catalog(url)
    try:
        namespace = Namespace(catalog)
        namespace.create(ROOT, namespace.root_ino, "through-the-second-host")
        assert catalog.catch_up(timeout=10.0), "the change watch did not connect"
        assert catalog.epoch() is not None
    finally:
        catalog.close()


@pytest.mark.slow
def test_acknowledged_writes_survive_the_primary_host_killed(healed_bed, tmp_path):
    figures = fail_primary_under_writes(healed_bed, tmp_path, healed_bed.kill_host)
    print(f"\ncatalog failover, primary host killed: {json.dumps(figures)}")
    assert figures["lost"] == 0


@pytest.mark.slow
def test_acknowledged_writes_survive_the_primary_link_cut(healed_bed, tmp_path):
    figures = fail_primary_under_writes(healed_bed, tmp_path, healed_bed.cut_link)
    print(f"\ncatalog failover, primary link cut: {json.dumps(figures)}")
    assert figures["lost"] == 0
