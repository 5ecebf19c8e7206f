"""Drive states and the redundancy status on real catalogs (rows as the data path writes them)."""

from __future__ import annotations

import time
import uuid

import pytest

from engine.admin.events import recent
from engine.base import errors
from engine.catalog.models import Drive, Fragment, Stripe, Zone
from engine.lifecycle import drives as drive_states


def add_drives(catalog, n, zones=4, zone_size=1 << 20):
    def work(conn):
        ids = []
        for i in range(n):
            drive_id = conn.execute(
                Drive.__table__.insert().values(
                    uuid=str(uuid.uuid4()),
                    path=f"/drives/d{i}",
                    backend="zonefile",
                    state="online",
                    zone_size=zone_size,
                    zone_count=zones,
                    added_ns=time.time_ns(),
                )
            ).inserted_primary_key[0]
            for idx in range(zones):
                conn.execute(
                    Zone.__table__.insert().values(drive_id=drive_id, idx=idx, state="empty")
                )
            ids.append(drive_id)
        return ids

    return catalog.run(work)


def add_stripe(catalog, drive_ids, k, m, live=100, zone_state="full"):
    """A stripe with one fragment on each given drive (zone 0 of that drive)."""

    def work(conn):
        stripe_id = conn.execute(
            Stripe.__table__.insert().values(
                band_class="warm",
                layout="ec",
                k=k,
                m=m,
                data_length=live,
                fragment_length=64,
                live_bytes=live,
                created_ns=time.time_ns(),
            )
        ).inserted_primary_key[0]
        zt = Zone.__table__
        for idx, drive_id in enumerate(drive_ids):
            zone_id = (
                conn.execute(zt.select().where(zt.c.drive_id == drive_id, zt.c.idx == 0)).first().id
            )
            conn.execute(
                zt.update()
                .where(zt.c.id == zone_id)
                .values(
                    state=zone_state,
                    write_pointer=zt.c.write_pointer + 64,
                    live_bytes=zt.c.live_bytes + 64,
                )
            )
            conn.execute(
                Fragment.__table__.insert().values(
                    stripe_id=stripe_id,
                    idx=idx,
                    drive_id=drive_id,
                    zone_id=zone_id,
                    zone_offset=0,
                    length=64,
                    checksum=0,
                )
            )
        return stripe_id

    return catalog.run(work)


def test_state_machine_refuses_bad_changes_and_records_events(catalog):
    a, b = add_drives(catalog, 2)
    with pytest.raises(errors.InvalidArgument, match="'broken': expected one of online"):
        drive_states.set_drive_state(catalog, a, "broken")
    with pytest.raises(errors.NotFound, match="no drive 999"):
        drive_states.fail_drive(catalog, 999)
    assert drive_states.fail_drive(catalog, str(a), actor="admin") == ("online", "failed")
    with pytest.raises(errors.InvalidArgument, match="is failed: it cannot become online"):
        drive_states.set_drive_state(catalog, a, "online")
    assert drive_states.set_drive_state(catalog, a, "removed")[1] == "removed"
    with pytest.raises(errors.InvalidArgument, match="final state"):
        drive_states.set_drive_state(catalog, a, "draining")
    # draining -> removed only once no fragment is left on the drive
    uuid_b = drive_states.get_drive(catalog, b).uuid
    add_stripe(catalog, [b], k=1, m=0)
    assert drive_states.start_drain(catalog, uuid_b) == ("online", "draining")
    with pytest.raises(errors.NotEmpty, match="still holds 1 fragments"):
        drive_states.set_drive_state(catalog, b, "removed")
    assert drive_states.get_drive(catalog, b).state == "draining"
    events = recent(catalog, kind_prefix="drive.state")
    assert [(e.details["from"], e.details["to"]) for e in reversed(events)] == [
        ("online", "failed"),
        ("failed", "removed"),
        ("online", "draining"),
    ]
    assert events[-1].severity == "error" and events[-1].actor == "admin"


def test_list_drives_sums_zones_and_fragments(catalog):
    ids = add_drives(catalog, 3, zones=5)
    add_stripe(catalog, ids, k=2, m=1)
    add_stripe(catalog, ids, k=2, m=1)
    listed = drive_states.list_drives(catalog)
    assert [d.id for d in listed] == ids
    first = listed[0]
    assert (first.zones_empty, first.zones_full, first.fragments) == (4, 1, 2)
    assert first.written_bytes == 128 and first.live_bytes == 128
    assert first.capacity_bytes == 5 << 20
    assert first.to_dict()["state"] == "online"


def test_redundancy_status_counts_reduced_and_lost_stripes(catalog):
    ids = add_drives(catalog, 6)
    add_stripe(catalog, ids[:6], k=4, m=2)  # fragments on every drive
    add_stripe(catalog, ids[:3], k=1, m=2)  # three copies on drives 0-2
    add_stripe(catalog, ids[3:6], k=1, m=2)  # three copies on drives 3-5
    add_stripe(catalog, ids[:3], k=1, m=2, live=0)  # dead stripe: not counted
    status = drive_states.redundancy_status(catalog)
    assert status.to_dict() == {
        "stripes": 3,
        "reduced": 0,
        "no_redundancy": 0,
        "lost": 0,
        "on_draining": 0,
    }
    drive_states.fail_drive(catalog, ids[0])
    assert drive_states.redundancy_status(catalog) == drive_states.RedundancyStatus(3, 2, 0, 0, 0)
    drive_states.fail_drive(catalog, ids[1])
    # EC 4+2 down to 4 readable; replica down to 1 copy: both without redundancy
    assert drive_states.redundancy_status(catalog) == drive_states.RedundancyStatus(3, 2, 2, 0, 0)
    drive_states.start_drain(catalog, ids[3])
    assert drive_states.redundancy_status(catalog).on_draining == 2
    drive_states.fail_drive(catalog, ids[2])
    assert drive_states.redundancy_status(catalog) == drive_states.RedundancyStatus(3, 2, 0, 2, 2)
