"""The durable batch transaction: written stripes become catalog rows (invariant 2).

A stripe is recorded only once every fragment of it is durable on its drive (its ticket is
``written``); the catalog transaction naming it is ``durable=True`` (SQLite FULL), and a flush
returns, so a stable WRITE or a COMMIT is answered, only once that transaction committed
(``PendingStripe.committed``). Batches commit in placement order: the commit lock is held
while popping and recording one, whether by the committer thread or by a flushing caller
(which would otherwise only wait)."""

from __future__ import annotations

import threading
import time
from collections import defaultdict, deque

from engine.base import errors
from engine.base.ordered_lock import condition, lock
from engine.catalog.database import (
    CatalogUnavailable,
    from_outage,
    in_list,
    sql,
    sql_all,
    sql_many,
    sql_one,
)
from engine.coding.erasure import INLINE
from engine.datapath.accounting import (
    ExtentMap,
    adjust_live,
    chunks,
    load_extents,
    write_map,
)
from engine.datapath.space import padded
from engine.datapath.stripes import PendingStripe, drain

COMMIT_BATCH = 256  # stripes per catalog transaction at most


class Committer:
    def __init__(self, catalog, space, reader, extents, *, inline, stats):
        self.catalog = catalog
        self.space = space
        self.reader = reader
        self.extents = extents  # extents.ExtentCache: forgets the maps of files a batch changed
        self.inline = inline
        self.stats = stats
        # the dispatcher's semaphore of stripes in flight, released at commit
        self.inflight: threading.BoundedSemaphore | None = None
        self.lock = lock("datapath.commit")
        self.cv = condition("datapath.commit_queue")
        self.queue: deque = deque()
        self.listeners: list = []
        self.size_watches: list = []  # see DataPath.add_size_watch
        self.writes_lost = 0  # batches let go because the catalog was unreachable
        self._stopping = False
        self._dispatch_idle = lambda: True
        self.thread = threading.Thread(target=self._run, daemon=True, name="shingle-commit")

    def start(self, dispatcher) -> None:
        self.inflight = dispatcher.inflight
        self._dispatch_idle = dispatcher.idle
        self.thread.start()

    def stop(self) -> None:
        self._stopping = True
        with self.cv:
            self.cv.notify_all()
        self.thread.join()

    def add_listener(self, listener, reader=None) -> None:
        """Call ``listener(inos, found)`` after each commit batch that changed the size and times of
        ``inos``; ``reader(conn, inos)``, if given, runs at the end of the batch's transaction and
        ``found`` is what it returned (None if the commit failed)."""
        self.listeners.append((listener, reader))

    # -- queue ------------------------------------------------------------------------------
    def enqueue(self, stripe: PendingStripe) -> None:
        """A placed (or failed) stripe, in placement order."""
        with self.cv:
            self.queue.append(stripe)

    def written(self, stripe: PendingStripe) -> None:
        """Every fragment of ``stripe`` is durable (or it failed): it may be recorded."""
        with self.cv:
            stripe.written.set()
            if not stripe.flushing:
                self.cv.notify()

    def _run(self) -> None:
        """Record written (durable) stripes in one catalog transaction per batch."""
        while True:
            with self.cv:
                while not (self.queue and self.queue[0].written.is_set()):
                    if self._stopping and not self.queue and self._dispatch_idle():
                        return
                    self.cv.wait(0.5)
            self.commit_ready(blocking=True)

    def commit_ready(self, *, blocking: bool) -> None:
        """Commit the written stripes at the head of the queue, in order, batch after batch (a flush
        whose stripe is written does not wake the committer: whoever holds the lock commits it)."""
        drain(
            self.lock,
            self.cv,
            self.queue,
            lambda s: s.written.is_set(),
            self._commit_batch,
            blocking=blocking,
            batch=COMMIT_BATCH,
        )

    # -- one batch ----------------------------------------------------------------------------
    def _commit_batch(self, batch: list[PendingStripe]) -> None:
        start = time.perf_counter()
        good = [s for s in batch if s.error is None]
        zone_state = self._zones_to_record(good)
        dead: list[int] = []
        found = [None] * len(self.listeners)
        self.stats["batches"] += 1
        try:
            if good or zone_state:
                # tracked: the extent cache and the commit listeners account for it; published:
                # other processes' namespace caches forget the files' attributes
                dead, found = self.catalog.run(
                    lambda conn: self._record(conn, good, zone_state),
                    durable=True,
                    tracked=True,
                    published=True,
                )
        except BaseException as exc:  # noqa: BLE001
            failure = self.failure(exc, f"catalog commit of {len(good)} stripes failed")
            for s in good:
                s.fail(failure)
            with self.space.lock:
                for zone_id in zone_state:
                    zone = self.space.zones[zone_id]
                    zone.dirty = True
                    self.space.dirty[zone_id] = zone
        self.stats["commit_s"] += time.perf_counter() - start
        self.reader.forget(set(dead))
        with self.space.lock:
            for s in batch:
                for _d, zone, offset, length, _i in s.placement:
                    zone.inflight -= 1
                    if s.error is None:
                        zone.committed_wp = max(zone.committed_wp, offset + length)
                for dropped in s.dropped:  # fragments the stripe did without (stripes.py)
                    dropped.zone.inflight -= 1
        inos = {s.fb.ino for s in batch}
        self.extents.invalidate(inos)
        for (listener, _reader), value in zip(self.listeners, found, strict=True):
            listener(inos, value)
        self._settle(batch)
        self.stats["stripes_committed"] += len(good)
        self.stats["fragments_lost_on_write"] += sum(len(s.dropped) for s in good)
        self.stats["client_bytes_written"] += sum(
            length for s in good for _fo, _so, length in s.extents
        )
        self.stats["media_bytes_written"] += sum(p.length for s in good for p in s.placement)
        self.stats["inline_bytes_written"] += sum(
            length for s in good if s.policy is self.inline for _fo, _so, length in s.extents
        )

    def failure(self, exc: BaseException, what: str) -> errors.IOFailure:
        """The error stripes that are let go carry to flush(): WritesNotRecorded when the
        catalog was unreachable (counted in ``writes_lost``), else an I/O failure."""
        if isinstance(exc, CatalogUnavailable) or from_outage(exc):
            # counted before any flush can see the failure: a write verifier read after this
            # differs from every one handed out with the bytes now let go
            self.writes_lost += 1
            return errors.WritesNotRecorded(f"{what}: {exc}")
        return errors.IOFailure(f"{what}: {exc}")

    def _zones_to_record(self, good: list[PendingStripe]) -> dict:
        """The zones whose rows the batch writes (those changed since the last batch, those the
        stripes went to): id -> (state, band class, opened_ns), taken under the space lock."""
        space = self.space
        with space.lock:
            zone_rows = {}
            for zone in space.dirty.values():
                if zone.dirty:
                    zone_rows[zone.id] = zone
                    zone.dirty = False
            space.dirty.clear()
            for s in good:
                for placed in s.placement:
                    zone_rows[placed.zone.id] = placed.zone
            return {z.id: (z.state, z.band_class, z.opened_ns) for z in zone_rows.values()}

    def _settle(self, batch: list[PendingStripe]) -> None:
        """Each stripe leaves its file's in-flight list (a failure becomes the file's error),
        drops its bytes, wakes its waiters and frees its in-flight slot."""
        for s in batch:
            fb = s.fb
            with fb.ilock:
                if s in fb.inflight:
                    fb.inflight.remove(s)
                if s.error is not None and fb.error is None and not fb.dead:
                    fb.error = s.error
            s.payload = b""
            s.fragments = []
            s.committed.set()
            assert self.inflight is not None  # set before the first stripe is dispatched
            self.inflight.release()

    def _record(
        self, conn, stripes: list[PendingStripe], zone_state: dict
    ) -> tuple[list[int], list]:
        """The one transaction of a flush batch: stripes, fragments, extents, zones, inodes.

        Plain SQL (engine.catalog.database.sql): this transaction is on the path of every
        COMMIT and stable WRITE, where SQLAlchemy's statement building cost more than SQLite."""
        now = time.time_ns()
        ids = _insert_stripes(conn, stripes, now)
        self.reader.forget(set(ids))  # an id SQLite hands out again must not hit an old cache entry
        ends = _insert_fragments(conn, ids, stripes)
        _advance_zones(conn, zone_state, ends, now)
        # extents, per file in write order; new stripes' bytes turn live as extents point at them
        deltas: dict[int, int] = {sid: 0 for sid in ids}
        by_ino: dict[int, list] = defaultdict(list)
        for sid, s in zip(ids, stripes, strict=True):
            by_ino[s.fb.ino].append((sid, s))
        watched = [(watch, watch.before(conn, by_ino)) for watch in self.size_watches]
        for ino, items in by_ino.items():
            for sid, delta in _extend_file(conn, ino, items, now).items():
                deltas[sid] = deltas.get(sid, 0) + delta
        for watch, state in watched:
            watch.after(conn, state)
        known = {
            sid: (len(s.payload), 0, [(p.zone.id, p.length) for p in s.placement])
            for sid, s in zip(ids, stripes, strict=True)
        }
        dead = adjust_live(conn, deltas, known)
        changed = set(by_ino)
        self.catalog.changes(conn, changed)  # sizes and times (Catalog.run published)
        found = [
            reader(conn, changed) if reader is not None else None
            for _listener, reader in self.listeners
        ]
        return dead, found


