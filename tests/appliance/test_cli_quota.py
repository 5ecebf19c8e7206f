"""`shingle quota` as an admin runs it: set, list --json, remove, recount; fsck checks the
counters."""

from __future__ import annotations

import json

import clirunner
import pytest

from appliance import config as config_mod
from appliance.runtime import Appliance
from engine.catalog.database import sql
from engine.namespace import ROOT


def shingle(*args, check=True):
    run = clirunner.run(list(args))
    if check:
        assert run.returncode == 0, run.stderr
    return run


@pytest.fixture(scope="module")
def conf(tmp_path_factory):
    root = tmp_path_factory.mktemp("quota-cli") / "a"
    shingle(
        "init",
        str(root),
        "--drives",
        "10",
        "--drive-size",
        "64MiB",
        "--zone-size",
        "4MiB",
        "--no-preallocate",
    )
    path = str(root / "shingle.toml")
    with Appliance(config_mod.load(path)) as appliance:
        ns = appliance.namespace
        team = ns.mkdir(ROOT, ns.root_ino, "team").ino
        f = ns.create(ROOT, team, "f").ino
        ns.write(f, 0, b"q" * 5000, stable=True)
    return path


def listed(conf) -> list[dict]:
    return json.loads(shingle("-c", conf, "quota", "list", "--json").stdout)


def test_set_list_remove(conf):
    assert listed(conf) == []
    # /export/team: the default export's name over its directory (the namespace root)
    out = shingle("-c", conf, "quota", "set", "/export/team", "--bytes", "1MiB", "--files", "10")
    assert "/export/team" in out.stdout
    shingle("-c", conf, "quota", "set", "/export/team", "--soft-bytes", "4000")
    (quota,) = listed(conf)
    assert quota["path"] == "/export/team"
    assert (quota["bytes_limit"], quota["files_limit"], quota["soft_bytes"]) == (1 << 20, 10, 4000)
    assert (quota["used_bytes"], quota["used_files"]) == (5000, 1)
    assert "team" in shingle("-c", conf, "quota", "list").stdout
    shingle("-c", conf, "quota", "set", "/team", "--files", "0")  # the namespace path also names it
    assert listed(conf)[0]["files_limit"] is None
    shingle("-c", conf, "quota", "remove", "/team")
    assert listed(conf) == []


def test_errors_are_one_line(conf):
    run = shingle("-c", conf, "quota", "set", "/nope", "--bytes", "1", check=False)
    assert run.returncode == 1 and ("No such file" in run.stderr or "not found" in run.stderr)
    run = shingle("-c", conf, "quota", "set", "/team", check=False)
    assert run.returncode == 2 and "give --bytes" in run.stderr
    run = shingle("-c", conf, "quota", "set", "/team", "--bytes", "lots", check=False)
    assert run.returncode == 2
    run = shingle("-c", conf, "quota", "remove", "/team", check=False)
    assert run.returncode == 1 and "no quota" in run.stderr


def test_fsck_finds_a_wrong_counter_and_recount_fixes_it(conf):
    shingle("-c", conf, "quota", "set", "/team", "--bytes", "1GiB")
    assert shingle("-c", conf, "fsck").returncode == 0
    with Appliance(config_mod.load(conf), with_data=False) as appliance:
        appliance.catalog.run(lambda c: sql(c, "UPDATE quotas SET used_files = 7").close())
    run = shingle("-c", conf, "fsck", check=False)
    assert run.returncode == 1 and "counts 5000 bytes and 7 files" in run.stdout
    run = shingle("-c", conf, "quota", "recount", "--check", check=False)
    assert run.returncode == 1 and "1 quota counters found wrong" in run.stdout
    assert "corrected" in shingle("-c", conf, "quota", "recount").stdout
    assert shingle("-c", conf, "fsck").returncode == 0
    assert listed(conf)[0]["used_files"] == 1
    shingle("-c", conf, "quota", "remove", "/team")
