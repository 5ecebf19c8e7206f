"""Space: the drives and zones the data path writes to, and who may use which bytes of them.

``Space`` owns the in-memory mirror of drives and zones (drivestate.py) and the one lock that
guards it (``lock``, rank "datapath.space"). Its operations:
- reserve / unreserve: raw bytes promised to buffered writes (checked at write time, so a
  write that cannot be placed fails with ENOSPC before anything is buffered; with fewer
  writable drives than the band class's write quorum it fails with NoRedundancy, an EIO);
- place: choose the zones of a stripe's k+m fragments and move their append positions;
- claim / close / take / settle: zones of the lifecycle jobs (engine/lifecycle/media.py);
- pin / unpin: a zone with pins (``ZoneMem.inflight``) is never reset;
- reclaim_zones: reset zones that hold only garbage (invariant 6)."""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from typing import TYPE_CHECKING, NamedTuple

from sqlalchemy import func, select

from engine.base import errors
from engine.base.blocking import holding, may_block
from engine.base.ordered_lock import lock, rlock
from engine.base.ratelog import RateLimitedLog
from engine.catalog.models import Drive, Fragment, Stripe, Zone
from engine.coding.erasure import ALIGNMENT_SLACK, Policy, fragment_length
from engine.datapath.drivestate import DriveState, ZoneMem

if TYPE_CHECKING:
    from engine.datapath.writers import DriveWriters

DRIVES = Drive.__table__
ZONES = Zone.__table__
STRIPES = Stripe.__table__
FRAGMENTS = Fragment.__table__

log = logging.getLogger("shingle.datapath")


class PlacedFragment(NamedTuple):
    """Where one fragment of a stripe goes: ``length`` bytes at ``offset`` of ``zone``."""

    drive: DriveState
    zone: ZoneMem
    offset: int
    length: int
    idx: int  # the fragment's index in its stripe