def _insert_stripes(conn, stripes: list[PendingStripe], now: int) -> list[int]:
    """The batch's stripe rows (an inline stripe's bytes in inline_data): their ids."""
    ids = []
    inline = []
    for s in stripes:
        p = s.policy
        fragment_length = s.placement[0].length if s.placement else len(s.payload)
        ids.append(
            sql_one(
                conn,
                "INSERT INTO stripes (band_class, layout, k, m, backend, data_length, "
                "fragment_length, compression, live_bytes, created_ns) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, NULL, 0, ?) RETURNING id",
                (p.name, p.layout, p.k, p.m, p.backend, len(s.payload), fragment_length, now),
            )[0]
        )
        if p.layout == INLINE:
            inline.append((ids[-1], len(s.payload), s.crcs[0], bytes(s.payload)))
    sql_many(
        conn,
        "INSERT INTO inline_data (stripe_id, length, checksum, data) VALUES (?, ?, ?, ?)",
        inline,
    )
    return ids


def _insert_fragments(conn, ids: list[int], stripes: list[PendingStripe]) -> dict[int, int]:
    """The fragment rows: the end of the new fragments in each zone written."""
    fragments = []
    ends: dict[int, int] = {}
    for sid, s in zip(ids, stripes, strict=True):
        for drive, zone, offset, length, i in s.placement:
            fragments.append((sid, i, drive.id, zone.id, offset, length, s.crcs[i]))
            # the device's pointer moves over the block padding too (garbage below it)
            ends[zone.id] = max(ends.get(zone.id, 0), offset + padded(length, drive.granularity))
    sql_many(
        conn,
        "INSERT INTO fragments (stripe_id, idx, drive_id, zone_id, zone_offset, length, "
        "checksum) VALUES (?, ?, ?, ?, ?, ?, ?)",
        fragments,
    )
    return ends


