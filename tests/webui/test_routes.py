"""Every route through Flask's test client: sign-in required, CSRF enforced,
validation shown, JSON errors."""

from __future__ import annotations

import json
import re

import pytest
from sqlalchemy import select

from engine.admin import events, jobs, metrics
from engine.catalog.models import Drive, Export, RetentionPolicy
from engine.namespace import ROOT
from tests.webui.conftest import ADMIN, PASSWORD, Browserish, csrf_of
from tests.webui.helpers import exists, make_checkpoints, mkdirs

OPEN_ROUTES = {"/login", "/metrics", "/api/v1/openapi.json", "/static/<path:filename>"}


def concrete(rule: str) -> str:
    return re.sub(r"<int:\w+>", "1", rule)


def routes(app):
    for rule in app.url_map.iter_rules():
        for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
            yield rule.rule, method


def count_rows(catalog, model) -> int:
    table = model.__table__
    return len(catalog.read(lambda c: c.execute(select(table)).all()))


def test_every_route_requires_sign_in(app, appliance):
    client = app.test_client()
    checked = 0
    for rule, method in routes(app):
        if rule in OPEN_ROUTES:
            continue
        url = concrete(rule)
        response = client.open(url, method=method, json={} if rule.startswith("/api/") else None)
        if rule.startswith("/api/"):
            assert response.status_code == 401, (method, url, response.status_code)
            assert "authentication required" in response.get_json()["error"]
        elif method == "GET":
            assert response.status_code == 302 and "/login" in response.headers["Location"], (
                method,
                url,
            )
        else:  # no session, so no CSRF token either: refused before anything runs
            assert response.status_code == 400 and b"CSRF" in response.data, (method, url)
        checked += 1
    assert checked >= 30
    assert client.get("/metrics").status_code == 200
    assert client.get("/api/v1/openapi.json").status_code == 200


def test_every_page_renders_signed_in(web, app):
    pages = [
        concrete(rule)
        for rule, method in routes(app)
        if method == "GET"
        and not rule.startswith("/api/")
        and rule not in OPEN_ROUTES
        and "<" not in rule.replace("<int:", "")
    ]
    assert len(pages) >= 9
    web.post("/retention/rules", {"pattern": "/ckpt/*", "keep": "2"})
    web.post("/jobs", {"kind": "scrub"})
    web.post(
        "/exports",
        {
            "name": "/data",
            "path": "/",
            "clients": "10.0.0.0/8",
            "access": "ro",
            "squash": "root_squash",
            "anon_uid": "65534",
            "anon_gid": "65534",
            "trash_days": "7",
        },
    )
    assert (
        web.post(
            "/smb/shares",
            {"name": "data", "path": "/", "access": "rw", "clients": "10.0.0.0/8", "guest": "on"},
        ).status_code
        == 302
    )
    ns = app.extensions["shingle"].namespace
    ns.mkdir(ROOT, ns.root_ino, "ds")
    assert (
        web.post(
            "/datasets/schedules",
            {"path": "/ds", "frequency": "daily", "keep_last": "3", "enabled": "on"},
        ).status_code
        == 302
    )
    for url in pages:
        response = web.get(url)
        assert response.status_code == 200, (url, response.status_code)
        assert b"Sign out" in response.data


def test_login_logout_cookie_flags_and_events(app, appliance):
    _, catalog = appliance
    browser = Browserish(app.test_client())
    response = browser.login()
    assert response.status_code == 302 and response.headers["Location"] == "/"
    cookie = response.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    page = browser.get("/drives")
    assert (
        page.headers["Cache-Control"] == "no-store"
        and "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]
        and page.headers["X-Frame-Options"] == "DENY"
    )
    logins = events.recent(catalog, 5, kind_prefix="auth.login")
    assert logins[0].actor == ADMIN and "signed in" in logins[0].message
    response = browser.post("/logout")
    assert response.status_code == 302
    assert browser.get("/drives").status_code == 302
    assert events.recent(catalog, 1, kind_prefix="auth.logout")[0].actor == ADMIN
    # open redirects are refused: only local paths after sign-in
    browser.csrf = csrf_of(browser.get("/login").get_data(as_text=True))
    response = browser.client.post(
        "/login?next=//evil.example/x",
        data={"username": ADMIN, "password": PASSWORD, "csrf_token": browser.csrf},
    )
    assert response.headers["Location"] == "/"


