"""Fragment I/O of the background jobs (cleaning, scrub repair, rebuild, drain, tiering).

These jobs write fragments outside any file's write buffer, but they must obey
the same rules as the data path: append only at a zone's write pointer, in the
order that drive's single writer thread sees (invariant 1), durable before the
catalog commit that references them (invariant 2). So ``Media`` hands its bytes
to the DataPath's per-drive writer queues, and appends only to zones of its own:
for each (drive, band class, purpose) it claims one empty zone from the data
path and keeps it open while it is in use. Relocated data is older than fresh
writes, so keeping it in separate bands also keeps cleaning cheap (the LFS habit of
segregating cleaned data from new data).

A claimed zone is pinned (``Space.claim``) so the data path never resets it;
``finish`` (called by every job at its end) closes the zones and unpins them. Everything here
goes through the data path's public parts: ``dp.space`` (zones, pins, claims) and
``dp.writers`` (the drives' queues, with a ``WriteTicket`` the appending job waits on).
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass

import crc32c
from sqlalchemy import bindparam, func, select

from engine.base import errors
from engine.base.ordered_lock import lock
from engine.catalog.models import Fragment, Stripe, Zone
from engine.datapath.accounting import share
from engine.datapath.drivestate import ZoneMem
from engine.datapath.space import padded
from engine.datapath.writers import WriteTicket

ZONES = Zone.__table__
FRAGMENTS = Fragment.__table__
STRIPES = Stripe.__table__

WRITE_TIMEOUT_S = 120


@dataclass(frozen=True)
class Placement:
    drive_id: int
    zone_id: int
    zone_idx: int
    offset: int
    length: int
    checksum: int


class Media:
    def __init__(self, datapath):
        self.dp = datapath
        self.space = datapath.space
        self.writers = datapath.writers
        self._lock = lock("lifecycle.media")
        self._open: dict[tuple[int, str], ZoneMem] = {}  # (drive, class) -> its open zone
        self._closed: set[int] = set()  # zones closed, not yet recorded as full
        # Guards _closed alone. record() runs inside the caller's catalog transaction, while
        # append() holds _lock and may wait for the catalog (_claim -> _reclaim_zones): taking
        # _lock there stalled the soak for the catalog's 120 s retry deadline.
        self._closed_lock = lock("lifecycle.media_closed")

    # -- drives ------------------------------------------------------------------------
    def drive(self, drive_id: int):
        drive = self.space.drives.get(drive_id)
        if drive is None:
            raise errors.NotFound(f"drive {drive_id} is not in the data path (removed?)")
        return drive

    def readable(self, drive_id: int) -> bool:
        drive = self.space.drives.get(drive_id)
        return drive is not None and drive.readable()

    def writable_drives(self, exclude=(), *, use_reserve: bool = False, want: int = 1) -> list[int]:
        """Drives that can take a new fragment, those with the most empty zones first.
        With fewer than ``want`` of them, zones holding only garbage are reset first."""
        found = self._writable(exclude, use_reserve)
        if len(found) < want and self.space.reclaim_zones():
            found = self._writable(exclude, use_reserve)
        return found

    def _writable(self, exclude, use_reserve: bool) -> list[int]:
        reserve = 0 if use_reserve else self.dp.reserve_zones
        with self.space.lock:
            found = self.space.drives_with_room(exclude, reserve)
            # a drive whose open lifecycle zone still has room counts too
            for (drive_id, _cls), zone in self._open.items():
                d = self.space.drives.get(drive_id)
                if (
                    d is not None
                    and d.writable()
                    and drive_id not in exclude
                    and zone.wp < d.zone_size
                    and all(i != drive_id for _n, i in found)
                ):
                    found.append((0, drive_id))
        return [drive_id for _n, drive_id in sorted(found, key=lambda t: (-t[0], t[1]))]

    def host_of(self, drive_id: int) -> str:
        """The host a drive is on ("" for the head's own, and for a drive no longer known)."""
        drive = self.space.drives.get(drive_id)
        return drive.host if drive is not None else ""

    def empty_zones(self, drive_id: int) -> int:
        drive = self.space.drives.get(drive_id)
        return len(drive.empty) if drive is not None else 0

    def read(self, drive_id: int, zone_id: int, offset: int, length: int) -> bytes:
        """Raw bytes of a fragment (no checksum check: the caller judges them)."""
        drive = self.drive(drive_id)
        if not drive.readable():
            raise errors.IOFailure(f"drive {drive_id} is {drive.state} or missing: cannot read")
        zone = self.space.zones[zone_id]
        buf = bytearray(length)
        got = drive.backend.read_into(zone.idx, offset, [buf])
        if got != length:
            raise errors.IOFailure(
                f"short read on drive {drive_id} zone {zone.idx} at {offset}: {got} of {length}"
            )
        return bytes(buf)

    # -- zones of our own ------------------------------------------------------------------
    def _claim(self, drive, band_class: str, purpose: str, length: int, use_reserve: bool):
        key = (drive.id, band_class)
        zone = self._open.get(key)
        if zone is not None and zone.wp + length <= drive.zone_size:
            return zone
        with self.space.lock:
            if zone is not None:
                self._close(key, zone, drive)
            zone = self._open[key] = self.space.claim(drive, band_class, purpose, use_reserve)
            return zone

    def _close(self, key, zone, drive) -> None:
        del self._open[key]
        if self.space.close_claimed(drive, zone):
            with self._closed_lock:
                self._closed.add(zone.id)

    def finish(self) -> None:
        """End of a job: record the zones it filled up as full (the open ones stay open)."""
        with self._closed_lock:
            pending = bool(self._closed)
        if pending:
            self.dp.catalog.run(lambda conn: self.record(conn, []))

    def close_all(self) -> None:
        """Close every lifecycle zone (before the data path closes, or to test a restart)."""
        with self._lock, self.space.lock:
            for key, zone in list(self._open.items()):
                self._close(key, zone, self.space.drives[key[0]])
        self.finish()

    # -- catalog side: inside the caller's transaction ---------------------------------------
    def record(self, conn, placements: list[Placement]) -> None:
        """Move the zones' write pointers over appended bytes, counted as garbage for now
        (``move_fragments`` / ``adjust_live`` turn the live share into live bytes), and
        record the zones closed since the last call as full."""
        with self._closed_lock:
            closed, self._closed = self._closed, set()
        try:
            if closed:
                conn.execute(
                    ZONES.update()
                    .where(ZONES.c.id.in_(sorted(closed)), ZONES.c.state == "open")
                    .values(state="full")
                )
            record_appends(conn, self.space, placements)
        except BaseException:
            with self._closed_lock:
                self._closed |= closed  # the transaction may be retried or fail: keep them
            raise

    # -- appends ----------------------------------------------------------------------------
    def append(
        self,
        band_class: str,
        items: list[tuple[int, bytes]],
        *,
        purpose: str = "relocate",
        use_reserve: bool = False,
    ) -> list[Placement]:
        """Append each (drive id, fragment bytes) to our open zone of that drive and class.

        Returns when every byte is durable. On an error nothing is left reserved and the
        bytes that did land are garbage of their zones (``record_appends`` must still run)."""
        placements = []
        ticket = WriteTicket(len(items))
        failure = None
        with self._lock:
            try:
                for drive_id, data in items:
                    drive = self.drive(drive_id)
                    if not drive.writable():
                        raise errors.IOFailure(
                            f"drive {drive_id} cannot take writes ({drive.state})"
                        )
                    zone = self._claim(drive, band_class, purpose, len(data), use_reserve)
                    offset = self.space.take(zone, len(data))
                    placements.append(
                        Placement(
                            drive_id, zone.id, zone.idx, offset, len(data), crc32c.crc32c(data)
                        )
                    )
                    # queued at once: a later item may close this zone, and its
                    # "finish" must come after
                    self.writers.append(drive, zone.idx, offset, data, ticket)
            except errors.FsError as exc:
                failure = exc
                # only the queued appends will report back
                ticket.fragment_done(len(items) - len(placements))
        if failure is not None:
            ticket.written.wait(WRITE_TIMEOUT_S)
            self.settle(placements, committed=False)
            raise failure
        if not ticket.written.wait(WRITE_TIMEOUT_S):
            raise errors.IOFailure(f"fragment writes did not finish in {WRITE_TIMEOUT_S} s")
        if ticket.error is not None:
            self.settle(placements, committed=False)
            raise ticket.error
        return placements

    def settle(self, placements: list[Placement], *, committed: bool) -> None:
        """After the catalog commit (or its failure): unpin the zones of these appends."""
        for p in placements:
            self.space.settle(
                self.space.zones[p.zone_id], p.offset + p.length if committed else None
            )


def record_appends(conn, space, placements: list[Placement]) -> None:
    """Move the zones' write pointers over appended bytes, counted as garbage for now
    (``move_fragments`` / ``adjust_live`` turn the live share into live bytes)."""
    ends: dict[int, int] = {}
    for p in placements:
        # the device's pointer moves over the block padding too (garbage below it)
        end = p.offset + padded(p.length, space.drives[p.drive_id].granularity)
        ends[p.zone_id] = max(ends.get(p.zone_id, 0), end)
    if not ends:
        return
    current = dict(
        conn.execute(
            select(ZONES.c.id, ZONES.c.write_pointer).where(ZONES.c.id.in_(list(ends)))
        ).all()
    )
    now = time.time_ns()
    rows = []
    for zone_id, end in ends.items():
        zone = space.zones[zone_id]
        wp = current.get(zone_id, 0)
        new_wp = max(wp, end)
        rows.append(
            {
                "b_id": zone_id,
                "b_wp": new_wp,
                "b_garbage": new_wp - wp,
                "b_class": zone.band_class,
                "b_opened": zone.opened_ns,
                "b_state": "full" if zone.state == "full" else "open",
                "b_last": now,
            }
        )
    conn.execute(
        ZONES.update()
        .where(ZONES.c.id == bindparam("b_id"))
        .values(
            write_pointer=bindparam("b_wp"),
            garbage_bytes=ZONES.c.garbage_bytes + bindparam("b_garbage"),
            band_class=bindparam("b_class"),
            opened_ns=func.coalesce(ZONES.c.opened_ns, bindparam("b_opened")),
            state=bindparam("b_state"),
            last_write_ns=bindparam("b_last"),
        ),
        rows,
    )


def live_share(fragment_length: int, live: int, data_length: int) -> int:
    """The accounting rule of engine.datapath.accounting: a fragment's live bytes."""
    return share(fragment_length, live, data_length)


def move_fragments(conn, moves: list[tuple[int, int, int, Placement]]) -> list[int]:
    """Point fragments at their new copies and move their live shares between zones, for many
    (fragment id, expected zone, expected offset, placement) in a few statements. A fragment
    that is gone or moved since it was read (its stripe died, another job moved it) is left
    alone and its new copy stays garbage. Returns the ids that moved."""
    if not moves:
        return []
    rows = _rows_by_id(
        conn,
        select(
            FRAGMENTS.c.id,
            FRAGMENTS.c.zone_id,
            FRAGMENTS.c.zone_offset,
            FRAGMENTS.c.length,
            FRAGMENTS.c.stripe_id,
            FRAGMENTS.c.checksum,
        ),
        FRAGMENTS.c.id,
        [m[0] for m in moves],
    )
    stripes = _rows_by_id(
        conn,
        select(STRIPES.c.id, STRIPES.c.live_bytes, STRIPES.c.data_length),
        STRIPES.c.id,
        sorted({r.stripe_id for r in rows.values()}),
    )
    updates, moved = [], []
    zone_delta: dict[int, int] = {}
    for fragment_id, expect_zone, expect_offset, placement in moves:
        row = rows.get(fragment_id)
        # ids can be handed out again (SQLite): the place and the checksum must
        # match the copied one too
        if (
            row is None
            or row.zone_id != expect_zone
            or row.zone_offset != expect_offset
            or row.length != placement.length
            or row.checksum != placement.checksum
        ):
            continue
        stripe = stripes.get(row.stripe_id)
        share = live_share(row.length, stripe.live_bytes, stripe.data_length) if stripe else 0
        updates.append(
            {
                "b_id": fragment_id,
                "b_drive": placement.drive_id,
                "b_zone": placement.zone_id,
                "b_offset": placement.offset,
                "b_crc": placement.checksum,
            }
        )
        if share:
            zone_delta[row.zone_id] = zone_delta.get(row.zone_id, 0) - share
            zone_delta[placement.zone_id] = zone_delta.get(placement.zone_id, 0) + share
        moved.append(fragment_id)
    _apply_moves(conn, updates, zone_delta)
    return moved


def add_fragments(conn, adds: list[tuple[int, int, Placement]]) -> list[tuple[int, int]]:
    """Record each (stripe id, fragment index, placement) as a new fragment of a stripe that was
    born without it (written while too few drives or hosts were there), and move its live share
    from the zone's garbage (``record_appends`` counted the appended bytes as garbage) to its
    live bytes. A stripe gone or dead since it was read, or an index another job filled
    meanwhile, is left alone and the new copy stays garbage. Returns the (stripe, index) added."""
    if not adds:
        return []
    stripe_ids = sorted({stripe_id for stripe_id, _idx, _p in adds})
    stripes = _rows_by_id(
        conn,
        select(STRIPES.c.id, STRIPES.c.live_bytes, STRIPES.c.data_length),
        STRIPES.c.id,
        stripe_ids,
    )
    taken: set[tuple[int, int]] = set()
    for part in range(0, len(stripe_ids), 400):
        taken.update(
            (r.stripe_id, r.idx)
            for r in conn.execute(
                select(FRAGMENTS.c.stripe_id, FRAGMENTS.c.idx).where(
                    FRAGMENTS.c.stripe_id.in_(stripe_ids[part : part + 400])
                )
            )
        )
    rows, added = [], []
    zone_delta: dict[int, int] = {}
    for stripe_id, idx, p in adds:
        stripe = stripes.get(stripe_id)
        if stripe is None or stripe.live_bytes <= 0 or (stripe_id, idx) in taken:
            continue
        taken.add((stripe_id, idx))
        rows.append(
            {
                "stripe_id": stripe_id,
                "idx": idx,
                "drive_id": p.drive_id,
                "zone_id": p.zone_id,
                "zone_offset": p.offset,
                "length": p.length,
                "checksum": p.checksum,
            }
        )
        share = live_share(p.length, stripe.live_bytes, stripe.data_length)
        if share:
            zone_delta[p.zone_id] = zone_delta.get(p.zone_id, 0) + share
        added.append((stripe_id, idx))
    if rows:
        conn.execute(FRAGMENTS.insert(), rows)
    _apply_moves(conn, [], zone_delta)
    return added


def _rows_by_id(conn, query, id_column, ids: list[int]) -> dict:
    """Rows of ``query`` whose ``id_column`` is in ``ids``, by id (in chunks: bound parameters
    are limited)."""
    rows = {}
    for part in range(0, len(ids), 400):
        for r in conn.execute(query.where(id_column.in_(ids[part : part + 400]))):
            rows[r.id] = r
    return rows


def _apply_moves(conn, updates: list[dict], zone_delta: dict[int, int]) -> None:
    if updates:
        conn.execute(
            FRAGMENTS.update()
            .where(FRAGMENTS.c.id == bindparam("b_id"))
            .values(
                drive_id=bindparam("b_drive"),
                zone_id=bindparam("b_zone"),
                zone_offset=bindparam("b_offset"),
                checksum=bindparam("b_crc"),
            ),
            updates,
        )
    changes = [{"b_id": z, "b_d": d} for z, d in zone_delta.items() if d]
    if changes:
        conn.execute(
            ZONES.update()
            .where(ZONES.c.id == bindparam("b_id"))
            .values(
                live_bytes=ZONES.c.live_bytes + bindparam("b_d"),
                garbage_bytes=ZONES.c.garbage_bytes - bindparam("b_d"),
            ),
            changes,
        )


_SHARED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_SHARED_LOCK = lock("lifecycle.media_shared")


def media_for(datapath) -> Media:
    """The one Media of a DataPath, shared by all its lifecycle jobs."""
    with _SHARED_LOCK:
        media = _SHARED.get(datapath)
        if media is None:
            media = _SHARED[datapath] = Media(datapath)
        return media
