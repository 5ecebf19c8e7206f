"""Sign-in security through the Flask app: local redirects only, sessions that end on the server,
a back-off that never locks the right password out, token scopes and expiry, secret file modes.
tests/webui/test_serve.py checks the same against gunicorn with a real HTTP client."""

from __future__ import annotations

import re
import time

import pytest
from sqlalchemy import select

from engine.admin import accounts, events
from engine.catalog.models import ApiToken, LoginThrottle
from tests.webui.conftest import ADMIN, PASSWORD, Browserish, csrf_of

OPEN_REDIRECTS = (
    "//evil.example/x",
    "/\t/evil.example",
    "/\n/evil.example",
    "/\\evil.example",
    "\\\\evil.example",
    "https://evil.example/",
    "/\x00/evil.example",
    "javascript:alert(1)",
    "evil.example",
    " //evil.example",
    "/\r\n/evil.example",
)


def from_address(app, address: str) -> Browserish:
    client = app.test_client()
    client.environ_base["REMOTE_ADDR"] = address
    return Browserish(client)


@pytest.mark.parametrize("target", OPEN_REDIRECTS)
def test_next_must_be_a_path_of_this_site(app, target):
    from urllib.parse import quote

    browser = Browserish(app.test_client())
    browser.csrf = csrf_of(browser.get("/login").get_data(as_text=True))
    response = browser.client.post(
        "/login?next=" + quote(target, safe=""),
        data={"username": ADMIN, "password": PASSWORD, "csrf_token": browser.csrf},
    )
    assert response.status_code == 302 and response.headers["Location"] == "/", target


def test_next_keeps_a_local_path(app):
    browser = Browserish(app.test_client())
    browser.csrf = csrf_of(browser.get("/login").get_data(as_text=True))
    response = browser.client.post(
        "/login?next=%2Fdrives%3Fstate%3Dfailed",
        data={"username": ADMIN, "password": PASSWORD, "csrf_token": browser.csrf},
    )
    assert response.headers["Location"] == "/drives?state=failed"


def test_a_copied_cookie_stops_working_at_logout(app):
    browser = Browserish(app.test_client())
    assert browser.login().status_code == 302
    stolen = browser.client.get_cookie("shingle_session").value
    assert browser.post("/logout").status_code == 302
    thief = app.test_client()
    thief.set_cookie("shingle_session", stolen)
    assert thief.get("/drives").status_code == 302  # the session row is gone: back to sign-in
    assert thief.get("/api/v1/drives").status_code == 401


def test_password_change_and_admin_removal_end_sessions(web, app, appliance):
    _, catalog = appliance
    accounts.create_admin(catalog, "alice", "alice's long password", actor=ADMIN)
    alice = Browserish(app.test_client())
    assert alice.login("alice", "alice's long password").status_code == 302
    stolen = alice.client.get_cookie("shingle_session").value
    response = web.post("/settings/admins/admin/delete")
    assert response.status_code == 400 and b"cannot remove yourself" in response.data
    assert web.post("/settings/admins/alice/delete").status_code == 302
    assert alice.get("/drives").status_code == 302
    thief = app.test_client()
    thief.set_cookie("shingle_session", stolen)
    assert thief.get("/drives").status_code == 302
    assert events.recent(catalog, 1, kind_prefix="admin.user.delete")[0].actor == ADMIN
    with pytest.raises(Exception, match="last admin"):
        accounts.delete_admin(catalog, ADMIN)


def test_wrong_passwords_back_off_but_never_lock_the_right_one_out(app, appliance):
    _, catalog = appliance
    attacker, owner = from_address(app, "192.0.2.66"), from_address(app, "192.0.2.10")
    for _ in range(accounts.ACCOUNT_FROM_ADDRESS_FREE):
        response = attacker.login(password="wrong password!")
        assert response.status_code == 401 and b"wrong user name or password" in response.data
    response = attacker.login(password="wrong password!")  # past the allowance: a back-off starts
    assert response.status_code == 429 and response.headers["Retry-After"] == "1"
    response = attacker.login()  # even the right password waits for the back-off ...
    assert response.status_code == 429 and b"try again in 1 s" in response.data
    assert owner.login().status_code == 302  # ... from that address only
    time.sleep(1.1)
    assert attacker.login().status_code == 302  # once it has passed, the right password works
    assert events.recent(catalog, 1, kind_prefix="auth.throttled")[0].severity == "warning"
    failed = events.recent(catalog, 10, kind_prefix="auth.login.failed")
    assert len(failed) == 6 and all("failed login as 'admin'" in e.message for e in failed)


def test_back_off_doubles_per_address_across_names(app, appliance, monkeypatch):
    _, catalog = appliance
    monkeypatch.setitem(accounts.THROTTLES, "address", (3, 2.0, 8.0))
    sprayer = from_address(app, "198.51.100.7")
    for name in ("nobody1", "nobody2", "nobody3"):  # unknown names: only the address counts up
        assert sprayer.login(name, "whatever-long").status_code == 401
    assert sprayer.login("nobody4", "whatever-long").headers["Retry-After"] == "2"
    assert sprayer.login().status_code == 429
    assert from_address(app, "198.51.100.8").login().status_code == 302
    throttle = LoginThrottle.__table__
    rows = catalog.read(lambda c: {r.key: r for r in c.execute(select(throttle))})
    assert rows["address 198.51.100.7"].failures == 4
    # Old failures are forgotten: a flood of addresses does not grow the table without bound.
    old = time.time_ns() - (accounts.THROTTLE_FORGET_S + 60) * 10**9
    catalog.run(
        lambda c: c.execute(throttle.update().values(last_failure_ns=old, blocked_until_ns=0))
    )
    accounts.login_failed(catalog, "someone", "203.0.113.1")
    keys = catalog.read(lambda c: set(c.execute(select(throttle.c.key)).scalars()))
    assert keys == {"address 203.0.113.1", "account someone", "account someone from 203.0.113.1"}


