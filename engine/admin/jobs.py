"""Jobs: long operations queued in the catalog and run by the daemon.

Only the daemon opens the drives, so an admin's "scrub now" from the CLI or
the web UI becomes a queued job; the daemon's maintenance loop claims it,
runs it with a progress callback that writes ``done/total/message`` here,
and records the result. Anyone can watch: `shingle` prints a progress line,
the web UI a progress bar.

While a job runs, its daemon writes a heartbeat (``Heartbeat``, every
``HEARTBEAT_S``). A daemon killed mid-job leaves it "running"; the next daemon
start (``recover_interrupted``) queues it again if its kind can restart from
the beginning (``RESTARTABLE``), else marks it "interrupted". A waiter
(``wait``) gives up with ``JobAbandoned`` when the daemon is gone or the
heartbeat is older than ``STALE_S``."""

from __future__ import annotations

import contextvars
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from sqlalchemy import select

from engine.admin.events import record_in
from engine.base import errors
from engine.base.ratelog import RateLimitedLog
from engine.catalog.database import Catalog, CatalogUnreachable
from engine.catalog.fence import LeaderFenced
from engine.catalog.models import Job

JOBS = Job.__table__
KINDS = (
    "retention",
    "tier",
    "clean",
    "scrub",
    "rebuild",
    "drain",
    "trash-purge",
    "drive-add",
    "drive-replace",
    "snapshot-schedule",
    "snapshot-archive",
    "host-join",
    "host-drain",
    "host-remove",
    "host-replace",
    "snapshot-reclaim",
    "snapshot-space",
)
# "warnings": done with warnings (the work ran, but its result is short of what was asked, e.g.
# stripes still under-protected after a rebuild); the message says how many and why.
WARNINGS = "warnings"
FINISHED = ("done", WARNINGS, "failed", "interrupted")
STATE_LABELS = {WARNINGS: "done with warnings"}
# Kinds that only read, or whose every step is its own transaction, so a second run from the
# start is safe and finishes the work: scrub, tiering, band cleaning, rebuild; a snapshot
# schedule run (a due slot is taken once, by name) and a snapshot's archive (moved stripes are
# cold and are not moved again); the hosts' jobs (a host's drives keep the state its operation
# gave them, and what was moved is not moved again); a deleted snapshot's reclaim (each chunk
# starts where the catalog says the last one ended); a recount of snapshots' space (each count
# is stored on its own).
RESTARTABLE = (
    "scrub",
    "tier",
    "clean",
    "rebuild",
    "snapshot-schedule",
    "snapshot-archive",
    "host-join",
    "host-drain",
    "host-remove",
    "host-replace",
    "snapshot-reclaim",
    "snapshot-space",
)
MAX_ATTEMPTS = 3  # a job that kills its daemon every time must not do so forever
HEARTBEAT_S = 5.0
STALE_S = 60.0  # no heartbeat for this long: its daemon is gone


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
    heartbeat_ns: int | None = None
    attempts: int = 0

    @property
    def finished(self) -> bool:
        return self.state in FINISHED

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else (1.0 if self.finished else 0.0)

    @property
    def state_label(self) -> str:
        """The state in words: "done with warnings" for ``WARNINGS``."""
        return STATE_LABELS.get(self.state, self.state)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["fraction"] = self.fraction
        return data


def _record(row) -> JobRecord:
    return JobRecord(
        row.id,
        row.kind,
        json.loads(row.params) if row.params else {},
        row.state,
        row.actor,
        row.done,
        row.total,
        row.message,
        json.loads(row.result) if row.result else None,
        row.created_ns,
        row.started_ns,
        row.finished_ns,
        row.heartbeat_ns,
        row.attempts,
    )


def submit(
    catalog: Catalog, kind: str, params: dict | None = None, *, actor: str = "system"
) -> int:
    if kind not in KINDS:
        raise errors.InvalidArgument(f"job kind {kind!r}: expected one of {', '.join(KINDS)}")

    def work(conn):
        job_id = conn.execute(
            JOBS.insert().values(
                kind=kind,
                params=json.dumps(params or {}, sort_keys=True),
                state="queued",
                actor=actor,
                done=0,
                total=0,
                created_ns=time.time_ns(),
                attempts=0,
            )
        ).inserted_primary_key[0]
        record_in(
            conn,
            f"job.{kind}.queued",
            f"{kind} job {job_id} queued",
            actor=actor,
            details={"job": job_id, "params": params or {}},
        )
        return job_id

    return catalog.run(work, tracked=True, published=True)  # jobs and events are cached nowhere


