"""`shingle init` and `shingle status` as an admin runs them."""

from __future__ import annotations

import json

import clirunner


def shingle(*args, check=True):
    run = clirunner.run(list(args))
    if check:
        assert run.returncode == 0, run.stderr
    return run


def test_init_then_status(tmp_path):
    home = tmp_path / "appliance"
    out = shingle(
        "init", str(home), "--drives", "10", "--drive-size", "64MiB", "--zone-size", "4MiB"
    ).stdout
    assert "initialized" in out and "initial-admin-password" in out
    assert (home / "shingle.toml").exists()
    assert oct((home / "initial-admin-password").stat().st_mode & 0o777) == "0o600"
    report = json.loads(shingle("-c", str(home / "shingle.toml"), "status", "--json").stdout)
    assert report["catalog"]["backend"] == "sqlite" and report["catalog"]["inodes"] == 1
    assert len(report["drives"]) == 10
    assert all(d["zones"] == 16 and d["state"] == "online" for d in report["drives"])
    cap = report["capacity"]
    assert cap["raw_bytes"] == 10 * (64 << 20)
    # usable: 8 of 10 fragments carry data, less the zones kept for cleaning
    assert cap["usable_bytes"] == int((10 * (64 << 20) - 10 * 2 * (4 << 20)) * 0.8)
    text = shingle("-c", str(home / "shingle.toml"), "status").stdout
    assert "10" in text and "usable" in text


def test_init_makes_the_root_like_tmp_owned_by_the_squashed_identity(tmp_path):
    """A root client of the default export (root_squash) writes as 65534; the kernel refuses
    open(O_CREAT) of a file in a sticky world-writable folder that neither the opener nor the
    folder's owner owns (fs.protected_regular), so the root belongs to 65534."""
    from engine.admin.exports import list_exports
    from engine.catalog import Catalog
    from engine.namespace import Namespace

    home = tmp_path / "appliance"
    shingle("init", str(home), "--drive-size", "64MiB", "--zone-size", "4MiB", "--no-preallocate")
    catalog = Catalog(f"sqlite:///{home}/catalog.db")
    try:
        ns = Namespace(catalog)
        root = ns.getattr(ns.root_ino)
        (export,) = list_exports(catalog)
        assert export.squash == "root_squash"
        owner = (export.anon_uid, export.anon_gid)
        assert (root.mode & 0o7777, (root.uid, root.gid)) == (0o1777, owner)
    finally:
        catalog.close()


def test_init_refuses_existing_folder_and_bad_sizes(tmp_path):
    home = tmp_path / "a"
    shingle("init", str(home), "--drive-size", "64MiB", "--zone-size", "4MiB")
    again = shingle("init", str(home), check=False)
    assert again.returncode == 2 and "already initialized" in again.stderr
    few = shingle("init", str(tmp_path / "b"), "--drives", "3", check=False)
    assert few.returncode == 2 and "at least 10 drives" in few.stderr
    bad = shingle("init", str(tmp_path / "c"), "--drive-size", "lots", check=False)
    assert bad.returncode == 2 and "--drive-size" in bad.stderr and "Traceback" not in bad.stderr


def test_init_on_postgresql(tmp_path, postgres_server):
    url = postgres_server.create_database()
    home = tmp_path / "pg"
    shingle("init", str(home), "--catalog", url, "--drive-size", "64MiB", "--zone-size", "4MiB")
    report = json.loads(shingle("-c", str(home / "shingle.toml"), "status", "--json").stdout)
    assert report["catalog"]["backend"] == "postgresql" and len(report["drives"]) == 10


def test_fsck_of_fresh_appliance_is_clean(tmp_path):
    home = tmp_path / "f"
    shingle("init", str(home), "--drive-size", "64MiB", "--zone-size", "4MiB")
    report = json.loads(shingle("-c", str(home / "shingle.toml"), "fsck", "--json").stdout)
    assert report["clean"] and report["inodes"] == 1


def test_bench_subcommand_runs_benchmarks_and_refuses_unknown(tmp_path):
    bad = shingle("bench", "no-such-benchmark", check=False)
    assert bad.returncode == 2 and "catalog" in bad.stderr
    out = json.loads(
        shingle("bench", "catalog", "--files", "200", "--no-postgres", "--json").stdout
    )
    assert out["sqlite"]["create_per_s"] > 0 and out["files"] == 200
