"""The Hosts page and the per-host metrics over a running appliance's catalog: files written
through the daemon's data path, its drives labelled with hosts; each host's fragments and bytes
against the catalog's own rows, its state as its drives change state, a rebuild's progress;
in Debian's chromium (Playwright): the nav link, sorting, a 390 px phone without overflow."""

from __future__ import annotations

import re

from sqlalchemy import func, select

from engine.admin import jobs
from engine.catalog.models import Drive, Fragment
from engine.lifecycle import drives as drive_states
from tests.webui.helpers import make_checkpoints
from tests.webui.test_browser import server  # noqa: F401
from tests.webui.test_metrics import parse
from tests.webui.test_operations_browser import sign_in

DRIVES, FRAGMENTS = Drive.__table__, Fragment.__table__


def label_hosts(catalog) -> None:
    """Drive n on host h(n-1): four hosts of one drive each."""
    catalog.run(
        lambda conn: [
            conn.execute(DRIVES.update().where(DRIVES.c.id == n).values(host=f"h{n - 1}"))
            for n in range(1, 5)
        ]
    )


def held_by_host(catalog) -> dict[str, tuple[int, int]]:
    rows = catalog.read(
        lambda conn: conn.execute(
            select(DRIVES.c.host, func.count(), func.sum(FRAGMENTS.c.length))
            .select_from(FRAGMENTS.join(DRIVES, DRIVES.c.id == FRAGMENTS.c.drive_id))
            .group_by(DRIVES.c.host)
        ).all()
    )
    return {host or "local": (int(n), int(b)) for host, n, b in rows}


def host_rows(html: str) -> dict[str, dict[str, str]]:
    """host -> the table row's state, fragments, bytes held (data-value) and "to move"."""
    out = {}
    for name, body in re.findall(r'<tr data-host="([^"]+)">(.*?)</tr>', html, re.S):
        state = re.search(r'class="badge h-(\w+)"', body)
        values = dict(re.findall(r'class="num (\w+)[^"]*" data-value="(\d+)"', body))
        out[name] = {"state": state.group(1) if state else "", **values}
    return out


def test_hosts_page_and_metrics_follow_the_catalog(live, live_web):
    make_checkpoints(live.namespace, "/data", range(1, 4), size=150_000)
    page_html = live_web.get("/hosts").get_data(as_text=True)
    assert list(host_rows(page_html)) == ["local"]  # one box: the head's own drives
    assert 'any <b class="warn" id="may-lose">0</b>' in page_html

    label_hosts(live.catalog)
    held = held_by_host(live.catalog)
    assert sorted(held) == ["h0", "h1", "h2", "h3"] and all(n for n, _ in held.values())
    rows = host_rows(live_web.get("/hosts").get_data(as_text=True))
    assert {name: (int(r["fragments"]), int(r["held"])) for name, r in rows.items()} == held
    assert {r["state"] for r in rows.values()} == {"up"}
    values = parse(live.app.test_client().get("/metrics").get_data(as_text=True))
    for host, (count, nbytes) in held.items():
        assert values[f'shingle_host_fragments{{host="{host}"}}'] == count
        assert values[f'shingle_host_fragment_bytes{{host="{host}"}}'] == nbytes
        assert values[f'shingle_host_state{{host="{host}",state="up"}}'] == 1
        assert values[f'shingle_host_drives{{host="{host}",state="online"}}'] == 1
        assert values[f'shingle_host_waiting_fragments{{host="{host}"}}'] == 0
    assert values['shingle_host_capacity_bytes{host="h0"}'] == 16 << 20

    drive_states.fail_drive(live.catalog, 4, actor="test")  # h3 has no other drive: lost
    drive_states.start_drain(live.catalog, 3, actor="test")  # h2 being emptied
    html = live_web.get("/hosts").get_data(as_text=True)
    rows = host_rows(html)
    assert {n: r["state"] for n, r in rows.items()} == {
        "h0": "up",
        "h1": "up",
        "h2": "draining",
        "h3": "lost",
    }
    assert rows["h3"]["waiting"] == rows["h3"]["fragments"] == str(held["h3"][0])
    assert rows["h0"]["waiting"] == "0"
    # 2+2 stripes (and 3 copies) with a fragment on the lost host: one more host may go
    assert '<b class="" id="may-lose">1</b>' in html
    values = parse(live.app.test_client().get("/metrics").get_data(as_text=True))
    assert values['shingle_host_state{host="h3",state="lost"}'] == 1
    assert values['shingle_host_state{host="h3",state="up"}'] == 0
    assert values['shingle_host_state{host="h2",state="draining"}'] == 1
    assert values['shingle_host_drives{host="h3",state="failed"}'] == 1
    assert values['shingle_host_waiting_fragments{host="h3"}'] == held["h3"][0]


