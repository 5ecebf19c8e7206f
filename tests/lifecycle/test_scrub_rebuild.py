"""Scrub, rebuild and drain end to end on emulated zoned drives."""

from __future__ import annotations

import shutil

import crc32c

from engine.admin.events import recent
from engine.lifecycle import drives as drive_states
from engine.lifecycle.rebuild import drain_drive, pending_work, rebuild, short_work
from engine.lifecycle.scrub import Scrubber

from .conftest import KiB, check_accounting, flip_bits, random_bytes, sha


def test_scrub_finds_and_repairs_flipped_bits(rig):
    files = {f"/data/f{i}": random_bytes(200 * KiB + i * 777, i) for i in range(4)}
    for path, data in files.items():
        rig.write_file(path, data)
    fragments = rig.fragments()
    victims = [fragments[1], fragments[len(fragments) // 2], fragments[-1]]
    for victim in victims:
        flip_bits(rig, victim)
    seen = []
    report = Scrubber(rig.data, rig.catalog).run(
        progress=lambda d, t, m: seen.append((d, t, m)), actor="cron"
    )
    assert report.fragments_checked == len(fragments)
    assert (report.bad, report.repaired, report.unrepairable) == (3, 3, 0)
    assert seen[-1][0] == seen[-1][1] and "3 repaired" in seen[-1][2]
    # the repaired fragments live elsewhere now, with their original checksums
    after = {f.id: f for f in rig.fragments()}
    for victim in victims:
        moved = after[victim.id]
        assert (moved.zone_id, moved.zone_offset) != (victim.zone_id, victim.zone_offset)
        assert moved.checksum == victim.checksum and moved.drive_id == victim.drive_id
        drive = rig.data.space.drives[moved.drive_id]
        raw = drive.backend.read(
            rig.data.space.zones[moved.zone_id].idx, moved.zone_offset, moved.length
        )
        assert crc32c.crc32c(raw) == moved.checksum
    repairs = recent(rig.catalog, kind_prefix="scrub.repair")
    assert len(repairs) == 3 and all(e.actor == "cron" and e.severity == "warning" for e in repairs)
    assert recent(rig.catalog, kind_prefix="scrub.run")[0].details["repaired"] == 3
    check_accounting(rig.catalog)
    # a second pass finds nothing, and the data reads back from a fresh start
    assert Scrubber(rig.data, rig.catalog).run().bad == 0
    rig.restart()
    for path, data in files.items():
        assert sha(rig.read_file(path)) == sha(data), path


def test_scrub_reports_a_stripe_beyond_repair(rig):
    rig.write_file("/x", random_bytes(100 * KiB, 7))
    fragments = rig.fragments()
    stripe = fragments[0].stripe_id
    for f in [f for f in fragments if f.stripe_id == stripe][:3]:  # 4+2: three bad is one too many
        flip_bits(rig, f)
    report = Scrubber(rig.data, rig.catalog).run()
    assert report.bad == 3 and report.unrepairable == 3 and report.repaired == 0
    assert recent(rig.catalog, kind_prefix="scrub.unrepairable")[0].severity == "error"


def test_rate_limited_scrub_takes_its_time(rig):
    rig.write_file("/x", random_bytes(300 * KiB, 3))
    total = sum(f.length for f in rig.fragments())
    report = Scrubber(rig.data, rig.catalog, bytes_per_s=total / 0.6).run()
    assert report.elapsed_s >= 0.35  # the limiter allows a 0.5 s burst of 0.6 s of work


def test_failed_drive_is_rebuilt_then_two_more_may_fail(rig):
    files = {f"/ckpt/step-{i}": random_bytes(150 * KiB + 1000 * i, 100 + i) for i in range(6)}
    files["/small"] = b"tiny file in the hot class" * 3
    for path, data in files.items():
        rig.write_file(path, data)
    first = rig.drive_ids[0]
    assert pending_work(rig.catalog, first) == (0, 0, 0)  # nothing to do while it is online
    on_first = [f for f in rig.fragments() if f.drive_id == first]
    before = (len({f.stripe_id for f in on_first}), len(on_first), sum(f.length for f in on_first))
    assert before[1] > 0
    drive_states.fail_drive(rig.catalog, first, actor="admin")
    assert pending_work(rig.catalog, first) == before
    rig.data.refresh_drive_states()
    status = drive_states.redundancy_status(rig.catalog)
    assert status.reduced == before[0] and status.lost == 0
    seen = []
    report = rebuild(rig.data, rig.catalog, progress=lambda d, t, m: seen.append(m), actor="admin")
    assert (
        report.fragments_rebuilt == before[1] and not report.unrecoverable and report.unplaced == 0
    )
    assert report.status["reduced"] == 0 and report.bytes_written == before[2]
    assert "ETA" in "".join(seen) or len(seen) >= 1
    assert pending_work(rig.catalog, first)[1] == 0
    # every stripe keeps its fragments on distinct drives
    by_stripe = {}
    for f in rig.fragments():
        by_stripe.setdefault(f.stripe_id, []).append(f.drive_id)
    assert all(len(set(ds)) == len(ds) and first not in ds for ds in by_stripe.values())
    check_accounting(rig.catalog)
    # two more drives fail: every byte still reads back (4+2 and 3 copies)
    for drive_id in rig.drive_ids[1:3]:
        drive_states.fail_drive(rig.catalog, drive_id)
        shutil.rmtree(rig.data.space.drives[drive_id].path)
    rig.restart()
    for path, data in files.items():
        assert sha(rig.read_file(path)) == sha(data), path
    assert drive_states.redundancy_status(rig.catalog).lost == 0
    assert (
        recent(rig.catalog, kind_prefix="rebuild.run")[0].details["fragments_rebuilt"] == before[1]
    )


def test_drain_moves_everything_off_and_removes_the_drive(rig):
    files = {f"/d/f{i}": random_bytes(120 * KiB, 200 + i) for i in range(5)}
    for path, data in files.items():
        rig.write_file(path, data)
    victim = rig.drive_ids[3]
    count = pending_work(rig.catalog)  # nothing pending yet
    assert count == (0, 0, 0)
    report = drain_drive(rig.data, rig.catalog, victim, actor="admin")
    assert report.fragments_moved > 0 and report.fragments_rebuilt == 0
    assert report.drives_drained == [victim]
    assert drive_states.get_drive(rig.catalog, victim).state == "removed"
    assert all(f.drive_id != victim for f in rig.fragments())
    check_accounting(rig.catalog)
    shutil.rmtree(rig.data.space.drives[victim].path)  # pulled from the machine
    rig.restart()
    for path, data in files.items():
        assert sha(rig.read_file(path)) == sha(data), path
    kinds = [e.kind for e in recent(rig.catalog, kind_prefix="drive.")]
    assert "drive.drained" in kinds


def test_rebuild_onto_a_replacement_drive(rig):
    from engine.drives import format_emulated

    files = {
        f"/r/f{i}": random_bytes(300 * KiB, 300 + i) for i in range(16)
    }  # a few zones per drive
    for path, data in files.items():
        rig.write_file(path, data)
    failed = rig.drive_ids[2]
    lost = [f for f in rig.fragments() if f.drive_id == failed]
    drive_states.fail_drive(rig.catalog, failed)
    shutil.rmtree(rig.data.space.drives[failed].path)
    # the replacement: a new, empty drive of the same geometry
    drive = rig.data.space.drives[rig.drive_ids[0]]
    [new] = format_emulated(
        rig.catalog,
        rig.root.parent / "spare",
        1,
        drive.zone_size * drive.zone_count,
        drive.zone_size,
    )
    rig.restart()
    report = rebuild(rig.data, rig.catalog)
    assert report.fragments_rebuilt == len(lost) and report.status["reduced"] == 0
    landed = [f for f in rig.fragments() if f.id in {x.id for x in lost}]
    # the empty replacement has the most room, so it takes the largest share
    assert sum(1 for f in landed if f.drive_id == new) >= len(lost) // 2
    for path, data in files.items():
        assert sha(rig.read_file(path)) == sha(data), path
    check_accounting(rig.catalog)


def test_stripes_born_short_of_their_width_are_completed(rig):
    """Stripes written while too few drives took writes (5 of 8 for 4+2: a host away, say)
    commit without their last parity fragment; once the drives are back, rebuild writes the
    absent fragments, on drives the stripe does not use yet, and they decode."""
    away = rig.drive_ids[:3]
    for drive_id in away:  # read, never written: as a drive whose agent is cut off
        drive_states.set_drive_state(rig.catalog, drive_id, "degraded")
    rig.data.refresh_drive_states()
    files = {f"/ckpt/short-{i}": random_bytes(130 * KiB + 999 * i, 300 + i) for i in range(4)}
    for path, data in files.items():
        rig.write_file(path, data)
    short = rig.catalog.read(short_work)
    assert short[0] > 0 and short[1] == short[0]  # one parity fragment absent per warm stripe
    assert drive_states.redundancy_status(rig.catalog).reduced == short[0]
    assert not {f.drive_id for f in rig.fragments()} & set(away)
    for drive_id in away:
        drive_states.set_drive_state(rig.catalog, drive_id, "online")
    rig.data.refresh_drive_states()

    report = rebuild(rig.data, rig.catalog, actor="admin")
    assert (report.stripes, report.fragments_rebuilt, report.bytes_written) == short
    assert report.unplaced == 0 and not report.unrecoverable
    assert report.status["reduced"] == 0 and rig.catalog.read(short_work) == (0, 0, 0)
    by_stripe: dict[int, list[int]] = {}
    for f in rig.fragments():
        by_stripe.setdefault(f.stripe_id, []).append(f.drive_id)
    assert all(len(set(ds)) == len(ds) for ds in by_stripe.values())
    added = [f for f in rig.fragments() if f.drive_id in away]
    assert len(added) == short[1]
    check_accounting(rig.catalog)
    assert rebuild(rig.data, rig.catalog).fragments_rebuilt == 0  # nothing left to do
    assert Scrubber(rig.data, rig.catalog).run().bad == 0  # the new fragments' checksums hold
    # two of the drives written first fail: the stripes decode with their new fragments
    for drive_id in rig.drive_ids[3:5]:
        drive_states.fail_drive(rig.catalog, drive_id)
        shutil.rmtree(rig.data.space.drives[drive_id].path)
    rig.restart()
    for path, data in files.items():
        assert sha(rig.read_file(path)) == sha(data), path


def test_a_rebuild_is_queued_once_missing_drives_are_back_with_stripes_short(rig):
    """What the maintenance leader calls each round: drives back from missing while stripes are
    short of their width queue one rebuild; nothing new, or a rebuild already queued, none."""
    from engine.admin import jobs
    from engine.lifecycle.hostops import queue_rebuild_after_returns

    rig.write_file("/before", random_bytes(130 * KiB, 1))
    assert queue_rebuild_after_returns(rig.catalog) is None  # nothing came back
    away = rig.drive_ids[:3]
    for drive_id in away:
        drive_states.set_drive_state(rig.catalog, drive_id, "missing", reason="test")
    rig.data.refresh_drive_states()
    rig.write_file("/meanwhile", random_bytes(130 * KiB, 2))
    assert queue_rebuild_after_returns(rig.catalog) is None  # still away: nothing to complete yet
    for drive_id in away:
        drive_states.set_drive_state(rig.catalog, drive_id, "online", reason="test")
    rig.data.refresh_drive_states()
    stripes, fragments, _nbytes = rig.catalog.read(short_work)
    assert stripes > 0

    job_id = queue_rebuild_after_returns(rig.catalog)
    assert job_id is not None
    job = jobs.get(rig.catalog, job_id)
    assert (job.kind, job.actor) == ("rebuild", "schedule")
    assert (
        f"{stripes} stripes were written without {fragments} of their fragments"
        in (job.params["why"])
    )
    assert queue_rebuild_after_returns(rig.catalog) is None  # those returns were seen
    drive_states.set_drive_state(rig.catalog, away[0], "missing", reason="test")
    drive_states.set_drive_state(rig.catalog, away[0], "online", reason="test")
    assert queue_rebuild_after_returns(rig.catalog) is None  # the queued rebuild does it
    assert [j.kind for j in jobs.recent(rig.catalog, 10)].count("rebuild") == 1
