"""Settings: the admin's password, other admin accounts, and API tokens for scripts."""
from __future__ import annotations

import hmac

from flask import Blueprint, abort, flash, redirect, render_template, request, url_for

from engine import accounts, admins, errors
from webui import core
from webui.schema import Field, Schema

bp = Blueprint("settings", __name__)

TOKEN_SCHEMA = Schema("ApiToken", "A new API token for scripts (shown once).", (
    Field("name", "string", "What the token is for, e.g. grafana or backup-script", min_length=1, max_length=64,
          pattern=r"[A-Za-z0-9 ._-]+", example="grafana"),
))
ADMIN_SCHEMA = Schema("AdminUser", "A new admin account.", (
    Field("username", "string", "Lower-case letters, digits, _ . - (starting with a letter or _)", min_length=1,
          max_length=64, pattern=accounts.USERNAME_RE.pattern, example="alice"),
    Field("password", "string", f"At least {accounts.MIN_PASSWORD} characters", min_length=accounts.MIN_PASSWORD,
          max_length=1024),
))
PASSWORD_SCHEMA = Schema("PasswordChange", "Change the signed-in admin's password.", (
    Field("current", "string", "The current password", min_length=1, max_length=1024),
    Field("new", "string", f"The new password, at least {accounts.MIN_PASSWORD} characters",
          min_length=accounts.MIN_PASSWORD, max_length=1024),
    Field("confirm", "string", "The new password again", min_length=1, max_length=1024),
))


def user_id(username: str) -> int:
    return admins.user_id(core.ctx().catalog, username)


def list_tokens() -> list[dict]:
    return admins.list_tokens(core.ctx().catalog)


def revoke_token(token_id: int, who: str) -> None:
    admins.revoke_token(core.ctx().catalog, token_id, actor=who)


def list_admins() -> list[dict]:
    return admins.list_admins(core.ctx().catalog)


def change_password(username: str, values: dict, who: str) -> None:
    if not hmac.compare_digest(values["new"], values["confirm"]):
        raise errors.InvalidArgument("the new password and its confirmation differ: type the same password twice")
    if accounts.verify_login(core.ctx().catalog, username, values["current"]) is None:
        raise errors.InvalidArgument("the current password is wrong")
    accounts.set_password(core.ctx().catalog, username, values["new"], actor=who)


def _page(status=200, **extra):
    return render_template("settings.html", tokens=list_tokens(), admins=list_admins(),
                           new_token=extra.get("new_token"), errors=extra.get("errors", {}),
                           which=extra.get("which")), status


@bp.route("/settings")
@core.login_required
def index():
    return _page()


@bp.route("/settings/password", methods=["POST"])
@core.login_required
def password():
    try:
        change_password(core.actor(), PASSWORD_SCHEMA.from_form(request.form), core.actor())
    except core.USER_ERRORS as exc:
        return _page(400, errors=core.form_errors(exc), which="password")
    from flask import session
    from webui.auth import fingerprint
    session["v"] = fingerprint(core.actor())  # this session stays; every other one ends
    flash("password changed: other sessions of this admin are signed out", "ok")
    return redirect(url_for("settings.index"))


@bp.route("/settings/tokens", methods=["POST"])
@core.login_required
def create_token():
    try:
        values = TOKEN_SCHEMA.from_form(request.form)
        token = accounts.create_token(core.ctx().catalog, user_id(core.actor()), values["name"], actor=core.actor())
    except core.USER_ERRORS as exc:
        return _page(400, errors=core.form_errors(exc), which="token")
    return _page(201, new_token=token)


@bp.route("/settings/tokens/<int:token_id>/revoke", methods=["POST"])
@core.login_required
def revoke(token_id: int):
    try:
        revoke_token(token_id, core.actor())
    except errors.NotFound:
        abort(404)
    flash(f"API token {token_id} revoked", "ok")
    return redirect(url_for("settings.index"))


@bp.route("/settings/admins", methods=["POST"])
@core.login_required
def create_admin():
    try:
        values = ADMIN_SCHEMA.from_form(request.form)
        accounts.create_admin(core.ctx().catalog, values["username"], values["password"], actor=core.actor())
    except core.USER_ERRORS as exc:
        return _page(400, errors=core.form_errors(exc), which="admin")
    flash(f"admin {values['username']} created", "ok")
    return redirect(url_for("settings.index"))
