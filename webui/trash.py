"""Trash: what retention rules (action "trash") and other deletes moved into each export's
.trash folder, with restore and purge.

Restoring is a rename in the namespace (engine.admin.trash), done here as the CLI does. Purging
frees file data, which only the daemon may do, so it queues a trash-purge job (one entry, the
expired ones, or all) and the job page follows it."""

from __future__ import annotations

from flask import Blueprint, abort, flash, redirect, render_template, request, url_for

from engine.admin.trash import Trash
from engine.base import errors
from webui import core
from webui.jobs import daemon_pid, queue
from webui.retention import tree_sizes

bp = Blueprint("trash", __name__)
PURGE_SCOPES = {  # form value -> the job's older_than_s, and what the page asks
    "expired": (None, "Purge every entry past its export's trash days?"),
    "all": (0, "Empty the trash? Every entry in it is removed for good."),
}


def trash() -> Trash:
    shingle = core.ctx()
    return Trash(shingle.namespace, shingle.catalog)


def entries() -> list[dict]:
    """Every trash entry (engine.admin.trash.TrashEntry.to_dict) with ``bytes``: what purging
    frees."""
    found = trash().list()
    sizes, complete = tree_sizes(core.ctx().namespace, [e.id for e in found])
    return [{**e.to_dict(), "bytes": sizes.get(e.id, 0), "sizes_complete": complete} for e in found]


def restore(entry_id: int, who: str) -> str:
    return trash().restore(entry_id, actor=who)


def queue_purge(who: str, *, entry: int | None = None, older_than_s: float | None = None) -> int:
    if entry is not None:
        trash().find(entry)  # NotFound now rather than a failed job later
        return queue("trash-purge", {"entry": entry}, who)
    return queue("trash-purge", {"older_than_s": older_than_s}, who)


@bp.route("/trash")
@core.login_required
def index():
    listed = entries()
    return render_template(
        "trash.html",
        entries=listed,
        total=sum(e["bytes"] for e in listed),
        daemon=daemon_pid(),
    )


@bp.route("/trash/<int:entry_id>/restore", methods=["POST"])
@core.login_required
def restore_entry(entry_id: int):
    try:
        path = restore(entry_id, core.actor())
    except errors.NotFound:
        abort(404)
    except core.USER_ERRORS as exc:
        flash(core.error_message(exc), "error")
        return redirect(url_for("trash.index"))
    flash(f"restored to {path}", "ok")
    return redirect(url_for("trash.index"))


@bp.route("/trash/<int:entry_id>/purge", methods=["POST"])
@core.login_required
def purge_entry(entry_id: int):
    try:
        entry = trash().find(entry_id)
        if request.form.get("confirm") != "yes":
            return core.confirm_page(
                question=f"Purge {entry.trash_path} (deleted from {entry.original_path or '?'})? "
                "It is removed for good and can no longer be restored.",
                action=url_for("trash.purge_entry", entry_id=entry_id),
                cancel=url_for("trash.index"),
            )
        job_id = queue_purge(core.actor(), entry=entry_id)
    except errors.NotFound:
        abort(404)
    flash(f"trash-purge job {job_id} queued", "ok")
    return redirect(url_for("jobs.detail", job_id=job_id))


@bp.route("/trash/purge", methods=["POST"])
@core.login_required
def purge():
    scope = request.form.get("scope", "")
    if scope not in PURGE_SCOPES:
        flash(f"purge {scope!r}: expected one of {', '.join(PURGE_SCOPES)}", "error")
        return redirect(url_for("trash.index"))
    older_than_s, question = PURGE_SCOPES[scope]
    if request.form.get("confirm") != "yes":
        return core.confirm_page(
            question=question,
            action=url_for("trash.purge"),
            fields={"scope": scope},
            cancel=url_for("trash.index"),
        )
    job_id = queue_purge(core.actor(), older_than_s=older_than_s)
    flash(f"trash-purge job {job_id} queued", "ok")
    return redirect(url_for("jobs.detail", job_id=job_id))
