"""Datasets: snapshots with the space each holds, schedules, and snapshot changes previewed.

Snapshot create, delete and rollback change catalog rows only (engine/snapshots/service.py), so they
are done here, as the CLI does them, each after a page that shows what it will do (engine/
datasets.py ``preview``) and asks for a confirmation. Schedules are catalog rows; running
them now and archiving a snapshot to the cold tier are jobs for the daemon (engine.admin.jobs)."""

from __future__ import annotations

from flask import Blueprint, abort, flash, redirect, render_template, request, url_for

from engine.admin.schema import Field, Schema
from engine.base import errors
from engine.snapshots import datasets as dataset_service
from engine.snapshots.schedules import (
    DATASET_FIELD as PATH_FIELD,
)
from engine.snapshots.schedules import (
    PATH_MAX,
    SCHEDULE_SCHEMA,
    SnapshotScheduler,
    engine_fields,
)
from engine.snapshots.service import Snapshots
from webui import core
from webui.crud import CrudApi
from webui.jobs import daemon_pid, queue

bp = Blueprint("datasets", __name__)


def _filled(form) -> dict:
    """A form's fields without the empty ones (an empty optional field is not given)."""
    return {k: v for k, v in form.items() if v.strip() != ""}


NAME_FIELD = Field(
    "name",
    "string",
    "The snapshot's name (no '/'; seen at PATH/.snapshots/NAME)",
    min_length=1,
    max_length=255,
    example="before-upgrade",
)

SNAPSHOT_SCHEMA = Schema("SnapshotInput", "One snapshot of a dataset.", (PATH_FIELD, NAME_FIELD))
CLONE_SCHEMA = Schema(
    "SnapshotCloneInput",
    "A writable clone of a snapshot at a new path.",
    (
        PATH_FIELD,
        NAME_FIELD,
        Field(
            "new_path",
            "string",
            "Where the clone goes: a new name in an existing directory",
            min_length=2,
            max_length=PATH_MAX,
            example="/datasets/web-experiment",
        ),
    ),
)
PREVIEW_SCHEMA = Schema(
    "SnapshotPreviewQuery",
    "Which snapshot change to preview.",
    (
        PATH_FIELD,
        NAME_FIELD,
        Field(
            "action",
            "string",
            "create, delete or rollback",
            enum=dataset_service.ACTIONS,
        ),
    ),
)
LIST_SCHEMA = Schema(
    "SnapshotListQuery",
    "Whose snapshots.",
    (
        Field(
            "path",
            "string",
            "One dataset; without it the snapshots of every dataset",
            required=False,
            max_length=PATH_MAX,
        ),
        Field(
            "recount",
            "boolean",
            "Count the dataset's snapshots' space now (with path; else as last counted: the "
            "daemon recounts every snapshots.space_recount_s)",
            required=False,
            default=False,
        ),
    ),
)
RUN_SCHEMA = Schema(
    "SnapshotScheduleRun",
    "Which schedules to preview or run.",
    (
        Field(
            "schedule_id",
            "integer",
            "One schedule (even a disabled one); without it every enabled one",
            required=False,
            minimum=1,
        ),
    ),
)


# -- services ---------------------------------------------------------------------------------
def snapshots() -> Snapshots:
    return Snapshots(core.ctx().namespace)


def scheduler() -> SnapshotScheduler:
    return SnapshotScheduler(core.ctx().namespace)


def add_schedule_from(values: dict, who: str):
    """A new schedule from form or API values."""
    fields = engine_fields(values)
    return scheduler().add(fields.pop("path"), fields.pop("frequency"), actor=who, **fields)


SCHEDULE_API = CrudApi(
    "/snapshot-schedules",
    "schedule_id",
    "datasets",
    "snapshot schedule",
    "snapshot schedules",
    SCHEDULE_SCHEMA,
    "SnapshotSchedule",
    lambda: [s.to_dict() for s in scheduler().list_schedules()],
    lambda values, who: add_schedule_from(values, who).to_dict(),
    lambda schedule_id: scheduler().get(schedule_id).to_dict(),
    lambda schedule_id, values, who: (
        scheduler().update(schedule_id, actor=who, **engine_fields(values, partial=True)).to_dict()
    ),
    lambda schedule_id, who: scheduler().delete(schedule_id, actor=who),
    summary={
        "create": "Create a snapshot schedule (its first snapshot is at its next slot)",
        "delete": "Delete a snapshot schedule (its snapshots stay)",
    },
)