def test_csrf_rejected_on_forms_and_session_api_calls(web, appliance):
    _, catalog = appliance
    response = web.client.post("/retention/rules", data={"pattern": "/ckpt/*", "keep": "3"})
    assert response.status_code == 400 and b"CSRF token missing or wrong" in response.data
    response = web.client.post(
        "/retention/rules", data={"pattern": "/ckpt/*", "keep": "3", "csrf_token": "forged"}
    )
    assert response.status_code == 400
    response = web.client.post("/api/v1/retention/rules", json={"pattern": "/ckpt/*", "keep": 3})
    assert response.status_code == 403 and "CSRF" in response.get_json()["error"]
    assert count_rows(catalog, RetentionPolicy) == 0
    response = web.api("POST", "/api/v1/retention/rules", {"pattern": "/ckpt/*", "keep": 3})
    assert response.status_code == 201 and response.get_json()["keep"] == 3


@pytest.mark.parametrize(
    "pattern, keep, expected",
    [
        ("/checkpoints/*/step-*", "0", "keep = 0: expected at least 1"),
        ("/checkpoints/*/step-*", "-1", "keep = -1: expected at least 1"),
        ("/checkpoints/../etc/*", "3", "'..' components are not allowed"),
        ("", "3", "pattern = '': expected a non-empty value"),
        ("checkpoints/*", "3", "expected an absolute path"),
        ("/checkpoints/*", "three", "keep = 'three': expected a whole number"),
    ],
)
def test_retention_form_shows_inline_errors_and_saves_nothing(
    web, appliance, pattern, keep, expected
):
    _, catalog = appliance
    response = web.post(
        "/retention/rules",
        {
            "pattern": pattern,
            "keep": keep,
            "action": "delete",
            "order_by": "mtime",
            "enabled": "on",
        },
    )
    html = response.get_data(as_text=True).replace("&#39;", "'")
    assert response.status_code == 400
    assert expected in html and 'role="alert"' in html
    assert f'value="{pattern}"' in html  # what the admin typed stays in the form
    assert count_rows(catalog, RetentionPolicy) == 0


def test_retention_create_preview_run_edit_delete(live_web, live):
    web, catalog, ns = live_web, live.catalog, live.namespace
    make_checkpoints(ns, "/ckpt/run1", range(1, 6), size=40_000)
    response = web.post(
        "/retention/rules",
        {
            "pattern": "/ckpt/*/step-*",
            "keep": "3",
            "action": "delete",
            "order_by": "mtime",
            "enabled": "on",
        },
    )
    assert (
        response.status_code == 302 and "/retention/preview?rule=" in response.headers["Location"]
    )
    rule_id = int(response.headers["Location"].rsplit("=", 1)[1])
    preview = web.get(f"/retention/preview?rule={rule_id}").get_data(as_text=True)
    listed = re.findall(r"<code>(/ckpt/run1/step-\d)</code>", preview)
    assert listed == ["/ckpt/run1/step-1", "/ckpt/run1/step-2"]
    assert "The daemon (pid" in preview
    assert all(exists(ns, f"/ckpt/run1/step-{n}") for n in range(1, 6))  # a preview changes nothing
    response = web.post("/retention/run", {"rule_id": str(rule_id)})
    assert response.status_code == 302 and "/jobs/" in response.headers["Location"]
    job_id = int(response.headers["Location"].rsplit("/", 1)[1])
    job = jobs.wait(catalog, job_id, timeout_s=30, poll_s=0.05)
    assert job.state == "done" and job.actor == ADMIN
    html = web.get(f"/jobs/{job_id}").get_data(as_text=True)
    assert "2 of 2 planned actions done" in html and 'http-equiv="refresh"' not in html
    assert [exists(ns, f"/ckpt/run1/step-{n}") for n in range(1, 6)] == [
        False,
        False,
        True,
        True,
        True,
    ]
    deletes = events.recent(catalog, 10, kind_prefix="retention.delete")
    assert len(deletes) == 2 and {e.actor for e in deletes} == {ADMIN}
    response = web.post(
        f"/retention/rules/{rule_id}",
        {"pattern": "/ckpt/*/step-*", "keep": "0", "action": "delete", "order_by": "mtime"},
    )
    assert response.status_code == 400 and b"expected at least 1" in response.data
    response = web.post(
        f"/retention/rules/{rule_id}",
        {"pattern": "/ckpt/*/step-*", "keep": "2", "action": "trash", "order_by": "name"},
    )
    assert response.status_code == 302
    rule = catalog.read(lambda c: c.execute(select(RetentionPolicy.__table__)).one())
    assert (rule.keep, rule.action, rule.order_by, rule.enabled) == (2, "trash", "name", False)
    assert events.recent(catalog, 1, kind_prefix="retention.rule.update")[0].actor == ADMIN
    asked = web.post(f"/retention/rules/{rule_id}/delete")  # the page asks once more first
    assert asked.status_code == 200 and b'id="confirm"' in asked.data
    assert count_rows(catalog, RetentionPolicy) == 1
    confirmed = web.post(f"/retention/rules/{rule_id}/delete", {"confirm": "yes"})
    assert confirmed.status_code == 302
    assert count_rows(catalog, RetentionPolicy) == 0
    assert web.post(f"/retention/rules/{rule_id}/delete").status_code == 404
    assert web.post("/retention/run", {"rule_id": str(rule_id)}).status_code == 404
    assert web.get("/retention/rules/999").status_code == 404


