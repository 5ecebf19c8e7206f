"""The JSON API: tokens, 401 without credentials, JSON errors, schema-driven
validation, the OpenAPI document."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from engine.admin import accounts, events, jobs
from engine.catalog.models import RetentionPolicy
from tests.webui.conftest import ADMIN
from tests.webui.helpers import exists, make_checkpoints


@pytest.fixture
def token(appliance):
    _, catalog = appliance
    uid = catalog.read(lambda c: c.execute(select(accounts.USERS.c.id)).scalar())
    return accounts.create_token(catalog, uid, "tests", scope="admin", actor=ADMIN)


@pytest.fixture
def api(app, token):
    client = app.test_client()

    def call(method, url, json=None, **kwargs):
        return client.open(
            url, method=method, json=json, headers={"Authorization": f"Bearer {token}"}, **kwargs
        )

    return call


def test_state_changing_calls_without_credentials_get_401(app):
    client = app.test_client()
    for method, url in (
        ("POST", "/api/v1/retention/rules"),
        ("PATCH", "/api/v1/retention/rules/1"),
        ("DELETE", "/api/v1/exports/1"),
        ("POST", "/api/v1/drives/1/actions"),
        ("POST", "/api/v1/retention/run"),
        ("POST", "/api/v1/tokens"),
    ):
        response = client.open(url, method=method, json={"x": 1})
        assert (
            response.status_code == 401
            and response.is_json
            and "authentication required" in response.get_json()["error"]
        )
    response = client.get("/api/v1/drives", headers={"Authorization": "Bearer shg_not-a-token"})
    assert response.status_code == 401 and "not recognised" in response.get_json()["error"]


def test_retention_through_the_api(live):
    catalog, ns = live.catalog, live.namespace
    uid = catalog.read(lambda c: c.execute(select(accounts.USERS.c.id)).scalar())
    token = accounts.create_token(catalog, uid, "ci", scope="admin", actor=ADMIN)
    headers = {"Authorization": f"Bearer {token}"}
    client = live.app.test_client()

    def api(method, url, json=None):
        return client.open(url, method=method, json=json, headers=headers)

    make_checkpoints(ns, "/checkpoints/run-a", range(10, 15), size=20_000)
    response = api(
        "POST", "/api/v1/retention/rules", {"pattern": "/checkpoints/*/step-*", "keep": 3}
    )
    assert response.status_code == 201
    rule = response.get_json()
    assert (rule["keep"], rule["action"], rule["order_by"], rule["enabled"]) == (
        3,
        "delete",
        "mtime",
        True,
    )
    preview = api("GET", f"/api/v1/retention/preview?rule_id={rule['id']}").get_json()
    assert [p["path"] for p in preview] == [
        "/checkpoints/run-a/step-10",
        "/checkpoints/run-a/step-11",
    ]
    assert all(p["action"] == "delete" and "keeps 3" in p["reason"] for p in preview)
    response = api("POST", "/api/v1/retention/run", {"rule_id": rule["id"]})
    assert response.status_code == 202 and response.get_json()["kind"] == "retention"
    jobs.wait(catalog, response.get_json()["id"], timeout_s=30, poll_s=0.05)
    job = api("GET", f"/api/v1/jobs/{response.get_json()['id']}").get_json()
    assert job["state"] == "done" and [r["outcome"] for r in job["result"]] == ["done", "done"]
    assert not exists(ns, "/checkpoints/run-a/step-10") and exists(ns, "/checkpoints/run-a/step-12")
    patched = api(
        "PATCH", f"/api/v1/retention/rules/{rule['id']}", {"keep": 5, "enabled": False}
    ).get_json()
    assert (patched["keep"], patched["enabled"]) == (5, False)
    assert api("GET", "/api/v1/retention/rules").get_json()[0]["keep"] == 5
    assert api("DELETE", f"/api/v1/retention/rules/{rule['id']}").get_json() == {
        "deleted": rule["id"]
    }
    assert api("GET", "/api/v1/retention/rules").get_json() == []
    assert {e.actor for e in events.recent(catalog, 20, kind_prefix="retention.")} == {ADMIN}
    assert api("POST", "/api/v1/jobs", {"kind": "wipe"}).status_code == 400
    assert api("GET", "/api/v1/jobs").get_json()[0]["kind"] == "retention"


@pytest.mark.parametrize(
    "body, field, fragment",
    [
        ({"pattern": "/c/*", "keep": 0}, "keep", "keep = 0: expected at least 1"),
        ({"pattern": "/c/*", "keep": -1}, "keep", "keep = -1: expected at least 1"),
        ({"pattern": "/c/*", "keep": "3"}, "keep", "keep = '3': expected a whole number"),
        ({"pattern": "/c/*", "keep": True}, "keep", "keep = True: expected a whole number"),
        ({"pattern": "/c/../d", "keep": 3}, "pattern", "'..' components are not allowed"),
        ({"pattern": "", "keep": 3}, "pattern", "pattern = '': expected a non-empty value"),
        ({"keep": 3}, "pattern", "pattern is missing"),
        (
            {"pattern": "/c/*", "keep": 3, "action": "shred"},
            "action",
            "expected one of delete, cold, trash",
        ),
        ({"pattern": "/c/*", "keep": 3, "colour": "red"}, "colour", "'colour' is unknown"),
    ],
)
def test_validation_errors_are_json_with_the_field(api, appliance, body, field, fragment):
    _, catalog = appliance
    response = api("POST", "/api/v1/retention/rules", body)
    assert response.status_code == 400 and response.is_json
    data = response.get_json()
    assert fragment in data["error"] and fragment in data["fields"][field]
    assert catalog.read(lambda c: c.execute(select(RetentionPolicy.__table__)).all()) == []


def test_errors_are_json_with_a_message(api):
    response = api(
        "POST", "/api/v1/retention/rules", None, data="not json", content_type="text/plain"
    )
    assert response.status_code == 400 and "expected a JSON object" in response.get_json()["error"]
    response = api("PATCH", "/api/v1/retention/rules/1", {})
    assert response.status_code == 400 and "no fields given" in response.get_json()["error"]
    response = api("GET", "/api/v1/retention/rules/42")
    assert response.status_code == 404 and response.get_json() == {
        "error": "no retention rule with id 42"
    }
    response = api("GET", "/api/v1/nothing-here")
    assert response.status_code == 404 and "no such API endpoint" in response.get_json()["error"]
    response = api("PUT", "/api/v1/drives")
    assert response.status_code == 405 and "not allowed" in response.get_json()["error"]
    response = api("POST", "/api/v1/drives/1/actions", {"action": "rebuild"})
    assert response.status_code == 400 and "is online" in response.get_json()["error"]
    response = api("GET", "/api/v1/events?limit=5000")
    assert (
        response.status_code == 400
        and "limit = 5000: expected at most 1000" in response.get_json()["error"]
    )


def test_drives_exports_tiers_events_tokens(api, appliance):
    _, catalog = appliance
    drives = api("GET", "/api/v1/drives").get_json()
    assert [d["smart"]["overall"] for d in drives] == [
        "PASSED",
        "PASSED",
        "PASSED",
        "no SMART data",
    ]
    assert (
        drives[0]["smart"]["reallocated_sectors"] == 8 and drives[2]["smart"]["protocol"] == "NVMe"
    )
    one = api("GET", "/api/v1/drives/1").get_json()
    assert one["bands"]["full"] == {"warm": 1} and one["bands"]["garbage"] == {"cold": 1}
    assert one["bands"]["empty"] == {"-": 12}
    assert api("POST", "/api/v1/drives/4/actions", {"action": "mark_failed"}).status_code == 200
    assert api("GET", "/api/v1/drives/4").get_json()["state"] == "failed"
    created = api("POST", "/api/v1/exports", {"name": "/export", "clients": "10.1.0.0/16"})
    assert created.status_code == 201 and created.get_json()["squash"] == "root_squash"
    export_id = created.get_json()["id"]
    assert (
        api("PATCH", f"/api/v1/exports/{export_id}", {"access": "ro"}).get_json()["access"] == "ro"
    )
    bad = api("PATCH", f"/api/v1/exports/{export_id}", {"clients": "not-an-ip"})
    assert bad.status_code == 400 and "expected an IP address or CIDR" in bad.get_json()["error"]
    assert api("DELETE", f"/api/v1/exports/{export_id}").status_code == 200
    assert api("GET", f"/api/v1/exports/{export_id}").status_code == 404
    tiers = api("PATCH", "/api/v1/tiers/thresholds", {"promote_reads": 7}).get_json()
    assert tiers["promote_reads"] == 7 and tiers["warm_to_cold_after_s"] == 30 * 86400
    overview = api("GET", "/api/v1/tiers").get_json()
    assert {c["name"] for c in overview["band_classes"]} == {"hot", "warm", "cold"}
    listed = api("GET", "/api/v1/events?kind=export.&limit=2").get_json()
    assert [e["kind"] for e in listed] == ["export.delete", "export.update"] and listed[0][
        "actor"
    ] == ADMIN
    new = api("POST", "/api/v1/tokens", {"name": "ci"}).get_json()
    assert new["token"].startswith("shg_")
    assert {t["name"] for t in api("GET", "/api/v1/tokens").get_json()} == {"tests", "ci"}
    status = api("GET", "/api/v1/status").get_json()
    assert (
        status["drive_states"] == {"online": 3, "failed": 1}
        and status["tiers"]["warm"]["live_bytes"] > 0
    )


def test_openapi_document_declares_every_endpoint_with_bounds(app):
    doc = app.test_client().get("/api/v1/openapi.json").get_json()
    assert doc["openapi"].startswith("3.") and "bearerAuth" in doc["components"]["securitySchemes"]
    api_rules = {
        (r.rule, m)
        for r in app.url_map.iter_rules()
        if r.rule.startswith("/api/v1/") and r.rule != "/api/v1/openapi.json"
        for m in r.methods - {"HEAD", "OPTIONS"}
    }
    import re

    def rule_of(path: str, op: dict) -> str:  # {id} -> <int:id>, {name} (a string) -> <name>
        kinds = {
            p["name"]: p["schema"]["type"] for p in op.get("parameters", ()) if p["in"] == "path"
        }
        return re.sub(
            r"\{(\w+)\}",
            lambda m: (
                f"<int:{m.group(1)}>" if kinds[m.group(1)] == "integer" else f"<{m.group(1)}>"
            ),
            path,
        )

    documented = {
        (rule_of(path, op), method.upper())
        for path, ops in doc["paths"].items()
        for method, op in ops.items()
    }
    assert documented == api_rules
    rule = doc["paths"]["/api/v1/retention/rules"]["post"]["requestBody"]["content"][
        "application/json"
    ]["schema"]
    assert (
        rule["properties"]["keep"]["minimum"] == 1
        and rule["properties"]["keep"]["maximum"] == 1_000_000
    )
    assert rule["required"] == ["pattern", "keep"]
    for path, ops in doc["paths"].items():
        for op in ops.values():
            schema = (
                op.get("requestBody", {})
                .get("content", {})
                .get("application/json", {})
                .get("schema")
            )
            for name, prop in (schema or {}).get("properties", {}).items():
                assert prop["description"], (path, name)
                bounded = {"minimum", "maximum", "maxLength", "enum"} & set(prop) or prop[
                    "type"
                ] == "boolean"
                assert bounded, f"{path} {name} has no bounds"
    patch = doc["paths"]["/api/v1/retention/rules/{rule_id}"]["patch"]["requestBody"]["content"]
    assert "required" not in patch["application/json"]["schema"]


def test_session_api_calls_need_the_csrf_header(web):
    response = web.client.post("/api/v1/exports", json={"name": "/x"})
    assert response.status_code == 403 and "CSRF" in response.get_json()["error"]
    token = web.get("/api/v1/csrf").get_json()["csrf_token"]
    response = web.client.post(
        "/api/v1/exports", json={"name": "/x"}, headers={"X-CSRF-Token": token}
    )
    assert response.status_code == 201
