"""The operations pages in Debian's chromium (Playwright; never a downloaded browser), asserted on
layout and behaviour: a 390 px phone viewport without horizontal overflow, dark mode from the
system setting, the drive table's own per-drive counters, confirmation steps before destructive
actions, the job list refreshing itself, trash restore and purge."""

from __future__ import annotations

import re

from sqlalchemy import select

from engine.admin import jobs, metrics
from engine.admin.trash import Trash
from engine.catalog.models import RetentionPolicy
from tests.webui.conftest import ADMIN, PASSWORD, Browserish
from tests.webui.helpers import exists, make_checkpoints
from tests.webui.test_browser import server  # noqa: F401  (a fixture)

PAGES = (
    "/",
    "/drives",
    "/retention",
    "/retention/preview",
    "/trash",
    "/jobs",
    "/tiers",
    "/exports",
    "/smb",
    "/events",
    "/alerts",
    "/settings",
)


def sign_in(tab, base: str, where: str = "/") -> None:
    tab.goto(base + where)
    tab.fill("input[name=username]", ADMIN)
    tab.fill("input[name=password]", PASSWORD)
    tab.click("button[type=submit]")
    tab.wait_for_url(base + where)


def luminance(css_colour: str) -> float:
    r, g, b = (int(v) for v in re.findall(r"\d+", css_colour)[:3])
    return (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255


def fill_the_pages(live) -> None:
    """Something on every page: checkpoints, a rule, a trashed entry, a finished job."""
    ns = live.namespace
    make_checkpoints(ns, "/checkpoints/a-run-with-a-rather-long-name-for-a-phone", range(1, 5))
    live.catalog.run(
        lambda c: c.execute(
            RetentionPolicy.__table__.insert().values(
                pattern="/checkpoints/*/step-*",
                keep=2,
                order_by="mtime",
                action="trash",
                enabled=True,
                created_ns=1,
            )
        )
    )
    Trash(ns, live.catalog).move_to_trash(
        "/checkpoints/a-run-with-a-rather-long-name-for-a-phone/step-1", actor=ADMIN
    )
    jobs.wait(live.catalog, jobs.submit(live.catalog, "scrub", {}), timeout_s=30, poll_s=0.05)
    metrics.record_sample(live.catalog, **live.daemon.datapath.counters())


def test_390_px_without_overflow_and_dark_mode(server, chromium, live):  # noqa: F811
    fill_the_pages(live)
    phone = chromium.new_context(viewport={"width": 390, "height": 844}, color_scheme="dark")
    tab = phone.new_page()
    tab.set_default_timeout(15000)
    sign_in(tab, server)
    for path in PAGES:
        tab.goto(server + path)
        width = tab.evaluate("document.scrollingElement.scrollWidth")
        assert width <= 390, f"{path}: the page is {width} px wide at a 390 px viewport"
        background = tab.evaluate("getComputedStyle(document.body).backgroundColor")
        assert luminance(background) < 0.2, (path, background)
        card = tab.evaluate(
            "getComputedStyle(document.querySelector('.card') || document.body).backgroundColor"
        )
        assert luminance(card) < 0.25, (path, card)
    # the drive table is wider than a phone: it scrolls inside its card, not the page
    tab.goto(server + "/drives")
    box = tab.evaluate(
        "(() => { const c = document.getElementById('drive-table-card');"
        " return [c.scrollWidth, c.clientWidth, getComputedStyle(c).overflowX]; })()"
    )
    assert box[0] > box[1] and box[2] == "auto", box
    # the navigation wraps onto more lines instead of running off the side
    nav = tab.evaluate(
        "Array.from(document.querySelectorAll('nav a')).map(a => a.getBoundingClientRect().right)"
    )
    assert max(nav) <= 390
    tab.screenshot(path=str(live.config.data_dir / "drives-390-dark.png"), full_page=True)
    phone.close()

    light = chromium.new_context(viewport={"width": 1280, "height": 900}, color_scheme="light")
    tab = light.new_page()
    sign_in(tab, server)
    assert luminance(tab.evaluate("getComputedStyle(document.body).backgroundColor")) > 0.8
    light.close()


def test_drive_table_counts_each_drives_own_io(server, page, live):  # noqa: F811
    make_checkpoints(live.namespace, "/data", range(1, 3), size=100_000)
    datapath = live.daemon.datapath
    metrics.record_sample(live.catalog, **datapath.counters())  # as the daemon samples
    before = datapath.counters()
    datapath.space.drives[3].backend.read(0, 0, 4096)  # I/O to one drive only
    metrics.record_sample(live.catalog, **datapath.counters())
    sign_in(page, server, "/drives")
    rows = page.locator("#drive-table tbody tr")
    assert rows.count() == 4
    read = {
        int(rows.nth(i).get_attribute("data-drive")): int(
            rows.nth(i).locator("td.io-read").get_attribute("data-value")
        )
        for i in range(4)
    }
    assert read == {
        d: int(before[f"drive_{d}_read_bytes"]) + (4096 if d == 3 else 0) for d in range(1, 5)
    }
    assert read[3] > 0 and len(set(read.values())) > 1  # not one host disk's numbers for all
    written = page.locator("#drive-table td.io-write").all_inner_texts()
    assert all(text.endswith(("KiB", "MiB", " B")) for text in written)  # human sizes

    # sortable: a click on "read I/O" orders the rows by it, a second click reverses them
    page.click("#drive-table th:has-text('read I/O')")
    ascending = [
        int(v)
        for v in page.eval_on_selector_all(
            "#drive-table td.io-read", "cells => cells.map(c => c.dataset.value)"
        )
    ]
    assert ascending == sorted(ascending)
    page.click("#drive-table th:has-text('read I/O')")
    descending = [
        int(v)
        for v in page.eval_on_selector_all(
            "#drive-table td.io-read", "cells => cells.map(c => c.dataset.value)"
        )
    ]
    assert descending == sorted(ascending, reverse=True)

    # SMART actions only where SMART exists (drive 4 is emulated without a device)
    assert page.locator("#drive-1 button[data-action=smart_test]").count() == 1
    assert page.locator("#drive-4 button[data-action=smart_test]").count() == 0
    assert "no SMART data" in page.inner_text("#drive-4")

    # marking a drive failed asks first; Cancel leaves it online
    page.click("#drive-2 button[data-action=mark_failed]")
    page.wait_for_selector("#confirm")
    assert "Mark drive 2 failed?" in page.inner_text("#confirm")
    page.click("#confirm a:has-text('Cancel')")
    page.wait_for_selector("#drive-table")
    assert "online" in page.inner_text("#drive-table tr[data-drive='2']")

    # a zoned block device's own fault counts, as the daemon samples them from
    # engine/drives/blkzoned.py (the counting itself is checked on kernel zoned devices in
    # tests/kernel/test_zoned.py): shown with their meaning on the page and in the API
    faults = {"drive_2_device_errors": 3, "drive_2_off_pointer_errors": 1}
    metrics.record_sample(live.catalog, **datapath.counters(), **faults)
    page.goto(server + "/drives")
    page.click("#drive-2 > details > summary")
    facts = page.inner_text("#drive-2 dl.facts")
    assert re.search(r"device errors\s+3: errors the zoned device returned", facts), facts
    assert re.search(r"off-pointer writes\s+1: of those, writes the device refused", facts), facts
    assert "Expected 0" in facts
    bad = page.eval_on_selector("#drive-2 dd.off-pointer-errors b", "el => el.className")
    assert bad == "bad"
    cell = page.locator("#drive-table tr[data-drive='2'] td.io-errors")
    assert "(3 device)" in cell.inner_text()
    assert "the device returned 3, 1 of them off-pointer writes" in cell.get_attribute("title")
    page.click("#drive-1 > details > summary")  # a drive without a zoned device: no such lines
    assert "device errors" not in page.inner_text("#drive-1 dl.facts")
    assert page.locator("#drive-table tr[data-drive='1'] td.io-errors span").count() == 0

    client = Browserish(live.app.test_client())
    assert client.login().status_code == 302
    listed = {d["id"]: d["io"] for d in client.get("/api/v1/drives").get_json()}
    assert (listed[2]["device_errors"], listed[2]["off_pointer_errors"]) == (3, 1)
    assert "device_errors" not in listed[1]
    assert listed[2]["errors"] == sum(
        listed[2][f"{k}_errors"] for k in ("read", "write", "checksum")
    )
    one = client.get("/api/v1/drives/2").get_json()["io"]
    assert (one["device_errors"], one["off_pointer_errors"]) == (3, 1)


def test_rule_delete_asks_and_preview_shows_sizes(server, page, live):  # noqa: F811
    made = make_checkpoints(live.namespace, "/ckpt/run", range(1, 6), size=30_000)
    rules = lambda: live.catalog.read(  # noqa: E731
        lambda c: c.execute(select(RetentionPolicy.__table__)).all()
    )
    sign_in(page, server, "/retention")
    assert page.locator("#new-rule select[name=action]").input_value() == "trash"  # the default
    assert "frees no space" in page.inner_text("#trash-note")
    page.fill("#new-rule input[name=pattern]", "/ckpt/*/step-*")
    page.fill("#new-rule input[name=keep]", "3")
    page.click("#new-rule button[type=submit]")
    page.wait_for_selector("#preview")
    sizes = page.locator("#preview td.size").all_inner_texts()
    assert sizes == ["29.3 KiB", "29.3 KiB"]  # each step's model.pt, 30,000 bytes
    assert "moves 58.6 KiB to the trash" in page.inner_text("#freed")
    assert "Frees 0 B now" in page.inner_text("#freed")
    assert "still take their space" in page.inner_text("#trash-note")
    assert all(exists(live.namespace, p) for p in made)

    page.goto(server + "/retention")
    page.click("#rules button.danger")  # Delete: a confirmation page, nothing deleted yet
    page.wait_for_selector("#confirm")
    assert "Delete retention rule" in page.inner_text("#confirm") and len(rules()) == 1
    page.click("#confirm a:has-text('Cancel')")
    page.wait_for_selector("#rules")
    assert len(rules()) == 1
    page.click("#rules button.danger")
    page.click("#confirm-yes")
    page.wait_for_url(server + "/retention")
    assert rules() == [] and "deleted" in page.inner_text(".flash")


def test_job_list_updates_without_reload(server, page, live):  # noqa: F811
    sign_in(page, server, "/jobs")
    page.evaluate("window.notReloaded = true")
    assert page.locator("#jobs").is_hidden()  # no jobs yet
    job_id = jobs.submit(live.catalog, "scrub", {}, actor="cron")
    row = page.locator(f"#jobs tr[data-job='{job_id}']")
    row.wait_for(timeout=10000)
    page.wait_for_function(
        f"document.querySelector(\"#jobs tr[data-job='{job_id}'] td.state\").textContent"
        " === 'done'",
        timeout=30000,
    )
    assert "scrub" in row.inner_text() and "cron" in row.inner_text()
    assert page.evaluate("window.notReloaded") is True  # updated in place, not by a reload
    assert page.locator("#jobs-empty").is_hidden()


def test_trash_restore_and_purge(server, page, live):  # noqa: F811
    ns = live.namespace
    make_checkpoints(ns, "/ckpt/run", range(1, 4), size=20_000)
    bin_ = Trash(ns, live.catalog)
    first = bin_.move_to_trash("/ckpt/run/step-1", actor=ADMIN)
    second = bin_.move_to_trash("/ckpt/run/step-2", actor=ADMIN)
    assert not exists(ns, "/ckpt/run/step-1")
    sign_in(page, server, "/trash")
    assert page.locator("#trash tbody tr").count() == 2
    assert "39.1 KiB" in page.inner_text("#trash-total")  # two 20,000-byte files
    page.click(f"tr[data-entry='{first.id}'] button.restore")
    page.wait_for_url(server + "/trash")
    assert "restored to /ckpt/run/step-1" in page.inner_text(".flash")
    assert exists(ns, "/ckpt/run/step-1") and page.locator("#trash tbody tr").count() == 1

    page.click(f"tr[data-entry='{second.id}'] button.purge")  # asks first
    page.wait_for_selector("#confirm")
    assert "removed for good" in page.inner_text("#confirm")
    assert [e.id for e in bin_.list()] == [second.id]
    page.click("#confirm-yes")  # a trash-purge job for the daemon; its page follows it
    page.wait_for_selector("#job-state:has-text('done')", timeout=30000)
    assert bin_.list() == [] and not exists(ns, "/ckpt/run/step-2")
    page.goto(server + "/trash")
    assert "The trash is empty" in page.inner_text("main")