def test_jobs_wait_for_the_daemon_and_say_so(web, appliance):
    _, catalog = appliance
    web.post("/retention/rules", {"pattern": "/ckpt/*", "keep": "1", "enabled": "on"})
    response = web.post("/retention/run")
    job_id = int(response.headers["Location"].rsplit("/", 1)[1])
    html = web.get(f"/jobs/{job_id}").get_data(as_text=True)
    assert "No daemon is running" in html and 'http-equiv="refresh" content="2"' in html
    assert jobs.get(catalog, job_id).state == "queued"
    response = web.post("/jobs", {"kind": "scrub"})
    scrub = jobs.get(catalog, int(response.headers["Location"].rsplit("/", 1)[1]))
    assert (scrub.kind, scrub.actor, scrub.state) == ("scrub", ADMIN, "queued")
    listing = web.get("/jobs").get_data(as_text=True)
    assert f'href="/jobs/{job_id}"' in listing and "scrub" in listing
    web.post("/jobs", {"kind": "format-everything"})
    assert "expected one of scrub, clean, tier, rebuild" in web.get("/jobs").get_data(as_text=True)
    assert web.get("/jobs/999").status_code == 404


def test_drives_page_shows_smart_band_map_and_no_smart(web):
    html = web.get("/drives").get_data(as_text=True)
    assert (
        "ST8000DM004-2CX188" in html
        and "SEAGATE ST4000NM0025" in html
        and "Samsung SSD 980 PRO" in html
    )
    assert "SMART: PASSED" in html
    assert "SMART: no SMART data" in html and "emulated drive: no block device" in html
    assert "17890 h" in html and "38 °C" in html
    assert html.count('class="chart"') >= 4  # one band map per drive
    assert "zone 0: full, warm, 100% written" in html and "zone 1: garbage, cold" in html
    assert "zone 2: open, hot, 50% written" in html


def add_huge_drive(catalog) -> int:
    """A big SMR drive's catalog rows: 6,000 zones of 256 MiB (1.5 TB; more than one square each can
    show), the first 1,800 written: 600 mostly garbage (warm), 600 warm, 600 cold."""
    zones, zone_size = 6000, 256 << 20
    drives, zone_table = (
        Drive.__table__,
        __import__("engine.catalog.models", fromlist=["Zone"]).Zone.__table__,
    )

    def work(conn):
        drive_id = conn.execute(
            drives.insert().values(
                uuid="big-smr-drive",
                path="/dev/sdq",
                backend="zoned-block",
                state="online",
                zone_size=zone_size,
                zone_count=zones,
                added_ns=0,
            )
        ).inserted_primary_key[0]
        conn.execute(
            zone_table.insert(),
            [
                {
                    "drive_id": drive_id,
                    "idx": i,
                    "state": "full" if i < 1800 else "empty",
                    "band_class": ("warm" if i < 1200 else "cold") if i < 1800 else None,
                    "write_pointer": zone_size if i < 1800 else 0,
                    "live_bytes": zone_size // 4 if i < 600 else zone_size,
                    "garbage_bytes": 3 * zone_size // 4 if i < 600 else 0,
                }
                for i in range(zones)
            ],
        )
        return drive_id

    return catalog.run(work)


