"""Maintenance in a cluster: jobs run only on the host that leads, and a deposed leader's job
cannot commit; its successor recovers the job and runs it.

Two hosts are two appliances (catalog and namespace, no drives: the jobs here are catalog work)
over one catalog, SQLite or PostgreSQL, each with its own maintenance thread campaigning through
a real etcd (tests/etcdserver.py)."""

from __future__ import annotations

import json
import re
import threading
import time

import pytest
from etcdserver import EtcdCluster, etcd_installed
from sqlalchemy import select

from appliance import config as config_mod
from appliance.maintenance import Maintenance, maintenance_leader
from appliance.runtime import Appliance
from engine.admin import jobs
from engine.base.errors import ConfigError
from engine.catalog import fence as leader_fence
from engine.catalog.models import Setting
from engine.cluster.etcd import EtcdClient

TTL_S = 2
SETTINGS = Setting.__table__

pytestmark = pytest.mark.skipif(not etcd_installed(), reason="etcd-server is not installed")


@pytest.fixture
def etcd_one():
    with EtcdCluster(1) as cluster:
        yield cluster


class Host:
    """One host of the cluster: an appliance and its maintenance thread, whose job runners
    note which host ran each job (the runners themselves are the real ones)."""

    def __init__(self, name: str, url: str, root, endpoints: list[str]):
        root.mkdir()
        self.name = name
        self.config = config_mod.from_dict(
            {
                "appliance": {"data_dir": str(root)},
                "catalog": {"url": url},
                "alerts": {"interval_s": 0},
                "cluster": {
                    "etcd_endpoints": ",".join(endpoints),
                    "name": name,
                    "lease_ttl_s": TTL_S,
                },
            }
        )
        self.appliance = Appliance(self.config, with_data=False)
        self.catalog = self.appliance.catalog
        leader = maintenance_leader(self.config, self.catalog)
        assert leader is not None and leader.name == name
        self.loop = Maintenance(self.appliance, tick_s=0.05, leader=leader)
        self.ran: list[int] = []  # job ids this host ran
        for kind, runner in list(self.loop.runners.items()):
            self.loop.runners[kind] = self._noting(runner)
        self.stopped = False

    def _noting(self, runner):
        def run(params, progress, actor):
            self.ran.append(params.get("job_tag"))
            return runner(params, progress, actor)

        return run

    @property
    def leader(self):
        assert self.loop.leader is not None
        return self.loop.leader

    def start(self) -> Host:
        self.loop.start()
        return self

    def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            self.loop.stop()
            self.loop.join(30)
            self.appliance.close()


@pytest.fixture
def hosts(catalog_url, etcd_one, tmp_path):
    made: list[Host] = []

    def make(name: str) -> Host:
        host = Host(name, catalog_url, tmp_path / name, etcd_one.endpoints)
        made.append(host)
        return host

    yield make
    for host in made:
        host.stop()


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout_s} s: {what}")


def submit(catalog, tag: int) -> int:
    return jobs.submit(catalog, "trash-purge", {"job_tag": tag}, actor="test")


def test_jobs_run_only_on_the_leader_and_move_with_office(hosts):
    a, b, c = hosts("a").start(), hosts("b").start(), hosts("c").start()
    everyone = (a, b, c)
    first = wait_for(
        lambda: next((h for h in everyone if h.leader.token is not None), None), 10, "a leader"
    )
    queued = [submit(a.catalog, tag) for tag in range(6)]
    wait_for(lambda: all(jobs.get(a.catalog, j).finished for j in queued), 30, "jobs done")
    assert [jobs.get(a.catalog, j).state for j in queued] == ["done"] * 6
    assert sorted(first.ran) == list(range(6)), "the leader ran every job"
    assert all(not h.ran for h in everyone if h is not first), "a follower ran a job"
    fence_row = leader_fence.current(a.catalog)
    assert (fence_row.holder, fence_row.token) == (first.name, first.leader.token)

    first.stop()  # resigns: a successor takes office without waiting for the lease
    rest = [h for h in everyone if h is not first]
    second = wait_for(
        lambda: next((h for h in rest if h.leader.token is not None), None), TTL_S + 2, "successor"
    )
    later = [submit(second.catalog, tag) for tag in range(10, 14)]
    wait_for(lambda: all(jobs.get(second.catalog, j).finished for j in later), 30, "jobs done")
    assert sorted(second.ran) == list(range(10, 14))
    assert all(not h.ran for h in rest if h is not second)
    assert leader_fence.current(second.catalog).holder == second.name
    assert leader_fence.current(second.catalog).token > fence_row.token


def test_a_deposed_leaders_job_cannot_commit_and_its_successor_runs_it(hosts, etcd_one):
    old = hosts("old").start()
    old_token = old.leader.wait_elected(10)
    new = hosts("new").start()
    started, release = threading.Event(), threading.Event()
    real_schedule_runner = old.loop.runners["snapshot-schedule"]

    def slow_runner(params, progress, actor):
        """A long job step: its write comes after the lease is gone."""
        started.set()
        release.wait(30)
        old.catalog.run(
            lambda conn: conn.execute(SETTINGS.insert().values(key="old.wrote", value="1"))
        )
        return real_schedule_runner(params, progress, actor)

    old.loop.runners["snapshot-schedule"] = slow_runner
    job_id = jobs.submit(old.catalog, "snapshot-schedule", {}, actor="test")
    assert started.wait(10), "the leader did not start the job"

    EtcdClient(etcd_one.endpoints).revoke(old.leader._lease)  # office lost behind its back
    new_token = new.leader.wait_elected(TTL_S + 2)
    assert new_token is not None and new_token > old_token
    # the successor found the job running and queued it again (it may restart), then ran it
    finished = wait_for(lambda: jobs.get(new.catalog, job_id).finished, 30, "job rerun")
    assert finished
    assert jobs.get(new.catalog, job_id).state == "done"
    assert jobs.get(new.catalog, job_id).attempts == 2

    release.set()  # the old leader's step goes on: its write must not commit
    wait_for(lambda: old.leader.token is None, 5, "the old leader stepping down")
    time.sleep(0.5)
    wrote = new.catalog.read(
        lambda conn: conn.execute(
            select(SETTINGS.c.value).where(SETTINGS.c.key == "old.wrote")
        ).scalar()
    )
    assert wrote is None, "a deposed leader committed"
    job = jobs.get(new.catalog, job_id)
    assert job.state == "done", "the deposed leader overwrote its successor's record of the job"


