"""Operations on whole hosts (engine/lifecycle/hostops.py) over real agent processes: a host lost
is one event and one alert, whichever head saw it and however long it stays away; a host
declared gone for good is rebuilt onto the others to full redundancy and spread, paced; a host
drained and removed leaves every byte readable with its agent stopped; and the refusals (an
unknown host, a lost host drained, an answering host removed, too few hosts left). A host lost
longer than cluster.host_gone_after_s is removed by a job queued once, whose progress and rate
the hosts' read model shows while it runs; a host is replaced by a new one."""

from __future__ import annotations

import hashlib
import json
import os
import time

import pytest
from agenthelpers import STRIPE, AgentHead, MiB
from test_agents import hosts_of_stripes, make, wait_for

from engine.admin import events, fsck, jobs
from engine.admin import hosts as hosts_view
from engine.admin.alerts import AlertMonitor, AlertService, AlertSettings, default_sources
from engine.base import errors
from engine.catalog.models import Drive
from engine.lifecycle import drives as drive_states
from engine.lifecycle import hostops
from engine.lifecycle.jobs import runners as lifecycle_runners

DRIVES = Drive.__table__
KiB = 1 << 10
# 4+2 keeps the agents few: 8 hosts, one lost and one drained still leave one fragment per host
FOUR_TWO = {
    "warm": {"k": 4, "m": 2, "fragment_size": 64 * KiB},
    "cold": {"k": 4, "m": 2, "fragment_size": 64 * KiB},
    "hot": {"fragment_size": 64 * KiB},
}
RATE = 2 * MiB  # bytes/s: the pace the rebuild and the drain are given


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check_every_byte(head, files: dict[str, tuple[int, str, int]]) -> None:
    head.data.reader.drop_cache()
    for name, (ino, digest, size) in files.items():
        assert sha(head.ns.read(ino, 0, size + 1)) == digest, name


def states_of(catalog, drive_ids) -> list[str]:
    return catalog.read(
        lambda conn: (
            conn.execute(
                DRIVES.select().with_only_columns(DRIVES.c.state).where(DRIVES.c.id.in_(drive_ids))
            )
            .scalars()
            .all()
        )
    )


def host_events(catalog, kind: str, host: str) -> list:
    return [e for e in events.recent(catalog, 1000, kind_prefix=kind) if e.details["host"] == host]


def host_alerts(catalog, host: str) -> list:
    return [a for a in AlertService(catalog).list() if a.key == f"host:{host}"]


def taken_back(head, drive_id: int) -> bool:
    head.data.check_drives()
    return head.data.space.drives[drive_id].state == "online"


def missing(head, drive_ids) -> bool:
    head.data.check_drives()
    return states_of(head.catalog, drive_ids) == ["missing"] * len(drive_ids)


def one_host_per_fragment(catalog) -> bool:
    layout = hosts_of_stripes(catalog)
    return bool(layout) and all(set(c.values()) == {1} and len(c) == 6 for c in layout.values())


