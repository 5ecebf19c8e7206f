"""Snapshot schedules: slots and names, keep-last-N, keep-for, both, a dry run that changes
nothing, failures that do not stop other schedules, and the visible .snapshots option.

The scheduler's clock is moved by hand (snapshot names and ages come from slot times)."""

from __future__ import annotations

import calendar

import pytest
from dphelpers import KiB, check_accounting

from engine.admin import fsck
from engine.base import errors
from engine.namespace import ROOT, Namespace
from engine.namespace.paths import iter_dir
from engine.snapshots.schedules import SnapshotScheduler, name_pattern, parse_at, snapshot_name
from engine.snapshots.service import Snapshots

HOUR = 3600
# Wednesday 2026-12-02 00:10 UTC
T0 = calendar.timegm((2026, 12, 2, 0, 10, 0))


class Clock:
    def __init__(self, at_s: int):
        self.s = at_s

    def __call__(self) -> int:
        return self.s * 10**9


def _dataset(ns, name="ds"):
    ds = ns.mkdir(ROOT, ns.root_ino, name)
    f = ns.create(ROOT, ds.ino, "model.pt")
    ns.write(f.ino, 0, b"w" * (64 * KiB), stable=True)
    return ds, f


def _names(snaps, path="/ds"):
    return [s.name for s in snaps.list(path)]


def test_slots_names_and_at_parsing():
    assert snapshot_name("auto", calendar.timegm((2026, 12, 2, 3, 0, 0))) == "auto-2026-12-02T0300Z"
    assert name_pattern("auto").fullmatch("auto-2026-12-02T0300Z")
    assert not name_pattern("auto").fullmatch("auto-hourly-2026-12-02T0300Z")
    assert parse_at("hourly", ":15") == parse_at("hourly", "15") == 900
    assert parse_at("daily", "03:30") == 3 * HOUR + 1800
    assert parse_at("weekly", "Tue 03:00") == 86400 + 3 * HOUR
    for frequency, bad in (("hourly", "61"), ("daily", "25:00"), ("weekly", "Fun 03:00")):
        with pytest.raises(errors.InvalidArgument, match="at "):
            parse_at(frequency, bad)


def test_hourly_keep_last_3_takes_slots_and_prunes_the_oldest(sqlite_engine):
    ns = sqlite_engine.ns
    ds, f = _dataset(ns)
    clock = Clock(T0)
    sched = SnapshotScheduler(ns, clock=clock)
    snaps = Snapshots(ns)
    s = sched.add("/ds", "hourly", at=":00", keep_last=3, actor="test")
    assert sched.due() == [] and sched.preview() == []  # the first slot is the next one
    taken = []
    for hour in range(1, 6):
        clock.s = T0 + hour * HOUR
        ns.write(f.ino, 0, bytes([hour]) * KiB, stable=True)  # each snapshot holds other bytes
        assert [d.id for d in sched.due()] == [s.id]
        done = sched.run(actor="test")
        assert all(d.outcome == "done" for d in done), done
        taken.append(snapshot_name("auto", T0 - 600 + hour * HOUR))
        assert sched.due() == []
        assert sched.run(actor="test") == []  # nothing more in the same slot
    assert _names(snaps) == taken[-3:]
    assert taken[-1] == "auto-2026-12-02T0500Z"
    # the oldest kept snapshot still reads its own bytes
    oldest = ns.resolve(f"/ds/.snapshots/{taken[-3]}/model.pt")
    assert ns.read(oldest.ino, 0, KiB) == bytes([3]) * KiB
    assert sched.get(s.id).last_error is None
    check_accounting(sqlite_engine.catalog)
    assert fsck.check(sqlite_engine.catalog, ns.root_ino).clean


