"""Hosts of a cluster as a whole: join, drain, remove (gone for good), replace.

A host is the drives one agent serves (``drives.host``); these operations act on all of them at
once, through the drive states and the rebuild every drive operation uses
(engine/lifecycle/rebuild.py), so stripes keep their spread over hosts
(``hosts.spread_targets``) and every moved or rebuilt fragment is checked (its checksum read
back by the writer's path, the stripe's others verified before a decode):

- ``join_host``: the agent's drives recorded (``add_agent_drives``, what `shingle
  drives-attach` did) and handed to the running data path, then a rebuild, so stripes that lost
  fragments get them back on the new host.
- ``drain_host``: every drive of a host that answers becomes ``draining``; its fragments are
  copied to the other hosts (paced), and each drive ends ``removed`` when empty. Refused when
  the other hosts could not hold a stripe of the widest band class on different drives, or
  have no room for what the host holds.
- ``remove_host``: a host out of the pool. A drained host (or one that holds nothing) is
  removed at once; a lost host (its agent does not answer) is declared gone for good: its
  drives become ``failed`` and its fragments are rebuilt from the other hosts' (paced), then
  removed. A host that answers and still holds fragments is refused: drain it first.
- ``replace_host``: join the new host, then drain the old one if it answers, else remove it.

``queue_rebuild_after_returns`` (the maintenance leader, each round): a rebuild job once a
missing drive is back (a host's agent answering again, a folder back) while stripes are short of
their width: written while it was away, they committed at the write quorum, and only a rebuild
completes them.

Each one records an event (``host.joined``, ``host.draining``, ``host.drained``, ``host.gone``,
``host.removed``) and returns the rebuild report as a job result, with ``host`` and its
``written_by_host`` (where the fragments went). While they run, the hosts' read model
(engine/admin/hosts.py) shows per host what is left and the job's progress and rate."""

from __future__ import annotations

import json
import time

from sqlalchemy import func, select

from engine.admin import jobs
from engine.admin.events import record, record_in
from engine.base import errors
from engine.catalog.database import Catalog
from engine.catalog.models import Drive, Event, Fragment, Zone
from engine.lifecycle import drives as drive_states
from engine.lifecycle.hosts import DRAINING_HOST, LOST, host_states_in
from engine.lifecycle.rebuild import Rebuilder, short_work
from engine.lifecycle.replace import rebuild_report

DRIVES = Drive.__table__
FRAGMENTS = Fragment.__table__
ZONES = Zone.__table__
HOST_JOBS = ("host-join", "host-drain", "host-remove", "host-replace")


def resolve_host_in(conn, host: str) -> dict:
    """The host's entry (host_states_in); NotFound naming the known hosts."""
    hosts = host_states_in(conn)
    if host in hosts:
        return hosts[host]
    ever = conn.execute(select(DRIVES.c.id).where(DRIVES.c.host == host).limit(1)).scalar()
    if ever is not None:
        raise errors.NotFound(f"host {host!r} is out of the pool already (its drives are removed)")
    known = ", ".join(sorted(hosts)) or "none"
    raise errors.NotFound(f"no host {host!r} (hosts: {known}; see `shingle cluster status`)")


def check_others_suffice_in(conn, host: str, policies: dict) -> None:
    """Refuse to take ``host`` out of placement when the drives left taking writes could not
    hold a stripe of the widest band class on different drives, or the bytes it holds."""
    rows = conn.execute(
        select(DRIVES.c.id, DRIVES.c.host, DRIVES.c.state, DRIVES.c.zone_size, DRIVES.c.zone_count)
        .where(DRIVES.c.state.in_(drive_states.PLACEABLE))
        .where((DRIVES.c.host != host) | DRIVES.c.host.is_(None))
    ).all()
    widest = max(policies.values(), key=lambda p: p.width)
    hosts_left = {r.host for r in rows}
    if len(rows) < widest.width:
        raise errors.InvalidArgument(
            f"taking host {host} out leaves {len(rows)} drives on {len(hosts_left)} hosts "
            f"that take writes; a {widest.name} stripe needs {widest.width} different drives: "
            "join a host first (`shingle cluster join HOST:PORT`)"
        )
    written = dict(
        conn.execute(
            select(ZONES.c.drive_id, func.coalesce(func.sum(ZONES.c.write_pointer), 0)).group_by(
                ZONES.c.drive_id
            )
        ).all()
    )
    free = sum(r.zone_size * r.zone_count - int(written.get(r.id, 0)) for r in rows)
    held = conn.execute(
        select(func.coalesce(func.sum(FRAGMENTS.c.length), 0))
        .select_from(FRAGMENTS.join(DRIVES, DRIVES.c.id == FRAGMENTS.c.drive_id))
        .where(DRIVES.c.host == host)
    ).scalar_one()
    if int(held) > free:
        raise errors.NoSpace(
            f"host {host} holds {int(held)} bytes of fragments and the other hosts have "
            f"{free} bytes free: free space or join a host first"
        )