def test_band_map_of_a_huge_drive_is_summarised_in_sql(web, appliance):
    """The page draws runs of zones, not 30,000 squares, and the grouping happens in SQL."""
    _, catalog = appliance
    drive_id = add_huge_drive(catalog)
    html = web.get("/drives").get_data(as_text=True)
    section = html[html.index(f'id="drive-{drive_id}"') :]
    cells = section.count('<rect class="zone')
    assert 1000 < cells <= 2048
    assert "zones 0-2: 3 garbage, warm, 100% written" in section
    assert "zones 1797-1799: 3 full, cold, 100% written" in section
    assert "zones 5997-5999: 3 empty, 0% written" in section
    bands = web.get(f"/api/v1/drives/{drive_id}").get_json()["bands"]
    assert bands == {
        "garbage": {"warm": 600},
        "full": {"warm": 600, "cold": 600},
        "empty": {"-": 4200},
    }


def test_drive_actions_change_state_request_rebuild_and_start_self_test(
    web, appliance, tmp_path, monkeypatch
):
    _, catalog = appliance
    calls = tmp_path / "smartctl-calls"
    monkeypatch.setenv("FAKE_SMARTCTL_LOG", str(calls))

    def state(i):
        return catalog.read(
            lambda c: c.execute(
                select(Drive.__table__.c.state).where(Drive.__table__.c.id == i)
            ).scalar()
        )

    web.post("/drives/2/action", {"action": "rebuild"})
    assert "is online: rebuild restores" in web.get("/drives").get_data(as_text=True)
    response = web.post(
        "/drives/2/action", {"action": "mark_failed"}
    )  # a stray click: asked once more
    assert (
        response.status_code == 200
        and b"Mark drive 2 failed?" in response.data
        and state(2) == "online"
    )
    assert (
        web.post("/drives/2/action", {"action": "mark_failed", "confirm": "yes"}).status_code == 302
    )
    assert state(2) == "failed"
    change = events.recent(catalog, 1, kind_prefix="drive.state")[0]
    assert change.actor == ADMIN and "online -> failed" in change.message
    response = web.post("/drives/2/action", {"action": "rebuild"})
    rebuild = jobs.recent(catalog, 1)[0]
    assert (rebuild.kind, rebuild.actor, rebuild.state) == ("rebuild", ADMIN, "queued")
    assert response.headers["Location"] == f"/jobs/{rebuild.id}"
    web.post("/drives/3/action", {"action": "drain", "confirm": "yes"})
    assert state(3) == "draining"
    drain = jobs.recent(catalog, 1)[0]
    assert (drain.kind, drain.params, drain.actor) == ("drain", {"drive": 3}, ADMIN)
    web.post("/drives/1/action", {"action": "smart_test"})
    assert calls.read_text().splitlines()[-1] == "--json -t short /dev/sda"
    assert events.recent(catalog, 1, kind_prefix="drive.smart")[0].actor == ADMIN
    web.post("/drives/4/action", {"action": "smart_test"})  # emulated: refused with the reason
    assert "no block device" in web.get("/drives").get_data(as_text=True)
    web.post("/drives/1/action", {"action": "explode"})
    assert "expected one of mark_failed, drain, rebuild, smart_test" in web.get("/drives").get_data(
        as_text=True
    )
    assert state(1) == "online"
    assert web.post("/drives/99/action", {"action": "drain"}).status_code == 404
    assert web.post("/drives/99/action", {"action": "drain", "confirm": "yes"}).status_code == 404


