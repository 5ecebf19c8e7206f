"""Tiers: band-class parameters, tiering thresholds and paths pinned to a class.

Band-class geometry comes from shingle.toml (validated at load; changing k/m
under existing stripes is a config change, not a click). Thresholds and pins
are engine.admin.tier_settings (catalog settings the daemon's tiering job reads);
zone usage and the compression ratio by class are engine.admin.inventory."""

from __future__ import annotations

import json

from flask import Blueprint, flash, redirect, render_template, request, url_for

from engine.admin import inventory, tier_settings
from engine.admin.schema import Field, Schema
from engine.admin.tier_settings import CLASSES, DAY, PATH_RULES_KEY, PIN_LIST_LIMIT  # noqa: F401
from engine.coding.compression import DEFAULT_LEVEL
from webui import core

bp = Blueprint("tiers", __name__)
DEFAULTS = tier_settings.THRESHOLD_DEFAULTS
THRESHOLDS = Schema(
    "TieringThresholds",
    "When the tiering engine moves data between band classes.",
    (
        Field(
            "hot_to_warm_after_s",
            "integer",
            "How long a hot file stays unchanged before it is erasure-coded into warm stripes "
            "(API: seconds; forms: 30 d, 12 h, 90 min)",
            minimum=60,
            maximum=30 * DAY,
            default=DEFAULTS["hot_to_warm_after_s"],
            unit="duration",
        ),
        Field(
            "warm_to_cold_after_s",
            "integer",
            "How long warm data goes without a change or a read before it moves to cold "
            "(API: seconds; forms: 30 d, 12 h, 90 min)",
            minimum=3600,
            maximum=3650 * DAY,
            default=DEFAULTS["warm_to_cold_after_s"],
            unit="duration",
        ),
        Field(
            "promote_reads",
            "integer",
            "Reads within the promotion window that bring cold data back to warm",
            minimum=1,
            maximum=1000,
            default=DEFAULTS["promote_reads"],
        ),
        Field(
            "promote_window_s",
            "integer",
            "The promotion window (API: seconds; forms: 30 d, 12 h, 90 min)",
            minimum=60,
            maximum=30 * DAY,
            default=DEFAULTS["promote_window_s"],
            unit="duration",
        ),
    ),
)
PIN = Schema(
    "Pin",
    "Pin a path (and everything below it) to a band class, or unpin it.",
    (
        Field(
            "path",
            "string",
            "An absolute path in the namespace",
            min_length=1,
            max_length=4096,
            example="/datasets/tokens-v3",
        ),
        Field(
            "band_class",
            "string",
            "hot, warm or cold; 'none' removes the pin",
            enum=CLASSES + (tier_settings.UNPIN,),
        ),
    ),
)


def thresholds() -> dict:
    return tier_settings.thresholds(core.ctx().catalog)


def set_thresholds(values: dict, who: str) -> dict:
    return tier_settings.set_thresholds(core.ctx().catalog, values, actor=who)


def path_rules() -> list[list[str]]:
    return tier_settings.path_rules(core.ctx().catalog)


def band_classes() -> list[dict]:
    shingle = core.ctx()
    used = inventory.usage_by_class(shingle.catalog)
    packed = inventory.compression_by_class(shingle.catalog)
    out = []
    for name, opts in shingle.config.band_classes.items():
        usage = used.get(name, {"zones": 0, "live_bytes": 0})
        stripes = packed.get(name, {"stripes": 0, "compressed": 0, "ratio": 1.0})
        out.append(
            {
                "name": name,
                "compression_level": DEFAULT_LEVEL,
                **opts,
                "zones": usage["zones"],
                "live_bytes": usage["live_bytes"],
                # user bytes per stored byte over the class's stripes, and how many are compressed
                "compression_ratio": stripes["ratio"],
                "stripes": stripes["stripes"],
                "stripes_compressed": stripes["compressed"],
            }
        )
    return out


def pinned() -> list[dict]:
    """Pinned inodes whose parent is not pinned to the same class: the tops of pinned trees."""
    shingle = core.ctx()
    return tier_settings.pinned(shingle.catalog, shingle.namespace, PIN_LIST_LIMIT)


def pin(path: str, band_class: str, who: str) -> int:
    """Pin a path to a class (or with 'none' unpin it); returns the inodes changed."""
    shingle = core.ctx()
    return tier_settings.pin(shingle.catalog, shingle.namespace, path, band_class, actor=who)


def overview() -> dict:
    return {
        "band_classes": band_classes(),
        "thresholds": thresholds(),
        "path_rules": path_rules(),
        "pinned": pinned(),
    }


@bp.route("/tiers")
@core.login_required
def index(status: int = 200, **extra):
    return render_template(
        "tiers.html",
        data=overview(),
        thresholds_schema=THRESHOLDS,
        pin_schema=PIN,
        errors=extra.get("errors", {}),
        pin_errors=extra.get("pin_errors", {}),
        form=extra.get("form"),
        pin_form=extra.get("pin_form", {}),
        json=json,
    ), status


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
    flash(
        f"{values['path']}: {count} inodes "
        + ("unpinned" if values["band_class"] == "none" else f"pinned to {values['band_class']}"),
        "ok",
    )
    return redirect(url_for("tiers.index"))
