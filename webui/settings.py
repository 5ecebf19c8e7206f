"""Settings: the admin's password, other admin accounts, and API tokens for scripts."""

from __future__ import annotations

import hmac
import time

from flask import Blueprint, abort, flash, redirect, render_template, request, url_for

from engine.admin import accounts, admins
from engine.admin.schema import Field, Schema
from engine.base import errors
from webui import core

bp = Blueprint("settings", __name__)

TOKEN_SCHEMA = Schema(
    "ApiToken",
    "A new API token for scripts (shown once).",
    (
        Field(
            "name",
            "string",
            "What the token is for, e.g. grafana or backup-script",
            min_length=1,
            max_length=64,
            pattern=r"[A-Za-z0-9 ._-]+",
            example="grafana",
        ),
        Field(
            "scope",
            "string",
            "read-only: GET only; operator: also jobs, retention runs and drive "
            "actions; admin: also exports, admins, tokens and settings",
            required=False,
            default="read-only",
            enum=accounts.SCOPES,
        ),
        Field(
            "expires_days",
            "integer",
            "Days until the token stops working (0: never)",
            required=False,
            default=90,
            minimum=0,
            maximum=3650,
        ),
    ),
)


def make_token(values: dict, who: str) -> str:
    """A new token from TOKEN_SCHEMA's validated values (defaults filled in)."""
    days = values["expires_days"]
    return accounts.create_token(
        core.ctx().catalog,
        user_id(who),
        values["name"],
        scope=values["scope"],
        expires_s=days * 86400 if days else None,
        actor=who,
    )


ADMIN_SCHEMA = Schema(
    "AdminUser",
    "A new admin account.",
    (
        Field(
            "username",
            "string",
            "Lower-case letters, digits, _ . - (starting with a letter or _)",
            min_length=1,
            max_length=64,
            pattern=accounts.USERNAME_RE.pattern,
            example="alice",
        ),
        Field(
            "password",
            "string",
            f"At least {accounts.MIN_PASSWORD} characters",
            min_length=accounts.MIN_PASSWORD,
            max_length=1024,
        ),
    ),
)
PASSWORD_SCHEMA = Schema(
    "PasswordChange",
    "Change the signed-in admin's password.",
    (
        Field("current", "string", "The current password", min_length=1, max_length=1024),
        Field(
            "new",
            "string",
            f"The new password, at least {accounts.MIN_PASSWORD} characters",
            min_length=accounts.MIN_PASSWORD,
            max_length=1024,
        ),
        Field("confirm", "string", "The new password again", min_length=1, max_length=1024),
    ),
)


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
        raise errors.InvalidArgument(
            "the new password and its confirmation differ: type the same password twice"
        )
    if accounts.verify_login(core.ctx().catalog, username, values["current"]) is None:
        raise errors.InvalidArgument("the current password is wrong")
    from flask import session

    accounts.set_password(
        core.ctx().catalog, username, values["new"], actor=who, keep_session=session.get("sid")
    )


def _page(status=200, **extra):
    return render_template(
        "settings.html",
        tokens=list_tokens(),
        admins=list_admins(),
        now_ns=time.time_ns(),
        new_token=extra.get("new_token"),
        errors=extra.get("errors", {}),
        which=extra.get("which"),
    ), status


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
    flash("password changed: other sessions of this admin are signed out", "ok")
    return redirect(url_for("settings.index"))


@bp.route("/settings/tokens", methods=["POST"])
@core.login_required
def create_token():
    try:
        token = make_token(TOKEN_SCHEMA.from_form(request.form), core.actor())
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
        accounts.create_admin(
            core.ctx().catalog, values["username"], values["password"], actor=core.actor()
        )
    except core.USER_ERRORS as exc:
        return _page(400, errors=core.form_errors(exc), which="admin")
    flash(f"admin {values['username']} created", "ok")
    return redirect(url_for("settings.index"))


@bp.route("/settings/admins/<username>/delete", methods=["POST"])
@core.login_required
def delete_admin(username: str):
    try:
        if username == core.actor():
            raise errors.InvalidArgument("you cannot remove yourself: sign in as another admin")
        accounts.delete_admin(core.ctx().catalog, username, actor=core.actor())
    except errors.NotFound:
        abort(404)
    except core.USER_ERRORS as exc:
        return _page(400, errors=core.form_errors(exc), which="admin")
    flash(f"admin {username} removed; their sessions and API tokens ended", "ok")
    return redirect(url_for("settings.index"))
