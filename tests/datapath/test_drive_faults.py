"""Drives that disappear or fail I/O: a state and an event, a distinct write error, reads that
keep working, and a folder that comes back taken back (engine/datapath/drivewatch.py)."""

from __future__ import annotations

import errno
import logging
import os
import threading
import time

import pytest
from dphelpers import Engine, MiB

from appliance.status import gather
from engine.admin.events import recent
from engine.base import errors
from engine.lifecycle.drives import get_drive, start_drain
from engine.namespace import ROOT

STRIPE = 8 * 64 * 1024  # dphelpers.SMALL: 8+2 stripes of 64 KiB fragments


def wait_for(predicate, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


def make(engine, name: str, data: bytes) -> int:
    ns = engine.ns
    ino = ns.create(ROOT, ns.root_ino, name).ino
    ns.write(ino, 0, data)
    ns.commit(ino)
    return ino


def state_of(engine, drive_id: int) -> str:
    return get_drive(engine.catalog, drive_id).state


def drive_events(engine, drive_id: int, kind: str = "drive.state") -> list:
    return [
        e
        for e in recent(engine.catalog, 200, kind_prefix=kind)
        if (e.details or {}).get("drive_id") == drive_id
    ]


def hide(engine, drive_id: int) -> tuple[str, str]:
    """Rename a drive's folder away (as an unmounted or pulled disk would leave it)."""
    path = engine.data.space.drives[drive_id].path
    os.rename(path, path + ".away")
    return path, path + ".away"


def test_a_folder_renamed_away_under_a_writer_becomes_missing_state_and_event(sqlite_engine):
    engine = sqlite_engine
    gone = engine.drive_ids[4]
    written, failures, stop = [], [], threading.Event()

    def writer():
        n = 0
        while not stop.is_set():
            data = os.urandom(STRIPE + 1000)
            started = time.monotonic()
            try:
                written.append((make(engine, f"w{n}", data), data, started))
            except errors.IOFailure as exc:  # a stripe in flight when the folder went
                failures.append((started, exc))
            n += 1

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        wait_for(lambda: len(written) >= 3)
        hide(engine, gone)
        hidden_at = time.monotonic()
        wait_for(lambda: state_of(engine, gone) == "missing")
        detected_at = time.monotonic()
        # writes go on degraded on the 9 drives left (the write quorum of 8+2)
        wait_for(lambda: sum(1 for _i, _d, t in written if t > detected_at) >= 3)
    finally:
        stop.set()
        thread.join()
    assert detected_at - hidden_at < 5, "noticed by the writes themselves, not a later check"
    assert all(t < detected_at for t, _exc in failures), failures
    events = drive_events(engine, gone)
    assert [(e.details["from"], e.details["to"], e.severity) for e in events] == [
        ("online", "missing", "error")
    ]
    assert engine.data.space.drives[gone].state == "missing"
    # what `shingle status`, /metrics and the web UI drives page read
    report = gather(engine.catalog, engine.policies, engine.reserve_zones)
    assert {d["id"]: d["state"] for d in report["drives"]}[gone] == "missing"
    for ino, data, _t in written:
        assert engine.ns.read(ino, 0, len(data)) == data


def test_two_of_ten_missing_writes_fail_with_no_redundancy_logged_once_reads_and_return(
    sqlite_engine, caplog
):
    engine = sqlite_engine
    files = {f"f{i}": os.urandom(3 * STRIPE + 777 * i) for i in range(4)}
    inos = {name: make(engine, name, data) for name, data in files.items()}
    lost = engine.drive_ids[2], engine.drive_ids[7]
    moved = [hide(engine, drive_id) for drive_id in lost]
    engine.data.check_drives()  # the maintenance loop's periodic look, no I/O needed
    assert all(state_of(engine, d) == "missing" for d in lost)
    total, free = engine.data.capacity()
    assert free > 9 * MiB, "plenty of free space: the refusal is not about space"
    caplog.set_level(logging.INFO)
    target = engine.ns.create(ROOT, engine.ns.root_ino, "refused").ino
    for _attempt in range(25):
        with pytest.raises(errors.NoRedundancy) as refused:
            engine.ns.write(target, 0, os.urandom(9 * MiB))
            engine.ns.commit(target)
    exc = refused.value
    assert exc.errno == errno.EIO and not isinstance(exc, errors.NoSpace)
    assert "at least 9" in str(exc) and f"drive {lost[0]} missing" in str(exc)
    said = [r for r in caplog.records if "needs 10 drives" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.ERROR
    assert engine.ns.getattr(target).size == 0  # nothing partial
    # reads decode around the two missing drives: every byte
    engine.data.reader.drop_cache()
    for name, data in files.items():
        assert engine.ns.read(inos[name], 0, len(data) + 1) == data, name
    assert engine.data.reader.stats["degraded_stripes"] > 0
    # the folders come back: same labels, same write pointers -> online again, writes work
    for path, away in moved:
        os.rename(away, path)
    engine.data.check_drives()
    assert all(state_of(engine, d) == "online" for d in lost)
    assert [e.details["to"] for e in drive_events(engine, lost[0])] == ["online", "missing"]
    data = os.urandom(9 * MiB)
    engine.ns.write(target, 0, data)
    engine.ns.commit(target)
    engine.data.reader.drop_cache()
    assert engine.ns.read(target, 0, len(data)) == data
    for name, data in files.items():
        assert engine.ns.read(inos[name], 0, len(data)) == data, name


def test_a_missing_drive_stays_missing_after_a_restart_and_returns_to_its_earlier_state(
    sqlite_engine,
):
    engine = sqlite_engine
    drive_id = engine.drive_ids[1]
    start_drain(engine.catalog, drive_id)
    engine.data.refresh_drive_states()
    path, away = hide(engine, drive_id)
    engine.data.check_drives()
    assert state_of(engine, drive_id) == "missing"
    engine.restart()  # the folder still gone at start: no backend, still missing
    assert state_of(engine, drive_id) == "missing"
    os.rename(away, path)
    engine.data.check_drives()
    assert state_of(engine, drive_id) == "draining"


def test_a_folder_back_with_a_shorter_zone_comes_back_degraded(sqlite_engine):
    engine = sqlite_engine
    data = os.urandom(4 * STRIPE)
    ino = make(engine, "short", data)
    drive = next(
        d for d in engine.data.space.drives.values() if any(z.committed_wp for z in d.zones)
    )
    zone = next(z for z in drive.zones if z.committed_wp)
    path, away = hide(engine, drive.id)
    engine.data.check_drives()
    with open(os.path.join(away, f"zone-{zone.idx:06d}"), "r+b") as f:
        f.truncate(zone.committed_wp // 2)  # committed fragments lost while it was away
    os.rename(away, path)
    engine.data.check_drives()
    assert state_of(engine, drive.id) == "degraded"
    assert "shorter" in drive_events(engine, drive.id)[0].message
    engine.data.reader.drop_cache()
    assert engine.ns.read(ino, 0, len(data)) == data  # read, the lost fragments decoded


def test_another_drives_folder_at_the_path_is_refused_once(sqlite_engine):
    engine = sqlite_engine
    first, second = engine.drive_ids[0], engine.drive_ids[1]
    path, away = hide(engine, first)
    engine.data.check_drives()
    other = engine.data.space.drives[second].path
    os.symlink(other, path)  # the wrong disk mounted where drive `first` was
    try:
        engine.data.check_drives()
        engine.data.check_drives()
        assert state_of(engine, first) == "missing"
        refused = drive_events(engine, first, "drive.refused")
        assert len(refused) == 1 and "holds drive" in refused[0].message
    finally:
        os.unlink(path)
        os.rename(away, path)
    engine.data.check_drives()
    assert state_of(engine, first) == "online"


def test_a_write_error_makes_the_drive_degraded_and_writes_move_on(
    drive_writers, sqlite_catalog, tmp_path, monkeypatch
):
    engine = Engine(sqlite_catalog, tmp_path / "drives")
    bad = engine.data.space.drives[engine.drive_ids[3]]
    if drive_writers == "python":

        def failing_append(*args, **kwargs):  # a medium error: nothing here can cause a real EIO
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(bad.backend, "append", failing_append)
    else:
        # the C writer's pwrite fails for real: the claimed descriptor is one opened read-only
        real_claim = bad.backend.claim_append
        read_only: list[int] = []

        def claim_read_only(idx, offset, data):
            fd, data = real_claim(idx, offset, data)
            read_only.append(os.open(f"/proc/self/fd/{fd}", os.O_RDONLY))
            return read_only[-1], data

        monkeypatch.setattr(bad.backend, "claim_append", claim_read_only)
    attempts = []
    for n in range(6):
        data = os.urandom(STRIPE)
        try:
            attempts.append((make(engine, f"e{n}", data), data))
        except errors.IOFailure:
            attempts.append(None)
    wait_for(lambda: state_of(engine, bad.id) == "degraded")
    # the stripes that met the error commit without that fragment (9 of 10: the write quorum
    # of 8+2), later ones are placed on the other drives: no write fails
    assert all(item is not None for item in attempts), attempts
    assert engine.data.stats["fragments_lost_on_write"] >= 1
    events = drive_events(engine, bad.id)
    assert len(events) == 1 and "write failed" in events[0].message
    assert bad.state == "degraded" and not bad.write_failed  # the state keeps writes off now
    for item in attempts:
        if item is not None:
            assert engine.ns.read(item[0], 0, len(item[1])) == item[1]
    engine.close()
    if drive_writers == "native":
        assert read_only, "the bad drive was written to"
        for fd in read_only:
            os.close(fd)


def test_a_folder_back_without_one_of_its_zone_files_stays_missing(sqlite_engine):
    engine = sqlite_engine
    drive_id = engine.drive_ids[5]
    path, away = hide(engine, drive_id)
    engine.data.check_drives()
    os.rename(os.path.join(away, "zone-000003"), os.path.join(away, "zone-000003.lost"))
    os.rename(away, path)
    engine.data.check_drives()
    assert state_of(engine, drive_id) == "missing"
    assert "zone-000003" in drive_events(engine, drive_id, "drive.refused")[0].message
    os.rename(os.path.join(path, "zone-000003.lost"), os.path.join(path, "zone-000003"))
    engine.data.check_drives()
    assert state_of(engine, drive_id) == "online"


def test_the_event_loop_never_stats_a_drive_and_a_worker_does(sqlite_engine, monkeypatch):
    """A stat of a hung filesystem hangs: inside no_blocking() (the NFS event loop) a drive's
    presence is its last look, however old; outside it the folder is looked at again."""
    from engine.base.blocking import no_blocking
    from engine.datapath import drivestate

    drive = next(iter(sqlite_engine.data.space.drives.values()))
    me = threading.current_thread()
    looks = []  # this thread's (the drive watch looks too, from its own)

    def hung_stat():  # a hung NFS or FUSE mount under the drive: nothing here can make one
        if threading.current_thread() is me:
            looks.append("stat")
        return True

    monkeypatch.setattr(drive.backend, "present", hung_stat)
    monkeypatch.setattr(drivestate, "PRESENCE_TTL_S", 0.0)  # every look is due
    with no_blocking():
        assert drive.present() and drive.readable()
    assert looks == []
    assert drive.present()
    assert looks == ["stat"]


def test_the_drive_watch_keeps_presence_fresh_for_the_event_loop(sqlite_engine):
    """The event loop never stats; the drive watch looks every PRESENCE_TTL_S, so a folder that
    went away is seen gone from the loop too, and its reads go to a worker."""
    from engine.base.blocking import no_blocking

    drive_id = sqlite_engine.drive_ids[0]
    drive = sqlite_engine.data.space.drives[drive_id]
    hide(sqlite_engine, drive_id)

    def loop_sees_it_gone() -> bool:
        with no_blocking():
            return not drive.present()

    wait_for(loop_sees_it_gone, timeout=10)
    wait_for(lambda: state_of(sqlite_engine, drive_id) == "missing")


def test_a_stripe_that_loses_more_fragments_than_its_parity_allows_fails(
    sqlite_catalog, tmp_path, monkeypatch
):
    """Two appends of one 8+2 stripe fail: the 8 left are below the write quorum (9), so the
    write is not acknowledged (IOFailure, EIO), both drives become degraded, and what was
    committed before reads back."""
    from engine.datapath import writers

    monkeypatch.setattr(writers, "driveio", None)
    engine = Engine(sqlite_catalog, tmp_path / "drives")
    before = os.urandom(STRIPE)
    kept = make(engine, "kept", before)
    bad = [engine.data.space.drives[engine.drive_ids[n]] for n in (2, 7)]

    def failing_append(*args, **kwargs):
        raise OSError(errno.EIO, "Input/output error")

    for drive in bad:
        monkeypatch.setattr(drive.backend, "append", failing_append)
    with pytest.raises(errors.IOFailure):
        make(engine, "lost", os.urandom(STRIPE))
    assert engine.data.stats["fragments_lost_on_write"] == 0
    wait_for(lambda: all(state_of(engine, d.id) == "degraded" for d in bad))
    assert engine.ns.read(kept, 0, STRIPE) == before
    engine.close()


def test_a_missing_drive_is_named_by_what_holds_it():
    """A drive of an agent or a zoned device has no folder: the missing drive's event says what
    went (its folder, its device, or its agent that does not answer)."""
    from types import SimpleNamespace

    from engine.datapath.drivestate import describe_medium
    from engine.datapath.drivewatch import gone_reason

    def reason(backend: str, path: str, device: str | None = None) -> str:
        row = SimpleNamespace(backend=backend, path=path, device=device)
        return gone_reason(SimpleNamespace(backend_kind=backend, medium=describe_medium(row)))

    assert (
        reason("zonefile", "/srv/d/drive-003", "/dev/sda") == "its folder /srv/d/drive-003 is gone"
    )
    assert reason("zoned-block", "/dev/sdk") == "its device /dev/sdk is gone"
    assert reason("zoned-block", "/dev/disk/by-id/x", "/dev/sdk") == "its device /dev/sdk is gone"
    assert reason("agent", "10.131.0.21:7410") == "its agent at 10.131.0.21:7410 does not answer"
