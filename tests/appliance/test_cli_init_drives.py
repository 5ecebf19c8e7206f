"""`shingle init DIR --drive PATH ...`: the drives named one by one, made as `drives add` makes
them (folders here; zoned block devices in tests/kernel/test_zoned.py), and every drive that
cannot be one refused before anything is made."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_cli_first_run import shingle


def environment() -> dict:
    """The tests' environment without SHINGLE_CONFIG (the commands run in the repository)."""
    return {k: v for k, v in os.environ.items() if k != "SHINGLE_CONFIG"}


def init(home: Path, *args: str, check: bool = True):
    return shingle("init", str(home), *args, check=check, env=environment())


def test_named_folders_become_the_drives(tmp_path):
    folders = [tmp_path / "disks" / f"d{n}" for n in range(10)]
    folders[0].mkdir(parents=True)  # an empty folder is taken as a new one
    args = [a for f in folders for a in ("--drive", str(f))]
    out = init(
        tmp_path / "home",
        *args,
        "--drive-size",
        "16MiB",
        "--zone-size",
        "4MiB",
        "--no-preallocate",
    ).stdout
    assert "10 emulated" in out, out
    config = str(tmp_path / "home" / "shingle.toml")
    status = json.loads(shingle("-c", config, "status", "--json", env=environment()).stdout)
    assert sorted(d["path"] for d in status["drives"]) == sorted(str(f) for f in folders)
    assert all(d["size_bytes"] == 16 << 20 for d in status["drives"])
    assert not (tmp_path / "home" / "drives").exists()  # none made in the default place


@pytest.mark.parametrize(
    ("drives", "says"),
    [
        (["/dev/shingle-no-such-disk"], "no such device"),
        (["{tmp}/a", "{tmp}/a"], "given twice"),
        (["{tmp}/file"], "a zoned block device or a new or empty folder"),
    ],
)
def test_a_drive_that_cannot_be_one_is_refused_before_anything_is_made(tmp_path, drives, says):
    (tmp_path / "file").write_text("not a drive\n")
    named = [d.format(tmp=tmp_path) for d in drives]
    named += [str(tmp_path / f"other{n}") for n in range(10 - len(named))]
    run = init(tmp_path / "home", *[a for d in named for a in ("--drive", d)], check=False)
    assert run.returncode == 2 and says in run.stderr, run.stderr
    assert "Traceback" not in run.stderr
    assert not (tmp_path / "home").exists() and not (tmp_path / "a").exists()


def test_drives_and_drive_together_are_refused(tmp_path):
    run = init(tmp_path / "home", "--drives", "10", "--drive", str(tmp_path / "a"), check=False)
    assert run.returncode == 2 and "either a count" in run.stderr, run.stderr


def test_too_few_named_drives_for_the_band_classes(tmp_path):
    run = init(tmp_path / "home", "--drive", str(tmp_path / "a"), check=False)
    assert run.returncode == 2 and "need at least 10 drives" in run.stderr, run.stderr


def conventional_block_device() -> str | None:
    """A block device of this machine that is not zoned (a loop device, a virtio disk)."""
    for queue in sorted(Path("/sys/block").glob("*/queue/zoned")):
        name = queue.parent.parent.name
        if queue.read_text().strip() == "none" and Path("/dev", name).exists():
            return f"/dev/{name}"
    return None


def test_a_block_device_that_is_not_zoned_is_refused(tmp_path):
    device = conventional_block_device()
    if device is None:
        pytest.skip("no block device on this machine")
    named = [device] + [str(tmp_path / f"d{n}") for n in range(9)]
    run = init(tmp_path / "home", *[a for d in named for a in ("--drive", d)], check=False)
    assert run.returncode != 0, run.stdout
    assert "not a host-managed zoned block device" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr
    assert not (tmp_path / "home").exists()


def test_status_shows_the_device_errors_the_daemon_sampled(tmp_path):
    """A zoned block device's faults (drive_<id>_device_errors, sampled by the daemon from
    engine/drives/blkzoned.py) show in `shingle status` and `shingle drives list`; drives
    without any show none."""
    from engine.admin import metrics
    from engine.catalog import Catalog

    home = tmp_path / "home"
    init(home, "--drive-size", "16MiB", "--zone-size", "4MiB", "--no-preallocate")
    catalog = Catalog(f"sqlite:///{home}/catalog.db")
    try:
        metrics.record_sample(
            catalog,
            drive_1_device_errors=4,
            drive_1_off_pointer_errors=0,
            drive_3_device_errors=2,
            drive_3_off_pointer_errors=1,
        )
    finally:
        catalog.close()
    config = str(home / "shingle.toml")
    report = json.loads(shingle("-c", config, "status", "--json", env=environment()).stdout)
    by_id = {d["id"]: d for d in report["drives"]}
    assert (by_id[1]["device_errors"], by_id[1]["off_pointer_errors"]) == (4, 0)
    assert "device_errors" not in by_id[2]
    text = shingle("-c", config, "status", env=environment()).stdout
    assert text.count("device errors") == 2 and "(4 device errors)" in text, text
    assert "(2 device errors, 1 of them off-pointer writes: expected 0)" in text, text
    listed = json.loads(shingle("-c", config, "drives", "list", "--json", env=environment()).stdout)
    assert [(d["id"], d.get("device_errors"), d.get("off_pointer_errors")) for d in listed[:4]] == [
        (1, 4, 0),
        (2, None, None),
        (3, 2, 1),
        (4, None, None),
    ]
    lines = shingle("-c", config, "drives", "list", env=environment()).stdout.splitlines()
    assert lines[0].endswith("(4 device errors)") and "device errors" not in lines[1], lines
    assert lines[2].endswith("(2 device errors, 1 of them off-pointer writes: expected 0)")
