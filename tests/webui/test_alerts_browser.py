"""The alerts page and banner in Debian's chromium (Playwright; never a downloaded browser)."""

from __future__ import annotations

from engine.admin.alerts import AlertMonitor, AlertService, AlertSettings, DriveFailed
from engine.lifecycle import drives as drive_states
from tests.webui.conftest import ADMIN, PASSWORD
from tests.webui.test_browser import server  # noqa: F401  (fixtures)


def sign_in(tab, base, where):
    tab.goto(base + where)
    tab.fill("input[name=username]", ADMIN)
    tab.fill("input[name=password]", PASSWORD)
    tab.click("button[type=submit]")
    tab.wait_for_url(base + where)


def test_banner_list_acknowledge_and_clear(server, page, live):  # noqa: F811
    catalog = live.catalog
    monitor = AlertMonitor(catalog, AlertSettings(), sources=[DriveFailed()])
    drive = drive_states.list_drives(catalog)[0].id
    sign_in(page, server, "/")
    assert page.locator("#alert-banner").count() == 0  # nothing active: no banner

    drive_states.fail_drive(catalog, drive, actor="admin")
    [raised] = monitor.tick(force=True)
    page.goto(server + "/exports")  # every page carries the banner, not only the dashboard
    banner = page.locator("#alert-banner")
    assert "1 active alert" in banner.inner_text() and "critical" in banner.inner_text()
    assert "bad" in banner.get_attribute("class")
    box = banner.bounding_box()
    assert box["width"] > 300 and box["height"] > 10  # shown, across the page
    banner.locator("a").click()
    page.wait_for_url(server + "/alerts")
    row = page.locator(f"tr[data-alert='{raised.alert.id}']")
    assert row.get_attribute("data-state") == "active"
    assert f"drive {drive} is failed" in row.inner_text()

    row.locator("button", has_text="Acknowledge").click()
    page.wait_for_url(server + "/alerts")
    row = page.locator(f"tr[data-alert='{raised.alert.id}']")
    assert row.get_attribute("data-state") == "acknowledged"
    assert f"by {ADMIN}" in row.inner_text()
    assert page.locator("#alert-banner").count() == 0  # acknowledged: the banner goes
    assert AlertService(catalog).get(raised.alert.id).acknowledged_by == ADMIN

    drive_states.set_drive_state(catalog, drive, "removed")
    [cleared] = monitor.tick(force=True)
    assert cleared.change == "cleared"
    page.reload()
    assert (
        page.locator(f"tr[data-alert='{raised.alert.id}']").get_attribute("data-state") == "cleared"
    )
    assert page.locator(f"tr[data-alert='{raised.alert.id}'] button").count() == 0
