"""`shingle cluster plan` and `render` refuse what would not make a working cluster, with one
line and exit code 2, and change nothing then (appliance/host/clusterplan.py). That the rendered
files start real etcd and Patroni members: tests/cluster/test_cluster_render.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from appliance.cli.parser import main as shingle
from appliance.host import clusterplan

MEMBERS = "m1=10.9.0.1,m2=10.9.0.2,m3=10.9.0.3"


_TEMPLATES: dict[tuple[str, str], Path] = {}


@pytest.fixture(scope="module", autouse=True)
def _plan_templates(tmp_path_factory):
    """Plans the CLI made once per member lists, copied for the tests after the first: each
    plan makes a CA and a certificate per host (openssl runs), and most tests need any plan."""
    _TEMPLATES["root"] = tmp_path_factory.mktemp("plans")
    yield
    _TEMPLATES.clear()


def make(tmp_path, capsys, etcd=MEMBERS, postgres=MEMBERS, fresh=False) -> int:
    target = tmp_path / "cluster.toml"
    template = _TEMPLATES.get((etcd, postgres))
    if fresh or target.exists() or template is None:
        code = shingle(["cluster", "plan", "--etcd", etcd, "--postgres", postgres,
                        "--plan", str(target)])  # fmt: skip
        if code == 0 and template is None:
            copy = _TEMPLATES["root"] / str(len(_TEMPLATES))
            shutil.copytree(tmp_path, copy)
            _TEMPLATES[(etcd, postgres)] = copy
        return code
    target.write_text((template / "cluster.toml").read_text().replace(str(template), str(tmp_path)))
    target.chmod(0o600)
    shutil.copytree(template / "cluster-tls", tmp_path / "cluster-tls")
    return 0


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
        "default/etcd", "etcd/tls/ca.crt", "etcd/tls/m2.crt", "etcd/tls/m2.key"
    ]  # fmt: skip
    assert (etc / "etcd" / "tls" / "m2.key").stat().st_mode & 0o777 == 0o600
    env = (etc / "default" / "etcd").read_text()
    assert 'ETCD_NAME="m2"' in env and 'ETCD_LISTEN_PEER_URLS="https://10.9.0.2:2380"' in env
    assert (
        'ETCD_INITIAL_CLUSTER="m1=https://10.9.0.1:2380,m2=https://10.9.0.2:2380,'
        'm3=https://10.9.0.3:2380"'
    ) in env
    tls = etc / "etcd" / "tls"
    for line in (
        f'ETCD_CERT_FILE="{tls}/m2.crt"',
        f'ETCD_PEER_KEY_FILE="{tls}/m2.key"',
        f'ETCD_TRUSTED_CA_FILE="{tls}/ca.crt"',
        'ETCD_CLIENT_CERT_AUTH="true"',
        'ETCD_PEER_CLIENT_CERT_AUTH="true"',
        'ETCD_INITIAL_CLUSTER_STATE="new"',
    ):
        assert line in env  # fmt: skip
    # m1: both, the Patroni files readable by their owner only
    assert shingle(["cluster", "render", "m1", "--plan", plan, "--etc", str(etc)]) == 0
    config = json.loads((etc / "patroni" / "config.yml").read_text())
    assert (etc / "patroni" / "config.yml").stat().st_mode & 0o777 == 0o600
    assert config["bootstrap"]["dcs"]["synchronous_mode"] is True
    assert config["etcd3"] == {
        "hosts": ["10.9.0.1:2379", "10.9.0.2:2379", "10.9.0.3:2379"], "protocol": "https",
        "cacert": f"{etc}/patroni/tls/ca.crt", "cert": f"{etc}/patroni/tls/m1.crt",
        "key": f"{etc}/patroni/tls/m1.key",
    }  # fmt: skip
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


def test_a_plan_makes_the_clusters_ca_and_a_certificate_per_host(tmp_path, capsys):
    """Every host's certificate is the CA's, names its address (etcd's peers check it), and
    its key is its own and 0600; a second plan into the same TLS folder is refused."""
    from appliance.host import clustertls

    assert make(tmp_path, capsys, postgres="m1=10.9.0.1,m4=10.9.0.4,m5=10.9.0.5", fresh=True) == 0
    plan = clusterplan.load_plan(tmp_path / "cluster.toml")
    folder = tmp_path / "cluster-tls"
    assert plan.tls_folder == str(folder) and plan.etcd_endpoints[0] == "https://10.9.0.1:2379"
    for host, address in {**plan.etcd, **plan.postgres, "client": None}.items():
        cert, key = folder / f"{host}.crt", folder / f"{host}.key"
        facts, problem = clustertls.inspect(folder / "ca.crt", cert, key)
        assert problem is None and facts is not None and facts.subject == f"CN={host}"
        assert key.stat().st_mode & 0o777 == 0o600
        assert facts.names == ({address, "127.0.0.1"} if address else {"127.0.0.1"})
    assert clustertls.ca_facts(folder / "ca.crt").subject == "CN=shingle cluster CA"
    _, problem = clustertls.inspect(folder / "ca.crt", folder / "m1.crt", folder / "m2.key")
    assert "is not the key of" in (problem or "")
    (tmp_path / "cluster.toml").rename(tmp_path / "first.toml")
    assert make(tmp_path, capsys, fresh=True) == 2
    assert "holds files: a new CA would not match" in capsys.readouterr().err
    assert not (tmp_path / "cluster.toml").exists()


def test_a_plans_members_are_added_and_removed_one_host_one_address(tmp_path, capsys):
    """The plan's side of add-host and remove-host (etcd's side runs on the test bed,
    tests/cluster/test_cluster_render.py)."""
    assert make(tmp_path, capsys, postgres="m1=10.9.0.1") == 0
    plan = clusterplan.load_plan(tmp_path / "cluster.toml")
    for name, address, roles, said in [
        ("m1", "10.9.0.1", ["etcd"], "etcd member of the plan already"),
        ("m2", "10.9.0.7", ["postgres"], "one host, one address"),
        ("m7", "10.9.0.2", ["etcd"], "10.9.0.2 is m2's address"),
        ("m7", "10.9.0.7", ["dns"], "expected etcd, postgres"),
        ("M7", "10.9.0.7", ["etcd"], "expected a lowercase name"),
    ]:
        with pytest.raises(clusterplan.PlanError, match=said):
            clusterplan.add_member(plan, name, address, roles)
    clusterplan.add_member(plan, "m4", "10.9.0.4", ["etcd", "postgres"])
    clusterplan.write_plan(plan, tmp_path / "cluster.toml")
    assert (tmp_path / "cluster.toml").stat().st_mode & 0o777 == 0o600
    again = clusterplan.load_plan(tmp_path / "cluster.toml")  # four members load
    assert again.etcd_added == ["m4"] and again.postgres["m4"] == "10.9.0.4"
    env = again.etcd_environment("m4")
    assert 'ETCD_INITIAL_CLUSTER_STATE="existing"' in env and "m4=https://10.9.0.4:2380" in env
    assert 'ETCD_INITIAL_CLUSTER_STATE="new"' in again.etcd_environment("m1")
    assert clusterplan.remove_member(again, "m4") == ["etcd", "postgres"]
    assert again.etcd_added == [] and "m4" not in again.postgres
    with pytest.raises(clusterplan.PlanError, match="last postgres member"):
        clusterplan.remove_member(again, "m1")
    assert shingle(["cluster", "remove-host", "m9", "--plan", str(tmp_path / "cluster.toml")]) == 2
    assert "'m9' is no member of the plan" in capsys.readouterr().err


def test_doctor_checks_each_certificate_against_the_ca_its_host_and_its_dates(tmp_path, capsys):
    from appliance.host import clustertls
    from appliance.host.clusterdoctor import check_certificates

    assert make(tmp_path, capsys) == 0
    plan = clusterplan.load_plan(tmp_path / "cluster.toml")
    folder = Path(plan.tls_folder)

    def status(member="m1") -> dict[str, str]:
        return {c.name: c.status for c in check_certificates(plan, member)}

    assert set(status().values()) == {"ok"} and set(status()) == {
        "cluster tls ca", "cluster tls m1", "cluster tls client"}  # fmt: skip
    # m1's certificate made for another address: etcd's peers would refuse it
    for name in ("m1.crt", "m1.key"):
        (folder / name).unlink()
    clustertls.make_cert(folder, "m1", ["10.9.0.9"])
    assert status()["cluster tls m1"] == "fail"
    # a week left: warned
    for name in ("m1.crt", "m1.key"):
        (folder / name).unlink()
    clustertls.make_cert(folder, "m1", ["10.9.0.1"], days=7)
    found = {c.name: c for c in check_certificates(plan, "m1")}["cluster tls m1"]
    assert found.status == "warn" and "(6 days)" in found.detail
    # signed by another CA
    other = tmp_path / "other"
    clustertls.make_ca(other, "other")
    clustertls.make_cert(other, "m2", ["10.9.0.2"])
    for name in ("m2.crt", "m2.key"):
        (folder / name).write_text((other / name).read_text())
    assert status("m2")["cluster tls m2"] == "fail"
    (folder / "client.crt").unlink()
    assert status()["cluster tls client"] == "fail"


def test_doctor_reads_a_members_clock_from_its_answers(tmp_path):
    """A real HTTP server whose Date header runs ahead: the skew is measured, warned past 2 s
    and failed past Kerberos' 5 minutes."""
    import email.utils
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from appliance.host.clusterdoctor import _get_json, check_clocks

    ahead = {"s": 0.0}

    class Handler(BaseHTTPRequestHandler):
        def date_time_string(self, timestamp=None):
            return email.utils.formatdate(time.time() + ahead["s"], usegmt=True)

        def do_GET(self):
            body = b'{"health": "true"}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/health"
    try:
        found = {}
        for offset, expected in ((0.0, "ok"), (30.0, "warn"), (-600.0, "fail")):
            ahead["s"] = offset
            skews: dict[str, float] = {}
            assert _get_json(url, skews=skews) == {"health": "true"}
            assert abs(skews["127.0.0.1"] - offset) < 1.0
            found[offset] = check_clocks(skews, {"127.0.0.1": "m1"})
            assert found[offset].status == expected, found[offset]
        assert "the farthest, m1, -" in found[-600.0].detail
    finally:
        server.shutdown()
        server.server_close()
    assert check_clocks({}, {}).status == "warn"


def test_https_etcd_endpoints_need_the_clusters_ca(tmp_path):
    from appliance import config as config_mod

    with pytest.raises(config_mod.ConfigError, match="etcd_ca_file"):
        config_mod.from_dict({"cluster": {"etcd_endpoints": "https://10.9.0.1:2379"}})
    with pytest.raises(config_mod.ConfigError, match="etcd_key_file"):
        config_mod.from_dict({"cluster": {"etcd_cert_file": "/x.crt"}})
