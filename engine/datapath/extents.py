"""Extent maps: which stripe bytes make up a file, cached per file, and the read path over them.

A file's map is loaded once (plain SQL: a 2 GiB file names 256 stripes and 2,560 fragments)
and kept until a commit, truncate or release of the file changes it (``invalidate``), or until
fragments move (``invalidate_stripes``: rebuild, cleaning, tiering). A generation counter keeps
a load that raced such a move from being cached."""

from __future__ import annotations

import bisect
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable

from engine.base import errors
from engine.base.blocking import may_block
from engine.base.ordered_lock import lock
from engine.catalog.database import in_list, sql_all, sql_one
from engine.catalog.epoch import commits_between
from engine.datapath.accounting import chunks
from engine.datapath.reader import NotInMemory, StripeInfo, StripeReader
from engine.native import empty_bytearray

EXTENT_CACHE_FILES = 4096
READ_AHEAD_STRIPES = 2
_STRIPE_INFO_SQL = ", ".join(StripeInfo.COLUMNS)


class ExtentCache:
    def __init__(self, catalog, reader: StripeReader):
        self.catalog = catalog
        self.reader = reader
        self._maps: OrderedDict = OrderedDict()  # ino -> (starts, items, {})
        self._map_version: dict[int, int] = defaultdict(int)
        self._lock = lock("datapath.maps")
        self._stripes: dict[int, StripeInfo] = {}
        self._generation = (
            0  # bumped by invalidate_stripes: loads that began before it are not cached
        )
        # fn(inos): also forget what else is cached of these files
        self.on_invalidate: Callable[[Iterable[int]], None] | None = None
        # the catalog epoch the maps are valid at: another process's commit (a head sharing the
        # catalog wrote the file, or moved fragments) empties them (None: cache nothing)
        self._epoch: int | None = None

    def invalidate(self, inos) -> None:
        with self._lock:
            for ino in inos:
                self._map_version[ino] += 1
                self._maps.pop(ino, None)
        if self.on_invalidate is not None:
            self.on_invalidate(inos)

    def invalidate_stripes(self, stripe_ids) -> None:
        """Forget cached descriptions and data of stripes (rebuild, cleaning: fragments moved)."""
        ids = set(stripe_ids)
        with self._lock:
            self._generation += 1
            for sid in ids:
                self._stripes.pop(sid, None)
            self._maps.clear()
        self.reader.forget(ids)

    def _follow_epoch(self) -> None:
        """Take in the commits since the maps' epoch that this process cannot account for
        (caller holds ``_lock``), as NameCache.valid does, so a head reads what another head
        sharing the catalog wrote, after its commit (SQLite: at once; PostgreSQL: within the
        change watch's delay): the maps of the files their change records name go (a data
        commit, truncate or removal names its file; a stripe id is never used again, so the
        descriptions of others stay true); a commit without a record (fragments moved by
        cleaning, rebuild or tiering, which publish none) empties the maps and descriptions."""
        epoch = self.catalog.epoch()
        old = self._epoch
        if epoch == old and epoch is not None:
            return
        changes = None if epoch is None or old is None else self.catalog.changes_since(old, epoch)
        if changes is None or old is None:
            self._maps.clear()
            self._stripes.clear()
            self._generation += 1  # a load that began before this is not cached
            self._epoch = epoch
            return
        for change in changes:
            for ino in change.inos:
                self._map_version[ino] += 1  # a load of it under way is not cached
                self._maps.pop(ino, None)
        if commits_between(old, epoch) > 0:  # (an older epoch changes nothing)
            self._epoch = epoch

    def stripe(self, stripe_id: int) -> StripeInfo | None:
        return self._stripes.get(stripe_id)

    def extent_map(self, ino: int):
        """(starts, items, stripes loaded now) of a file: items are (file offset, length, stripe id,
        stripe offset) sorted by file offset, starts their file offsets."""
        with self._lock:
            self._follow_epoch()
            hit = self._maps.get(ino)
            if hit is not None:
                self._maps.move_to_end(ino)
                return hit
            version = self._map_version[ino]
            generation = self._generation
        known = self._stripes

        def work(conn):
            # a file freed under a reader has no extents: that must read as gone, not as a hole
            if sql_one(conn, "SELECT ino FROM inodes WHERE ino = ?", (ino,)) is None:
                raise errors.StaleHandle(f"inode {ino} was removed")
            # plain SQL: SQLAlchemy rows cost about 10 us each (a 64 MiB file's map took 10 ms)
            rows = sql_all(
                conn,
                "SELECT file_offset, length, stripe_id, stripe_offset FROM extents "
                "WHERE ino = ? ORDER BY file_offset",
                (ino,),
            )
            wanted = sorted({r[2] for r in rows if r[2] not in known})
            infos = {}
            for part in chunks(wanted):
                marks = in_list(part)
                for row in sql_all(
                    conn, f"SELECT {_STRIPE_INFO_SQL} FROM stripes WHERE id IN {marks}", tuple(part)
                ):
                    infos[row[0]] = StripeInfo(*row)
                for sid, idx, *where in sql_all(
                    conn,
                    "SELECT stripe_id, idx, drive_id, zone_id, zone_offset, length, "
                    f"checksum FROM fragments WHERE stripe_id IN {marks}",
                    tuple(part),
                ):
                    infos[sid].fragments[idx] = tuple(where)
            return rows, infos

        rows, infos = self.catalog.read(work)
        items = [tuple(r) for r in rows]
        entry: tuple[list, list, dict] = ([i[0] for i in items], items, {})
        with self._lock:
            fresh = self._generation == generation
            if fresh:
                self._stripes.update(infos)
            # else fragments moved while we loaded: what we read serves this read only
            if fresh and self._map_version[ino] == version:
                self._maps[ino] = entry
                while len(self._maps) > EXTENT_CACHE_FILES:
                    self._maps.popitem(last=False)
        return entry[0], entry[1], infos


