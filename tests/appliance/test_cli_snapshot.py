"""`shingle snapshot ...` as an admin runs it: create, list --json, diff, clone, rollback,
delete."""

from __future__ import annotations

import json

import clirunner

from appliance import config as config_mod
from appliance.runtime import Appliance
from engine.namespace import ROOT


def shingle(*args, check=True):
    run = clirunner.run(list(args))
    if check:
        assert run.returncode == 0, run.stderr
    return run


def _write(appliance, path: str, data: bytes) -> None:
    ns = appliance.namespace
    parent, name = path.rsplit("/", 1)
    attr = ns.create(ROOT, ns.resolve(parent).ino, name, exclusive=False)
    ns.setattr(ROOT, attr.ino, size=0)
    ns.write(attr.ino, 0, data, stable=True)


def _read(appliance, path: str) -> bytes:
    ns = appliance.namespace
    attr = ns.resolve(path)
    return bytes(ns.read(attr.ino, 0, attr.size))


def test_snapshot_commands(tmp_path):
    home = tmp_path / "a"
    shingle("init", str(home), "--drives", "10", "--drive-size", "64MiB", "--zone-size", "4MiB")
    conf = str(home / "shingle.toml")
    config = config_mod.load(conf)
    with Appliance(config) as appliance:
        ns = appliance.namespace
        web = ns.mkdir(ROOT, ns.mkdir(ROOT, ns.root_ino, "datasets").ino, "web")
        ns.mkdir(ROOT, web.ino, "img")
        _write(appliance, "/datasets/web/index.html", b"<h1>v1</h1>")
        _write(appliance, "/datasets/web/img/logo", b"L" * 100_000)

    out = shingle("-c", conf, "snapshot", "create", "/datasets/web", "monday").stdout
    assert "monday" in out
    listed = json.loads(shingle("-c", conf, "snapshot", "list", "/datasets/web", "--json").stdout)
    if not listed[0]["counted"]:  # a lazy view (lazyviews.ENABLED): counted after, through it
        listed = json.loads(
            shingle("-c", conf, "snapshot", "list", "/datasets/web", "--recount", "--json").stdout
        )
    assert [s["name"] for s in listed] == ["monday"]
    assert {"name", "created", "referenced_bytes", "unique_bytes"} <= set(listed[0])
    assert listed[0]["referenced_bytes"] == 100_000 + len(b"<h1>v1</h1>")
    assert listed[0]["unique_bytes"] == 0

    with Appliance(config) as appliance:
        _write(appliance, "/datasets/web/index.html", b"<h1>v2</h1>")
        _write(appliance, "/datasets/web/new", b"n")
        assert _read(appliance, "/datasets/web/.snapshots/monday/index.html") == b"<h1>v1</h1>"
    diff = shingle("-c", conf, "snapshot", "diff", "/datasets/web", "monday").stdout.split("\n")
    assert "M index.html" in diff and "+ new" in diff
    as_json = json.loads(
        shingle("-c", conf, "snapshot", "diff", "/datasets/web", "monday", "--json").stdout
    )
    assert {"change": "added", "path": "new"} in as_json

    shingle("-c", conf, "snapshot", "clone", "/datasets/web", "monday", "/datasets/web-monday")
    shingle("-c", conf, "dataset", "clone", "/datasets/web/.snapshots/monday", "/datasets/web-2")
    bad = shingle(
        "-c", conf, "dataset", "clone", "/datasets/web/monday", "/datasets/x", check=False
    )
    assert bad.returncode != 0 and "DIR/.snapshots/NAME" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr
    shingle("-c", conf, "snapshot", "rollback", "/datasets/web", "monday")
    with Appliance(config) as appliance:
        assert _read(appliance, "/datasets/web/index.html") == b"<h1>v1</h1>"
        assert _read(appliance, "/datasets/web-monday/img/logo") == b"L" * 100_000
        assert _read(appliance, "/datasets/web-2/index.html") == b"<h1>v1</h1>"
        _write(appliance, "/datasets/web-monday/index.html", b"clone's own")
        assert _read(appliance, "/datasets/web/index.html") == b"<h1>v1</h1>"
    assert shingle("-c", conf, "snapshot", "diff", "/datasets/web", "monday").stdout == ""

    again = shingle("-c", conf, "snapshot", "create", "/datasets/web", "monday", check=False)
    assert again.returncode == 1 and "exists" in again.stderr and "Traceback" not in again.stderr
    shingle("-c", conf, "snapshot", "delete", "/datasets/web", "monday")
    assert (
        json.loads(shingle("-c", conf, "snapshot", "list", "/datasets/web", "--json").stdout) == []
    )
    missing = shingle("-c", conf, "snapshot", "delete", "/datasets/web", "monday", check=False)
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    report = json.loads(shingle("-c", conf, "fsck", "--json").stdout)
    assert report["clean"], report["problems"]


