"""Retention: keep-last-N rules with a preview of what a run would remove now, and "run now".

Rules and previews are catalog reads and writes, done here. Running a rule
frees file data, which only the daemon may do (it owns the drives, and it
alone sees which files NFS clients hold open), so "run now" queues a
retention job (engine.admin.jobs) and the job page follows it to its result."""

from __future__ import annotations

from flask import Blueprint, abort, flash, redirect, render_template, request, url_for

from engine.admin.schema import Field, Schema
from engine.base import errors
from engine.catalog.models import REG
from engine.snapshots.retention import ACTIONS, RULE_SCHEMA, RetentionService
from webui import core
from webui.crud import CrudApi
from webui.jobs import daemon_pid, queue

bp = Blueprint("retention", __name__)
FORM_DEFAULTS = {"action": "trash", "order_by": "mtime", "enabled": True}  # trash: restorable
PREVIEW_WALK_LIMIT = 100_000  # entries a preview looks at for sizes; past it, sizes are "at least"


RUN_SCHEMA = Schema(
    "RetentionRun",
    "Which rules to preview or run.",
    (
        Field(
            "rule_id",
            "integer",
            "One rule (even a disabled one); without it every enabled rule",
            required=False,
            minimum=1,
        ),
    ),
)


def service():
    """One RetentionService per process, for rules and previews (runs are the daemon's jobs)."""
    shingle = core.ctx()
    svc = shingle.retention
    if svc is None:
        # The same settings as the daemon's runner, so the preview shows what the job will do.
        svc = shingle.retention = RetentionService(shingle.namespace, shingle.catalog)
    return svc


def queue_run(rule_id: int | None, who: str) -> int:
    """Queue a retention job for the daemon (one rule, even a disabled one,
    or every enabled rule)."""
    if rule_id is not None:
        service().get_rule(rule_id)  # NotFound now rather than a failed job later
    return queue("retention", {"rule_id": rule_id}, who)


def create_rule(values: dict, who: str) -> int:
    return service().add_rule(
        values["pattern"],
        values["keep"],
        action=values["action"],
        order_by=values["order_by"],
        enabled=values.get("enabled", True),
        actor=who,
    )


API = CrudApi(
    "/retention/rules",
    "rule_id",
    "retention",
    "retention rule",
    "retention rules",
    RULE_SCHEMA,
    "RetentionRule",
    lambda: [rule.to_dict() for rule in service().list_rules()],
    lambda values, who: service().get_rule(create_rule(values, who)).to_dict(),
    lambda rule_id: service().get_rule(rule_id).to_dict(),
    lambda rule_id, values, who: service().update_rule(rule_id, actor=who, **values).to_dict(),
    lambda rule_id, who: service().delete_rule(rule_id, actor=who),
    summary={"create": "Create a keep-last-N rule"},
)


def _page(status: int = 200, **extra):
    return render_template(
        "retention.html",
        rules=service().list_rules(),
        schema=RULE_SCHEMA,
        form=extra.get("form", FORM_DEFAULTS),
        errors=extra.get("errors", {}),
    ), status


@bp.route("/retention")
@core.login_required
def index():
    return _page()


@bp.route("/retention/rules", methods=["POST"])
@core.login_required
def create():
    try:
        values = RULE_SCHEMA.from_form(request.form)
        rule_id = create_rule(values, core.actor())
    except core.USER_ERRORS as exc:
        return _page(400, form=core.posted(RULE_SCHEMA), errors=core.form_errors(exc))
    flash(f"retention rule {rule_id} created: preview it before it runs", "ok")
    return redirect(url_for("retention.preview", rule=rule_id))


@bp.route("/retention/rules/<int:rule_id>", methods=["GET", "POST"])
@core.login_required
def edit(rule_id: int):
    svc = service()
    try:
        rule = svc.get_rule(rule_id)
    except errors.NotFound:
        abort(404)
    form, errs, status = rule.to_dict(), {}, 200
    if request.method == "POST":
        try:
            values = RULE_SCHEMA.from_form(request.form)
            svc.update_rule(rule_id, actor=core.actor(), **values)
            flash(f"retention rule {rule_id} saved", "ok")
            return redirect(url_for("retention.index"))
        except core.USER_ERRORS as exc:
            form, errs, status = core.posted(RULE_SCHEMA), core.form_errors(exc), 400
    return render_template(
        "retention_edit.html", rule=rule, form=form, errors=errs, schema=RULE_SCHEMA
    ), status


@bp.route("/retention/rules/<int:rule_id>/delete", methods=["POST"])
@core.login_required
def delete(rule_id: int):
    return core.delete_page(
        lambda: service().get_rule(rule_id),
        lambda rule: service().delete_rule(rule_id, actor=core.actor()),
        question=lambda rule: (
            f"Delete retention rule {rule_id} (under {rule.pattern} keep the "
            f"newest {rule.keep}, {rule.action} the rest)? Scheduled runs stop applying it."
        ),
        done=lambda rule: f"retention rule {rule_id} deleted",
        back=lambda rule: url_for("retention.index"),
    )


@bp.route("/retention/preview")
@core.login_required
def preview():
    rule_id = request.args.get("rule", type=int)
    try:
        planned = service().preview(rule_id)
        rules = (
            [service().get_rule(rule_id)]
            if rule_id
            else [r for r in service().list_rules() if r.enabled]
        )
    except errors.NotFound:
        abort(404)
    sizes, complete = tree_sizes(
        service().namespace, [item.ino for item in planned if item.action != "skip"]
    )
    totals = {action: 0 for action in ACTIONS}
    for item in planned:
        if item.action in totals:
            totals[item.action] += sizes.get(item.ino, 0)
    return render_template(
        "retention_preview.html",
        planned=planned,
        rule_id=rule_id,
        rules=rules,
        daemon=daemon_pid(),
        sizes=sizes,
        totals=totals,
        sizes_complete=complete,
        walk_limit=PREVIEW_WALK_LIMIT,
    )


def tree_sizes(ns, inos) -> tuple[dict[int, int], bool]:
    """inode -> bytes its removal frees (the regular files of its subtree that have no other
    name), and whether every subtree was walked (False past PREVIEW_WALK_LIMIT entries: the
    rest count 0). For the retention preview and the trash page."""
    from engine.namespace.paths import walk_subtree

    sizes: dict[int, int] = {}
    budget = PREVIEW_WALK_LIMIT
    for ino in inos:
        if ino in sizes:
            continue
        total = 0
        if budget > 0:
            try:
                for attr in walk_subtree(ns, ns.getattr(ino)):
                    budget -= 1
                    if attr.type == REG and attr.nlink <= 1:
                        total += attr.size
                    if budget <= 0:
                        break
            except errors.FsError:
                pass  # gone since it was listed: it frees nothing
        sizes[ino] = total
    return sizes, budget > 0


@bp.route("/retention/run", methods=["POST"])
@core.login_required
def run():
    try:
        clean = RUN_SCHEMA.from_form(request.form)
        job_id = queue_run(clean.get("rule_id"), core.actor())
    except errors.NotFound:
        abort(404)
    except core.USER_ERRORS as exc:
        flash(str(core.form_errors(exc).popitem()[1]), "error")
        return redirect(url_for("retention.index"))
    flash(f"retention job {job_id} queued", "ok")
    return redirect(url_for("jobs.detail", job_id=job_id))
