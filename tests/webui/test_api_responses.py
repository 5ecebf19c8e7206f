"""The OpenAPI document describes every response, and real responses match what it says."""

from __future__ import annotations

TYPES = {
    "object": dict,
    "array": list,
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "null": type(None),
}


def check(value, schema: dict, components: dict, where: str) -> None:
    """A small JSON Schema check: types, required fields, no undeclared fields."""
    if "$ref" in schema:
        schema = components[schema["$ref"].rsplit("/", 1)[1]]
    kinds = schema.get("type")
    if kinds is not None:
        kinds = kinds if isinstance(kinds, list) else [kinds]
        assert any(
            isinstance(value, TYPES[k])
            and not (k in ("integer", "number") and isinstance(value, bool))
            for k in kinds
        ), f"{where}: {value!r} is not {kinds}"
    if isinstance(value, dict) and "properties" in schema:
        missing = set(schema.get("required", ())) - set(value)
        assert not missing, f"{where}: missing {missing}"
        undeclared = set(value) - set(schema["properties"])
        assert not undeclared, f"{where}: undeclared fields {undeclared}"
        for key, item in value.items():
            check(item, schema["properties"][key], components, f"{where}.{key}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            check(item, schema["items"], components, f"{where}[{i}]")


def test_every_endpoint_describes_its_response(app):
    doc = app.test_client().get("/api/v1/openapi.json").get_json()
    components = doc["components"]["schemas"]
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            success = [code for code in op["responses"] if code.startswith("2")]
            assert len(success) == 1, (path, method)
            response = op["responses"][success[0]]
            described = response["description"]
            assert not described.startswith(("success", "undescribed")), (path, method)
            schema = response["content"]["application/json"]["schema"]
            assert schema, f"{method} {path}: no response schema"
            name = (schema.get("items") or schema).get("$ref", "").rsplit("/", 1)[-1]
            assert name in components, (path, method, schema)
            for field in components[name].get("properties", {}).values():
                assert field.get("description") or "$ref" in field, (name, field)


def test_real_responses_match_their_schemas(web, appliance, app):
    from engine.admin import exports, jobs
    from engine.namespace import ROOT

    _, catalog = appliance
    exports.ensure_default(catalog)
    ns = app.extensions["shingle"].namespace
    ns.mkdir(ROOT, ns.root_ino, "ds")  # a dataset for the snapshot routes
    jobs.submit(catalog, "scrub", {}, actor="test")
    from engine.admin.alerts import AlertService, Finding

    [raised] = AlertService(catalog).apply(
        "drive_failed", [Finding("drive:1", "critical", "drive 1")]
    )
    alert_id = raised.alert.id
    from engine.admin.trash import Trash
    from tests.webui.helpers import mkdirs
    from tests.webui.test_nfs_clients_api import record_client

    ns = web.client.application.extensions["shingle"].namespace
    mkdirs(ns, "/old/run-1")
    trashed = Trash(ns, catalog).move_to_trash("/old/run-1", actor="test")
    made = {
        ("post", "/api/v1/trash/{entry_id}/restore"): web.api(
            "POST", f"/api/v1/trash/{trashed.id}/restore"
        ),
        ("post", "/api/v1/trash/purge"): web.api("POST", "/api/v1/trash/purge", json={}),
        ("post", "/api/v1/alerts/{alert_id}/ack"): web.api(
            "POST", f"/api/v1/alerts/{alert_id}/ack"
        ),
        ("post", "/api/v1/drives"): web.api("POST", "/api/v1/drives", json={"path": "/srv/d-new"}),
        ("post", "/api/v1/drives/{drive_id}/replace"): web.api(
            "POST", "/api/v1/drives/1/replace", json={"path": "/srv/d-new2", "preallocate": True}
        ),
        ("post", "/api/v1/retention/rules"): web.api(
            "POST", "/api/v1/retention/rules", json={"pattern": "/x/*", "keep": 2}
        ),
        ("post", "/api/v1/tokens"): web.api("POST", "/api/v1/tokens", json={"name": "ci"}),
        ("post", "/api/v1/jobs"): web.api("POST", "/api/v1/jobs", json={"kind": "scrub"}),
        ("post", "/api/v1/snapshots"): web.api(
            "POST", "/api/v1/snapshots", json={"path": "/ds", "name": "s1"}
        ),
        ("post", "/api/v1/snapshot-schedules"): web.api(
            "POST",
            "/api/v1/snapshot-schedules",
            json={"path": "/ds", "frequency": "daily", "at": "03:00", "keep_last": 3},
        ),
        ("post", "/api/v1/snapshots/archive"): web.api(
            "POST", "/api/v1/snapshots/archive", json={"path": "/ds", "name": "s1"}
        ),
        ("post", "/api/v1/snapshot-schedules/run"): web.api(
            "POST", "/api/v1/snapshot-schedules/run", json={}
        ),
        # a real Samba passdb under the appliance's data folder (pdbedit; no smbd needed)
        ("post", "/api/v1/smb/users"): web.api(
            "POST", "/api/v1/smb/users", json={"name": "alice", "password": "pw-1"}
        ),
        ("post", "/api/v1/smb/shares"): web.api(
            "POST", "/api/v1/smb/shares", json={"name": "data", "users": "alice"}
        ),
        ("post", "/api/v1/quotas"): web.api(
            "POST", "/api/v1/quotas", json={"path": "/", "bytes_limit": 1 << 30}
        ),
        ("post", "/api/v1/quotas/recount"): web.api("POST", "/api/v1/quotas/recount"),
    }
    mkdirs(ns, "/old/run-2")  # run-1 was restored: GET /trash lists this one
    Trash(ns, catalog).move_to_trash("/old/run-2", actor="test")
    # an NFSv4 client and its delegation, as the NFS server records them
    record_client(catalog, 0xAB01, b"host", [1, 0, ""])
    catalog.set_setting(
        f"nfs_delegation_{ns.root_ino}_{'00' * 12}",
        '{"head": "", "clientid": 43777, "owner": "686f7374", "type": "read", "granted_ns": 1}',
    )
    quota_id = made[("post", "/api/v1/quotas")].get_json()["id"]
    made[("patch", "/api/v1/quotas/{quota_id}")] = web.api(
        "PATCH", f"/api/v1/quotas/{quota_id}", json={"soft_files": 10}
    )
    share_id = made[("post", "/api/v1/smb/shares")].get_json()["id"]
    made[("put", "/api/v1/smb/users/{name}/password")] = web.api(
        "PUT", "/api/v1/smb/users/alice/password", json={"password": "pw-2"}
    )
    made[("patch", "/api/v1/smb/shares/{share_id}")] = web.api(
        "PATCH", f"/api/v1/smb/shares/{share_id}", json={"access": "ro"}
    )
    schedule_id = made[("post", "/api/v1/snapshot-schedules")].get_json()["id"]
    made[("patch", "/api/v1/snapshot-schedules/{schedule_id}")] = web.api(
        "PATCH", f"/api/v1/snapshot-schedules/{schedule_id}", json={"keep_for": "7d"}
    )
    queries = {"/api/v1/snapshots/preview": "?path=/ds&name=s1&action=rollback"}
    doc = web.get("/api/v1/openapi.json").get_json()
    components = doc["components"]["schemas"]
    rule_id = made[("post", "/api/v1/retention/rules")].get_json()["id"]
    export_id = exports.list_exports(catalog)[0].id
    ids = {
        "drive_id": 1,
        "rule_id": rule_id,
        "job_id": 1,
        "export_id": export_id,
        "share_id": share_id,
        "name": "alice",
        "host": "local",
        "alert_id": alert_id,
        "entry_id": trashed.id,
        "schedule_id": schedule_id,
        "quota_id": quota_id,
    }
    checked = 0
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            if method == "get":
                url = path.format(**ids) + queries.get(path, "")
                response = web.get(url)
            elif (method, path) in made:
                response = made[(method, path)]
            else:
                continue
            code = next(c for c in op["responses"] if c.startswith("2"))
            assert str(response.status_code) == code, (
                method,
                path,
                response.get_data(as_text=True),
            )
            schema = op["responses"][code]["content"]["application/json"]["schema"]
            body = response.get_json()
            check(body, schema, components, f"{method} {path}")
            if isinstance(body, list):
                assert body or path.endswith(("/preview", "/tokens")), (
                    f"{path}: nothing was checked"
                )
            checked += 1
    assert checked >= 15
    for rule in ("/api/v1/snapshots/rollback", "/api/v1/snapshots/delete"):
        response = web.api("POST", rule, json={"path": "/ds", "name": "s1"})
        op = doc["paths"][rule]["post"]
        assert response.status_code == 200, response.get_data(as_text=True)
        check(
            response.get_json(),
            op["responses"]["200"]["content"]["application/json"]["schema"],
            components,
            f"POST {rule}",
        )
    for rule in (
        "/api/v1/smb/shares/{share_id}",
        "/api/v1/smb/users/{name}",
        "/api/v1/snapshot-schedules/{schedule_id}",
    ):
        response = web.api("DELETE", rule.format(**ids))
        op = doc["paths"][rule]["delete"]
        assert response.status_code == 200, response.get_data(as_text=True)
        check(
            response.get_json(),
            op["responses"]["200"]["content"]["application/json"]["schema"],
            components,
            f"DELETE {rule}",
        )