def test_hosts_page_in_chromium(server, chromium, live):  # noqa: F811
    make_checkpoints(live.namespace, "/data", range(1, 4), size=150_000)
    label_hosts(live.catalog)
    drive_states.fail_drive(live.catalog, 4, actor="test")
    drive_states.start_drain(live.catalog, 3, actor="test")
    live.maintenance.stop()  # the jobs below stay where the test puts them
    live.maintenance.join(30)
    job = jobs.claim(live.catalog, jobs.submit(live.catalog, "rebuild", actor="test"))
    assert job is not None
    jobs.progress_writer(live.catalog, job.id)(2, 5, "rebuilding drive 4's fragments")
    drain = jobs.claim(live.catalog, jobs.submit(live.catalog, "host-drain", {"host": "h2"}))
    assert drain is not None
    jobs.progress_writer(live.catalog, drain.id)(1 << 20, 4 << 20, "draining h2")

    wide = chromium.new_context(viewport={"width": 1280, "height": 900})
    tab = wide.new_page()
    tab.set_default_timeout(15000)
    sign_in(tab, server)
    tab.click("nav a:has-text('Hosts')")
    tab.wait_for_selector("#host-table")
    assert tab.url == server + "/hosts"
    assert "active" in (tab.get_attribute("nav a:has-text('Hosts')", "class") or "")
    assert "rebuilding drive 4's fragments" in tab.inner_text("#moving")
    assert tab.eval_on_selector("#moving tr[data-job] progress", "p => p.value") == 0.4
    assert "draining h2" in tab.inner_text("#moving")
    under_way = tab.inner_text("#host-table tr[data-host='h2'] td.operation")
    assert "host-drain" in under_way and "25 %" in under_way and "MB/s" in under_way
    assert tab.inner_text("#host-table tr[data-host='h0'] td.operation") == "–"
    order = "rows => rows.map(r => r.dataset.host)"
    tab.click("#host-table th:has-text('to move')")  # h2 and h3 have fragments to move
    assert tab.eval_on_selector_all("#host-table tbody tr", order)[:2] == ["h0", "h1"]
    tab.click("#host-table th:has-text('to move')")
    assert sorted(tab.eval_on_selector_all("#host-table tbody tr", order)[:2]) == ["h2", "h3"]
    fragments = tab.eval_on_selector_all(
        "#host-table td.fragments", "cells => cells.map(c => Number(c.dataset.value))"
    )
    assert sum(fragments) == sum(n for n, _ in held_by_host(live.catalog).values())
    assert tab.inner_text("#host-table tr[data-host='h3'] .badge") == "lost"
    tab.click("#host-table a:has-text('h3')")
    assert "failed" in tab.inner_text("#host-h3")
    tab.click("#host-h3 a:has-text('4')")  # its drive, on the Drives page
    tab.wait_for_selector("#drive-4")
    wide.close()

    phone = chromium.new_context(viewport={"width": 390, "height": 844}, color_scheme="dark")
    tab = phone.new_page()
    tab.set_default_timeout(15000)
    sign_in(tab, server, "/hosts")
    width = tab.evaluate("document.scrollingElement.scrollWidth")
    assert width <= 390, f"/hosts is {width} px wide at a 390 px viewport"
    tab.screenshot(path=str(live.config.data_dir / "hosts-390-dark.png"), full_page=True)
    phone.close()
