"""NFS exports: the path clients mount, which clients (CIDRs), ro/rw, squash and the security
flavours (sec=krb5p:krb5i:krb5:sys).

The pages and the API go through engine.admin.exports (checks, the change and its
event naming the admin, in one catalog transaction); the NFS server reloads
its table from there."""

from __future__ import annotations

from flask import Blueprint, abort, flash, redirect, render_template, request, url_for

from engine.admin import exports as export_service
from engine.admin import nfs_clients as nfs_client_service
from engine.admin.exports import SQUASH_MODES as SQUASH
from engine.base import errors
from webui import core
from webui.crud import CrudApi, engine_calls

bp = Blueprint("exports", __name__)


EXPORT_SCHEMA = export_service.SCHEMA


list_exports, create_export, get_export, update_export, delete_export = engine_calls(
    export_service.list_exports,
    export_service.get,
    export_service.create,
    export_service.update,
    export_service.delete,
)


API = CrudApi(
    "/exports",
    "export_id",
    "exports",
    "NFS export",
    "NFS exports",
    EXPORT_SCHEMA,
    "Export",
    list_exports,
    create_export,
    get_export,
    update_export,
    delete_export,
    article="an",
)


def nfs_clients() -> list[dict]:
    """NFSv4 clients with their principals and delegations (engine.admin.nfs_clients)."""
    return nfs_client_service.list_clients(core.ctx().catalog)


@bp.route("/exports", methods=["GET", "POST"])
@core.login_required
def index():
    form, errs, status = dict(export_service.DEFAULTS), {}, 200
    if request.method == "POST":
        try:
            made = create_export(EXPORT_SCHEMA.from_form(request.form), core.actor())
            flash(f"export {made['id']} created", "ok")
            return redirect(url_for("exports.index"))
        except core.USER_ERRORS as exc:
            form, errs, status = core.posted(EXPORT_SCHEMA), core.form_errors(exc), 400
    config = core.ctx().config
    from webui.quotas import list_quotas

    return render_template(
        "exports.html",
        exports=list_exports(),
        quotas=list_quotas(),
        nfs_clients=nfs_clients(),
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
            form, errs, status = core.posted(EXPORT_SCHEMA), core.form_errors(exc), 400
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
def delete(export_id: int):  # clients lose the mount
    return core.delete_page(
        lambda: get_export(export_id),
        lambda export: delete_export(export_id, core.actor()),
        question=lambda export: (
            f"Delete export {export['name']}? NFS clients can no longer "
            "mount it; the files stay in the namespace."
        ),
        done=lambda export: f"export {export_id} deleted",
        back=lambda export: url_for("exports.index"),
    )
