"""Stripes on their way: buffered -> encoded -> placed -> written -> fsync'ed -> committed.

``FileBuffer`` holds a file's bytes until they fill a stripe or a flush comes; ``Dispatcher``
turns them into a ``PendingStripe``, has it encoded (an encoder thread, or the flushing thread
itself), places it (``Space.place``) in submission order and queues its fragments to the drive
writers; ``Committer`` (commit.py) records it once every fragment is durable."""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait

import crc32c

from engine.base import errors
from engine.base.ordered_lock import condition, lock
from engine.catalog.database import sql_one
from engine.coding.erasure import HOT_CLASS, Policy
from engine.datapath.writers import DriveWriters, WriteTicket

INLINE_RECOUNT_S = 5.0  # over budget: count what tiering has folded meanwhile at most this often


def _crc(fragment) -> int:
    """crc32c of a fragment: a buffer, or the (header, payload) of the slice encoder."""
    if isinstance(fragment, tuple):
        return crc32c.crc32c(fragment[1], crc32c.crc32c(fragment[0]))
    return crc32c.crc32c(fragment)


class PendingStripe(WriteTicket):
    """A stripe in the pipeline; as a WriteTicket it counts its fragments' appends down."""

    __slots__ = (
        "seq",
        "fb",
        "policy",
        "payload",
        "extents",
        "reserved",
        "fragments",
        "crcs",
        "placement",
        "committed",
        "encoding",
        "encoded",
        "flushing",
        "commits",
        "written_ns",
        "lost",
        "dropped",
    )

    def __init__(self, seq, fb, payload, extents, reserved, policy, commits):
        super().__init__()
        self.seq = seq
        self.fb = fb
        self.policy: Policy = policy
        self.payload: bytes = payload
        self.extents = extents  # [file_offset, stripe_offset, length] in write order
        self.reserved = reserved
        self.fragments: list = []
        self.crcs: list[int] = []
        self.placement: list = []  # space.PlacedFragment, one per fragment written
        self.committed = threading.Event()
        self.encoding: Future | None = None
        self.encoded = None  # erasure.Encoded: its buffers are freed once every fragment is written
        self.flushing = (
            False  # a flush waits for it and commits it itself: the committer need not wake
        )
        self.commits = commits  # the Committer that records it
        # the time of the last write it holds (cut under fb.lock): the mtime its commit records
        self.written_ns = fb.mtime_ns
        self.lost: dict[int, BaseException] = {}  # drive id -> why its fragment failed
        self.dropped: list = []  # placements given up (lost), which the commit does not record

    def fragment_failed(self, drive, exc: BaseException) -> None:
        """A fragment's append or fsync failed (a bad sector, a zone gone read-only or
        offline, a drive gone): decided once every fragment is done (``all_written``)."""
        self.lost.setdefault(drive.id, exc)

    def settle_lost(self) -> None:
        """With fragments lost, the stripe still commits when the others reach the band class's
        write quorum (as a stripe placed on fewer drives than its width: rebuild completes it;
        the drives that failed are degraded by then); else it fails with the first error."""
        if not self.lost or self.error is not None:
            return
        kept = [p for p in self.placement if p.drive.id not in self.lost]
        if len(kept) >= self.policy.write_quorum:
            self.dropped = [p for p in self.placement if p.drive.id in self.lost]
            self.placement = kept
        else:
            self.fail(next(iter(self.lost.values())))

    def all_written(self) -> None:
        self.settle_lost()
        self.fragments = []
        if self.encoded is not None:
            self.encoded.release()
            self.encoded = None
        self.commits.written(self)


class FileBuffer:
    """Per-file write buffer: the bytes of the stripe being filled, and the stripes in flight."""

    __slots__ = (
        "ino",
        "policy",
        "pinned",
        "size",
        "data",
        "extents",
        "reserved",
        "inflight",
        "lock",
        "ilock",
        "error",
        "dead",
        "change",
        "mtime_ns",
        "times_set_after",
    )

    def __init__(self, ino: int, policy: Policy, size: int, pinned: bool = False):
        self.ino = ino
        self.policy = policy
        self.pinned = pinned  # the inode names its band class: no small-write routing
        self.size = size  # file size counting buffered writes
        self.data = bytearray()
        self.extents: list[list[int]] = []
        self.reserved = 0
        self.inflight: list[PendingStripe] = []
        self.lock = lock("datapath.file")  # data/extents/size
        self.ilock = lock("datapath.file_inflight")  # inflight
        self.error: BaseException | None = None
        self.dead = False
        # what the file's change attribute and mtime are with its buffered writes: each write
        # moves them at once (another client sees a same-size rewrite before any COMMIT); the
        # commit of its stripes brings the catalog's change up to ``change`` (commit.py)
        self.change = 0
        self.mtime_ns = 0
        # a setattr/utimes set the mtime after the writes up to this mtime_ns: their commit keeps
        # the time set (cp -p, rsync -t, tar and smbd set times after writing, before COMMIT)
        self.times_set_after = 0

    def idle(self) -> bool:
        return not self.data and not self.inflight


