"""The hosts read model (engine/admin/hosts.py) on a real catalog (SQLite and PostgreSQL) and
real emulated drives labelled with hosts: what each host holds against the catalog's own
rows, host states as drives fail and drain, the moving jobs, and the hosts that may be lost
after a rebuild."""

from __future__ import annotations

import os

import pytest
from sqlalchemy import func, select

from engine.admin import hosts as hosts_view
from engine.admin import jobs
from engine.base import errors
from engine.catalog.models import Drive, Fragment, Stripe
from engine.lifecycle import drives as drive_states
from engine.lifecycle.hosts import hosts_status
from engine.lifecycle.rebuild import rebuild
from engine.namespace import ROOT

from .conftest import Rig

DRIVES, FRAGMENTS, STRIPES = Drive.__table__, Fragment.__table__, Stripe.__table__
STRIPE = 4 * 16 * 1024  # SMALL's warm stripe: 4 x 16 KiB


def fragments_by_host(catalog) -> dict[str, tuple[int, int]]:
    """host -> (fragment rows, their bytes), straight from the catalog."""
    rows = catalog.read(
        lambda conn: conn.execute(
            select(DRIVES.c.host, func.count(), func.sum(FRAGMENTS.c.length))
            .select_from(FRAGMENTS.join(DRIVES, DRIVES.c.id == FRAGMENTS.c.drive_id))
            .group_by(DRIVES.c.host)
        ).all()
    )
    return {host: (int(n), int(b)) for host, n, b in rows}


def held(cluster) -> dict[str, tuple[int, int]]:
    return {h.name: (h.fragments, h.fragment_bytes) for h in cluster.hosts if h.fragments}


@pytest.fixture
def rig(catalog, tmp_path):
    rig = Rig(catalog, tmp_path / "drives", drives=12)

    def label(conn):  # six hosts of two drives
        for n, drive_id in enumerate(rig.drive_ids):
            conn.execute(DRIVES.update().where(DRIVES.c.id == drive_id).values(host=f"h{n // 2}"))

    catalog.run(label)
    rig.restart()  # the data path learns its drives' hosts when it starts
    yield rig
    rig.close()


def test_hosts_hold_what_the_catalog_says_and_change_state_with_their_drives(rig, catalog):
    view = hosts_view.cluster(catalog, 4, 2)
    assert [h.name for h in view.hosts] == [f"h{n}" for n in range(6)]
    assert {h.state for h in view.hosts} == {hosts_view.UP}
    assert all(len(h.drives) == 2 and h.fragments == 0 for h in view.hosts)
    # nothing stored: the figure is that of a 4+2 stripe placed now, one fragment per host
    assert view.losable is None and view.losable_by_placement == 2 and view.may_lose == 2

    payload = os.urandom(8 * STRIPE)
    ino = rig.ns.create(ROOT, rig.ns.root_ino, "f").ino
    rig.ns.write(ino, 0, payload)
    rig.ns.commit(ino)
    view = hosts_view.cluster(catalog, 4, 2)
    assert held(view) == fragments_by_host(catalog)
    assert sum(h.fragments for h in view.hosts) >= 8 * 6
    assert view.may_lose == view.losable == 2 == hosts_status(catalog, 4, 2)["losable"]
    h0 = view.host("h0")
    assert h0.capacity_bytes == sum(d.capacity_bytes for d in h0.drives) > 0
    assert h0.written_bytes >= h0.fragment_bytes > 0 and h0.waiting_fragments == 0
    with pytest.raises(errors.NotFound, match="no host 'h9'"):
        view.host("h9")

    for drive in view.host("h0").drives:  # h0 gone: both its drives failed
        drive_states.fail_drive(catalog, drive.id, actor="test")
    for drive in view.host("h1").drives:  # h1 emptied before it is removed
        drive_states.start_drain(catalog, drive.id, actor="test")
    drive_states.set_drive_state(catalog, view.host("h2").drives[0].id, drive_states.DEGRADED)
    job_id = jobs.submit(catalog, "rebuild", actor="test")
    view = hosts_view.cluster(catalog, 4, 2)
    states = {h.name: h.state for h in view.hosts}
    assert states == {
        "h0": "lost",
        "h1": "draining",
        "h2": "degraded",
        "h3": "up",
        "h4": "up",
        "h5": "up",
    }
    assert view.host("h0").waiting_fragments == view.host("h0").fragments > 0
    assert view.host("h1").waiting_bytes == view.host("h1").fragment_bytes > 0
    assert view.host("h2").waiting_fragments == 0  # a degraded drive is still read in place
    assert view.host("h0").drives_readable == 0 and view.host("h1").drives_readable == 2
    assert view.may_lose == 1  # each stripe lost its fragment on h0: one parity left
    assert [(j.id, j.kind) for j in view.moving] == [(job_id, "rebuild")]

    rig.data.refresh_drive_states()
    report = rebuild(rig.data, catalog, actor="test")
    assert report.unrecoverable == [] and report.unplaced == 0
    jobs.finish(catalog, job_id, ok=True, result=report.to_dict())
    view = hosts_view.cluster(catalog, 4, 2)
    # h1's drained drives are removed: out of the pool and of the view
    assert [h.name for h in view.hosts] == ["h0", "h2", "h3", "h4", "h5"]
    assert view.host("h0").fragments == 0 and view.host("h0").state == "lost"
    assert held(view) == fragments_by_host(catalog)
    # four hosts take six fragments: two of them hold two, so one host may be lost
    assert view.may_lose == 1 == hosts_status(catalog, 4, 2)["losable"]
    assert view.moving == ()
    rig.data.reader.drop_cache()
    assert rig.ns.read(ino, 0, len(payload)) == payload
    assert view.to_dict()["hosts"][0]["name"] == "h0" and view.to_dict()["may_lose"] == 1


def test_host_state_from_its_drives():
    state = hosts_view.host_state
    assert state(["online", "online"]) == "up"
    assert state(["draining", "draining"]) == "draining"
    assert state(["online", "draining"]) == "degraded"
    assert state(["online", "missing"]) == "degraded"
    assert state(["degraded"]) == "degraded"
    assert state(["failed", "missing"]) == "lost"


def test_stripe_shape_is_the_warm_policy():
    from engine.coding.erasure import load_policies

    assert hosts_view.stripe_shape(load_policies({"warm": {"k": 4, "m": 2}})) == (4, 2)
    assert hosts_view.stripe_shape({}) == (8, 2)
