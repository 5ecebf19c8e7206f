"""Quotas of directory trees: a section of the exports page, and the API's /quotas.

Both go through engine.admin.quota_service (the checks, the change and its event naming the admin,
in one catalog transaction); the daemon's next write to the tree sees the change."""

from __future__ import annotations

from flask import Blueprint, abort, flash, redirect, request, url_for

from appliance.facade import parse_size
from engine.admin.quota_service import QuotaService
from engine.admin.schema import Field, Schema, ValidationError
from engine.base import errors
from webui import core
from webui.crud import CrudApi

bp = Blueprint("quotas", __name__)
LIMIT_MAX = 2**62
LIMITS = (
    ("bytes_limit", "Hard limit of the files' sizes in bytes (writes past it fail: EDQUOT)"),
    ("files_limit", "Hard limit of the inodes below the directory"),
    ("soft_bytes", "An alert once the files' sizes pass this many bytes"),
    ("soft_files", "An alert once the inodes pass this many"),
)
SIZE_FIELDS = ("bytes_limit", "soft_bytes")

QUOTA_SCHEMA = Schema(
    "Quota",
    "A quota on a directory tree; 0 removes one limit, a field left out keeps its value.",
    (
        Field(
            "path",
            "string",
            "A namespace directory, or one under an export's name (/export/team)",
            min_length=1,
            max_length=4096,
            example="/export/team",
        ),
        *(
            Field(name, "integer", text, required=False, minimum=0, maximum=LIMIT_MAX)
            for name, text in LIMITS
        ),
    ),
)
LIMITS_SCHEMA = Schema(
    "QuotaLimits",
    "The limits of a quota to change; 0 removes one.",
    tuple(f for f in QUOTA_SCHEMA.fields if f.name != "path"),
)


def service() -> QuotaService:
    return QuotaService(core.ctx().namespace)


def list_quotas() -> list[dict]:
    return [q.to_dict() for q in service().list()]


def get_quota(quota_id: int) -> dict:
    return service().get_by_id(quota_id).to_dict()


def set_quota(values: dict, who: str) -> dict:
    limits = {k: v for k, v in values.items() if k != "path"}
    return service().set(values["path"], actor=who, **limits).to_dict()


def update_quota(quota_id: int, values: dict, who: str) -> dict:
    quotas = service()
    path = quotas.get_by_id(quota_id).path
    return quotas.set(path, actor=who, **values).to_dict()


def delete_quota(quota_id: int, who: str) -> None:
    quotas = service()
    quotas.remove(quotas.get_by_id(quota_id).path, actor=who)


API = CrudApi(
    "/quotas",
    "quota_id",
    "quotas",
    "quota",
    "quotas of directory trees, with their usage",
    QUOTA_SCHEMA,
    "Quota",
    list_quotas,
    set_quota,
    get_quota,
    update_quota,
    delete_quota,
    update_schema=LIMITS_SCHEMA,
    summary={
        "create": "Set the quota of a directory (made if new, else the limits given change)",
        "update": "Change limits of a quota (0 removes one)",
        "delete": "Remove a quota (the files stay)",
    },
    described={
        "list": "every quota with its usage",
        "create": "the quota as set",
        "delete": "the id of the removed quota",
    },
)


def recount(who: str) -> dict:
    wrong = service().recount()
    return {"corrected": [str(m) for m in wrong]}


def _form_values() -> dict:
    """The form's fields; sizes may be written 10GiB, 500MiB or as a byte count."""
    values: dict = {"path": request.form.get("path", "").strip()}
    bad: dict[str, str] = {}
    for name, _text in LIMITS:
        text = (request.form.get(name) or "").strip()
        if not text:
            continue
        try:
            values[name] = parse_size(text, name) if name in SIZE_FIELDS else int(text)
        except (errors.ConfigError, ValueError):
            what = "a size such as 10GiB or a byte count" if name in SIZE_FIELDS else "a count"
            bad[name] = f"{name} = {text!r}: expected {what}"
    if bad:
        raise ValidationError(bad)
    return QUOTA_SCHEMA.validate(values)


@bp.route("/exports/quotas", methods=["POST"])
@core.login_required
def set_from_form():
    try:
        quota = set_quota(_form_values(), core.actor())
        flash(f"quota on {quota['path']} saved", "ok")
    except core.USER_ERRORS as exc:
        flash(f"quota not saved: {'; '.join(core.form_errors(exc).values())}", "error")
    return redirect(url_for("exports.index") + "#quotas")


@bp.route("/exports/quotas/<int:quota_id>/delete", methods=["POST"])
@core.login_required
def delete(quota_id: int):
    try:
        delete_quota(quota_id, core.actor())
    except errors.NotFound:
        abort(404)
    flash(f"quota {quota_id} removed (the files stay)", "ok")
    return redirect(url_for("exports.index") + "#quotas")
