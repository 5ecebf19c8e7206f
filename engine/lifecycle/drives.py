"""Drive states in the catalog and the redundancy status of the stripes on them.

States and what they mean for data:
- ``online``: read and written.
- ``degraded``: still read (it reported errors), no new fragments are placed on it.
- ``draining``: still read; rebuild moves every fragment off it, then it may be removed.
- ``missing``: its folder or device is gone (set by the data path's drive watch,
  engine/datapath/drivewatch.py): neither read nor written; it returns to the state it had
  when its folder comes back, or an admin fails it.
- ``failed``: never read; its fragments count as missing until rebuild replaces them.
- ``removed``: out of the pool for good (a failed drive pulled, or a drained one).

Allowed changes (anything else is refused with InvalidArgument naming both states):
online -> degraded | draining | failed | missing; degraded -> online | draining | failed |
missing; draining -> online (cancel) | degraded | failed | missing | removed (only once empty);
missing -> online | degraded | draining | failed; failed -> removed. A replaced drive comes
back as a new drive, never as the old id.
Every change is an event (``drive.state``) in the same transaction.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from sqlalchemy import and_, case, func, select
from sqlalchemy.engine import Connection

from engine.admin.events import record_in
from engine.base import errors
from engine.catalog.database import Catalog
from engine.catalog.models import Drive, Fragment, Stripe, Zone
from engine.coding.erasure import INLINE

DRIVES = Drive.__table__
ZONES = Zone.__table__
FRAGMENTS = Fragment.__table__
STRIPES = Stripe.__table__

ONLINE, DEGRADED, FAILED, DRAINING, REMOVED = "online", "degraded", "failed", "draining", "removed"
MISSING = "missing"
STATES = (ONLINE, DEGRADED, FAILED, DRAINING, MISSING, REMOVED)
READABLE = (ONLINE, DEGRADED, DRAINING)  # fragments on these drives can serve reads
PLACEABLE = (ONLINE,)  # new fragments (writes, rebuild, cleaning) go only here
TRANSITIONS = {
    ONLINE: (DEGRADED, DRAINING, FAILED, MISSING),
    DEGRADED: (ONLINE, DRAINING, FAILED, MISSING),
    DRAINING: (ONLINE, DEGRADED, FAILED, MISSING, REMOVED),
    MISSING: (ONLINE, DEGRADED, DRAINING, FAILED),
    FAILED: (REMOVED,),
    REMOVED: (),
}
OFFLINE_ZONE = "offline"


@dataclass(frozen=True)
class DriveStatus:
    id: int
    uuid: str
    path: str
    backend: str
    state: str
    zone_size: int
    zone_count: int
    zones_empty: int
    zones_open: int
    zones_full: int
    capacity_bytes: int
    written_bytes: int  # sum of write pointers
    live_bytes: int
    garbage_bytes: int
    fragments: int
    serial: str | None
    model: str | None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class RedundancyStatus:
    stripes: int  # stripes holding live data
    reduced: int  # missing at least one fragment
    no_redundancy: int  # exactly the minimum left: one more loss loses data
    lost: int  # fewer than k readable fragments
    on_draining: int  # stripes with a fragment on a draining drive (still readable)

    def to_dict(self) -> dict:
        return asdict(self)


def resolve_drive_id(conn: Connection, drive: int | str) -> int:
    """A drive by id (int or digits) or by uuid."""
    if isinstance(drive, str) and drive.strip().isdigit():
        drive = int(drive.strip())
    if isinstance(drive, int) and not isinstance(drive, bool):
        found = conn.execute(select(DRIVES.c.id).where(DRIVES.c.id == drive)).scalar()
    elif isinstance(drive, str):
        found = conn.execute(select(DRIVES.c.id).where(DRIVES.c.uuid == drive.strip())).scalar()
    else:
        raise errors.InvalidArgument(f"drive {drive!r}: expected a drive id or uuid")
    if found is None:
        raise errors.NotFound(f"no drive {drive!r}: see `shingle drives list`")
    return found


def list_drives(catalog: Catalog) -> list[DriveStatus]:
    def work(conn):
        zone_rows = conn.execute(
            select(
                ZONES.c.drive_id,
                func.sum(case((ZONES.c.state == "empty", 1), else_=0)),
                func.sum(case((ZONES.c.state == "open", 1), else_=0)),
                func.sum(case((ZONES.c.state == "full", 1), else_=0)),
                func.coalesce(func.sum(ZONES.c.write_pointer), 0),
                func.coalesce(func.sum(ZONES.c.live_bytes), 0),
                func.coalesce(func.sum(ZONES.c.garbage_bytes), 0),
            ).group_by(ZONES.c.drive_id)
        ).all()
        zones = {row[0]: row[1:] for row in zone_rows}
        counts = dict(
            conn.execute(
                select(FRAGMENTS.c.drive_id, func.count()).group_by(FRAGMENTS.c.drive_id)
            ).all()
        )
        out = []
        for d in conn.execute(select(DRIVES).order_by(DRIVES.c.id)):
            empty, open_, full, written, live, garbage = (
                int(v or 0) for v in zones.get(d.id, (0,) * 6)
            )
            out.append(
                DriveStatus(
                    d.id,
                    d.uuid,
                    d.path,
                    d.backend,
                    d.state,
                    d.zone_size,
                    d.zone_count,
                    empty,
                    open_,
                    full,
                    d.zone_size * d.zone_count,
                    written,
                    live,
                    garbage,
                    int(counts.get(d.id, 0)),
                    d.serial,
                    d.model,
                )
            )
        return out

    return catalog.read(work)


def get_drive(catalog: Catalog, drive: int | str) -> DriveStatus:
    drive_id = catalog.read(lambda conn: resolve_drive_id(conn, drive))
    return next(d for d in list_drives(catalog) if d.id == drive_id)


def set_drive_state_in(
    conn: Connection, drive: int | str, state: str, *, actor: str = "system", reason: str = ""
) -> tuple[str, str]:
    """Change a drive's state inside the caller's transaction; returns (old, new)."""
    if state not in STATES:
        raise errors.InvalidArgument(f"drive state {state!r}: expected one of {', '.join(STATES)}")
    drive_id = resolve_drive_id(conn, drive)
    old = conn.execute(select(DRIVES.c.state).where(DRIVES.c.id == drive_id)).scalar_one()
    if old == state:
        return old, state
    if state not in TRANSITIONS.get(old, ()):
        allowed = ", ".join(TRANSITIONS.get(old, ())) or "nothing (final state)"
        raise errors.InvalidArgument(
            f"drive {drive_id} is {old}: it cannot become {state} (allowed: {allowed})"
        )
    if old == DRAINING and state == REMOVED:
        left = conn.execute(
            select(func.count()).select_from(FRAGMENTS).where(FRAGMENTS.c.drive_id == drive_id)
        ).scalar_one()
        if left:
            raise errors.NotEmpty(
                f"drive {drive_id} still holds {left} fragments: let the drain finish "
                "(`shingle rebuild`) before removing it"
            )
    conn.execute(DRIVES.update().where(DRIVES.c.id == drive_id).values(state=state))
    severity = (
        "error"
        if state in (FAILED, MISSING)
        else "warning"
        if state in (DEGRADED, REMOVED)
        else "info"
    )
    record_in(
        conn,
        "drive.state",
        f"drive {drive_id}: {old} -> {state}" + (f" ({reason})" if reason else ""),
        severity=severity,
        actor=actor,
        details={"drive_id": drive_id, "from": old, "to": state, "reason": reason},
    )
    _record_host_change_in(conn, drive_id, old, state, actor)
    return old, state


def _record_host_change_in(conn: Connection, drive_id: int, old: str, new: str, actor: str) -> None:
    """``host.lost`` when the last drive of an agent's host still answering goes missing, and
    ``host.back`` when the first of a lost host's drives answers again: one event per host and
    change, whichever head saw it first (the drive's change and this check share a
    transaction, so a second head finds the drive changed already and records nothing)."""
    if MISSING not in (old, new):
        return
    host = conn.execute(select(DRIVES.c.host).where(DRIVES.c.id == drive_id)).scalar()
    if host is None:  # the head's own drives: a host of one is the drive watch's business
        return
    rows = conn.execute(
        select(DRIVES.c.id, DRIVES.c.state, DRIVES.c.path).where(
            DRIVES.c.host == host, DRIVES.c.state != REMOVED
        )
    ).all()
    others_missing = all(r.state == MISSING for r in rows if r.id != drive_id)
    if not others_missing:
        return
    address = rows[0].path if rows else ""
    details = {"host": host, "drives": [r.id for r in rows], "address": address}
    if new == MISSING:
        record_in(
            conn,
            "host.lost",
            f"host {host} does not answer (its agent at {address}): its {len(rows)} drives are "
            "missing, reads decode from the other hosts",
            severity="error",
            actor=actor,
            details=details,
        )
    elif new in READABLE:
        record_in(
            conn,
            "host.back",
            f"host {host} answers again (its agent at {address}): drive {drive_id} is {new}",
            actor=actor,
            details=details,
        )


def set_drive_state(
    catalog: Catalog, drive: int | str, state: str, *, actor: str = "system", reason: str = ""
) -> tuple[str, str]:
    return catalog.run(
        lambda conn: set_drive_state_in(conn, drive, state, actor=actor, reason=reason)
    )


def fail_drive(
    catalog: Catalog,
    drive: int | str,
    actor: str = "system",
    reason: str = "marked failed by an admin",
) -> tuple[str, str]:
    """Stop using a drive now: its fragments count as missing until rebuild replaces them."""
    return set_drive_state(catalog, drive, FAILED, actor=actor, reason=reason)


def start_drain(catalog: Catalog, drive: int | str, actor: str = "system") -> tuple[str, str]:
    """Mark a drive draining: still read, no new data; rebuild moves its fragments off."""
    return set_drive_state(catalog, drive, DRAINING, actor=actor, reason="drain requested")


def redundancy_status_in(conn: Connection) -> RedundancyStatus:
    readable = case((and_(DRIVES.c.state.in_(READABLE), ZONES.c.state != OFFLINE_ZONE), 1), else_=0)
    draining = case((DRIVES.c.state == DRAINING, 1), else_=0)
    per_stripe = (
        select(
            STRIPES.c.id,
            STRIPES.c.k,
            STRIPES.c.m,
            func.coalesce(func.sum(readable), 0).label("readable"),
            func.coalesce(func.sum(draining), 0).label("draining"),
        )
        .select_from(
            STRIPES.outerjoin(FRAGMENTS, FRAGMENTS.c.stripe_id == STRIPES.c.id)
            .outerjoin(DRIVES, DRIVES.c.id == FRAGMENTS.c.drive_id)
            .outerjoin(ZONES, ZONES.c.id == FRAGMENTS.c.zone_id)
        )
        .where(
            STRIPES.c.live_bytes > 0, STRIPES.c.layout != INLINE
        )  # inline bytes live in the catalog
        .group_by(STRIPES.c.id, STRIPES.c.k, STRIPES.c.m)
    ).subquery()
    width = per_stripe.c.k + per_stripe.c.m
    row = conn.execute(
        select(
            func.count(),
            func.coalesce(func.sum(case((per_stripe.c.readable < width, 1), else_=0)), 0),
            func.coalesce(func.sum(case((per_stripe.c.readable == per_stripe.c.k, 1), else_=0)), 0),
            func.coalesce(func.sum(case((per_stripe.c.readable < per_stripe.c.k, 1), else_=0)), 0),
            func.coalesce(func.sum(case((per_stripe.c.draining > 0, 1), else_=0)), 0),
        ).select_from(per_stripe)
    ).one()
    return RedundancyStatus(*(int(v) for v in row))


def redundancy_status(catalog: Catalog) -> RedundancyStatus:
    """How many live stripes run with reduced (or no) redundancy: the status page's headline."""
    return catalog.read(redundancy_status_in)
