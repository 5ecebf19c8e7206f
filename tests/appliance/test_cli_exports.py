"""`shingle exports` as an admin runs it: list, add, set, remove, and errors as one line."""

from __future__ import annotations

import json

import clirunner
import pytest

from appliance import config as config_mod
from appliance.nfs.exports import ExportTable
from appliance.runtime import Appliance
from engine.admin import events
from engine.admin.exports import ExportValueError, clean_sec


def shingle(*args, check=True):
    run = clirunner.run(list(args))
    if check:
        assert run.returncode == 0, run.stderr
    return run


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    root = tmp_path_factory.mktemp("exports-cli") / "a"
    shingle("init", str(root), "--drives", "10", "--drive-size", "16MiB", "--zone-size", "1MiB")
    return root


def exports_json(conf) -> list[dict]:
    return json.loads(shingle("-c", conf, "exports", "list", "--json").stdout)


def test_list_add_set_remove(home):
    conf = str(home / "shingle.toml")
    listed = exports_json(conf)
    assert [(e["name"], e["path"], e["squash"]) for e in listed] == [
        ("/export", "/", "root_squash")
    ]
    assert "/export" in shingle("-c", conf, "exports", "list").stdout

    config = config_mod.load(conf)
    with Appliance(config, with_data=False) as appliance:  # a directory to export
        from engine.namespace import ROOT

        appliance.namespace.mkdir(ROOT, appliance.namespace.root_ino, "datasets")
    out = shingle(
        "-c",
        conf,
        "exports",
        "add",
        "/datasets",
        "--clients",
        "10.0.0.0/8",
        "192.168.1.5",
        "--squash",
        "all_squash",
        "--read-only",
    ).stdout
    assert "/datasets" in out
    added = next(e for e in exports_json(conf) if e["name"] == "/datasets")
    assert added["clients"] == "10.0.0.0/8,192.168.1.5/32" and added["access"] == "ro"
    assert added["squash"] == "all_squash" and added["path"] == "/datasets"

    first = listed[0]["id"]
    shingle(
        "-c",
        conf,
        "exports",
        "set",
        str(first),
        "--squash",
        "no_root_squash",
        "--sec",
        "KRB5P, krb5:sys",
        "--no-delegations",
    )
    changed = next(e for e in exports_json(conf) if e["id"] == first)
    assert changed["squash"] == "no_root_squash" and changed["clients"] == "0.0.0.0/0,::/0"
    assert changed["sec"] == "krb5p:krb5:sys" and changed["delegations"] is False

    with Appliance(config, with_data=False) as appliance:
        # what the daemon's periodic reload sees, and who the event names
        rule = ExportTable(appliance.catalog, appliance.namespace).by_id[first]
        assert rule.squash == "no_root_squash" and rule.cred(0, 0, ()).uid == 0
        # the flavours in the admin's order (SECINFO and MNT list them so), no delegations
        assert rule.flavors == (390005, 390003, 1) and rule.delegations is False
        assert rule.admits(0) and not rule.admits(390004)  # AUTH_NONE goes with sys
        latest = events.recent(appliance.catalog, 1, kind_prefix="export.")[0]
        assert (latest.kind, latest.actor) == ("export.update", "cli")

    shingle("-c", conf, "exports", "remove", str(added["id"]))
    assert [e["name"] for e in exports_json(conf)] == ["/export"]


def test_errors_are_one_line(home):
    conf = str(home / "shingle.toml")
    bad = shingle("-c", conf, "exports", "add", "/nowhere", check=False)
    assert bad.returncode == 2 and "path = '/nowhere': expected an existing directory" in bad.stderr
    assert "Traceback" not in bad.stderr
    cidr = shingle(
        "-c",
        conf,
        "exports",
        "add",
        "/",
        "--name",
        "/all",
        "--clients",
        "10.0.0.300/8",
        check=False,
    )
    assert cidr.returncode == 2
    assert "clients = '10.0.0.300/8': expected an IP address" in cidr.stderr
    squash = shingle("-c", conf, "exports", "set", "1", "--squash", "everyone", check=False)
    assert squash.returncode == 2 and "invalid choice" in squash.stderr
    for sec in ("krb5q", "krb5:krb5", "", 5):  # (the CLI's --sec goes through clean_sec)
        with pytest.raises(ExportValueError, match="sec"):
            clean_sec(sec)
    missing = shingle("-c", conf, "exports", "set", "999", "--squash", "all_squash", check=False)
    assert missing.returncode == 1 and "no export with id 999" in missing.stderr
    nothing = shingle("-c", conf, "exports", "set", "1", check=False)
    assert nothing.returncode == 2 and "nothing to change" in nothing.stderr
    taken = shingle("-c", conf, "exports", "add", "/", "--name", "/export", check=False)
    assert taken.returncode == 1 and "exists" in taken.stderr
