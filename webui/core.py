"""What every blueprint shares: the appliance handle, the signed-in admin, CSRF, errors.

``ctx()`` is the per-process handle (config, catalog, namespace without a data
path: the web UI never touches drives). ``g.admin`` is the signed-in admin's
name, from the session cookie or an API token (``Authorization: Bearer``)."""

from __future__ import annotations

import functools
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flask import (
    abort,
    current_app,
    flash,
    g,
    jsonify,
    redirect,
    render_template,
    request,
    session,
    url_for,
)

from engine.admin import health
from engine.admin.schema import FieldError, Schema, ValidationError
from engine.base import errors, units

STATE_CHANGING = ("POST", "PUT", "PATCH", "DELETE")
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "X-CSRF-Token"


@dataclass
class Shingle:
    config: Any
    catalog: Any
    namespace: Any
    smartctl: str
    smart: health.SmartCache = field(default_factory=health.SmartCache)  # readings, kept a while
    _policies: dict | None = None
    retention: Any = None  # the RetentionService, made on first use

    @property
    def policies(self) -> dict:
        """Band-class policies, built once (building them instantiates pyeclib codecs)."""
        if self._policies is None:
            self._policies = self.config.policies()
        return self._policies

    def close(self) -> None:
        self.catalog.close()


def ctx() -> Shingle:
    return current_app.extensions["shingle"]


def actor() -> str:
    """The admin behind this request, as events name them."""
    return g.get("admin") or "anonymous"


def csrf_token() -> str:
    token = session.get("csrf")
    if not token:
        token = session["csrf"] = secrets.token_urlsafe(32)
    return token


def csrf_ok() -> bool:
    expected = session.get("csrf")
    given = request.form.get(CSRF_FIELD) if request.form else None
    given = given or request.headers.get(CSRF_HEADER)
    return bool(expected and given and hmac.compare_digest(expected, given))


def is_api() -> bool:
    return request.path.startswith("/api/")


def api_error(message: str, status: int, **extra):
    response = jsonify({"error": message, **extra})
    response.status_code = status
    return response


def login_required(view):
    """Pages: a signed-in admin or a redirect to /login; API: a session or token, else 401."""

    @functools.wraps(view)
    def wrapper(*args, **kwargs):
        if not g.get("admin"):
            if is_api():
                return api_error(
                    "authentication required: sign in or send Authorization: Bearer <API token>",
                    401,
                )
            return redirect(
                url_for(
                    "auth.login", next=request.full_path if request.query_string else request.path
                )
            )
        return view(*args, **kwargs)

    return wrapper


STATUS_OF = {
    errors.NotFound: 404,
    errors.Exists: 409,
    errors.NotEmpty: 409,
    errors.AccessDenied: 403,
    errors.NotPermitted: 403,
    errors.InvalidArgument: 400,
    errors.NotADirectory: 400,
    errors.IsADirectory: 400,
    errors.NameTooLong: 400,
    errors.StaleHandle: 409,
    errors.NoSpace: 507,
    errors.QuotaExceeded: 507,  # a hard quota of the tree
    errors.NoRedundancy: 503,  # too few drives take writes: may pass when one returns
}


def error_status(exc: Exception) -> int:
    for cls in type(exc).__mro__:
        if cls in STATUS_OF:
            return STATUS_OF[cls]
    return 500


def error_message(exc: Exception) -> str:
    if isinstance(exc, errors.FsError):
        return exc.strerror or str(exc)
    return str(exc)


USER_ERRORS = (errors.FsError, ValidationError, ValueError)


def api_failure(exc: Exception):
    """A user-fixable failure as JSON {"error": message} with the right status."""
    if isinstance(exc, (ValidationError, FieldError)):
        return api_error(str(exc), 400, fields=form_errors(exc))
    if isinstance(exc, errors.FsError):
        return api_error(error_message(exc), error_status(exc))
    return api_error(str(exc), 400)


def posted(schema: Schema) -> dict[str, Any]:
    """The form as posted, to show again with its errors: an unchecked checkbox sends
    nothing, so each boolean field of ``schema`` is whether it came."""
    form: dict[str, Any] = dict(request.form)
    for f in schema.fields:
        if f.type == "boolean":
            form[f.name] = f.name in request.form
    return form


def confirm_page(question: str, action: str, cancel: str, fields: dict | None = None):
    """The page that asks once more before a destructive change (confirm.html, no JavaScript
    needed): its form posts ``fields`` and confirm=yes to ``action`` again."""
    return render_template(
        "confirm.html",
        question=question,
        action=action,
        cancel=cancel,
        fields={**(fields or {}), "confirm": "yes"},
    )


def delete_page(
    find: Callable[[], Any],
    remove: Callable[[Any], None],
    *,
    question: Callable[[Any], str],
    done: Callable[[Any], str],
    back: Callable[[Any], str],
):
    """A page's delete of an admin object, asked once more first (a stray click must not drop
    it): 404 when ``find`` finds nothing; without confirm=yes the question, whose form posts
    here again; with it ``remove``, the message ``done`` and back to the ``back`` page. Each
    takes what ``find`` returned."""
    try:
        found = find()
        if request.form.get("confirm") != "yes":
            return confirm_page(question(found), request.script_root + request.path, back(found))
        remove(found)
    except errors.NotFound:
        abort(404)
    flash(done(found), "ok")
    return redirect(back(found))


def form_errors(exc: Exception) -> dict[str, str]:
    """Field -> message for showing next to form inputs ("" = the whole form)."""
    if isinstance(exc, ValidationError):
        return dict(exc.errors)
    if isinstance(exc, FieldError) and exc.field != "fields":
        return {exc.field: str(exc)}  # the engine's check of one field (a path's folder, ...)
    return {"": error_message(exc)}


def fmt_size(n) -> str:
    if n is None:
        return "–"
    return units.format_size(int(n))


def fmt_duration(seconds) -> str:
    if seconds is None:
        return "–"
    return units.format_duration(float(seconds))


def fmt_duration_field(value) -> str:
    """A duration form field's value: seconds as "30 d" when that reads back exactly, else
    "<n> s"; text (a rejected entry shown again) as it was typed."""
    if value is None or value == "":
        return ""
    if isinstance(value, str):
        return value
    shown = units.format_duration(value)
    try:
        return shown if units.parse_duration(shown) == value else f"{value:g} s"
    except ValueError:
        return f"{value:g} s"


def fmt_time(ns) -> str:
    if not ns:
        return "–"
    import datetime

    return datetime.datetime.fromtimestamp(ns / 1e9, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def fmt_value(key: str, value):
    """A job result's field: sizes and durations in human units (engine.base.units.format_value)."""
    return units.format_value(key, value)
