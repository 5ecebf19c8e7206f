"""Snapshots and their schedules through the REST API against a running daemon side: scopes,
previews that change nothing, rollback and delete, schedule runs and archives as jobs, the
daemon's maintenance taking a due snapshot on its own, and JSON errors."""

from __future__ import annotations

import time

from sqlalchemy import select

from engine.admin import accounts, jobs
from engine.catalog.models import SnapshotSchedule
from engine.namespace import ROOT
from engine.snapshots.schedules import latest_slot, snapshot_name
from tests.webui.conftest import ADMIN
from tests.webui.helpers import mkdirs

OLD = [f"auto-2026-11-{day}T0300Z" for day in (26, 27, 28)]


def _tokens(live) -> dict:
    catalog = live.catalog
    uid = catalog.read(lambda c: c.execute(select(accounts.USERS.c.id)).scalar())
    return {
        scope: {
            "Authorization": "Bearer " + accounts.create_token(catalog, uid, scope, scope=scope)
        }
        for scope in accounts.SCOPES
    }


def _write(ns, path: str, data: bytes) -> None:
    parent, name = path.rsplit("/", 1)
    attr = ns.create(ROOT, ns.resolve(parent).ino, name, exclusive=False)
    ns.setattr(ROOT, attr.ino, size=0)
    ns.write(attr.ino, 0, data, stable=True)


def _read(ns, path: str) -> bytes:
    attr = ns.resolve(path)
    return bytes(ns.read(attr.ino, 0, attr.size))


def _finished(live, job: dict) -> dict:
    return jobs.wait(live.catalog, job["id"], timeout_s=60, poll_s=0.05).to_dict()


