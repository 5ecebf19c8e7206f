"""Events: the audit and activity log (who changed what, drive states, retention, repairs)."""

from __future__ import annotations

from flask import Blueprint, render_template, request

from engine.admin import events
from webui import core

bp = Blueprint("events", __name__)
PAGE = 100


@bp.route("/events")
@core.login_required
def index():
    kind = request.args.get("kind", "").strip()[:64] or None
    before = request.args.get("before", type=int)
    rows = events.recent(core.ctx().catalog, PAGE, kind_prefix=kind, before_id=before)
    older = rows[-1].id if len(rows) == PAGE else None
    return render_template("events.html", events=rows, kind=kind or "", older=older)