def test_exports_create_validate_edit_delete(web, appliance, app):
    _, catalog = appliance
    mkdirs(app.extensions["shingle"].namespace, "/datasets")
    good = {
        "name": "/datasets",
        "path": "/datasets",
        "clients": "10.0.0.0/8, 192.168.1.5",
        "access": "ro",
        "squash": "all_squash",
        "anon_uid": "1000",
        "anon_gid": "1000",
        "trash_days": "3",
        "enabled": "on",
    }
    for field, value, expected in (
        ("clients", "10.0.0.300/8", "expected an IP address or CIDR"),
        ("path", "/nowhere", "expected an existing directory"),
        ("access", "rwx", "expected one of rw, ro"),
        ("anon_uid", "-5", "expected at least 0"),
        ("name", "datasets", "expected the path clients mount"),
        ("name", "/data/../etc", "expected no '.' or '..' components"),
    ):
        response = web.post("/exports", {**good, field: value})
        assert response.status_code == 400 and expected in response.get_data(as_text=True).replace(
            "&#39;", "'"
        )
    assert count_rows(catalog, Export) == 0
    assert web.post("/exports", {**good, "name": "//datasets/"}).status_code == 302
    row = catalog.read(lambda c: c.execute(select(Export.__table__)).one())
    assert row.name == "/datasets"  # the form the NFS server compares
    assert (
        row.clients == "10.0.0.0/8,192.168.1.5/32"
        and row.access == "ro"
        and row.squash == "all_squash"
    )
    assert web.post("/exports", good).status_code == 400  # the name exists
    assert web.post(f"/exports/{row.id}", {**good, "access": "rw"}).status_code == 302
    assert catalog.read(lambda c: c.execute(select(Export.__table__.c.access)).scalar()) == "rw"
    response = web.post(f"/exports/{row.id}/delete")
    assert response.status_code == 200 and b"Delete export /datasets?" in response.data
    assert count_rows(catalog, Export) == 1
    assert web.post(f"/exports/{row.id}/delete", {"confirm": "yes"}).status_code == 302
    assert count_rows(catalog, Export) == 0
    assert web.post(f"/exports/{row.id}/delete", {"confirm": "yes"}).status_code == 404
    kinds = [e.kind for e in events.recent(catalog, 3, kind_prefix="export.")]
    assert kinds == ["export.delete", "export.update", "export.create"]


def test_tiers_thresholds_and_pins(web, appliance, app):
    _, catalog = appliance
    ns = app.extensions["shingle"].namespace
    make_checkpoints(ns, "/archive", range(1, 3))
    response = web.post(
        "/tiers/thresholds",
        {
            "hot_to_warm_after_s": "10",
            "warm_to_cold_after_s": "86400",
            "promote_reads": "3",
            "promote_window_s": "86400",
        },
    )
    assert (
        response.status_code == 400
        and b"hot_to_warm_after_s = 10: expected at least 60" in response.data
    )
    assert catalog.get_setting("tiering.hot_to_warm_after_s") is None
    web.post(
        "/tiers/thresholds",
        {
            "hot_to_warm_after_s": "7200",
            "warm_to_cold_after_s": "1209600",
            "promote_reads": "5",
            "promote_window_s": "3600",
        },
    )
    assert catalog.get_setting("tiering.warm_to_cold_after_s") == "1209600"
    assert web.post("/tiers/pins", {"path": "/archive", "band_class": "cold"}).status_code == 302
    assert json.loads(catalog.get_setting("tiering.path_rules")) == [["/archive", "cold"]]
    html = web.get("/tiers").get_data(as_text=True)
    assert "<code>/archive</code></td><td>cold" in html
    ns.invalidate()
    assert (
        catalog.read(
            lambda c: c.execute(
                select(
                    __import__(
                        "engine.catalog.models", fromlist=["Inode"]
                    ).Inode.__table__.c.band_class
                ).where(
                    __import__(
                        "engine.catalog.models", fromlist=["Inode"]
                    ).Inode.__table__.c.band_class
                    == "cold"
                )
            ).all()
        ).__len__()
        == 5
    )
    assert web.post("/tiers/pins", {"path": "/archive", "band_class": "none"}).status_code == 302
    assert json.loads(catalog.get_setting("tiering.path_rules")) == []
    response = web.post("/tiers/pins", {"path": "/missing", "band_class": "cold"})
    assert response.status_code == 400 and b"not found" in response.data
    assert events.recent(catalog, 1, kind_prefix="tiering.pin")[0].actor == ADMIN


