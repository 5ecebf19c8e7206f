"""/api/v1/hosts: the cluster's hosts as `shingle cluster` shows and changes them
(webui/cluster.py). The four emulated drives of the web UI's appliance are labelled as two
agents' hosts and the head's own; what moves data is queued as a job, and every refusal changes
nothing."""

from __future__ import annotations

from engine.admin import jobs
from engine.catalog.models import Drive

DRIVES = Drive.__table__


def label_hosts(catalog) -> None:
    def work(conn):
        for drive_id, host in ((1, "store-a"), (2, "store-a"), (3, "store-b")):
            conn.execute(
                DRIVES.update()
                .where(DRIVES.c.id == drive_id)
                .values(host=host, backend="agent", path=f"10.0.0.{drive_id}:7400")
            )

    catalog.run(work)


def states(catalog) -> list[str]:
    return catalog.read(
        lambda conn: (
            conn.execute(DRIVES.select().with_only_columns(DRIVES.c.state).order_by(DRIVES.c.id))
            .scalars()
            .all()
        )
    )


def test_hosts_listed_joined_and_every_bad_request_refused_with_nothing_changed(web, appliance):
    _config, catalog = appliance
    label_hosts(catalog)
    listed = web.get("/api/v1/hosts")
    assert listed.status_code == 200, listed.get_json()
    report = listed.get_json()
    by_name = {h["name"]: h for h in report["hosts"]}
    assert set(by_name) == {"store-a", "store-b", "local"} and report["count"] == 3
    assert len(by_name["store-a"]["drives"]) == 2 and by_name["store-a"]["state"] == "up"
    assert by_name["store-a"]["address"] == "10.0.0.1:7400" and by_name["local"]["address"] is None
    one = web.get("/api/v1/hosts/store-b").get_json()
    assert one["name"] == "store-b" and len(one["drives"]) == 1 and one["operation"] is None

    # unknown hosts: 404, saying which hosts exist
    for method, url, body in (
        ("GET", "/api/v1/hosts/nosuch", None),
        ("POST", "/api/v1/hosts/nosuch/drain", {}),
        ("POST", "/api/v1/hosts/nosuch/remove", {}),
        ("POST", "/api/v1/hosts/nosuch/replace", {"address": "10.0.0.9:7400"}),
    ):
        response = web.api(method, url, body)
        assert response.status_code == 404, (url, response.get_json())
        assert "no host 'nosuch'" in response.get_json()["error"]
        assert "store-a" in response.get_json()["error"]  # the hosts there are

    # below the policy minimum: the 2+2 stripes need 4 drives, store-a's two leave 2
    before = states(catalog)
    for action in ("drain", "remove"):
        refused = web.api("POST", f"/api/v1/hosts/store-a/{action}", {})
        assert refused.status_code == 400, refused.get_json()
        assert "needs 4 different drives" in refused.get_json()["error"]
    assert states(catalog) == before  # nothing changed
    assert jobs.recent(catalog, 10) == []

    # bad bodies: a clear field error
    bad = web.api("POST", "/api/v1/hosts", {"address": "no port here"})
    assert bad.status_code == 400 and "address" in bad.get_json()["fields"]
    slow = web.api("POST", "/api/v1/hosts/store-b/drain", {"rate_mib_s": -1})
    assert slow.status_code == 400 and "rate_mib_s" in slow.get_json()["fields"]
    # the session's calls need the CSRF header
    forged = web.client.post("/api/v1/hosts", json={"address": "10.0.0.9:7400"})
    assert forged.status_code == 403 and "CSRF" in forged.get_json()["error"]

    # join: a job the daemon runs (only it reaches agents)
    queued = web.api("POST", "/api/v1/hosts", {"address": "10.0.0.9:7400", "rate_mib_s": 50})
    assert queued.status_code == 202, queued.get_json()
    job = queued.get_json()
    assert job["kind"] == "host-join" and job["state"] == "queued"
    assert job["params"] == {"address": "10.0.0.9:7400", "rate_mib_s": 50}
