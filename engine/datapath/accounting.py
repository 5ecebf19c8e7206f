"""Extent-map arithmetic and live/garbage accounting in the catalog.

Accounting rules (others build cleaning, tiering and rebuild on them):
- ``Stripe.live_bytes`` = the bytes of every extent that references the stripe, summed over all
  of them: a byte shared by a file, its clones and snapshots counts once per reference, so the
  count is a reference count in bytes (invariant 9: a stripe is freed only when it reaches 0).
- A fragment's live share = ``fragment.length * min(stripe.live_bytes, data_length) //
  stripe.data_length`` (integer, recomputed from the new and old live value, so repeated
  changes never drift and a dead stripe contributes exactly 0). Under sharing the share
  over-counts a stripe whose references overlap (cleaning then sees it fuller than it is),
  never under-counts it.
- ``Zone.live_bytes`` = sum of the live shares of the zone's fragments;
  ``Zone.garbage_bytes`` = every other byte below the write pointer, so
  ``write_pointer == live_bytes + garbage_bytes`` for every zone.
- A stripe whose live bytes reach 0 is deleted with its fragments.
"""

from __future__ import annotations

import bisect
from collections import defaultdict

from engine.catalog.database import in_list, sql, sql_all, sql_many

CHUNK = 400  # ids per IN (...) list: far below SQLite's parameter limit


def chunks(items: list, size: int = CHUNK):
    for i in range(0, len(items), size):
        yield items[i : i + size]


def share(fragment_length: int, live: int, data_length: int) -> int:
    """A fragment's live bytes in its zone: references beyond the stripe's size count as full."""
    return fragment_length * min(live, data_length) // data_length if data_length else 0


class ExtentMap:
    """A file's extents, sorted and non-overlapping: [file_offset, length,
    stripe_id, stripe_offset, row_id].

    ``put`` and ``punch`` record, per stripe, how many live bytes were added
    or dropped, and which catalog rows must be deleted, shortened or inserted. A stored extent
    cut at its end keeps its row with a shorter length (only the length changes, so neither
    index of the table moves): an overwrite inside an extent costs one UPDATE and the rows of
    the new piece and of the part after it, not a DELETE and three INSERTs."""

    def __init__(self, rows):
        self.items = sorted([list(r) for r in rows], key=lambda e: e[0])
        self.starts = [e[0] for e in self.items]
        self.delta: dict = defaultdict(int)
        self.deleted_rows: set[int] = set()
        self.shortened: dict[int, int] = {}  # row id -> its new length

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
            if fo < lo:
                # the part before the hole keeps the row (if stored), shortened
                replacement.append([fo, lo - fo, sid, so, row])
                if row is not None:
                    self.shortened[row] = lo - fo
            elif row is not None:
                self.deleted_rows.add(row)
                self.shortened.pop(row, None)
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


def adjust_live(conn, deltas: dict[int, int], known: dict | None = None) -> list[int]:
    """Apply live-byte changes to stripes and their zones; delete dead
    stripes. Returns the dead ids.

    ``known``: stripe id -> (data_length, live_bytes, [(zone_id, fragment length)]) for stripes
    this transaction just inserted, which need no lookup. Plain SQL: this runs in every flush
    and every unlink, where building SQLAlchemy statements cost more than SQLite's work."""
    known = known or {}
    if not deltas:
        return []
    ids = [sid for sid in deltas if sid not in known]
    stripes: dict[int, tuple[int, int]] = {}  # id -> (data_length, live_bytes)
    fragments: dict[int, list] = defaultdict(list)  # id -> [(zone_id, length)]
    for sid, (data_length, live, frags) in known.items():
        stripes[sid] = (data_length, live)
        fragments[sid] = list(frags)
    for part in chunks(ids):
        # one statement for both (an overwrite's commit runs this for the stripe it cuts into)
        for sid, data_length, live, zone_id, length in sql_all(
            conn,
            "SELECT s.id, s.data_length, s.live_bytes, f.zone_id, f.length FROM stripes AS s "
            f"LEFT JOIN fragments AS f ON f.stripe_id = s.id WHERE s.id IN {in_list(part)}",
            tuple(part),
        ):
            stripes[sid] = (data_length, live)
            if zone_id is not None:
                fragments[sid].append((zone_id, length))
    zone_delta: dict[int, int] = defaultdict(int)
    dead, updates = [], []
    for sid, delta in deltas.items():
        row = stripes.get(sid)
        if row is None:
            continue
        data_length, live = row
        new = max(live + delta, 0)  # a reference count in bytes: may pass data_length
        for zone_id, length in fragments[sid]:
            zone_delta[zone_id] += share(length, new, data_length) - share(
                length, live, data_length
            )
        if new == 0:
            dead.append(sid)
        elif new != live:
            updates.append((new, sid))
    sql_many(conn, "UPDATE stripes SET live_bytes = ? WHERE id = ?", updates)
    sql_many(
        conn,
        "UPDATE zones SET live_bytes = live_bytes + ?, garbage_bytes = garbage_bytes - ? WHERE id "
        "= ?",
        [(d, d, z) for z, d in zone_delta.items() if d],
    )
    for part in chunks(dead):
        marks = in_list(part)
        sql(conn, f"DELETE FROM fragments WHERE stripe_id IN {marks}", tuple(part)).close()
        sql(conn, f"DELETE FROM stripes WHERE id IN {marks}", tuple(part)).close()
    return dead


def load_extents(conn, ino: int, lo: int | None = None, hi: int | None = None) -> list:
    """Rows (file_offset, length, stripe_id, stripe_offset, id) of ``ino`` touching [lo, hi).

    With ``lo``, two index seeks: the one extent starting at or before ``lo`` (extents never
    overlap, so no other one before it can reach ``lo``) and those starting inside the range. A
    range scan from ``lo`` less the longest extent read every row of a file that random writes
    had cut into small extents (hundreds per 4 KiB overwrite, in the write's own commit)."""
    columns = "SELECT file_offset, length, stripe_id, stripe_offset, id FROM extents WHERE ino = ?"
    if lo is None:
        if hi is None:
            return sql_all(conn, columns, (ino,))
        return sql_all(conn, columns + " AND file_offset < ?", (ino, hi))
    inside = columns + " AND file_offset > ?"
    params: tuple = (ino, lo, ino, lo)
    if hi is not None:
        inside += " AND file_offset < ?"
        params += (hi,)
    rows = sql_all(
        conn,
        "SELECT * FROM (" + columns + " AND file_offset <= ? ORDER BY file_offset DESC LIMIT 1) "
        "AS below UNION ALL " + inside,
        params,
    )
    return [row for row in rows if row[0] + row[1] > lo]


def write_map(conn, ino: int, emap: ExtentMap) -> None:
    """Store the changes of ``emap``: delete replaced rows, shorten cut ones, insert new pieces."""
    for part in chunks(sorted(emap.deleted_rows)):
        sql(conn, f"DELETE FROM extents WHERE id IN {in_list(part)}", tuple(part)).close()
    sql_many(
        conn,
        "UPDATE extents SET length = ? WHERE id = ?",
        [(length, row) for row, length in emap.shortened.items()],
    )
    sql_many(
        conn,
        "INSERT INTO extents (ino, file_offset, length, stripe_id, stripe_offset) VALUES (?, ?, ?, "
        "?, ?)",
        [(ino, e[0], e[1], e[2], e[3]) for e in emap.new_rows()],
    )
