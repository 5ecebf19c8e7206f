"""NFS exports: the path clients mount, which clients (CIDRs), ro/rw and squash.

The NFS server reads the ``exports`` table; a change here is one catalog
transaction plus an event naming the admin."""
from __future__ import annotations

import ipaddress
import re

from flask import Blueprint, abort, flash, redirect, render_template, request, url_for
from sqlalchemy import select

from appliance.nfs.exports import SQUASH_MODES as SQUASH
from engine import errors
from engine.catalog.models import DIR, Export
from engine.events import record_in
from webui import core
from webui.schema import Field, Schema

bp = Blueprint("exports", __name__)
EXPORTS = Export.__table__
MAX_CLIENTS = 64


def _clients(text: str) -> str:
    """'10.0.0.0/8, 192.168.1.5' -> '10.0.0.0/8,192.168.1.5/32' (each checked)."""
    parts = [p.strip() for p in re.split(r"[,\s]+", text) if p.strip()]
    if not parts:
        raise ValueError(f"{text!r}: expected at least one client address or CIDR, e.g. 10.0.0.0/8")
    if len(parts) > MAX_CLIENTS:
        raise ValueError(f"{len(parts)} client entries: expected at most {MAX_CLIENTS}")
    clean = []
    for part in parts:
        try:
            clean.append(str(ipaddress.ip_network(part, strict=False)))
        except ValueError:
            raise ValueError(f"{part!r}: expected an IP address or CIDR such as 10.0.0.0/8 or fd00::/8") from None
    return ",".join(clean)