def test_snapshot_schedule_prune_and_archive_commands(tmp_path):
    home = tmp_path / "a"
    shingle("init", str(home), "--drives", "10", "--drive-size", "64MiB", "--zone-size", "4MiB")
    conf = str(home / "shingle.toml")
    config = config_mod.load(conf)
    with Appliance(config) as appliance:
        ns = appliance.namespace
        ns.mkdir(ROOT, ns.mkdir(ROOT, ns.root_ino, "datasets").ino, "web")
        _write(appliance, "/datasets/web/model", b"M" * 200_000)
    # four snapshots named as a daily schedule names them, the newest last
    names = [f"auto-2026-11-{day}T0300Z" for day in (26, 27, 28, 29)]
    for n, name in enumerate(names):
        with Appliance(config) as appliance:
            _write(appliance, "/datasets/web/model", bytes([n]) * 200_000)
        shingle("-c", conf, "snapshot", "create", "/datasets/web", name)
    shingle("-c", conf, "snapshot", "create", "/datasets/web", "by-hand")

    out = shingle(
        "-c", conf, "snapshot", "schedule", "add", "/datasets/web", "daily", "--at", "03:00",
        "--keep-last", "2",
    ).stdout  # fmt: skip
    assert "daily at 03:00 UTC, keeping the newest 2" in out
    [listed] = json.loads(shingle("-c", conf, "snapshot", "schedule", "list", "--json").stdout)
    assert (listed["path"], listed["prefix"], listed["at"]) == ("/datasets/web", "auto", "03:00")
    assert listed["next_ns"] % (86400 * 10**9) == 3 * 3600 * 10**9

    def snapshot_names():
        listing = shingle("-c", conf, "snapshot", "list", "/datasets/web", "--json").stdout
        return [s["name"] for s in json.loads(listing)]

    dry = shingle("-c", conf, "snapshot", "prune", "--dry-run").stdout
    assert "delete" in dry and names[0] in dry and names[1] in dry and names[2] not in dry
    assert "frees 195.3 KiB" in dry  # each held its own bytes
    assert snapshot_names() == [*names, "by-hand"]  # the dry run changed nothing
    run = shingle("-c", conf, "snapshot", "prune").stdout
    assert "snapshot-schedule job" in run and "done" in run
    assert snapshot_names() == [names[2], names[3], "by-hand"]

    taken = shingle(
        "-c", conf, "snapshot", "schedule", "add", "/datasets/web", "hourly", check=False
    )
    assert taken.returncode == 1 and "another prefix" in taken.stderr
    assert "Traceback" not in taken.stderr
    missing = shingle("-c", conf, "snapshot", "schedule", "add", "/nowhere", "daily", check=False)
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    sid = str(listed["id"])
    out = shingle(
        "-c", conf, "snapshot", "schedule", "set", sid, "--keep-last", "none", "--keep-for", "7d"
    ).stdout
    assert "keeping those younger than 7 d" in out

    archived = json.loads(
        shingle("-c", conf, "snapshot", "archive", "/datasets/web", names[2], "--json").stdout
    )
    assert archived["state"] == "done", archived
    assert archived["result"]["bytes_moved"] == 200_000
    with Appliance(config) as appliance:
        assert (
            _read(appliance, f"/datasets/web/.snapshots/{names[2]}/model") == bytes([2]) * 200_000
        )
    bad = shingle("-c", conf, "snapshot", "archive", "/datasets/web", "nope", check=False)
    assert bad.returncode == 1 and "no snapshot" in bad.stderr

    shingle("-c", conf, "snapshot", "schedule", "remove", sid)
    assert json.loads(shingle("-c", conf, "snapshot", "schedule", "list", "--json").stdout) == []
    assert snapshot_names() == [names[2], names[3], "by-hand"]  # its snapshots stay
    report = json.loads(shingle("-c", conf, "fsck", "--json").stdout)
    assert report["clean"], report["problems"]
