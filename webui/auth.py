"""Sign-in and sign-out: server-side sessions, a throttle that backs off, local redirects only.

The signed cookie carries a random session id (and the CSRF token); the
session itself is a row of the catalog (engine.admin.accounts), so signing out ends
it for every copy of the cookie. Failed sign-ins back off per address, per
account and per account from one address (engine.admin.accounts.THROTTLES); a client
inside its back-off gets 429 with Retry-After, and the right password works
again once it has passed."""

from __future__ import annotations

import math
import re
from urllib.parse import urlsplit

from flask import Blueprint, g, redirect, render_template, request, session, url_for

from engine.admin import accounts, events
from webui import core

bp = Blueprint("auth", __name__)
CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")


def safe_next(target: str | None) -> str | None:
    """``target`` if it is a path of this site, else None.

    Browsers drop tabs and newlines from URLs (/%09/evil.example becomes //evil.example) and read
    a backslash as a slash, so control characters go before the check and a backslash fails it."""
    target = CONTROL_CHARS.sub("", target or "")
    if not target.startswith("/") or target.startswith("//") or "\\" in target:
        return None
    parts = urlsplit(target)
    if parts.scheme or parts.netloc:
        return None
    return target


def token_identity(token: str) -> accounts.TokenIdentity | None:
    return accounts.token_identity(core.ctx().catalog, token) if token else None


def session_admin() -> str | None:
    """The admin of this request's session cookie, if that session is still live."""
    session_id = session.get("sid")
    if not session_id:
        return None
    who = accounts.session_admin(core.ctx().catalog, session_id)
    if who is None:
        session.pop("sid", None)  # ended, expired, or the admin is gone
    return who


def attempt_login(username: str, password: str, address: str) -> tuple[int | None, str, int, int]:
    """(user id if signed in, message for the form, HTTP status, Retry-After seconds)."""
    catalog = core.ctx().catalog
    wait = accounts.login_wait_s(catalog, username, address)
    if wait > 0:
        seconds = math.ceil(wait)
        return None, f"too many failed logins: try again in {seconds} s", 429, seconds
    user_id = accounts.verify_login(catalog, username, password)
    if user_id is None:
        events.record(
            catalog,
            "auth.login.failed",
            f"failed login as {username[:64]!r} from {address}",
            severity="warning",
            actor=address[:64],
        )
        wait = accounts.login_failed(catalog, username, address, actor=address)
        if wait > 0:
            seconds = math.ceil(wait)
            return (
                None,
                f"wrong user name or password; too many failed logins: try again in {seconds} s",
                429,
                seconds,
            )
        return None, "wrong user name or password", 401, 0
    accounts.login_succeeded(catalog, username, address)
    events.record(
        catalog, "auth.login", f"admin {username} signed in from {address}", actor=username
    )
    return user_id, "", 200, 0


@bp.route("/login", methods=["GET", "POST"])
def login():
    error, status, retry_after = "", 200, 0
    if request.method == "POST":
        username = request.form.get("username", "").strip()
        password = request.form.get("password", "")
        address = request.remote_addr or "unknown"
        if not username or not password:
            error, status = "enter a user name and a password", 400
        else:
            user_id, error, status, retry_after = attempt_login(username, password, address)
            if user_id is not None:
                csrf = session.get("csrf")
                session.clear()  # a fresh session on sign-in: no fixation of a pre-login cookie
                session["sid"] = accounts.open_session(core.ctx().catalog, user_id, address)
                session["csrf"] = csrf
                session.permanent = True
                # Only paths of this site: an open redirect makes phishing links look like ours.
                return redirect(safe_next(request.args.get("next")) or url_for("dashboard.index"))
    page = render_template("login.html", error=error, username=request.form.get("username", ""))
    headers = {"Retry-After": str(retry_after)} if retry_after else {}
    return page, status, headers


@bp.route("/logout", methods=["POST"])
def logout():
    who = g.get("admin")
    if session.get("sid"):
        accounts.end_session(core.ctx().catalog, session["sid"])
    session.clear()
    if who:
        events.record(core.ctx().catalog, "auth.logout", f"admin {who} signed out", actor=who)
    return redirect(url_for("auth.login"))