def test_snapshots_and_schedules_through_the_api(live):
    ns = live.namespace  # the daemon's side: data path and maintenance running jobs
    mkdirs(ns, "/datasets/web")
    _write(ns, "/datasets/web/model", b"v1" * 50_000)
    client = live.app.test_client()
    token = _tokens(live)
    reader, operator, admin = token["read-only"], token["operator"], token["admin"]

    def call(method, url, headers, json=None):
        return client.open(url, method=method, json=json, headers=headers)

    body = {"path": "/datasets/web", "name": "s1"}
    assert call("POST", "/api/v1/snapshots", reader, body).status_code == 403
    made = call("POST", "/api/v1/snapshots", operator, body)
    assert made.status_code == 201, made.get_json()
    figures = made.get_json()
    if not figures["counted"]:  # a lazy view (lazyviews.ENABLED): counted after, through it
        [figures] = call(
            "GET", "/api/v1/snapshots?path=/datasets/web&recount=true", reader
        ).get_json()
    assert figures["referenced_bytes"] == 100_000
    again = call("POST", "/api/v1/snapshots", operator, body)
    assert again.status_code == 409 and "exists" in again.get_json()["error"]
    _write(ns, "/datasets/web/model", b"v2" * 50_000)
    _write(ns, "/datasets/web/new", b"n")

    [dataset] = call("GET", "/api/v1/datasets", reader).get_json()
    assert dataset["path"] == "/datasets/web" and dataset["snapshots"] == 1
    [stored] = call("GET", "/api/v1/snapshots?path=/datasets/web", reader).get_json()
    assert stored["unique_bytes"] == 0, "as counted at create: a listing does not count"
    [snap] = call("GET", "/api/v1/snapshots?path=/datasets/web&recount=true", reader).get_json()
    assert snap["unique_bytes"] == 100_000  # the old model is the snapshot's alone now
    assert snap["counted"] > stored["counted"]
    shown = call(
        "GET", "/api/v1/snapshots/preview?path=/datasets/web&name=s1&action=delete", reader
    ).get_json()
    assert shown["frees_bytes"] == 100_000 and "97.7 KiB" in shown["summary"]
    shown = call(
        "GET", "/api/v1/snapshots/preview?path=/datasets/web&name=s1&action=rollback", reader
    ).get_json()
    assert (shown["removed"], shown["reverted"]) == (["new"], ["model"])
    assert _read(ns, "/datasets/web/model") == b"v2" * 50_000  # previews change nothing
    missing = call(
        "GET", "/api/v1/snapshots/preview?path=/datasets/web&name=nope&action=delete", reader
    )
    assert missing.status_code == 404 and "no snapshot" in missing.get_json()["error"]

    assert call("POST", "/api/v1/snapshots/rollback", operator, body).status_code == 403
    rolled = call("POST", "/api/v1/snapshots/rollback", admin, body)
    assert rolled.status_code == 200 and rolled.get_json()["removed"] == 1
    assert _read(ns, "/datasets/web/model") == b"v1" * 50_000
    assert ns.resolve("/datasets/web").ino  # the dataset keeps its inode

    # schedules: three old snapshots named as a daily schedule names them, keep the newest 1
    for name in OLD:
        assert (
            call("POST", "/api/v1/snapshots", operator, {**body, "name": name}).status_code == 201
        )
    schedule = {"path": "/datasets/web", "frequency": "daily", "at": "03:00", "keep_last": 1}
    assert call("POST", "/api/v1/snapshot-schedules", operator, schedule).status_code == 403
    created = call("POST", "/api/v1/snapshot-schedules", admin, schedule)
    assert created.status_code == 201, created.get_json()
    sid = created.get_json()["id"]
    assert created.get_json()["summary"] == "daily at 03:00 UTC, keeping the newest 1"
    taken = call("POST", "/api/v1/snapshot-schedules", admin, schedule)
    assert taken.status_code == 409 and "another prefix" in taken.get_json()["error"]
    for bad, field in (
        ({**schedule, "frequency": "monthly"}, "frequency"),
        ({**schedule, "keep_for": "soon"}, "keep_for"),
        ({**schedule, "prefix": "a b"}, "prefix"),
    ):
        refused = call("POST", "/api/v1/snapshot-schedules", admin, bad)
        assert refused.status_code == 400 and field in refused.get_json()["fields"], bad
    nowhere = call("POST", "/api/v1/snapshot-schedules", admin, {**schedule, "path": "/nowhere"})
    assert nowhere.status_code == 404
    planned = call("GET", f"/api/v1/snapshot-schedules/preview?schedule_id={sid}", reader)
    assert [(p["action"], p["name"]) for p in planned.get_json()] == [
        ("delete", OLD[0]),
        ("delete", OLD[1]),
    ]
    queued = call("POST", "/api/v1/snapshot-schedules/run", operator, {"schedule_id": sid})
    assert queued.status_code == 202
    job = _finished(live, queued.get_json())
    assert job["state"] == "done", job
    assert [a["outcome"] for a in job["result"]["actions"]] == ["done", "done"]
    names = [s["name"] for s in call("GET", "/api/v1/snapshots", reader).get_json()]
    assert names == ["s1", OLD[2]]
    changed = call("PATCH", f"/api/v1/snapshot-schedules/{sid}", admin, {"keep_for": "30d"})
    assert changed.get_json()["keep_for_s"] == 30 * 86400, changed.get_json()

    # archive: the daemon moves what only s1 holds to cold; what it shares stays
    _write(ns, "/datasets/web/model", b"v3" * 50_000)
    archived = call("POST", "/api/v1/snapshots/archive", operator, body)
    assert archived.status_code == 202
    job = _finished(live, archived.get_json())
    assert job["state"] == "done", job
    assert (job["result"]["bytes_moved"], job["result"]["shared_bytes"]) == (0, 100_000)
    gone = call("POST", "/api/v1/snapshots/delete", admin, {**body, "name": OLD[2]})
    assert gone.status_code == 200  # it shared s1's model: now s1 holds it alone
    job = _finished(live, call("POST", "/api/v1/snapshots/archive", operator, body).get_json())
    assert (job["result"]["bytes_moved"], job["result"]["shared_bytes"]) == (100_000, 0), job
    assert _read(ns, "/datasets/web/.snapshots/s1/model") == b"v1" * 50_000

    # a writable clone of s1 at a new path (operator), sharing its stripes
    clone = {**body, "new_path": "/datasets/web-exp"}
    assert call("POST", "/api/v1/snapshots/clone", reader, clone).status_code == 403
    cloned = call("POST", "/api/v1/snapshots/clone", operator, clone)
    assert cloned.status_code == 201, cloned.get_json()
    assert cloned.get_json()["new_path"] == "/datasets/web-exp"
    assert _read(ns, "/datasets/web-exp/model") == b"v1" * 50_000
    taken = call("POST", "/api/v1/snapshots/clone", operator, clone)
    assert taken.status_code == 409 and "exists" in taken.get_json()["error"], taken.get_json()
    nowhere = call("POST", "/api/v1/snapshots/clone", operator, {**clone, "new_path": "/no/x"})
    assert nowhere.status_code == 404, nowhere.get_json()
    exp = ns.resolve("/datasets/web-exp").ino
    for entry in ns.readdir(ROOT, exp)[0]:
        ns.unlink(ROOT, exp, entry.name)
    ns.rmdir(ROOT, ns.resolve("/datasets").ino, "web-exp")

    stripes = live.catalog.read(lambda c: c.exec_driver_sql("SELECT COUNT(*) FROM stripes").one())
    deleted = call("POST", "/api/v1/snapshots/delete", admin, body)
    assert deleted.status_code == 200 and deleted.get_json()["pending_deletions"] >= 1
    # the daemon's background reclaim (a snapshot-reclaim job) frees it: nothing pending after
    deadline = time.monotonic() + 60
    while call("GET", "/api/v1/datasets", reader).get_json()[0]["pending_deletions"]:
        assert time.monotonic() < deadline, "the daemon did not reclaim the deleted snapshot"
        time.sleep(0.05)
    after = live.catalog.read(lambda c: c.exec_driver_sql("SELECT COUNT(*) FROM stripes").one())
    assert after[0] < stripes[0], "what only the deleted snapshot held is freed"
    assert call("DELETE", f"/api/v1/snapshot-schedules/{sid}", admin).status_code == 200
    assert call("GET", f"/api/v1/snapshot-schedules/{sid}", reader).status_code == 404


