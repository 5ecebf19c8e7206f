"""Jobs queue in the catalog: submitted by admins, claimed once, progress visible, finished."""
from __future__ import annotations

import threading

import pytest

from engine import errors, jobs
from engine.events import recent


def test_job_lifecycle(catalog):
    job_id = jobs.submit(catalog, "scrub", {"drive": 3}, actor="alice")
    assert jobs.get(catalog, job_id).state == "queued"
    claimed = jobs.claim_next(catalog)
    assert claimed.id == job_id and claimed.state == "running" and claimed.params == {"drive": 3}
    assert jobs.claim_next(catalog) is None  # claimed once only
    progress = jobs.progress_writer(catalog, job_id, every_s=0)
    progress(5, 10, "half way")
    mid = jobs.get(catalog, job_id)
    assert (mid.done, mid.total, mid.message, mid.fraction) == (5, 10, "half way", 0.5)
    jobs.finish(catalog, job_id, ok=True, result={"repaired": 2})
    final = jobs.get(catalog, job_id)
    assert final.state == "done" and final.result == {"repaired": 2} and final.done == 10
    kinds = [e.kind for e in recent(catalog, 10)]
    assert "job.scrub.queued" in kinds and "job.scrub.done" in kinds
    assert any(e.actor == "alice" for e in recent(catalog, 10))


def test_wait_reports_progress_until_done(catalog):
    job_id = jobs.submit(catalog, "rebuild")
    seen = []

    def daemon():
        job = jobs.claim_next(catalog)
        jobs.progress_writer(catalog, job.id, every_s=0)(1, 2, "one of two")
        jobs.finish(catalog, job.id, ok=False, message="drive 4 missing")
    worker = threading.Timer(0.2, daemon)
    worker.start()
    final = jobs.wait(catalog, job_id, progress=seen.append, poll_s=0.05, timeout_s=30)
    worker.join()
    assert final.state == "failed" and final.message == "drive 4 missing"
    assert seen[0].state == "queued" and seen[-1].state == "failed"


def test_unknown_kind_refused(catalog):
    with pytest.raises(errors.InvalidArgument, match="job kind"):
        jobs.submit(catalog, "defrag")
