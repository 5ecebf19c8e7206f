"""Tiers: band-class parameters, tiering thresholds and paths pinned to a class.

Band-class geometry comes from shingle.toml (validated at load; changing k/m
under existing stripes is a config change, not a click). Tiering thresholds
live in the catalog's settings as ``tiering.<TieringPolicy field>`` (seconds,
as engine.lifecycle.tiering.TieringPolicy takes them), and pinned paths as
``tiering.path_rules`` (JSON [[path, class], ...], TieringPolicy.path_rules),
so the daemon's tiering job can build its policy from them. A pin also sets
``inodes.band_class`` on the path and everything below it at once, as
retention's "cold" action does; the rule covers files created there later."""
from __future__ import annotations

import json

from flask import Blueprint, flash, redirect, render_template, request, url_for
from sqlalchemy import func, select

from engine import errors
from engine.catalog.models import Inode, Zone
from engine.events import record_in
from webui import core
from webui.schema import Field, Schema

bp = Blueprint("tiers", __name__)
INODES = Inode.__table__
ZONES = Zone.__table__
CLASSES = ("hot", "warm", "cold")
SETTING_PREFIX = "tiering."
PIN_LIST_LIMIT = 500

DAY = 86400
THRESHOLDS = Schema("TieringThresholds", "When the tiering engine moves data between band classes.", (
    Field("hot_to_warm_after_s", "integer", "Seconds a hot file stays unchanged before it is erasure-coded "
          "into warm stripes", minimum=60, maximum=30 * DAY, default=600),
    Field("warm_to_cold_after_s", "integer", "Seconds without a change or a read before warm data moves to "
          "cold", minimum=3600, maximum=3650 * DAY, default=30 * DAY),
    Field("promote_reads", "integer", "Reads within the promotion window that bring cold data back to warm",
          minimum=1, maximum=1000, default=3),
    Field("promote_window_s", "integer", "The promotion window in seconds", minimum=60, maximum=30 * DAY,
          default=DAY),
))
PATH_RULES_KEY = SETTING_PREFIX + "path_rules"
PIN = Schema("Pin", "Pin a path (and everything below it) to a band class, or unpin it.", (
    Field("path", "string", "An absolute path in the namespace", min_length=1, max_length=4096,
          example="/datasets/tokens-v3"),
    Field("band_class", "string", "hot, warm or cold; 'none' removes the pin", enum=CLASSES + ("none",)),
))


def thresholds() -> dict:
    catalog = core.ctx().catalog
    out = {}
    for f in THRESHOLDS.fields:
        raw = catalog.get_setting(SETTING_PREFIX + f.name)
        out[f.name] = int(raw) if raw is not None else f.default
    return out


def set_thresholds(values: dict, who: str) -> dict:
    from engine.catalog.models import Setting
    table = Setting.__table__

    def work(conn):
        for name, value in values.items():
            key = SETTING_PREFIX + name
            if not conn.execute(table.update().where(table.c.key == key).values(value=str(value))).rowcount:
                conn.execute(table.insert().values(key=key, value=str(value)))
        record_in(conn, "tiering.thresholds", "tiering thresholds changed: "
                  + ", ".join(f"{k}={v}" for k, v in values.items()), actor=who, details=values)
    core.ctx().catalog.run(work)
    return thresholds()


def path_rules() -> list[list[str]]:
    raw = core.ctx().catalog.get_setting(PATH_RULES_KEY)
    return json.loads(raw) if raw else []


def band_classes() -> list[dict]:
    shingle = core.ctx()

    def usage(conn):
        return {r[0]: (int(r[1]), int(r[2] or 0)) for r in conn.execute(
            select(ZONES.c.band_class, func.count(), func.sum(ZONES.c.live_bytes))
            .where(ZONES.c.band_class.is_not(None)).group_by(ZONES.c.band_class))}
    used = shingle.catalog.read(usage)
    out = []
    for name, opts in shingle.config.band_classes.items():
        zones, live = used.get(name, (0, 0))
        out.append({"name": name, **opts, "zones": zones, "live_bytes": live})
    return out


