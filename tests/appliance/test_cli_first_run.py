"""A first run as a new user makes it: real disk use, finding the config, --version, help, pipes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import clirunner
import pytest

from engine.base.units import format_duration, format_size, format_value

REPO = Path(__file__).resolve().parent.parent.parent


def shingle(*args, check=True, cwd=None, env=None):
    # a fresh interpreter for another folder or environment (clirunner), as these tests need
    run = clirunner.run(list(args), cwd=cwd, env=env, timeout=120)
    if check:
        assert run.returncode == 0, run.stderr
    return run


def environment(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "SHINGLE_CONFIG"}
    env["PYTHONPATH"] = str(REPO)  # the subprocess runs in another folder
    env.update(extra)
    return env


def real_and_apparent(folder: Path) -> tuple[int, int]:
    files = [p for p in folder.rglob("zone-*")]
    return sum(p.stat().st_blocks * 512 for p in files), len(files)


def test_no_preallocate_zone_files_grow_as_written(tmp_path):
    home = tmp_path / "sparse"
    out = shingle(
        "init", str(home), "--drive-size", "64MiB", "--zone-size", "4MiB", "--no-preallocate"
    ).stdout
    assert "not preallocated" in out and "up to 640.0 MiB" in out
    assert f"export SHINGLE_CONFIG={home / 'shingle.toml'}" in out
    real, zone_files = real_and_apparent(home / "drives")
    assert zone_files == 10 * 16 and real == 0  # nothing reserved, nothing written yet

    from appliance import config as config_mod
    from appliance.runtime import Appliance
    from engine.namespace import ROOT

    payload = os.urandom(3 << 20)
    with Appliance(config_mod.load(home / "shingle.toml")) as appliance:
        ns = appliance.namespace
        f = ns.create(ROOT, ns.root_ino, "data.bin")
        ns.write(f.ino, 0, payload, stable=True)
    with Appliance(config_mod.load(home / "shingle.toml")) as appliance:
        assert appliance.namespace.read(f.ino, 0, len(payload)) == payload
    real, _ = real_and_apparent(home / "drives")
    # the bytes written take real disk now (fragments + parity), far below the drives' size
    assert len(payload) <= real < 64 << 20
    status = json.loads(shingle("-c", str(home / "shingle.toml"), "status", "--json").stdout)
    assert status["capacity"]["raw_bytes"] == 10 * (64 << 20)  # capacity counts zones, not disk use


def test_preallocated_zone_files_reserve_their_size(tmp_path):
    home = tmp_path / "full"
    out = shingle("init", str(home), "--drive-size", "16MiB", "--zone-size", "4MiB").stdout
    assert "160.0 MiB of real disk reserved now" in out and "--no-preallocate" in out
    real, zone_files = real_and_apparent(home / "drives")
    assert zone_files == 40
    try:
        assert real >= 160 << 20
    except AssertionError:
        pytest.skip("this filesystem has no fallocate")
    assert all(
        p.stat().st_size == 0 for p in (home / "drives").rglob("zone-*")
    )  # write pointers at 0


def test_init_refuses_to_preallocate_more_than_the_disk_holds(tmp_path):
    huge = shingle(
        "init", str(tmp_path / "h"), "--drive-size", "1000TiB", "--zone-size", "256MiB", check=False
    )
    assert (
        huge.returncode == 2
        and "--no-preallocate" in huge.stderr
        and "Traceback" not in huge.stderr
    )
    assert not (tmp_path / "h").exists()


def test_config_is_found_from_c_then_the_variable_then_var_appliance(tmp_path):
    a, b, local = tmp_path / "a", tmp_path / "b", tmp_path / "cwd" / "var" / "appliance"
    for home in (a, b, local):
        shingle(
            "init", str(home), "--drive-size", "16MiB", "--zone-size", "4MiB", "--no-preallocate"
        )
    cwd = tmp_path / "cwd"

    def data_dir(*args, **env) -> str:
        out = shingle(*args, "status", "--json", cwd=cwd, env=environment(**env)).stdout
        return json.loads(out)["catalog"]["url"]

    assert str(local) in data_dir()
    assert str(b) in data_dir(SHINGLE_CONFIG=str(b / "shingle.toml"))
    assert str(a) in data_dir("-c", str(a / "shingle.toml"), SHINGLE_CONFIG=str(b / "shingle.toml"))
    # a wrong path in the variable is reported, not replaced by another appliance's config
    wrong = shingle(
        "status", cwd=cwd, env=environment(SHINGLE_CONFIG=str(tmp_path / "nope.toml")), check=False
    )
    assert wrong.returncode == 2 and "nope.toml" in wrong.stderr


def test_no_config_anywhere_says_what_was_tried(tmp_path):
    if Path("/etc/shingle/shingle.toml").exists():
        pytest.skip("this host has an installed appliance")
    run = shingle("status", cwd=tmp_path, env=environment(), check=False)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    for tried in (
        "-c",
        "$SHINGLE_CONFIG",
        "./var/appliance/shingle.toml",
        "/etc/shingle/shingle.toml",
    ):
        assert tried in run.stderr


def test_version():
    run = shingle("--version")
    import tomllib

    expected = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert run.stdout.strip().startswith(f"shingle {expected} (Python ")


@pytest.mark.parametrize(
    "command, example",
    [
        ("retention", "shingle retention add '/checkpoints/"),
        ("trash", "shingle trash restore 42"),
        ("drives", "shingle drives fail 3"),
    ],
)
def test_action_help_has_examples(command, example):
    out = shingle(command, "--help").stdout
    assert "examples:" in out and example in out and "actions:" in out


def test_a_closed_pipe_ends_quietly(tmp_path):
    home = tmp_path / "p"
    shingle("init", str(home), "--drive-size", "16MiB", "--zone-size", "4MiB", "--no-preallocate")
    command = (
        f"{sys.executable} -m appliance.cli -c {home / 'shingle.toml'} status --json | head -1; "
        f"{sys.executable} -m appliance.cli --help | head -1"
    )
    run = subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, timeout=120, env=environment()
    )
    assert run.stdout.splitlines()[0] == "{" and run.stdout.splitlines()[1].startswith("usage:")
    assert "Traceback" not in run.stderr and "BrokenPipe" not in run.stderr, run.stderr
    assert run.stderr == ""


def test_units_read_as_people_write_them():
    assert format_size(512) == "512 B" and format_size(1536) == "1.5 KiB"
    assert format_size(776 << 20) == "776.0 MiB" and format_size(3 << 30) == "3.0 GiB"
    assert format_duration(17.257074370000055) == "17.3 s" and format_duration(125) == "2 min 5 s"
    assert format_duration(7300) == "2 h 1 min" and format_duration(0.004) == "4.0 ms"
    assert format_value("elapsed_s", 17.257074370000055) == "17.3 s"
    assert (
        format_value("bytes_written", 5) == "5 B" and format_value("free_bytes", 2048) == "2.0 KiB"
    )
    assert format_value("mb_per_s", 123.456) == "123" and format_value("stripes", 4) == 4


def test_progress_lines_show_one_eta():
    import io

    from appliance.cli.lifecycle import ProgressLine
    from engine.lifecycle.pacing import Tracker

    clock = iter([0.0, 0.0, 10.0, 10.0, 10.0]).__next__
    stream = io.StringIO()
    tracker = Tracker(100 << 20, ProgressLine(stream), "rebuild", clock=clock)
    tracker.add(25 << 20, force=True)
    line = stream.getvalue().splitlines()[-1]
    assert line.count("ETA") == 1 and "ETA 30.0 s" in line and "25.0 MiB of 100.0 MiB" in line, line
    bare = ProgressLine(io.StringIO())
    bare(1, 4, "copying")
    assert bare.stream.getvalue().count("ETA") == 1  # a message without one gets the line's own