def token_for(catalog, scope: str, **kwargs) -> dict:
    uid = catalog.read(lambda c: c.execute(select(accounts.USERS.c.id)).scalar())
    token = accounts.create_token(catalog, uid, scope, scope=scope, **kwargs)
    return {"Authorization": f"Bearer {token}"}


def test_token_scopes_are_enforced_on_every_api_route(app, appliance):
    _, catalog = appliance
    client = app.test_client()
    reader, operator, admin = (token_for(catalog, s) for s in accounts.SCOPES)
    export = {"name": "/open", "squash": "no_root_squash"}
    assert client.get("/api/v1/drives", headers=reader).status_code == 200
    for method, url, body in (
        ("POST", "/api/v1/jobs", {"kind": "scrub"}),
        ("POST", "/api/v1/exports", export),
        ("POST", "/api/v1/tokens", {"name": "x"}),
        ("DELETE", "/api/v1/exports/1", None),
        ("POST", "/api/v1/drives/1/actions", {"action": "drain"}),
    ):
        response = client.open(url, method=method, json=body, headers=reader)
        assert response.status_code == 403 and "read-only" in response.get_json()["error"], url
    assert client.post("/api/v1/jobs", json={"kind": "scrub"}, headers=operator).status_code == 202
    assert client.post("/api/v1/retention/run", json={}, headers=operator).status_code == 202
    assert (
        client.post(
            "/api/v1/drives/4/actions", json={"action": "mark_failed"}, headers=operator
        ).status_code
        == 200
    )
    for method, url, body in (
        ("POST", "/api/v1/exports", export),
        ("POST", "/api/v1/tokens", {"name": "x"}),
        ("GET", "/api/v1/tokens", None),
        ("PATCH", "/api/v1/tiers/thresholds", {"promote_reads": 2}),
        ("POST", "/api/v1/retention/rules", {"pattern": "/x/*", "keep": 1}),
    ):
        response = client.open(url, method=method, json=body, headers=operator)
        assert response.status_code == 403, url
        assert (
            "scope is operator" in response.get_json()["error"]
            and "needs a token of scope admin" in response.get_json()["error"]
        )
    created = client.post("/api/v1/exports", json=export, headers=admin)
    assert created.status_code == 201 and created.get_json()["squash"] == "no_root_squash"
    minted = client.post(
        "/api/v1/tokens", json={"name": "ci", "scope": "operator"}, headers=admin
    ).get_json()
    assert minted["scope"] == "operator" and minted["expires_days"] == 90
    listed = {t["name"]: t for t in client.get("/api/v1/tokens", headers=admin).get_json()}
    assert listed["ci"]["scope"] == "operator" and listed["read-only"]["scope"] == "read-only"
    assert listed["ci"]["expires_ns"] > time.time_ns() + 89 * 86400 * 10**9
    doc = client.get("/api/v1/openapi.json").get_json()
    assert doc["paths"]["/api/v1/exports"]["post"]["x-required-scope"] == "admin"
    assert doc["paths"]["/api/v1/jobs"]["post"]["x-required-scope"] == "operator"
    assert doc["paths"]["/api/v1/drives"]["get"]["x-required-scope"] == "read-only"


def test_expired_tokens_are_refused_and_shown_so(web, app, appliance):
    _, catalog = appliance
    headers = token_for(catalog, "admin", expires_s=3600)
    client = app.test_client()
    assert client.get("/api/v1/drives", headers=headers).status_code == 200
    catalog.run(
        lambda c: c.execute(ApiToken.__table__.update().values(expires_ns=time.time_ns() - 1))
    )
    response = client.get("/api/v1/drives", headers=headers)
    assert response.status_code == 401 and "expired" in response.get_json()["error"]
    html = web.get("/settings").get_data(as_text=True)
    assert "(expired)" in html and '<td class="token-scope">admin</td>' in html
    # The token page makes a token of the chosen scope and lifetime.
    html = web.post(
        "/settings/tokens", {"name": "grafana", "scope": "read-only", "expires_days": "0"}
    ).get_data(as_text=True)
    token = re.search(r'id="new-token">(shg_[^<]+)<', html).group(1)
    bearer = {"Authorization": f"Bearer {token}"}
    assert client.get("/api/v1/drives", headers=bearer).status_code == 200
    assert client.post("/api/v1/jobs", json={"kind": "scrub"}, headers=bearer).status_code == 403
    row = catalog.read(
        lambda c: c.execute(
            select(ApiToken.__table__).where(ApiToken.__table__.c.name == "grafana")
        ).first()
    )
    assert row.scope == "read-only" and row.expires_ns is None
    response = web.post("/settings/tokens", {"name": "x", "scope": "root"})
    assert (
        response.status_code == 400
        and b"expected one of read-only, operator, admin" in response.data
    )