def test_settings_password_tokens_admins(web, appliance, app):
    _, catalog = appliance
    other = Browserish(app.test_client())
    assert other.login().status_code == 302 and other.get("/drives").status_code == 200
    response = web.post(
        "/settings/password", {"current": PASSWORD, "new": "short", "confirm": "short"}
    )
    assert response.status_code == 400 and b"expected at least 10 characters" in response.data
    response = web.post(
        "/settings/password",
        {"current": "nope", "new": "a new long password", "confirm": "a new long password"},
    )
    assert response.status_code == 400 and b"current password is wrong" in response.data
    assert (
        web.post(
            "/settings/password",
            {"current": PASSWORD, "new": "a new long password", "confirm": "a new long password"},
        ).status_code
        == 302
    )
    assert web.get("/drives").status_code == 200  # the session that changed it stays signed in
    assert other.get("/drives").status_code == 302  # every other session of this admin ends
    assert other.login(password="a new long password").status_code == 302
    response = web.post("/settings/tokens", {"name": "grafana"})
    token = re.search(r'id="new-token">(shg_[^<]+)<', response.get_data(as_text=True)).group(1)
    assert (
        web.client.get("/api/v1/drives", headers={"Authorization": f"Bearer {token}"}).status_code
        == 200
    )
    token_id = int(
        re.search(
            r"/settings/tokens/(\d+)/revoke", web.get("/settings").get_data(as_text=True)
        ).group(1)
    )
    assert web.post(f"/settings/tokens/{token_id}/revoke").status_code == 302
    assert (
        web.client.get("/api/v1/drives", headers={"Authorization": f"Bearer {token}"}).status_code
        == 401
    )
    assert (
        web.post(
            "/settings/admins", {"username": "Bad Name", "password": "long enough pw"}
        ).status_code
        == 400
    )
    assert (
        web.post(
            "/settings/admins", {"username": "alice", "password": "long enough pw"}
        ).status_code
        == 302
    )
    assert (
        Browserish(web.client.application.test_client())
        .login("alice", "long enough pw")
        .status_code
        == 302
    )
    assert [e.actor for e in events.recent(catalog, 5, kind_prefix="admin.")][:3] == [
        ADMIN,
        ADMIN,
        ADMIN,
    ]


def test_events_page_filters_and_pages(web, appliance):
    _, catalog = appliance
    for n in range(105):
        events.record(catalog, "test.bulk", f"bulk event {n}", actor="tester")
    html = web.get("/events?kind=test.").get_data(as_text=True)
    assert "bulk event 104" in html and "bulk event 4<" not in html and "Older events" in html
    older = re.search(r'href="(/events\?[^"]+before=\d+)"', html).group(1).replace("&amp;", "&")
    assert "bulk event 4<" in web.get(older).get_data(as_text=True)


def test_dashboard_charts_show_samples_or_say_there_are_none(web, appliance):
    _, catalog = appliance
    html = web.get("/").get_data(as_text=True)
    assert "no throughput samples in the last hour" in html
    assert "warm live" in html and "drives by state" in html
    import time

    now = time.time_ns()
    for i in range(6):
        metrics.record_sample(
            catalog,
            time_ns=now - (6 - i) * 60 * 10**9,
            nfs_read_bytes=i * 600 * 2**20,
            nfs_write_bytes=i * 60 * 2**20,
        )
    html = web.get("/").get_data(as_text=True)
    assert "no throughput samples" not in html and "<polyline" in html
    assert "10.0 MiB/s" in html  # 600 MiB per 60 s: the read rate's top label


def test_threshold_fields_are_the_tiering_policy_fields_with_its_defaults():
    from dataclasses import fields

    from engine.lifecycle.tiering import TieringPolicy
    from webui.tiers import THRESHOLDS

    policy = TieringPolicy()
    known = {f.name for f in fields(TieringPolicy)}
    for f in THRESHOLDS.fields:
        assert f.name in known and f.default == getattr(policy, f.name), f.name
        assert f.minimum <= f.default <= f.maximum
