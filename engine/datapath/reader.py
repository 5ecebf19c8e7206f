"""The read path: stripe descriptions, fragment fetches with checksums, decode, caches.

A healthy read fetches only the data fragments that cover the asked range
(the codes are systematic) and checks each fragment's crc32c. A missing
drive, a failed read or a bad checksum makes the stripe decode from any k
good fragments (parity included). Fetched payloads live in a byte-bounded
LRU cache keyed by (stripe, fragment), as futures so that concurrent readers
and read-ahead share one fetch.

A caller that must not block (the NFS event loop, inside engine.base.blocking's no_blocking) reads
what the drives hold in memory itself: preadv2(RWF_NOWAIT) from the page cache, checked
against the fragment's crc32c like any drive read; for a reader streaming a file, fragments
go straight into the caller's buffer (a READ's reply), and what a READ leaves of its last
fragment is cached for the reader's next READ (TailFragment); other readers' fragments go into
the cache. Anything else (not in
memory, a read-ahead on its way, a bad checksum, a missing drive, an inline stripe) raises
WouldBlock, and the blocking read in a worker reads, reports, decodes and repairs. Such reads
of a warm file start no read-ahead (``read_range`` says so): threads reading ahead would only
take turns at the GIL with the loop.

A compressed stripe (``compression`` set: tiering wrote it into a class with zstd) is read
whole: the data fragments that hold its frame are fetched as above (decoding around bad ones),
the frame is decompressed once, and the stripe's user bytes are cached under (stripe,
UNPACKED) in place of those fragments, so a sequential reader decompresses each stripe once,
not once per READ call, and read-ahead decompresses the next stripes in the background."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, cast

import crc32c

from engine.base import errors
from engine.base.blocking import WouldBlock, blocking_forbidden
from engine.base.ordered_lock import lock
from engine.coding import compression
from engine.coding.erasure import FRAGMENT_HEADER, INLINE, decoder_for
from engine.drives import DriveMissing
from engine.native import empty_bytearray


class FragmentFuture(Future):
    """A fragment's payload to come, and its size once known (for the cache's byte budget).
    ``in_memory``: read from the page cache without waiting (its file is warm)."""

    nbytes = 0
    in_memory = False


class ReadyFragment:
    """A cache entry whose payload was in hand when it was made (an in-memory read): what a
    FragmentFuture answers, without a Future's condition variable and its locks."""

    __slots__ = ("payload", "nbytes", "in_memory")

    def __init__(self, payload: memoryview):
        self.payload = payload
        self.nbytes = len(payload)
        self.in_memory = True

    def done(self) -> bool:
        return True

    def exception(self) -> None:
        return None

    def result(self) -> memoryview:
        return self.payload


class TailFragment:
    """A cache entry with the end of a fragment's payload, from ``start`` on: what is left of a
    fragment a streaming reader's READ took partly straight into its reply, and what that reader's
    next READ asks for first (nfs-rs reads each MiB as READs of 1,020 KiB and 4 KiB). It serves
    only a range inside it for such a reader; to any other it is a miss, which a whole fragment
    read then replaces."""

    __slots__ = ("start", "payload", "nbytes", "in_memory")

    def __init__(self, start: int, payload: memoryview):
        self.start = start
        self.payload = payload
        self.nbytes = len(payload)
        self.in_memory = True

    def done(self) -> bool:
        return True

    def exception(self) -> None:
        return None


def _whole(entry) -> bool:
    """A cache entry that stands for a whole fragment's payload (not a TailFragment)."""
    return entry is not None and not isinstance(entry, TailFragment)


class StripeInfo:
    COLUMNS = (
        "id",
        "band_class",
        "layout",
        "k",
        "m",
        "backend",
        "data_length",
        "fragment_length",
        "compression",
        "stored_length",
    )  # of stripes
    __slots__ = COLUMNS + ("fragments",)

    def __init__(
        self,
        id,  # noqa: A002
        band_class,
        layout,
        k,
        m,
        backend,
        data_length,
        fragment_length,
        compression=None,
        stored_length=None,
    ):
        self.id = id
        self.band_class = band_class
        self.layout = layout
        self.k = k
        self.m = m
        self.backend = backend
        self.data_length = data_length
        self.fragment_length = fragment_length
        self.compression = compression  # codec of the bytes the fragments encode, or None
        self.stored_length = stored_length  # their length when compressed
        # idx -> (drive_id, zone_id, zone_offset, length, checksum)
        self.fragments: dict[int, tuple] = {}

    @property
    def header(self) -> int:
        return FRAGMENT_HEADER if self.layout == "ec" else 0

    @property
    def payload(self) -> int:
        return self.fragment_length - self.header

    @property
    def encoded_length(self) -> int:
        """Bytes the fragments encode: the zstd frame of a compressed stripe, else the data."""
        return self.stored_length if self.compression is not None else self.data_length


