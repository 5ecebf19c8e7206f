"""The hosts of the cluster as the admin sees them: each storage host with its drives, its
state, the bytes and fragments it holds and what waits to be rebuilt or moved off it, and how
many hosts may be lost without losing data.

Read from the catalog alone, in one transaction (the web UI never opens a drive). A host is
the ``host`` of its drives (engine/lifecycle/hosts.py: NULL is the head's own, ``local``);
drives that were removed are out of the pool and of this view. How many hosts may be lost is
engine/lifecycle/hosts.py's arithmetic, the same figure `shingle status` and /metrics give.

A host's state comes from its drives' states (``host_state`` in engine/lifecycle/hosts.py,
which the host operations and the host_lost alert decide by too): up, draining, degraded, lost.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from engine.admin import jobs
from engine.base import errors
from engine.catalog.database import Catalog
from engine.catalog.models import Drive, Fragment, Zone
from engine.lifecycle import drives as drive_states
from engine.lifecycle.hosts import HOST_STATES, host_name, host_state, hosts_status_in

DRIVES = Drive.__table__
UP, DEGRADED, DRAINING, LOST = HOST_STATES  # host_state's words
ZONES = Zone.__table__
FRAGMENTS = Fragment.__table__
# fragments on drives in these states wait for a rebuild (failed, missing) or a drain to move
# them; rebuild itself counts failed and removed (engine/lifecycle/rebuild.py pending_work)
WAITING_STATES = (drive_states.FAILED, drive_states.MISSING, drive_states.DRAINING)
# the jobs that move fragments between hosts (the hosts' own: engine/lifecycle/hostops.py)
MOVING_JOBS = ("rebuild", "drain", "host-join", "host-drain", "host-remove", "host-replace")


@dataclass(frozen=True)
class HostDrive:
    id: int
    uuid: str
    path: str
    backend: str
    state: str
    capacity_bytes: int
    written_bytes: int  # the sum of its zones' write pointers
    live_bytes: int
    garbage_bytes: int
    fragments: int  # fragment rows on it
    fragment_bytes: int  # their lengths: the bytes it holds for stripes


@dataclass(frozen=True)
class Host:
    name: str
    state: str  # one of HOST_STATES
    drives: tuple[HostDrive, ...]

    @property
    def address(self) -> str | None:
        """Its drive agent's HOST:PORT (None: the head's own drives)."""
        return next((d.path for d in self.drives if d.backend == "agent"), None)

    @property
    def drives_readable(self) -> int:
        return sum(d.state in drive_states.READABLE for d in self.drives)

    @property
    def capacity_bytes(self) -> int:
        return sum(d.capacity_bytes for d in self.drives)

    @property
    def written_bytes(self) -> int:
        return sum(d.written_bytes for d in self.drives)

    @property
    def live_bytes(self) -> int:
        return sum(d.live_bytes for d in self.drives)

    @property
    def fragments(self) -> int:
        return sum(d.fragments for d in self.drives)

    @property
    def fragment_bytes(self) -> int:
        return sum(d.fragment_bytes for d in self.drives)

    @property
    def waiting_fragments(self) -> int:
        """Fragments on its failed, missing or draining drives: what a rebuild or a drain has
        yet to put on other drives (zero once it is done)."""
        return sum(d.fragments for d in self.drives if d.state in WAITING_STATES)

    @property
    def waiting_bytes(self) -> int:
        return sum(d.fragment_bytes for d in self.drives if d.state in WAITING_STATES)

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "state": self.state,
            "drives": [asdict(d) for d in self.drives],
            "drives_readable": self.drives_readable,
            "capacity_bytes": self.capacity_bytes,
            "written_bytes": self.written_bytes,
            "live_bytes": self.live_bytes,
            "fragments": self.fragments,
            "fragment_bytes": self.fragment_bytes,
            "waiting_fragments": self.waiting_fragments,
            "waiting_bytes": self.waiting_bytes,
            "address": self.address,
        }


@dataclass(frozen=True)
class Cluster:
    hosts: tuple[Host, ...]
    k: int
    m: int
    losable: int | None  # hosts the stored stripes survive losing (None: no stripe stored)
    losable_by_placement: int  # hosts a stripe written now survives losing
    moving: tuple[jobs.JobRecord, ...]  # rebuild and drain jobs queued or running

    @property
    def may_lose(self) -> int:
        """Hosts that may be lost without losing data: of the stored stripes, or before any is
        stored, of one written now (the figure status and /metrics show)."""
        return self.losable_by_placement if self.losable is None else self.losable

    def host(self, name: str) -> Host:
        for host in self.hosts:
            if host.name == name:
                return host
        known = ", ".join(h.name for h in self.hosts) or "none"
        raise errors.NotFound(f"no host {name!r} with drives in the pool (hosts: {known})")

    def operation(self, host: Host, now_ns: int | None = None) -> dict | None:
        """The moving job that works on ``host`` (a host job naming it, or a drive's drain of
        one of its drives), with its progress and its rate since it started; None if none."""
        ids = {d.id for d in host.drives}
        for job in self.moving:
            drive = str(job.params.get("drive"))  # an id, or a uuid the drive list would name
            if job.params.get("host") == host.name or (
                job.kind == "drain" and drive.isdigit() and int(drive) in ids
            ):
                now = now_ns or time.time_ns()
                elapsed = (now - job.started_ns) / 1e9 if job.started_ns else 0.0
                return {
                    "job": job.id,
                    "kind": job.kind,
                    "state": job.state,
                    "done_bytes": job.done,
                    "total_bytes": job.total,
                    "mb_per_s": round(job.done / 1e6 / elapsed, 2) if elapsed > 0 else 0.0,
                    "message": job.message,
                }
        return None

    def to_dict(self) -> dict:
        return {
            "count": len(self.hosts),
            "k": self.k,
            "m": self.m,
            "losable": self.losable,
            "losable_by_placement": self.losable_by_placement,
            "may_lose": self.may_lose,
            "hosts": [{**h.to_dict(), "operation": self.operation(h)} for h in self.hosts],
            "moving": [j.to_dict() for j in self.moving],
        }


def stripe_shape(policies: dict) -> tuple[int, int]:
    """(k, m) of the stripes placement writes for settled data: the warm policy's (else the
    first one's; 8+2 with none), as the losable-host figures count them."""
    policy = policies.get("warm") or next(iter(policies.values()), None)
    return (policy.k, policy.m) if policy is not None else (8, 2)