def test_without_cluster_config_maintenance_runs_unfenced(catalog_url, tmp_path):
    """The single-host default: no etcd, no leader, jobs run, and no transaction reads the
    fence (the row stays as the migration made it)."""
    config = config_mod.from_dict(
        {
            "appliance": {"data_dir": str(tmp_path)},
            "catalog": {"url": catalog_url},
            "alerts": {"interval_s": 0},
        }
    )
    with Appliance(config, with_data=False) as appliance:
        assert maintenance_leader(config, appliance.catalog) is None
        loop = Maintenance(appliance, tick_s=0.05)
        assert loop.leader is None
        job_id = submit(appliance.catalog, 1)
        loop.start()
        try:
            wait_for(lambda: jobs.get(appliance.catalog, job_id).finished, 30, "job done")
        finally:
            loop.stop()
            loop.join(30)
        assert jobs.get(appliance.catalog, job_id).state == "done"
        assert leader_fence.current(appliance.catalog).to_dict() == {
            "token": 0,
            "holder": "",
            "since_ns": 0,
        }


def test_a_leader_the_catalog_fences_steps_down_and_runs_nothing(hosts):
    """The fence raised past this leader while its lease lives (a successor elected through
    another etcd, say): its next write fails, it steps down, and winning the key again does not
    let it run a job, since its new token is still below the fence."""
    host = hosts("fenced").start()
    token = host.leader.wait_elected(10)
    assert leader_fence.advance(host.catalog, 10**9, "elsewhere")
    job_id = submit(host.catalog, 99)  # the leader's next round claims it: fenced
    wait_for(lambda: host.leader.token is None, 5, "the fenced leader stepping down")
    time.sleep(2 * TTL_S)  # campaigns again, wins the key, is refused by the fence
    assert host.leader.token is None
    assert not host.ran
    assert jobs.get(host.catalog, job_id).state == "queued"
    assert leader_fence.current(host.catalog).holder == "elsewhere"
    assert token < 10**9


def test_a_cli_job_command_on_a_cluster_host_is_run_by_the_leader(etcd_one, tmp_path):
    """`shingle scrub` where [cluster] is set queues the job, and the leader (here a daemon's
    maintenance thread with the drives) runs it; the CLI prints its result."""
    import subprocess
    import sys

    home = tmp_path / "node"
    init = subprocess.run(
        [sys.executable, "-m", "appliance.cli", "init", str(home), "--drive-size", "64MiB",
         "--zone-size", "8MiB", "--no-preallocate"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert init.returncode == 0, init.stderr
    path = home / "shingle.toml"
    text = path.read_text()
    for line, value in (
        ('etcd_endpoints = ""', f'etcd_endpoints = "{etcd_one.endpoints[0]}"'),
        ('name = ""', 'name = "node1"'),
        ("lease_ttl_s = 10.0", f"lease_ttl_s = {TTL_S}"),
    ):
        text, count = re.subn(rf"^#? ?{re.escape(line)}$", value, text, flags=re.M)
        assert count == 1, line
    path.write_text(text)
    config = config_mod.load(path)
    with Appliance(config) as appliance:
        loop = Maintenance(
            appliance, tick_s=0.05, leader=maintenance_leader(config, appliance.catalog)
        )
        loop.start()
        try:
            assert loop.leader is not None and loop.leader.wait_elected(10)
            run = subprocess.run(
                [sys.executable, "-m", "appliance.cli", "-c", str(path), "scrub", "--json"],
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
        finally:
            loop.stop()
            loop.join(30)
    assert run.returncode == 0, run.stderr
    assert "for the cluster's maintenance leader" in run.stderr
    job = json.loads(run.stdout)
    assert (job["kind"], job["state"], job["actor"]) == ("scrub", "done", "cli")


def test_cluster_options_are_checked_when_the_config_loads(tmp_path):
    base = {"appliance": {"data_dir": str(tmp_path)}}
    for endpoints in ("127.0.0.1:2379", "http://h:1,ftp://h:2", "http://h:port"):
        with pytest.raises(ConfigError, match="cluster.etcd_endpoints"):
            config_mod.from_dict({**base, "cluster": {"etcd_endpoints": endpoints}})
    with pytest.raises(ConfigError, match="cluster.lease_ttl_s"):
        config_mod.from_dict({**base, "cluster": {"lease_ttl_s": 1}})
    with pytest.raises(ConfigError, match="cluster.leader"):
        config_mod.from_dict({**base, "cluster": {"leader": "me"}})
    good = config_mod.from_dict(
        {**base, "cluster": {"etcd_endpoints": " http://a:2379, http://b:2379/ ", "name": "x"}}
    )
    assert config_mod.etcd_endpoints(good.get("cluster.etcd_endpoints")) == [
        "http://a:2379",
        "http://b:2379/",
    ]