def test_a_lost_host_is_one_alert_then_rebuilt_elsewhere_then_another_drained_and_stopped(
    agents, sqlite_catalog
):
    hosts = agents(8)
    lost, drained, third = hosts[0], hosts[1], hosts[2]
    head = AgentHead(sqlite_catalog, hosts, policies=FOUR_TWO)
    second = AgentHead(sqlite_catalog, [], policies=FOUR_TWO)  # another head, same catalog
    try:
        files = {}
        for i in range(6):
            data = os.urandom(4 * STRIPE + 999 * i)
            files[f"f{i}"] = (make(head, f"f{i}", data), sha(data), len(data))
        assert one_host_per_fragment(sqlite_catalog)
        lost_drives = [d for d, h in zip(head.drive_ids, hosts, strict=True) if h is lost]
        monitors = [
            AlertMonitor(sqlite_catalog, AlertSettings(), sources=default_sources())
            for _ in (head, second)
        ]

        # -- lost: both heads see it, each looks many times; one event, one alert ------------
        lost.kill()
        check_every_byte(head, files)  # decoded from the other hosts
        for _ in range(3):
            for h in (head, second):
                h.data.check_drives()
            for monitor in monitors:
                monitor.tick(force=True)
        assert states_of(sqlite_catalog, lost_drives) == ["missing"]
        assert len(host_events(sqlite_catalog, "host.lost", lost.name)) == 1
        (alert,) = host_alerts(sqlite_catalog, lost.name)
        assert alert.kind == "host_lost" and alert.state == "active"
        assert f"host {lost.name} does not answer" in alert.message
        open_kinds = [a.kind for a in AlertService(sqlite_catalog).list(("active",))]
        assert "drive_failed" not in open_kinds  # its drive is the host's alert, not another
        with pytest.raises(errors.InvalidArgument, match="no drive of it answers"):
            hostops.start_drain_host(sqlite_catalog, lost.name, head.policies, actor="test")

        # -- back: one host.back, the alert cleared ------------------------------------------
        lost.start().wait_ready()
        for h in (head, second):
            wait_for(lambda h=h: taken_back(h, lost_drives[0]), 60)
        for monitor in monitors:
            monitor.tick(force=True)
        assert len(host_events(sqlite_catalog, "host.back", lost.name)) == 1
        assert [a.state for a in host_alerts(sqlite_catalog, lost.name)] == ["cleared"]

        # -- lost again, then declared gone for good: rebuilt onto the 7 others, paced --------
        second.close()
        lost.kill()
        wait_for(lambda: missing(head, lost_drives))
        assert len(host_events(sqlite_catalog, "host.lost", lost.name)) == 2  # one per episode
        with pytest.raises(errors.InvalidArgument, match="drain it first"):
            hostops.start_remove_host(sqlite_catalog, drained.name, head.policies, actor="t")
        # gone for good after cluster.host_gone_after_s: one host-remove job, queued once
        monitors[0].tick(force=True)
        time.sleep(0.05)
        (job_id,) = hostops.queue_gone_hosts(sqlite_catalog, 0.01)
        assert hostops.queue_gone_hosts(sqlite_catalog, 0.01) == []
        job = jobs.claim(sqlite_catalog, job_id)
        assert job is not None and job.params["host"] == lost.name
        seen = []  # what status shows while it runs

        def progress(done, total, message):
            jobs.progress_writer(sqlite_catalog, job_id, every_s=0)(done, total, message)
            view = hosts_view.cluster(sqlite_catalog, 4, 2)
            seen.append(view.operation(view.host(lost.name)))

        runner = lifecycle_runners(head.ns, head.data, sqlite_catalog, rebuild_bytes_per_s=RATE)
        started = time.monotonic()
        result = runner["host-remove"](job.params, progress, "schedule")
        took = time.monotonic() - started
        jobs.finish(sqlite_catalog, job_id, ok=True, result=result)
        moving = [op for op in seen if op and op["done_bytes"]]
        assert moving and all(op["kind"] == "host-remove" for op in moving)
        assert 0 < moving[-1]["mb_per_s"] and moving[-1]["total_bytes"] > 0
        assert result["fragments_rebuilt"] > 0 and result["unplaced"] == 0
        assert not result["unrecoverable"] and not result["warnings"]
        assert result["written_by_host"] and lost.name not in result["written_by_host"]
        # paced: the limiter lets a job run ahead by half a second, no more
        assert took >= result["bytes_written"] / RATE - 0.6, (took, result["bytes_written"])
        print(
            f"\nrebuild of a lost host: {result['bytes_written'] / MiB:.2f} MiB in {took:.2f} s "
            f"= {result['bytes_written'] / MiB / took:.2f} MiB/s (paced at {RATE / MiB:g})"
        )
        assert states_of(sqlite_catalog, lost_drives) == ["removed"]
        assert drive_states.redundancy_status(sqlite_catalog).reduced == 0
        assert one_host_per_fragment(sqlite_catalog)  # 7 hosts left: still one per host
        assert len(host_events(sqlite_catalog, "host.gone", lost.name)) == 1
        assert len(host_events(sqlite_catalog, "host.removed", lost.name)) == 1
        monitors[0].tick(force=True)
        assert {a.state for a in host_alerts(sqlite_catalog, lost.name)} == {"cleared"}
        head.restart()  # every fragment from the agents again
        check_every_byte(head, files)
        assert fsck.check(sqlite_catalog, head.ns.root_ino).clean

        # -- drain: moved off, then its agent stopped; every byte reads ----------------------
        with pytest.raises(errors.NotFound, match="no host 'nosuch'"):
            hostops.start_drain_host(sqlite_catalog, "nosuch", head.policies, actor="test")
        started = time.monotonic()
        result = hostops.drain_host(
            head.data, sqlite_catalog, drained.name, actor="test", bytes_per_s=RATE
        )
        took = time.monotonic() - started
        assert result["fragments_moved"] > 0 and result["fragments_left"] == 0
        assert not result["warnings"]
        print(
            f"drain of a host: {result['bytes_written'] / MiB:.2f} MiB in {took:.2f} s "
            f"= {result['bytes_written'] / MiB / took:.2f} MiB/s (paced at {RATE / MiB:g})"
        )
        assert len(host_events(sqlite_catalog, "host.drained", drained.name)) == 1
        assert one_host_per_fragment(sqlite_catalog)  # 6 hosts, 6 fragments: one each
        drained.kill()
        head.restart()
        check_every_byte(head, files)
        assert drive_states.redundancy_status(sqlite_catalog).reduced == 0
        assert fsck.check(sqlite_catalog, head.ns.root_ino).clean
        view = hosts_view.cluster(sqlite_catalog, 4, 2)  # what status shows: nothing waits
        assert drained.name not in {h.name for h in view.hosts} and view.may_lose == 2
        assert all(h.waiting_fragments == 0 and view.operation(h) is None for h in view.hosts)

        # -- replace: a new host joins, the old one is drained onto the others ---------------
        (new,) = agents(1)
        result = hostops.replace_host(head.data, sqlite_catalog, third.name, new.address)
        assert result["joined"]["host"] == new.name and len(result["joined"]["drives_added"]) == 1
        assert result["host"] == third.name and result["fragments_left"] == 0
        assert not result["warnings"]
        assert one_host_per_fragment(sqlite_catalog)
        view = hosts_view.cluster(sqlite_catalog, 4, 2)
        assert third.name not in {h.name for h in view.hosts} and view.host(new.name).fragments
        third.kill()
        check_every_byte(head, files)

        # -- too few hosts left: 5 drives cannot hold a 6-wide stripe ------------------------
        before = states_of(sqlite_catalog, head.drive_ids)
        with pytest.raises(errors.InvalidArgument, match="needs 6 different drives"):
            hostops.start_drain_host(sqlite_catalog, hosts[3].name, head.policies, actor="test")
        assert states_of(sqlite_catalog, head.drive_ids) == before  # nothing changed
    finally:
        second.close()
        head.close()


