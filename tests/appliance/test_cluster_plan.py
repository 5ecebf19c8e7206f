"""`shingle cluster plan` and `render` refuse what would not make a working cluster, with one
line and exit code 2, and change nothing then (appliance/host/clusterplan.py). That the rendered
files start real etcd and Patroni members: tests/cluster/test_cluster_render.py."""

from __future__ import annotations

import json

import pytest

from appliance.cli.parser import main as shingle
from appliance.host import clusterplan

MEMBERS = "m1=10.9.0.1,m2=10.9.0.2,m3=10.9.0.3"


def make(tmp_path, capsys, etcd=MEMBERS, postgres=MEMBERS) -> int:
    code = shingle(["cluster", "plan", "--etcd", etcd, "--postgres", postgres,
                    "--plan", str(tmp_path / "cluster.toml")])  # fmt: skip
    return code


@pytest.mark.parametrize(
    ("etcd", "said"),
    [
        ("m1=10.9.0.1,m2=10.9.0.2", "an odd number"),
        ("m1=10.9.0.1,m2=nohost,m3=10.9.0.3", "is not an IP address"),
        ("m1=10.9.0.1,m2,m3=10.9.0.3", "expected NAME=ADDRESS"),
        ("M1=10.9.0.1", "expected a lowercase name"),
        ("", "cluster plan --etcd"),
    ],
)
def test_a_plan_that_would_not_work_is_refused(tmp_path, capsys, etcd, said):
    assert make(tmp_path, capsys, etcd=etcd) == 2
    assert said in capsys.readouterr().err
    assert not (tmp_path / "cluster.toml").exists()


def test_a_plan_is_never_overwritten_and_its_passwords_are_its_own(tmp_path, capsys):
    assert make(tmp_path, capsys) == 0
    first = (tmp_path / "cluster.toml").read_text()
    assert (tmp_path / "cluster.toml").stat().st_mode & 0o777 == 0o600
    assert make(tmp_path, capsys) == 2
    assert "would change the cluster's passwords" in capsys.readouterr().err
    assert (tmp_path / "cluster.toml").read_text() == first
    plan = clusterplan.load_plan(tmp_path / "cluster.toml")
    secrets = {plan.superuser_password, plan.replication_password, plan.catalog_password}
    assert len(secrets) == 3 and all(len(s) >= 32 for s in secrets)
    assert plan.catalog_url == (
        f"postgresql+psycopg://shingle:{plan.catalog_password}@/shingle?host=10.9.0.1:5432"
        "&host=10.9.0.2:5432&host=10.9.0.3:5432&target_session_attrs=read-write"
    )


def test_render_writes_a_members_files_and_refuses_a_stranger(tmp_path, capsys):
    assert make(tmp_path, capsys, postgres="m1=10.9.0.1") == 0
    plan = str(tmp_path / "cluster.toml")
    etc = tmp_path / "etc"
    assert shingle(["cluster", "render", "m9", "--plan", plan, "--etc", str(etc)]) == 2
    assert "'m9' is no member of the plan (its members: m1, m2, m3)" in capsys.readouterr().err
    assert not etc.exists()
    # m2: etcd only
    assert shingle(["cluster", "render", "m2", "--plan", plan, "--etc", str(etc)]) == 0
    assert sorted(p.relative_to(etc).as_posix() for p in etc.rglob("*") if p.is_file()) == [
        "default/etcd"
    ]
    env = (etc / "default" / "etcd").read_text()
    assert 'ETCD_NAME="m2"' in env and 'ETCD_LISTEN_PEER_URLS="http://10.9.0.2:2380"' in env
    assert (
        'ETCD_INITIAL_CLUSTER="m1=http://10.9.0.1:2380,m2=http://10.9.0.2:2380,'
        'm3=http://10.9.0.3:2380"'
    ) in env
    # m1: both, the Patroni files readable by their owner only
    assert shingle(["cluster", "render", "m1", "--plan", plan, "--etc", str(etc)]) == 0
    config = json.loads((etc / "patroni" / "config.yml").read_text())
    assert (etc / "patroni" / "config.yml").stat().st_mode & 0o777 == 0o600
    assert config["bootstrap"]["dcs"]["synchronous_mode"] is True
    assert config["etcd3"]["hosts"] == ["10.9.0.1:2379", "10.9.0.2:2379", "10.9.0.3:2379"]
    assert not [line for line in config["postgresql"]["pg_hba"] if "trust" in line]


def test_patroni_timings_are_checked(tmp_path, capsys):
    assert make(tmp_path, capsys) == 0
    path = tmp_path / "cluster.toml"
    path.write_text(path.read_text().replace("retry_timeout = 10", "retry_timeout = 20"))
    with pytest.raises(clusterplan.PlanError, match="must not pass ttl"):
        clusterplan.load_plan(path)
    path.write_text(path.read_text().replace("retry_timeout = 20", 'retry_timeout = "3"'))
    with pytest.raises(clusterplan.PlanError, match="whole seconds"):
        clusterplan.load_plan(path)


def test_cluster_init_takes_the_plans_etcd_endpoints(tmp_path, capsys):
    """The endpoints reach init's own checks: a SQLite head is refused as before."""
    assert make(tmp_path, capsys) == 0
    (tmp_path / "head").mkdir()
    (tmp_path / "head" / "shingle.toml").write_text(
        f'[catalog]\nurl = "sqlite:///{tmp_path}/head/catalog.db"\n'
    )
    code = shingle(["-c", str(tmp_path / "head" / "shingle.toml"), "cluster", "init",
                    "--plan", str(tmp_path / "cluster.toml")])  # fmt: skip
    assert code == 2
    assert "this head's catalog is SQLite" in capsys.readouterr().err


def test_doctor_names_what_a_members_host_lacks(tmp_path, capsys):
    """Members on addresses where nothing listens (127.66.0.x): etcd and Patroni fail; the
    rendered files: absent fails, changed warns; a head's URL missing a member warns. The
    checks finding a working cluster all ok: tests/cluster/test_cluster_render.py."""
    from appliance.host.clusterdoctor import check_cluster

    members = "m1=127.66.0.1,m2=127.66.0.2,m3=127.66.0.3"
    assert make(tmp_path, capsys, etcd=members, postgres=members) == 0
    plan, etc = tmp_path / "cluster.toml", tmp_path / "etc"

    def statuses(url=None) -> dict[str, str]:
        return {c.name: c.status for c in check_cluster(plan, etc, "m1", url)}

    found = statuses()
    assert found["cluster etcd"] == "fail" and found["cluster patroni"] == "fail"
    assert found["cluster default/etcd"] == found["cluster patroni/config.yml"] == "fail"
    assert found["cluster plan"] == "ok"
    assert shingle(["cluster", "render", "m1", "--plan", str(plan), "--etc", str(etc)]) == 0
    assert statuses()["cluster patroni/config.yml"] == "ok"
    (etc / "default" / "etcd").write_text("ETCD_NAME=other\n")
    assert statuses()["cluster default/etcd"] == "warn"
    url = clusterplan.load_plan(plan).catalog_url
    assert statuses(url)["cluster catalog url"] == "ok"
    assert statuses(url.replace("&host=127.66.0.3:5432", ""))["cluster catalog url"] == "warn"
    plan.chmod(0o644)
    assert statuses()["cluster plan"] == "warn"
