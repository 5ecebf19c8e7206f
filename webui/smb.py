"""SMB: shares (a namespace folder Samba serves, to which clients and users) and SMB users.

The pages and the API go through engine.admin.smb (checks, the change and its event naming the
admin, in one catalog transaction); the daemon rewrites smb.conf from there every 2 s
(appliance/smb/samba.py), so a change reaches smbd without a signal. Passwords go straight to
Samba's passdb under DATA_DIR/smb with pdbedit, from this process: it runs as the same user as
the daemon and finds the same folder through the config's data_dir. smbd's health and sessions
come from smbstatus over the daemon's smb.conf."""

from __future__ import annotations

from flask import Blueprint, abort, flash, redirect, render_template, request, url_for

from appliance.facade import SambaLayout, SambaPassdb, smb_report
from engine.admin import smb as smb_service
from engine.base import errors
from webui import core
from webui.crud import CrudApi, engine_calls

bp = Blueprint("smb", __name__)


SHARE_SCHEMA = smb_service.SHARE_SCHEMA
USER_SCHEMA = smb_service.USER_SCHEMA
PASSWORD_SCHEMA = smb_service.PASSWORD_SCHEMA


def layout() -> SambaLayout:
    return SambaLayout.for_data_dir(core.ctx().config.data_dir)


def passdb() -> SambaPassdb:
    return SambaPassdb(layout(), core.ctx().catalog)


# -- what the page and the API share ---------------------------------------------------------
list_shares, create_share, get_share, update_share, delete_share = engine_calls(
    smb_service.list_shares,
    smb_service.get_share,
    smb_service.create_share,
    smb_service.update_share,
    smb_service.delete_share,
)


SHARE_API = CrudApi(
    "/smb/shares",
    "share_id",
    "smb",
    "SMB share",
    "SMB shares",
    SHARE_SCHEMA,
    "SmbShare",
    list_shares,
    create_share,
    get_share,
    update_share,
    delete_share,
    article="an",
    summary={
        "create": "Create an SMB share (smbd serves it within 2 s)",
        "delete": "Delete an SMB share (the files stay)",
    },
)


def list_users() -> list[dict]:
    return [u.to_dict() for u in smb_service.list_users(core.ctx().catalog)]


def get_user(name: str) -> dict:
    return smb_service.get_user(core.ctx().catalog, name).to_dict()


def create_user(values: dict, who: str) -> dict:
    return smb_service.create_user(
        core.ctx().catalog,
        values["name"],
        values["password"],
        passdb=passdb(),
        actor=who,
        uid=values.get("uid"),
        gid=values.get("gid"),
    ).to_dict()


def set_password(name: str, password: str, who: str) -> None:
    smb_service.set_password(core.ctx().catalog, name, password, passdb=passdb(), actor=who)


def delete_user(name: str, who: str) -> None:
    smb_service.delete_user(core.ctx().catalog, name, passdb=passdb(), actor=who)


def status() -> dict:
    """smbd's health and sessions, and how many shares and users the catalog holds (what
    `shingle status` shows)."""
    shingle = core.ctx()
    return smb_report(shingle.config.data_dir, shingle.catalog)


# -- pages -------------------------------------------------------------------------------------
def _page(share_form=None, share_errors=None, user_form=None, user_errors=None, status_code=200):
    return render_template(
        "smb.html",
        shares=list_shares(),
        users=list_users(),
        smb=status(),
        share_form=share_form if share_form is not None else dict(smb_service.SHARE_DEFAULTS),
        share_errors=share_errors or {},
        user_form=user_form or {},
        user_errors=user_errors or {},
        share_schema=SHARE_SCHEMA,
        user_schema=USER_SCHEMA,
    ), status_code


@bp.route("/smb", methods=["GET"])
@core.login_required
def index():
    return _page()


@bp.route("/smb/shares", methods=["POST"])
@core.login_required
def add_share():
    try:
        share = create_share(SHARE_SCHEMA.from_form(request.form), core.actor())
    except core.USER_ERRORS as exc:
        return _page(
            share_form=core.posted(SHARE_SCHEMA),
            share_errors=core.form_errors(exc),
            status_code=400,
        )
    flash(f"SMB share {share['name']} created", "ok")
    return redirect(url_for("smb.index"))


@bp.route("/smb/shares/<int:share_id>", methods=["GET", "POST"])
@core.login_required
def edit_share(share_id: int):
    try:
        form = get_share(share_id)
    except errors.NotFound:
        abort(404)
    errs, status_code = {}, 200
    if request.method == "POST":
        try:
            share = update_share(share_id, SHARE_SCHEMA.from_form(request.form), core.actor())
            flash(f"SMB share {share['name']} saved", "ok")
            return redirect(url_for("smb.index"))
        except core.USER_ERRORS as exc:
            form, errs, status_code = core.posted(SHARE_SCHEMA), core.form_errors(exc), 400
    return render_template(
        "smb_share_edit.html", share_id=share_id, form=form, errors=errs, schema=SHARE_SCHEMA
    ), status_code


@bp.route("/smb/shares/<int:share_id>/delete", methods=["POST"])
@core.login_required
def remove_share(share_id: int):  # connected clients lose the share
    return core.delete_page(
        lambda: get_share(share_id),
        lambda share: delete_share(share_id, core.actor()),
        question=lambda share: (
            f"Delete SMB share {share['name']}? Clients can no longer "
            "connect to it; the files stay in the namespace."
        ),
        done=lambda share: f"SMB share {share['name']} deleted",
        back=lambda share: url_for("smb.index"),
    )


@bp.route("/smb/users", methods=["POST"])
@core.login_required
def add_user():
    try:
        user = create_user(USER_SCHEMA.from_form(request.form), core.actor())
    except core.USER_ERRORS as exc:
        form = {k: v for k, v in request.form.items() if k != "password"}  # never echoed back
        return _page(user_form=form, user_errors=core.form_errors(exc), status_code=400)
    flash(f"SMB user {user['name']} added (uid {user['uid']}, gid {user['gid']})", "ok")
    return redirect(url_for("smb.index"))


@bp.route("/smb/users/<name>/password", methods=["POST"])
@core.login_required
def change_password(name: str):
    try:
        get_user(name)
    except errors.NotFound:
        abort(404)
    try:
        set_password(name, PASSWORD_SCHEMA.from_form(request.form)["password"], core.actor())
    except core.USER_ERRORS as exc:
        flash(f"SMB user {name}: {core.error_message(exc)}", "error")
        return redirect(url_for("smb.index"))
    flash(f"SMB user {name}: password changed", "ok")
    return redirect(url_for("smb.index"))


@bp.route("/smb/users/<name>/delete", methods=["POST"])
@core.login_required
def remove_user(name: str):
    return core.delete_page(
        lambda: get_user(name),
        lambda user: delete_user(name, core.actor()),
        question=lambda user: (
            f"Remove SMB user {name}? They can no longer connect; their files keep their owner."
        ),
        done=lambda user: f"SMB user {name} removed",
        back=lambda user: url_for("smb.index"),
    )