UNPACKED = -1  # cache key (stripe, UNPACKED): a compressed stripe's user bytes


class ChecksumError(errors.IOFailure):
    pass


class NotInMemory(WouldBlock):
    """A caller that must not block needs a fragment that is neither cached nor in the page
    cache (or a read-ahead of it is still on its way)."""


class FragmentSource:
    """Reads of single fragments where they lie (a drive, the page cache, or the catalog for an
    inline stripe), each checked against its crc32c. The StripeReader above it caches, shares
    and decodes; this class knows nothing of either. Checksum failures are remembered in
    ``corrupt`` for the decode that follows to repair."""

    def __init__(self, drives: dict, zones: dict, load_inline, stats: dict, lock_) -> None:
        self.drives = drives  # drive id -> DriveState
        self.zones = zones  # zone id -> ZoneMem
        self.load_inline = load_inline  # stripe id -> (data, checksum) of an inline stripe, or None
        self.stats = stats  # the reader's counters
        self._lock = lock_  # the reader's lock: corrupt is read under it by the decode
        self.corrupt: set[tuple[int, int]] = set()  # (stripe, idx) that failed their checksum
        # on_io_error(drive, exc, "read"): a drive read failed (the drive watch listens)
        self.on_io_error = None

    def read(self, info: StripeInfo, idx: int, whole: bool):
        """Payload (memoryview) of fragment ``idx``, or the whole fragment bytes when ``whole``."""
        if info.layout == INLINE:
            return self.read_inline(info, whole)
        where = info.fragments.get(idx)
        if where is None:
            raise errors.IOFailure(
                f"stripe {info.id} fragment {idx} was never written (degraded stripe)"
            )
        drive_id, zone_id, offset, length, checksum = where
        drive = self.drives.get(drive_id)
        if drive is None or not drive.readable():
            raise DriveMissing(
                f"drive {drive_id} of stripe {info.id} fragment {idx} is unavailable"
            )
        zone = self.zones[zone_id]
        header = info.header
        try:
            if whole:
                buf = empty_bytearray(length)  # a short read is an error below
                got = drive.backend.read_into(zone.idx, offset, [buf])
                crc = crc32c.crc32c(buf)
            else:
                head = bytearray(header)
                buf = empty_bytearray(length - header)
                got = drive.backend.read_into(zone.idx, offset, [head, buf] if header else [buf])
                crc = crc32c.crc32c(buf, crc32c.crc32c(head)) if header else crc32c.crc32c(buf)
        except OSError as exc:
            if self.on_io_error is not None:
                self.on_io_error(drive, exc, "read")
            raise
        self.stats["fragment_reads"] += 1
        if got != length:
            raise errors.IOFailure(
                f"short read of stripe {info.id} fragment {idx}: {got} of {length} bytes"
            )
        if crc != checksum:
            self.stats["checksum_errors"] += 1
            drive.backend.checksum_errors += 1
            with self._lock:
                self.corrupt.add((info.id, idx))
            raise ChecksumError(
                f"checksum mismatch in stripe {info.id} fragment {idx} on drive {drive_id} "
                f"zone {zone.idx} at {offset}: {crc:#010x}, expected {checksum:#010x}"
            )
        return buf if whole else memoryview(buf)

    def read_inline(self, info: StripeInfo, whole: bool):
        """The bytes of an inline stripe, from the catalog (its only "fragment")."""
        row = self.load_inline(info.id) if self.load_inline is not None else None
        if row is None:  # folded into other stripes and deleted since the extent map was read
            raise errors.IOFailure(f"inline stripe {info.id} has no data in the catalog")
        data, checksum = row
        self.stats["inline_reads"] += 1
        if len(data) != info.data_length or crc32c.crc32c(data) != checksum:
            self.stats["checksum_errors"] += 1
            raise ChecksumError(
                f"inline stripe {info.id}: {len(data)} bytes with crc32c "
                f"{crc32c.crc32c(data):#010x}, expected {info.data_length} with {checksum:#010x}"
            )
        return bytearray(data) if whole else memoryview(data)

    def will_read(self, info: StripeInfo, idx: int) -> None:
        where = info.fragments.get(idx)
        if where is None:
            return
        drive = self.drives.get(where[0])
        if drive is None or drive.backend is None or not drive.readable():
            return
        try:
            drive.backend.will_read(self.zones[where[1]].idx, where[2], where[3])
        except OSError:
            pass  # a hint: the read itself reports what is wrong

    def read_in_memory(self, info: StripeInfo, idx: int) -> memoryview | None:
        """Payload of fragment ``idx`` if its drive has it in memory and its checksum matches,
        else None (the blocking read then counts any error)."""
        where = info.fragments.get(idx)
        if info.layout == INLINE or where is None:  # inline bytes are a catalog read
            return None
        drive_id, zone_id, offset, length, checksum = where
        drive = self.drives.get(drive_id)
        zone = self.zones.get(zone_id)
        if drive is None or zone is None or not drive.readable():
            return None
        buf = drive.backend.read_cached(zone.idx, offset, length)
        if buf is None:
            return None
        # keep the GIL (release mode 0): on the loop, letting go of it only hands it around
        if crc32c.crc32c(buf, 0, 0) != checksum:
            return None
        self.stats["fragment_reads"] += 1
        return memoryview(buf)[info.header :]

    def read_in_memory_into(
        self, info: StripeInfo, idx: int, target: memoryview, start: int, end: int
    ) -> bytearray | None:
        """``_read_in_memory`` of fragment ``idx`` with its payload bytes [start, end) going into
        ``target``: the payload after ``end`` (empty when ``end`` is the payload's end), or None.
        The whole fragment is read (its crc32c covers all of it); bytes before ``start`` are
        read into a scratch buffer."""
        where = info.fragments.get(idx)
        if where is None:
            return None
        drive_id, zone_id, offset, length, checksum = where
        drive = self.drives.get(drive_id)
        zone = self.zones.get(zone_id)
        header, payload = info.header, info.payload
        if (
            drive is None
            or zone is None
            or length != header + payload
            or not 0 <= start <= end <= payload
            or len(target) != end - start
            or not drive.readable()
        ):
            return None
        parts: list[bytearray | memoryview] = [bytearray(header)] if header else []
        if start:
            parts.append(empty_bytearray(start))
        parts.append(target)
        tail = empty_bytearray(payload - end)
        if tail:
            parts.append(tail)
        if not drive.backend.read_cached_into(zone.idx, offset, parts):
            return None
        crc = 0
        for part in parts:
            crc = crc32c.crc32c(part, crc, 0)
        if crc != checksum:
            return None
        self.stats["fragment_reads"] += 1
        return tail