def drain(lock, cv, items: deque, ready, run, *, blocking: bool, batch: int = 1) -> None:
    """Whoever holds ``lock`` runs ``run(taken)`` on the ready items at the head of ``items``, in
    order, up to ``batch`` at a time; ``cv`` guards the queue. A caller that finds the lock held
    leaves its items to the holder and wakes nobody, so the holder looks once more after
    letting go."""
    while True:
        if not lock.acquire(blocking=blocking):
            return
        try:
            while True:
                with cv:
                    taken: list = []
                    while items and ready(items[0]) and len(taken) < batch:
                        taken.append(items.popleft())
                if not taken:
                    break
                run(taken)
        finally:
            lock.release()
        with cv:
            if not (items and ready(items[0])):
                return
        blocking = False


class InlineBudget:
    """How many bytes inline stripes may hold in the catalog; counts up, recounted when full."""

    def __init__(self, catalog, budget_bytes: int, enabled: bool):
        self.catalog = catalog
        self.budget_bytes = budget_bytes
        self._lock = lock("datapath.inline_budget")
        self._used = self._count() if enabled else 0  # an estimate: tiering folds inline stripes
        self._counted_at = time.monotonic()

    def take(self, length: int) -> bool:
        """Whether ``length`` more bytes may be kept inline; if so they are counted."""
        with self._lock:
            if self._used + length > self.budget_bytes:
                now = time.monotonic()
                if now - self._counted_at < INLINE_RECOUNT_S:
                    return False
                self._counted_at = now
                self._used = self._count()  # a read: it waits for no writer
                if self._used + length > self.budget_bytes:
                    return False
            self._used += length
            return True

    def _count(self) -> int:
        return int(
            self.catalog.read(
                lambda conn: sql_one(conn, "SELECT COALESCE(SUM(length), 0) FROM inline_data", ())
            )[0]
        )