def _advance_zones(conn, zone_state: dict, ends: dict[int, int], now: int) -> None:
    """The write pointer moves over the new fragments; everything below it that is not live is
    garbage (gaps left by failed flushes included)."""
    current: dict[int, int] = {}
    for part in chunks(list(zone_state)):
        current.update(
            sql_all(
                conn,
                f"SELECT id, write_pointer FROM zones WHERE id IN {in_list(part)}",
                tuple(part),
            )
        )
    updates = []
    for zone_id, (state, band_class, opened_ns) in zone_state.items():
        wp = current.get(zone_id, 0)
        new_wp = max(wp, ends.get(zone_id, 0))
        updates.append(
            (
                state,
                band_class,
                opened_ns,
                new_wp,
                new_wp - wp,
                now if zone_id in ends else None,
                zone_id,
            )
        )
    sql_many(
        conn,
        "UPDATE zones SET state = ?, band_class = ?, opened_ns = ?, write_pointer = ?, "
        "garbage_bytes = garbage_bytes + ?, last_write_ns = COALESCE(?, last_write_ns) "
        "WHERE id = ?",
        updates,
    )


def _extend_file(conn, ino: int, items: list, now: int) -> dict[int, int]:
    """One file's new extents (``items``: (stripe id, PendingStripe) in write order) and its
    size, times and change counter: the live-byte change of each stripe involved (none when
    the file was removed meanwhile: its new stripes stay dead)."""
    new = [(fo, length, sid, so) for sid, s in items for fo, so, length in s.extents]
    lo = min(fo for fo, *_ in new)
    hi = max(fo + length for fo, length, *_ in new)
    # at least the change the buffered writes showed (FileBuffer.change): it never
    # goes back, and a writer that saw it then sees no change at the commit
    shown = max(s.fb.change for _sid, s in items)
    # mtime is the time of the last write committed, not the commit's, unless a setattr
    # set it after that write (read inside this transaction: setattr's is ordered with it)
    written = max(
        (s.written_ns for _sid, s in items if s.written_ns > s.fb.times_set_after),
        default=None,
    )
    cursor = sql(
        conn,
        "UPDATE inodes SET size = CASE WHEN size < ? THEN ? ELSE size END, "
        "mtime_ns = COALESCE(?, mtime_ns), ctime_ns = ?, "
        "change = CASE WHEN change + 1 < ? THEN ? ELSE change + 1 END WHERE ino = ?",
        (hi, hi, written, now, shown, shown, ino),
    )
    alive = cursor.rowcount
    cursor.close()
    if not alive:
        return {}
    emap = ExtentMap(load_extents(conn, ino, lo, hi))
    for fo, length, sid, so in new:
        emap.put(fo, length, sid, so)
    write_map(conn, ino, emap)
    return emap.delta
