"""NFS exports: the path clients mount, which clients (CIDRs), ro/rw and squash.

The pages and the API go through engine.exports (checks, the change and its
event naming the admin, in one catalog transaction); the NFS server reloads
its table from there."""

from __future__ import annotations

from flask import Blueprint, abort, flash, redirect, render_template, request, url_for

from engine import errors
from engine import exports as export_service
from engine.exports import SQUASH_MODES as SQUASH
from webui import core
from webui.schema import Field, Schema

bp = Blueprint("exports", __name__)


def _dir_path(text: str) -> str:
    return export_service.clean_path(core.ctx().namespace, text)


EXPORT_SCHEMA = Schema(
    "Export",
    "One NFS export.",
    (
        Field(
            "name",
            "string",
            "The path clients mount, e.g. /export (a slash, then letters, digits, . _ - /)",
            min_length=1,
            max_length=export_service.NAME_MAX,
            pattern=export_service.NAME_PATTERN,
            example="/export",
            check=export_service.clean_name,
        ),
        Field(
            "path",
            "string",
            "The namespace directory this export shows",
            min_length=1,
            max_length=export_service.PATH_MAX,
            default="/",
            check=_dir_path,
        ),
        Field(
            "clients",
            "string",
            "Clients allowed to mount: comma-separated IP addresses or CIDRs",
            min_length=1,
            max_length=export_service.PATH_MAX,
            default=export_service.ANY_CLIENT,
            check=export_service.clean_clients,
        ),
        Field(
            "access",
            "string",
            "rw (read-write) or ro (read-only)",
            enum=export_service.ACCESS_MODES,
            default="rw",
        ),
        Field(
            "squash",
            "string",
            "Identity mapping: root_squash (root becomes anon), all_squash "
            "(everyone becomes anon) or no_root_squash",
            enum=SQUASH,
            default="root_squash",
        ),
        Field(
            "anon_uid",
            "integer",
            "uid that squashed users get",
            minimum=0,
            maximum=export_service.ID_MAX,
            default=65534,
        ),
        Field(
            "anon_gid",
            "integer",
            "gid that squashed users get",
            minimum=0,
            maximum=export_service.ID_MAX,
            default=65534,
        ),
        Field(
            "trash_days",
            "integer",
            "Days deleted entries stay in the export's trash (0: no trash)",
            minimum=0,
            maximum=export_service.TRASH_DAYS_MAX,
            default=7,
        ),
        Field("enabled", "boolean", "Whether clients may mount it", required=False, default=True),
    ),
)


def list_exports() -> list[dict]:
    return [e.to_dict() for e in export_service.list_exports(core.ctx().catalog)]


def get_export(export_id: int) -> dict:
    return export_service.get(core.ctx().catalog, export_id).to_dict()


def create_export(values: dict, who: str) -> int:
    shingle = core.ctx()
    return export_service.create(shingle.catalog, values, actor=who, namespace=shingle.namespace).id


def update_export(export_id: int, values: dict, who: str) -> dict:
    shingle = core.ctx()
    return export_service.update(
        shingle.catalog, export_id, values, actor=who, namespace=shingle.namespace
    ).to_dict()


def delete_export(export_id: int, who: str) -> None:
    export_service.delete(core.ctx().catalog, export_id, actor=who)


def _form_values() -> dict:
    form: dict[str, object] = dict(request.form)
    form["enabled"] = "enabled" in request.form
    return form


@bp.route("/exports", methods=["GET", "POST"])
@core.login_required
def index():
    form, errs, status = dict(export_service.DEFAULTS), {}, 200
    if request.method == "POST":
        try:
            export_id = create_export(EXPORT_SCHEMA.from_form(request.form), core.actor())
            flash(f"export {export_id} created", "ok")
            return redirect(url_for("exports.index"))
        except core.USER_ERRORS as exc:
            form, errs, status = _form_values(), core.form_errors(exc), 400
    config = core.ctx().config
    from webui.quotas import list_quotas

    return render_template(
        "exports.html",
        exports=list_exports(),
        quotas=list_quotas(),
        form=form,
        errors=errs,
        schema=EXPORT_SCHEMA,
        squash=SQUASH,
        nfs_host=config.get("nfs.host"),
        nfs_port=config.get("nfs.port"),
    ), status


@bp.route("/exports/<int:export_id>", methods=["GET", "POST"])
@core.login_required
def edit(export_id: int):
    try:
        form = get_export(export_id)
    except errors.NotFound:
        abort(404)
    errs, status = {}, 200
    if request.method == "POST":
        try:
            update_export(export_id, EXPORT_SCHEMA.from_form(request.form), core.actor())
            flash(f"export {export_id} saved", "ok")
            return redirect(url_for("exports.index"))
        except core.USER_ERRORS as exc:
            form, errs, status = _form_values(), core.form_errors(exc), 400
    return render_template(
        "export_edit.html",
        export_id=export_id,
        form=form,
        errors=errs,
        schema=EXPORT_SCHEMA,
        squash=SQUASH,
    ), status


@bp.route("/exports/<int:export_id>/delete", methods=["POST"])
@core.login_required
def delete(export_id: int):
    if request.form.get("confirm") != "yes":  # clients lose the mount: the page asks once more
        try:
            name = get_export(export_id)["name"]
        except errors.NotFound:
            abort(404)
        return render_template(
            "confirm.html",
            question=f"Delete export {name}? NFS clients can no longer mount "
            "it; the files stay in the namespace.",
            fields={"confirm": "yes"},
            action=url_for("exports.delete", export_id=export_id),
            cancel=url_for("exports.index"),
        )
    try:
        delete_export(export_id, core.actor())
    except errors.NotFound:
        abort(404)
    flash(f"export {export_id} deleted", "ok")
    return redirect(url_for("exports.index"))
