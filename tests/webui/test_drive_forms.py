"""Adding and replacing a drive from the drives page queues the daemon's job; the token scope
and bad input are refused."""

from __future__ import annotations

from engine.admin import jobs


def test_add_and_replace_from_the_drives_page(web, appliance):
    _, catalog = appliance
    page = web.get("/drives").get_data(as_text=True)
    assert 'id="add-drive"' in page and "Replaces" in page
    response = web.post("/drives/add", {"path": "/srv/shingle/new-1"})
    assert response.status_code == 302 and "/jobs/" in response.headers["Location"]
    [job] = [j for j in jobs.recent(catalog) if j.kind == "drive-add"]
    assert (
        job.params
        == {"path": "/srv/shingle/new-1", "size": None, "zone_size": None, "preallocate": False}
        and job.state == "queued"
    )
    form = {"path": "/srv/shingle/new-2", "replaces": "2", "preallocate": "on"}
    asked = web.post("/drives/add", form).get_data(as_text=True)  # a replace asks once more
    assert 'id="confirm"' in asked and "Replace drive 2" in asked
    assert not [j for j in jobs.recent(catalog) if j.kind == "drive-replace"]
    web.post("/drives/add", {**form, "confirm": "yes"})
    [job] = [j for j in jobs.recent(catalog) if j.kind == "drive-replace"]
    assert job.params["old"] == 2 and job.params["preallocate"] is True

    bad = web.post("/drives/add", {"path": "relative/path"}, follow_redirects=True)
    assert "expected" in bad.get_data(as_text=True)
    missing = web.api("POST", "/api/v1/drives/999/replace", json={"path": "/srv/x"})
    assert missing.status_code == 404
    assert len([j for j in jobs.recent(catalog) if j.kind.startswith("drive-")]) == 2


def test_a_finished_job_with_warnings_is_shown_as_such(web, appliance):
    _, catalog = appliance
    job_id = jobs.submit(catalog, "rebuild", {})
    jobs.claim(catalog, job_id)
    jobs.finish(
        catalog,
        job_id,
        ok=True,
        result={"warnings": ["3 stripes still under-protected"]},
        warnings=["3 stripes still under-protected: only 9 drives take writes"],
    )
    job = jobs.get(catalog, job_id)
    assert job.state == "warnings" and job.finished and job.message.startswith("3 stripes")
    page = web.get(f"/jobs/{job_id}").get_data(as_text=True)
    assert "done with warnings" in page and "only 9 drives take writes" in page
    assert "done with warnings" in web.get("/jobs").get_data(as_text=True)
