"""Sign-in and sign-out, with throttled login attempts.

Two throttles: per account in the catalog (shared by every gunicorn worker:
after ``LOCK_AFTER`` failures in a row the account is locked for a time that
doubles with each further failure), and per client address in this process
(``IP_LIMIT`` failures per ``IP_WINDOW_S``), which also covers guessed names."""
from __future__ import annotations

import threading
import time
from collections import defaultdict, deque

from flask import Blueprint, g, redirect, render_template, request, session, url_for
from sqlalchemy import select

from engine import accounts, events
from engine.catalog.models import AdminUser
from webui import core

bp = Blueprint("auth", __name__)
USERS = AdminUser.__table__
LOCK_AFTER = 5
LOCK_BASE_S = 30
LOCK_MAX_S = 15 * 60
IP_LIMIT = 20
IP_WINDOW_S = 300
IP_TRACKED_MAX = 10_000  # a flood of addresses must not grow this process without bound

_ip_failures: dict[str, deque] = defaultdict(deque)
_ip_lock = threading.Lock()


def fingerprint(username: str) -> str | None:
    """A digest of the admin's password hash, kept in the session: a password change (or a removed
    account) ends every other session, which a signed cookie alone could not do."""
    import hashlib
    digest = core.ctx().catalog.read(lambda c: c.execute(select(USERS.c.password_hash)
                                                         .where(USERS.c.username == username)).scalar())
    return hashlib.sha256(digest.encode()).hexdigest()[:32] if digest else None


def admin_for_token(token: str) -> str | None:
    found = accounts.user_for_token(core.ctx().catalog, token) if token else None
    return found[1] if found else None


def _ip_blocked(address: str) -> float:
    """Seconds until this address may try again (0: now)."""
    now = time.monotonic()
    with _ip_lock:
        q = _ip_failures[address]
        while q and q[0] < now - IP_WINDOW_S:
            q.popleft()
        return (q[0] + IP_WINDOW_S - now) if len(q) >= IP_LIMIT else 0.0


def _ip_failed(address: str) -> None:
    now = time.monotonic()
    with _ip_lock:
        if len(_ip_failures) >= IP_TRACKED_MAX:
            for stale in [a for a, q in _ip_failures.items() if not q or q[-1] < now - IP_WINDOW_S]:
                del _ip_failures[stale]
            if len(_ip_failures) >= IP_TRACKED_MAX:  # all recent: forget the oldest half
                oldest = sorted(_ip_failures, key=lambda a: _ip_failures[a][-1])[:IP_TRACKED_MAX // 2]
                for stale in oldest:
                    del _ip_failures[stale]
        _ip_failures[address].append(now)


def _account_lock_s(username: str) -> float:
    catalog = core.ctx().catalog
    until = catalog.read(lambda c: c.execute(select(USERS.c.locked_until_ns).where(USERS.c.username == username))
                         .scalar())
    return max(0.0, (until - time.time_ns()) / 1e9) if until else 0.0


def _after_failure(username: str) -> None:
    """Lock the account once failures pile up; the lock doubles with each further failure."""
    def work(conn):
        row = conn.execute(select(USERS.c.failed_logins).where(USERS.c.username == username)).first()
        if row is None or row.failed_logins < LOCK_AFTER:
            return
        seconds = min(LOCK_BASE_S * 2 ** (row.failed_logins - LOCK_AFTER), LOCK_MAX_S)
        conn.execute(USERS.update().where(USERS.c.username == username)
                     .values(locked_until_ns=time.time_ns() + int(seconds * 1e9)))
        events.record_in(conn, "auth.locked", f"admin {username} locked for {seconds:.0f} s after "
                         f"{row.failed_logins} failed logins", severity="warning", actor="webui")
    core.ctx().catalog.run(work)


def attempt_login(username: str, password: str, address: str) -> tuple[bool, str, int]:
    """(signed in?, message for the form, HTTP status)."""
    catalog = core.ctx().catalog
    wait = _ip_blocked(address)
    if wait:
        return False, f"too many failed logins from {address}: try again in {wait:.0f} s", 429
    wait = _account_lock_s(username)
    if wait:
        _ip_failed(address)
        return False, f"too many failed logins for {username!r}: try again in {wait:.0f} s", 429
    if accounts.verify_login(catalog, username, password) is None:
        _ip_failed(address)
        _after_failure(username)
        events.record(catalog, "auth.login.failed", f"failed login as {username[:64]!r} from {address}",
                      severity="warning", actor=address[:64])
        return False, "wrong user name or password", 401
    catalog.run(lambda c: c.execute(USERS.update().where(USERS.c.username == username).values(locked_until_ns=None)))
    events.record(catalog, "auth.login", f"admin {username} signed in from {address}", actor=username)
    return True, "", 200


@bp.route("/login", methods=["GET", "POST"])
def login():
    error, status = "", 200
    if request.method == "POST":
        username = request.form.get("username", "").strip()
        password = request.form.get("password", "")
        address = request.remote_addr or "unknown"
        if not username or not password:
            error, status = "enter a user name and a password", 400
        else:
            ok, error, status = attempt_login(username, password, address)
            if ok:
                csrf = session.get("csrf")
                session.clear()  # a fresh session on sign-in: no fixation of a pre-login cookie
                session["admin"] = username
                session["v"] = fingerprint(username)
                session["csrf"] = csrf
                session.permanent = True
                target = request.args.get("next") or ""
                # Only local paths: an open redirect would make phishing links look like ours.
                if not target.startswith("/") or target.startswith("//"):
                    target = url_for("dashboard.index")
                return redirect(target)
    return render_template("login.html", error=error, username=request.form.get("username", "")), status


@bp.route("/logout", methods=["POST"])
def logout():
    who = g.get("admin")
    session.clear()
    if who:
        events.record(core.ctx().catalog, "auth.logout", f"admin {who} signed out", actor=who)
    return redirect(url_for("auth.login"))