def snapshot_dict(path: str, info) -> dict:
    return {"path": path, **info.to_dict()}


def list_snapshots(path: str | None = None, recount: bool = False) -> list[dict]:
    """Each dataset's snapshots with their space as last counted; ``recount`` (one dataset):
    counted now."""
    snaps = snapshots()
    paths = [dataset_service.clean_path(path)] if path else None
    if paths is None:
        paths = dataset_service.dataset_paths(core.ctx().namespace, scheduler())
    out = []
    for each in paths:
        try:
            out += [
                snapshot_dict(each, info)
                for info in snaps.list(each, recount=recount and bool(path))
            ]
        except errors.FsError:
            if path:
                raise
    return out


def create_snapshot(path: str, name: str) -> dict:
    path = dataset_service.clean_path(path)
    return snapshot_dict(path, snapshots().create(path, name))


def delete_snapshot(path: str, name: str) -> dict:
    path = dataset_service.clean_path(path)
    snaps = snapshots()
    snaps.delete(path, name)
    pending = snaps.pending(path)
    return {
        "path": path,
        "name": name,
        # reclaimed in the background (the daemon's snapshot-reclaim job)
        "pending_deletions": len(pending),
    }


def clone_snapshot(path: str, name: str, new_path: str) -> dict:
    path = dataset_service.clean_path(path)
    new_path = dataset_service.clean_path(new_path)
    ino = snapshots().clone(path, name, new_path)
    return {"path": path, "name": name, "new_path": new_path, "ino": ino}


def rollback_snapshot(path: str, name: str) -> dict:
    path = dataset_service.clean_path(path)
    snaps = snapshots()
    before = dataset_service.preview(
        core.ctx().namespace, snaps, scheduler(), "rollback", path, name
    )
    snaps.rollback(path, name)
    return {
        "path": path,
        "name": name,
        "removed": len(before.removed),
        "restored": len(before.restored),
        "reverted": len(before.reverted),
    }


def preview(action: str, path: str, name: str):
    return dataset_service.preview(
        core.ctx().namespace, snapshots(), scheduler(), action, path, name
    )


def queue_archive(path: str, name: str, who: str) -> int:
    path = dataset_service.clean_path(path)
    dataset_service.find(snapshots(), path, name)  # NotFound now rather than a failed job
    return queue("snapshot-archive", {"path": path, "name": name}, who)


def queue_run(schedule_id: int | None, who: str) -> int:
    if schedule_id is not None:
        scheduler().get(schedule_id)
    return queue("snapshot-schedule", {"schedule_id": schedule_id}, who)


# -- pages --------------------------------------------------------------------------------------
def _index(status: int = 200, **extra):
    ns = core.ctx().namespace
    sched = scheduler()
    return render_template(
        "datasets.html",
        datasets=dataset_service.datasets(ns, sched, snapshots()),
        snapshot_schema=SNAPSHOT_SCHEMA,
        snapshot_form=extra.get("snapshot_form", {}),
        snapshot_errors=extra.get("snapshot_errors", {}),
    ), status


def _dataset_page(path: str, status: int = 200, **extra):
    sched = scheduler()
    try:
        held = snapshots().list(path)
        pending = snapshots().pending(path)
        problem = None
    except errors.FsError as exc:
        held, pending, problem = [], [], core.error_message(exc)
    return render_template(
        "dataset.html",
        path=path,
        snapshots=held,
        pending=pending,
        pending_bytes=sum(p.pending_bytes or 0 for p in pending),
        pending_uncounted=any(p.pending_bytes is None for p in pending),
        problem=problem,
        schedules=sched.list_schedules(path),
        snapshot_schema=SNAPSHOT_SCHEMA,
        snapshot_form=extra.get("snapshot_form", {"path": path}),
        snapshot_errors=extra.get("snapshot_errors", {}),
        schedule_schema=SCHEDULE_SCHEMA,
        schedule_form=extra.get(
            "schedule_form", {"path": path, "frequency": "daily", "prefix": "auto", "enabled": True}
        ),
        schedule_errors=extra.get("schedule_errors", {}),
        daemon=daemon_pid(),
    ), status


