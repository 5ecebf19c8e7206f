"""Alerts: the list (open first), acknowledge, and the banner every page shows while any alert
is active (engine/admin/alerts.py; the daemon evaluates the sources and delivers mail and
webhooks)."""

from __future__ import annotations

from flask import Blueprint, flash, g, redirect, render_template, url_for

from engine.admin.alerts import ACTIVE, AlertService
from engine.base import errors
from webui import core

bp = Blueprint("alerts", __name__)


def service() -> AlertService:
    return AlertService(core.ctx().catalog)


def acknowledge(alert_id: int, who: str) -> dict:
    return service().acknowledge(alert_id, who).to_dict()


@bp.app_context_processor
def alert_banner() -> dict:
    """``alert_banner``: active alerts by severity, for base.html (signed-in pages only)."""
    if not g.get("admin"):
        return {"alert_banner": None}
    try:
        counts = service().count_active()
    except Exception:  # a page must render even when the catalog has no alerts table yet
        return {"alert_banner": None}
    return {"alert_banner": counts or None}


@bp.route("/alerts")
@core.login_required
def index():
    return render_template("alerts.html", alerts=service().list(), active=ACTIVE)


@bp.route("/alerts/<int:alert_id>/ack", methods=["POST"])
@core.login_required
def ack(alert_id: int):
    try:
        alert = acknowledge(alert_id, core.actor())
        flash(f"alert {alert_id} acknowledged: {alert['message']}", "ok")
    except core.USER_ERRORS as exc:
        if isinstance(exc, errors.NotFound):
            flash(str(exc), "error")
        else:
            flash(str(core.form_errors(exc).popitem()[1]), "error")
    return redirect(url_for("alerts.index"))
