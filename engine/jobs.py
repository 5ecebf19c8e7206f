"""Jobs: long operations queued in the catalog and run by the daemon.

Only the daemon opens the drives, so an admin's "scrub now" from the CLI or
the web UI becomes a queued job; the daemon's maintenance loop claims it,
runs it with a progress callback that writes ``done/total/message`` here,
and records the result. Anyone can watch: `shingle` prints a progress line,
the web UI a progress bar."""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from sqlalchemy import select

from engine import errors
from engine.catalog.database import Catalog
from engine.catalog.models import Job
from engine.events import record_in

JOBS = Job.__table__
KINDS = ("retention", "tier", "clean", "scrub", "rebuild", "drain", "trash-purge")
FINISHED = ("done", "failed")


@dataclass(frozen=True)
class JobRecord:
    id: int
    kind: str
    params: dict
    state: str
    actor: str
    done: int
    total: int
    message: str | None
    result: dict | list | None
    created_ns: int
    started_ns: int | None
    finished_ns: int | None

    @property
    def finished(self) -> bool:
        return self.state in FINISHED

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else (1.0 if self.finished else 0.0)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["fraction"] = self.fraction
        return data


def _record(row) -> JobRecord:
    return JobRecord(row.id, row.kind, json.loads(row.params) if row.params else {}, row.state, row.actor,
                     row.done, row.total, row.message, json.loads(row.result) if row.result else None,
                     row.created_ns, row.started_ns, row.finished_ns)


def submit(catalog: Catalog, kind: str, params: dict | None = None, *, actor: str = "system") -> int:
    if kind not in KINDS:
        raise errors.InvalidArgument(f"job kind {kind!r}: expected one of {', '.join(KINDS)}")

    def work(conn):
        job_id = conn.execute(JOBS.insert().values(
            kind=kind, params=json.dumps(params or {}, sort_keys=True), state="queued", actor=actor,
            done=0, total=0, created_ns=time.time_ns())).inserted_primary_key[0]
        record_in(conn, f"job.{kind}.queued", f"{kind} job {job_id} queued", actor=actor,
                  details={"job": job_id, "params": params or {}})
        return job_id
    return catalog.run(work, tracked=True)  # jobs and events are cached nowhere


def get(catalog: Catalog, job_id: int) -> JobRecord:
    row = catalog.read(lambda conn: conn.execute(select(JOBS).where(JOBS.c.id == job_id)).first())
    if row is None:
        raise errors.NotFound(f"no job {job_id}")
    return _record(row)


def recent(catalog: Catalog, limit: int = 50) -> list[JobRecord]:
    rows = catalog.read(lambda conn: conn.execute(select(JOBS).order_by(JOBS.c.id.desc()).limit(limit)).all())
    return [_record(row) for row in rows]


def claim_next(catalog: Catalog) -> JobRecord | None:
    """The oldest queued job, now marked running (for the daemon's maintenance loop)."""
    job_id = catalog.read(lambda conn: conn.execute(
        select(JOBS.c.id).where(JOBS.c.state == "queued").order_by(JOBS.c.id).limit(1)).scalar())
    return None if job_id is None else claim(catalog, job_id)


def claim(catalog: Catalog, job_id: int) -> JobRecord | None:
    """Mark one queued job running; None if someone else claimed it first."""
    claimed = catalog.run(lambda conn: conn.execute(
        JOBS.update().where(JOBS.c.id == job_id, JOBS.c.state == "queued")
        .values(state="running", started_ns=time.time_ns())).rowcount, tracked=True)
    return get(catalog, job_id) if claimed else None


def progress_writer(catalog: Catalog, job_id: int, every_s: float = 0.5) -> Callable[[int, int, str], None]:
    """A ``progress(done, total, message)`` callback that writes at most every ``every_s``."""
    last = [0.0]

    def progress(done: int, total: int, message: str = "") -> None:
        now = time.monotonic()
        if now - last[0] < every_s and done < total:
            return
        last[0] = now
        catalog.run(lambda conn: conn.execute(JOBS.update().where(JOBS.c.id == job_id).values(
            done=int(done), total=int(total), message=message[:500])), tracked=True)
    return progress


def finish(catalog: Catalog, job_id: int, *, ok: bool, result=None, message: str = "") -> None:
    def work(conn):
        row = conn.execute(select(JOBS.c.kind, JOBS.c.actor, JOBS.c.total).where(JOBS.c.id == job_id)).first()
        values = dict(state="done" if ok else "failed", finished_ns=time.time_ns(), message=message[:500],
                      result=json.dumps(result, default=str) if result is not None else None)
        if ok and row.total:
            values["done"] = row.total
        conn.execute(JOBS.update().where(JOBS.c.id == job_id).values(**values))
        record_in(conn, f"job.{row.kind}.{'done' if ok else 'failed'}",
                  f"{row.kind} job {job_id} {'finished' if ok else 'failed'}" + (f": {message}" if message else ""),
                  severity="info" if ok else "error", actor=row.actor, details={"job": job_id})
    catalog.run(work, tracked=True)


def wait(catalog: Catalog, job_id: int, *, progress: Callable[[JobRecord], None] | None = None,
         poll_s: float = 0.5, timeout_s: float | None = None) -> JobRecord:
    """Block until the job finishes, calling ``progress`` with each new state."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    seen = None
    while True:
        job = get(catalog, job_id)
        key = (job.state, job.done, job.total, job.message)
        if progress and key != seen:
            progress(job)
            seen = key
        if job.finished:
            return job
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} ({job.kind}) still {job.state} after {timeout_s} s")
        time.sleep(poll_s)