@bp.route("/datasets")
@core.login_required
def index():
    path = request.args.get("path")
    if path:
        try:
            return _dataset_page(dataset_service.clean_path(path))
        except errors.FsError:
            abort(404)
    return _index()


def _back(path: str):
    return redirect(url_for("datasets.index", path=path))


def _confirm(action: str, values: dict, endpoint: str, button: str):
    """The preview page of a change, whose form posts it again with confirm=yes."""
    shown = preview(action, values["path"], values["name"])
    return render_template(
        "dataset_confirm.html",
        preview=shown,
        fields={"path": shown.path, "name": shown.name, "confirm": "yes"},
        action=url_for(endpoint),
        button=button,
        cancel=url_for("datasets.index", path=shown.path),
    )


@bp.route("/datasets/snapshots", methods=["POST"])
@core.login_required
def create():
    try:
        values = SNAPSHOT_SCHEMA.from_form(request.form)
        if request.form.get("confirm") != "yes":
            return _confirm("create", values, "datasets.create", "Take the snapshot")
        made = create_snapshot(values["path"], values["name"])
    except core.USER_ERRORS as exc:
        form = dict(request.form)
        page_path = form.get("path") or ""
        if request.form.get("from") == "index" or not page_path:
            return _index(400, snapshot_form=form, snapshot_errors=core.form_errors(exc))
        try:
            return _dataset_page(
                dataset_service.clean_path(page_path),
                400,
                snapshot_form=form,
                snapshot_errors=core.form_errors(exc),
            )
        except errors.FsError:
            return _index(400, snapshot_form=form, snapshot_errors=core.form_errors(exc))
    flash(f"snapshot {made['name']} of {made['path']} taken ({made['files']} inodes)", "ok")
    return _back(made["path"])


def _snapshot_form() -> dict | None:
    """The path and name a snapshot button posts; None (and a message) if they are bad."""
    try:
        return SNAPSHOT_SCHEMA.from_form(request.form)
    except core.USER_ERRORS as exc:
        flash(core.error_message(exc), "error")
        return None


@bp.route("/datasets/snapshots/delete", methods=["POST"])
@core.login_required
def delete():
    values = _snapshot_form()
    if values is None:
        return redirect(url_for("datasets.index"))
    try:
        if request.form.get("confirm") != "yes":
            return _confirm("delete", values, "datasets.delete", "Delete the snapshot")
        done = delete_snapshot(values["path"], values["name"])
    except errors.NotFound:
        abort(404)
    flash(
        f"snapshot {done['name']} of {done['path']} deleted: its space is reclaimed in the "
        "background (pending until then)",
        "ok",
    )
    return _back(done["path"])


@bp.route("/datasets/snapshots/clone", methods=["POST"])
@core.login_required
def clone():
    try:
        values = CLONE_SCHEMA.from_form(request.form)
        done = clone_snapshot(values["path"], values["name"], values["new_path"])
    except core.USER_ERRORS as exc:  # a bad or taken path, a missing parent or snapshot
        flash(f"clone: {core.error_message(exc)}", "error")
        return _back(request.form.get("path") or "/")
    flash(f"snapshot {done['name']} of {done['path']} cloned to {done['new_path']}", "ok")
    return _back(done["path"])


