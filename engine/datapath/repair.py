"""Fragment repair (invariant 5): a fragment that failed its checksum on a read is rebuilt from
the stripe's good fragments, appended to an open band of the same drive, and the catalog
points at the new copy; the bad bytes become garbage of their zone."""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor

import crc32c
from sqlalchemy import select

from engine.base import errors
from engine.catalog.models import Fragment, Stripe, Zone
from engine.datapath.accounting import share
from engine.datapath.reader import StripeInfo
from engine.datapath.space import padded

ZONES = Zone.__table__
STRIPES = Stripe.__table__
FRAGMENTS = Fragment.__table__


class Repairer:
    def __init__(self, catalog, space, writers, extents):
        self.catalog = catalog
        self.space = space
        self.writers = writers
        self.extents = extents
        self.closed = False
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="shingle-repair")
        self._repairs: list[Future] = []

    def queue(self, info: StripeInfo, indexes: set[int], good: dict) -> None:
        """The reader's repair hook: rebuild fragments ``indexes`` of ``info`` in the background."""
        if self.closed:
            return
        good = {i: bytes(f) for i, f in good.items()}
        for idx in sorted(indexes):
            self._repairs.append(self._pool.submit(self._repair, info, idx, good))

    def wait(self) -> list:
        """Wait for queued fragment repairs; returns their results (True, or the exception)."""
        results = []
        while self._repairs:
            fut = self._repairs.pop(0)
            try:
                results.append(fut.result())
            except Exception as exc:  # noqa: BLE001 - reported to the caller
                results.append(exc)
        return results

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def _repair(self, info: StripeInfo, idx: int, good: dict) -> bool:
        fragment = _rebuilt_fragment(info, idx, good)
        drive_id, _zone_id, _offset, length, _checksum = info.fragments[idx]
        space = self.space
        drive = space.drives.get(drive_id)
        if drive is None or not drive.writable() or len(fragment) != length:
            return False
        band_class = info.band_class if info.band_class in space.policies else space.default_class
        with space.lock:
            zone = space.zone_for(drive, band_class, length)
            if zone is None:
                raise errors.NoSpace(
                    f"no room on drive {drive_id} to repair stripe {info.id} fragment {idx}"
                )
            offset = zone.wp
            zone.wp += padded(length, drive.granularity)
            zone.inflight += 1
            state = (zone.state, zone.band_class, zone.opened_ns)
        latch = self.writers.write_repair(drive, zone.idx, offset, fragment)
        latch.done.wait()
        pad = padded(length, drive.granularity) - length
        moved = _MovedFragment(info, idx, zone.id, offset, crc32c.crc32c(fragment), state, pad)
        try:
            if latch.errors:
                raise errors.IOFailure(f"repair write failed: {latch.errors[0]}")
            done = self.catalog.run(moved.repoint, durable=True)
        finally:
            space.settle(zone, None if latch.errors else offset + length)
        self.extents.invalidate_stripes([info.id])
        return done


def _rebuilt_fragment(info: StripeInfo, idx: int, good: dict) -> bytes:
    if info.layout == "replica":
        return next(iter(good.values()))
    from engine.coding.erasure import decoder_for

    return decoder_for(info.k, info.m, info.backend).driver.reconstruct(list(good.values()), [idx])[
        0
    ]


class _MovedFragment:
    """The catalog side of one repair: fragment ``idx`` now lies at ``zone_id``/``offset``."""

    def __init__(
        self, info: StripeInfo, idx: int, zone_id, offset: int, checksum: int, state, pad: int = 0
    ):
        self.info = info
        self.pad = pad  # the block padding the device's pointer moves over after the fragment
        self.idx = idx
        self.zone_id = zone_id
        self.offset = offset
        self.checksum = checksum
        self.state = state  # the new zone's (state, band_class, opened_ns) as the allocator left it

    def repoint(self, conn) -> bool:
        info, idx = self.info, self.idx
        _drive_id, old_zone_id, old_offset, length, old_checksum = info.fragments[idx]
        row = conn.execute(
            select(STRIPES.c.data_length, STRIPES.c.live_bytes).where(STRIPES.c.id == info.id)
        ).first()
        # repoint only the copy we judged bad: if scrub or cleaning moved it meanwhile,
        # ours is garbage
        moved = (
            row is not None
            and conn.execute(
                FRAGMENTS.update()
                .where(
                    FRAGMENTS.c.stripe_id == info.id,
                    FRAGMENTS.c.idx == idx,
                    FRAGMENTS.c.zone_id == old_zone_id,
                    FRAGMENTS.c.zone_offset == old_offset,
                    FRAGMENTS.c.checksum == old_checksum,
                )
                .values(zone_id=self.zone_id, zone_offset=self.offset, checksum=self.checksum)
            ).rowcount
            == 1
        )
        live = share(length, row.live_bytes, row.data_length) if moved else 0
        if live:
            conn.execute(
                ZONES.update()
                .where(ZONES.c.id == old_zone_id)
                .values(
                    live_bytes=ZONES.c.live_bytes - live,
                    garbage_bytes=ZONES.c.garbage_bytes + live,
                )
            )
        self._account_new_copy(conn, length, live)
        return moved

    def _account_new_copy(self, conn, length: int, live: int) -> None:
        wp = conn.execute(select(ZONES.c.write_pointer).where(ZONES.c.id == self.zone_id)).scalar()
        new_wp = max(wp, self.offset + length + self.pad)
        conn.execute(
            ZONES.update()
            .where(ZONES.c.id == self.zone_id)
            .values(
                state=self.state[0],
                band_class=self.state[1],
                opened_ns=self.state[2],
                write_pointer=new_wp,
                live_bytes=ZONES.c.live_bytes + live,
                garbage_bytes=ZONES.c.garbage_bytes + (new_wp - wp) - live,
                last_write_ns=time.time_ns(),
            )
        )
