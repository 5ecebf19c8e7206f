"""SMB in the web UI and the API: shares and users through engine.admin.smb, passwords in Samba's
real passdb under the appliance's data folder (pdbedit; no smbd needed), token scopes, events naming
the admin, confirmations before deletes, and smbd's status when SMB is not enabled."""

from __future__ import annotations

from sqlalchemy import select

from appliance.smb.samba import SambaLayout, SambaPassdb
from engine.admin import accounts, events
from engine.admin import smb as smb_service
from tests.webui.conftest import ADMIN


def _token(catalog, scope: str) -> dict:
    uid = catalog.read(lambda c: c.execute(select(accounts.USERS.c.id)).scalar())
    return {"Authorization": f"Bearer {accounts.create_token(catalog, uid, scope, scope=scope)}"}


def _passdb_names(config) -> list[str]:
    return SambaPassdb(SambaLayout.for_data_dir(config.data_dir)).names()


def test_api_scopes_users_and_shares(app, appliance):
    config, catalog = appliance
    client = app.test_client()
    reader, operator, admin = (_token(catalog, s) for s in accounts.SCOPES)
    user = {"name": "alice", "password": "s3cret pw"}
    share = {"name": "data", "path": "/", "users": "alice", "clients": "10.0.0.0/8"}
    for headers in (reader, operator):
        for method, url, body in (
            ("POST", "/api/v1/smb/users", user),
            ("POST", "/api/v1/smb/shares", share),
            ("PUT", "/api/v1/smb/users/alice/password", {"password": "x"}),
            ("DELETE", "/api/v1/smb/users/alice", None),
        ):
            response = client.open(url, method=method, json=body, headers=headers)
            assert response.status_code == 403, (url, headers, response.get_json())
    assert smb_service.list_users(catalog) == [] and _passdb_names(config) == []

    created = client.post("/api/v1/smb/users", json=user, headers=admin)
    assert created.status_code == 201, created.get_json()
    assert created.get_json() == {"id": 1, "name": "alice", "uid": 20000, "gid": 20000}
    assert _passdb_names(config) == ["alice"]  # the password went to Samba's passdb
    assert "password" not in str(client.get("/api/v1/smb/users", headers=reader).get_json())
    again = client.post("/api/v1/smb/users", json=user, headers=admin)
    assert again.status_code == 409 and "exists" in again.get_json()["error"]
    bad = client.post("/api/v1/smb/users", json={"name": "Root!", "password": ""}, headers=admin)
    assert bad.status_code == 400 and set(bad.get_json()["fields"]) == {"name", "password"}

    made = client.post("/api/v1/smb/shares", json=share, headers=admin)
    assert made.status_code == 201, made.get_json()
    share_id = made.get_json()["id"]
    assert made.get_json()["access"] == "rw" and made.get_json()["guest"] is False
    listed = client.get("/api/v1/smb/shares", headers=reader)
    assert listed.status_code == 200 and [s["name"] for s in listed.get_json()] == ["data"]
    for body, field in (
        ({"path": "/no/such"}, "path"),
        ({"clients": "300.1.1.1"}, "clients"),
        ({"users": "Bad Name"}, "users"),
        ({"name": "homes"}, "name"),
    ):
        response = client.patch(f"/api/v1/smb/shares/{share_id}", json=body, headers=admin)
        assert response.status_code == 400 and field in response.get_json()["error"], body
    changed = client.patch(
        f"/api/v1/smb/shares/{share_id}",
        json={"access": "ro", "case_insensitive": True},
        headers=admin,
    )
    assert changed.status_code == 200
    assert changed.get_json()["access"] == "ro" and changed.get_json()["case_insensitive"]

    put = client.put("/api/v1/smb/users/alice/password", json={"password": "new pw"}, headers=admin)
    assert put.status_code == 200 and put.get_json()["name"] == "alice"
    missing = client.put(
        "/api/v1/smb/users/nobody2/password", json={"password": "pw"}, headers=admin
    )
    assert missing.status_code == 404
    assert client.delete(f"/api/v1/smb/shares/{share_id}", headers=admin).get_json() == {
        "deleted": share_id
    }
    assert client.delete("/api/v1/smb/users/alice", headers=admin).get_json() == {
        "deleted": "alice"
    }
    assert _passdb_names(config) == []
    kinds = [e.kind for e in events.recent(catalog, 20) if e.kind.startswith("smb.")]
    assert kinds == [
        "smb.user.delete",
        "smb.share.delete",
        "smb.user.password",
        "smb.share.update",
        "smb.share.create",
        "smb.user.create",
    ]
    assert {e.actor for e in events.recent(catalog, 20) if e.kind.startswith("smb.")} == {"admin"}

    doc = client.get("/api/v1/openapi.json").get_json()
    assert doc["paths"]["/api/v1/smb/shares"]["get"]["x-required-scope"] == "read-only"
    assert doc["paths"]["/api/v1/smb/users"]["post"]["x-required-scope"] == "admin"
    params = doc["paths"]["/api/v1/smb/users/{name}/password"]["put"]["parameters"]
    assert params == [
        {
            "name": "name",
            "in": "path",
            "required": True,
            "description": "name",
            "schema": {"type": "string"},
        }
    ]


