"""`shingle cluster plan` and `render` make a working etcd cluster and PostgreSQL under Patroni.

Three hosts of the test bed (each a network namespace, beside the bed's own members), each an
etcd member and a PostgreSQL member, as a small cluster's three machines would be. The plan is
made by `shingle cluster plan` (data folders in the hosts' folders, Patroni's timings edited in
the file to the bed's short ones, as a user may); each host's files by `shingle cluster render
NAME --etc FOLDER`. Each member then runs as Debian's units run it: etcd as the etcd user with
the environment of the rendered /etc/default/etcd (etcd-server's etcd.service:
EnvironmentFile, `/usr/bin/etcd`), Patroni as postgres with the rendered config.yml
(patroni.service: `/usr/bin/patroni /etc/patroni/config.yml`). Checked:
- the three etcd members form one cluster (each /health true, three members listed), speaking
  only TLS with certificates of the plan's CA to clients and peers: a client without a
  certificate is refused;
- Patroni bootstraps a primary and two streaming replicas, one of them the synchronous standby,
  through etcd over TLS (its rendered etcd3 section);
- the heads' catalog URL (`render --catalog-url`) reaches the primary as the catalog role (its
  post-bootstrap script ran: role and database), which writes and migrates the catalog to the
  newest revision (as `shingle init --catalog URL` does), and the synchronous standby has it; a
  wrong password is refused (the rendered pg_hba asks for one);
- `shingle doctor`'s cluster checks (appliance/host/clusterdoctor.py) on a member: all ok
  (certificates, etcd's members against the plan, replication lag, clocks);
- `shingle cluster add-host` of a fourth host as an etcd member (`member add` through the plan's
  client certificate, then its rendered file starts it with initial-cluster-state existing): four
  members healthy; `remove-host` takes it out again (`member remove`) and its etcd stops by
  itself, the doctor's member check back to ok; Patroni's leader is refused, and with a member
  down etcd refuses to remove another: the plan is left as it was.
Every process of the four hosts is killed and their namespaces deleted at the end."""

from __future__ import annotations

import json
import shlex
import subprocess
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import psycopg
import pytest
from bed import CLEAN_PATH
from psycopg.conninfo import make_conninfo
from sqlalchemy import create_engine, make_url
from sqlalchemy.pool import NullPool

from appliance import config as config_mod
from appliance.cli.cluster import set_section_options
from appliance.cli.clustersetup import plan_endpoints
from appliance.cli.parser import main as shingle
from appliance.config import etcd_client
from appliance.host import clusterplan
from appliance.host.clusterdoctor import check_cluster, check_etcd
from engine.catalog import upgrade
from engine.catalog.migrate import head_revision
from engine.cluster.etcd import EtcdClient, tls_context

HOSTS = ("crender1", "crender2", "crender3")
ADDED = "crender4"  # the etcd member add-host brings in
# the bed's (bed.py), but loop_wait 1: the leader names its synchronous standby sooner
PATRONI_TIMINGS = {"ttl": 10, "loop_wait": 1, "retry_timeout": 3}
START_TIMEOUT_S = 90.0


def environment_file(path: Path) -> dict[str, str]:
    """KEY="VALUE" lines of a systemd EnvironmentFile."""
    values = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = shlex.split(value)[0] if value.strip() else ""
    return values


def get_json(bed, host: str, url: str, tls=None):
    def fetch():
        with urllib.request.urlopen(url, timeout=2, context=tls) as reply:
            return json.loads(reply.read())

    return bed.call(host, fetch)


def wait_for(ready, what: str, log: str, bed, hosts=HOSTS) -> float:
    """Seconds until ``ready()``; past START_TIMEOUT_S a failure with each host's ``log``."""
    started = time.monotonic()
    while True:
        try:
            if ready():
                return time.monotonic() - started
        except (OSError, ValueError, KeyError):
            pass
        if time.monotonic() - started > START_TIMEOUT_S:
            tails = {h: (bed.hosts[h].folder / log).read_text()[-1500:] for h in hosts}
            raise AssertionError(f"{what}: not within {START_TIMEOUT_S:.0f} s: {tails}")
        time.sleep(0.2)


