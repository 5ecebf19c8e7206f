"""Jobs: long operations (retention runs, rebuild, drain, scrub, cleaning,
tiering) run by the daemon.

The web UI never opens the drives, so anything that moves or frees data is
queued in the catalog (engine.admin.jobs) for the daemon's maintenance loop; these
pages show the queue and each job's progress, refreshing until it finishes."""

from __future__ import annotations

import os

from flask import Blueprint, abort, flash, redirect, render_template, request, url_for

from engine.admin import jobs
from engine.admin.schema import Field, Schema
from engine.base import errors
from webui import core

bp = Blueprint("jobs", __name__)
QUEUEABLE = ("scrub", "clean", "tier", "rebuild")  # whole-appliance jobs without parameters
REFRESH_S = 2
LIST_REFRESH_MS = 2000  # the job list polls GET /api/v1/jobs this often (static/jobs.js)

QUEUE_SCHEMA = Schema(
    "JobRequest",
    "A maintenance job for the daemon to run now.",
    (
        Field(
            "kind",
            "string",
            "scrub (verify and repair every fragment), clean (band cleaning), tier (move data "
            "between classes) or rebuild (restore redundancy after a drive failed)",
            enum=QUEUEABLE,
        ),
    ),
)


def daemon_pid() -> int | None:
    """The pid of a running `shingle serve` (from its lock file), else None: jobs wait for it."""
    try:
        text = (core.ctx().config.data_dir / "shingle.lock").read_text().strip()
        pid = int(text)
    except (OSError, ValueError):
        return None
    return pid if os.path.exists(f"/proc/{pid}") else None


def queue(kind: str, params: dict, who: str) -> int:
    return jobs.submit(core.ctx().catalog, kind, params, actor=who)


def job_dict(job: jobs.JobRecord) -> dict:
    return job.to_dict()


@bp.route("/jobs")
@core.login_required
def index():
    return render_template(
        "jobs.html",
        jobs=jobs.recent(core.ctx().catalog, 50),
        daemon=daemon_pid(),
        queueable=QUEUEABLE,
        state_labels=jobs.STATE_LABELS,
        refresh_ms=LIST_REFRESH_MS,
    )


@bp.route("/jobs", methods=["POST"])
@core.login_required
def submit():
    try:
        values = QUEUE_SCHEMA.from_form(request.form)
        job_id = queue(values["kind"], {}, core.actor())
    except core.USER_ERRORS as exc:
        flash(str(core.form_errors(exc).popitem()[1]), "error")
        return redirect(url_for("jobs.index"))
    return redirect(url_for("jobs.detail", job_id=job_id))


@bp.route("/jobs/<int:job_id>")
@core.login_required
def detail(job_id: int):
    try:
        job = jobs.get(core.ctx().catalog, job_id)
    except errors.NotFound:
        abort(404)
    return render_template(
        "job.html", job=job, daemon=daemon_pid(), refresh=None if job.finished else REFRESH_S
    )