class Reads:
    """``read``: pending writes over the extent map, fragments fetched by the StripeReader."""

    def __init__(self, files: dict, extents: ExtentCache, reader: StripeReader):
        self.files = files  # ino -> stripes.FileBuffer (the buffers' own dict, read without a lock)
        self.extents = extents
        self.reader = reader
        # fn(ino), called on every read that asks to be tracked
        self.hook: Callable[[int], None] | None = None
        self._last_read_end: dict[int, int] = {}
        # files whose last read on the event loop found a fragment out of memory (bounded: a
        # file missing from it only costs one non-blocking read that fails)
        self._cold: set[int] = set()

    def read(
        self,
        ino: int,
        offset: int,
        length: int,
        size: int,
        *,
        track: bool = True,
        retry: bool = True,
    ) -> bytes | bytearray:
        """Bytes [offset, min(offset + length, size)) of a file. ``track``: tell the read hook
        (tiering counts reads; its own moves pass False). ``retry``: reload a stale map once."""
        if track:
            hook = self.hook
            if hook is not None:
                hook(ino)
        end = min(offset + length, size)
        if end <= offset:
            return b""
        # pending writes are taken first: a stripe that commits meanwhile is then also in the map
        overlay = self._pending_writes(ino)
        out = empty_bytearray(end - offset)  # not zeroed: the holes are, below
        view = memoryview(out)
        filled = offset  # out is written up to here
        extents = self.extents
        starts, items, loaded = extents.extent_map(ino)
        i = max(bisect.bisect_right(starts, offset) - 1, 0)
        stripe_ends = []
        warm = True  # every stripe served from in-memory drive reads: no read-ahead wanted
        from_drives = ino not in self._cold
        # one reader streaming the file: what it reads is not cached for others (16 readers of
        # one shard interleave, and share the fragments through the cache)
        into_out = self._last_read_end.get(ino) == offset
        while i < len(items) and items[i][0] < end:
            fo, elen, sid, so = items[i]
            a, b = max(fo, offset), min(fo + elen, end)
            if a < b:
                if a > filled:  # a hole reads as zeros
                    view[filled - offset : a - offset] = bytes(a - filled)
                filled = b
                info = loaded.get(sid) or extents.stripe(sid)
                if info is None:
                    extents.invalidate({ino})
                    return self.read(ino, offset, length, size, track=False)
                try:
                    in_memory = self.reader.read_range(
                        info,
                        so + (a - fo),
                        b - a,
                        view[a - offset : b - offset],
                        from_drives,
                        into_out,
                    )
                except NotInMemory:
                    # the page cache did not have it: from the cache only (read-ahead) until a
                    # read-ahead finds the file in memory again
                    if len(self._cold) < EXTENT_CACHE_FILES:
                        self._cold.add(ino)
                    raise
                except errors.IOFailure:
                    if not retry:
                        raise
                    # a stale map: the stripe died (overwrite, tiering) and its zones were reset
                    extents.invalidate_stripes({item[2] for item in items})
                    return self.read(ino, offset, length, size, track=False, retry=False)
                stripe_ends.append((i, info))
                warm = warm and in_memory
            i += 1
        if filled < end:
            view[filled - offset :] = bytes(end - filled)
        if overlay:
            _lay_over(view, overlay, offset, end)
        if warm and stripe_ends:
            self._cold.discard(ino)
        self._read_ahead(ino, offset, end, items, stripe_ends, warm)
        return out  # a bytearray the caller owns: the NFS reply sends it without another 1 MiB copy

    def _pending_writes(self, ino: int) -> list:
        """(payload, [(file offset, payload offset, length)]) of the file's uncommitted writes."""
        overlay: list = []
        fb = self.files.get(ino)
        if fb is not None and not fb.dead:
            may_block("pending writes")  # fb.lock is held across a flush
            with fb.lock:
                with fb.ilock:
                    for s in fb.inflight:
                        overlay.append((s.payload, s.extents))
                if fb.data:
                    overlay.append((bytes(fb.data), [list(e) for e in fb.extents]))
        return overlay

    def _read_ahead(self, ino, offset, end, items, touched, warm: bool) -> None:
        sequential = self._last_read_end.get(ino) == offset
        self._last_read_end[ino] = end
        if len(self._last_read_end) > EXTENT_CACHE_FILES:
            self._last_read_end.pop(next(iter(self._last_read_end)))
        # a warm file (its fragments in the page cache) is read by the event loop itself: threads
        # reading ahead would only take the GIL from it (warm nfs-rs read: docs/performance.md)
        if not sequential or not touched or warm:
            return
        last_index = touched[-1][0]
        seen = set()
        for _fo, _elen, sid, _so in items[last_index : last_index + 1 + READ_AHEAD_STRIPES * 8]:
            if sid in seen:
                continue
            seen.add(sid)
            info = self.extents.stripe(sid)
            if info is not None:
                self.reader.prefetch(info)
            if len(seen) > READ_AHEAD_STRIPES:
                break


def _lay_over(view: memoryview, overlay: list, offset: int, end: int) -> None:
    """Copy pending writes over ``view`` (file bytes [offset, end)); later ones win."""
    for payload, pending in overlay:
        if not payload:
            continue
        for fo, so, elen in pending:
            a, b = max(fo, offset), min(fo + elen, end)
            if a < b:
                view[a - offset : b - offset] = payload[so + (a - fo) : so + (b - fo)]