def own_plan(bed, plan: Path, host: str, tmp_path: Path) -> Path:
    """The same plan on every machine, whose data folders are its own: here the hosts share one
    file system, so each host's copy names a folder of its own."""
    own = tmp_path / f"{host}.toml"
    folder = bed.hosts[host].folder  # the members' users reach it (bed.py)
    own.write_text(plan.read_text().replace(f"{bed.folder}/member/", f"{folder}/"))
    own.chmod(0o600)
    return own


def start_etcd(bed, host: str, procs: list) -> None:
    """etcd as etcd-server's unit runs it: the etcd user, the rendered environment file."""
    etc = bed.hosts[host].folder / "etc"
    env = {"PATH": CLEAN_PATH, **environment_file(etc / "default" / "etcd")}
    with open(bed.hosts[host].folder / "etcd.log", "ab") as log:
        procs.append(
            bed.run(host, ["etcd"], user="etcd", env=env, stdin=subprocess.DEVNULL,
                    stdout=log, stderr=subprocess.STDOUT)
        )  # fmt: skip


def test_rendered_configs_start_an_etcd_cluster_and_patroni_members(bed, tmp_path, capsys):
    for host in (*HOSTS, ADDED):
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
            own = own_plan(bed, plan, host, tmp_path)
            assert shingle(["cluster", "render", host, "--plan", str(own),
                            "--etc", str(bed.hosts[host].folder / "etc")]) == 0  # fmt: skip
        capsys.readouterr()
        assert shingle(["cluster", "render", "--catalog-url", "--plan", str(plan)]) == 0
        catalog_url = capsys.readouterr().out.strip()
        made = clusterplan.load_plan(plan)
        client_tls = tls_context(*made.client_tls())

        started = time.monotonic()
        for host in HOSTS:
            start_etcd(bed, host, procs)
        endpoints = {h: f"https://{bed.hosts[h].address}:2379" for h in HOSTS}

        def healthy(hosts) -> bool:
            return all(
                get_json(bed, h, f"{endpoints[h]}/health", client_tls)["health"] == "true"
                for h in hosts
            )

        wait_for(lambda: healthy(HOSTS), "etcd members healthy", "etcd.log", bed)
        etcd_s = time.monotonic() - started
        etcd = EtcdClient(endpoints.values(), tls=client_tls)
        assert sorted(m.name for m in bed.call(HOSTS[0], etcd.members)) == sorted(HOSTS)
        # a head's etcd client as its daemon makes it: the [cluster] options `cluster init
        # --plan` writes (https endpoints, the CA, the client certificate); the election's calls
        endpoints_line, tls_options = plan_endpoints(SimpleNamespace(plan=str(plan)))
        head_config = config_mod.from_dict(
            {"cluster": {"etcd_endpoints": endpoints_line, **tls_options}}
        )
        head = etcd_client(head_config, timeout_s=2.0)

        def campaign() -> bool:
            lease = head.grant(5)
            won, _key = head.create("/shingle/maintenance-leader", "crender1", lease.id)
            head.revoke(lease.id)
            return won

        assert bed.call(HOSTS[1], campaign)
        # TLS only, and only for holders of the CA's certificates: no client certificate, no
        # answer; plain HTTP, no answer
        bare = tls_context(made.client_tls()[0])
        with pytest.raises(OSError):
            get_json(bed, HOSTS[1], f"{endpoints[HOSTS[0]]}/health", bare)
        with pytest.raises(OSError):
            get_json(bed, HOSTS[1], f"http://{bed.hosts[HOSTS[0]].address}:2379/health")

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
                try:
                    in_recovery, count, revision = conn.execute(
                        "SELECT pg_is_in_recovery(), (SELECT count(*) FROM rendered), "
                        "(SELECT version_num FROM alembic_version)"
                    ).fetchone()
                except psycopg.errors.UndefinedTable:
                    # a synchronous commit waits for the standby's flush, not its replay
                    return False
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
        doctor_said = "\n".join(f"{c.status:4} {c.name}: {c.detail}" for c in checks)
        assert {c.name for c in checks} >= {
            "cluster etcd", "cluster patroni", "cluster patroni/config.yml", "cluster catalog url",
            "cluster etcd/tls/ca.crt", f"cluster tls {HOSTS[0]}", "cluster tls client",
            "cluster etcd members", "cluster replication", "cluster clocks",
        }  # fmt: skip

        # a fourth etcd member: add-host on the plan's host adds it to etcd, then it starts
        added = time.monotonic()
        address = bed.hosts[ADDED].address
        assert (
            bed.call(
                HOSTS[0],
                lambda: shingle(
                    ["cluster", "add-host", ADDED, address, "--role", "etcd", "--plan", str(plan)]
                ),
            )
            == 0
        )
        assert "systemctl restart etcd" in capsys.readouterr().out
        four = clusterplan.load_plan(plan)
        assert four.etcd[ADDED] == address and four.etcd_added == [ADDED]
        assert bed.call(HOSTS[0], lambda: sorted(m.name for m in etcd.members())) == [
            "",
            *HOSTS,
        ]  # fmt: skip (added, not started: no name yet)
        own = own_plan(bed, plan, ADDED, tmp_path)
        assert shingle(["cluster", "render", ADDED, "--plan", str(own),
                        "--etc", str(bed.hosts[ADDED].folder / "etc")]) == 0  # fmt: skip
        env = environment_file(bed.hosts[ADDED].folder / "etc" / "default" / "etcd")
        assert env["ETCD_INITIAL_CLUSTER_STATE"] == "existing"
        start_etcd(bed, ADDED, procs)
        added_etcd = procs[-1]
        endpoints[ADDED] = f"https://{address}:2379"
        wait_for(lambda: healthy([*HOSTS, ADDED]), "the added member healthy", "etcd.log", bed,
                 hosts=[ADDED])  # fmt: skip
        assert bed.call(HOSTS[0], lambda: sorted(m.name for m in etcd.members())) == sorted(
            [*HOSTS, ADDED]
        )
        add_s = time.monotonic() - added
        member_checks = bed.call(HOSTS[0], lambda: check_etcd(four))
        said = {c.name: (c.status, c.detail) for c in member_checks}
        assert said["cluster etcd"][0] == "ok" and said["cluster etcd members"][0] == "warn"
        assert "4 members: a quorum of 3" in said["cluster etcd members"][1]

        # and out again: etcd first (the member stops by itself), then the plan
        removed = time.monotonic()
        assert (
            bed.call(
                HOSTS[0], lambda: shingle(["cluster", "remove-host", ADDED, "--plan", str(plan)])
            )
            == 0
        )
        assert "systemctl disable --now etcd" in capsys.readouterr().out
        assert ADDED not in clusterplan.load_plan(plan).etcd
        assert bed.call(HOSTS[0], lambda: sorted(m.name for m in etcd.members())) == sorted(HOSTS)
        added_etcd.wait(20)  # a removed member's etcd ends by itself
        removed_s = time.monotonic() - removed
        three = clusterplan.load_plan(plan)
        member_checks = bed.call(HOSTS[0], lambda: check_etcd(three))
        assert {c.name: c.status for c in member_checks}["cluster etcd members"] == "ok"
        # refused, the plan left as it was: Patroni's leader (switch over first), and with a
        # member down another member (etcd: the rest would have no quorum)
        before = plan.read_text()
        cluster = get_json(bed, HOSTS[0], rest)["members"]
        leader = next(m["name"] for m in cluster if m["role"] == "leader")
        target, down = [h for h in HOSTS if h != leader]
        for host, said in ((leader, "is the Patroni leader"), (target, "fewer than a quorum")):
            if host == target:
                procs[HOSTS.index(down)].kill()  # its etcd
                procs[HOSTS.index(down)].wait(10)
            assert bed.call(HOSTS[0], lambda host=host: shingle(
                ["cluster", "remove-host", host, "--plan", str(plan)])) != 0  # fmt: skip
            assert said in capsys.readouterr().err
            assert plan.read_text() == before
        print(
            f"\n{doctor_said}\netcd healthy {etcd_s:.1f} s, "
            f"Patroni whole {patroni_s:.1f} s after that, "
            f"catalog migrated in {migrate_s:.1f} s; a member added and healthy in "
            f"{add_s:.1f} s, removed and stopped in {removed_s:.1f} s"
        )
    finally:
        for host in (*HOSTS, ADDED):
            bed.remove_host(host)
        for proc in procs:
            proc.wait(10)