def test_status_and_metrics_when_smb_is_not_enabled(app, appliance):
    _, catalog = appliance
    client = app.test_client()
    reader = _token(catalog, "read-only")
    status = client.get("/api/v1/smb/status", headers=reader).get_json()
    assert status["enabled"] is False and status["running"] is False
    assert status["sessions"] == [] and status["shares"] == 0
    assert "shingle_smb" not in client.get("/metrics").get_data(as_text=True)


def test_pages_confirm_deletes_and_name_the_admin(web, appliance):
    config, catalog = appliance
    page = web.get("/smb")
    assert page.status_code == 200 and b"SMB is not enabled" in page.data
    refused = web.post("/smb/users", {"name": "carol", "password": ""})
    assert refused.status_code == 400 and b"password" in refused.data
    assert web.post("/smb/users", {"name": "carol", "password": "pw one"}).status_code == 302
    assert _passdb_names(config) == ["carol"]
    assert web.post("/smb/users/carol/password", {"password": "pw two"}).status_code == 302
    assert (
        web.post(
            "/smb/shares",
            {
                "name": "Team",
                "path": "/",
                "access": "rw",
                "clients": "0.0.0.0/0",
                "users": "carol",
                "case_insensitive": "on",
            },
        ).status_code
        == 302
    )
    share = smb_service.get_share(catalog, "Team")
    assert share.users == "carol" and share.case_insensitive and not share.guest
    edit = web.post(
        f"/smb/shares/{share.id}",
        {"name": "Team", "path": "/", "access": "ro", "clients": "0.0.0.0/0", "users": "carol"},
    )
    assert edit.status_code == 302
    assert smb_service.get_share(catalog, share.id).read_only
    assert not smb_service.get_share(catalog, share.id).case_insensitive  # unticked box

    asked = web.post(f"/smb/shares/{share.id}/delete")
    assert asked.status_code == 200 and b"Delete SMB share Team?" in asked.data
    assert smb_service.list_shares(catalog)  # nothing happened yet
    assert web.post(f"/smb/shares/{share.id}/delete", {"confirm": "yes"}).status_code == 302
    assert smb_service.list_shares(catalog) == []
    asked = web.post("/smb/users/carol/delete")
    assert b"Remove SMB user carol?" in asked.data and _passdb_names(config) == ["carol"]
    assert web.post("/smb/users/carol/delete", {"confirm": "yes"}).status_code == 302
    assert smb_service.list_users(catalog) == [] and _passdb_names(config) == []
    assert web.post("/smb/users/carol/delete", {"confirm": "yes"}).status_code == 404
    smb_events = [e for e in events.recent(catalog, 20) if e.kind.startswith("smb.")]
    assert len(smb_events) == 6 and {e.actor for e in smb_events} == {ADMIN}