def test_the_daemon_takes_a_due_snapshot_on_its_own(live):
    ns = live.namespace
    mkdirs(ns, "/data/set")
    _write(ns, "/data/set/f", b"x" * 1000)
    client = live.app.test_client()
    admin = _tokens(live)["admin"]
    made = client.post(
        "/api/v1/snapshot-schedules",
        json={"path": "/data/set", "frequency": "hourly", "keep_last": 2},
        headers=admin,
    ).get_json()
    # a slot passes: the schedule's last slot is set an hour back, as if the clock moved on
    table = SnapshotSchedule.__table__
    live.catalog.run(
        lambda c: c.execute(
            table.update()
            .where(table.c.id == made["id"])
            .values(last_slot_s=made["last_slot_s"] - 3600)
        )
    )
    want = snapshot_name("auto", latest_slot("hourly", 3600, 0, time.time()))
    deadline = time.monotonic() + 60
    names: list[str] = []
    while time.monotonic() < deadline and want not in names:
        names = [s["name"] for s in client.get("/api/v1/snapshots", headers=admin).get_json()]
        time.sleep(0.1)
    assert names == [want]
    [job] = [j for j in jobs.recent(live.catalog) if j.kind == "snapshot-schedule"]
    assert job.actor == "schedule" and job.state in ("running", "done")
    time.sleep(0.5)  # more rounds of the loop: no second job for the same slot
    assert len([j for j in jobs.recent(live.catalog) if j.kind == "snapshot-schedule"]) == 1
    assert (
        client.get(f"/api/v1/snapshot-schedules/{made['id']}", headers=admin).get_json()[
            "last_error"
        ]
        is None
    )
    assert ADMIN  # the tokens belong to the first admin