def start_drain_host(catalog: Catalog, host: str, policies: dict, *, actor: str) -> list[int]:
    """Mark every drive of ``host`` draining (one transaction, one ``host.draining`` event);
    returns its drive ids. Refused for a host that does not answer (nothing can be read off
    it: remove it instead) and when the others do not suffice (check_others_suffice_in)."""

    def work(conn):
        entry = resolve_host_in(conn, host)
        if entry["state"] == LOST:
            raise errors.InvalidArgument(
                f"host {host} is lost: no drive of it answers, nothing can be copied off it; "
                f"`shingle cluster remove {host}` rebuilds its fragments from the other hosts"
            )
        if entry["state"] == DRAINING_HOST:
            return entry["drives"]
        check_others_suffice_in(conn, host, policies)
        for drive_id in entry["drives"]:  # a missing or failed one is rebuilt by the drain
            state = conn.execute(select(DRIVES.c.state).where(DRIVES.c.id == drive_id)).scalar_one()
            if state in (drive_states.ONLINE, drive_states.DEGRADED):
                drive_states.set_drive_state_in(
                    conn, drive_id, drive_states.DRAINING, actor=actor, reason=f"host {host} drains"
                )
        record_in(
            conn,
            "host.draining",
            f"host {host}: its {len(entry['drives'])} drives drain onto the other hosts",
            actor=actor,
            details={"host": host, "drives": entry["drives"]},
        )
        return entry["drives"]

    return catalog.run(work)


def drain_host(
    datapath,
    catalog: Catalog,
    host: str,
    *,
    progress=None,
    actor: str = "system",
    bytes_per_s: float | None = None,
) -> dict:
    """Move every fragment off ``host`` onto the others (paced), its drives then ``removed``."""
    drive_ids = start_drain_host(catalog, host, datapath.policies, actor=actor)
    datapath.refresh_drive_states()
    report = Rebuilder(datapath, catalog, bytes_per_s=bytes_per_s).run(
        progress=progress, actor=actor, drive_ids=drive_ids
    )
    left = _finish(catalog, host, drive_ids, "host.drained", "drained onto the other hosts", actor)
    datapath.refresh_drive_states()
    return rebuild_report(datapath, report, host=host, drives=drive_ids, fragments_left=left)


def remove_host(
    datapath,
    catalog: Catalog,
    host: str,
    *,
    progress=None,
    actor: str = "system",
    bytes_per_s: float | None = None,
) -> dict:
    """Take ``host`` out of the pool: at once when it holds nothing; declared gone for good
    (its fragments rebuilt from the other hosts, paced) when it does not answer; refused when
    it answers and holds fragments (drain it first)."""
    drive_ids = start_remove_host(catalog, host, datapath.policies, actor=actor)
    datapath.refresh_drive_states()
    report = Rebuilder(datapath, catalog, bytes_per_s=bytes_per_s).run(
        progress=progress, actor=actor, drive_ids=drive_ids
    )
    left = _finish(
        catalog, host, drive_ids, "host.removed", "removed from the pool", actor, retire=True
    )
    datapath.refresh_drive_states()
    return rebuild_report(datapath, report, host=host, drives=drive_ids, fragments_left=left)


def start_remove_host(catalog: Catalog, host: str, policies: dict, *, actor: str) -> list[int]:
    """Take ``host`` out of placement (one transaction): a lost host's drives become
    ``failed`` (one ``host.gone`` event), an empty one's ``draining``; returns its drive ids.
    Refused for a host that answers and holds fragments, and when the others do not suffice."""
    return catalog.run(lambda conn: _start_remove_in(conn, host, policies, actor))