def test_cluster_commands_join_status_drain_remove_and_refuse_bad_input(agents, tmp_path, capsys):
    from test_agents import shingle

    from appliance import config as config_mod
    from appliance.cli import main
    from engine.catalog import Catalog

    home = tmp_path / "appliance"
    init = ["init", str(home), "--drive-size", "32MiB", "--zone-size", "4MiB", "--no-preallocate"]
    assert main(init) == 0
    config = str(home / "shingle.toml")
    # zones of 4 MiB hold the default 1 MiB fragments and their headers
    first, second = agents(2, extra=["--drive-size", "32MiB", "--zone-size", "4MiB"])
    (small,) = agents(1)  # zones of 1 MiB: too small for them

    def cluster(*args, code=0) -> str:
        """`shingle cluster ARGS` in this process (quicker than a new one): its output, or
        with a ``code`` other than 0, what it told stderr."""
        capsys.readouterr()
        returned = main(["-c", config, "cluster", *args])
        said = capsys.readouterr()
        assert returned == code, (args, said)
        return said.err if code else said.out

    joined = cluster("join", first.address)
    assert f"1 drives of agent {first.address} (host {first.name}) recorded" in joined
    # `drives-attach` is the same command by its first name (and the entry point works)
    again = shingle("-c", config, "drives-attach", first.address).stdout
    assert "all known already" in again
    cluster("join", second.address)
    report = json.loads(cluster("status", "--json"))
    by_name = {h["name"]: h for h in report["hosts"]}
    assert set(by_name) == {"local", first.name, second.name}
    assert by_name[first.name]["state"] == "up" and by_name[first.name]["address"] == first.address
    shown = cluster("status")
    assert "hosts     3;" in shown and f"{second.address}" in shown

    # bad input: one line and the exit code (main catches nothing else), nothing changed
    for args, code, said in (
        (("drain", "nosuch"), 1, "no host 'nosuch'"),
        (("remove", "nosuch"), 1, "no host 'nosuch'"),
        (("drain",), 2, "cluster drain HOST"),
        (("join", "no-port-here"), 2, "expected an agent's HOST:PORT"),
        (("join", "127.0.0.1:1"), 1, "agent 127.0.0.1:1 unreachable"),
        (("join", small.address), 1, "zones of 1048576 bytes; the band classes' largest"),
        (("drain", first.name, "--rate", "0"), 2, "--rate 0.0: expected MiB/s above 0"),
        (("init", "--etcd", "ftp://x"), 2, "expected comma-separated http://HOST:PORT"),
        (("init", "--etcd", "http://127.0.0.1:1"), 2, "catalog is SQLite"),
    ):
        assert said in cluster(*args, code=code), args
    assert "draining" not in cluster("status")

    # remove: a host that answers and holds nothing goes at once
    removed = cluster("remove", second.name, "--rate", "50")
    assert "host-remove job" in removed and "done" in removed
    report = json.loads(cluster("status", "--json"))
    assert {h["name"] for h in report["hosts"]} == {"local", first.name}
    assert "out of the pool already" in cluster("remove", second.name, code=1)
    # one of the head's drives failed: 10 drives take writes, a 10-wide stripe's minimum
    catalog = Catalog(config_mod.load(config).catalog_url)
    try:
        drive_states.fail_drive(catalog, 1, actor="test")
    finally:
        catalog.close()
    assert "needs 10 different drives" in cluster("drain", first.name, code=1)
    assert "draining" not in cluster("status")


