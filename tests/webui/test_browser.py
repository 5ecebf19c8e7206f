"""The admin UI in a real browser: Debian's chromium driven by Playwright (the ``page``
fixture, tests/webui/conftest.py), against a real HTTP server."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import select
from werkzeug.serving import make_server

from engine.catalog.models import RetentionPolicy
from tests.webui.conftest import ADMIN, PASSWORD
from tests.webui.helpers import exists, make_checkpoints


@pytest.fixture
def server(live):
    httpd = make_server("127.0.0.1", 0, live.app, threaded=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_port}"
    httpd.shutdown()
    thread.join(10)


def test_keep_last_3_rule_in_the_browser(server, page, live, tmp_path):
    catalog, ns = live.catalog, live.namespace  # the daemon's side: data path and job runner
    made = make_checkpoints(ns, "/checkpoints/run1", range(1, 6), size=48_000)
    rules = lambda: catalog.read(lambda c: c.execute(select(RetentionPolicy.__table__)).all())  # noqa: E731

    page.goto(server + "/retention")
    assert page.url.startswith(server + "/login")  # not signed in: sent to the login page
    page.fill("input[name=username]", ADMIN)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(server + "/retention")

    form = "#new-rule"
    for pattern, keep, expected in (
        ("/checkpoints/*/step-*", "0", "keep = 0: expected at least 1"),
        ("/checkpoints/*/step-*", "-1", "keep = -1: expected at least 1"),
        ("/checkpoints/../step-*", "3", "'..' components are not allowed"),
        ("", "3", "pattern = '': expected a non-empty value"),
    ):
        page.fill(f"{form} input[name=pattern]", pattern)
        page.fill(f"{form} input[name=keep]", keep)
        page.click(f"{form} button[type=submit]")
        page.wait_for_load_state()
        shown = " ".join(page.locator(f"{form} .error").all_inner_texts())
        assert expected in shown, (pattern, keep, shown)
        assert (
            page.locator(f"{form} input[name=pattern]").input_value() == pattern
        )  # kept for correcting
        assert rules() == []

    page.fill(f"{form} input[name=pattern]", "/checkpoints/*/step-*")
    page.fill(f"{form} input[name=keep]", "3")
    page.click(f"{form} button[type=submit]")
    page.wait_for_selector("#preview")
    listed = page.locator("#preview td.path").all_inner_texts()
    oldest = sorted(made, key=made.get)[:2]
    assert listed == oldest == ["/checkpoints/run1/step-1", "/checkpoints/run1/step-2"]
    assert all(exists(ns, path) for path in made)  # the preview removed nothing

    page.click("#apply")  # queues a retention job; its page refreshes until the daemon has run it
    page.wait_for_selector("#summary", timeout=30000)
    assert "2 of 2 planned actions done" in page.inner_text("#summary")
    assert page.inner_text("#job-state") == "done"
    assert [exists(ns, f"/checkpoints/run1/step-{n}") for n in range(1, 6)] == [
        False,
        False,
        True,
        True,
        True,
    ]
    assert len(rules()) == 1

    page.goto(server + "/drives")
    page.wait_for_selector("#drive-table")
    for n in range(1, 5):  # each drive's facts and band map are folded under its line
        page.click(f"#drive-{n} > details > summary")
    page.wait_for_selector("#drive-1 svg.chart")
    assert page.locator("section.drive").count() == 4
    assert "no SMART data" in page.inner_text("#drive-4")
    assert (
        page.locator("#drive-1 rect.zone.z-open").count() >= 1
    )  # bands the checkpoints were written to
    shot = tmp_path / "drives.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 20_000
    # the stylesheet loaded under the page's CSP (no inline styles): band-map zones are coloured
    fill = page.eval_on_selector("#drive-1 rect.zone.z-open", "el => getComputedStyle(el).stroke")
    assert fill not in ("", "none", "rgb(0, 0, 0)"), fill
