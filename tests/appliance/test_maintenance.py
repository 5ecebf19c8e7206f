"""The daemon's maintenance loop: scheduled jobs come due and run, queued jobs run,
counters are sampled for the charts."""

from __future__ import annotations

import os
import re
import time

from test_cli_lifecycle import shingle

from appliance import config as config_mod
from appliance.maintenance import Maintenance
from appliance.runtime import Appliance
from engine.admin import jobs, metrics


def wait_for(predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("condition not reached in time")


def test_scheduled_and_queued_jobs_run_and_counters_are_sampled(tmp_path):
    home = tmp_path / "a"
    shingle("init", str(home), "--drive-size", "128MiB", "--zone-size", "8MiB")
    path = home / "shingle.toml"
    text = path.read_text()
    for key in ("retention", "tier", "clean", "scrub", "trash_purge"):
        text, count = re.subn(
            rf"^# {key}_interval_s = \d+$", f"{key}_interval_s = 1", text, flags=re.M
        )
        assert count == 1, key
    path.write_text(text)
    config = config_mod.load(path)
    counter = {"n": 0}

    def counters():
        counter["n"] += 1
        return {"nfs_ops": counter["n"], "nfs_read_bytes": 4096 * counter["n"]}

    with Appliance(config) as appliance:
        loop = Maintenance(appliance, counters=counters, tick_s=0.05, sample_every_s=0.2)
        queued = jobs.submit(appliance.catalog, "scrub", {}, actor="alice")
        loop.start()
        try:
            assert wait_for(lambda: jobs.get(appliance.catalog, queued).finished)
            kinds = {"retention", "tier", "clean", "scrub", "trash-purge"}  # every scheduled kind
            done = wait_for(
                lambda: (
                    {
                        j.kind
                        for j in jobs.recent(appliance.catalog, 50)
                        if j.actor == "schedule" and j.state == "done"
                    }
                    >= kinds
                    and kinds
                )
            )
            assert done == kinds
            wait_for(lambda: metrics.latest(appliance.catalog).get("nfs_ops", 0) >= 2)
        finally:
            loop.stop()
            loop.join(30)
        assert jobs.get(appliance.catalog, queued).state == "done"
        failed = [j for j in jobs.recent(appliance.catalog, 50) if j.state == "failed"]
        assert not failed, [(j.kind, j.message) for j in failed]


def test_the_loop_notices_a_drive_folder_gone_and_back_without_any_io(tmp_path):
    from engine.admin.events import recent
    from engine.lifecycle.drives import get_drive

    home = tmp_path / "d"
    shingle("init", str(home), "--drive-size", "128MiB", "--zone-size", "8MiB")
    path = home / "shingle.toml"
    text, count = re.subn(
        r"^# drive_check_interval_s = [\d.]+$",
        "drive_check_interval_s = 0.2",
        path.read_text(),
        flags=re.M,
    )
    assert count == 1
    path.write_text(text)
    config = config_mod.load(path)
    with Appliance(config) as appliance:
        drive = next(iter(appliance.datapath.space.drives.values()))
        loop = Maintenance(appliance, tick_s=0.05)
        loop.start()
        try:
            os.rename(drive.path, drive.path + ".away")
            wait_for(lambda: get_drive(appliance.catalog, drive.id).state == "missing")
            os.rename(drive.path + ".away", drive.path)
            wait_for(lambda: get_drive(appliance.catalog, drive.id).state == "online")
        finally:
            loop.stop()
            loop.join(30)
        moves = [
            (e.details["from"], e.details["to"])
            for e in recent(appliance.catalog, 20)
            if e.kind == "drive.state" and e.details["drive_id"] == drive.id
        ]
        assert moves == [("missing", "online"), ("online", "missing")]
