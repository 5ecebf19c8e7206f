"""Drives: state, capacity, band map, SMART and I/O counters; admin actions.

Actions change the catalog only (the web UI never opens a drive): mark failed
and drain are drive-state changes (engine.lifecycle.drives); moving data (the
drain itself, rebuild) is a job the daemon runs (engine.jobs); a SMART
self-test is started through smartctl, and the drive runs it on its own."""
from __future__ import annotations

import time

from flask import Blueprint, abort, flash, redirect, render_template, request, url_for
from sqlalchemy import select

from engine import errors, events, health
from engine.catalog.models import Drive, Zone
from webui import charts, core
from webui.schema import Field, Schema

bp = Blueprint("drives", __name__)
DRIVES = Drive.__table__
ZONES = Zone.__table__
ACTIONS = ("mark_failed", "drain", "rebuild", "smart_test")
SMART_TTL_S = 60  # smartctl -x takes a while on real drives; pages reuse a reading this long

ACTION_SCHEMA = Schema("DriveAction", "An admin action on one drive.", (
    Field("action", "string", "What to do: mark_failed (stop using it now), drain (move its data off, then "
          "remove), rebuild (restore redundancy of stripes that lost a fragment), smart_test (start a SMART "
          "short self-test)", enum=ACTIONS),
))


def smart_of(device: str | None) -> dict:
    """The drive's SMART report, from this process's short-lived cache when fresh."""
    shingle = core.ctx()
    cache = shingle.smart_cache
    hit = cache.get(device)
    if hit is not None and time.monotonic() - hit[0] < SMART_TTL_S:
        return hit[1]
    report = health.read_smart(device, shingle.smartctl).to_dict()
    cache[device] = (time.monotonic(), report)
    return report


def drive_rows(with_health: bool = True, only: int | None = None) -> list[dict]:
    from engine.lifecycle.drives import list_drives
    shingle = core.ctx()
    devices = dict(shingle.catalog.read(lambda c: c.execute(select(DRIVES.c.id, DRIVES.c.device)).all()))
    out = []
    for d in list_drives(shingle.catalog):
        if only is not None and d.id != only:
            continue
        row = {"id": d.id, "uuid": d.uuid, "path": d.path, "backend": d.backend, "state": d.state,
               "zone_size": d.zone_size, "zones": d.zone_count, "zones_empty": d.zones_empty,
               "zones_open": d.zones_open, "zones_full": d.zones_full, "size_bytes": d.capacity_bytes,
               "written_bytes": d.written_bytes, "live_bytes": d.live_bytes, "garbage_bytes": d.garbage_bytes,
               "fragments": d.fragments, "serial": d.serial, "model": d.model, "device": devices.get(d.id)}
        if with_health:
            row["smart"] = smart_of(row["device"])
            # the device's own counters, else those of the disk holding an emulated drive's folder
            row["io"] = health.io_counters(row["device"]) or health.io_counters(row["path"])
        out.append(row)
    return out


def drive_row(drive_id: int) -> dict:
    rows = drive_rows(only=drive_id)
    if not rows:
        raise errors.NotFound(f"no drive with id {drive_id}")
    return rows[0]


def zones_of(drive_id: int) -> list[dict]:
    def work(conn):
        return [dict(r._mapping) for r in conn.execute(
            select(ZONES.c.idx, ZONES.c.state, ZONES.c.band_class, ZONES.c.write_pointer, ZONES.c.live_bytes,
                   ZONES.c.garbage_bytes, DRIVES.c.zone_size)
            .select_from(ZONES.join(DRIVES, DRIVES.c.id == ZONES.c.drive_id))
            .where(ZONES.c.drive_id == drive_id).order_by(ZONES.c.idx))]
    return core.ctx().catalog.read(work)


def band_counts(zones: list[dict]) -> dict[str, dict[str, int]]:
    """kind (empty/open/full/garbage/offline) -> band class -> zones."""
    out: dict[str, dict[str, int]] = {}
    for zone in zones:
        kind = charts.zone_kind(zone)
        cls = zone["band_class"] or "-"
        out.setdefault(kind, {}).setdefault(cls, 0)
        out[kind][cls] += 1
    return out


def do_action(drive_id: int, action: str, who: str) -> tuple[str, int | None]:
    """Do or queue one action; returns what happened (for a flash message or the API) and the job queued."""
    from engine.lifecycle import drives as lifecycle
    shingle = core.ctx()
    if action not in ACTIONS:
        raise errors.InvalidArgument(f"drive action {action!r}: expected one of {', '.join(ACTIONS)}")
    from webui.jobs import queue
    if action == "mark_failed":
        old, new = lifecycle.fail_drive(shingle.catalog, drive_id, actor=who)
        return f"drive {drive_id}: {old} -> {new}; a rebuild restores its fragments on the other drives", None
    if action == "drain":
        old, new = lifecycle.start_drain(shingle.catalog, drive_id, actor=who)
        job_id = queue("drain", {"drive": drive_id}, who)
        return f"drive {drive_id}: {old} -> {new}; drain job {job_id} moves its fragments off", job_id
    if action == "rebuild":
        state = lifecycle.get_drive(shingle.catalog, drive_id).state
        if state == lifecycle.ONLINE:
            raise errors.InvalidArgument(f"drive {drive_id} is online: rebuild restores the fragments of failed or "
                                         "draining drives; mark it failed or drain it first")
        job_id = queue("rebuild", {}, who)
        return f"rebuild job {job_id} queued: it restores every stripe that lost a fragment (drive {drive_id} " \
               f"is {state})", job_id
    device = shingle.catalog.read(lambda c: c.execute(select(DRIVES.c.device).where(DRIVES.c.id == drive_id))
                                  .first())
    if device is None:
        raise errors.NotFound(f"no drive with id {drive_id}")
    try:
        message = health.start_self_test(device[0], shingle.smartctl, "short")
    except ValueError as exc:
        raise errors.InvalidArgument(f"drive {drive_id}: SMART self-test not started: {exc}") from None
    shingle.smart_cache.pop(device[0], None)  # show the running test on the next view
    events.record(shingle.catalog, "drive.smart.test", f"SMART short self-test started on drive {drive_id} "
                  f"({device[0]}): {message}", actor=who, details={"drive_id": drive_id})
    return f"drive {drive_id}: SMART short self-test started ({message})", None


@bp.route("/drives")
@core.login_required
def index():
    rows = drive_rows()
    from engine.lifecycle.drives import redundancy_status
    redundancy = redundancy_status(core.ctx().catalog)
    maps = {}
    for row in rows:
        zones = zones_of(row["id"])
        maps[row["id"]] = {"svg": charts.band_map(zones, label=f"band map of drive {row['id']}"),
                           "counts": band_counts(zones)}
    return render_template("drives.html", drives=rows, maps=maps, redundancy=redundancy, actions=ACTIONS)


@bp.route("/drives/<int:drive_id>/action", methods=["POST"])
@core.login_required
def action(drive_id: int):
    try:
        clean = ACTION_SCHEMA.from_form(request.form)
        message, job_id = do_action(drive_id, clean["action"], core.actor())
        flash(message, "ok")
        if job_id is not None:
            return redirect(url_for("jobs.detail", job_id=job_id))
    except core.USER_ERRORS as exc:
        if isinstance(exc, errors.NotFound):
            abort(404)
        flash(str(core.form_errors(exc).popitem()[1]), "error")
    return redirect(url_for("drives.index") + f"#drive-{drive_id}")
