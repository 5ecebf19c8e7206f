"""Hosts as failure domains: how many may be lost without losing data.

A drive's ``host`` is the storage host whose agent serves it (NULL: the head's own host, named
LOCAL here). Placement (engine/datapath/space.py ``Space._choose``) puts a stripe's fragments on
as many hosts as it can, as evenly as it can. Losing a host loses every fragment on it; a
stripe survives while ``k`` of its fragments do. So a stripe survives the loss of any ``L``
hosts when the ``L`` hosts holding most of its readable fragments hold at most ``readable - k``
of them, and the pool survives ``min`` of that over its live stripes (``losable``).
``losable_by_placement`` says the same of the stripes placement would write now, from the hosts'
writable drives alone (the figure before any data is written, and after a rebuild)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from sqlalchemy import and_, func, select
from sqlalchemy.engine import Connection

from engine.catalog.models import Drive, Fragment, Stripe, Zone
from engine.coding.erasure import INLINE
from engine.lifecycle.drives import (
    DRAINING,
    FAILED,
    MISSING,
    OFFLINE_ZONE,
    PLACEABLE,
    READABLE,
    REMOVED,
)

DRIVES = Drive.__table__
ZONES = Zone.__table__
FRAGMENTS = Fragment.__table__
STRIPES = Stripe.__table__
LOCAL = "local"  # the name shown for the head's own host (drives without a host)


def host_name(host: str | None) -> str:
    return host or LOCAL


def losable(counts: list[int], spare: int) -> int:
    """How many hosts may go when hosts hold ``counts`` fragments of a stripe that can spare
    ``spare`` of them (readable - k): the worst case takes the fullest hosts first."""
    lost = 0
    taken = 0
    for count in sorted(counts, reverse=True):
        if taken + count > spare:
            break
        taken += count
        lost += 1
    return lost


def even_spread(drives_per_host: list[int], width: int) -> list[int]:
    """Fragments per host of a stripe of ``width`` placed as Space._choose does: each next
    fragment on a host holding the fewest so far that still has a drive to spare."""
    held = [0] * len(drives_per_host)
    for _ in range(width):
        free = [i for i, n in enumerate(drives_per_host) if held[i] < n]
        if not free:
            break
        held[min(free, key=lambda i: held[i])] += 1
    return [n for n in held if n]


def hosts_status_in(conn: Connection, k: int, m: int) -> dict:
    """The hosts, their drives and fragments, and the hosts that may be lost: of the stored
    stripes (``losable``; None when no stripe is stored) and of a ``k``+``m`` stripe placed
    now (``losable_by_placement``)."""
    drives = conn.execute(
        select(DRIVES.c.id, DRIVES.c.host, DRIVES.c.state).where(DRIVES.c.state != REMOVED)
    ).all()
    hosts: dict[str, dict] = {}
    for drive in drives:
        entry = hosts.setdefault(
            host_name(drive.host),
            {"name": host_name(drive.host), "drives": 0, "drives_readable": 0, "fragments": 0},
        )
        entry["drives"] += 1
        entry["drives_readable"] += drive.state in READABLE
        entry.setdefault("_writable", 0)
        entry["_writable"] += drive.state in PLACEABLE
    rows = conn.execute(
        select(STRIPES.c.id, STRIPES.c.k, DRIVES.c.host, func.count())
        .select_from(
            FRAGMENTS.join(STRIPES, STRIPES.c.id == FRAGMENTS.c.stripe_id)
            .join(DRIVES, DRIVES.c.id == FRAGMENTS.c.drive_id)
            .join(ZONES, ZONES.c.id == FRAGMENTS.c.zone_id)
        )
        .where(
            STRIPES.c.live_bytes > 0,
            STRIPES.c.layout != INLINE,  # inline bytes live in the catalog
            and_(DRIVES.c.state.in_(READABLE), ZONES.c.state != OFFLINE_ZONE),
        )
        .group_by(STRIPES.c.id, STRIPES.c.k, DRIVES.c.host)
    ).all()
    per_stripe: dict[int, list[int]] = defaultdict(list)
    stripe_k: dict[int, int] = {}
    for stripe_id, stripe_k_value, host, count in rows:
        per_stripe[stripe_id].append(int(count))
        stripe_k[stripe_id] = int(stripe_k_value)
        if host_name(host) in hosts:
            hosts[host_name(host)]["fragments"] += int(count)
    stored = [
        losable(counts, sum(counts) - stripe_k[stripe_id])
        for stripe_id, counts in per_stripe.items()
    ]
    writable = [h.pop("_writable") for h in hosts.values()]
    spread = even_spread(writable, k + m)
    by_placement = losable(spread, sum(spread) - k) if sum(spread) >= k else 0
    return {
        "count": len(hosts),
        "losable": min(stored) if stored else None,
        "losable_by_placement": by_placement,
        "hosts": sorted(hosts.values(), key=lambda h: h["name"]),
    }


def hosts_status(catalog, k: int, m: int) -> dict:
    return catalog.read(lambda conn: hosts_status_in(conn, k, m))


def spread_targets(
    candidates: list[int], host_of: Callable[[int], str], held: dict[str, int], want: int
) -> list[int]:
    """Up to ``want`` of ``candidates`` (drive ids, best first) for a stripe's rebuilt
    fragments, each next one on a host holding the fewest of the stripe's fragments so far
    (``held``, which its surviving fragments fill): as Space._choose places a new stripe."""
    held = dict(held)
    left = list(candidates)
    chosen: list[int] = []
    while left and len(chosen) < want:
        pick = min(range(len(left)), key=lambda i: (held.get(host_of(left[i]), 0), i))
        drive_id = left.pop(pick)
        chosen.append(drive_id)
        host = host_of(drive_id)
        held[host] = held.get(host, 0) + 1
    return chosen + left  # the rest in their order: spares if a chosen one cannot take it


UP, DEGRADED, DRAINING_HOST, LOST = "up", "degraded", "draining", "lost"
HOST_STATES = (UP, DEGRADED, DRAINING_HOST, LOST)


def host_state(drive_states_of_host: list[str]) -> str:
    """A host's state from its drives' states (removed ones left out):
    - ``up``: every drive online;
    - ``draining``: every drive draining (the host is emptied before it is removed);
    - ``degraded``: some drive not online (degraded, draining, missing or failed), at least one
      still serving reads;
    - ``lost``: no drive serves reads (all missing: its agent does not answer; or failed: it
      was declared gone): its fragments count as missing until rebuild puts them elsewhere."""
    if not any(s in READABLE for s in drive_states_of_host):
        return LOST
    if all(s == "online" for s in drive_states_of_host):
        return UP
    if all(s == DRAINING for s in drive_states_of_host):
        return DRAINING_HOST
    return DEGRADED


def host_states_in(conn: Connection) -> dict[str, dict]:
    """Each agent's host (drives without a host are the head's own, not here) with its drives
    not removed: {name: {"state" (host_state), "drives": [ids], "address", "answers"}}.
    ``answers`` is False when every drive is missing (its agent does not answer) and None for
    a lost host with a failed drive (declared gone: rebuilt from the other hosts)."""
    rows = conn.execute(
        select(DRIVES.c.id, DRIVES.c.host, DRIVES.c.state, DRIVES.c.path)
        .where(DRIVES.c.host.is_not(None), DRIVES.c.state != REMOVED)
        .order_by(DRIVES.c.id)
    ).all()
    hosts: dict[str, dict] = {}
    for row in rows:
        entry = hosts.setdefault(row.host, {"drives": [], "states": [], "address": row.path})
        entry["drives"].append(row.id)
        entry["states"].append(row.state)
    for entry in hosts.values():
        states = entry.pop("states")
        entry["state"] = host_state(states)
        entry["answers"] = (
            True
            if entry["state"] != LOST
            else None
            if FAILED in states
            else not all(s == MISSING for s in states)
        )
    return hosts
