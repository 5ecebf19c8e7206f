"""The admin web UI's Flask application factory.

``create_app()`` reads the config named by $SHINGLE_CONFIG (gunicorn runs
``webui.app:create_app()``); tests pass a loaded Config. The app opens the
catalog and a namespace WITHOUT a data path: the web UI changes metadata and
asks the daemon (through the catalog) for anything that touches drives."""

from __future__ import annotations

import datetime
import importlib
import os
import secrets
from pathlib import Path

from flask import Flask, current_app, g, request

from appliance import facade
from engine.admin import accounts
from engine.catalog import CatalogUnavailable
from webui import core

CATALOG_RETRY_AFTER_S = 5  # what a 503 asks a client to wait while the catalog is away
BLUEPRINTS = (
    "auth",
    "dashboard",
    "drives",
    "hosts",
    "retention",
    "trash",
    "datasets",
    "exports",
    "quotas",
    "smb",
    "tiers",
    "jobs",
    "events",
    "settings",
    "api",
    "metrics",
    "alerts",
)


def _secret_key(path: Path) -> bytes:
    """The session-signing key; created once (O_EXCL, so gunicorn workers agree on one key)."""
    try:
        return path.read_text().strip().encode()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip().encode()
    with os.fdopen(fd, "w") as fh:
        fh.write(secrets.token_hex(32) + "\n")
    return path.read_text().strip().encode()


def create_app(config: facade.Config | str | os.PathLike | None = None) -> Flask:
    from appliance.facade import Appliance

    config = _config(config)
    appliance = Appliance(config, with_data=False)

    app = Flask(__name__)
    tls = bool(config.get("webui.tls_cert_file"))
    app.config.update(
        SECRET_KEY=_secret_key(config.resolve("webui.secret_key_file")),
        SESSION_COOKIE_NAME="shingle_session",
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Strict",
        SESSION_COOKIE_SECURE=tls,  # over TLS the cookie never travels in clear
        # The cookie's lifetime; the session row (engine.admin.accounts) decides whether it is still
        # live.
        PERMANENT_SESSION_LIFETIME=datetime.timedelta(seconds=accounts.SESSION_S),
        MAX_CONTENT_LENGTH=1 << 20,
        SHINGLE_TLS=tls,
    )
    app.extensions["shingle"] = core.Shingle(
        config=config,
        catalog=appliance.catalog,
        namespace=appliance.namespace,
        smartctl=config.get("smart.smartctl"),
    )

    for name in BLUEPRINTS:
        module = importlib.import_module(f"webui.{name}")
        app.register_blueprint(module.bp)
    app.before_request(identify_and_check_csrf)
    # Globals (not a context processor) so that imported macros (_forms.html) see them too.
    app.jinja_env.globals.update(
        csrf_token=core.csrf_token,
        fmt_size=core.fmt_size,
        fmt_time=core.fmt_time,
        fmt_duration=core.fmt_duration,
        fmt_duration_field=core.fmt_duration_field,
        fmt_value=core.fmt_value,
    )
    app.context_processor(lambda: {"admin": g.get("admin")})
    app.after_request(security_headers)
    _register_error_handlers(app)
    return app


def _config(config: facade.Config | str | os.PathLike | None) -> facade.Config:
    """The config given, or loaded from the path given, else from $SHINGLE_CONFIG."""
    if config is None:
        path = os.environ.get("SHINGLE_CONFIG")
        if not path:
            raise facade.ConfigError(
                "SHINGLE_CONFIG", None, "the path of shingle.toml in the environment"
            )
        return facade.load(path)
    if not isinstance(config, facade.Config):
        return facade.load(config)
    return config


def identify_and_check_csrf():
    """Who calls (an API token, else the session's admin) and, for a state-changing request
    in a browser session, its CSRF token: None to go on, else the refusal."""
    from webui import auth

    g.admin = None
    g.via_token = False
    g.scope = None
    header = request.headers.get("Authorization", "")
    if header.startswith("Bearer ") and core.is_api():
        identity = auth.token_identity(header[len("Bearer ") :].strip())
        if identity is None:
            return core.api_error(
                "API token not recognised or expired: create one on the settings page", 401
            )
        g.admin, g.via_token, g.scope = identity.username, True, identity.scope
        if identity.scope == "read-only" and request.method not in ("GET", "HEAD"):
            return core.api_error(
                f"this API token is read-only: {request.method} needs an operator or admin token",
                403,
            )
        return None  # a bearer token is not sent by browsers on their own, so no CSRF risk
    g.admin = auth.session_admin()
    g.scope = "admin" if g.admin else None  # a signed-in admin may do everything
    if request.method in core.STATE_CHANGING:
        if core.is_api() and not g.admin:
            return core.api_error(
                "authentication required: sign in or send Authorization: Bearer <API token>",
                401,
            )
        if not core.csrf_ok():
            message = (
                "CSRF token missing or wrong: reload the page and submit again "
                f"(API clients with a session send the {core.CSRF_HEADER} header)"
            )
            if core.is_api():
                return core.api_error(message, 403)
            return message, 400
    return None


def security_headers(response):
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("X-Frame-Options", "DENY")
    response.headers.setdefault("Referrer-Policy", "same-origin")
    if current_app.config["SHINGLE_TLS"]:
        response.headers.setdefault("Strict-Transport-Security", "max-age=31536000")
    if (
        request.endpoint != "static"
    ):  # pages and API answers hold admin data: keep them out of caches
        response.headers.setdefault("Cache-Control", "no-store")
    response.headers.setdefault(
        "Content-Security-Policy",
        "default-src 'self'; img-src 'self' data:; style-src 'self'; "
        "script-src 'self'; form-action 'self'; frame-ancestors 'none'",
    )
    return response


def _register_error_handlers(app: Flask) -> None:
    """API calls get a JSON error; pages keep Flask's, except a catalog outage (a short 503)."""

    @app.errorhandler(404)
    def not_found(exc):
        if core.is_api():
            return core.api_error(f"no such API endpoint: {request.method} {request.path}", 404)
        return exc

    @app.errorhandler(405)
    def not_allowed(exc):
        if core.is_api():
            return core.api_error(f"method {request.method} not allowed on {request.path}", 405)
        return exc

    @app.errorhandler(413)
    def too_large(exc):
        return core.api_error(
            f"request body larger than {app.config['MAX_CONTENT_LENGTH']} bytes", 413
        )

    @app.errorhandler(CatalogUnavailable)
    def catalog_unavailable(exc):
        # no traceback per request: the catalog's outage log tells the outage (start, a count
        # per interval, its end) in this process as in the daemon
        if core.is_api():
            response = core.api_error(f"the catalog is unavailable: {exc}", 503)
        else:
            response = app.response_class(
                "The catalog is unavailable; try again in a moment.\n",
                status=503,
                mimetype="text/plain",
            )
        response.headers["Retry-After"] = str(CATALOG_RETRY_AFTER_S)
        return response

    @app.errorhandler(500)
    def internal(exc):
        if core.is_api():
            return core.api_error("internal error: see the web UI's log", 500)
        return exc