def padded(length: int, granularity: int) -> int:
    """``length`` rounded up to the drive's write granularity (a block device pads appends)."""
    return -(-length // granularity) * granularity


class Space:
    """The drives' zones as the writers see them: which are open, empty, pinned or being
    claimed, where each write pointer stands, how much room is left and reserved, and where the
    next stripe's fragments go (spread over hosts, then drives).

    One class of about 450 lines on purpose: placement, reservation, zone resets and claims all
    read and change the same zone states under the one ``datapath.space`` lock (rank 40, held
    across a reset), and each must see the others' changes at once; split into classes, each
    would need that lock and the invariants of the others (docs/datapath.md)."""

    def __init__(
        self,
        catalog,
        policies: dict[str, Policy],
        default_class: str,
        reserve_zones: int,
        stats,
        *,
        smr_model=None,
        zone_share: tuple[int, int] = (0, 1),
    ):
        self.catalog = catalog
        # (index, count) of heads writing the same drives: this one opens only the zones whose
        # number modulo count is its index (docs/pnfs.md), so no two heads append to one zone
        self.zone_share = zone_share
        self.policies = policies
        self.default_class = default_class
        self.reserve_zones = reserve_zones
        self.stats = stats
        self.writers: DriveWriters | None = None  # set once they exist, before any write
        self.lock = rlock("datapath.space")  # drives' open/empty zones, zone positions and pins
        self.drives: dict[int, DriveState] = {}
        self.zones: dict[int, ZoneMem] = {}
        # zones whose state or class changed since the last commit batch recorded them (under
        # ``lock``): a batch looks at these, not at every zone of every drive
        self.dirty: dict[int, ZoneMem] = {}
        self.zone_drive: dict[int, DriveState] = {}
        # Guards _reserved alone. release() takes it inside the namespace's catalog transaction,
        # so it must never be held while waiting for the catalog (as ``lock`` is, in
        # reserve -> reclaim_zones): otherwise each side waits for the other's lock.
        self._reserve_lock = lock("datapath.reserve")
        self._reserved = 0
        self._reclaimable: dict[int, int] = {}
        self._rr = 0
        self._warn = RateLimitedLog(log)
        self._load_drives(smr_model)

    def owns(self, zone_idx: int) -> bool:
        """Whether this head may open, append to or reset the zone of that number."""
        index, count = self.zone_share
        return zone_idx % count == index

    # -- drives -------------------------------------------------------------------------
    def _load_drives(self, smr_model) -> None:
        def work(conn):
            drives = conn.execute(
                select(DRIVES).where(DRIVES.c.state != "removed").order_by(DRIVES.c.id)
            ).all()
            zones = defaultdict(list)
            for row in conn.execute(select(ZONES)):
                zones[row.drive_id].append(row)
            return drives, zones

        drives, zones = self.catalog.read(work)
        for row in drives:
            drive = DriveState(row, zones[row.id])
            if smr_model is not None and drive.backend is not None:
                drive.backend.model = smr_model
                drive.backend.model_key = drive.id
            self.drives[drive.id] = drive
            for zone in drive.zones:
                self.zones[zone.id] = zone
                self.zone_drive[zone.id] = drive

    def add_drive(self, drive_id: int, smr_model=None) -> DriveState:
        """Take a drive added to the catalog while the data path runs (``drives add``): its
        in-memory state joins the shared maps under the space lock, empty zones included."""

        def work(conn):
            row = conn.execute(select(DRIVES).where(DRIVES.c.id == drive_id)).one()
            return row, conn.execute(select(ZONES).where(ZONES.c.drive_id == drive_id)).all()

        row, zone_rows = self.catalog.read(work)
        drive = DriveState(row, zone_rows)
        if drive.backend is None:
            raise errors.IOFailure(
                f"drive {drive_id} ({row.path}) cannot be opened: {drive.open_error}"
            )
        if smr_model is not None:
            drive.backend.model = smr_model
            drive.backend.model_key = drive.id
        with self.lock:
            for zone in drive.zones:
                if zone.state == "empty" and zone.wp == 0 and self.owns(zone.idx):
                    drive.empty.add(zone.idx)
                self.zones[zone.id] = zone
                self.zone_drive[zone.id] = drive
            self.drives[drive.id] = drive
        return drive

    def refresh_drive_states(self) -> None:
        """Re-read Drive.state (an admin or the rebuild engine may have changed it)."""
        rows = self.catalog.read(
            lambda conn: conn.execute(select(DRIVES.c.id, DRIVES.c.state)).all()
        )
        for row in rows:
            drive = self.drives.get(row.id)
            if drive is not None:
                drive.state = row.state

    def empty_zone_counts(self) -> dict[int, int]:
        """Empty zones per writable drive, as they are now."""
        with self.lock:
            return {d.id: len(d.empty) for d in self.drives.values() if d.writable()}

    def drives_with_room(self, exclude=(), reserve: int = 0) -> list[tuple[int, int]]:
        """(empty zones, drive id) of writable drives not in ``exclude``, more than ``reserve``."""
        with self.lock:
            return [
                (len(d.empty), d.id)
                for d in self.drives.values()
                if d.writable() and d.id not in exclude and len(d.empty) > reserve
            ]

    # -- capacity -----------------------------------------------------------------------
    def refresh_reclaimable(self) -> None:
        def work(conn):
            return conn.execute(
                select(ZONES.c.drive_id, func.count())
                .where(ZONES.c.state == "full", ZONES.c.live_bytes == 0)
                .group_by(ZONES.c.drive_id)
            ).all()

        self._reclaimable = {row[0]: row[1] for row in self.catalog.read(work)}

    def usable(self, policy: Policy | None = None) -> int:
        fragment = (policy or self.policies[self.default_class]).max_fragment_length
        return sum(
            d.usable_bytes(self.reserve_zones, fragment, self._reclaimable.get(d.id, 0))
            for d in self.drives.values()
            if d.writable()
        )

    def spare(self) -> int:
        """Usable raw bytes that no buffered write has reserved."""
        return self.usable() - self._reserved

    def capacity(self) -> tuple[int, int]:
        """Usable (total, free) bytes of user data: raw x k/(k+m), less the cleaning reserve."""
        policy = self.policies[self.default_class]
        self.refresh_reclaimable()
        with self.lock:
            raw = sum(
                max(d.zone_count - self.reserve_zones, 0) * d.zone_size
                for d in self.drives.values()
                if d.state not in ("failed", "missing", "removed")
            )
            free = max(self.usable() - self._reserved, 0)
        return int(raw * policy.efficiency), int(free * policy.efficiency)

    @staticmethod
    def need(policy: Policy, length: int) -> int:
        """Raw bytes to reserve for ``length`` user bytes (headers of every stripe they start)."""
        stripes = 2 + length // policy.stripe_size
        return policy.width * (
            -(-length // policy.k) + stripes * (policy.header_size + ALIGNMENT_SLACK)
        )

    def check_redundancy(self, policy: Policy, writable: int | None = None) -> None:
        """Raise NoRedundancy when fewer drives take writes than ``policy``'s write quorum: no
        stripe of it can be placed, however much space is free (logged once a minute)."""
        drives = self.drives.values()
        if writable is None:
            writable = sum(1 for d in drives if d.writable())
        if writable >= policy.write_quorum:
            return
        unavailable = ", ".join(f"drive {d.id} {d.condition()}" for d in drives if not d.writable())
        message = (
            f"a {policy.name} stripe needs {policy.width} drives (at least "
            f"{policy.write_quorum}) and only {writable} of {len(self.drives)} take writes "
            f"({unavailable}): writes of this band class are refused until drives come back"
        )
        self._warn.error(message, "%s", message)
        raise errors.NoRedundancy(message)

    def reserve(self, need: int, policy: Policy) -> None:
        self.check_redundancy(policy)
        with holding(self.lock, "zones being placed"):
            with self._reserve_lock:
                if self._reserved + need <= self.usable(policy):
                    self._reserved += need
                    return
            may_block("reclaiming zones")
            self.reclaim_zones()
            self.refresh_reclaimable()
            with self._reserve_lock:
                if self._reserved + need > self.usable(policy):
                    raise errors.NoSpace(
                        f"no space for {need} more raw bytes: "
                        f"{self.usable(policy) - self._reserved} usable on "
                        f"{sum(d.writable() for d in self.drives.values())} writable drives"
                    )
                self._reserved += need

    def unreserve(self, amount: int) -> None:
        if amount:
            with self._reserve_lock:
                self._reserved = max(self._reserved - amount, 0)

    def reclaim_zones(self) -> int:
        """Reset zones holding only garbage (invariant 6: no committed extent points into them)."""
        # A stripe with a few live bytes can round its fragments' live share down to zero, so
        # the counter alone must not decide: no fragment of a live stripe may sit in the zone.
        referenced = (
            select(FRAGMENTS.c.id)
            .join(STRIPES, FRAGMENTS.c.stripe_id == STRIPES.c.id)
            .where(FRAGMENTS.c.zone_id == ZONES.c.id, STRIPES.c.live_bytes > 0)
            .exists()
        )

        def find(conn):
            return (
                conn.execute(
                    select(ZONES.c.id).where(
                        ZONES.c.live_bytes == 0,
                        ZONES.c.state.in_(("full", "open")),
                        ZONES.c.write_pointer > 0,
                        ~referenced,
                    )
                )
                .scalars()
                .all()
            )

        with self.lock:
            candidates = []
            for zone_id in self.catalog.read(find):
                zone, drive = self.zones.get(zone_id), self.zone_drive.get(zone_id)
                if zone is None or drive is None or zone.inflight or not drive.writable():
                    continue
                if not self.owns(zone.idx):  # another head's zone: it may be writing there
                    continue
                candidates.append((drive, zone))
            if not candidates:
                return 0

            def work(conn):
                done = []
                for drive, zone in candidates:
                    hit = conn.execute(
                        ZONES.update()
                        .where(ZONES.c.id == zone.id, ZONES.c.live_bytes == 0, ~referenced)
                        .values(
                            state="empty",
                            band_class=None,
                            write_pointer=0,
                            live_bytes=0,
                            garbage_bytes=0,
                            opened_ns=None,
                            resets=ZONES.c.resets + 1,
                        )
                    ).rowcount
                    if hit:
                        done.append((drive, zone))
                return done

            done = self.catalog.run(work, durable=True)
            for drive, zone in done:
                if drive.open.get(zone.band_class) is zone:
                    del drive.open[zone.band_class]
            # through the writers' queues, behind any "finish" still queued for these zones
            assert self.writers is not None  # zones are written (so reset) only once they exist
            self.writers.reset_zones([(drive, zone.idx) for drive, zone in done])
            for drive, zone in done:
                zone.state, zone.band_class, zone.wp, zone.committed_wp, zone.dirty = (
                    "empty",
                    None,
                    0,
                    0,
                    False,
                )
                self.dirty.pop(zone.id, None)  # the reset's own transaction recorded it
                drive.empty.add(zone.idx)
            return len(done)

    # -- placement ----------------------------------------------------------------------
    def place(self, stripe) -> None:
        """Choose zones on ``stripe.policy.width`` distinct drives, spread over hosts
        (``_choose``), for the stripe's fragments and append a PlacedFragment for each to
        ``stripe.placement`` (each zone pinned till commit)."""
        policy = stripe.policy
        length = fragment_length(stripe.fragments[0])
        width = policy.width
        with self.lock:
            writable = [d for d in self.drives.values() if d.writable()]
            self._rr += 1
            n = max(len(writable), 1)
            # most free first; the rotation spreads ties so equal drives share the work
            writable.sort(
                key=lambda d: (-(len(d.empty) + sum(1 for _ in d.open)), (d.id + self._rr) % n)
            )
            for attempt in range(2):
                chosen = self._choose(writable, policy.name, length, width)
                # reserve counted zones holding only garbage as room: reset them before giving up
                if len(chosen) == width or attempt or not self.reclaim_zones():
                    break
            if len(chosen) < policy.write_quorum:
                self.check_redundancy(policy, len(writable))
                raise errors.NoSpace(
                    f"stripe of {len(stripe.payload)} bytes needs {width} drives (at least "
                    f"{policy.write_quorum}) with {length} free bytes in a {policy.name} band; "
                    f"{len(chosen)} have room"
                )
            # fewer drives than the stripe is wide (a drive failed): write the data fragments and as
            # much parity as there are drives; the stripe is born degraded and rebuild completes it
            if len(chosen) < width:
                self.stats["degraded_stripes_written"] += 1
            now = time.time_ns()
            placement = stripe.placement
            for idx, (drive, zone) in enumerate(chosen):  # data fragments come first, then parity
                placement.append(PlacedFragment(drive, zone, zone.wp, length, idx))
                # a block device pads appends to whole blocks; the pad is garbage below the pointer
                zone.wp += padded(length, drive.granularity)
                zone.inflight += 1
                if zone.opened_ns is None:
                    zone.opened_ns = now

    def _choose(
        self, drives: list[DriveState], band_class: str, length: int, width: int
    ) -> list[tuple[DriveState, ZoneMem]]:
        """Up to ``width`` (drive, zone) with room for ``length`` bytes, taken from ``drives`` in
        their order, except that each next one comes from a host holding the fewest of the
        stripe's fragments so far: on 10 hosts or more no two fragments share a host, on fewer
        they spread as evenly as the hosts' drives allow (caller holds ``lock``)."""
        chosen: list[tuple[DriveState, ZoneMem]] = []
        if len({d.host for d in drives}) <= 1:  # one host (the single-host default): in order
            for drive in drives:
                zone = self.zone_for(drive, band_class, length)
                if zone is not None:
                    chosen.append((drive, zone))
                    if len(chosen) == width:
                        break
            return chosen
        held: dict[str, int] = defaultdict(int)  # fragments of this stripe per host
        left = list(drives)
        while left and len(chosen) < width:
            pick = min(range(len(left)), key=lambda i: (held[left[i].host], i))
            drive = left.pop(pick)
            zone = self.zone_for(drive, band_class, length)
            if zone is not None:
                chosen.append((drive, zone))
                held[drive.host] += 1
        return chosen

    def zone_for(self, drive: DriveState, band_class: str, length: int) -> ZoneMem | None:
        """The open band of ``band_class`` on ``drive`` with room for ``length`` bytes, opening an
        empty zone when needed (caller holds ``lock``); None if the drive has no zone to spare."""
        zone = drive.open.get(band_class)
        length = padded(length, drive.granularity)
        if zone is not None and zone.wp + length <= drive.zone_size:
            return zone
        if zone is not None:
            # the tail cannot take this fragment: the band is done
            zone.state, zone.dirty = "full", True
            self.dirty[zone.id] = zone
            del drive.open[band_class]
            # through the writer's queue: fragments queued for this zone must land first
            assert self.writers is not None  # zones are written (so finished) only once they exist
            self.writers.finish(drive, zone.idx)
        if len(drive.empty) <= self.reserve_zones or drive.at_open_limit():
            return None
        idx = min(drive.empty)
        drive.empty.discard(idx)
        zone = drive.zones[idx]
        zone.state, zone.band_class, zone.dirty, zone.opened_ns = (
            "open",
            band_class,
            True,
            time.time_ns(),
        )
        self.dirty[zone.id] = zone
        drive.open[band_class] = zone
        return zone

    def take(self, zone: ZoneMem, length: int) -> int:
        """Move ``zone``'s append position over ``length`` bytes (padded to its drive's write
        granularity, as the device pads them), pinned till ``settle``; returns the offset they
        go to."""
        with self.lock:
            offset = zone.wp
            zone.wp += padded(length, self.zone_drive[zone.id].granularity)
            zone.inflight += 1
            return offset

    def settle(self, zone: ZoneMem, end: int | None) -> None:
        """Unpin ``zone`` after a commit that made its bytes up to ``end`` durable in the catalog
        (``end`` None: the commit failed, the bytes are garbage). The device's pointer is past
        the block padding after ``end``: so is the committed one."""
        with self.lock:
            zone.inflight -= 1
            if end is not None:
                end = padded(end, self.zone_drive[zone.id].granularity)
                zone.committed_wp = max(zone.committed_wp, end)

    def pin(self, zone_id: int) -> ZoneMem:
        """Keep a zone from being reset (and reused) until ``unpin``."""
        with self.lock:
            zone = self.zones[zone_id]
            zone.inflight += 1
            return zone

    def unpin(self, zone_id: int) -> None:
        with self.lock:
            self.zones[zone_id].inflight -= 1

    def busy(self, zone_id: int) -> bool:
        """Whether a zone is unknown, pinned, or not a full band (so cleaning leaves it alone)."""
        zone = self.zones.get(zone_id)
        return zone is None or zone.inflight > 0 or zone.state != "full"

    # -- zones of the lifecycle jobs ----------------------------------------------------------
    def claim(self, drive: DriveState, band_class: str, purpose: str, use_reserve: bool) -> ZoneMem:
        """Open an empty zone of ``drive`` for a lifecycle job, pinned until ``close_claimed``.

        Jobs other than cleaning may only take a zone beyond the ``reserve_zones`` ones that no
        buffered write needs; cleaning (``use_reserve``) may take any, the reserve included: it
        frees more than it takes and must never wait on writers."""
        with self.lock:
            if not self._may_claim(drive, band_class, use_reserve):
                self.reclaim_zones()  # zones holding only garbage: reset them and look again
                self.refresh_reclaimable()
            if not self._may_claim(drive, band_class, use_reserve):
                raise errors.NoSpace(
                    f"drive {drive.id} has {len(drive.empty)} empty zones "
                    f"({self.reserve_zones} reserved for cleaning) and the data path's "
                    f"buffered writes hold the rest: no room for {purpose}"
                )
            idx = min(drive.empty)
            drive.empty.discard(idx)
            zone = drive.zones[idx]
            zone.state, zone.band_class, zone.opened_ns, zone.dirty = (
                "open",
                band_class,
                time.time_ns(),
                True,
            )
            self.dirty[zone.id] = zone
            zone.inflight += 1  # pinned while the job owns it: never reset under it
            return zone

    def _may_claim(self, drive: DriveState, band_class: str, use_reserve: bool) -> bool:
        if not drive.empty or drive.at_open_limit():
            return False
        if use_reserve:
            return True
        policy = self.policies.get(band_class) or self.policies[self.default_class]
        per_zone = max(drive.zone_size - policy.max_fragment_length, 0)
        return len(drive.empty) > self.reserve_zones and self.spare() >= per_zone

    def close_claimed(self, drive: DriveState, zone: ZoneMem) -> bool:
        """A job is done with its zone: unpin it, and give it back if never written, else mark it
        full. True when it is full (the caller records that in the catalog)."""
        with self.lock:
            zone.inflight -= 1
            if zone.wp == 0:  # never written: give it back as it was
                zone.state, zone.band_class, zone.opened_ns, zone.dirty = "empty", None, None, True
                self.dirty[zone.id] = zone
                drive.empty.add(zone.idx)
                return False
            zone.state, zone.dirty = "full", True
            self.dirty[zone.id] = zone
            assert self.writers is not None  # zones are written (so finished) only once they exist
            self.writers.finish(drive, zone.idx)
            return True
