"""Operations pages without a browser: durations typed as "30 d", capacity figures that agree,
retention preview totals, the trash page's purge scopes and its API."""

from __future__ import annotations

import re

import pytest

from appliance.status import space_by_state
from engine.admin import jobs
from engine.admin.trash import Trash
from engine.base.units import format_duration, parse_duration
from engine.lifecycle import drives as lifecycle
from tests.webui.helpers import exists, make_checkpoints, mkdirs
from webui.dashboard import live_by_class


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("30 d", 30 * 86400),
        ("2 h 30 min", 9000),
        ("90s", 90),
        ("1.5 h", 5400),
        ("600", 600),
        ("1 w", 7 * 86400),
        (" 12 H ", 12 * 3600),
    ],
)
def test_durations_people_type(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "abc", "5 x", "-3 d", "d", "3 d and a bit"])
def test_durations_that_are_not(text):
    with pytest.raises(ValueError, match="expected a duration such as 30 d"):
        parse_duration(text)


@pytest.mark.parametrize("seconds", [60, 3600, 86400, 2592000, 125, 9000, 608400])
def test_what_format_duration_writes_reads_back(seconds):
    assert parse_duration(format_duration(seconds)) == seconds
    assert format_duration(2592000) == "30 d" and format_duration(120) == "2 min"


def test_tier_thresholds_are_shown_and_taken_as_durations(web, appliance):
    _, catalog = appliance
    html = web.get("/tiers").get_data(as_text=True)
    assert re.search(r'name="warm_to_cold_after_s"[^>]*\s+value="30 d"', html), html
    assert "2592000" not in html
    form = {
        "hot_to_warm_after_s": "2 h",
        "warm_to_cold_after_s": "14 d",
        "promote_reads": "3",
        "promote_window_s": "1 d 12 h",
    }
    assert web.post("/tiers/thresholds", form).status_code == 302
    assert catalog.get_setting("tiering.hot_to_warm_after_s") == "7200"
    assert catalog.get_setting("tiering.warm_to_cold_after_s") == str(14 * 86400)
    assert catalog.get_setting("tiering.promote_window_s") == str(36 * 3600)
    html = web.get("/tiers").get_data(as_text=True)
    assert 'value="2 h"' in html and 'value="14 d"' in html and 'value="1 d 12 h"' in html
    bad = web.post("/tiers/thresholds", {**form, "hot_to_warm_after_s": "soon"})
    text = bad.get_data(as_text=True).replace("&#39;", "'")
    assert bad.status_code == 400 and "hot_to_warm_after_s = 'soon': expected a duration" in text
    short = web.post("/tiers/thresholds", {**form, "hot_to_warm_after_s": "10 s"})
    assert short.status_code == 400
    assert b"expected at least 60 s (1 min)" in short.data
    assert catalog.get_setting("tiering.hot_to_warm_after_s") == "7200"  # nothing saved


def test_capacity_header_and_bar_use_the_same_figures(web, app, appliance):
    _, catalog = appliance
    shingle = app.extensions["shingle"]
    lifecycle.fail_drive(catalog, 1, actor="test")  # its zones leave the usable figures
    from appliance.status import gather

    report = gather(catalog, shingle.policies, shingle.config.get("storage.reserve_zones"))
    space = space_by_state(report["capacity"])
    html = web.get("/").get_data(as_text=True)
    header = dict(re.findall(r'<b data-state="(\w+)">([^<]+)</b>', html))
    legend = dict(
        re.findall(r'<text class="legend"[^>]*>([a-z ]+?) ([\d.]+ [KMGT]?i?B)</text>', html)
    )
    for state in ("garbage", "reserve", "free", "stranded"):
        assert header[state] == legend[state], (state, header, legend)
    # live in the bar is split by band class, and the parts add up to the header's live
    parts = live_by_class(space["live"], {})
    assert sum(n for _, n, _ in parts) == space["live"]
    by_class = {"warm": {"live_bytes": 3 << 20}, "cold": {"live_bytes": 1 << 20}}
    scaled = live_by_class(2 << 20, by_class)  # failed drives' zones counted: scaled down
    assert [(name, n) for name, n, _ in scaled] == [("cold live", 1 << 19), ("warm live", 3 << 19)]
    assert sum(n for _, n, _ in live_by_class(5 << 20, by_class)) == 5 << 20  # "other live"


def test_preview_totals_what_delete_frees(live_web, live):
    web, ns = live_web, live.namespace
    make_checkpoints(ns, "/ckpt/run", range(1, 6), size=40_000)
    form = {"pattern": "/ckpt/*/step-*", "keep": "3", "action": "delete", "order_by": "mtime"}
    response = web.post("/retention/rules", {**form, "enabled": "on"})
    html = web.get(response.headers["Location"]).get_data(as_text=True)
    assert re.findall(r'<td class="num size nowrap">([^<]+)</td>', html) == ["39.1 KiB"] * 2
    assert "Frees 78.1 KiB now." in html and 'id="trash-note"' not in html


def test_trash_purge_scopes_ask_first_then_queue_a_job(web, appliance):
    _, catalog = appliance
    asked = web.post("/trash/purge", {"scope": "all"})
    assert asked.status_code == 200 and b"Empty the trash?" in asked.data
    assert not [j for j in jobs.recent(catalog) if j.kind == "trash-purge"]
    done = web.post("/trash/purge", {"scope": "all", "confirm": "yes"})
    assert done.status_code == 302 and "/jobs/" in done.headers["Location"]
    web.post("/trash/purge", {"scope": "expired", "confirm": "yes"})
    queued = [j.params for j in jobs.recent(catalog) if j.kind == "trash-purge"]
    assert queued == [{"older_than_s": None}, {"older_than_s": 0}]
    assert web.post("/trash/purge", {"scope": "everything", "confirm": "yes"}).status_code == 302
    assert len([j for j in jobs.recent(catalog) if j.kind == "trash-purge"]) == 2
    assert web.post("/trash/999/purge").status_code == 404
    assert web.post("/trash/999/restore").status_code == 404


def test_trash_api_restores_and_purges_one_entry(live_web, live):
    web, ns, catalog = live_web, live.namespace, live.catalog
    mkdirs(ns, "/old/a")
    mkdirs(ns, "/old/b")
    bin_ = Trash(ns, catalog)
    a = bin_.move_to_trash("/old/a", actor="test")
    b = bin_.move_to_trash("/old/b", actor="test")
    listed = web.api("GET", "/api/v1/trash").get_json()
    assert [e["original_path"] for e in listed] == ["/old/a", "/old/b"]
    restored = web.api("POST", f"/api/v1/trash/{a.id}/restore").get_json()
    assert restored == {"restored": a.id, "path": "/old/a"} and exists(ns, "/old/a")
    response = web.api("POST", "/api/v1/trash/purge", json={"entry": b.id})
    assert response.status_code == 202 and response.get_json()["params"] == {"entry": b.id}
    job = jobs.wait(catalog, response.get_json()["id"], timeout_s=30, poll_s=0.05)
    assert job.state == "done" and [e["id"] for e in job.result] == [b.id]
    assert bin_.list() == [] and exists(ns, "/old/a") and not exists(ns, "/old/b")
    assert web.api("POST", "/api/v1/trash/purge", json={"entry": 12345}).status_code == 404
