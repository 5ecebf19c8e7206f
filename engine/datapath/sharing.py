"""Shared extents: clone a range of one file into another, punch holes, find data and holes.

An extent is (file offset, length) -> (stripe, offset in the stripe), so any sub-range of a
stripe can be referenced by several files (clones, copies, snapshots) without copying a byte.
``Stripe.live_bytes`` counts the referenced bytes over every extent (accounting.py), so a
stripe dies only when no file, clone or snapshot references it (invariant 9); every change
here is one ``adjust_live`` in the caller's transaction, like truncate and release.

The calls run inside the namespace's catalog transaction. The namespace flushes the files'
buffered writes first: a stripe still buffered must not land over a range cloned after it."""

from __future__ import annotations

from collections import defaultdict

from engine import errors
from engine.catalog.database import sql, sql_all
from engine.datapath.accounting import ExtentMap, adjust_live, load_extents, write_map


class Sharing:
    def __init__(self, buffers, extents, reader, *, max_extent: int):
        self.buffers = buffers
        self.extents = extents
        self.reader = reader
        self.max_extent = max_extent

    def _changed(self, conn, inos: set[int], dead: list[int]) -> None:
        self.reader.forget(set(dead))
        self.buffers.forget_settled(inos)
        self.extents.invalidate(inos)
        self.buffers.catalog.after_commit(conn, lambda: self.extents.invalidate(inos))

    def clone_range(self, conn, src: int, src_off: int, dst: int, dst_off: int, length: int) -> int:
        """Make [dst_off, dst_off + length) of ``dst`` reference the stripes that hold
        [src_off, src_off + length) of ``src`` (holes stay holes). Cost: the extents of the
        range, no data copied. Returns the number of extents shared."""
        if length <= 0:
            return 0
        if src == dst and src_off < dst_off + length and dst_off < src_off + length:
            raise errors.InvalidArgument(
                f"clone of inode {src} onto itself: ranges at {src_off} and {dst_off} of "
                f"{length} bytes overlap"
            )
        lo, hi = src_off, src_off + length
        pieces = []
        for fo, elen, sid, so, _row in load_extents(conn, src, lo, hi, self.max_extent):
            a, b = max(fo, lo), min(fo + elen, hi)
            if a < b:
                pieces.append((a - lo + dst_off, b - a, sid, so + (a - fo)))
        emap = ExtentMap(load_extents(conn, dst, dst_off, dst_off + length, self.max_extent))
        emap.punch(dst_off, dst_off + length)
        for fo, plen, sid, so in pieces:
            emap.put(fo, plen, sid, so)
        write_map(conn, dst, emap)
        dead = adjust_live(conn, dict(emap.delta))
        self._changed(conn, {dst}, dead)
        return len(pieces)

    def punch(self, conn, ino: int, offset: int, length: int) -> int:
        """Drop [offset, offset + length) of a file (a hole; the size stays): stripes that nothing
        else references die. Returns the bytes that were referenced there."""
        if length <= 0:
            return 0
        emap = ExtentMap(load_extents(conn, ino, offset, offset + length, self.max_extent))
        emap.punch(offset, offset + length)
        write_map(conn, ino, emap)
        dropped = -sum(emap.delta.values())
        dead = adjust_live(conn, dict(emap.delta))
        self._changed(conn, {ino}, dead)
        return dropped

    @staticmethod
    def data_ranges(conn, ino: int) -> list[tuple[int, int]]:
        """The file's data as sorted, merged [start, end) ranges (holes are what lies between)."""
        merged: list[list[int]] = []
        for fo, elen in sql_all(
            conn,
            "SELECT file_offset, length FROM extents WHERE ino = ? ORDER BY file_offset",
            (ino,),
        ):
            if merged and merged[-1][1] == fo:
                merged[-1][1] = fo + elen
            else:
                merged.append([fo, fo + elen])
        return [(a, b) for a, b in merged]


def referenced_by(conn, ino_lo: int, ino_hi: int) -> dict[int, int]:
    """stripe id -> bytes the extents of inodes [ino_lo, ino_hi] reference in it."""
    refs: dict[int, int] = defaultdict(int)
    for sid, total in sql_all(
        conn,
        "SELECT stripe_id, SUM(length) FROM extents WHERE ino BETWEEN ? AND ? GROUP BY stripe_id",
        (ino_lo, ino_hi),
    ):
        refs[sid] += int(total)
    return refs


_REFS_IN_RANGE = (
    "SELECT r.stripe_id, r.refs, s.live_bytes, s.data_length FROM "
    "(SELECT stripe_id, SUM(length) AS refs FROM extents WHERE ino BETWEEN ? AND ? "
    "GROUP BY stripe_id) r JOIN stripes s ON s.id = r.stripe_id"
)
# one statement for the stripes whose zone shares cannot change (they stay fully referenced)
_ADD_FULL = (
    "UPDATE stripes SET live_bytes = live_bytes + (SELECT SUM(e.length) FROM extents e "
    "WHERE e.stripe_id = stripes.id AND e.ino BETWEEN ? AND ?) WHERE id IN "
    "(SELECT stripe_id FROM extents WHERE ino BETWEEN ? AND ?) AND live_bytes {cond}"
)


def add_references(conn, ino_lo: int, ino_hi: int) -> None:
    """The extents of inodes [ino_lo, ino_hi] were just copied (a snapshot, a clone of one):
    count them in their stripes. Stripes already fully referenced keep their zone shares, so
    they take one set statement; only the others go through ``adjust_live``."""
    partial = {
        sid: int(refs)
        for sid, refs, live, length in sql_all(conn, _REFS_IN_RANGE, (ino_lo, ino_hi))
        if live < length
    }
    sql(conn, _ADD_FULL.format(cond=">= data_length"), (ino_lo, ino_hi, ino_lo, ino_hi)).close()
    adjust_live(conn, partial)


def drop_references(conn, ino_lo: int, ino_hi: int, delete_extents) -> list[int]:
    """The extents of inodes [ino_lo, ino_hi] go (``delete_extents(conn)`` removes them):
    take them off their stripes' counts; returns the stripes that died. Stripes that stay
    fully referenced take one set statement, the rest ``adjust_live`` once the rows are gone
    (a dead stripe can only be deleted after the extents naming it)."""
    others = {}
    full = 0
    for sid, refs, live, length in sql_all(conn, _REFS_IN_RANGE, (ino_lo, ino_hi)):
        if live - refs >= length:
            full += 1
        else:
            others[sid] = -int(refs)
    if full:
        sql(
            conn,
            _ADD_FULL.replace("live_bytes + (", "live_bytes - (").format(
                cond="- (SELECT SUM(e.length) FROM extents e WHERE e.stripe_id = stripes.id AND "
                "e.ino BETWEEN ? AND ?) >= data_length"
            ),
            (ino_lo, ino_hi, ino_lo, ino_hi, ino_lo, ino_hi),
        ).close()
    delete_extents(conn)
    return adjust_live(conn, others)