def cluster_in(conn: Connection, k: int, m: int) -> Cluster:
    zone_rows = conn.execute(
        select(
            ZONES.c.drive_id,
            func.coalesce(func.sum(ZONES.c.write_pointer), 0),
            func.coalesce(func.sum(ZONES.c.live_bytes), 0),
            func.coalesce(func.sum(ZONES.c.garbage_bytes), 0),
        ).group_by(ZONES.c.drive_id)
    ).all()
    zones = {row[0]: tuple(int(v) for v in row[1:]) for row in zone_rows}
    fragment_rows = conn.execute(
        select(
            FRAGMENTS.c.drive_id, func.count(), func.coalesce(func.sum(FRAGMENTS.c.length), 0)
        ).group_by(FRAGMENTS.c.drive_id)
    ).all()
    fragments = {row[0]: (int(row[1]), int(row[2])) for row in fragment_rows}
    by_host: dict[str, list[HostDrive]] = {}
    for d in conn.execute(
        select(DRIVES).where(DRIVES.c.state != drive_states.REMOVED).order_by(DRIVES.c.id)
    ):
        written, live, garbage = zones.get(d.id, (0, 0, 0))
        count, nbytes = fragments.get(d.id, (0, 0))
        by_host.setdefault(host_name(d.host), []).append(
            HostDrive(
                d.id,
                d.uuid,
                d.path,
                d.backend,
                d.state,
                d.zone_size * d.zone_count,
                written,
                live,
                garbage,
                count,
                nbytes,
            )
        )
    hosts = tuple(
        Host(name, host_state([d.state for d in drives]), tuple(drives))
        for name, drives in sorted(by_host.items())
    )
    status = hosts_status_in(conn, k, m)
    return Cluster(
        hosts,
        k,
        m,
        status["losable"],
        status["losable_by_placement"],
        tuple(jobs.active_in(conn, MOVING_JOBS)),
    )


def cluster(catalog: Catalog, k: int, m: int) -> Cluster:
    """The hosts and what they hold, in one read of the catalog."""
    return catalog.read(lambda conn: cluster_in(conn, k, m))
