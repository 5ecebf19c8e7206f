"""Drives: state, capacity, band map, SMART and I/O counters; admin actions.

Actions change the catalog only (the web UI never opens a drive): mark failed
and drain are drive-state changes (engine.lifecycle.drives); moving data (the
drain itself, rebuild) is a job the daemon runs (engine.jobs); a SMART
self-test is started through smartctl, and the drive runs it on its own."""
from __future__ import annotations

import time

from flask import Blueprint, abort, flash, redirect, render_template, request, url_for
from sqlalchemy import and_, case, func, select

from engine import errors, events, health
from engine.catalog.models import Drive, Zone
from webui import charts, core
from webui.schema import Field, Schema

bp = Blueprint("drives", __name__)
DRIVES = Drive.__table__
ZONES = Zone.__table__
ACTIONS = ("mark_failed", "drain", "rebuild", "smart_test")
CONFIRM = {  # actions a stray click must not do: the page asks once more (the API does not)
    "mark_failed": "Mark drive {id} failed? It is no longer read or written; its fragments count as missing "
                   "until a rebuild restores them on the other drives.",
    "drain": "Drain drive {id}? No new data goes to it and a drain job moves its fragments to the other drives, "
             "after which it can be removed.",
}
SMART_TTL_S = 60  # smartctl -x takes a while on real drives; pages reuse a reading this long
SMART_PARALLEL = 8

ACTION_SCHEMA = Schema("DriveAction", "An admin action on one drive.", (
    Field("action", "string", "What to do: mark_failed (stop using it now), drain (move its data off, then "
          "remove), rebuild (restore redundancy of stripes that lost a fragment), smart_test (start a SMART "
          "short self-test)", enum=ACTIONS),
))


def smart_of(shingle: core.Shingle, device: str | None) -> dict:
    """The drive's SMART report, from this process's short-lived cache when fresh."""
    hit = shingle.smart_cache.get(device)
    if hit is not None and time.monotonic() - hit[0] < SMART_TTL_S:
        return hit[1]
    report = health.read_smart(device, shingle.smartctl).to_dict()
    shingle.smart_cache[device] = (time.monotonic(), report)
    return report


def refresh_smart(shingle: core.Shingle, devices: list[str | None]) -> None:
    """Read stale SMART reports in parallel: one smartctl per drive, a 24-bay chassis in one go."""
    stale = [d for d in set(devices) if d and (shingle.smart_cache.get(d) is None
                                               or time.monotonic() - shingle.smart_cache[d][0] >= SMART_TTL_S)]
    if len(stale) > 1:
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(max_workers=min(SMART_PARALLEL, len(stale))) as pool:
            list(pool.map(lambda d: smart_of(shingle, d), stale))


def drive_rows(only: int | None = None) -> list[dict]:
    from engine.lifecycle.drives import list_drives
    shingle = core.ctx()
    devices = dict(shingle.catalog.read(lambda c: c.execute(select(DRIVES.c.id, DRIVES.c.device)).all()))
    found = [d for d in list_drives(shingle.catalog) if only is None or d.id == only]
    out = []
    for d in found:
        row = {"id": d.id, "uuid": d.uuid, "path": d.path, "backend": d.backend, "state": d.state,
               "zone_size": d.zone_size, "zones": d.zone_count, "zones_empty": d.zones_empty,
               "zones_open": d.zones_open, "zones_full": d.zones_full, "size_bytes": d.capacity_bytes,
               "written_bytes": d.written_bytes, "live_bytes": d.live_bytes, "garbage_bytes": d.garbage_bytes,
               "fragments": d.fragments, "serial": d.serial, "model": d.model,
               # a zoned block device is its own SMART device; zone-file drives name one only if set
               "device": devices.get(d.id) or (d.path if d.backend == "zoned-block" else None)}
        out.append(row)
    refresh_smart(shingle, [row["device"] for row in out])
    for row in out:
        row["smart"] = smart_of(shingle, row["device"])
        # the device's own counters, else those of the disk holding an emulated drive's folder
        row["io"] = health.io_counters(row["device"]) or health.io_counters(row["path"])
    return out


def drive_row(drive_id: int) -> dict:
    rows = drive_rows(only=drive_id)
    if not rows:
        raise errors.NotFound(f"no drive with id {drive_id}")
    return rows[0]


def _kind_column():
    """A zone's kind as the band map shows it (charts.zone_kind), computed in SQL."""
    return case((and_(ZONES.c.state == "full", ZONES.c.garbage_bytes > ZONES.c.live_bytes), "garbage"),
                (ZONES.c.state.in_(("empty", "open", "full")), ZONES.c.state), else_="offline")