def get(catalog: Catalog, job_id: int) -> JobRecord:
    row = catalog.read(lambda conn: conn.execute(select(JOBS).where(JOBS.c.id == job_id)).first())
    if row is None:
        raise errors.NotFound(f"no job {job_id}")
    return _record(row)


def recent(catalog: Catalog, limit: int = 50) -> list[JobRecord]:
    rows = catalog.read(
        lambda conn: conn.execute(select(JOBS).order_by(JOBS.c.id.desc()).limit(limit)).all()
    )
    return [_record(row) for row in rows]


def pending(catalog: Catalog, kind: str) -> bool:
    """Whether a job of ``kind`` is queued or running (a schedule queues no second one)."""
    return (
        catalog.read(
            lambda conn: conn.execute(
                select(JOBS.c.id)
                .where(JOBS.c.kind == kind, JOBS.c.state.in_(("queued", "running")))
                .limit(1)
            ).scalar()
        )
        is not None
    )


def claim_next(catalog: Catalog) -> JobRecord | None:
    """The oldest queued job, now marked running (for the daemon's maintenance loop)."""
    job_id = catalog.read(
        lambda conn: conn.execute(
            select(JOBS.c.id).where(JOBS.c.state == "queued").order_by(JOBS.c.id).limit(1)
        ).scalar()
    )
    return None if job_id is None else claim(catalog, job_id)


def claim(catalog: Catalog, job_id: int) -> JobRecord | None:
    """Mark one queued job running; None if someone else claimed it first."""
    now = time.time_ns()
    claimed = catalog.run(
        lambda conn: (
            conn.execute(
                JOBS.update()
                .where(JOBS.c.id == job_id, JOBS.c.state == "queued")
                .values(
                    state="running", started_ns=now, heartbeat_ns=now, attempts=JOBS.c.attempts + 1
                )
            ).rowcount
        ),
        tracked=True,
        published=True,
    )
    return get(catalog, job_id) if claimed else None


def progress_writer(
    catalog: Catalog, job_id: int, every_s: float = 0.5
) -> Callable[[int, int, str], None]:
    """A ``progress(done, total, message)`` callback that writes at most every ``every_s``."""
    last = [0.0]

    def progress(done: int, total: int, message: str = "") -> None:
        now = time.monotonic()
        if now - last[0] < every_s and done < total:
            return
        last[0] = now
        catalog.run(
            lambda conn: conn.execute(
                JOBS.update()
                .where(JOBS.c.id == job_id)
                .values(
                    done=int(done),
                    total=int(total),
                    message=message[:500],
                    heartbeat_ns=time.time_ns(),
                )
            ),
            tracked=True,
            published=True,
        )

    return progress


_missed_beats = RateLimitedLog(logging.getLogger("shingle.jobs"))


class Heartbeat:
    """``with Heartbeat(catalog, job_id):`` writes the job's heartbeat every ``every_s`` from a
    thread, so a job between progress calls (a paced scrub, one long step) still looks alive."""

    def __init__(self, catalog: Catalog, job_id: int, every_s: float = HEARTBEAT_S):
        self.catalog, self.job_id, self.every_s = catalog, job_id, every_s
        self.stopped = threading.Event()
        # in a copy of the caller's context: a maintenance leader's fence covers the beats too
        self.thread = threading.Thread(
            target=contextvars.copy_context().run,
            args=(self._beat,),
            name=f"job-{job_id}-heartbeat",
            daemon=True,
        )

    def _beat(self) -> None:
        while not self.stopped.wait(self.every_s):
            try:
                self.catalog.run(
                    lambda conn: conn.execute(
                        JOBS.update()
                        .where(JOBS.c.id == self.job_id, JOBS.c.state == "running")
                        .values(heartbeat_ns=time.time_ns())
                    ),
                    tracked=True,
                    published=True,
                )
            except CatalogUnreachable:
                pass  # counted by the catalog's outage log; the next beat tries again
            except LeaderFenced:
                return  # a deposed leader's job: its successor queues it again
            except Exception as exc:  # a missed beat is retried at the next; the job goes on
                _missed_beats.warning(
                    type(exc), "job %d: heartbeat not written: %s", self.job_id, exc
                )

    def __enter__(self) -> Heartbeat:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        self.thread.join()