def test_keep_for_and_both_rules_and_a_dry_run_changes_nothing(engine):
    ns = engine.ns
    _dataset(ns)
    clock = Clock(T0)
    sched = SnapshotScheduler(ns, clock=clock)
    snaps = Snapshots(ns)
    daily = sched.add("/ds", "interval", interval_s=6 * HOUR, keep_for_s=13 * HOUR)
    for step in range(1, 6):  # five snapshots, 6 h apart
        clock.s = T0 + step * 6 * HOUR
        sched.run()
    # kept: the slots younger than 13 h (0 h, 6 h and 12 h old)
    assert len(_names(snaps)) == 3
    # the dry run: the due snapshot and the deletions, and nothing happens
    clock.s += 6 * HOUR
    before = (_names(snaps), sched.get(daily.id))
    planned = sched.preview()
    assert [p.action for p in planned] == ["create", "delete"]
    assert planned[1].name == _names(snaps)[0] and "13 h" in planned[1].reason
    assert planned[1].unique_bytes == 0  # the file never changed: every stripe is shared
    assert (_names(snaps), sched.get(daily.id)) == before
    assert sched.due() and sched.preview() == planned
    # keep-last 4 added to keep-for: a snapshot stays when either rule keeps it
    sched.update(daily.id, keep_last=4)
    planned = sched.preview()
    assert [p.action for p in planned] == ["create"]
    done = sched.run()
    assert [d.outcome for d in done] == ["done"]
    assert len(_names(snaps)) == 4
    clock.s += 6 * HOUR
    done = sched.run()
    assert [(d.action, d.outcome) for d in done] == [("create", "done"), ("delete", "done")]
    assert len(_names(snaps)) == 4
    check_accounting(engine.catalog)


def test_hand_made_snapshots_and_other_prefixes_are_left_alone(sqlite_engine):
    ns = sqlite_engine.ns
    _dataset(ns)
    clock = Clock(T0)
    snaps = Snapshots(ns)
    snaps.create("/ds", "before-upgrade")
    sched = SnapshotScheduler(ns, clock=clock)
    sched.add("/ds", "hourly", keep_last=1)
    sched.add("/ds", "daily", at="00:30", prefix="daily", keep_last=1)
    with pytest.raises(errors.Exists, match="another prefix"):
        sched.add("/ds", "weekly", keep_last=1)  # "auto" is taken on /ds
    for hour in range(1, 4):
        clock.s = T0 + hour * HOUR
        sched.run()
    assert _names(snaps) == ["before-upgrade", "daily-2026-12-02T0030Z", "auto-2026-12-02T0300Z"]


def test_a_broken_schedule_reports_and_others_still_run(sqlite_engine):
    ns = sqlite_engine.ns
    _dataset(ns)
    ns.mkdir(ROOT, ns.root_ino, "gone")
    clock = Clock(T0)
    sched = SnapshotScheduler(ns, clock=clock)
    broken = sched.add("/gone", "hourly", keep_last=2)
    good = sched.add("/ds", "hourly", keep_last=2)
    ns.rmdir(ROOT, ns.root_ino, "gone")
    clock.s = T0 + HOUR
    done = sched.run()
    outcomes = {d.schedule_id: d.outcome for d in done}
    assert outcomes[good.id] == "done"
    assert outcomes[broken.id].startswith("failed: ")
    assert "cannot be read" in sched.get(broken.id).last_error
    assert sched.due() == []  # the failed slot waits for the next one instead of looping
    with pytest.raises(errors.NotFound):
        sched.add("/missing", "hourly")
    with pytest.raises(errors.InvalidArgument, match="interval_s"):
        sched.add("/ds", "interval", prefix="i")
    with pytest.raises(errors.InvalidArgument, match="prefix"):
        sched.add("/ds", "daily", prefix="bad/prefix")


def test_visible_option_lists_snapshots_and_walks_stay_out(sqlite_engine):
    ns = sqlite_engine.ns
    ds, _f = _dataset(ns)
    Snapshots(ns).create("/ds", "s1")
    assert [e.name for e in ns.readdir(ROOT, ds.ino)[0]] == ["model.pt"]  # hidden by default
    visible = Namespace(sqlite_engine.catalog, data=sqlite_engine.data, snapshots_visible=True)
    assert sorted(e.name for e in visible.readdir(ROOT, ds.ino)[0]) == [".snapshots", "model.pt"]
    snapdir = visible.lookup(ROOT, ds.ino, ".snapshots")
    assert [e.name for e in visible.readdir(ROOT, snapdir.ino)[0]] == ["s1"]
    # the engine's own tree walks (retention, trash, tiering rules) never descend into it
    assert [e.name for e in iter_dir(visible, ds.ino)] == ["model.pt"]