def _start_remove_in(conn, host: str, policies: dict, actor: str) -> list[int]:
    entry = resolve_host_in(conn, host)
    held = dict(
        conn.execute(
            select(FRAGMENTS.c.drive_id, func.count())
            .where(FRAGMENTS.c.drive_id.in_(entry["drives"]))
            .group_by(FRAGMENTS.c.drive_id)
        ).all()
    )
    if entry["state"] != LOST and any(held.values()):
        raise errors.InvalidArgument(
            f"host {host} answers and holds {sum(held.values())} fragments: drain it first "
            f"(`shingle cluster drain {host}`), or stop its agent if it is to be rebuilt from "
            "the other hosts"
        )
    check_others_suffice_in(conn, host, policies)
    failed = 0
    for drive_id in entry["drives"]:
        state = conn.execute(select(DRIVES.c.state).where(DRIVES.c.id == drive_id)).scalar_one()
        if state == drive_states.MISSING:
            drive_states.set_drive_state_in(
                conn, drive_id, drive_states.FAILED, actor=actor, reason=f"host {host} is gone"
            )
            failed += 1
        elif state in (drive_states.ONLINE, drive_states.DEGRADED):  # empty: drained at once
            drive_states.set_drive_state_in(
                conn, drive_id, drive_states.DRAINING, actor=actor, reason=f"host {host} removed"
            )
    if failed:
        record_in(
            conn,
            "host.gone",
            f"host {host} is declared gone for good: its fragments are rebuilt on the other hosts",
            severity="warning",
            actor=actor,
            details={"host": host, "drives": entry["drives"], "fragments": sum(held.values())},
        )
    return entry["drives"]


def _finish(
    catalog: Catalog,
    host: str,
    drive_ids: list[int],
    kind: str,
    what: str,
    actor: str,
    *,
    retire: bool = False,
) -> int:
    """Drives of ``host`` left empty become ``removed`` (``retire``: failed ones too); the
    ``kind`` event once none is left in the pool. Returns the fragments still on them."""

    def work(conn):
        left = 0
        for drive_id in drive_ids:
            state = conn.execute(select(DRIVES.c.state).where(DRIVES.c.id == drive_id)).scalar_one()
            count = conn.execute(
                select(func.count()).select_from(FRAGMENTS).where(FRAGMENTS.c.drive_id == drive_id)
            ).scalar_one()
            left += count
            empty_and_done = state == drive_states.DRAINING or (
                retire and state == drive_states.FAILED
            )
            if not count and empty_and_done:
                drive_states.set_drive_state_in(
                    conn, drive_id, drive_states.REMOVED, actor=actor, reason=f"host {host} {what}"
                )
        remaining = conn.execute(
            select(func.count())
            .select_from(DRIVES)
            .where(DRIVES.c.id.in_(drive_ids), DRIVES.c.state != drive_states.REMOVED)
        ).scalar_one()
        if not remaining:
            record_in(
                conn,
                kind,
                f"host {host} is {what}",
                actor=actor,
                details={"host": host, "drives": drive_ids},
            )
        return left

    return catalog.run(work)


def check_agent_geometry(served: dict, policies: dict, address: str) -> None:
    """Refuse an agent (its HELLO, ``served``) whose zones cannot hold the band classes'
    largest fragment: recorded, its drives would stop every head from starting."""
    largest = max(p.max_fragment_length for p in policies.values())
    small = [d for d in served.get("drives", []) if int(d["zone_size"]) < largest]
    if small:
        raise errors.InvalidArgument(
            f"agent {address} serves drives with zones of {int(small[0]['zone_size'])} bytes; "
            f"the band classes' largest fragment takes {largest}: start it with a larger "
            "--zone-size"
        )


def join_host(
    datapath,
    catalog: Catalog,
    address: str,
    *,
    progress=None,
    actor: str = "system",
    bytes_per_s: float | None = None,
) -> dict:
    """Record the drives of the agent at ``address`` (HOST:PORT), start using them, rebuild."""
    from engine.drives import add_agent_drives
    from engine.drives.remote import hello

    served = hello(address)
    check_agent_geometry(served, datapath.policies, address)
    host = str(served.get("host") or address)
    added = add_agent_drives(catalog, address)
    for drive_id in added:
        datapath.add_drive(drive_id)
    if added:
        record(
            catalog,
            "host.joined",
            f"host {host} joined with {len(added)} drives (its agent at {address})",
            actor=actor,
            details={"host": host, "address": address, "drives": added},
        )
    report = Rebuilder(datapath, catalog, bytes_per_s=bytes_per_s).run(
        progress=progress, actor=actor
    )
    return rebuild_report(datapath, report, host=host, address=address, drives_added=added)


