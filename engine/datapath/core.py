"""DataPath: the FileData implementation behind the namespace (see the package docstring)."""
from __future__ import annotations

import bisect
import queue
import threading
import time
from collections import OrderedDict, defaultdict, deque
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass, field

import crc32c
from sqlalchemy import func, select

from engine import errors
from engine.blocking import may_block
from engine.catalog.database import in_list, sql, sql_all, sql_many, sql_one
from engine.catalog.models import BandClass, Drive, Extent, Fragment, Inode, Stripe, Zone
from engine.datapath.accounting import ExtentMap, adjust_live, chunks, load_extents, write_map
from engine.datapath.drivestate import DriveState, ZoneMem
from engine.datapath.reader import StripeInfo, StripeReader
from engine.erasure import ALIGNMENT_SLACK, DEFAULT_CLASS, HOT_CLASS, INLINE, Policy, inline_policy

INODES = Inode.__table__
DRIVES = Drive.__table__
ZONES = Zone.__table__
STRIPES = Stripe.__table__
FRAGMENTS = Fragment.__table__
EXTENTS = Extent.__table__
BAND_CLASSES = BandClass.__table__

COMMIT_BATCH = 256  # stripes per catalog transaction at most
_STRIPE_INFO_SQL = ", ".join(StripeInfo.COLUMNS)
EXTENT_CACHE_FILES = 4096
READ_AHEAD_STRIPES = 2
# Durable flushes up to INLINE_WRITE_BYTES that would go to the hot class are kept in the catalog
# instead (stripes of layout "inline"): their bytes ride in the flush's one catalog transaction, so
# a 4 KiB COMMIT costs one fsync round instead of two (drives, then catalog). Tiering folds them into
# erasure-coded stripes like other hot data; INLINE_BUDGET_BYTES bounds what the catalog holds.
INLINE_WRITE_BYTES = 64 << 10
INLINE_BUDGET_BYTES = 256 << 20
INLINE_RECOUNT_S = 5.0  # over budget: count what tiering has folded meanwhile at most this often


class PendingStripe:
    """A stripe on its way: buffered -> encoded -> placed -> written -> fsync'ed -> committed."""

    __slots__ = ("seq", "fb", "policy", "payload", "extents", "reserved", "fragments", "crcs", "placement",
                 "remaining", "lock", "written", "committed", "error", "encoding", "encoded", "flushing")

    def __init__(self, seq, fb, payload, extents, reserved, policy):
        self.seq = seq
        self.fb = fb
        self.policy: Policy = policy
        self.payload: bytes = payload
        self.extents = extents  # [file_offset, stripe_offset, length] in write order
        self.reserved = reserved
        self.fragments: list = []
        self.crcs: list[int] = []
        self.placement: list = []  # (DriveState, ZoneMem, zone_offset, length, fragment idx)
        self.remaining = 0
        self.lock = threading.Lock()
        self.written = threading.Event()
        self.committed = threading.Event()
        self.error: BaseException | None = None
        self.encoding: Future | None = None
        self.encoded = None  # erasure.Encoded: its buffers are freed once every fragment is written
        self.flushing = False  # a flush waits for it and commits it itself: the committer need not wake

    def fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc


class FileBuffer:
    """Per-file write buffer: the bytes of the stripe being filled, and the stripes in flight."""

    __slots__ = ("ino", "policy", "pinned", "size", "data", "extents", "reserved", "inflight", "lock", "ilock",
                 "error", "dead")

    def __init__(self, ino: int, policy: Policy, size: int, pinned: bool = False):
        self.ino = ino
        self.policy = policy
        self.pinned = pinned  # the inode names its band class: no small-write routing
        self.size = size  # file size counting buffered writes
        self.data = bytearray()
        self.extents: list[list[int]] = []
        self.reserved = 0
        self.inflight: list[PendingStripe] = []
        self.lock = threading.Lock()  # data/extents/size
        self.ilock = threading.Lock()  # inflight
        self.error: BaseException | None = None
        self.dead = False

    def idle(self) -> bool:
        return not self.data and not self.inflight


@dataclass
class RecoveryReport:
    drives: int = 0
    missing_drives: list = field(default_factory=list)
    zones_checked: int = 0
    zones_with_garbage: int = 0
    garbage_bytes: int = 0
    short_zones: list = field(default_factory=list)  # (drive id, zone idx, catalog wp, medium wp)
    zones_reset: int = 0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


class _Latch:
    def __init__(self, count: int):
        self.count = count
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.errors: list = []
        if count == 0:
            self.done.set()

    def arrive(self, exc=None):
        with self.lock:
            if exc is not None:
                self.errors.append(exc)
            self.count -= 1
            if self.count == 0:
                self.done.set()


def _drain(lock, cv, queue: deque, ready, run, *, blocking: bool, batch: int = 1) -> None:
    """Whoever holds ``lock`` runs ``run(items)`` on the ready items at the head of ``queue``, in
    order, up to ``batch`` at a time; ``cv`` guards the queue. A caller that finds the lock held
    leaves its items to the holder and wakes nobody, so the holder looks once more after letting go."""
    while True:
        if not lock.acquire(blocking=blocking):
            return
        try:
            while True:
                with cv:
                    items = []
                    while queue and ready(queue[0]) and len(items) < batch:
                        items.append(queue.popleft())
                if not items:
                    break
                run(items)
        finally:
            lock.release()
        with cv:
            if not (queue and ready(queue[0])):
                return
        blocking = False


