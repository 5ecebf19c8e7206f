"""The maintenance leader's fence reaches every catalog write of the real lifecycle jobs (scrub,
band cleaning, tiering, rebuild, retention-style deletes), from whatever thread the job makes
it, and a deposed leader's rebuild commits nothing (engine/catalog/fence.py)."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import select

from engine.catalog import fence as leader_fence
from engine.catalog.database import _FENCE
from engine.catalog.fence import LeaderFenced
from engine.catalog.models import Extent, Fragment, Inode, Stripe, Zone
from engine.lifecycle import drives as drive_states
from engine.lifecycle.jobs import LifecycleJobs
from engine.namespace import ROOT

from .conftest import KiB, Rig, check_accounting, flip_bits, random_bytes, sha

TOKEN = 41


def catalog_rows(catalog) -> dict:
    """Every row the lifecycle jobs change, to compare before and after."""

    def work(conn):
        return {
            table.name: sorted(tuple(row) for row in conn.execute(select(table)).all())
            for table in (
                Stripe.__table__,
                Fragment.__table__,
                Extent.__table__,
                Zone.__table__,
                Inode.__table__,
            )
        }

    return catalog.read(work)


def record_writes(catalog, monkeypatch) -> list[tuple[str, bool]]:
    """(thread, fenced?) of every write transaction from now on."""
    writes: list[tuple[str, bool]] = []
    original = catalog.run

    def run(work, **options):
        if options.get("write", True):
            fence = _FENCE.get()
            writes.append((threading.current_thread().name, fence is not None))
        return original(work, **options)

    monkeypatch.setattr(catalog, "run", run)
    return writes


def test_every_write_of_the_lifecycle_jobs_is_fenced(catalog, tmp_path, monkeypatch):
    rig = Rig(catalog, tmp_path / "drives")
    try:
        files = {f"/m/f{i}": random_bytes(140 * KiB, 70 + i) for i in range(10)}
        for path, data in files.items():
            rig.write_file(path, data)
        for path in sorted(files)[::2]:
            rig.ns.unlink(ROOT, rig.ns.resolve("/m").ino, path.rsplit("/", 1)[1])
            files.pop(path)
        flip_bits(rig, rig.fragments()[-1])
        cold = rig.ns.resolve(sorted(files)[0]).ino
        inodes = Inode.__table__
        rig.catalog.run(
            lambda c: c.execute(
                inodes.update().where(inodes.c.ino == cold).values(band_class="cold")
            )
        )
        assert leader_fence.advance(catalog, TOKEN, "leader")
        runners = LifecycleJobs(rig.ns, rig.data, rig.catalog).runners()
        writes = record_writes(catalog, monkeypatch)
        results = {}
        with catalog.fenced(TOKEN):
            for kind in ("scrub", "clean", "tier"):
                results[kind] = runners[kind]({}, lambda *a: None, "leader")
            drive_states.fail_drive(rig.catalog, rig.drive_ids[0])
            results["rebuild"] = runners["rebuild"]({}, lambda *a: None, "leader")
        assert results["scrub"]["repaired"] == 1
        assert results["clean"]["zones_cleaned"] > 0
        assert results["tier"]["moves"] == {"warm->cold": 1}
        assert results["rebuild"]["status"]["reduced"] == 0
        assert len(writes) >= 10, f"the jobs wrote less than expected ({len(writes)})"
        unfenced = [name for name, fenced in writes if not fenced]
        assert not unfenced, f"write transactions outside the fence, by thread: {unfenced}"
        check_accounting(rig.catalog)
        for path, data in files.items():
            assert sha(rig.read_file(path)) == sha(data), path
    finally:
        rig.close()


def test_a_deposed_leaders_rebuild_commits_nothing(catalog, tmp_path):
    rig = Rig(catalog, tmp_path / "drives")
    try:
        files = {f"/r/f{i}": random_bytes(100 * KiB, 90 + i) for i in range(6)}
        for path, data in files.items():
            rig.write_file(path, data)
        assert leader_fence.advance(catalog, TOKEN, "old")
        drive_states.fail_drive(rig.catalog, rig.drive_ids[0])
        assert leader_fence.advance(catalog, TOKEN + 1, "new")  # a successor took office
        before = catalog_rows(catalog)
        runners = LifecycleJobs(rig.ns, rig.data, rig.catalog).runners()
        with pytest.raises(LeaderFenced, match=f"leader token {TOKEN} is fenced"):
            with catalog.fenced(TOKEN):
                runners["rebuild"]({}, lambda *a: None, "old")
        after = catalog_rows(catalog)
        # the fragments it appended are garbage no row references (invariant 2): the zones'
        # write pointers in the catalog did not move either
        assert after == before
        with catalog.fenced(TOKEN + 1):
            report = runners["rebuild"]({}, lambda *a: None, "new")
        assert report["status"]["reduced"] == 0
        check_accounting(rig.catalog)
        for path, data in files.items():
            assert sha(rig.read_file(path)) == sha(data), path
    finally:
        rig.close()
