"""`shingle cluster plan` and `render` make a working etcd cluster and PostgreSQL under Patroni.

Three hosts of the test bed (each a network namespace, beside the bed's own members), each an
etcd member and a PostgreSQL member, as a small cluster's three machines would be. The plan is
made by `shingle cluster plan` (data folders in the hosts' folders, Patroni's timings edited in
the file to the bed's short ones, as a user may); each host's files by `shingle cluster render
NAME --etc FOLDER`. Each member then runs as Debian's units run it: etcd as the etcd user with
the environment of the rendered /etc/default/etcd (etcd-server's etcd.service:
EnvironmentFile, `/usr/bin/etcd`), Patroni as postgres with the rendered config.yml
(patroni.service: `/usr/bin/patroni /etc/patroni/config.yml`). Checked:
- the three etcd members form one cluster (each /health true, three members listed);
- Patroni bootstraps a primary and two streaming replicas, one of them the synchronous standby;
- the heads' catalog URL (`render --catalog-url`) reaches the primary as the catalog role (its
  post-bootstrap script ran: role and database), which writes and migrates the catalog to the
  newest revision (as `shingle init --catalog URL` does), and the synchronous standby has it; a
  wrong password is refused (the rendered pg_hba asks for one);
- `shingle doctor`'s cluster checks (appliance/host/clusterdoctor.py) on a member: all ok.
Every process of the three hosts is killed at the end."""

from __future__ import annotations

import json
import shlex
import subprocess
import time
import urllib.request
from pathlib import Path

import psycopg
import pytest
from bed import CLEAN_PATH, kill_netns_processes
from psycopg.conninfo import make_conninfo
from sqlalchemy import create_engine, make_url
from sqlalchemy.pool import NullPool

from appliance.cli.cluster import set_section_options
from appliance.cli.parser import main as shingle
from appliance.host.clusterdoctor import check_cluster
from engine.catalog import upgrade
from engine.catalog.migrate import head_revision

HOSTS = ("crender1", "crender2", "crender3")
PATRONI_TIMINGS = {"ttl": 10, "loop_wait": 2, "retry_timeout": 3}  # the bed's (bed.py)
START_TIMEOUT_S = 90.0


def environment_file(path: Path) -> dict[str, str]:
    """KEY="VALUE" lines of a systemd EnvironmentFile."""
    values = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = shlex.split(value)[0] if value.strip() else ""
    return values


def get_json(bed, host: str, url: str):
    def fetch():
        with urllib.request.urlopen(url, timeout=2) as reply:
            return json.loads(reply.read())

    return bed.call(host, fetch)


def wait_for(ready, what: str, log: str, bed) -> float:
    """Seconds until ``ready()``; past START_TIMEOUT_S a failure with each host's ``log``."""
    started = time.monotonic()
    while True:
        try:
            if ready():
                return time.monotonic() - started
        except (OSError, ValueError, KeyError):
            pass
        if time.monotonic() - started > START_TIMEOUT_S:
            tails = {h: (bed.hosts[h].folder / log).read_text()[-1500:] for h in HOSTS}
            raise AssertionError(f"{what}: not within {START_TIMEOUT_S:.0f} s: {tails}")
        time.sleep(0.5)


