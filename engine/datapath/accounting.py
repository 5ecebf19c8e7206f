"""Extent-map arithmetic and live/garbage accounting in the catalog.

Accounting rules (others build cleaning, tiering and rebuild on them):
- ``Stripe.live_bytes`` = user bytes of the stripe still referenced by extents.
- A fragment's live share = ``fragment.length * stripe.live_bytes // stripe.data_length``
  (integer, recomputed from the new and old live value, so repeated changes
  never drift and a dead stripe contributes exactly 0).
- ``Zone.live_bytes`` = sum of the live shares of the zone's fragments;
  ``Zone.garbage_bytes`` = every other byte below the write pointer, so
  ``write_pointer == live_bytes + garbage_bytes`` for every zone.
- A stripe whose live bytes reach 0 is deleted with its fragments.
"""
from __future__ import annotations

import bisect
from collections import defaultdict

from sqlalchemy import bindparam, select

from engine.catalog.models import Extent, Fragment, Stripe, Zone

STRIPES = Stripe.__table__
FRAGMENTS = Fragment.__table__
EXTENTS = Extent.__table__
ZONES = Zone.__table__
CHUNK = 400  # ids per IN (...) list: far below SQLite's parameter limit


def chunks(items: list, size: int = CHUNK):
    for i in range(0, len(items), size):
        yield items[i:i + size]


def share(fragment_length: int, live: int, data_length: int) -> int:
    return fragment_length * live // data_length if data_length else 0


class ExtentMap:
    """A file's extents, sorted and non-overlapping: [file_offset, length, stripe_id, stripe_offset, row_id].

    ``put`` and ``punch`` record, per stripe, how many live bytes were added
    or dropped, and which catalog rows must be deleted or inserted."""

    def __init__(self, rows):
        self.items = sorted([list(r) for r in rows], key=lambda e: e[0])
        self.starts = [e[0] for e in self.items]
        self.delta: dict = defaultdict(int)
        self.deleted_rows: set[int] = set()

    def punch(self, lo: int, hi: int) -> None:
        """Drop the bytes [lo, hi)."""
        if hi <= lo:
            return
        i = bisect.bisect_right(self.starts, lo) - 1
        if i < 0 or self.items[i][0] + self.items[i][1] <= lo:
            i += 1
        j = i
        replacement = []
        while j < len(self.items) and self.items[j][0] < hi:
            fo, length, sid, so, row = self.items[j]
            end = fo + length
            a, b = max(fo, lo), min(end, hi)
            self.delta[sid] -= b - a
            if row is not None:
                self.deleted_rows.add(row)
            if fo < lo:
                replacement.append([fo, lo - fo, sid, so, None])
            if end > hi:
                replacement.append([hi, end - hi, sid, so + (hi - fo), None])
            j += 1
        if j > i:
            self.items[i:j] = replacement
            self.starts[i:j] = [e[0] for e in replacement]

    def put(self, file_offset: int, length: int, stripe_id, stripe_offset: int) -> None:
        self.punch(file_offset, file_offset + length)
        i = bisect.bisect_left(self.starts, file_offset)
        self.items.insert(i, [file_offset, length, stripe_id, stripe_offset, None])
        self.starts.insert(i, file_offset)
        self.delta[stripe_id] += length

    def new_rows(self):
        return [e for e in self.items if e[4] is None]


class _Known:
    __slots__ = ("id", "data_length", "live_bytes")

    def __init__(self, sid, data_length, live_bytes):
        self.id, self.data_length, self.live_bytes = sid, data_length, live_bytes


def adjust_live(conn, deltas: dict[int, int], known: dict | None = None) -> list[int]:
    """Apply live-byte changes to stripes and their zones; delete dead stripes. Returns the dead ids.

    ``known``: stripe id -> (data_length, live_bytes, [(zone_id, fragment length)]) for stripes
    this transaction just inserted, which need no lookup."""
    known = known or {}
    ids = [sid for sid in deltas if sid not in known]
    if not deltas:
        return []
    stripes = {}
    fragments = defaultdict(list)
    for sid, (data_length, live, frags) in known.items():
        stripes[sid] = _Known(sid, data_length, live)
        fragments[sid] = [_Known(zone_id, length, 0) for zone_id, length in frags]
    for part in chunks(ids):
        for row in conn.execute(select(STRIPES.c.id, STRIPES.c.data_length, STRIPES.c.live_bytes)
                                .where(STRIPES.c.id.in_(part))):
            stripes[row.id] = row
        for row in conn.execute(select(FRAGMENTS.c.stripe_id, FRAGMENTS.c.zone_id, FRAGMENTS.c.length)
                                .where(FRAGMENTS.c.stripe_id.in_(part))):
            fragments[row.stripe_id].append(row)
    zone_delta: dict[int, int] = defaultdict(int)
    dead, updates = [], []
    for sid, delta in deltas.items():
        row = stripes.get(sid)
        if row is None:
            continue
        new = min(max(row.live_bytes + delta, 0), row.data_length)
        for frag in fragments[sid]:
            zone_id, length = (frag.id, frag.data_length) if isinstance(frag, _Known) else (frag.zone_id, frag.length)
            zone_delta[zone_id] += share(length, new, row.data_length) - share(length, row.live_bytes, row.data_length)
        if new == 0:
            dead.append(sid)
        elif new != row.live_bytes:
            updates.append({"b_id": sid, "b_live": new})
    if updates:
        conn.execute(STRIPES.update().where(STRIPES.c.id == bindparam("b_id"))
                     .values(live_bytes=bindparam("b_live")), updates)
    changes = [{"b_id": z, "b_d": d} for z, d in zone_delta.items() if d]
    if changes:
        conn.execute(ZONES.update().where(ZONES.c.id == bindparam("b_id")).values(
            live_bytes=ZONES.c.live_bytes + bindparam("b_d"),
            garbage_bytes=ZONES.c.garbage_bytes - bindparam("b_d")), changes)
    for part in chunks(dead):
        conn.execute(FRAGMENTS.delete().where(FRAGMENTS.c.stripe_id.in_(part)))
        conn.execute(STRIPES.delete().where(STRIPES.c.id.in_(part)))
    return dead


def load_extents(conn, ino: int, lo: int | None = None, hi: int | None = None, max_extent: int = 0):
    """Rows (file_offset, length, stripe_id, stripe_offset, id) of ``ino`` touching [lo, hi)."""
    query = select(EXTENTS.c.file_offset, EXTENTS.c.length, EXTENTS.c.stripe_id, EXTENTS.c.stripe_offset,
                   EXTENTS.c.id).where(EXTENTS.c.ino == ino)
    if hi is not None:
        query = query.where(EXTENTS.c.file_offset < hi)
    if lo is not None:
        # extents are never longer than a stripe: this bound keeps the (ino, offset) index usable
        query = query.where(EXTENTS.c.file_offset > lo - max_extent,
                            EXTENTS.c.file_offset + EXTENTS.c.length > lo)
    return conn.execute(query).all()


def write_map(conn, ino: int, emap: ExtentMap) -> None:
    """Store the changes of ``emap``: delete replaced rows, insert new pieces."""
    for part in chunks(sorted(emap.deleted_rows)):
        conn.execute(EXTENTS.delete().where(EXTENTS.c.id.in_(part)))
    rows = [{"ino": ino, "file_offset": e[0], "length": e[1], "stripe_id": e[2], "stripe_offset": e[3]}
            for e in emap.new_rows()]
    if rows:
        conn.execute(EXTENTS.insert(), rows)
