"""The engine services behind the web UI's settings, drives, tiers, metrics and dashboard pages,
on both catalogs: engine.admin.admins, engine.admin.inventory, engine.admin.tier_settings,
health.SmartCache."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from engine.admin import accounts, admins, events, health, inventory, tier_settings
from engine.base import errors
from engine.catalog.models import Zone
from engine.drives import format_emulated
from engine.namespace import ROOT

MiB = 1 << 20


def test_admins_and_tokens_listed_and_revoked(catalog):
    uid = accounts.create_admin(catalog, "alice", "correct horse battery", actor="t")
    accounts.create_token(catalog, uid, "grafana", actor="t")
    assert admins.user_id(catalog, "alice") == uid
    with pytest.raises(errors.NotFound, match="no admin user 'bob'"):
        admins.user_id(catalog, "bob")
    (admin,) = admins.list_admins(catalog)
    assert admin["username"] == "alice" and admin["failed_logins"] == 0 and "password" not in admin
    (token,) = admins.list_tokens(catalog)
    assert (token["name"], token["username"]) == ("grafana", "alice") and "secret" not in str(token)
    admins.revoke_token(catalog, token["id"], actor="alice")
    assert admins.list_tokens(catalog) == []
    with pytest.raises(errors.NotFound, match="no API token with id"):
        admins.revoke_token(catalog, token["id"], actor="alice")
    latest = events.recent(catalog, 1)[0]
    assert (latest.kind, latest.actor) == ("admin.token.revoke", "alice")


def test_inventory_counts_zones_by_kind_and_class(catalog, tmp_path):
    ids = format_emulated(catalog, tmp_path / "drives", 2, 8 * MiB, MiB, preallocate=False)
    zones = Zone.__table__

    def seed(conn):
        first = [
            r.id
            for r in conn.execute(
                select(zones.c.id).where(zones.c.drive_id == ids[0]).order_by(zones.c.idx)
            )
        ]
        layout = [
            ("full", "warm", MiB, 0),
            ("full", "cold", MiB // 4, 3 * MiB // 4),
            ("open", "hot", MiB // 2, 0),
        ]
        for zone_id, (state, cls, live, garbage) in zip(first[:3], layout, strict=True):
            conn.execute(
                zones.update()
                .where(zones.c.id == zone_id)
                .values(
                    state=state,
                    band_class=cls,
                    write_pointer=live + garbage,
                    live_bytes=live,
                    garbage_bytes=garbage,
                )
            )

    catalog.run(seed)
    assert inventory.drive_devices(catalog) == {ids[0]: None, ids[1]: None}
    assert inventory.drive_device(catalog, ids[0]) is None
    with pytest.raises(errors.NotFound, match="no drive with id 999"):
        inventory.drive_device(catalog, 999)
    assert inventory.band_counts(catalog, ids[0]) == {
        "full": {"warm": 1},
        "garbage": {"cold": 1},
        "open": {"hot": 1},
        "empty": {"-": 5},
    }
    usage = inventory.usage_by_class(catalog)
    assert usage["cold"] == {
        "zones": 1,
        "written_bytes": MiB,
        "live_bytes": MiB // 4,
        "garbage_bytes": 3 * MiB // 4,
    }
    assert set(usage) == {"hot", "warm", "cold"}
    by_state = {
        (s, c): (n, live, garbage) for s, c, n, live, garbage in inventory.bands_by_state(catalog)
    }
    assert by_state[("empty", None)] == (13, 0, 0) and by_state[("full", "cold")][2] == 3 * MiB // 4
    each = inventory.band_map_rows(catalog, ids[0], max_cells=100)
    assert each.group is None and [r["idx"] for r in each.rows] == list(range(8))
    grouped = inventory.band_map_rows(catalog, ids[0], max_cells=3)
    assert grouped.group == 3 and grouped.zone_size == MiB
    assert sum(r.n for r in grouped.rows) == 8 and {int(r.cell) for r in grouped.rows} == {0, 1, 2}
    with pytest.raises(errors.NotFound):
        inventory.band_map_rows(catalog, 999, 10)


def test_tier_thresholds_and_pins(catalog, namespace):
    assert tier_settings.thresholds(catalog) == tier_settings.THRESHOLD_DEFAULTS
    changed = tier_settings.set_thresholds(catalog, {"promote_reads": 7}, actor="alice")
    assert changed["promote_reads"] == 7 and changed["promote_window_s"] == tier_settings.DAY
    with pytest.raises(errors.InvalidArgument, match="expected one of hot_to_warm_after_s"):
        tier_settings.set_thresholds(catalog, {"colour": 1}, actor="alice")
    top = namespace.mkdir(ROOT, namespace.root_ino, "sets")
    namespace.create(ROOT, top.ino, "a")
    assert tier_settings.pin(catalog, namespace, "/sets/", "cold", actor="alice") == 2
    assert tier_settings.path_rules(catalog) == [["/sets", "cold"]]
    assert tier_settings.pinned(catalog, namespace) == [
        {"ino": top.ino, "path": "/sets", "band_class": "cold"}
    ]
    assert tier_settings.pin(catalog, namespace, "/sets", "none", actor="alice") == 2
    assert tier_settings.path_rules(catalog) == []
    assert tier_settings.pinned(catalog, namespace) == []
    with pytest.raises(errors.InvalidArgument, match="band_class = 'lukewarm'"):
        tier_settings.pin(catalog, namespace, "/sets", "lukewarm", actor="alice")
    kinds = [e.kind for e in events.recent(catalog, 3)]
    assert kinds == ["tiering.pin", "tiering.pin", "tiering.thresholds"]


def test_smart_cache_reuses_a_reading_and_forgets_it_after_a_self_test(tmp_path):
    log = tmp_path / "runs"
    smartctl = tmp_path / "smartctl"
    answer = '{"smartctl": {"exit_status": 0}, "smart_status": {"passed": true}}'
    smartctl.write_text(f"#!/bin/sh\necho \"$@\" >> {log}\necho '{answer}'\n")
    smartctl.chmod(0o755)
    cache = health.SmartCache(ttl_s=60)
    first = cache.report("/dev/sdx", str(smartctl))
    assert cache.report("/dev/sdx", str(smartctl)) == first
    assert len(log.read_text().splitlines()) == 1
    cache.refresh(["/dev/sdx", "/dev/sdy", "/dev/sdz", None], str(smartctl))
    assert len(log.read_text().splitlines()) == 3  # only the two stale ones, none for no device
    cache.start_self_test("/dev/sdx", str(smartctl))
    cache.report("/dev/sdx", str(smartctl))
    runs = log.read_text().splitlines()
    assert runs[-2].startswith("--json -t short") and runs[-1].startswith("--json -x")
    with pytest.raises(ValueError, match="emulated drive"):
        cache.start_self_test(None, str(smartctl))