class Dispatcher:
    """Encodes submitted stripes and places them in submission order (the dispatch lock keeps
    that order whoever places: the dispatcher thread, or a flushing caller)."""

    def __init__(
        self,
        space,
        commits,
        writers: DriveWriters,
        policies: dict[str, Policy],
        inline: Policy | None,
        inline_budget: InlineBudget,
        small_write_bytes: int,
        max_inflight_stripes: int,
        encoders: int,
        stats,
    ):
        self.space = space
        self.commits = commits
        self.writers = writers
        self.policies = policies
        self.inline = inline
        self.inline_budget = inline_budget
        self.small_write_bytes = small_write_bytes
        self.stats = stats
        self.inflight = threading.BoundedSemaphore(
            max_inflight_stripes
        )  # stripes submitted, not committed
        self.queue: deque = deque()
        self.cv = condition("datapath.dispatch_queue")
        self.lock = lock("datapath.dispatch")
        self._seq = 0
        self._seq_lock = lock("datapath.seq")
        self._stopping = False
        self._encoder = ThreadPoolExecutor(encoders, thread_name_prefix="shingle-encode")
        self.thread = threading.Thread(target=self._run, daemon=True, name="shingle-dispatch")

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stopping = True
        with self.cv:
            self.cv.notify_all()
        self.thread.join()

    def close_encoders(self) -> None:
        self._encoder.shutdown(wait=True)

    def idle(self) -> bool:
        return not self.queue

    def submit(self, fb: FileBuffer, *, inline: bool = False) -> None:
        """Hand the buffered bytes of ``fb`` to the pipeline as one stripe (caller holds fb.lock).

        ``inline``: the caller waits for this stripe (a flush), so it encodes it itself instead
        of waking an encoder (one thread hand-off less on every COMMIT and stable WRITE); it
        places it with ``dispatch_ready`` once it has let go of fb.lock."""
        payload = fb.data  # the buffer itself becomes the stripe: no copy
        policy = fb.policy
        space = self.space
        own = min(fb.reserved, space.need(policy, len(payload)))
        fb.reserved -= own
        hot = self.policies.get(HOT_CLASS)
        if (
            not fb.pinned
            and hot is not None
            and hot is not policy
            and len(payload) < self.small_write_bytes
        ):
            # a few KiB cannot fill a stripe: keep them in the catalog (inline) or replicate them in
            # the hot class; tiering re-encodes both later
            if self.inline is not None and self._inline_room(len(payload)):
                policy = self.inline  # needs no drive space: ``own`` is released at dispatch
            else:
                extra = space.need(hot, len(payload)) - own
                try:
                    if extra > 0:
                        space.reserve(extra, hot)
                        own += extra
                    policy = hot
                except (errors.NoSpace, errors.NoRedundancy):
                    pass  # the erasure-coded stripe is already reserved
        fb.data = bytearray()
        extents, fb.extents = fb.extents, []
        if not self.inflight.acquire(blocking=False):
            started = time.perf_counter()
            self.inflight.acquire()
            self.stats["backpressure_s"] += time.perf_counter() - started
        with self._seq_lock:
            self._seq += 1
            stripe = PendingStripe(self._seq, fb, payload, extents, own, policy, self.commits)
            with fb.ilock:
                fb.inflight.append(stripe)
            if inline:
                done: Future[None] = Future()
                stripe.encoding = done
                try:
                    self._encode(stripe)
                    done.set_result(None)
                except BaseException as exc:  # noqa: BLE001 - the dispatcher records it on the stripe
                    done.set_exception(exc)
            else:
                stripe.encoding = self._encoder.submit(self._encode, stripe)
            with self.cv:
                self.queue.append(stripe)
                if (
                    not inline
                ):  # an inline stripe is placed by its flush (dispatch_ready): no wake-up
                    self.cv.notify()

    def _inline_room(self, length: int) -> bool:
        if self.inline is None or length > self.inline.fragment_size:
            return False
        return self.inline_budget.take(length)

    def _encode(self, stripe: PendingStripe) -> None:
        start, cpu = time.perf_counter(), time.thread_time()
        stripe.encoded = stripe.policy.encode_stripe(stripe.payload)
        stripe.fragments = stripe.encoded.fragments
        self.stats["encode_s"] += time.perf_counter() - start
        self.stats["encode_cpu_s"] += time.thread_time() - cpu
        stripe.crcs = [_crc(f) for f in stripe.fragments]

    def _run(self) -> None:
        """Place stripes in submission order, so every drive receives fragments in that order."""
        while True:
            with self.cv:
                while not self.queue and not self._stopping:
                    self.cv.wait()
                if not self.queue:
                    return
                head = self.queue[0]
            futures_wait(
                (head.encoding,)
            )  # a failed encoding is recorded on the stripe by _dispatch
            self.dispatch_ready(blocking=True)

    def dispatch_ready(self, *, blocking: bool) -> None:
        """Place every stripe at the head of the queue whose encoding is done. The dispatch lock
        keeps placement in submission order whoever runs it (the dispatcher, or a flushing caller,
        which wakes no dispatcher for its own stripe)."""
        drain(
            self.lock,
            self.cv,
            self.queue,
            lambda s: s.encoding.done(),
            lambda stripes: self._dispatch(stripes[0]),
            blocking=blocking,
        )

    def _dispatch(self, stripe: PendingStripe) -> None:
        try:
            assert stripe.encoding is not None  # set when the stripe was cut
            stripe.encoding.result()
            if stripe.policy is not self.inline:  # inline bytes go to the catalog, not to drives
                self.space.place(stripe)
        except BaseException as exc:  # noqa: BLE001 - the stripe carries it to flush()
            # placing opens zones in catalog transactions: an outage there is no I/O failure
            stripe.fail(
                exc
                if isinstance(exc, errors.FsError)
                else self.commits.failure(exc, "encoding or placing the stripe failed")
            )
        finally:
            self.space.unreserve(stripe.reserved)
            stripe.reserved = 0
        self.commits.enqueue(stripe)
        if stripe.error is not None or not stripe.placement:
            stripe.all_written()
            return
        stripe.remaining = len(stripe.placement)
        append, fragments = self.writers.append, stripe.fragments
        for drive, zone, offset, _length, idx in stripe.placement:
            append(drive, zone.idx, offset, fragments[idx], stripe)
