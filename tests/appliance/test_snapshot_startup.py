"""A snapshot's background reclaim cut short by a crash is finished by the daemon's maintenance
(the owner of the drives) in its first round, a paced snapshot-reclaim job; opening the runtime
does not wait for it, and the web UI's and CLI's catalog-only opening leaves it alone. Stale
space figures are recounted by a snapshot-space job."""

from __future__ import annotations

import os

from sqlalchemy import select

from appliance import config as config_mod
from appliance.maintenance import Maintenance
from appliance.runtime import Appliance
from engine.admin import fsck, jobs
from engine.catalog import Catalog
from engine.catalog.models import Snapshot, Stripe
from engine.namespace import ROOT
from engine.snapshots import service as snapshots_module
from engine.snapshots.service import Snapshots
from tests.appliance.test_job_recovery import shingle
from tests.lifecycle.conftest import check_accounting

SNAPSHOTS, STRIPES = Snapshot.__table__, Stripe.__table__


def _rows(catalog):
    return catalog.read(
        lambda c: [tuple(r) for r in c.execute(select(SNAPSHOTS.c.name, SNAPSHOTS.c.deleting))]
    )


def _stripes(catalog) -> int:
    return len(catalog.read(lambda c: c.execute(select(STRIPES.c.id)).all()))


def _delete_and_die(config) -> None:
    """In a child: delete the snapshot and die (os._exit, as kill -9 would) right after the
    first chunk of its rows is freed."""
    snapshots_module.DELETE_CHUNK_INODES = 4
    appliance = Appliance(config)
    snaps = Snapshots(appliance.namespace)
    snaps._forget_stripes = lambda dead: os._exit(0)  # the crash, after a committed chunk
    snaps.delete("/ds", "s1")
    snaps.finish_deletions()  # the reclaim the daemon's job would run
    os._exit(1)  # not reached: the deletion has more than one chunk


def test_daemon_start_finishes_an_interrupted_snapshot_deletion(tmp_path):
    home = tmp_path / "appliance"
    shingle("init", str(home), "--drive-size", "64MiB", "--zone-size", "4MiB", "--no-preallocate")
    config = config_mod.load(home / "shingle.toml")
    with Appliance(config) as appliance:
        ns = appliance.namespace
        ds = ns.mkdir(ROOT, ns.root_ino, "ds")
        for n in range(20):
            f = ns.create(ROOT, ds.ino, f"f{n}")
            ns.write(f.ino, 0, os.urandom(40_000 + n), stable=True)
        Snapshots(ns).create("/ds", "s1")
        for n in range(20):  # the snapshot's stripes become its own
            ns.unlink(ROOT, ds.ino, f"f{n}")
    catalog = Catalog(config.catalog_url)
    try:
        held = _stripes(catalog)
        pid = os.fork()
        if pid == 0:
            try:
                _delete_and_die(config)
            finally:
                os._exit(2)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
        [(name, deleting)] = _rows(catalog)
        assert deleting and name.startswith("s1/")  # cut short: hidden, half freed
        with Appliance(config, with_data=False) as admin:  # the web UI's, the CLI's opening
            assert fsck.check(catalog, admin.namespace.root_ino).clean
        assert _rows(catalog) == [(name, deleting)]  # left to the daemon

        with Appliance(config) as daemon:  # as `shingle serve` opens it
            assert _rows(catalog) == [(name, deleting)], "a start does not wait for a reclaim"
            maintenance = Maintenance(daemon)
            assert maintenance.recover_interrupted()
            assert maintenance.lead(), "its first round queues and runs the reclaim"
            [job] = jobs.recent(catalog)
            assert (job.kind, job.state) == ("snapshot-reclaim", "done"), job
            assert job.result["stripes_freed"] > 10, job
            assert _rows(catalog) == []
            assert not maintenance.lead(), "nothing left to reclaim: no job queued"
            assert _stripes(catalog) < held - 10
            check_accounting(catalog)
            assert fsck.check(catalog, daemon.namespace.root_ino).clean
            assert Snapshots(daemon.namespace).list("/ds") == []
            assert not daemon.namespace.snapshots_visible  # the default: hidden
            # stored space figures: counted at create; stale ones recounted by a job
            if Snapshots(daemon.namespace).create("/ds", "s2").counted:
                assert not maintenance.lead(), "counted at create: no recount due"
            else:  # a lazy view (lazyviews.ENABLED): its first count is due at once
                assert maintenance.lead(), "a lazy view: its first count queued and run"
            catalog.run(lambda c: c.execute(SNAPSHOTS.update().values(space_counted_ns=0)))
            assert maintenance.lead(), "stale figures: a snapshot-space job queued and run"
            job = jobs.recent(catalog)[0]
            assert (job.kind, job.state, job.result) == (
                "snapshot-space",
                "done",
                {"snapshots_counted": 1},
            ), job
            [s2] = Snapshots(daemon.namespace).list("/ds")
            assert s2.counted > 0 and s2.files >= 1
            assert not maintenance.lead(), "nothing due any more"
    finally:
        catalog.close()
    visible = config_mod.from_dict(
        {
            "appliance": {"data_dir": str(home)},
            "catalog": {"url": config.catalog_url},
            "snapshots": {"visible": True},
        },
        home / "shingle.toml",
    )
    with Appliance(visible, with_data=False) as admin:
        assert admin.namespace.snapshots_visible
