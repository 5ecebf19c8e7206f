"""The lifecycle job runners the daemon's queue calls, with the policy from catalog settings."""

from __future__ import annotations

import json

import pytest

from engine.admin.events import recent
from engine.base import errors
from engine.lifecycle import drives as drive_states
from engine.lifecycle.jobs import runners, tiering_policy

from .conftest import KiB, random_bytes, sha


def test_runners_do_each_job_and_return_json(rig):
    rig.write_file("/data/a", random_bytes(150 * KiB, 1))
    rig.write_file("/archive/b", random_bytes(60 * KiB, 2))
    rig.catalog.set_setting("tiering.path_rules", json.dumps([["/archive", "cold"]]))
    rig.catalog.set_setting("tiering.hot_to_warm_after_s", "0")
    policy = tiering_policy(rig.catalog)
    assert policy.path_rules == [("/archive", "cold")] and policy.hot_to_warm_after_s == 0.0
    jobs = runners(rig.ns, rig.data, rig.catalog)
    assert set(jobs) == {
        "tier",
        "clean",
        "scrub",
        "rebuild",
        "drain",
        "drive-add",
        "drive-replace",
    } | {
        "host-join",
        "host-drain",
        "host-remove",
        "host-replace",
    }
    seen = []
    progress = lambda d, t, m: seen.append(m)  # noqa: E731
    result = jobs["tier"]({}, progress, "cli")
    assert result["moves"] == {"warm->cold": 1}
    json.dumps(result)
    assert jobs["scrub"]({}, progress, "cli")["bad"] == 0
    assert "zones_cleaned" in jobs["clean"]({"max_zones": 2}, progress, "cli")
    drive_states.fail_drive(rig.catalog, rig.drive_ids[1])
    assert jobs["rebuild"]({}, progress, "cli")["status"]["reduced"] == 0
    report = jobs["drain"]({"drive": str(rig.drive_ids[4])}, progress, "cli")
    assert report["drives_drained"] == [rig.drive_ids[4]]
    assert sha(rig.read_file("/archive/b")) == sha(random_bytes(60 * KiB, 2))
    assert {e.actor for e in recent(rig.catalog, kind_prefix="tier.run")} == {"cli"}
    assert seen
    with pytest.raises(errors.NotFound, match="no host 'nowhere'"):
        jobs["host-drain"]({"host": "nowhere"}, progress, "cli")


def test_bad_tiering_settings_are_reported(rig):
    rig.catalog.set_setting("tiering.path_rules", json.dumps([["archive", "cold"]]))
    with pytest.raises(errors.InvalidArgument, match="path rule"):
        tiering_policy(rig.catalog)