def pinned() -> list[dict]:
    """Pinned inodes whose parent is not pinned to the same class: the tops of pinned trees."""
    shingle = core.ctx()
    from engine.catalog.models import Dirent
    dirents = Dirent.__table__

    def work(conn):
        rows = conn.execute(select(INODES.c.ino, INODES.c.band_class).where(INODES.c.band_class.is_not(None))
                            .order_by(INODES.c.ino).limit(PIN_LIST_LIMIT * 20)).all()
        classes = {r.ino: r.band_class for r in rows}
        parents = {}
        for start in range(0, len(rows), 500):
            chunk = [r.ino for r in rows[start:start + 500]]
            parents.update(dict(conn.execute(select(dirents.c.child, dirents.c.parent)
                                             .where(dirents.c.child.in_(chunk))).all()))
        return [(ino, cls) for ino, cls in classes.items() if classes.get(parents.get(ino)) != cls]
    tops = shingle.catalog.read(work)[:PIN_LIST_LIMIT]
    out = []
    for ino, cls in tops:
        try:
            path = shingle.namespace.path_of(ino)
        except errors.FsError:
            continue  # unlinked but still open: not something an admin can unpin by path
        out.append({"ino": ino, "path": path, "band_class": cls})
    return out


def pin(path: str, band_class: str, who: str) -> int:
    """Pin a path to a class (or with 'none' unpin it): its rule, and the band class of the path and
    everything below it now; returns the inodes changed."""
    from engine.trash import join_path, split_path, walk_subtree
    shingle = core.ctx()
    path = join_path(split_path(path, "pin path"))
    attr = shingle.namespace.resolve(path, follow=False)
    inos = [a.ino for a in walk_subtree(shingle.namespace, attr)]
    value = None if band_class == "none" else band_class
    from engine.catalog.models import Setting
    settings = Setting.__table__

    def work(conn):
        raw = conn.execute(select(settings.c.value).where(settings.c.key == PATH_RULES_KEY)).scalar()
        rules = [r for r in (json.loads(raw) if raw else []) if r[0] != path]
        if value is not None:
            rules = sorted(rules + [[path, value]])
        if raw is None:
            conn.execute(settings.insert().values(key=PATH_RULES_KEY, value=json.dumps(rules)))
        else:
            conn.execute(settings.update().where(settings.c.key == PATH_RULES_KEY).values(value=json.dumps(rules)))
        for start in range(0, len(inos), 500):
            conn.execute(INODES.update().where(INODES.c.ino.in_(inos[start:start + 500])).values(band_class=value))
        message = (f"{path} unpinned" if value is None else f"{path} pinned to the {value} class") \
            + f" ({len(inos)} inodes; tiering moves the data)"
        record_in(conn, "tiering.pin", message, actor=who,
                  details={"path": path, "band_class": value, "inodes": len(inos)})
    shingle.catalog.run(work)
    return len(inos)


def overview() -> dict:
    return {"band_classes": band_classes(), "thresholds": thresholds(), "path_rules": path_rules(),
            "pinned": pinned()}


@bp.route("/tiers")
@core.login_required
def index(status: int = 200, **extra):
    return render_template("tiers.html", data=overview(), thresholds_schema=THRESHOLDS, pin_schema=PIN,
                           errors=extra.get("errors", {}), pin_errors=extra.get("pin_errors", {}),
                           form=extra.get("form"), pin_form=extra.get("pin_form", {}),
                           json=json), status


@bp.route("/tiers/thresholds", methods=["POST"])
@core.login_required
def save_thresholds():
    try:
        set_thresholds(THRESHOLDS.from_form(request.form), core.actor())
    except core.USER_ERRORS as exc:
        return index(400, errors=core.form_errors(exc), form=dict(request.form))
    flash("tiering thresholds saved", "ok")
    return redirect(url_for("tiers.index"))


@bp.route("/tiers/pins", methods=["POST"])
@core.login_required
def save_pin():
    try:
        values = PIN.from_form(request.form)
        count = pin(values["path"], values["band_class"], core.actor())
    except core.USER_ERRORS as exc:
        return index(400, pin_errors=core.form_errors(exc), pin_form=dict(request.form))
    flash(f"{values['path']}: {count} inodes " + ("unpinned" if values["band_class"] == "none"
                                                  else f"pinned to {values['band_class']}"), "ok")
    return redirect(url_for("tiers.index"))
