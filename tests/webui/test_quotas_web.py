"""Quotas in the web UI: the API's /quotas (set, change, remove, recount, errors) and the
quotas section of the exports page in Debian's chromium, enforced by the daemon's side."""

from __future__ import annotations

import pytest

from engine.admin.quota_service import QuotaService
from engine.base import errors
from engine.namespace import ROOT
from tests.webui.conftest import ADMIN, PASSWORD
from tests.webui.helpers import mkdirs
from tests.webui.test_browser import server  # noqa: F401 - fixtures (page and chromium: conftest.py)


def test_quota_api(web, app):
    ns = app.extensions["shingle"].namespace
    mkdirs(ns, "/team/sub")
    made = web.api("POST", "/api/v1/quotas", json={"path": "/team", "bytes_limit": 1 << 20})
    assert made.status_code == 201, made.get_json()
    quota = made.get_json()
    assert (quota["path"], quota["bytes_limit"], quota["files_limit"]) == ("/team", 1 << 20, None)
    assert quota["used_files"] == 1  # sub
    changed = web.api("PATCH", f"/api/v1/quotas/{quota['id']}", json={"files_limit": 5})
    assert changed.get_json()["files_limit"] == 5 and changed.get_json()["bytes_limit"] == 1 << 20
    assert [q["path"] for q in web.get("/api/v1/quotas").get_json()] == ["/team"]
    assert web.get(f"/api/v1/quotas/{quota['id']}").get_json()["used_files"] == 1
    assert web.api("POST", "/api/v1/quotas/recount").get_json() == {"corrected": []}

    missing = web.api("POST", "/api/v1/quotas", json={"path": "/nope", "files_limit": 1})
    assert missing.status_code == 404 and "error" in missing.get_json()
    bad = web.api("POST", "/api/v1/quotas", json={"path": "/team", "bytes_limit": -1})
    assert bad.status_code == 400 and "bytes_limit" in bad.get_json()["fields"]
    assert web.api("PATCH", "/api/v1/quotas/999", json={"files_limit": 1}).status_code == 404
    gone = web.api("DELETE", f"/api/v1/quotas/{quota['id']}")
    assert gone.get_json() == {"deleted": quota["id"]}
    assert web.get("/api/v1/quotas").get_json() == []


def test_quotas_on_the_exports_page_in_the_browser(server, page, live):  # noqa: F811
    ns = live.namespace  # the daemon's side, with the data path
    team = mkdirs(ns, "/team")
    f = ns.create(ROOT, team.ino, "data")
    ns.write(f.ino, 0, b"x" * 300_000, stable=True)

    page.goto(server + "/exports")
    page.fill("input[name=username]", ADMIN)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(server + "/exports")
    assert "No quotas." in page.inner_text("#quotas")

    form = "#quota-form"
    page.fill(f"{form} input[name=path]", "/team")
    page.fill(f"{form} input[name=bytes_limit]", "lots")
    page.click(f"{form} button[type=submit]")
    page.wait_for_load_state()
    assert "expected a size" in page.inner_text(".flash")
    page.fill(f"{form} input[name=path]", "/team")
    page.fill(f"{form} input[name=bytes_limit]", "512KiB")
    page.fill(f"{form} input[name=soft_bytes]", "256KiB")
    page.fill(f"{form} input[name=files_limit]", "10")
    page.click(f"{form} button[type=submit]")
    page.wait_for_selector("#quota-table tr[data-path='/team']")
    assert "quota on /team saved" in page.inner_text(".flash")
    row = page.inner_text("#quota-table tr[data-path='/team']")
    assert "293.0 KiB" in row and "512.0 KiB" in row and "256.0 KiB" in row, row

    # the daemon's next write sees the quota the web UI set
    with pytest.raises(errors.QuotaExceeded):
        ns.write(f.ino, 300_000, b"y" * 300_000)
    assert ns.getattr(f.ino).size == 300_000

    page.click("#quota-table tr[data-path='/team'] button:has-text('Remove')")
    page.wait_for_load_state()
    assert "No quotas." in page.inner_text("#quotas")
    assert QuotaService(ns).list() == []
    ns.write(f.ino, 300_000, b"y" * 300_000, stable=True)