class StripeReader:
    """Stripes' payload bytes for reads: a fragment cache shared by every reader, one decode per
    degraded stripe at a time, read-ahead, and two read paths over the same cache entries (the
    worker threads', which may wait, and the NFS event loop's, which must not).

    It stays one class of about 450 lines on purpose: both paths take and fill the same entries
    (FragmentFuture, ReadyFragment, TailFragment) under one lock, and each must know every state
    an entry can be in; split apart, that protocol would be spread over classes that all depend
    on it. Single-fragment reads, which know nothing of the cache, are FragmentSource."""

    def __init__(
        self,
        drives: dict,
        zones: dict,
        *,
        threads: int = 12,
        cache_bytes: int = 256 << 20,
        load_inline=None,
    ):
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="shingle-read")
        # read-ahead waits on fragment reads: it gets its own threads so the
        # pool cannot starve itself
        self.ahead = ThreadPoolExecutor(2, thread_name_prefix="shingle-readahead")
        self.cache: OrderedDict[tuple[int, int], FragmentFuture | ReadyFragment | TailFragment] = (
            OrderedDict()
        )
        self.cache_bytes = cache_bytes
        self._cached = 0
        self._lock = lock("datapath.reader_cache")
        self._decoding: dict[int, Future] = {}
        # called as repair_hook(info, indexes, good fragments) after a decode around bad checksums
        self.repair_hook: Callable[[StripeInfo, set[int], dict], None] | None = None
        self.stats = {
            "fragment_reads": 0,
            "inline_reads": 0,
            "degraded_stripes": 0,
            "checksum_errors": 0,
            "stripes_decompressed": 0,
            "decompressed_bytes": 0,
            "decompress_s": 0.0,  # thread CPU seconds
        }
        self.source = FragmentSource(drives, zones, load_inline, self.stats, self._lock)

    @property
    def on_io_error(self):
        return self.source.on_io_error

    @on_io_error.setter
    def on_io_error(self, hook) -> None:
        """hook(drive, exc, "read"): a drive read failed (the drive watch listens)."""
        self.source.on_io_error = hook

    def close(self):
        self.ahead.shutdown(wait=True, cancel_futures=True)
        self.pool.shutdown(wait=True, cancel_futures=True)

    def drop_cache(self) -> None:
        with self._lock:
            self.cache.clear()
            self._cached = 0

    def forget(self, stripe_ids) -> None:
        with self._lock:
            for key in [k for k in self.cache if k[0] in stripe_ids]:
                fut = self.cache.pop(key)
                self._cached -= self._size(fut)

    @property
    def cached_bytes(self) -> int:
        """Payload bytes the cache holds (what its budget counts)."""
        return self._cached

    @staticmethod
    def _size(fut: FragmentFuture | ReadyFragment | TailFragment) -> int:
        return getattr(fut, "nbytes", 0)

    # -- fragment fetches -----------------------------------------------------------
    def _decode(self, info: StripeInfo, bad: set[int]) -> dict[int, memoryview]:
        """One decode per stripe at a time: concurrent readers of the stripe share it."""
        with self._lock:
            waiting = self._decoding.get(info.id)
            if waiting is None:
                fut: Future[dict[int, memoryview]] = Future()
                self._decoding[info.id] = fut
        if waiting is not None:
            return waiting.result()
        try:
            result = self._decode_now(info, bad)
            fut.set_result(result)
            return result
        except BaseException as exc:
            fut.set_exception(exc)
            raise
        finally:
            with self._lock:
                self._decoding.pop(info.id, None)

    def _decode_now(self, info: StripeInfo, bad: set[int]) -> dict[int, memoryview]:
        """Every data fragment's payload, rebuilt from any k good fragments."""
        self.stats["degraded_stripes"] += 1
        good: dict[int, bytes] = {}
        failures = []
        order = [i for i in sorted(info.fragments) if i not in bad] + sorted(bad)
        # fetch k at a time in parallel, more only when some fail
        pending = list(order)
        while len(good) < info.k and pending:
            batch, pending = pending[: info.k - len(good)], pending[info.k - len(good) :]
            futures = {i: self.pool.submit(self.source.read, info, i, True) for i in batch}
            for i, fut in futures.items():
                try:
                    good[i] = fut.result()
                except (OSError, errors.FsError) as exc:
                    failures.append(f"fragment {i}: {exc}")
        if len(good) < info.k:
            raise errors.IOFailure(
                f"stripe {info.id} cannot be read: {len(good)} of {info.k} needed fragments "
                f"good ({'; '.join(failures)})"
            )
        if info.layout == "replica":
            data = next(iter(good.values()))
            result = {0: memoryview(data)}
        else:
            try:
                data = decoder_for(info.k, info.m, info.backend).decode(list(good.values()))
            except Exception as exc:
                raise errors.IOFailure(f"stripe {info.id}: decode failed: {exc}") from exc
            p = info.payload
            view = memoryview(data)
            result = {i: view[i * p : (i + 1) * p] for i in range(info.k)}
        with self._lock:
            corrupt = {i for sid, i in self.source.corrupt if sid == info.id}
            self.source.corrupt -= {(info.id, i) for i in corrupt}
        if corrupt and self.repair_hook is not None:
            self.repair_hook(info, corrupt, good)
        return result

    def _fetch(self, info: StripeInfo, indexes: list[int]) -> dict[int, memoryview]:
        """Payloads of the data fragments ``indexes``, from cache or drives,
        decoding on any failure."""
        return self._fetch_flagged(info, indexes)[0]

    def _fetch_flagged(
        self, info: StripeInfo, indexes: list[int]
    ) -> tuple[dict[int, memoryview], bool]:
        """``_fetch``, and whether every payload was read from memory without waiting."""
        if blocking_forbidden():
            return self._fetch_in_memory(info, indexes)
        futures, mine = self._claim(info, indexes)
        jobs = self._read_claimed(info, mine)
        bad: set[int] = set()
        for i, fut, payload, failure in jobs:
            if failure is not None:
                bad.add(i)
                continue
            fut.nbytes = len(payload)
            fut.set_result(payload)
            self._account(fut)
        if bad:
            self._decode_claimed(info, jobs, bad)
        payloads = {i: f.result() for i, f in futures.items()}
        return payloads, all(f.in_memory for f in futures.values())

    def _claim(self, info: StripeInfo, indexes: list[int]):
        """The cache entries of fragments ``indexes``: existing ones, and new futures this
        caller must fill (``mine``), so concurrent readers of a fragment read it once."""
        futures: dict[int, FragmentFuture | ReadyFragment] = {}
        mine: list[tuple[int, FragmentFuture]] = []
        with self._lock:
            for i in indexes:
                key = (info.id, i)
                fut = self.cache.get(key)
                if isinstance(fut, TailFragment):  # not the whole payload: read it again
                    self._cached -= fut.nbytes
                    fut = None
                if fut is None:
                    fut = FragmentFuture()
                    fut.set_running_or_notify_cancel()
                    self.cache[key] = fut
                    mine.append((i, fut))
                else:
                    self.cache.move_to_end(key)
                futures[i] = fut
        return futures, mine

    def _read_claimed(self, info: StripeInfo, mine) -> list:
        """(idx, future, payload or None, failure or None) of each claimed fragment.

        What the page cache holds is taken first, without waiting (marked in_memory: a file
        read wholly so wants no read-ahead, the event loop reads it itself). The rest is read in
        this thread, after asking the kernel for each range (posix_fadvise WILLNEED): the drives
        fetch in parallel all the same, and a thread hand-off per fragment cost more CPU than
        the copy (two cores serve the whole appliance on the reference machine)."""
        jobs: list[tuple[int, FragmentFuture, Any, Exception | None]] = []
        cold = []
        for i, fut in mine:
            payload = self.source.read_in_memory(info, i)
            if payload is None:
                cold.append((i, fut))
            else:
                fut.in_memory = True
                jobs.append((i, fut, payload, None))
        if len(cold) > 1:
            for i, _fut in cold:
                self.source.will_read(info, i)
        for i, fut in cold:
            try:
                jobs.append((i, fut, self.source.read(info, i, False), None))
            except (OSError, errors.FsError) as exc:
                jobs.append((i, fut, None, exc))
        return jobs

    def _decode_claimed(self, info: StripeInfo, jobs: list, bad: set[int]) -> None:
        """Fill the futures of the ``bad`` fragments from a decode (or fail them with its error)."""
        try:
            rebuilt = self._decode(info, bad)
        except Exception as exc:
            for i, fut, _payload, _exc in jobs:
                if i in bad:
                    fut.set_exception(exc)
                    with self._lock:
                        if self.cache.get((info.id, i)) is fut:
                            del self.cache[(info.id, i)]
            raise
        for i, fut, _payload, _exc in jobs:
            if i in bad:
                fut.nbytes = len(rebuilt[i])
                fut.set_result(rebuilt[i])
                self._account(fut)
        # the decode rebuilt every data fragment: keep them all, not only the ones asked for
        for i, payload in rebuilt.items():
            with self._lock:
                old = self.cache.get((info.id, i))
                if _whole(old):
                    continue
                if old is not None:
                    self._cached -= old.nbytes
                fut = FragmentFuture()
                fut.set_running_or_notify_cancel()
                fut.nbytes = len(payload)
                fut.set_result(payload)
                self.cache[(info.id, i)] = fut
            self._account(fut)

    def _fetch_in_memory(
        self,
        info: StripeInfo,
        indexes: list[int],
        from_drives: bool = True,
        direct: dict[int, tuple[memoryview, int, int]] | None = None,
    ) -> tuple[dict[int, memoryview], bool]:
        """For a caller that must not block (the NFS event loop): payloads from the cache, or
        (``from_drives``) read where the drive has them in memory (the page cache), checked
        against their crc32c and cached. ``direct`` maps fragments to (buffer, start, end): the
        payload bytes [start, end) that buffer takes. Such a fragment that is not cached is read
        straight into its buffer instead (the READ's reply: no buffer of its own, no copy), its
        payload after ``end`` cached as a TailFragment, and so is one whose TailFragment holds
        the range; neither has an entry in the payloads returned. WouldBlock where a drive
        would wait, a read-ahead is still on its way, or a read fails or mismatches: the
        blocking path then reads again, reports and decodes. Also returns whether every
        payload came from such in-memory reads (the file is warm: read-ahead threads would only
        compete with the loop)."""
        sid, cache = info.id, self.cache
        with self._lock:
            hits = [cache.get((sid, i)) for i in indexes]
            for i, fut in zip(indexes, hits, strict=True):
                if fut is not None:
                    cache.move_to_end((sid, i))
        payloads: dict[int, memoryview] = {}
        fresh: list[tuple[int, ReadyFragment | TailFragment]] = []
        in_memory = True
        for i, fut in zip(indexes, hits, strict=True):
            want = direct.get(i) if direct is not None else None
            if isinstance(fut, TailFragment):
                if want is not None and fut.start <= want[1]:
                    target, a, b = want
                    target[:] = fut.payload[a - fut.start : b - fut.start]
                    continue
                fut = None  # not the bytes asked for: read the fragment again
            if fut is None:
                if info.layout == INLINE:
                    raise WouldBlock("inline stripe read")  # a catalog read
                if want is not None and from_drives:
                    tail = self.source.read_in_memory_into(info, i, *want)
                    if tail is None:
                        self._cache_ready(sid, fresh)
                        raise NotInMemory("fragment read")
                    if tail:
                        fresh.append((i, TailFragment(want[2], memoryview(tail))))
                    continue
                payload = self.source.read_in_memory(info, i) if from_drives else None
                if payload is None:
                    self._cache_ready(sid, fresh)  # what was read stays read
                    raise NotInMemory("fragment read")
                fresh.append((i, ReadyFragment(payload)))
                payloads[i] = payload
            elif not fut.done() or fut.exception() is not None:
                self._cache_ready(sid, fresh)
                raise NotInMemory("fragment read")
            else:
                payloads[i] = fut.result()
                in_memory = in_memory and fut.in_memory
        self._cache_ready(sid, fresh)
        return payloads, in_memory

    def _cache_ready(
        self, stripe_id: int, entries: list[tuple[int, ReadyFragment | TailFragment]]
    ) -> None:
        """Cache fragments read in memory, in one go (one taking of the lock for a stripe). A
        fragment another thread cached or is reading meanwhile keeps that entry; a whole
        payload replaces a TailFragment."""
        if not entries:
            return
        cache = self.cache
        with self._lock:
            for i, entry in entries:
                old = cache.get((stripe_id, i))
                if old is None or (isinstance(old, TailFragment) and _whole(entry)):
                    cache[(stripe_id, i)] = entry
                    self._cached += entry.nbytes - (old.nbytes if old is not None else 0)
            while self._cached > self.cache_bytes and len(cache) > 1:
                _, old = cache.popitem(last=False)
                self._cached -= self._size(old)

    def _account(self, fut: FragmentFuture | ReadyFragment | TailFragment) -> None:
        with self._lock:
            self._cached += fut.nbytes
            while self._cached > self.cache_bytes and len(self.cache) > 1:
                _, old = self.cache.popitem(last=False)
                self._cached -= self._size(old)

    # -- compressed stripes ---------------------------------------------------------------
    def _unpacked(self, info: StripeInfo) -> memoryview:
        """The user bytes of a compressed stripe: decompressed once, then from the cache."""
        key = (info.id, UNPACKED)
        with self._lock:
            # a compressed stripe's key never holds a TailFragment (its reads take this path)
            cached = cast("FragmentFuture | ReadyFragment | None", self.cache.get(key))
            if cached is None and not blocking_forbidden():
                fut = FragmentFuture()
                self.cache[key] = fut
                fut.set_running_or_notify_cancel()
            elif cached is not None:
                self.cache.move_to_end(key)
        if cached is not None:
            if blocking_forbidden() and not cached.done():
                raise WouldBlock("stripe decompression")  # from the cache or not at all
            return cached.result()
        if blocking_forbidden():
            raise WouldBlock("stripe decompression")
        try:
            data = self._decompress(info)
        except BaseException as exc:
            fut.set_exception(exc)
            with self._lock:
                if self.cache.get(key) is fut:
                    del self.cache[key]
            raise
        fut.nbytes = len(data)
        fut.set_result(data)
        with self._lock:  # the frame's fragments are not needed while the bytes are cached
            for i in range(self._data_fragments(info)):
                old = self.cache.get((info.id, i))
                if old is not None and old.done():
                    del self.cache[(info.id, i)]
                    self._cached -= self._size(old)
        self._account(fut)
        return data

    def _decompress(self, info: StripeInfo) -> memoryview:
        count = self._data_fragments(info)
        payloads = self._fetch(info, list(range(count)))
        frame = b"".join(payloads[i] for i in range(count))[: info.stored_length]
        started = time.thread_time()
        data = compression.unpack(frame, info.compression, info.data_length, stripe_id=info.id)
        self.stats["decompress_s"] += time.thread_time() - started
        self.stats["stripes_decompressed"] += 1
        self.stats["decompressed_bytes"] += len(data)
        return memoryview(data)

    @staticmethod
    def _data_fragments(info: StripeInfo) -> int:
        """Data fragments that hold the bytes the stripe encodes."""
        p = info.payload
        return -(-info.encoded_length // p) if p else 0

    # -- ranges ----------------------------------------------------------------------
    def read_range(
        self,
        info: StripeInfo,
        offset: int,
        length: int,
        out: memoryview,
        from_drives: bool = True,
        into_out: bool = False,
    ) -> bool:
        """Copy stripe data [offset, offset+length) into ``out``. True when every byte came
        from drive reads that found it in memory (the page cache: no read-ahead needed). A
        caller that must not block reads drives only with ``from_drives`` (else only the
        cache), and with ``into_out`` (one reader streams the file: nobody will ask for these
        bytes again soon) the fragments straight into ``out``, the rest of the last one kept for
        that reader's next READ (TailFragment)."""
        if offset + length > info.data_length:
            raise errors.IOFailure(
                f"extent reaches past stripe {info.id}'s {info.data_length} data bytes"
            )
        if info.compression is not None:
            out[:length] = self._unpacked(info)[offset : offset + length]
            return False
        p = info.payload
        first, last = offset // p, (offset + length - 1) // p
        if blocking_forbidden():
            # a streaming reader's fragments go straight into ``out`` where not cached
            direct = None
            if into_out:
                end, at = offset + length, 0
                direct = {}
                for i in range(first, last + 1):
                    a, b = max(offset - i * p, 0), min(end - i * p, p)
                    direct[i] = (out[at : at + b - a], a, b)
                    at += b - a
            payloads, in_memory = self._fetch_in_memory(
                info, list(range(first, last + 1)), from_drives, direct
            )
        else:
            payloads, in_memory = self._fetch_flagged(info, list(range(first, last + 1)))
        pos = 0
        for i in range(first, last + 1):
            a = max(offset, i * p) - i * p
            b = min(offset + length, (i + 1) * p) - i * p
            payload = payloads.get(i)
            if payload is not None:  # else read into out already
                out[pos : pos + b - a] = payload[a:b]
            pos += b - a
        return in_memory

    def prefetch(self, info: StripeInfo) -> None:
        """Start fetching all data fragments of a stripe (read-ahead), without waiting."""
        if info.compression is not None:
            with self._lock:
                if (info.id, UNPACKED) in self.cache:
                    return
            self.ahead.submit(self._quiet_unpack, info)
            return
        count = self._data_fragments(info)
        with self._lock:
            if all(_whole(self.cache.get((info.id, i))) for i in range(count)):
                return
        self.ahead.submit(self._quiet_fetch, info, list(range(count)))

    def _quiet_fetch(self, info, indexes):
        try:
            self._fetch(info, indexes)
        except Exception:
            pass  # the reader that needs these bytes reports the error

    def _quiet_unpack(self, info):
        try:
            self._unpacked(info)
        except Exception:
            pass  # the reader that needs these bytes reports the error
