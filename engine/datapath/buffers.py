"""Per-file write buffers: write, flush, and the truncate and release of a file's data.

``write`` reserves space and copies the bytes into the file's buffer; a full stripe goes to the
Dispatcher. Inside ``no_blocking()`` (the NFS event loop) a write that fills no stripe runs as
well; one that would fill a stripe, wait for a lock or reclaim space raises WouldBlock before it
changed anything. ``flush`` submits what is left, encodes and places it itself, and returns once all
the file's stripes committed. ``truncate`` and ``release`` run inside the namespace's catalog
transaction."""

from __future__ import annotations

import time
from collections import OrderedDict, defaultdict

from engine.base import errors
from engine.base.blocking import WouldBlock, blocking_forbidden, holding
from engine.base.ordered_lock import lock
from engine.catalog.database import in_list, sql, sql_all, sql_one
from engine.coding.erasure import Policy
from engine.datapath.accounting import (
    ExtentMap,
    adjust_live,
    chunks,
    load_extents,
    write_map,
)
from engine.datapath.extents import EXTENT_CACHE_FILES
from engine.datapath.stripes import FileBuffer


class FileBuffers:
    def __init__(
        self,
        catalog,
        policies: dict[str, Policy],
        default_class: str,
        space,
        dispatcher,
        commits,
        extents,
        reader,
        *,
        max_extent: int,
    ):
        self.catalog = catalog
        self.policies = policies
        self.default_class = default_class
        self.space = space
        self.dispatcher = dispatcher
        self.commits = commits
        self.extents = extents
        self.reader = reader
        self.max_extent = max_extent
        self.closed = False
        self.files: dict[int, FileBuffer] = {}
        self._files_lock = lock("datapath.files")
        # ino -> (size, policy, pinned, catalog epoch) of files whose last flush left them idle: the
        # next write to them (a random-write or append loop) needs no catalog read while no commit
        # by anyone has happened since (Catalog.epoch). None: the catalog cannot vouch, it reads.
        self._settled: OrderedDict = OrderedDict()

    def policy_for(self, band_class: str | None) -> Policy:
        return self.policies.get(
            band_class or self.default_class, self.policies[self.default_class]
        )

    def _buffer(self, ino: int) -> FileBuffer:
        fb = self.files.get(ino)
        if fb is not None and not fb.dead:
            return fb
        settled = self._settled.get(ino)
        # valid while no commit since changed the file: this process's own flushes, truncates
        # and releases evict the entry (forget_settled); another process's name it in their
        # change records (engine/catalog/changelog.py); a commit without one may have
        if settled is not None and self._still(ino, settled[3]):
            size, policy, pinned = settled[:3]
        else:
            row = self.catalog.read(
                lambda conn: sql_one(
                    conn, "SELECT size, band_class FROM inodes WHERE ino = ?", (ino,)
                )
            )
            if row is None:
                raise errors.StaleHandle(f"inode {ino} does not exist")
            size, policy, pinned = row[0], self.policy_for(row[1]), row[1] in self.policies
        with self._files_lock:
            fb = self.files.get(ino)
            if fb is None or fb.dead:
                self._settled.pop(ino, None)
                fb = self.files[ino] = FileBuffer(ino, policy, size, pinned=pinned)
            return fb

    def _still(self, ino: int, epoch: int) -> bool:
        """Whether no commit since ``epoch`` but this process's tracked ones changed ``ino``."""
        now = self.catalog.epoch()
        if now is None:
            return False
        if now == epoch:
            return True
        changes = self.catalog.changes_since(epoch, now)
        return changes is not None and not any(ino in change.inos for change in changes)

    def write(self, ino: int, offset: int, data, *, seen_change: int = 0) -> int:
        """Buffer ``data`` at ``offset``; the new pending size. ``seen_change``: the file's change
        attribute as the writer saw it (with earlier buffered writes), which this one moves past."""
        if self.closed:
            raise errors.IOFailure("data path is closed")
        if offset < 0:
            raise errors.InvalidArgument(f"write at offset {offset}: expected >= 0")
        length = len(data)
        space = self.space
        while True:
            fb = self._buffer(ino)
            with holding(fb.lock, "the file's buffer is being flushed"):
                if fb.dead:
                    continue
                if length == 0:
                    return fb.size
                policy = fb.policy
                if len(fb.data) + length >= policy.stripe_size and blocking_forbidden():
                    # a full stripe goes to the dispatcher, which may wait (backpressure)
                    raise WouldBlock("a full stripe")
                need = space.need(policy, length)
                space.reserve(need, policy)
                fb.reserved += need
                fb.change = max(fb.change, seen_change) + 1
                fb.mtime_ns = max(time.time_ns(), fb.mtime_ns + 1)
                view = memoryview(data).cast("B")
                stripe_size = policy.stripe_size
                pos = 0
                while pos < length:
                    used = len(fb.data)
                    take = min(stripe_size - used, length - pos)
                    fb.data += view[pos : pos + take]
                    last = fb.extents[-1] if fb.extents else None
                    if (
                        last is not None
                        and last[0] + last[2] == offset + pos
                        and last[1] + last[2] == used
                    ):
                        last[2] += take
                    else:
                        fb.extents.append([offset + pos, used, take])
                    pos += take
                    if len(fb.data) >= stripe_size:
                        self.dispatcher.submit(fb)
                fb.size = max(fb.size, offset + length)
                return fb.size

    def flush(self, ino: int) -> None:
        """Make every write to ``ino`` so far durable and recorded. Nothing buffered or in flight
        returns at once, inside ``no_blocking()`` too (the event loop answers such a COMMIT);
        anything else raises WouldBlock there before it changed anything."""
        fb = self.files.get(ino)
        if fb is None:
            return
        if blocking_forbidden():
            raise WouldBlock("a flush")
        with fb.lock:
            submitted = bool(fb.data)
            if submitted:
                self.dispatcher.submit(fb, inline=True)
            with fb.ilock:
                waiting = list(fb.inflight)
                for stripe in waiting:
                    stripe.flushing = True  # we commit it ourselves below: no committer wake-up
        if submitted:
            # outside fb.lock: placing may reset zones in a catalog transaction, and a namespace
            # transaction freeing this file waits for fb.lock (release)
            self.dispatcher.dispatch_ready(blocking=False)
        for stripe in waiting:
            stripe.written.wait()
            if not stripe.committed.is_set():
                self.commits.commit_ready(
                    blocking=False
                )  # rather than wake the committer and wait for it
            stripe.committed.wait()
        with fb.lock:
            with fb.ilock:
                error, fb.error = fb.error, None
                if fb.idle():
                    self.space.unreserve(fb.reserved)
                    fb.reserved = 0
                    epoch = (
                        self.catalog.epoch()
                    )  # after our commit (a commit racing it is taken as seen)
                    with self._files_lock:
                        if self.files.get(ino) is fb:
                            del self.files[ino]
                            fb.dead = True
                            if error is None:
                                self._settle(ino, fb.size, fb.policy, fb.pinned, epoch)
        if error is not None:
            raise error

    def flush_all(self) -> None:
        first = None
        for ino in list(self.files):
            try:
                self.flush(ino)
            except errors.FsError as exc:
                first = first or exc
        if first is not None:
            raise first

    def pending_size(self, ino: int) -> int | None:
        fb = self.files.get(ino)
        if fb is None or fb.dead or fb.idle():
            return None
        return fb.size

    def pending_attrs(self, ino: int) -> tuple[int, int, int] | None:
        """(size, change, mtime_ns) counting buffered writes not yet committed, or None."""
        fb = self.files.get(ino)
        if fb is None or fb.dead or fb.idle():
            return None
        # a write older than an explicit mtime no longer shows
        mtime_ns = fb.mtime_ns if fb.mtime_ns > fb.times_set_after else 0
        return fb.size, fb.change, mtime_ns

    def times_set(self, ino: int) -> None:
        """A setattr sets the mtime of ``ino`` explicitly (inside its transaction): the commit
        of the writes buffered so far keeps that time instead of recording theirs."""
        fb = self.files.get(ino)
        if fb is not None:
            # without fb.lock: a write holding it may wait for a commit, which waits for this
            # transaction; a write racing the setattr may land on either side of it
            fb.times_set_after = fb.mtime_ns

    def changed(self, inos) -> None:
        """A namespace transaction changed ``inos`` (and their change attribute in the catalog):
        a file whose buffered writes show a higher change than the catalog moves it once more,
        or a chmod or rename of it would not show until its data commits."""
        for ino in inos:
            fb = self.files.get(ino)
            if fb is not None and fb.change:
                with fb.lock:
                    if fb.change:
                        fb.change += 1

    # -- what is known of idle files ------------------------------------------------------------
    def created(self, conn, ino: int) -> None:
        """A new file, inside its create transaction: once that commits, its size and class
        are known (``_settled``), so the first write to it skips the catalog read."""
        size, band_class = sql_one(
            conn, "SELECT size, band_class FROM inodes WHERE ino = ?", (ino,)
        )

        def settle():
            epoch = self.catalog.epoch()
            with self._files_lock:
                if ino not in self.files:
                    self._settle(
                        ino, size, self.policy_for(band_class), band_class in self.policies, epoch
                    )

        self.catalog.after_commit(conn, settle)

    def _settle(self, ino: int, size: int, policy: Policy, pinned: bool, epoch: int | None) -> None:
        """Remember an idle file's size and class as of ``epoch`` (caller holds _files_lock)."""
        if epoch is None:
            return  # no epoch (PostgreSQL's change watch down): _buffer reads
        self._settled[ino] = (size, policy, pinned, epoch)
        while len(self._settled) > EXTENT_CACHE_FILES:
            self._settled.popitem(last=False)

    def forget_settled(self, inos) -> None:
        with self._files_lock:
            for ino in inos:
                self._settled.pop(ino, None)

    # -- truncate and release (inside the namespace's transaction) -----------------------------
    def _after_commit(self, conn, inos) -> None:
        self.catalog.after_commit(conn, lambda: self.extents.invalidate(inos))

    def truncate(self, conn, ino: int, old_size: int, new_size: int) -> None:
        fb = self.files.get(ino)
        if fb is not None:
            with fb.lock:
                fb.size = new_size
        if new_size < old_size:
            emap = ExtentMap(load_extents(conn, ino, new_size))
            emap.punch(new_size, max(old_size, new_size + 1) + self.max_extent)
            write_map(conn, ino, emap)
            dead = adjust_live(conn, dict(emap.delta))
            self.reader.forget(set(dead))
        self.extents.invalidate({ino})
        self._after_commit(conn, {ino})

    def release(self, conn, ino: int, limit: int | None = None) -> bool:
        """The inode is being freed: its extents become garbage. With ``limit``, only the last
        ``limit`` extents go in this transaction (the caller frees the rest in later ones);
        True when none is left."""
        with self._files_lock:
            fb = self.files.pop(ino, None)
            self._settled.pop(ino, None)
        if fb is not None:
            with fb.lock:
                fb.dead = True
                fb.data = bytearray()
                fb.extents = []
                self.space.unreserve(fb.reserved)
                fb.reserved = 0
        if limit is None:
            rows = load_extents(conn, ino)
        else:
            rows = sql_all(
                conn,
                "SELECT file_offset, length, stripe_id, stripe_offset, id FROM extents "
                "WHERE ino = ? ORDER BY file_offset DESC LIMIT ?",
                (ino, limit + 1),
            )
        done = limit is None or len(rows) <= limit
        rows = rows if done else rows[:limit]
        deltas: dict[int, int] = defaultdict(int)
        for _fo, length, sid, _so, _id in rows:
            deltas[sid] -= length
        if done:
            sql(conn, "DELETE FROM extents WHERE ino = ?", (ino,)).close()
        else:
            for part in chunks([row[4] for row in rows]):
                sql(conn, f"DELETE FROM extents WHERE id IN {in_list(part)}", tuple(part)).close()
        dead = adjust_live(conn, dict(deltas))
        self.reader.forget(set(dead))
        self.extents.invalidate({ino})
        self._after_commit(conn, {ino})
        return done
