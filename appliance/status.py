"""What `shingle status` reports: catalog, drives and capacity, from the catalog alone.

It never opens the drives, so it is safe while the daemon runs."""

from __future__ import annotations

import os

from sqlalchemy import case, func, select

from engine.admin.hosts import stripe_shape
from engine.catalog.database import Catalog
from engine.catalog.migrate import current_revision
from engine.catalog.models import Drive, Inode, Zone
from engine.lifecycle.drives import redundancy_status_in
from engine.lifecycle.hosts import hosts_status_in

DRIVES = Drive.__table__
ZONES = Zone.__table__
INODES = Inode.__table__
USABLE_STATES = ("online", "degraded", "draining")


def gather(catalog: Catalog, policies: dict, reserve_zones: int) -> dict:
    inodes, rows, redundancy, hosts = catalog.read(lambda conn: _read_drives(conn, policies))
    drives = [_drive(row) for row in rows]
    raw = used = live = garbage = reserve = stranded = 0
    for row, drive in zip(rows, drives, strict=True):
        if drive["state"] in USABLE_STATES:
            raw += drive["size_bytes"]
            used += drive["written_bytes"]
            live += drive["live_bytes"]
            garbage += drive["garbage_bytes"]
            reserve += reserve_zones * row["zone_size"]
            # a full zone takes no more writes until it is reset: the tail past its write pointer
            stranded += int(row["full"] or 0) * row["zone_size"] - int(row["full_written"] or 0)
    warm = policies.get("warm")
    ratio = warm.k / (warm.k + warm.m) if warm is not None and warm.m else 1.0
    usable = int((raw - reserve) * ratio) if raw > reserve else 0
    free = max(int((raw - reserve - used) * ratio), 0)
    return {
        "catalog": {
            "url": _redact(catalog.url),
            "revision": current_revision(catalog.url),
            "backend": "sqlite" if catalog.is_sqlite else "postgresql",
            "inodes": inodes,
        },
        "drives": drives,
        "capacity": {
            "raw_bytes": raw,
            "usable_bytes": usable,
            "free_bytes": free,
            "written_bytes": used,
            "live_bytes": live,
            "garbage_bytes": garbage,
            "reserve_bytes": reserve,
            "stranded_bytes": stranded,
            "data_fraction": ratio,
        },
        # the failure domains: hosts, their drives and fragments, how many may be lost
        "hosts": hosts,
        # stripes missing a fragment (reduced), one loss from data loss, and beyond repair
        "redundancy": {
            "stripes": redundancy.stripes,
            "under_protected": redundancy.reduced,
            "no_redundancy": redundancy.no_redundancy,
            "lost": redundancy.lost,
            "on_draining": redundancy.on_draining,
        },
    }


def _read_drives(conn, policies: dict):
    """The inode count, each drive's row with its zones' counts and bytes, the redundancy and
    the hosts' status."""
    inodes = conn.execute(select(func.count()).select_from(INODES)).scalar_one()
    zone_stats = (
        select(
            ZONES.c.drive_id,
            func.count().label("zones"),
            func.sum(case((ZONES.c.state == "empty", 1), else_=0)).label("empty"),
            func.sum(case((ZONES.c.state == "open", 1), else_=0)).label("open"),
            func.sum(case((ZONES.c.state == "full", 1), else_=0)).label("full"),
            func.sum(ZONES.c.write_pointer).label("written"),
            func.sum(case((ZONES.c.state == "full", ZONES.c.write_pointer), else_=0)).label(
                "full_written"
            ),
            func.sum(ZONES.c.live_bytes).label("live"),
            func.sum(ZONES.c.garbage_bytes).label("garbage"),
        )
        .group_by(ZONES.c.drive_id)
        .subquery()
    )
    rows = (
        conn.execute(
            select(DRIVES, zone_stats)
            .outerjoin(zone_stats, zone_stats.c.drive_id == DRIVES.c.id)
            .order_by(DRIVES.c.id)
        )
        .mappings()
        .all()
    )
    k, m = stripe_shape(policies)
    return inodes, rows, redundancy_status_in(conn), hosts_status_in(conn, k, m)


def _drive(row) -> dict:
    """One drive's report; its state is "missing" when its path is gone (unless it failed or
    was removed anyway)."""
    if row["backend"] == "agent":
        present = True  # on another host: the daemon's drive watch records it missing
    elif row["backend"] == "zonefile":
        present = os.path.isdir(row["path"])
    else:
        present = os.path.exists(row["path"])
    return {
        "id": row["id"],
        "uuid": row["uuid"],
        "path": row["path"],
        "backend": row["backend"],
        "host": row["host"],
        "state": row["state"] if present or row["state"] in ("failed", "removed") else "missing",
        "size_bytes": row["zone_size"] * row["zone_count"],
        "zone_size": row["zone_size"],
        "zones": row["zone_count"],
        "zones_empty": int(row["empty"] or 0),
        "zones_open": int(row["open"] or 0),
        "zones_full": int(row["full"] or 0),
        "written_bytes": int(row["written"] or 0),
        "live_bytes": int(row["live"] or 0),
        "garbage_bytes": int(row["garbage"] or 0),
    }