def test_two_heads_on_postgresql_seeing_a_host_of_two_drives_go_at_once_record_it_once(
    agents, postgres_server
):
    """The dedup rests on the catalog: the drive's change and the host check share a
    serializable transaction. Two heads (each its own connections, as two processes) look at
    the same lost host at the same moment, several times; one event and one alert, not one per
    drive or head, and its drives raise no drive alert of their own."""
    import threading

    from engine.catalog import Catalog, upgrade

    url = postgres_server.create_database()
    upgrade(url)
    hosts = agents(3, drives=2)
    catalogs = [Catalog(url), Catalog(url)]
    heads = [
        AgentHead(catalogs[0], hosts, policies=FOUR_TWO),
        AgentHead(catalogs[1], [], policies=FOUR_TWO),
    ]
    monitors = [AlertMonitor(c, AlertSettings(), sources=default_sources()) for c in catalogs]
    try:
        gone = hosts[1]
        gone.kill()
        start = threading.Barrier(2)

        def look(head, monitor):
            for _ in range(3):
                start.wait()
                head.data.check_drives()
                start.wait()
                monitor.tick(force=True)

        threads = [
            threading.Thread(target=look, args=pair) for pair in zip(heads, monitors, strict=True)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        catalog = catalogs[0]
        gone_drives = [d.id for d in hosts_view.cluster(catalog, 4, 2).host(gone.name).drives]
        assert states_of(catalog, gone_drives) == ["missing", "missing"]
        assert len(host_events(catalog, "host.lost", gone.name)) == 1
        (alert,) = host_alerts(catalog, gone.name)
        assert alert.state == "active" and alert.severity == "critical"
        assert [a.kind for a in AlertService(catalog).list(("active",))].count("host_lost") == 1
        assert "drive_failed" not in {a.kind for a in AlertService(catalog).list()}
        assert hosts_view.cluster(catalog, 4, 2).host(gone.name).state == "lost"
    finally:
        for head in heads:
            head.close()
        for catalog in catalogs:
            catalog.close()


def test_cluster_init_makes_a_head_of_a_cluster_once_etcd_answers(
    postgres_server, tmp_path, capsys
):
    from etcdserver import EtcdCluster, etcd_installed

    from appliance import config as config_mod
    from appliance.cli import main
    from engine.catalog import Catalog

    if not etcd_installed():
        pytest.skip("etcd-server is not installed")
    url = postgres_server.create_database()
    home = tmp_path / "head"
    made = ["init", str(home), "--catalog", url, "--drive-size", "32MiB", "--zone-size", "4MiB"]
    assert main([*made, "--no-preallocate"]) == 0
    config = str(home / "shingle.toml")
    with EtcdCluster(1) as etcd:
        urls = ",".join(etcd.endpoints)
        for _ in range(2):  # again: the same lines set, not added twice
            capsys.readouterr()
            assert main(["-c", config, "cluster", "init", "--etcd", urls, "--name", "head-a"]) == 0
            assert "restart the daemon" in capsys.readouterr().out
        loaded = config_mod.load(config)
        assert loaded.get("cluster.etcd_endpoints") == urls
        assert loaded.get("cluster.name") == "head-a"
        assert (home / "shingle.toml").read_text().count("etcd_endpoints =") == 1
    capsys.readouterr()
    assert main(["-c", config, "cluster", "init", "--etcd", urls]) == 1  # etcd is gone now
    assert "does not answer" in capsys.readouterr().err
    catalog = Catalog(url)
    try:
        said = events.recent(catalog, 10, kind_prefix="cluster.init")
        assert len(said) == 2 and said[0].details["name"] == "head-a"
    finally:
        catalog.close()