def test_rendered_configs_start_an_etcd_cluster_and_patroni_members(bed, tmp_path, capsys):
    for host in HOSTS:
        if host not in bed.hosts:
            bed.add_host(host)
    members = ",".join(f"{h}={bed.hosts[h].address}" for h in HOSTS)
    plan = tmp_path / "cluster.toml"
    procs: list[subprocess.Popen] = []
    try:
        assert (
            shingle(["cluster", "plan", "--etcd", members, "--postgres", members,
                     "--plan", str(plan), "--etcd-data-dir", str(bed.folder / "member" / "etcd"),
                     "--postgres-folder", str(bed.folder / "member" / "pg")])
            == 0
        )  # fmt: skip
        assert plan.stat().st_mode & 0o777 == 0o600
        plan.write_text(set_section_options(plan.read_text(), "patroni", PATRONI_TIMINGS))
        for host in HOSTS:
            # the same plan on every machine, whose data folders are its own: here the hosts
            # share one file system, so each host's copy names a folder of its own
            own = tmp_path / f"{host}.toml"
            folder = bed.hosts[host].folder  # the members' users reach it (bed.py)
            own.write_text(plan.read_text().replace(f"{bed.folder}/member/", f"{folder}/"))
            own.chmod(0o600)
            assert shingle(["cluster", "render", host, "--plan", str(own),
                            "--etc", str(folder / "etc")]) == 0  # fmt: skip
        capsys.readouterr()
        assert shingle(["cluster", "render", "--catalog-url", "--plan", str(plan)]) == 0
        catalog_url = capsys.readouterr().out.strip()

        started = time.monotonic()
        for host in HOSTS:
            etc = bed.hosts[host].folder / "etc"
            env = {"PATH": CLEAN_PATH, **environment_file(etc / "default" / "etcd")}
            with open(bed.hosts[host].folder / "etcd.log", "wb") as log:
                procs.append(
                    bed.run(host, ["etcd"], user="etcd", env=env, stdin=subprocess.DEVNULL,
                            stdout=log, stderr=subprocess.STDOUT)
                )  # fmt: skip
        endpoints = {h: f"http://{bed.hosts[h].address}:2379" for h in HOSTS}
        wait_for(
            lambda: all(
                get_json(bed, h, f"{endpoints[h]}/health")["health"] == "true" for h in HOSTS
            ),
            "etcd members healthy", "etcd.log", bed,
        )  # fmt: skip
        etcd_s = time.monotonic() - started
        listed = bed.call(HOSTS[0], lambda: _etcd_members(endpoints[HOSTS[0]]))
        assert sorted(listed) == sorted(HOSTS)

        for host in HOSTS:
            folder = bed.hosts[host].folder
            with open(folder / "patroni.log", "wb") as log:
                procs.append(
                    bed.run(host, ["patroni", str(folder / "etc" / "patroni" / "config.yml")],
                            user="postgres", stdin=subprocess.DEVNULL, stdout=log,
                            stderr=subprocess.STDOUT, cwd=folder,
                            env={"PATH": CLEAN_PATH, "LANG": "C.UTF-8", "HOME": str(folder)})
                )  # fmt: skip
        rest = f"http://{bed.hosts[HOSTS[0]].address}:8008/cluster"

        def whole() -> bool:
            cluster = get_json(bed, HOSTS[0], rest)["members"]
            roles = sorted(m["role"] for m in cluster)
            running = all(m["state"] in ("running", "streaming") for m in cluster)
            return running and roles == ["leader", "replica", "sync_standby"]

        wait_for(
            whole, "a primary, a synchronous standby and a replica streaming", "patroni.log", bed
        )
        patroni_s = time.monotonic() - started - etcd_s

        def write() -> tuple:
            # as a head connects: SQLAlchemy's psycopg dialect over the multi-host URL
            engine = create_engine(catalog_url, poolclass=NullPool)
            try:
                with engine.begin() as conn:
                    conn.exec_driver_sql("CREATE TABLE rendered (n integer)")
                    conn.exec_driver_sql("INSERT INTO rendered VALUES (1)")
                    return tuple(
                        conn.exec_driver_sql(
                            "SELECT current_user, current_database(), pg_is_in_recovery(), "
                            "(SELECT count(*) FROM rendered)"
                        ).one()
                    )
            finally:
                engine.dispose()

        assert bed.call(HOSTS[1], write) == ("shingle", "shingle", False, 1)
        # what `shingle init --catalog URL` does first: the catalog role migrates its database
        migrated = time.monotonic()
        bed.call(HOSTS[1], lambda: upgrade(catalog_url))
        migrate_s = time.monotonic() - migrated
        password = make_url(catalog_url).password

        def member(host: str, secret: str) -> str:
            return make_conninfo(
                host=host, port=5432, user="shingle", password=secret, dbname="shingle",
                connect_timeout=5,
            )  # fmt: skip

        # the synchronous standby has the row (a read-only connection to it alone)
        roles = {m["role"]: m["host"] for m in get_json(bed, HOSTS[0], rest)["members"]}

        def read_standby() -> bool:
            with psycopg.connect(member(roles["sync_standby"], password)) as conn:
                in_recovery, count, revision = conn.execute(
                    "SELECT pg_is_in_recovery(), (SELECT count(*) FROM rendered), "
                    "(SELECT version_num FROM alembic_version)"
                ).fetchone()
            assert in_recovery
            return count == 1 and revision == head_revision()

        wait_for(
            lambda: bed.call(HOSTS[2], read_standby), "the row on the standby", "patroni.log", bed
        )
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            bed.call(HOSTS[1], lambda: psycopg.connect(member(roles["leader"], "not-it")))
        # `shingle doctor`'s cluster checks on a member find it all well
        first = bed.hosts[HOSTS[0]].folder
        checks = bed.call(
            HOSTS[0],
            lambda: check_cluster(
                tmp_path / f"{HOSTS[0]}.toml", first / "etc", HOSTS[0], catalog_url
            ),
        )
        assert [c.name for c in checks if c.status != "ok"] == [], checks
        assert {c.name for c in checks} >= {
            "cluster etcd", "cluster patroni", "cluster patroni/config.yml", "cluster catalog url"
        }  # fmt: skip
        print(
            f"\netcd healthy {etcd_s:.1f} s, Patroni whole {patroni_s:.1f} s after that, "
            f"catalog migrated in {migrate_s:.1f} s"
        )
    finally:
        for host in HOSTS:
            kill_netns_processes(bed.hosts[host].netns)
        for proc in procs:
            proc.wait(10)


def _etcd_members(endpoint: str) -> list[str]:
    request = urllib.request.Request(
        f"{endpoint}/v3/cluster/member/list", data=b"{}", method="POST"
    )
    with urllib.request.urlopen(request, timeout=2) as reply:
        return [m["name"] for m in json.loads(reply.read())["members"]]