def leader_report(catalog: Catalog, config, *, ask_etcd: bool = True) -> dict | None:
    """The cluster's maintenance leader; None on a single host (no [cluster] etcd_endpoints).

    From the catalog's fence: the host that took office last, its token and since when. With
    ``ask_etcd``, also who holds the leader key now (None: no one, office is vacant) or why etcd
    did not say (a leader that died shows in the fence until its successor takes office)."""
    from appliance.config import etcd_client, etcd_endpoints
    from engine.catalog import fence
    from engine.cluster.etcd import EtcdError
    from engine.cluster.leader import DEFAULT_KEY

    endpoints = etcd_endpoints(config.get("cluster.etcd_endpoints"))
    if not endpoints:
        return None
    row = fence.current(catalog)
    report: dict = {
        "holder": (row.holder or None) if row else None,
        "token": row.token if row and row.token else None,
        "since_ns": row.since_ns if row and row.since_ns else None,
    }
    if ask_etcd:
        try:
            key = etcd_client(config, timeout_s=1.0).get(DEFAULT_KEY)
            report["etcd_holder"] = key.value if key is not None else None
            report["etcd_error"] = None
        except EtcdError as exc:
            report["etcd_holder"], report["etcd_error"] = None, str(exc)
    return report


def leader_line(report: dict | None) -> str | None:
    """`shingle status`'s line on the leader, or None on a single host."""
    if report is None:
        return None
    if report["holder"] is None:
        line = "no host has taken office yet"
    else:
        line = f"{report['holder']} (token {report['token']})"
    if report.get("etcd_error"):
        line += f"; etcd did not answer: {report['etcd_error']}"
    elif "etcd_holder" in report and report["etcd_holder"] != report["holder"]:
        now = report["etcd_holder"]
        line += "; office vacant now" if now is None else f"; {now} is taking office"
    return line


def mds_address_report(config) -> dict | None:
    """The metadata server's floating address ([cluster] mds_address) and the head that holds
    it now, as etcd says (appliance/mds_address.py); None when there is none."""
    from appliance.config import etcd_client
    from appliance.mds_address import DEFAULT_KEY
    from engine.cluster.etcd import EtcdError

    address = config.get("cluster.mds_address")
    if not address:
        return None
    report: dict = {"address": address, "holder": None, "etcd_error": None}
    try:
        key = etcd_client(config, timeout_s=1.0).get(DEFAULT_KEY)
        report["holder"] = key.value if key is not None else None
    except EtcdError as exc:
        report["etcd_error"] = str(exc)
    return report


def mds_address_line(report: dict | None) -> str | None:
    """`shingle status`'s line on the floating address, or None without one."""
    if report is None:
        return None
    if report["etcd_error"]:
        return f"{report['address']}: etcd did not answer: {report['etcd_error']}"
    if report["holder"] is None:
        return f"{report['address']}: no head holds it now (the next takes it within its lease)"
    return f"{report['address']} on {report['holder']}"


SPACE_STATES = ("live", "garbage", "reserve", "free", "stranded")


def space_by_state(capacity: dict) -> dict[str, int]:
    """Raw bytes of the usable drives split into parts that add up to ``raw_bytes``:
    live (data stripes reference), garbage (written and not live: dead data, padding; band
    cleaning reclaims it), stranded (tails of full zones, writable again after a reset), reserve
    (empty space kept for band cleaning) and free (the rest of the writable space)."""
    raw, written = capacity["raw_bytes"], capacity["written_bytes"]
    live = min(capacity["live_bytes"], written)
    stranded = min(capacity["stranded_bytes"], raw - written)
    writable = raw - written - stranded
    reserve = min(capacity["reserve_bytes"], writable)
    return {
        "live": live,
        "garbage": written - live,
        "reserve": reserve,
        "free": writable - reserve,
        "stranded": stranded,
    }


def smb_report(data_dir, catalog: Catalog) -> dict:
    """smbd's health and sessions (smbstatus over the daemon's smb.conf) and the catalog's SMB
    shares and users; ``enabled`` is false where the daemon never served SMB."""
    from appliance.smb.samba import SambaLayout, smb_status
    from engine.admin import smb as smb_service

    report = smb_status(SambaLayout.for_data_dir(data_dir))
    shares = smb_service.list_shares(catalog)
    report.update(
        shares=len(shares),
        shares_enabled=sum(s.enabled for s in shares),
        users=len(smb_service.list_users(catalog)),
    )
    return report


def smb_line(report: dict) -> str:
    """The ``smb`` line of `shingle status`."""
    counted = (
        f"{report['shares_enabled']} of {report['shares']} shares enabled, {report['users']} users"
    )
    if not report["enabled"]:
        return f"not enabled (smb.port, or serve --smb-port PORT, serves it); {counted}"
    if report.get("problem"):
        state = f"smbd running (pid {report['pid']})" if report["running"] else "smbd not running"
        return f"FAILING: {report['problem']}; {state}; {counted}"
    if not report["running"]:
        return f"smbd not running; {counted}"
    sessions = report["sessions"]
    who = ", ".join(f"{s['user']}@{s['machine']}" for s in sessions[:5])
    line = (
        f"smbd running (pid {report['pid']}, port {report['port']}), {len(sessions)} "
        f"session{'' if len(sessions) == 1 else 's'}{': ' + who if who else ''}; {counted}"
    )
    return line + (f"; smbstatus: {report['error']}" if report["error"] else "")


def _redact(url: str) -> str:
    """Hide a password in a database URL."""
    if "://" in url and "@" in url:
        scheme, rest = url.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        if ":" in creds:
            return f"{scheme}://{creds.split(':', 1)[0]}:***@{host}"
    return url
