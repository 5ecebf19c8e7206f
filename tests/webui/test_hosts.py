"""Hosts as failure domains in the dashboard, the REST API's /status and /metrics: nothing of
them while every drive is the head's own, the count and the hosts that may be lost once the
drives are on several hosts (engine/lifecycle/hosts.py)."""

from __future__ import annotations

import re

from engine.catalog.models import Drive

DRIVES = Drive.__table__


def test_one_host_shows_no_hosts_line_and_several_do(app, web, appliance):
    _config, catalog = appliance
    assert 'id="hosts-figures"' not in web.get("/").get_data(as_text=True)
    hosts = web.api("GET", "/api/v1/status").get_json()["hosts"]
    assert hosts["count"] == 1 and hosts["hosts"][0]["name"] == "local"

    ids = catalog.read(lambda conn: conn.execute(DRIVES.select()).all())

    def spread(conn):  # each drive on a host of its own
        for n, row in enumerate(ids):
            conn.execute(DRIVES.update().where(DRIVES.c.id == row.id).values(host=f"h{n}"))

    catalog.run(spread)
    page = web.get("/").get_data(as_text=True)
    line = re.search(r'id="hosts-figures">(.*?)</p>', page, re.S)
    assert line is not None and f"{len(ids)} hosts" in line.group(1)
    hosts = web.api("GET", "/api/v1/status").get_json()["hosts"]
    assert hosts["count"] == len(ids)
    assert sorted(h["name"] for h in hosts["hosts"]) == sorted(f"h{n}" for n in range(len(ids)))
    metrics = app.test_client().get("/metrics").get_data(as_text=True)
    assert f"shingle_hosts {len(ids)}" in metrics
    losable = hosts["losable_by_placement"] if hosts["losable"] is None else hosts["losable"]
    assert re.search(rf"^shingle_hosts_losable {losable}$", metrics, re.M)
    assert f'<b class="{"warn" if losable == 0 else ""}">{losable}</b>' in line.group(1)