def recover_interrupted(catalog: Catalog, *, actor: str = "daemon") -> list[JobRecord]:
    """Jobs a dead daemon left running: queued again if they can restart, else interrupted.

    Only the owner of the drives (the daemon lock) may call this: then no job is really running."""
    now = time.time_ns()

    def work(conn):
        rows = conn.execute(select(JOBS).where(JOBS.c.state == "running").order_by(JOBS.c.id)).all()
        for row in rows:
            again = row.kind in RESTARTABLE and row.attempts < MAX_ATTEMPTS
            if again:
                values = dict(
                    state="queued",
                    started_ns=None,
                    heartbeat_ns=None,
                    done=0,
                    total=0,
                    message="interrupted when its daemon stopped (attempt "
                    f"{row.attempts}); queued again",
                )
            else:
                why = (
                    ("it was tried " + str(row.attempts) + " times")
                    if row.kind in RESTARTABLE
                    else f"a {row.kind} job does not restart on its own"
                )
                values = dict(
                    state="interrupted",
                    finished_ns=now,
                    message=f"interrupted when its daemon stopped; {why}: check its work "
                    "and queue it again",
                )
            conn.execute(JOBS.update().where(JOBS.c.id == row.id).values(**values))
            record_in(
                conn,
                f"job.{row.kind}.{'requeued' if again else 'interrupted'}",
                f"{row.kind} job {row.id} {values['message']}",
                severity="warning" if again else "error",
                actor=actor,
                details={"job": row.id, "attempts": row.attempts},
            )
        return [row.id for row in rows]

    return [get(catalog, job_id) for job_id in catalog.run(work, tracked=True, published=True)]


def finish(
    catalog: Catalog,
    job_id: int,
    *,
    ok: bool,
    result=None,
    message: str = "",
    warnings: list[str] | None = None,
) -> None:
    """Record a job's end: done, done with ``warnings`` (their text becomes the message), or
    failed."""
    state = ("done" if not warnings else WARNINGS) if ok else "failed"
    if ok and warnings:
        message = "; ".join(warnings)

    def work(conn):
        row = conn.execute(
            select(JOBS.c.kind, JOBS.c.actor, JOBS.c.total).where(JOBS.c.id == job_id)
        ).first()
        values = dict(
            state=state,
            finished_ns=time.time_ns(),
            message=message[:500],
            result=json.dumps(result, default=str) if result is not None else None,
        )
        if ok and row.total:
            values["done"] = row.total
        conn.execute(JOBS.update().where(JOBS.c.id == job_id).values(**values))
        ended = {"done": "finished", WARNINGS: "finished with warnings"}.get(state, "failed")
        record_in(
            conn,
            f"job.{row.kind}.{state if ok else 'failed'}",
            f"{row.kind} job {job_id} {ended}" + (f": {message}" if message else ""),
            severity={"done": "info", WARNINGS: "warning"}.get(state, "error"),
            actor=row.actor,
            details={"job": job_id},
        )

    catalog.run(work, tracked=True, published=True)


def wait(
    catalog: Catalog,
    job_id: int,
    *,
    progress: Callable[[JobRecord], None] | None = None,
    poll_s: float = 0.5,
    timeout_s: float | None = None,
    daemon_gone: Callable[[], str | None] | None = None,
    stale_s: float = STALE_S,
) -> JobRecord:
    """Block until the job finishes, calling ``progress`` with each new state.

    ``daemon_gone()`` returns why the daemon that should run the job is gone (None while it is
    there); then, or when a running job's heartbeat is older than ``stale_s``, this raises
    ``errors.JobAbandoned`` instead of waiting for ever."""
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
        gone = daemon_gone() if daemon_gone is not None else None
        if (
            gone is None
            and job.state == "running"
            and job.heartbeat_ns is not None
            and time.time_ns() - job.heartbeat_ns > stale_s * 1e9
        ):
            silent_s = (time.time_ns() - job.heartbeat_ns) / 1e9
            gone = f"no heartbeat from the daemon for {silent_s:.0f} s"
        if gone is not None:
            job = get(catalog, job_id)  # it may have finished just before its daemon stopped
            if job.finished:
                if progress:
                    progress(job)
                return job
            fate = (
                "it will be queued again"
                if job.kind in RESTARTABLE
                else "it will be marked interrupted"
            )
            raise errors.JobAbandoned(
                f"{job.kind} job {job_id} is {job.state} but {gone}: {fate} "
                "when the daemon starts again (see `shingle jobs`)"
            )
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} ({job.kind}) still {job.state} after {timeout_s} s")
        time.sleep(poll_s)


def active_in(conn, kinds: tuple[str, ...]) -> list[JobRecord]:
    """The jobs of ``kinds`` queued or running, oldest first (inside the caller's read)."""
    rows = conn.execute(
        select(JOBS)
        .where(JOBS.c.kind.in_(kinds), JOBS.c.state.in_(("queued", "running")))
        .order_by(JOBS.c.id)
    ).all()
    return [_record(row) for row in rows]