def replace_host(
    datapath,
    catalog: Catalog,
    old: str,
    address: str,
    *,
    progress=None,
    actor: str = "system",
    bytes_per_s: float | None = None,
) -> dict:
    """Join the agent at ``address``, then drain ``old`` if it answers, else remove it."""
    state = catalog.read(lambda conn: resolve_host_in(conn, old))["state"]
    joined = join_host(datapath, catalog, address, actor=actor, bytes_per_s=bytes_per_s)
    retire = remove_host if state == LOST else drain_host
    result = retire(datapath, catalog, old, progress=progress, actor=actor, bytes_per_s=bytes_per_s)
    result["joined"] = {k: joined[k] for k in ("host", "address", "drives_added")}
    return result


def pending_host_job(catalog: Catalog, host: str) -> jobs.JobRecord | None:
    """The newest host job naming ``host`` that is queued or running."""
    return next(
        (
            j
            for j in jobs.recent(catalog, 100)
            if j.kind in HOST_JOBS and not j.finished and j.params.get("host") == host
        ),
        None,
    )


def hosts_lost_since(catalog: Catalog) -> dict[str, int]:
    """Hosts whose agent does not answer now, with when that was first noticed (the open
    ``host_lost`` alert's first time, in ns): one figure every head agrees on."""
    from engine.catalog.models import Alert

    alerts = Alert.__table__

    def work(conn):
        lost = {n for n, h in host_states_in(conn).items() if h["answers"] is False}
        rows = conn.execute(
            select(alerts.c.key, alerts.c.first_ns).where(
                alerts.c.kind == "host_lost", alerts.c.state.in_(("active", "acknowledged"))
            )
        ).all()
        return {key[len("host:") :]: int(first) for key, first in rows if key[5:] in lost}

    return catalog.read(work)


def queue_gone_hosts(catalog: Catalog, gone_after_s: float) -> list[int]:
    """A host-remove job for each host lost longer than ``gone_after_s`` with no host job of
    its own queued or running; returns the jobs' ids."""
    if not gone_after_s:
        return []
    now = time.time_ns()
    queued = []
    for host, since_ns in hosts_lost_since(catalog).items():
        if now - since_ns < gone_after_s * 1e9 or pending_host_job(catalog, host) is not None:
            continue
        queued.append(
            jobs.submit(
                catalog,
                "host-remove",
                {"host": host, "why": f"lost for more than {gone_after_s:g} s"},
                actor="schedule",
            )
        )
    return queued


RETURNS_SEEN_KEY = "maintenance.returns_seen_event"  # the newest drive.state event looked at


def queue_rebuild_after_returns(catalog: Catalog) -> int | None:
    """A rebuild job when a drive that was missing became readable again since the last call
    (its ``drive.state`` event) and stripes are short of their width, unless a rebuild is queued
    or running already (it completes them too); returns the job's id. Each call reads only the
    events newer than the last one it saw (a setting keeps its id)."""
    events = Event.__table__
    seen = int(catalog.get_setting(RETURNS_SEEN_KEY) or 0)

    def work(conn):
        newest = conn.execute(select(func.max(events.c.id))).scalar() or 0
        changes = conn.execute(
            select(events.c.details).where(
                events.c.id > seen, events.c.id <= newest, events.c.kind == "drive.state"
            )
        ).scalars()
        return newest, [json.loads(text) for text in changes if text]

    newest, changes = catalog.read(work)
    if newest <= seen:
        return None
    catalog.set_setting(RETURNS_SEEN_KEY, str(newest))
    returned = [
        c.get("drive_id")
        for c in changes
        if c.get("from") == drive_states.MISSING and c.get("to") in drive_states.READABLE
    ]
    if not returned or jobs.pending(catalog, "rebuild"):
        return None
    stripes, fragments, _nbytes = catalog.read(short_work)
    if not stripes:
        return None
    return jobs.submit(
        catalog,
        "rebuild",
        {
            "why": f"drives {', '.join(map(str, returned))} back: {stripes} stripes were "
            f"written without {fragments} of their fragments meanwhile"
        },
        actor="schedule",
    )
