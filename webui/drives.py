"""Drives: a table of every drive (state, capacity, zones, its own I/O counters, SMART), band
maps and SMART details per drive; admin actions, confirmed on a page of their own when they
take a drive out of use (mark failed, drain, replace).

Actions change the catalog only (the web UI never opens a drive): mark failed
and drain are drive-state changes (engine.lifecycle.drives); moving data (the
drain itself, rebuild) is a job the daemon runs (engine.admin.jobs); SMART readings
and self-tests go through engine.admin.health (the drive runs a test on its own);
zone counts and band maps come from engine.admin.inventory."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, abort, flash, redirect, render_template, request, url_for

from engine.admin import events, inventory, metrics
from engine.admin.schema import Field, Schema
from engine.base import errors
from webui import charts, core

bp = Blueprint("drives", __name__)
ACTIONS = ("mark_failed", "drain", "rebuild", "smart_test")
CONFIRM = {  # actions a stray click must not do: the page asks once more (the API does not)
    "mark_failed": "Mark drive {id} failed? It is no longer read or written; its fragments count "
    "as missing until a rebuild restores them on the other drives.",
    "drain": "Drain drive {id}? No new data goes to it and a drain job moves its fragments to the "
    "other drives, after which it can be removed.",
}

ACTION_SCHEMA = Schema(
    "DriveAction",
    "An admin action on one drive.",
    (
        Field(
            "action",
            "string",
            "What to do: mark_failed (stop using it now), drain (move its data off, then remove), "
            "rebuild (restore redundancy of stripes that lost a fragment), smart_test (start a "
            "SMART short self-test)",
            enum=ACTIONS,
        ),
    ),
)


NEW_DRIVE_SCHEMA = Schema(
    "NewDrive",
    "A drive to add: a new folder (an emulated drive of zone "
    "files) or a zoned block device, as the daemon sees it.",
    (
        Field(
            "path",
            "string",
            "Absolute path: a folder that does not exist yet, or a zoned block device",
            min_length=2,
            max_length=4096,
            pattern=r"/.*",
            example="/srv/shingle/drives/drive-010",
        ),
        Field(
            "size",
            "integer",
            "Emulated drive size in bytes (default: that of the drives in use)",
            required=False,
            minimum=1 << 20,
        ),
        Field(
            "zone_size",
            "integer",
            "Zone size in bytes (default: that of the drives in use)",
            required=False,
            minimum=4096,
        ),
        Field(
            "preallocate",
            "boolean",
            "Reserve the zone files' size now (false: they grow as written)",
            required=False,
            default=False,
        ),
    ),
)


def queue_new_drive(body: dict, who: str, replaces: int | None = None) -> int:
    """Queue a drive-add (or drive-replace of ``replaces``) job: only the daemon opens drives."""
    from engine.lifecycle.drives import get_drive
    from webui.jobs import queue

    params = {
        "path": body["path"],
        "size": body.get("size"),
        "zone_size": body.get("zone_size"),
        "preallocate": bool(body.get("preallocate")),
    }
    if replaces is None:
        return queue("drive-add", params, who)
    get_drive(core.ctx().catalog, replaces)  # NotFound now, not in the job
    return queue("drive-replace", {**params, "old": replaces}, who)


# each drive's own counters (engine.drives.ZonedDrive.io_counters), sampled by the daemon
IO_COUNTERS = ("read_bytes", "written_bytes", "read_errors", "write_errors", "checksum_errors")
# a zoned block device's own fault counts (engine/drives/blkzoned.py; docs/zoned.md): errors the
# device returned (also counted as read or write errors, so left out of ``errors``) and, of
# them, writes it refused as off its write pointer (expected 0)
DEVICE_COUNTERS = ("device_errors", "off_pointer_errors")


def drive_io(latest: dict[str, float], drive_id: int) -> dict[str, int] | None:
    """The drive's I/O counters from the daemon's newest sample (``drive_<id>_<counter>``), with
    ``errors`` the sum of its read, write and checksum errors, and a zoned block device's
    ``device_errors`` and ``off_pointer_errors`` when it has them; None before the daemon
    recorded any for it."""
    found = {
        name: int(latest[f"drive_{drive_id}_{name}"])
        for name in IO_COUNTERS
        if f"drive_{drive_id}_{name}" in latest
    }
    if not found:
        return None
    found["errors"] = sum(v for k, v in found.items() if k.endswith("_errors"))
    for name in DEVICE_COUNTERS:
        if f"drive_{drive_id}_{name}" in latest:
            found[name] = int(latest[f"drive_{drive_id}_{name}"])
    return found


def drive_rows(only: int | None = None) -> list[dict]:
    from engine.lifecycle.drives import list_drives

    shingle = core.ctx()
    devices = inventory.drive_devices(shingle.catalog)
    latest = metrics.latest(shingle.catalog)
    found = [d for d in list_drives(shingle.catalog) if only is None or d.id == only]
    out = []
    for d in found:
        row: dict[str, Any] = {
            "id": d.id,
            "uuid": d.uuid,
            "path": d.path,
            "backend": d.backend,
            "state": d.state,
            "zone_size": d.zone_size,
            "zones": d.zone_count,
            "zones_empty": d.zones_empty,
            "zones_open": d.zones_open,
            "zones_full": d.zones_full,
            "size_bytes": d.capacity_bytes,
            "written_bytes": d.written_bytes,
            "live_bytes": d.live_bytes,
            "garbage_bytes": d.garbage_bytes,
            "fragments": d.fragments,
            "serial": d.serial,
            "model": d.model,
            # a zoned block device is its own SMART device; zone-file drives name one only if set
            "device": devices.get(d.id) or (d.path if d.backend == "zoned-block" else None),
        }
        out.append(row)
    shingle.smart.refresh([row["device"] for row in out], shingle.smartctl)
    for row in out:
        row["smart"] = shingle.smart.report(row["device"], shingle.smartctl)
        row["io"] = drive_io(latest, row["id"])
    return out


def drive_row(drive_id: int) -> dict:
    rows = drive_rows(only=drive_id)
    if not rows:
        raise errors.NotFound(f"no drive with id {drive_id}")
    return rows[0]


def band_cells(drive_id: int) -> list[dict]:
    """The band map's cells: one per zone, or on big drives one per run of zones (grouped in
    SQL by engine.admin.inventory, so an 80,000-zone drive costs a few thousand rows, not
    80,000)."""
    found = inventory.band_map_rows(core.ctx().catalog, drive_id, charts.MAX_CELLS)
    if found.group is None:
        return charts.zone_cells(found.rows)
    group, zone_size = found.group, found.zone_size
    per_cell: dict[int, list] = {}
    for r in found.rows:
        per_cell.setdefault(int(r.cell), []).append(r)
    cells = []
    for index in sorted(per_cell):
        parts = per_cell[index]
        zones = sum(r.n for r in parts)
        kinds: dict[str, int] = {}
        classes: dict[str, int] = {}
        for r in parts:
            kinds[r.kind] = kinds.get(r.kind, 0) + r.n
            if r.band_class:
                classes[r.band_class] = classes.get(r.band_class, 0) + r.n
        cells.append(
            {
                "label": f"zones {index * group}-{index * group + zones - 1}",
                "kind": max(kinds, key=kinds.__getitem__),
                "band_class": max(classes, key=classes.__getitem__) if classes else None,
                "fill": sum(int(r.written or 0) for r in parts) / (zones * zone_size),
                "detail": ", ".join(
                    f"{n} {k}" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1])
                ),
            }
        )
    return cells


def band_counts(drive_id: int) -> dict[str, dict[str, int]]:
    """kind (empty/open/full/garbage/offline) -> band class ("-" for none) -> zones."""
    return inventory.band_counts(core.ctx().catalog, drive_id)


def do_action(drive_id: int, action: str, who: str) -> tuple[str, int | None]:
    """Do or queue one action; returns what happened (for a flash message or the
    API) and the job queued."""
    from engine.lifecycle import drives as lifecycle

    shingle = core.ctx()
    if action not in ACTIONS:
        raise errors.InvalidArgument(
            f"drive action {action!r}: expected one of {', '.join(ACTIONS)}"
        )
    from webui.jobs import queue

    if action == "mark_failed":
        old, new = lifecycle.fail_drive(shingle.catalog, drive_id, actor=who)
        return (
            f"drive {drive_id}: {old} -> {new}; a rebuild restores its fragments on the other "
            "drives",
            None,
        )
    if action == "drain":
        old, new = lifecycle.start_drain(shingle.catalog, drive_id, actor=who)
        job_id = queue("drain", {"drive": drive_id}, who)
        return (
            f"drive {drive_id}: {old} -> {new}; drain job {job_id} moves its fragments off",
            job_id,
        )
    if action == "rebuild":
        state = lifecycle.get_drive(shingle.catalog, drive_id).state
        if state == lifecycle.ONLINE:
            raise errors.InvalidArgument(
                f"drive {drive_id} is online: rebuild restores the fragments of failed or "
                "draining drives; mark it failed or drain it first"
            )
        job_id = queue("rebuild", {}, who)
        return (
            f"rebuild job {job_id} queued: it restores every stripe that lost a fragment (drive "
            f"{drive_id} is {state})",
            job_id,
        )
    device = inventory.drive_device(shingle.catalog, drive_id)
    try:
        message = shingle.smart.start_self_test(device, shingle.smartctl, "short")
    except ValueError as exc:
        raise errors.InvalidArgument(
            f"drive {drive_id}: SMART self-test not started: {exc}"
        ) from None
    events.record(
        shingle.catalog,
        "drive.smart.test",
        f"SMART short self-test started on drive {drive_id} ({device}): {message}",
        actor=who,
        details={"drive_id": drive_id},
    )
    return f"drive {drive_id}: SMART short self-test started ({message})", None


@bp.route("/drives")
@core.login_required
def index():
    rows = drive_rows()
    from engine.lifecycle.drives import redundancy_status

    redundancy = redundancy_status(core.ctx().catalog)
    maps = {}
    for row in rows:
        maps[row["id"]] = {
            "svg": charts.band_map(band_cells(row["id"]), label=f"band map of drive {row['id']}"),
            "counts": band_counts(row["id"]),
        }
    return render_template(
        "drives.html", drives=rows, maps=maps, redundancy=redundancy, actions=ACTIONS
    )


@bp.route("/drives/<int:drive_id>/action", methods=["POST"])
@core.login_required
def action(drive_id: int):
    try:
        clean = ACTION_SCHEMA.from_form({"action": request.form.get("action")})
        if clean["action"] in CONFIRM and request.form.get("confirm") != "yes":
            drive_row(drive_id)  # 404 for a drive that does not exist
            return core.confirm_page(
                question=CONFIRM[clean["action"]].format(id=drive_id),
                action=url_for("drives.action", drive_id=drive_id),
                fields={"action": clean["action"]},
                cancel=url_for("drives.index") + f"#drive-{drive_id}",
            )
        message, job_id = do_action(drive_id, clean["action"], core.actor())
        flash(message, "ok")
        if job_id is not None:
            return redirect(url_for("jobs.detail", job_id=job_id))
    except core.USER_ERRORS as exc:
        if isinstance(exc, errors.NotFound):
            abort(404)
        flash(str(core.form_errors(exc).popitem()[1]), "error")
    return redirect(url_for("drives.index") + f"#drive-{drive_id}")


@bp.route("/drives/add", methods=["POST"])
@core.login_required
def add():
    """Add a drive, or replace one (``replaces``): a job the daemon runs, then its page."""
    replaces = request.form.get("replaces") or None
    try:
        body = NEW_DRIVE_SCHEMA.from_form(request.form)
        if replaces and request.form.get("confirm") != "yes":
            old = drive_row(int(replaces))
            return core.confirm_page(
                question=f"Replace drive {old['id']} ({old['state']}, {old['path']}) with "
                f"{body['path']}? Drive {old['id']} is taken out of use and its fragments are "
                "rebuilt onto the new drive.",
                action=url_for("drives.add"),
                fields={k: v for k, v in request.form.items() if k != "csrf_token"},
                cancel=url_for("drives.index") + "#add-drive",
            )
        job_id = queue_new_drive(body, core.actor(), int(replaces) if replaces else None)
    except core.USER_ERRORS as exc:
        flash(str(core.form_errors(exc).popitem()[1]), "error")
        return redirect(url_for("drives.index") + "#add-drive")
    flash(f"job {job_id} queued: the daemon adds {body['path']} and rebuilds onto it", "ok")
    return redirect(url_for("jobs.detail", job_id=job_id))