def band_cells(drive_id: int) -> list[dict]:
    """The band map's cells: one per zone, or on big drives one per run of zones, grouped in SQL
    so an 80,000-zone drive costs a few thousand rows, not 80,000."""
    def work(conn):
        row = conn.execute(select(DRIVES.c.zone_count, DRIVES.c.zone_size).where(DRIVES.c.id == drive_id)).first()
        if row is None:
            raise errors.NotFound(f"no drive with id {drive_id}")
        if row.zone_count <= charts.MAX_CELLS:
            return None, [dict(r._mapping) for r in conn.execute(
                select(ZONES.c.idx, ZONES.c.state, ZONES.c.band_class, ZONES.c.write_pointer, ZONES.c.live_bytes,
                       ZONES.c.garbage_bytes, DRIVES.c.zone_size)
                .select_from(ZONES.join(DRIVES, DRIVES.c.id == ZONES.c.drive_id))
                .where(ZONES.c.drive_id == drive_id).order_by(ZONES.c.idx))]
        group = -(-row.zone_count // charts.MAX_CELLS)
        cell = (ZONES.c.idx // group).label("cell")  # floor division: SQLAlchemy 2 makes "/" true division
        kind = _kind_column().label("kind")
        rows = conn.execute(select(cell, kind, ZONES.c.band_class, func.count().label("n"),
                                   func.sum(ZONES.c.write_pointer).label("written"))
                            .where(ZONES.c.drive_id == drive_id)
                            .group_by(cell, kind, ZONES.c.band_class)).all()
        return (group, row.zone_size), rows
    grouping, rows = core.ctx().catalog.read(work)
    if grouping is None:
        return charts.zone_cells(rows)
    group, zone_size = grouping
    per_cell: dict[int, list] = {}
    for r in rows:
        per_cell.setdefault(int(r.cell), []).append(r)
    cells = []
    for index in sorted(per_cell):
        parts = per_cell[index]
        zones = sum(r.n for r in parts)
        kinds, classes = {}, {}
        for r in parts:
            kinds[r.kind] = kinds.get(r.kind, 0) + r.n
            if r.band_class:
                classes[r.band_class] = classes.get(r.band_class, 0) + r.n
        cells.append({"label": f"zones {index * group}-{index * group + zones - 1}",
                      "kind": max(kinds, key=kinds.get),
                      "band_class": max(classes, key=classes.get) if classes else None,
                      "fill": sum(int(r.written or 0) for r in parts) / (zones * zone_size),
                      "detail": ", ".join(f"{n} {k}" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1]))})
    return cells


def band_counts(drive_id: int) -> dict[str, dict[str, int]]:
    """kind (empty/open/full/garbage/offline) -> band class ("-" for none) -> zones."""
    kind = _kind_column().label("kind")

    def work(conn):
        return conn.execute(select(kind, ZONES.c.band_class, func.count()).where(ZONES.c.drive_id == drive_id)
                            .group_by(kind, ZONES.c.band_class)).all()
    out: dict[str, dict[str, int]] = {}
    for k, cls, n in core.ctx().catalog.read(work):
        out.setdefault(k, {})[cls or "-"] = int(n)
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
        maps[row["id"]] = {"svg": charts.band_map(band_cells(row["id"]), label=f"band map of drive {row['id']}"),
                           "counts": band_counts(row["id"])}
    return render_template("drives.html", drives=rows, maps=maps, redundancy=redundancy, actions=ACTIONS)


@bp.route("/drives/<int:drive_id>/action", methods=["POST"])
@core.login_required
def action(drive_id: int):
    try:
        clean = ACTION_SCHEMA.from_form({"action": request.form.get("action")})
        if clean["action"] in CONFIRM and request.form.get("confirm") != "yes":
            drive_row(drive_id)  # 404 for a drive that does not exist
            return render_template("confirm.html", question=CONFIRM[clean["action"]].format(id=drive_id),
                                   action=url_for("drives.action", drive_id=drive_id),
                                   fields={"action": clean["action"], "confirm": "yes"},
                                   cancel=url_for("drives.index") + f"#drive-{drive_id}")
        message, job_id = do_action(drive_id, clean["action"], core.actor())
        flash(message, "ok")
        if job_id is not None:
            return redirect(url_for("jobs.detail", job_id=job_id))
    except core.USER_ERRORS as exc:
        if isinstance(exc, errors.NotFound):
            abort(404)
        flash(str(core.form_errors(exc).popitem()[1]), "error")
    return redirect(url_for("drives.index") + f"#drive-{drive_id}")