@bp.route("/datasets/snapshots/rollback", methods=["POST"])
@core.login_required
def rollback():
    values = _snapshot_form()
    if values is None:
        return redirect(url_for("datasets.index"))
    try:
        if request.form.get("confirm") != "yes":
            return _confirm("rollback", values, "datasets.rollback", "Roll back")
        done = rollback_snapshot(values["path"], values["name"])
    except errors.NotFound:
        abort(404)
    except core.USER_ERRORS as exc:
        flash(f"rollback of {values['path']}: {core.error_message(exc)}", "error")
        return _back(values["path"])
    flash(f"{done['path']} rolled back to snapshot {done['name']}", "ok")
    return _back(done["path"])


@bp.route("/datasets/snapshots/archive", methods=["POST"])
@core.login_required
def archive():
    values = _snapshot_form()
    if values is None:
        return redirect(url_for("datasets.index"))
    try:
        job_id = queue_archive(values["path"], values["name"], core.actor())
    except errors.NotFound:
        abort(404)
    flash(f"archive job {job_id} queued", "ok")
    return redirect(url_for("jobs.detail", job_id=job_id))


@bp.route("/datasets/schedules", methods=["POST"])
@core.login_required
def add_schedule():
    form = core.posted(SCHEDULE_SCHEMA)
    try:
        made = add_schedule_from(SCHEDULE_SCHEMA.from_form(_filled(request.form)), core.actor())
    except core.USER_ERRORS as exc:
        try:
            return _dataset_page(
                dataset_service.clean_path(request.form.get("path") or "/"),
                400,
                schedule_form=form,
                schedule_errors=core.form_errors(exc),
            )
        except errors.FsError:
            return _index(400)
    flash(f"snapshot schedule {made.id} created: {made.describe()}", "ok")
    return _back(made.path)


@bp.route("/datasets/schedules/<int:schedule_id>", methods=["GET", "POST"])
@core.login_required
def edit_schedule(schedule_id: int):
    sched = scheduler()
    try:
        current = sched.get(schedule_id)
    except errors.NotFound:
        abort(404)
    form = current.to_dict()
    form["keep_for"] = current.keep_for_s or ""
    errs, status = {}, 200
    if request.method == "POST":
        form = core.posted(SCHEDULE_SCHEMA)
        try:
            values = engine_fields(SCHEDULE_SCHEMA.from_form(_filled(request.form)))
            made = sched.update(schedule_id, actor=core.actor(), **values)
            flash(f"snapshot schedule {schedule_id} saved: {made.describe()}", "ok")
            return _back(made.path)
        except core.USER_ERRORS as exc:
            errs, status = core.form_errors(exc), 400
    return render_template(
        "dataset_schedule.html", schedule=current, form=form, errors=errs, schema=SCHEDULE_SCHEMA
    ), status


@bp.route("/datasets/schedules/<int:schedule_id>/delete", methods=["POST"])
@core.login_required
def delete_schedule(schedule_id: int):
    return core.delete_page(
        lambda: scheduler().get(schedule_id),
        lambda schedule: scheduler().delete(schedule_id, actor=core.actor()),
        question=lambda schedule: (
            f"Delete snapshot schedule {schedule_id} of {schedule.path} "
            f"({schedule.describe()})? No more snapshots are taken or pruned by it; the "
            "snapshots it took stay."
        ),
        done=lambda schedule: f"snapshot schedule {schedule_id} deleted",
        back=lambda schedule: url_for("datasets.index", path=schedule.path),
    )


@bp.route("/datasets/schedules/preview")
@core.login_required
def schedule_preview():
    schedule_id = request.args.get("schedule", type=int)
    try:
        planned = scheduler().preview(schedule_id)
    except errors.NotFound:
        abort(404)
    return render_template(
        "dataset_schedule_preview.html",
        planned=planned,
        schedule_id=schedule_id,
        path=request.args.get("path"),
        daemon=daemon_pid(),
    )


@bp.route("/datasets/schedules/run", methods=["POST"])
@core.login_required
def schedule_run():
    try:
        clean = RUN_SCHEMA.from_form(request.form)
        job_id = queue_run(clean.get("schedule_id"), core.actor())
    except errors.NotFound:
        abort(404)
    flash(f"snapshot schedule job {job_id} queued", "ok")
    return redirect(url_for("jobs.detail", job_id=job_id))