class DataPath:
    def __init__(self, catalog, policies: dict[str, Policy], *, reserve_zones: int = 2, smr_model=None,
                 encoders: int = 2, read_threads: int = 12, max_inflight_stripes: int = 24,
                 cache_bytes: int = 256 << 20, small_write_bytes: int | None = None,
                 inline_write_bytes: int = INLINE_WRITE_BYTES, inline_budget_bytes: int = INLINE_BUDGET_BYTES):
        if not policies:
            raise errors.ConfigError("band_classes", policies, "at least one band class policy")
        if isinstance(reserve_zones, bool) or not isinstance(reserve_zones, int) or reserve_zones < 0:
            raise errors.ConfigError("datapath.reserve_zones", reserve_zones, "an integer >= 0")
        for name, value in (("inline_write_bytes", inline_write_bytes), ("inline_budget_bytes", inline_budget_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise errors.ConfigError(f"storage.{name}", value, "an integer >= 0")
        self.catalog = catalog
        self.policies = dict(policies)
        self.default_class = DEFAULT_CLASS if DEFAULT_CLASS in policies else next(iter(policies))
        self.reserve_zones = reserve_zones
        self.smr_model = smr_model
        self.max_fragment = max(p.max_fragment_length for p in self.policies.values())
        self.max_extent = max(p.stripe_size for p in self.policies.values())
        # flushes smaller than this go to the hot (replicated) class; default: one fragment of the default class
        self.small_write_bytes = (self.policies[self.default_class].fragment_size if small_write_bytes is None
                                  else small_write_bytes)
        self._write_band_classes()
        use_inline = HOT_CLASS in self.policies and inline_write_bytes and inline_budget_bytes
        self.inline = inline_policy(HOT_CLASS, inline_write_bytes) if use_inline else None
        self.inline_budget_bytes = inline_budget_bytes
        self._inline_lock = threading.Lock()
        self._inline_used = self._count_inline() if use_inline else 0  # estimate: counts up, recounted
        self._inline_counted_at = time.monotonic()

        self._space_lock = threading.RLock()
        self._drives: dict[int, DriveState] = {}
        self._zones: dict[int, ZoneMem] = {}
        self._zone_drive: dict[int, DriveState] = {}
        self._reserved = 0
        # Guards _reserved alone. release() takes it inside the namespace's catalog transaction,
        # so it must never be held while waiting for the catalog (as _space_lock is, in
        # _reserve -> _reclaim_zones): otherwise each side waits for the other's lock.
        self._reserve_lock = threading.Lock()
        self._reclaimable: dict[int, int] = {}
        self._rr = 0
        self._load_drives()
        for policy in self.policies.values():
            for drive in self._drives.values():
                if policy.max_fragment_length > drive.zone_size:
                    raise errors.ConfigError(f"band_classes.{policy.name}.fragment_size", policy.fragment_size,
                                             f"fragments that fit drive {drive.id}'s zones of {drive.zone_size} "
                                             "bytes")

        self._files: dict[int, FileBuffer] = {}
        self._files_lock = threading.Lock()
        # ino -> (size, policy, pinned, catalog epoch) of files whose last flush left them idle: the
        # next write to them (a random-write or append loop) needs no catalog read while no commit
        # by anyone has happened since (Catalog.epoch). None on PostgreSQL: there it always reads.
        self._settled: OrderedDict = OrderedDict()
        self._seq = 0
        self._seq_lock = threading.Lock()
        self._inflight = threading.BoundedSemaphore(max_inflight_stripes)
        self._dispatch_q: deque = deque()
        self._dispatch_cv = threading.Condition()
        self._dispatch_lock = threading.Lock()
        # held while popping and recording a batch: batches commit in placement order, whether the
        # committer thread or a flushing caller (which would only wait otherwise) runs them
        self._commit_lock = threading.Lock()
        self._commit_q: deque = deque()
        self._commit_listeners: list = []
        self._commit_cv = threading.Condition()
        self._stopping = False
        self._closed = False

        self._maps: OrderedDict = OrderedDict()  # ino -> (starts, items)
        self._map_version: dict[int, int] = defaultdict(int)
        self._maps_lock = threading.Lock()
        self._stripes: dict[int, StripeInfo] = {}
        self._generation = 0  # bumped by invalidate_stripes: loads that began before it are not cached
        self._last_read_end: dict[int, int] = {}
        self.reader = StripeReader(self._drives, self._zones, threads=read_threads, cache_bytes=cache_bytes,
                                   load_inline=self._load_inline)
        self.reader.repair_hook = self._queue_repair
        self._repairer = ThreadPoolExecutor(1, thread_name_prefix="shingle-repair")
        self._repairs: list[Future] = []
        self.stats = defaultdict(float)

        self.recovery_report = self.recover()
        self._encoder = ThreadPoolExecutor(encoders, thread_name_prefix="shingle-encode")
        self._threads = []
        for drive in self._drives.values():
            drive.thread = threading.Thread(target=self._drive_writer, args=(drive,), daemon=True,
                                            name=f"shingle-drive-{drive.id}")
            self._threads.append(drive.thread)
        self._threads.append(threading.Thread(target=self._dispatcher, daemon=True, name="shingle-dispatch"))
        self._threads.append(threading.Thread(target=self._committer, daemon=True, name="shingle-commit"))
        for thread in self._threads:
            thread.start()

    # -- set-up ------------------------------------------------------------------------
    def _write_band_classes(self) -> None:
        def work(conn):
            for policy in self.policies.values():
                row = policy.as_row()
                done = conn.execute(BAND_CLASSES.update().where(BAND_CLASSES.c.name == policy.name)
                                    .values(**row)).rowcount
                if not done:
                    conn.execute(BAND_CLASSES.insert().values(**row))
        self.catalog.run(work)

    def _load_drives(self) -> None:
        def work(conn):
            drives = conn.execute(select(DRIVES).where(DRIVES.c.state != "removed").order_by(DRIVES.c.id)).all()
            zones = defaultdict(list)
            for row in conn.execute(select(ZONES)):
                zones[row.drive_id].append(row)
            return drives, zones
        drives, zones = self.catalog.read(work)
        for row in drives:
            drive = DriveState(row, zones[row.id])
            if self.smr_model is not None and drive.backend is not None:
                drive.backend.model = self.smr_model
                drive.backend.model_key = drive.id
            self._drives[drive.id] = drive
            for zone in drive.zones:
                self._zones[zone.id] = zone
                self._zone_drive[zone.id] = drive

    def refresh_drive_states(self) -> None:
        """Re-read Drive.state (an admin or the rebuild engine may have changed it)."""
        rows = self.catalog.read(lambda conn: conn.execute(select(DRIVES.c.id, DRIVES.c.state)).all())
        for row in rows:
            drive = self._drives.get(row.id)
            if drive is not None:
                drive.state = row.state

    # -- crash recovery ---------------------------------------------------------------------
    def recover(self) -> RecoveryReport:
        """Compare each zone's medium write pointer with the catalog (run at start).

        Bytes past the committed write pointer come from a flush that never
        committed: they become garbage of the zone, never referenced, and new
        appends go after them. A zone shorter than the catalog says is reported."""
        if getattr(self, "_threads", None):
            self.flush_all()
        report = RecoveryReport(drives=len(self._drives))
        updates = []
        with self._space_lock:
            for drive in self._drives.values():
                if drive.backend is None or not drive.present():
                    report.missing_drives.append(drive.id)
                    continue
                drive.open.clear()
                drive.empty.clear()
                for zone in drive.zones:
                    report.zones_checked += 1
                    medium = drive.backend.write_pointer(zone.idx)
                    values = {}
                    if medium > zone.committed_wp:
                        extra = medium - zone.committed_wp
                        report.zones_with_garbage += 1
                        report.garbage_bytes += extra
                        values = {"write_pointer": medium, "garbage_bytes": ZONES.c.garbage_bytes + extra}
                        if zone.state == "empty":
                            values["state"] = zone.state = "full"  # only garbage: reclaimable
                        zone.committed_wp = medium
                    elif medium < zone.committed_wp:
                        report.short_zones.append((drive.id, zone.idx, zone.committed_wp, medium))
                        zone.state = "full"  # never append where the catalog believes data lives
                        values = {"state": "full"}
                    zone.wp = max(medium, zone.committed_wp)
                    if values:
                        updates.append((zone.id, values))
                    if zone.state == "empty" and zone.wp == 0:
                        drive.empty.add(zone.idx)
                    elif zone.state == "open" and zone.band_class in self.policies \
                            and zone.band_class not in drive.open and zone.wp < drive.zone_size:
                        drive.open[zone.band_class] = zone
                    elif zone.state == "open":
                        zone.state = "full"
                        updates.append((zone.id, {"state": "full"}))

        def work(conn):
            for zone_id, values in updates:
                conn.execute(ZONES.update().where(ZONES.c.id == zone_id).values(**values))
        if updates:
            self.catalog.run(work, durable=True)
        return report

    # -- capacity -------------------------------------------------------------------------
    def _refresh_reclaimable(self) -> None:
        def work(conn):
            return conn.execute(select(ZONES.c.drive_id, func.count()).where(
                ZONES.c.state == "full", ZONES.c.live_bytes == 0).group_by(ZONES.c.drive_id)).all()
        self._reclaimable = {row[0]: row[1] for row in self.catalog.read(work)}

    def _usable(self, policy: Policy | None = None) -> int:
        fragment = (policy or self.policies[self.default_class]).max_fragment_length
        return sum(d.usable_bytes(self.reserve_zones, fragment, self._reclaimable.get(d.id, 0))
                   for d in self._drives.values() if d.writable())

    def capacity(self) -> tuple[int, int]:
        """Usable (total, free) bytes of user data: raw x k/(k+m), less the cleaning reserve."""
        policy = self.policies[self.default_class]
        self._refresh_reclaimable()
        with self._space_lock:
            raw = sum(max(d.zone_count - self.reserve_zones, 0) * d.zone_size
                      for d in self._drives.values() if d.state not in ("failed", "removed"))
            free = max(self._usable() - self._reserved, 0)
        return int(raw * policy.efficiency), int(free * policy.efficiency)

    def _need(self, policy: Policy, length: int) -> int:
        """Raw bytes to reserve for ``length`` user bytes (headers of every stripe they may start)."""
        stripes = 2 + length // policy.stripe_size
        return policy.width * (-(-length // policy.k) + stripes * (policy.header_size + ALIGNMENT_SLACK))

    def _reserve(self, need: int, policy: Policy) -> None:
        with self._space_lock:
            with self._reserve_lock:
                if self._reserved + need <= self._usable(policy):
                    self._reserved += need
                    return
            self._reclaim_zones()
            self._refresh_reclaimable()
            with self._reserve_lock:
                if self._reserved + need > self._usable(policy):
                    raise errors.NoSpace(f"no space for {need} more raw bytes: {self._usable(policy) - self._reserved}"
                                         f" usable on {sum(d.writable() for d in self._drives.values())} writable "
                                         "drives")
                self._reserved += need

    def _unreserve(self, amount: int) -> None:
        if amount:
            with self._reserve_lock:
                self._reserved = max(self._reserved - amount, 0)

    def _reclaim_zones(self) -> int:
        """Reset zones holding only garbage (invariant 6: no committed extent points into them)."""
        # A stripe with a few live bytes can round its fragments' live share down to zero, so
        # the counter alone must not decide: no fragment of a live stripe may sit in the zone.
        referenced = (select(FRAGMENTS.c.id).join(STRIPES, FRAGMENTS.c.stripe_id == STRIPES.c.id)
                      .where(FRAGMENTS.c.zone_id == ZONES.c.id, STRIPES.c.live_bytes > 0).exists())

        def find(conn):
            return conn.execute(select(ZONES.c.id).where(ZONES.c.live_bytes == 0, ZONES.c.state.in_(("full", "open")),
                                                        ZONES.c.write_pointer > 0, ~referenced)).scalars().all()
        with self._space_lock:
            candidates = []
            for zone_id in self.catalog.read(find):
                zone, drive = self._zones.get(zone_id), self._zone_drive.get(zone_id)
                if zone is None or drive is None or zone.inflight or not drive.writable():
                    continue
                candidates.append((drive, zone))
            if not candidates:
                return 0

            def work(conn):
                done = []
                for drive, zone in candidates:
                    hit = conn.execute(ZONES.update().where(ZONES.c.id == zone.id, ZONES.c.live_bytes == 0,
                                                            ~referenced).values(
                        state="empty", band_class=None, write_pointer=0, live_bytes=0, garbage_bytes=0,
                        opened_ns=None, resets=ZONES.c.resets + 1)).rowcount
                    if hit:
                        done.append((drive, zone))
                return done
            done = self.catalog.run(work, durable=True)
            latch = _Latch(len(done))
            for drive, zone in done:
                if drive.open.get(zone.band_class) is zone:
                    del drive.open[zone.band_class]
                # through the writer's queue, behind any "finish" still queued for this zone
                drive.queue.put(("reset", zone.idx, latch))
            latch.done.wait()
            if latch.errors:
                raise errors.IOFailure(f"zone reset failed: {latch.errors[0]}")
            for drive, zone in done:
                zone.state, zone.band_class, zone.wp, zone.committed_wp, zone.dirty = "empty", None, 0, 0, False
                drive.empty.add(zone.idx)
            return len(done)

    # -- writes ----------------------------------------------------------------------------
    def _policy_for(self, band_class: str | None) -> Policy:
        return self.policies.get(band_class or self.default_class, self.policies[self.default_class])

    def _buffer(self, ino: int) -> FileBuffer:
        fb = self._files.get(ino)
        if fb is not None and not fb.dead:
            return fb
        settled = self._settled.get(ino)
        # valid while every commit since was one this process accounts for (its own flushes,
        # truncates and releases evict the entry: _invalidate); another writer's flush is one
        if settled is not None and self.catalog.only_tracked(settled[3], self.catalog.epoch()):
            size, policy, pinned = settled[:3]
        else:
            row = self.catalog.read(lambda conn: sql_one(conn, "SELECT size, band_class FROM inodes WHERE ino = ?",
                                                         (ino,)))
            if row is None:
                raise errors.StaleHandle(f"inode {ino} does not exist")
            size, policy, pinned = row[0], self._policy_for(row[1]), row[1] in self.policies
        with self._files_lock:
            fb = self._files.get(ino)
            if fb is None or fb.dead:
                self._settled.pop(ino, None)
                fb = self._files[ino] = FileBuffer(ino, policy, size, pinned=pinned)
            return fb

    def write(self, ino: int, offset: int, data) -> int:
        if self._closed:
            raise errors.IOFailure("data path is closed")
        if offset < 0:
            raise errors.InvalidArgument(f"write at offset {offset}: expected >= 0")
        length = len(data)
        while True:
            fb = self._buffer(ino)
            with fb.lock:
                if fb.dead:
                    continue
                if length == 0:
                    return fb.size
                policy = fb.policy
                need = self._need(policy, length)
                self._reserve(need, policy)
                fb.reserved += need
                view = memoryview(data).cast("B")
                stripe_size = policy.stripe_size
                pos = 0
                while pos < length:
                    used = len(fb.data)
                    take = min(stripe_size - used, length - pos)
                    fb.data += view[pos:pos + take]
                    last = fb.extents[-1] if fb.extents else None
                    if last is not None and last[0] + last[2] == offset + pos and last[1] + last[2] == used:
                        last[2] += take
                    else:
                        fb.extents.append([offset + pos, used, take])
                    pos += take
                    if len(fb.data) >= stripe_size:
                        self._submit(fb)
                fb.size = max(fb.size, offset + length)
                return fb.size

    def _submit(self, fb: FileBuffer, *, inline: bool = False) -> None:
        """Hand the buffered bytes of ``fb`` to the pipeline as one stripe (caller holds fb.lock).

        ``inline``: the caller waits for this stripe (a flush), so it encodes it itself instead
        of waking an encoder (one thread hand-off less on every COMMIT and stable WRITE); it
        places it with _dispatch_ready once it has let go of fb.lock."""
        payload = fb.data  # the buffer itself becomes the stripe: no copy
        policy = fb.policy
        own = min(fb.reserved, self._need(policy, len(payload)))
        fb.reserved -= own
        hot = self.policies.get(HOT_CLASS)
        if not fb.pinned and hot is not None and hot is not policy and len(payload) < self.small_write_bytes:
            # a few KiB cannot fill a stripe: keep them in the catalog (inline) or replicate them in
            # the hot class; tiering re-encodes both later
            if self._inline_room(len(payload)):
                policy = self.inline  # needs no drive space: ``own`` is released at dispatch
            else:
                extra = self._need(hot, len(payload)) - own
                try:
                    if extra > 0:
                        self._reserve(extra, hot)
                        own += extra
                    policy = hot
                except errors.NoSpace:
                    pass  # the erasure-coded stripe is already reserved
        fb.data = bytearray()
        extents, fb.extents = fb.extents, []
        if not self._inflight.acquire(blocking=False):
            started = time.perf_counter()
            self._inflight.acquire()
            self.stats["backpressure_s"] += time.perf_counter() - started
        with self._seq_lock:
            self._seq += 1
            stripe = PendingStripe(self._seq, fb, payload, extents, own, policy)
            with fb.ilock:
                fb.inflight.append(stripe)
            if inline:
                stripe.encoding = done = Future()
                try:
                    self._encode(stripe)
                    done.set_result(None)
                except BaseException as exc:  # noqa: BLE001 - the dispatcher records it on the stripe
                    done.set_exception(exc)
            else:
                stripe.encoding = self._encoder.submit(self._encode, stripe)
            with self._dispatch_cv:
                self._dispatch_q.append(stripe)
                if not inline:  # an inline stripe is placed by its flush (_dispatch_ready): no wake-up
                    self._dispatch_cv.notify()

    def _inline_room(self, length: int) -> bool:
        """Whether a flush of ``length`` bytes may be kept inline; if so it is counted."""
        if self.inline is None or length > self.inline.fragment_size:
            return False
        with self._inline_lock:
            if self._inline_used + length > self.inline_budget_bytes:
                now = time.monotonic()
                if now - self._inline_counted_at < INLINE_RECOUNT_S:
                    return False
                self._inline_counted_at = now
                self._inline_used = self._count_inline()  # a read: it waits for no writer
                if self._inline_used + length > self.inline_budget_bytes:
                    return False
            self._inline_used += length
            return True

    def _count_inline(self) -> int:
        return int(self.catalog.read(lambda conn: sql_one(conn, "SELECT COALESCE(SUM(length), 0) FROM inline_data",
                                                          ()))[0])

    def _load_inline(self, stripe_id: int):
        """(data, checksum) of an inline stripe, or None when it no longer exists."""
        return self.catalog.read(lambda conn: sql_one(conn, "SELECT data, checksum FROM inline_data "
                                                            "WHERE stripe_id = ?", (stripe_id,)))

    def _encode(self, stripe: PendingStripe) -> None:
        start, cpu = time.perf_counter(), time.thread_time()
        stripe.encoded = stripe.policy.encode_stripe(stripe.payload)
        stripe.fragments = stripe.encoded.fragments
        self.stats["encode_s"] += time.perf_counter() - start
        self.stats["encode_cpu_s"] += time.thread_time() - cpu
        stripe.crcs = [crc32c.crc32c(f) for f in stripe.fragments]

    def _dispatcher(self) -> None:
        """Place stripes in submission order, so every drive receives fragments in that order."""
        while True:
            with self._dispatch_cv:
                while not self._dispatch_q and not self._stopping:
                    self._dispatch_cv.wait()
                if not self._dispatch_q:
                    return
                head = self._dispatch_q[0]
            futures_wait((head.encoding,))  # a failed encoding is recorded on the stripe by _dispatch
            self._dispatch_ready(blocking=True)

    def _dispatch_ready(self, *, blocking: bool) -> None:
        """Place every stripe at the head of the queue whose encoding is done. The dispatch lock
        keeps placement in submission order whoever runs it (the dispatcher, or a flushing caller,
        which wakes no dispatcher for its own stripe)."""
        _drain(self._dispatch_lock, self._dispatch_cv, self._dispatch_q, lambda s: s.encoding.done(),
               lambda stripes: self._dispatch(stripes[0]), blocking=blocking)

    def _dispatch(self, stripe: PendingStripe) -> None:
        try:
            stripe.encoding.result()
            if stripe.policy is not self.inline:  # inline bytes go to the catalog, not to drives
                self._place(stripe)
        except BaseException as exc:  # noqa: BLE001 - the stripe carries it to flush()
            stripe.fail(exc if isinstance(exc, errors.FsError) else errors.IOFailure(f"encode failed: {exc}"))
        finally:
            self._unreserve(stripe.reserved)
            stripe.reserved = 0
        with self._commit_cv:
            self._commit_q.append(stripe)
        if stripe.error is not None or not stripe.placement:
            self._written(stripe)
            return
        stripe.remaining = len(stripe.placement)
        for drive, zone, offset, _length, idx in stripe.placement:
            drive.queue.put(("append", zone.idx, offset, stripe.fragments[idx], stripe))

    def _place(self, stripe: PendingStripe) -> None:
        policy = stripe.policy
        length = len(stripe.fragments[0])
        width = policy.width
        with self._space_lock:
            writable = [d for d in self._drives.values() if d.writable()]
            self._rr += 1
            n = max(len(writable), 1)
            # most free first; the rotation spreads ties so equal drives share the work
            writable.sort(key=lambda d: (-(len(d.empty) + sum(1 for _ in d.open)), (d.id + self._rr) % n))
            for attempt in range(2):
                chosen = []
                for drive in writable:
                    zone = self._zone_for(drive, policy.name, length)
                    if zone is not None:
                        chosen.append((drive, zone))
                        if len(chosen) == width:
                            break
                # _reserve counted zones holding only garbage as room: reset them before giving up
                if len(chosen) == width or attempt or not self._reclaim_zones():
                    break
            if len(chosen) < policy.write_quorum:
                raise errors.NoSpace(f"stripe of {len(stripe.payload)} bytes needs {width} drives (at least "
                                     f"{policy.write_quorum}) with {length} free bytes in a {policy.name} band; "
                                     f"{len(chosen)} have room")
            # fewer drives than the stripe is wide (a drive failed): write the data fragments and as
            # much parity as there are drives; the stripe is born degraded and rebuild completes it
            indexes = range(len(chosen))  # data fragments come first, then parity
            if len(chosen) < width:
                self.stats["degraded_stripes_written"] += 1
            now = time.time_ns()
            for (drive, zone), idx in zip(chosen, indexes):
                stripe.placement.append((drive, zone, zone.wp, length, idx))
                # a block device pads appends to whole blocks; the pad is garbage below the pointer
                zone.wp += -(-length // drive.granularity) * drive.granularity
                zone.inflight += 1
                if zone.opened_ns is None:
                    zone.opened_ns = now

    def _zone_for(self, drive: DriveState, band_class: str, length: int) -> ZoneMem | None:
        zone = drive.open.get(band_class)
        length = -(-length // drive.granularity) * drive.granularity
        if zone is not None and zone.wp + length <= drive.zone_size:
            return zone
        if zone is not None:
            # the tail cannot take this fragment: the band is done
            zone.state, zone.dirty = "full", True
            del drive.open[band_class]
            # through the writer's queue: fragments queued for this zone must land first
            drive.queue.put(("finish", zone.idx))
        if len(drive.empty) <= self.reserve_zones:
            return None
        idx = min(drive.empty)
        drive.empty.discard(idx)
        zone = drive.zones[idx]
        zone.state, zone.band_class, zone.dirty, zone.opened_ns = "open", band_class, True, time.time_ns()
        drive.open[band_class] = zone
        return zone

    def _drive_writer(self, drive: DriveState) -> None:
        """The one writer of a drive: appends fragments in arrival order.

        fsync runs in the drive's syncer thread (group commit): while one fsync
        is under way the writer keeps appending, and the next fsync covers
        everything appended meanwhile. When nothing else waits, the writer
        fsyncs itself (a lone flush pays no hand-off). A fragment counts as
        written only once it is durable."""
        synced: queue.SimpleQueue = queue.SimpleQueue()
        syncer = threading.Thread(target=self._drive_syncer, args=(drive, synced), daemon=True,
                                  name=f"shingle-sync-{drive.id}")
        syncer.start()
        try:
            while True:
                item = drive.queue.get()
                op = item[0] if item is not None else None
                if op is None:
                    return
                if op == "append":
                    _, idx, offset, data, stripe = item
                    try:
                        started = time.perf_counter()
                        if drive.queue.empty() and synced.empty():
                            # nothing else to append meanwhile: no hand-off to the syncer (it would only
                            # add latency), and the write is durable in the same call
                            drive.backend.append(idx, offset, data, durable=True)
                            self.stats["fsync_s"] += time.perf_counter() - started
                            self.stats["fsyncs"] += 1
                            self._fragment_done(stripe)
                            continue
                        drive.backend.append(idx, offset, data)
                        self.stats["append_s"] += time.perf_counter() - started
                        if drive.queue.empty() and synced.empty():
                            self._sync_batch(drive, [(idx, stripe)])
                        else:
                            drive.backend.start_writeback(idx, offset, len(data))
                            synced.put((idx, stripe))
                    except BaseException as exc:  # noqa: BLE001
                        drive.write_failed = True
                        stripe.fail(errors.IOFailure(f"drive {drive.id} zone {idx}: write failed: {exc}"))
                        self._fragment_done(stripe)
                elif op == "finish":
                    try:
                        drive.backend.finish_zone(item[1])
                    except BaseException:  # noqa: BLE001 - a later append to it fails loudly anyway
                        pass
                elif op == "repair":
                    _, idx, offset, data, latch = item
                    try:
                        drive.backend.append(idx, offset, data)
                        drive.backend.sync(idx)
                        latch.arrive()
                    except BaseException as exc:  # noqa: BLE001
                        latch.arrive(exc)
                elif op == "reset":
                    _, idx, latch = item
                    try:
                        drive.backend.reset(idx)
                        latch.arrive()
                    except BaseException as exc:  # noqa: BLE001
                        latch.arrive(exc)
        finally:
            synced.put(None)
            syncer.join()

    def _drive_syncer(self, drive: DriveState, synced: queue.SimpleQueue) -> None:
        """fsync what the writer appended, as many fragments per fsync as arrived meanwhile."""
        stop = False
        while not stop:
            batch = [synced.get()]
            while True:
                try:
                    batch.append(synced.get_nowait())
                except queue.Empty:
                    break
            if batch[-1] is None:
                stop = True
                batch.pop()
            if batch:
                self._sync_batch(drive, batch)

    def _sync_batch(self, drive: DriveState, batch: list) -> None:
        """fsync the zones of ``batch`` [(zone idx, stripe)]; then each fragment counts as written."""
        started = time.perf_counter()
        error = None
        for idx in sorted({idx for idx, _stripe in batch}):
            try:
                drive.backend.sync(idx)
            except BaseException as exc:  # noqa: BLE001
                drive.write_failed = True
                error = errors.IOFailure(f"drive {drive.id} zone {idx}: fsync failed: {exc}")
        self.stats["fsync_s"] += time.perf_counter() - started
        self.stats["fsyncs"] += 1
        for _idx, stripe in batch:
            if error is not None:
                stripe.fail(error)
            self._fragment_done(stripe)

    def _fragment_done(self, stripe: PendingStripe) -> None:
        with stripe.lock:
            stripe.remaining -= 1
            last = stripe.remaining == 0
        if last:
            self._written(stripe)

    def _written(self, stripe: PendingStripe) -> None:
        stripe.fragments = []
        if stripe.encoded is not None:
            stripe.encoded.release()
            stripe.encoded = None
        with self._commit_cv:
            stripe.written.set()
            if not stripe.flushing:
                self._commit_cv.notify()

    def _committer(self) -> None:
        """Record written (durable) stripes in one catalog transaction per batch."""
        while True:
            with self._commit_cv:
                while not (self._commit_q and self._commit_q[0].written.is_set()):
                    if self._stopping and not self._commit_q and not self._dispatch_q:
                        return
                    self._commit_cv.wait(0.5)
            self._commit_ready(blocking=True)

    def _commit_ready(self, *, blocking: bool) -> None:
        """Commit the written stripes at the head of the queue, in order, batch after batch (a flush
        whose stripe is written does not wake the committer: whoever holds the lock commits it)."""
        _drain(self._commit_lock, self._commit_cv, self._commit_q, lambda s: s.written.is_set(), self._commit_batch,
               blocking=blocking, batch=COMMIT_BATCH)

    def _commit_batch(self, batch: list[PendingStripe]) -> None:
        start = time.perf_counter()
        good = [s for s in batch if s.error is None]
        with self._space_lock:
            zone_rows = {}
            for zone in self._zones.values():
                if zone.dirty:
                    zone_rows[zone.id] = zone
                    zone.dirty = False
            for s in good:
                for _d, zone, _o, _l, _i in s.placement:
                    zone_rows[zone.id] = zone
            zone_state = {z.id: (z.state, z.band_class, z.opened_ns) for z in zone_rows.values()}
        dead: list[int] = []
        found = [None] * len(self._commit_listeners)
        self.stats["batches"] += 1
        try:
            if good or zone_state:
                # tracked: _invalidate and the commit listeners account for it
                dead, found = self.catalog.run(lambda conn: self._record(conn, good, zone_state), durable=True,
                                               tracked=True)
        except BaseException as exc:  # noqa: BLE001
            failure = errors.IOFailure(f"catalog commit of {len(good)} stripes failed: {exc}")
            for s in good:
                s.fail(failure)
            with self._space_lock:
                for zone_id in zone_state:
                    self._zones[zone_id].dirty = True
        self.stats["commit_s"] += time.perf_counter() - start
        self.reader.forget(set(dead))
        inos = set()
        with self._space_lock:
            for s in batch:
                for _d, zone, offset, length, _i in s.placement:
                    zone.inflight -= 1
                    if s.error is None:
                        zone.committed_wp = max(zone.committed_wp, offset + length)
        for s in batch:
            inos.add(s.fb.ino)
        self._invalidate(inos)
        for (listener, _reader), value in zip(self._commit_listeners, found):
            listener(inos, value)
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
            self._inflight.release()
        self.stats["stripes_committed"] += len(good)
        self.stats["client_bytes_written"] += sum(length for s in good for _fo, _so, length in s.extents)
        self.stats["media_bytes_written"] += sum(p[3] for s in good for p in s.placement)
        self.stats["inline_bytes_written"] += sum(length for s in good if s.policy is self.inline
                                                  for _fo, _so, length in s.extents)

    def add_commit_listener(self, listener, reader=None) -> None:
        """Call ``listener(inos, found)`` after each commit batch that changed the size and times of
        ``inos`` (the namespace updates its attribute cache). ``reader(conn, inos)``, if given, runs
        at the end of the batch's transaction; ``found`` is what it returned (None if the commit
        failed): the namespace reads the new attributes there instead of in a transaction of its own."""
        self._commit_listeners.append((listener, reader))

    def counters(self) -> dict[str, float]:
        """Cumulative counters for the web UI's charts (names: engine/metrics.py)."""
        return {"client_bytes_written": self.stats["client_bytes_written"],
                "media_bytes_written": self.stats["media_bytes_written"]}

    def _record(self, conn, stripes: list[PendingStripe], zone_state: dict) -> list[int]:
        """The one transaction of a flush batch: stripes, fragments, extents, zones, inodes.

        Plain SQL (engine.catalog.database.sql): this transaction is on the path of every
        COMMIT and stable WRITE, where SQLAlchemy's statement building cost more than SQLite."""
        now = time.time_ns()
        ids = []
        inline = []
        for s in stripes:
            p = s.policy
            fragment_length = s.placement[0][3] if s.placement else len(s.payload)
            ids.append(sql_one(conn, "INSERT INTO stripes (band_class, layout, k, m, backend, data_length, "
                                     "fragment_length, compression, live_bytes, created_ns) "
                                     "VALUES (?, ?, ?, ?, ?, ?, ?, NULL, 0, ?) RETURNING id",
                               (p.name, p.layout, p.k, p.m, p.backend, len(s.payload), fragment_length, now))[0])
            if p.layout == INLINE:
                inline.append((ids[-1], len(s.payload), s.crcs[0], bytes(s.payload)))
        sql_many(conn, "INSERT INTO inline_data (stripe_id, length, checksum, data) VALUES (?, ?, ?, ?)", inline)
        self.reader.forget(set(ids))  # an id SQLite hands out again must not hit an old cache entry
        fragments = []
        ends: dict[int, int] = {}
        for sid, s in zip(ids, stripes):
            for drive, zone, offset, length, i in s.placement:
                fragments.append((sid, i, drive.id, zone.id, offset, length, s.crcs[i]))
                ends[zone.id] = max(ends.get(zone.id, 0), offset + length)
        sql_many(conn, "INSERT INTO fragments (stripe_id, idx, drive_id, zone_id, zone_offset, length, checksum) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?)", fragments)
        # zones: the write pointer moves over the new fragments; everything below it that is not
        # live is garbage (gaps left by failed flushes included)
        current = {}
        for part in chunks(list(zone_state)):
            current.update(sql_all(conn, f"SELECT id, write_pointer FROM zones WHERE id IN {in_list(part)}",
                                   tuple(part)))
        updates = []
        for zone_id, (state, band_class, opened_ns) in zone_state.items():
            wp = current.get(zone_id, 0)
            new_wp = max(wp, ends.get(zone_id, 0))
            updates.append((state, band_class, opened_ns, new_wp, new_wp - wp,
                            now if zone_id in ends else None, zone_id))
        sql_many(conn, "UPDATE zones SET state = ?, band_class = ?, opened_ns = ?, write_pointer = ?, "
                       "garbage_bytes = garbage_bytes + ?, last_write_ns = COALESCE(?, last_write_ns) "
                       "WHERE id = ?", updates)
        # extents, per file in write order; the new stripes' bytes turn live as extents point at them
        deltas: dict[int, int] = {sid: 0 for sid in ids}
        by_ino: dict[int, list] = defaultdict(list)
        for sid, s in zip(ids, stripes):
            by_ino[s.fb.ino].append((sid, s))
        for ino, items in by_ino.items():
            new = [(fo, length, sid, so) for sid, s in items for fo, so, length in s.extents]
            lo = min(fo for fo, *_ in new)
            hi = max(fo + length for fo, length, *_ in new)
            cursor = sql(conn, "UPDATE inodes SET size = CASE WHEN size < ? THEN ? ELSE size END, mtime_ns = ?, "
                               "ctime_ns = ?, change = change + 1 WHERE ino = ?", (hi, hi, now, now, ino))
            alive = cursor.rowcount
            cursor.close()
            if not alive:
                continue  # the file was removed meanwhile: its new stripes stay dead
            emap = ExtentMap(load_extents(conn, ino, lo, hi, self.max_extent))
            for fo, length, sid, so in new:
                emap.put(fo, length, sid, so)
            write_map(conn, ino, emap)
            for sid, delta in emap.delta.items():
                deltas[sid] = deltas.get(sid, 0) + delta
        known = {sid: (len(s.payload), 0, [(zone.id, length) for _d, zone, _o, length, _i in s.placement])
                 for sid, s in zip(ids, stripes)}
        dead = adjust_live(conn, deltas, known)
        changed = set(by_ino)
        found = [reader(conn, changed) if reader is not None else None for _listener, reader in self._commit_listeners]
        return dead, found

    # -- repair (invariant 5) -------------------------------------------------------------------
    def _queue_repair(self, info: StripeInfo, indexes: set[int], good: dict) -> None:
        if self._closed:
            return
        good = {i: bytes(f) for i, f in good.items()}
        for idx in sorted(indexes):
            self._repairs.append(self._repairer.submit(self._repair, info, idx, good))

    def wait_repairs(self) -> list:
        """Wait for queued fragment repairs; returns their results (True, or the exception)."""
        results = []
        while self._repairs:
            fut = self._repairs.pop(0)
            try:
                results.append(fut.result())
            except Exception as exc:  # noqa: BLE001 - reported to the caller
                results.append(exc)
        return results

    def _repair(self, info: StripeInfo, idx: int, good: dict) -> bool:
        """Write a rebuilt copy of a fragment that failed its checksum, appended to an open band of the
        same drive, and point the catalog at it; the bad bytes become garbage of their zone."""
        if info.layout == "replica":
            fragment = next(iter(good.values()))
        else:
            from engine.erasure import decoder_for
            fragment = decoder_for(info.k, info.m, info.backend).driver.reconstruct(list(good.values()), [idx])[0]
        drive_id, old_zone_id, old_offset, length, old_checksum = info.fragments[idx]
        drive = self._drives.get(drive_id)
        if drive is None or not drive.writable() or len(fragment) != length:
            return False
        band_class = info.band_class if info.band_class in self.policies else self.default_class
        with self._space_lock:
            zone = self._zone_for(drive, band_class, length)
            if zone is None:
                raise errors.NoSpace(f"no room on drive {drive_id} to repair stripe {info.id} fragment {idx}")
            offset = zone.wp
            zone.wp += -(-length // drive.granularity) * drive.granularity
            zone.inflight += 1
            state = (zone.state, zone.band_class, zone.opened_ns)
        latch = _Latch(1)
        drive.queue.put(("repair", zone.idx, offset, fragment, latch))
        latch.done.wait()
        checksum = crc32c.crc32c(fragment)

        def work(conn):
            row = conn.execute(select(STRIPES.c.data_length, STRIPES.c.live_bytes)
                               .where(STRIPES.c.id == info.id)).first()
            # repoint only the copy we judged bad: if scrub or cleaning moved it meanwhile, ours is garbage
            moved = row is not None and conn.execute(FRAGMENTS.update().where(
                FRAGMENTS.c.stripe_id == info.id, FRAGMENTS.c.idx == idx, FRAGMENTS.c.zone_id == old_zone_id,
                FRAGMENTS.c.zone_offset == old_offset, FRAGMENTS.c.checksum == old_checksum)
                .values(zone_id=zone.id, zone_offset=offset, checksum=checksum)).rowcount == 1
            live = length * row.live_bytes // row.data_length if moved and row.data_length else 0
            if live:
                conn.execute(ZONES.update().where(ZONES.c.id == old_zone_id).values(
                    live_bytes=ZONES.c.live_bytes - live, garbage_bytes=ZONES.c.garbage_bytes + live))
            wp = conn.execute(select(ZONES.c.write_pointer).where(ZONES.c.id == zone.id)).scalar()
            new_wp = max(wp, offset + length)
            conn.execute(ZONES.update().where(ZONES.c.id == zone.id).values(
                state=state[0], band_class=state[1], opened_ns=state[2], write_pointer=new_wp,
                live_bytes=ZONES.c.live_bytes + live,
                garbage_bytes=ZONES.c.garbage_bytes + (new_wp - wp) - live, last_write_ns=time.time_ns()))
            return moved
        try:
            if latch.errors:
                raise errors.IOFailure(f"repair write failed: {latch.errors[0]}")
            done = self.catalog.run(work, durable=True)
        finally:
            with self._space_lock:
                zone.inflight -= 1
                if not latch.errors:
                    zone.committed_wp = max(zone.committed_wp, offset + length)
        self.invalidate_stripes([info.id])
        return done

    # -- flush -------------------------------------------------------------------------------
    def flush(self, ino: int) -> None:
        fb = self._files.get(ino)
        if fb is None:
            return
        with fb.lock:
            submitted = bool(fb.data)
            if submitted:
                self._submit(fb, inline=True)
            with fb.ilock:
                waiting = list(fb.inflight)
                for stripe in waiting:
                    stripe.flushing = True  # we commit it ourselves below: no committer wake-up
        if submitted:
            # outside fb.lock: placing may reset zones in a catalog transaction, and a namespace
            # transaction freeing this file waits for fb.lock (release)
            self._dispatch_ready(blocking=False)
        for stripe in waiting:
            stripe.written.wait()
            if not stripe.committed.is_set():
                self._commit_ready(blocking=False)  # rather than wake the committer and wait for it
            stripe.committed.wait()
        with fb.lock:
            with fb.ilock:
                error, fb.error = fb.error, None
                if fb.idle():
                    self._unreserve(fb.reserved)
                    fb.reserved = 0
                    epoch = self.catalog.epoch()  # after our commit (a commit racing it is taken as seen)
                    with self._files_lock:
                        if self._files.get(ino) is fb:
                            del self._files[ino]
                            fb.dead = True
                            if error is None:
                                self._settle(ino, fb.size, fb.policy, fb.pinned, epoch)
        if error is not None:
            raise error

    def flush_all(self) -> None:
        first = None
        for ino in list(self._files):
            try:
                self.flush(ino)
            except errors.FsError as exc:
                first = first or exc
        if first is not None:
            raise first

    def pending_size(self, ino: int) -> int | None:
        fb = self._files.get(ino)
        if fb is None or fb.dead or fb.idle():
            return None
        return fb.size

    # -- truncate and release (inside the namespace's transaction) -----------------------------
    def _after_commit(self, conn, inos) -> None:
        self.catalog.after_commit(conn, lambda: self._invalidate(inos))

    def created(self, conn, ino: int) -> None:
        """A new file, inside its create transaction: once that commits, its size and class are known
        (``_settled``), so the first write to it skips the catalog read."""
        size, band_class = sql_one(conn, "SELECT size, band_class FROM inodes WHERE ino = ?", (ino,))

        def settle():
            epoch = self.catalog.epoch()
            with self._files_lock:
                if ino not in self._files:
                    self._settle(ino, size, self._policy_for(band_class), band_class in self.policies, epoch)
        self.catalog.after_commit(conn, settle)

    def _settle(self, ino: int, size: int, policy: Policy, pinned: bool, epoch: int | None) -> None:
        """Remember an idle file's size and class as of ``epoch`` (caller holds _files_lock)."""
        if epoch is None:
            return  # PostgreSQL: no cheap epoch, _buffer always reads
        self._settled[ino] = (size, policy, pinned, epoch)
        while len(self._settled) > EXTENT_CACHE_FILES:
            self._settled.popitem(last=False)

    def truncate(self, conn, ino: int, old_size: int, new_size: int) -> None:
        fb = self._files.get(ino)
        if fb is not None:
            with fb.lock:
                fb.size = new_size
        if new_size < old_size:
            emap = ExtentMap(load_extents(conn, ino, new_size, None, self.max_extent))
            emap.punch(new_size, max(old_size, new_size + 1) + self.max_extent)
            write_map(conn, ino, emap)
            dead = adjust_live(conn, dict(emap.delta))
            self.reader.forget(set(dead))
        self._invalidate({ino})
        self._after_commit(conn, {ino})

    def release(self, conn, ino: int, limit: int | None = None) -> bool:
        """The inode is being freed: its extents become garbage. With ``limit``, only the last
        ``limit`` extents go in this transaction (the caller frees the rest in later ones);
        True when none is left."""
        with self._files_lock:
            fb = self._files.pop(ino, None)
            self._settled.pop(ino, None)
        if fb is not None:
            with fb.lock:
                fb.dead = True
                fb.data = bytearray()
                fb.extents = []
                self._unreserve(fb.reserved)
                fb.reserved = 0
        if limit is None:
            rows = load_extents(conn, ino)
        else:
            rows = sql_all(conn, "SELECT file_offset, length, stripe_id, stripe_offset, id FROM extents "
                                 "WHERE ino = ? ORDER BY file_offset DESC LIMIT ?", (ino, limit + 1))
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
        self._invalidate({ino})
        self._after_commit(conn, {ino})
        return done

    # -- reads -------------------------------------------------------------------------------
    def _invalidate(self, inos) -> None:
        with self._maps_lock:
            for ino in inos:
                self._map_version[ino] += 1
                self._maps.pop(ino, None)
        with self._files_lock:
            for ino in inos:
                self._settled.pop(ino, None)

    def _extent_map(self, ino: int):
        with self._maps_lock:
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
            # plain SQL: a 2 GiB file names 256 stripes and 2,560 fragments, and SQLAlchemy rows
            # cost about 10 us each (a 64 MiB file's map took 10 ms to load)
            rows = sql_all(conn, "SELECT file_offset, length, stripe_id, stripe_offset FROM extents "
                                 "WHERE ino = ? ORDER BY file_offset", (ino,))
            wanted = sorted({r[2] for r in rows if r[2] not in known})
            infos = {}
            for part in chunks(wanted):
                marks = in_list(part)
                for row in sql_all(conn, f"SELECT {_STRIPE_INFO_SQL} FROM stripes WHERE id IN {marks}", tuple(part)):
                    infos[row[0]] = StripeInfo(*row)
                for sid, idx, *where in sql_all(conn, "SELECT stripe_id, idx, drive_id, zone_id, zone_offset, length, "
                                                      f"checksum FROM fragments WHERE stripe_id IN {marks}", tuple(part)):
                    infos[sid].fragments[idx] = tuple(where)
            return rows, infos
        rows, infos = self.catalog.read(work)
        items = [tuple(r) for r in rows]
        entry = ([i[0] for i in items], items, {})
        with self._maps_lock:
            fresh = self._generation == generation
            if fresh:
                self._stripes.update(infos)
            # else fragments moved while we loaded: what we read serves this read only
            if fresh and self._map_version[ino] == version:
                self._maps[ino] = entry
                while len(self._maps) > EXTENT_CACHE_FILES:
                    self._maps.popitem(last=False)
        return entry[0], entry[1], infos

    def invalidate_stripes(self, stripe_ids) -> None:
        """Forget cached descriptions and data of stripes (for rebuild/cleaning that move fragments)."""
        ids = set(stripe_ids)
        with self._maps_lock:
            self._generation += 1
            for sid in ids:
                self._stripes.pop(sid, None)
            self._maps.clear()
        self.reader.forget(ids)

    def read(self, ino: int, offset: int, length: int, size: int, *, _retry: bool = True) -> bytes:
        end = min(offset + length, size)
        if end <= offset:
            return b""
        # pending writes are taken first: a stripe that commits meanwhile is then also in the map
        overlay = []
        fb = self._files.get(ino)
        if fb is not None and not fb.dead:
            may_block("pending writes")  # fb.lock is held across a flush
            with fb.lock:
                with fb.ilock:
                    for s in fb.inflight:
                        overlay.append((s.payload, s.extents))
                if fb.data:
                    overlay.append((bytes(fb.data), [list(e) for e in fb.extents]))
        out = bytearray(end - offset)
        view = memoryview(out)
        starts, items, loaded = self._extent_map(ino)
        i = max(bisect.bisect_right(starts, offset) - 1, 0)
        stripe_ends = []
        while i < len(items) and items[i][0] < end:
            fo, elen, sid, so = items[i]
            a, b = max(fo, offset), min(fo + elen, end)
            if a < b:
                info = loaded.get(sid) or self._stripes.get(sid)
                if info is None:
                    self._invalidate({ino})
                    return self.read(ino, offset, length, size)
                try:
                    self.reader.read_range(info, so + (a - fo), b - a, view[a - offset:b - offset])
                except errors.IOFailure:
                    if not _retry:
                        raise
                    # a stale map: the stripe died (overwrite, tiering) and its zones were reset
                    self.invalidate_stripes({item[2] for item in items})
                    return self.read(ino, offset, length, size, _retry=False)
                stripe_ends.append((i, info))
            i += 1
        for payload, extents in overlay:
            if not payload:
                continue
            for fo, so, elen in extents:
                a, b = max(fo, offset), min(fo + elen, end)
                if a < b:
                    view[a - offset:b - offset] = payload[so + (a - fo):so + (b - fo)]
        self._read_ahead(ino, offset, end, items, stripe_ends)
        return out  # a bytearray the caller owns: the NFS reply sends it without another 1 MiB copy

    def _read_ahead(self, ino, offset, end, items, touched) -> None:
        sequential = self._last_read_end.get(ino) == offset
        self._last_read_end[ino] = end
        if len(self._last_read_end) > EXTENT_CACHE_FILES:
            self._last_read_end.pop(next(iter(self._last_read_end)))
        if not sequential or not touched:
            return
        last_index = touched[-1][0]
        seen = set()
        for fo, elen, sid, so in items[last_index:last_index + 1 + READ_AHEAD_STRIPES * 8]:
            if sid in seen:
                continue
            seen.add(sid)
            info = self._stripes.get(sid)
            if info is not None:
                self.reader.prefetch(info)
            if len(seen) > READ_AHEAD_STRIPES:
                break

    # -- shutdown ----------------------------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        try:
            self.flush_all()
            self.wait_repairs()
        finally:
            self._closed = True
            self._stopping = True
            with self._dispatch_cv:
                self._dispatch_cv.notify_all()
            for thread in self._threads:
                if thread.name == "shingle-dispatch":
                    thread.join()
            with self._commit_cv:
                self._commit_cv.notify_all()
            for thread in self._threads:
                if thread.name == "shingle-commit":
                    thread.join()
            for drive in self._drives.values():
                drive.queue.put(None)
            for drive in self._drives.values():
                if drive.thread is not None:
                    drive.thread.join()
                if drive.backend is not None:
                    drive.backend.close()
            self._encoder.shutdown(wait=True)
            self.reader.close()
            self._repairer.shutdown(wait=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
