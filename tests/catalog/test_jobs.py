"""Jobs queue in the catalog: submitted by admins, claimed once, progress visible, finished."""

from __future__ import annotations

import threading
import time

import pytest

from engine.admin import jobs
from engine.admin.events import recent
from engine.base import errors


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


def test_jobs_left_running_by_a_dead_daemon_are_requeued_or_interrupted(catalog):
    scrub = jobs.submit(catalog, "scrub")
    retention = jobs.submit(catalog, "retention", {"rule_id": 1})
    done = jobs.submit(catalog, "tier")
    for _ in range(3):
        jobs.claim_next(catalog)
    jobs.finish(catalog, done, ok=True)
    recovered = {job.id: job for job in jobs.recover_interrupted(catalog)}
    assert set(recovered) == {scrub, retention}  # a finished job is nobody's business here
    assert recovered[scrub].state == "queued" and "queued again" in recovered[scrub].message
    assert recovered[retention].state == "interrupted" and recovered[retention].finished
    assert "does not restart on its own" in recovered[retention].message
    kinds = [e.kind for e in recent(catalog, 10)]
    assert "job.scrub.requeued" in kinds and "job.retention.interrupted" in kinds
    # A job that kills its daemon every time is given up after MAX_ATTEMPTS claims.
    for attempt in range(2, jobs.MAX_ATTEMPTS + 1):
        assert jobs.claim_next(catalog).attempts == attempt
        state = jobs.recover_interrupted(catalog)[0].state
        assert state == ("queued" if attempt < jobs.MAX_ATTEMPTS else "interrupted")
    assert jobs.get(catalog, scrub).state == "interrupted"


def test_wait_gives_up_when_the_daemon_is_gone_or_its_heartbeat_stale(catalog):
    queued = jobs.submit(catalog, "scrub")
    expected = r"scrub job \d+ is queued but the daemon \(pid 7\) has stopped: it will be queued"
    with pytest.raises(errors.JobAbandoned, match=expected):
        jobs.wait(
            catalog, queued, poll_s=0.01, daemon_gone=lambda: "the daemon (pid 7) has stopped"
        )
    running = jobs.claim_next(catalog)
    with jobs.Heartbeat(catalog, running.id, every_s=0.05):
        time.sleep(0.3)
        fresh = jobs.get(catalog, running.id).heartbeat_ns
        assert fresh > running.heartbeat_ns
        with pytest.raises(TimeoutError):  # beating: still waited for
            jobs.wait(catalog, running.id, poll_s=0.05, timeout_s=0.5, stale_s=0.5)
    time.sleep(0.3)
    with pytest.raises(errors.JobAbandoned, match="no heartbeat from the daemon for"):
        jobs.wait(catalog, running.id, poll_s=0.05, timeout_s=10, stale_s=0.2)
    jobs.finish(catalog, running.id, ok=True)  # finished before the daemon went: that is an answer
    assert jobs.wait(catalog, running.id, daemon_gone=lambda: "gone").state == "done"
