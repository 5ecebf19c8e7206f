"""Shared extents: clone a range of one file into another, punch holes, find data and holes.

An extent is (file offset, length) -> (stripe, offset in the stripe), so any sub-range of a
stripe can be referenced by several files (clones, copies, snapshots) without copying a byte.
``Stripe.live_bytes`` counts the referenced bytes over every extent (accounting.py), so a
stripe dies only when no file, clone or snapshot references it (invariant 9); every change
here is in the caller's transaction: set statements over the extents of a range (a range is
thousands of extents for a large file), one grouped UPDATE of the counts of stripes that stay
fully referenced (their zone shares cannot change), and ``adjust_live`` for the rest, as in
truncate and release.

The calls run inside the namespace's catalog transaction. The namespace flushes the files'
buffered writes first: a stripe still buffered must not land over a range cloned after it."""

from __future__ import annotations

from engine.base import errors
from engine.catalog.database import sql, sql_all, sql_many, sql_one
from engine.datapath.accounting import ExtentMap, adjust_live, load_extents, write_map


class Sharing:
    def __init__(self, buffers, extents, reader):
        self.buffers = buffers
        self.extents = extents
        self.reader = reader

    def _changed(self, conn, inos: set[int], dead: list[int]) -> None:
        self.reader.forget(set(dead))
        self.buffers.forget_settled(inos)
        self.extents.invalidate(inos)
        self.buffers.catalog.after_commit(conn, lambda: self.extents.invalidate(inos))

    def clone_range(self, conn, src: int, src_off: int, dst: int, dst_off: int, length: int) -> int:
        """Make [dst_off, dst_off + length) of ``dst`` reference the stripes that hold
        [src_off, src_off + length) of ``src`` (holes stay holes). No data is copied, and the
        catalog work is set statements: the extents inside the range are copied with their
        offsets shifted in one INSERT ... SELECT, their stripes' counts grow in one UPDATE
        (``add_counts``), and only the two edge extents and partly referenced stripes are
        handled one by one. Returns the number of extents shared."""
        if length <= 0:
            return 0
        if src == dst and src_off < dst_off + length and dst_off < src_off + length:
            raise errors.InvalidArgument(
                f"clone of inode {src} onto itself: ranges at {src_off} and {dst_off} of "
                f"{length} bytes overlap"
            )
        lo, hi = src_off, src_off + length
        dst_hi = dst_off + length
        dead = _punch_rows(conn, dst, dst_off, dst_hi)
        pieces = []
        for fo, elen, sid, so, _row in _edge_rows(conn, src, lo, hi):
            a, b = max(fo, lo), min(fo + elen, hi)
            pieces.append((dst, a - lo + dst_off, b - a, sid, so + (a - fo)))
        sql_many(conn, _INSERT_EXTENT, pieces)
        cursor = sql(
            conn,
            "INSERT INTO extents (ino, file_offset, length, stripe_id, stripe_offset) "
            f"SELECT ?, file_offset + ?, length, stripe_id, stripe_offset FROM extents "
            f"WHERE {_INSIDE}",
            (dst, dst_off - src_off, src, lo, hi, hi),
        )
        shared = len(pieces) + max(cursor.rowcount, 0)
        cursor.close()
        add_counts(conn, _IN_RANGE, (dst, dst_off, dst_hi))
        self._changed(conn, {dst}, dead)
        return shared

    def punch(self, conn, ino: int, offset: int, length: int) -> int:
        """Drop [offset, offset + length) of a file (a hole; the size stays): stripes that nothing
        else references die. Returns the bytes that were referenced there."""
        if length <= 0:
            return 0
        inside = (ino, offset, offset + length, offset + length)
        dropped = sql_one(
            conn, f"SELECT COALESCE(SUM(length), 0) FROM extents WHERE {_INSIDE}", inside
        )[0]
        edges = _edge_rows(conn, ino, offset, offset + length)
        dropped += sum(min(fo + elen, offset + length) - max(fo, offset) for fo, elen, *_ in edges)
        dead = _punch_rows(conn, ino, offset, offset + length)
        self._changed(conn, {ino}, dead)
        return int(dropped)

    @staticmethod
    def data_ranges(conn, ino: int) -> list[tuple[int, int]]:
        """The file's data as sorted, merged [start, end) ranges (holes are what lies between)."""
        return _merged(
            sql_all(
                conn,
                "SELECT file_offset, length FROM extents WHERE ino = ? ORDER BY file_offset",
                (ino,),
            )
        )

    @staticmethod
    def few_data_ranges(conn, ino: int, most: int) -> list[tuple[int, int]] | None:
        """``data_ranges`` of a file with at most ``most`` extents; None for one with more."""
        rows = sql_all(
            conn,
            "SELECT file_offset, length FROM extents WHERE ino = ? ORDER BY file_offset LIMIT ?",
            (ino, most + 1),
        )
        return _merged(rows) if len(rows) <= most else None