def _export_name(text: str) -> str:
    """'/data//sets/' -> '/data/sets', the form the NFS server compares."""
    parts = [p for p in text.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise ValueError(f"name = {text!r}: expected no '.' or '..' components")
    return "/" + "/".join(parts)


def _dir_path(text: str) -> str:
    from engine.trash import join_path, split_path
    try:
        parts = split_path(text, "export path")
    except errors.InvalidArgument as exc:
        raise ValueError(exc.strerror) from None
    path = join_path(parts)
    try:
        attr = core.ctx().namespace.resolve(path)
    except errors.FsError:
        raise ValueError(f"{path!r}: expected an existing directory in the namespace") from None
    if attr.type != DIR:
        raise ValueError(f"{path!r} is not a directory: expected a directory to export")
    return path


EXPORT_SCHEMA = Schema("Export", "One NFS export.", (
    Field("name", "string", "The path clients mount, e.g. /export (a slash, then letters, digits, . _ - /)",
          min_length=1, max_length=255, pattern=r"/[A-Za-z0-9._/-]*", example="/export", check=_export_name),
    Field("path", "string", "The namespace directory this export shows", min_length=1, max_length=4096,
          default="/", check=_dir_path),
    Field("clients", "string", "Clients allowed to mount: comma-separated IP addresses or CIDRs",
          min_length=1, max_length=4096, default="0.0.0.0/0,::/0", check=_clients),
    Field("access", "string", "rw (read-write) or ro (read-only)", enum=("rw", "ro"), default="rw"),
    Field("squash", "string", "Identity mapping: root_squash (root becomes anon), all_squash (everyone becomes "
          "anon) or no_root_squash", enum=SQUASH, default="root_squash"),
    Field("anon_uid", "integer", "uid that squashed users get", minimum=0, maximum=2**32 - 1, default=65534),
    Field("anon_gid", "integer", "gid that squashed users get", minimum=0, maximum=2**32 - 1, default=65534),
    Field("trash_days", "integer", "Days deleted entries stay in the export's trash (0: no trash)",
          minimum=0, maximum=3650, default=7),
    Field("enabled", "boolean", "Whether clients may mount it", required=False, default=True),
))


def list_exports() -> list[dict]:
    rows = core.ctx().catalog.read(lambda c: c.execute(select(EXPORTS).order_by(EXPORTS.c.name)).all())
    return [dict(r._mapping) for r in rows]


def get_export(export_id: int) -> dict:
    row = core.ctx().catalog.read(lambda c: c.execute(select(EXPORTS).where(EXPORTS.c.id == export_id)).first())
    if row is None:
        raise errors.NotFound(f"no export with id {export_id}")
    return dict(row._mapping)


def _describe(values: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in values.items())


def create_export(values: dict, who: str) -> int:
    def work(conn):
        if conn.execute(select(EXPORTS.c.id).where(EXPORTS.c.name == values["name"])).first():
            raise errors.Exists(f"export {values['name']!r} exists: choose another name or edit it")
        export_id = conn.execute(EXPORTS.insert().values(**values)).inserted_primary_key[0]
        record_in(conn, "export.create", f"export {values['name']} created: {_describe(values)}", actor=who,
                  details={"export_id": export_id, **values})
        return export_id
    return core.ctx().catalog.run(work)


def update_export(export_id: int, values: dict, who: str) -> dict:
    def work(conn):
        if "name" in values and conn.execute(select(EXPORTS.c.id).where(
                EXPORTS.c.name == values["name"], EXPORTS.c.id != export_id)).first():
            raise errors.Exists(f"export {values['name']!r} exists: choose another name")
        if not conn.execute(EXPORTS.update().where(EXPORTS.c.id == export_id).values(**values)).rowcount:
            raise errors.NotFound(f"no export with id {export_id}")
        record_in(conn, "export.update", f"export {export_id} changed: {_describe(values)}", actor=who,
                  details={"export_id": export_id, **values})
        return dict(conn.execute(select(EXPORTS).where(EXPORTS.c.id == export_id)).one()._mapping)
    return core.ctx().catalog.run(work)


def delete_export(export_id: int, who: str) -> None:
    def work(conn):
        row = conn.execute(select(EXPORTS.c.name).where(EXPORTS.c.id == export_id)).first()
        if row is None:
            raise errors.NotFound(f"no export with id {export_id}")
        conn.execute(EXPORTS.delete().where(EXPORTS.c.id == export_id))
        record_in(conn, "export.delete", f"export {row.name} deleted", actor=who, severity="warning",
                  details={"export_id": export_id})
    core.ctx().catalog.run(work)


def _form_values() -> dict:
    form = dict(request.form)
    form["enabled"] = "enabled" in request.form
    return form


@bp.route("/exports", methods=["GET", "POST"])
@core.login_required
def index():
    form, errs, status = {"path": "/", "clients": "0.0.0.0/0,::/0", "access": "rw", "squash": "root_squash",
                          "anon_uid": 65534, "anon_gid": 65534, "trash_days": 7, "enabled": True}, {}, 200
    if request.method == "POST":
        try:
            export_id = create_export(EXPORT_SCHEMA.from_form(request.form), core.actor())
            flash(f"export {export_id} created", "ok")
            return redirect(url_for("exports.index"))
        except core.USER_ERRORS as exc:
            form, errs, status = _form_values(), core.form_errors(exc), 400
    config = core.ctx().config
    return render_template("exports.html", exports=list_exports(), form=form, errors=errs,
                           schema=EXPORT_SCHEMA, squash=SQUASH, nfs_host=config.get("nfs.host"),
                           nfs_port=config.get("nfs.port")), status


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
    return render_template("export_edit.html", export_id=export_id, form=form, errors=errs,
                           schema=EXPORT_SCHEMA, squash=SQUASH), status


@bp.route("/exports/<int:export_id>/delete", methods=["POST"])
@core.login_required
def delete(export_id: int):
    if request.form.get("confirm") != "yes":  # clients lose the mount: the page asks once more
        try:
            name = get_export(export_id)["name"]
        except errors.NotFound:
            abort(404)
        return render_template("confirm.html", question=f"Delete export {name}? NFS clients can no longer mount "
                               "it; the files stay in the namespace.", fields={"confirm": "yes"},
                               action=url_for("exports.delete", export_id=export_id), cancel=url_for("exports.index"))
    try:
        delete_export(export_id, core.actor())
    except errors.NotFound:
        abort(404)
    flash(f"export {export_id} deleted", "ok")
    return redirect(url_for("exports.index"))