def _merged(rows) -> list[tuple[int, int]]:
    """(file offset, length) rows sorted by offset as merged [start, end) ranges."""
    merged: list[list[int]] = []
    for fo, elen in rows:
        if merged and merged[-1][1] == fo:
            merged[-1][1] = fo + elen
        else:
            merged.append([fo, fo + elen])
    return [(a, b) for a, b in merged]


_INSERT_EXTENT = (
    "INSERT INTO extents (ino, file_offset, length, stripe_id, stripe_offset) "
    "VALUES (?, ?, ?, ?, ?)"
)
# extents of (ino, lo, hi, hi) lying wholly inside [lo, hi) (the offset bound uses the index)
_INSIDE = "ino = ? AND file_offset >= ? AND file_offset < ? AND file_offset + length <= ?"
# extents of (ino, lo, hi) starting inside [lo, hi)
_IN_RANGE = "ino = ? AND file_offset >= ? AND file_offset < ?"
_IN_INODES = "ino BETWEEN ? AND ?"
# stripe, bytes the extents matching {where} reference in it, its live bytes and data length
_REFS = (
    "SELECT r.stripe_id, r.refs, s.live_bytes, s.data_length FROM "
    "(SELECT stripe_id, SUM(length) AS refs FROM extents WHERE {where} "
    "GROUP BY stripe_id) r JOIN stripes s ON s.id = r.stripe_id"
)
# one statement for the stripes whose zone shares cannot change (they stay fully referenced);
# a join, not a correlated SUM per stripe, which SQLite ran over the whole (ino, offset) range
_CHANGE_FULL = (
    "UPDATE stripes SET live_bytes = stripes.live_bytes {sign} r.refs FROM "
    "(SELECT stripe_id, SUM(length) AS refs FROM extents WHERE {where} GROUP BY stripe_id) r "
    "WHERE stripes.id = r.stripe_id AND stripes.live_bytes {sign} {held} >= stripes.data_length"
)


def _edge_rows(conn, ino: int, lo: int, hi: int) -> list:
    """The extent rows of ``ino`` crossing ``lo`` or ``hi`` (at most two)."""
    rows = {}
    for edge in (lo, hi):
        for row in load_extents(conn, ino, edge, edge + 1):
            if row[0] < edge < row[0] + row[1]:
                rows[row[4]] = row
    return sorted(rows.values())


def _punch_rows(conn, ino: int, lo: int, hi: int) -> list[int]:
    """Remove [lo, hi) from the extents of ``ino``: the ones inside in set statements
    (``drop_counts``), the edge ones cut in Python. Returns the stripes that died."""
    emap = ExtentMap(_edge_rows(conn, ino, lo, hi))
    emap.punch(lo, hi)
    inside = (ino, lo, hi, hi)
    dead = drop_counts(
        conn,
        _INSIDE,
        inside,
        lambda conn: sql(conn, f"DELETE FROM extents WHERE {_INSIDE}", inside).close(),
    )
    write_map(conn, ino, emap)
    return dead + adjust_live(conn, dict(emap.delta))


def add_counts(conn, where: str, params: tuple) -> int:
    """The extents matching ``where`` (over the extents table, with ``params``) were just
    inserted: count them in their stripes; returns the bytes they reference. Stripes already
    fully referenced keep their zone shares, so they take one set statement; only the others
    go through ``adjust_live`` (adding references kills no stripe)."""
    rows = sql_all(conn, _REFS.format(where=where), params)
    partial = {sid: int(refs) for sid, refs, live, length in rows if live < length}
    if len(partial) < len(rows):
        sql(conn, _CHANGE_FULL.format(sign="+", where=where, held="0"), params).close()
    adjust_live(conn, partial)
    return sum(int(refs) for _sid, refs, _live, _length in rows)


def add_references(conn, ino_lo: int, ino_hi: int) -> int:
    """The extents of inodes [ino_lo, ino_hi] were just copied (a snapshot, a clone of one):
    count them in their stripes (``add_counts``); returns the bytes they reference."""
    return add_counts(conn, _IN_INODES, (ino_lo, ino_hi))


def drop_counts(conn, where: str, params: tuple, delete_extents) -> list[int]:
    """The extents matching ``where`` go (``delete_extents(conn)`` removes them): take them off
    their stripes' counts; returns the stripes that died. Stripes that stay fully referenced
    take one set statement, the rest ``adjust_live`` once the rows are gone (a dead stripe can
    only be deleted after the extents naming it)."""
    others = {}
    full = 0
    for sid, refs, live, length in sql_all(conn, _REFS.format(where=where), params):
        if live - refs >= length:
            full += 1
        else:
            others[sid] = -int(refs)
    if full:
        sql(conn, _CHANGE_FULL.format(sign="-", where=where, held="r.refs"), params).close()
    delete_extents(conn)
    return adjust_live(conn, others)


def drop_references(conn, ino_lo: int, ino_hi: int, delete_extents) -> list[int]:
    """The extents of inodes [ino_lo, ino_hi] go (``delete_extents(conn)`` removes them):
    ``drop_counts`` over them; returns the stripes that died."""
    return drop_counts(conn, _IN_INODES, (ino_lo, ino_hi), delete_extents)
