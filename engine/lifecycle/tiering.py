"""Tiering: move files between the hot, warm and cold band classes in the background.

What moves where (``TieringPolicy``):
- a file pinned to a class (``inodes.band_class``: retention's "cold" action, or a
  path rule such as /archive -> cold) moves to that class;
- hot -> warm once the file has not changed for ``hot_to_warm_after_s``; its small
  extents are coalesced into full stripes;
- warm -> cold when neither changed nor read for ``warm_to_cold_after_s``;
- cold -> warm after ``promote_reads`` reads within ``promote_window_s``.
Reads are counted by ``ReadTracker``, the data path's read hook (``DataPath.set_read_hook``;
the catalog does not record reads); tiering's own reads are not counted.

A move reads the file's bytes, writes them as new stripes of the target class
(fragments through the data path's drive writers, on k+m distinct drives, durable
first), then swaps the extents in ONE catalog transaction that first checks the
file's extents are exactly those the bytes were read through. A reader therefore
sees the old extents or the new ones, never a gap; a file written meanwhile keeps
its new data and the copy becomes garbage. mtime and ctime do not change: the
data did not. Moves are rate limited (bytes/s) and report progress.

A target class with compression (cold: ``compression = "zstd"``) gets each new stripe's data
compressed before it is erasure coded (engine/coding/compression.py); the stripe row records the
codec and the compressed length, and a stripe that would not shrink by 1/16 is stored raw. The read
path decompresses; scrub, rebuild and cleaning work on the fragments and never look inside.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import and_, func, select

from engine.admin.events import record
from engine.base import errors
from engine.base.ordered_lock import lock
from engine.catalog.database import Catalog
from engine.catalog.models import REG, Extent, Fragment, Inode, Stripe
from engine.coding import compression
from engine.datapath.accounting import adjust_live, chunks
from engine.lifecycle.media import Media, media_for
from engine.lifecycle.pacing import Progress, RateLimiter, Tracker

EXTENTS = Extent.__table__
STRIPES = Stripe.__table__
FRAGMENTS = Fragment.__table__
INODES = Inode.__table__
HOT, WARM, COLD = "hot", "warm", "cold"
CLASSES = (HOT, WARM, COLD)
MOVE_BATCH_BYTES = 16 << 20  # user bytes read and written per file move step


@dataclass
class TieringPolicy:
    hot_to_warm_after_s: float = 600.0
    warm_to_cold_after_s: float = 30 * 86400.0
    promote_reads: int = 3
    promote_window_s: float = 86400.0
    path_rules: list = field(default_factory=list)  # [(path prefix, class)]: pin subtrees
    bytes_per_s: float | None = None

    def validate(self) -> TieringPolicy:
        for name in ("hot_to_warm_after_s", "warm_to_cold_after_s", "promote_window_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise errors.InvalidArgument(f"tiering {name} {value!r}: expected seconds >= 0")
        if (
            isinstance(self.promote_reads, bool)
            or not isinstance(self.promote_reads, int)
            or self.promote_reads < 1
        ):
            raise errors.InvalidArgument(
                f"tiering promote_reads {self.promote_reads!r}: expected an integer >= 1"
            )
        for rule in self.path_rules:
            if not (
                isinstance(rule, (tuple, list))
                and len(rule) == 2
                and isinstance(rule[0], str)
                and rule[0].startswith("/")
                and rule[1] in CLASSES
            ):
                raise errors.InvalidArgument(
                    f"tiering path rule {rule!r}: expected (absolute path, one of "
                    f"{', '.join(CLASSES)})"
                )
        return self


class ReadTracker:
    """Counts reads per file (one per burst of reads) for promotion: the data path calls
    ``note`` on every read once the tracker is made (it sets itself as the read hook)."""

    BURST_S = 1.0

    def __init__(self, data, *, clock=time.monotonic):
        self.data = data
        self.clock = clock
        self.started = clock()
        self._reads: dict[int, deque] = {}
        self._lock = lock("lifecycle.read_tracker")
        data.set_read_hook(self.note)

    def close(self) -> None:
        """Stop counting (the data path calls no hook any more)."""
        self.data.set_read_hook(None)

    def note(self, ino: int) -> None:
        now = self.clock()
        with self._lock:
            seen = self._reads.setdefault(ino, deque(maxlen=64))
            if not seen or now - seen[-1] >= self.BURST_S:
                seen.append(now)
            else:
                seen[-1] = now

    def reads_since(self, ino: int, seconds: float) -> int:
        now = self.clock()
        with self._lock:
            return sum(1 for t in self._reads.get(ino, ()) if now - t <= seconds)

    def idle_for(self, ino: int) -> float:
        """Seconds since the last read (since tracking began if none was seen)."""
        with self._lock:
            seen = self._reads.get(ino)
            last = seen[-1] if seen else self.started
        return self.clock() - last


@dataclass(frozen=True)
class TierMove:
    ino: int
    source: str  # the class holding most of its bytes now
    target: str
    nbytes: int
    reason: str

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class TieringReport:
    files_moved: int = 0
    files_skipped: int = 0
    bytes_moved: int = 0  # user bytes
    media_bytes_written: int = 0
    moves: dict = field(default_factory=dict)  # "hot->warm" -> files
    elapsed_s: float = 0.0
    # stripes written into classes with compression: compressed, and kept raw (would not shrink)
    stripes_compressed: int = 0
    stripes_stored_raw: int = 0
    compression_in_bytes: int = 0  # user bytes of those stripes
    compression_out_bytes: int = 0  # what their fragments encode (frames, raw stripes as they are)
    compress_cpu_s: float = 0.0

    @property
    def mb_per_s(self) -> float:
        return self.bytes_moved / 1e6 / self.elapsed_s if self.elapsed_s else 0.0

    @property
    def compression_ratio(self) -> float | None:
        """User bytes per stored byte of the stripes written into compressing classes."""
        if not self.compression_out_bytes:
            return None
        return self.compression_in_bytes / self.compression_out_bytes

    def add_packed(self, packed: compression.Packed) -> None:
        if packed.codec is None:
            self.stripes_stored_raw += 1
        else:
            self.stripes_compressed += 1
        self.compression_in_bytes += packed.raw_length
        self.compression_out_bytes += len(packed.data)
        self.compress_cpu_s += packed.cpu_s

    def to_dict(self) -> dict:
        data = asdict(self)
        data["mb_per_s"] = self.mb_per_s
        if self.compression_ratio is not None:  # only runs that wrote into compressing classes
            data["compression_ratio"] = self.compression_ratio
        return data


class Tiering:
    def __init__(
        self,
        namespace,
        datapath,
        catalog: Catalog,
        policy: TieringPolicy | None = None,
        *,
        reads: ReadTracker | None = None,
        clock=time.time_ns,
    ):
        self.ns = namespace
        self.dp = datapath
        self.catalog = catalog
        self.policy = (policy or TieringPolicy()).validate()
        self.reads = reads
        self.clock = clock
        self.limiter = RateLimiter(self.policy.bytes_per_s)
        self._lock = lock("lifecycle.tiering")
        # what compression did, over every move of this object (run() reports its own share)
        self.packing = TieringReport()

    # -- path rules -----------------------------------------------------------------------
    def apply_path_rules(self) -> int:
        """Pin every file and directory under each rule's path to its class;
        returns inodes changed."""
        from engine.namespace.paths import walk_subtree

        changed = 0
        for prefix, band_class in self.policy.path_rules:
            try:
                top = self.ns.resolve(prefix, follow=False)
            except (errors.NotFound, errors.NotADirectory):
                continue
            inos = [a.ino for a in walk_subtree(self.ns, top)]

            def work(conn, inos=inos, band_class=band_class):
                n = 0
                for part in chunks(inos):
                    n += conn.execute(
                        INODES.update()
                        .where(
                            INODES.c.ino.in_(part),
                            (INODES.c.band_class.is_(None)) | (INODES.c.band_class != band_class),
                        )
                        .values(band_class=band_class)
                    ).rowcount
                return n

            changed += self.catalog.run(work)
        return changed

    # -- planning -----------------------------------------------------------------------------
    def plan(self) -> list[TierMove]:
        """Files that should move now, with the reason."""
        now = self.clock()

        def work(conn):
            per_class = (
                select(
                    EXTENTS.c.ino, STRIPES.c.band_class, func.sum(EXTENTS.c.length).label("nbytes")
                )
                .select_from(EXTENTS.join(STRIPES, STRIPES.c.id == EXTENTS.c.stripe_id))
                .group_by(EXTENTS.c.ino, STRIPES.c.band_class)
            ).subquery()
            return conn.execute(
                select(
                    per_class.c.ino,
                    per_class.c.band_class,
                    per_class.c.nbytes,
                    INODES.c.band_class.label("pinned"),
                    INODES.c.mtime_ns,
                    INODES.c.ctime_ns,
                ).select_from(
                    per_class.join(
                        INODES, and_(INODES.c.ino == per_class.c.ino, INODES.c.type == REG)
                    )
                )
            ).all()

        files: dict[int, dict] = {}
        for row in self.catalog.read(work):
            entry = files.setdefault(
                row.ino,
                {
                    "classes": {},
                    "pinned": row.pinned,
                    "changed_ns": max(row.mtime_ns, row.ctime_ns),
                },
            )
            entry["classes"][row.band_class] = int(row.nbytes)
        p = self.policy
        moves = []
        for ino, info in sorted(files.items()):
            classes, pinned = info["classes"], info["pinned"]
            total = sum(classes.values())
            source = max(classes, key=classes.get)
            idle_s = (now - info["changed_ns"]) / 1e9
            if pinned in CLASSES:
                if any(c != pinned for c in classes):
                    moves.append(TierMove(ino, source, pinned, total, f"pinned to {pinned}"))
                continue
            if HOT in classes and idle_s >= p.hot_to_warm_after_s:
                moves.append(TierMove(ino, HOT, WARM, total, f"unchanged for {idle_s:.0f} s"))
            elif (
                source == WARM
                and idle_s >= p.warm_to_cold_after_s
                and self._unread(ino, p.warm_to_cold_after_s)
            ):
                moves.append(
                    TierMove(ino, WARM, COLD, total, f"not changed or read for {idle_s:.0f} s")
                )
            elif (
                COLD in classes
                and self.reads is not None
                and self.reads.reads_since(ino, p.promote_window_s) >= p.promote_reads
            ):
                moves.append(
                    TierMove(
                        ino,
                        COLD,
                        WARM,
                        total,
                        f"read {self.reads.reads_since(ino, p.promote_window_s)} times",
                    )
                )
        return moves

    def _unread(self, ino: int, seconds: float) -> bool:
        return self.reads is None or self.reads.idle_for(ino) >= seconds

    # -- running --------------------------------------------------------------------------------
    def run(
        self,
        *,
        progress: Progress | None = None,
        actor: str = "system",
        max_bytes: int | None = None,
    ) -> TieringReport:
        with self._lock:
            started = time.monotonic()
            report = TieringReport()
            self.dp.refresh_drive_states()
            self.apply_path_rules()
            moves = self.plan()
            if max_bytes is not None:
                budget, chosen = max_bytes, []
                for move in moves:
                    if move.nbytes <= budget:
                        chosen.append(move)
                        budget -= move.nbytes
                moves = chosen
            tracker = Tracker(sum(m.nbytes for m in moves), progress, "tiering")
            media = media_for(self.dp)
            self.packing = report
            try:
                for index, move in enumerate(moves):
                    try:
                        moved, written = self.move_file(move.ino, move.target, media)
                    except (errors.StaleHandle, errors.NotFound):
                        moved = written = 0  # the file was removed while it was being moved
                    except errors.NoSpace:
                        # a full volume: cleaning must free zones first; the rest
                        # waits for a later round
                        report.files_skipped += len(moves) - index
                        break
                    if moved:
                        report.files_moved += 1
                        report.bytes_moved += moved
                        report.media_bytes_written += written
                        key = f"{move.source}->{move.target}"
                        report.moves[key] = report.moves.get(key, 0) + 1
                    else:
                        report.files_skipped += 1
                    tracker.add(move.nbytes)
            finally:
                media.finish()
            report.elapsed_s = time.monotonic() - started
            tracker.finish(
                f"tiering: {report.files_moved} files moved ({report.bytes_moved / 1e6:.1f} MB), "
                f"{report.files_skipped} skipped"
            )
            record(
                self.catalog,
                "tier.run",
                f"tiering moved {report.files_moved} files "
                f"({report.bytes_moved / 1e6:.1f} MB): "
                + (
                    ", ".join(f"{n} {k}" for k, n in sorted(report.moves.items()))
                    or "nothing to move"
                )
                + (
                    f"; {report.files_skipped} skipped (busy or changed)"
                    if report.files_skipped
                    else ""
                )
                + (
                    f"; compressed {report.compression_ratio:.2f}:1 "
                    f"({report.stripes_compressed} stripes, {report.stripes_stored_raw} kept raw)"
                    if report.compression_ratio is not None
                    else ""
                ),
                actor=actor,
                details=report.to_dict(),
            )
            return report

    def move_file(
        self,
        ino: int,
        target: str,
        media: Media | None = None,
        *,
        only_stripes: set[int] | None = None,
    ) -> tuple[int, int]:
        """Rewrite the file's extents that are not in ``target`` into ``target`` stripes (only
        those in ``only_stripes`` if given: a snapshot's archive leaves shared stripes alone).

        Returns (user bytes moved, media bytes written); (0, 0) when skipped because the
        file is being written or changed while it was copied."""
        if target not in self.dp.policies:
            raise errors.InvalidArgument(
                f"band class {target!r}: expected one of {', '.join(self.dp.policies)}"
            )
        own_media = media is None
        media = media or media_for(self.dp)
        try:
            if self.dp.pending_size(ino) is not None:
                return 0, 0
            moved = written = 0
            offset = 0
            while True:
                step = self._move_step(ino, target, media, offset, only_stripes)
                if step is None:
                    return moved, written  # a change was seen: what moved so far stays moved
                done_bytes, media_bytes, next_offset = step
                moved += done_bytes
                written += media_bytes
                if next_offset is None:
                    return moved, written
                offset = next_offset
        finally:
            if own_media:
                media.finish()

    def _snapshot(self, ino: int, target: str, start: int):
        def work(conn):
            size = conn.execute(select(INODES.c.size).where(INODES.c.ino == ino)).scalar()
            rows = conn.execute(
                select(
                    EXTENTS.c.id,
                    EXTENTS.c.file_offset,
                    EXTENTS.c.length,
                    EXTENTS.c.stripe_id,
                    EXTENTS.c.stripe_offset,
                    STRIPES.c.band_class,
                )
                .select_from(EXTENTS.join(STRIPES, STRIPES.c.id == EXTENTS.c.stripe_id))
                .where(EXTENTS.c.ino == ino, EXTENTS.c.file_offset >= start)
                .order_by(EXTENTS.c.file_offset)
            ).all()
            return size, rows

        return self.catalog.read(work)

    def _move_step(
        self, ino: int, target: str, media: Media, start: int, only_stripes: set[int] | None = None
    ):
        """Move up to MOVE_BATCH_BYTES of extents at or after ``start``.
        Returns (bytes moved, media bytes, next start or None), or None if the file changed."""
        size, rows = self._snapshot(ino, target, start)
        if size is None:
            return None
        todo, total, next_start = _next_batch(rows, target, only_stripes)
        if not todo:
            return 0, 0, None
        policy = self.dp.policies[target]
        # read the bytes through the extents we will replace
        pieces = [
            (row, self.dp.read(ino, row.file_offset, row.length, size, track=False)) for row in todo
        ]
        if any(len(data) != row.length for row, data in pieces):
            return None  # truncated meanwhile
        move = _pack(ino, target, policy, todo, pieces)
        items, move.layout = _spread(move, media)
        placements = media.append(target, items, purpose="tier")
        try:
            new_ids = self.catalog.run(
                lambda conn: self._swap_extents(conn, move, media, placements), durable=True
            )
        except BaseException:
            media.settle(placements, committed=False)
            raise
        media.settle(placements, committed=True)
        self.dp.invalidate_stripes({r.stripe_id for r in todo} | set(new_ids or ()))
        if new_ids is None:
            return None
        if policy.compression is not None:
            for stored in move.packed:
                self.packing.add_packed(stored)
        self.limiter.spend(sum(p.length for p in placements))
        return total, sum(p.length for p in placements), next_start

    def _swap_extents(self, conn, move: _Move, media: Media, placements) -> list[int] | None:
        """Record the new fragments and, if the file's extents are still those the bytes were
        read through, replace them with extents of the new stripes (one transaction): the new
        stripes' ids, or None when the file changed (the copy is then garbage)."""
        media.record(conn, placements)
        expected = [
            (r.id, r.file_offset, r.length, r.stripe_id, r.stripe_offset) for r in move.todo
        ]
        current = conn.execute(
            select(
                EXTENTS.c.id,
                EXTENTS.c.file_offset,
                EXTENTS.c.length,
                EXTENTS.c.stripe_id,
                EXTENTS.c.stripe_offset,
            ).where(EXTENTS.c.id.in_([e[0] for e in expected]))
        ).all()
        if sorted(tuple(r) for r in current) != sorted(expected):
            return None  # changed since we read it: the copy is garbage, the file keeps its data
        stripe_ids = _insert_stripes(conn, move, self.clock())
        # SQLite may hand out ids of dead stripes again: no cached description may survive
        self.dp.invalidate_stripes(stripe_ids)
        conn.execute(
            FRAGMENTS.insert(),
            [
                {
                    "stripe_id": stripe_ids[n],
                    "idx": idx,
                    "drive_id": p.drive_id,
                    "zone_id": p.zone_id,
                    "zone_offset": p.offset,
                    "length": p.length,
                    "checksum": p.checksum,
                }
                for (n, idx), p in zip(move.layout, placements, strict=True)
            ],
        )
        for part in chunks([e[0] for e in expected]):
            conn.execute(EXTENTS.delete().where(EXTENTS.c.id.in_(part)))
        conn.execute(
            EXTENTS.insert(),
            [
                {
                    "ino": move.ino,
                    "file_offset": fo,
                    "length": length,
                    "stripe_id": stripe_ids[n],
                    "stripe_offset": so,
                }
                for fo, length, n, so in move.new_extents
            ],
        )
        _move_live_bytes(conn, move, stripe_ids, placements)
        return stripe_ids


@dataclass
class _Move:
    """One batch of a file's extents on its way to another band class."""

    ino: int
    target: str
    policy: Any  # the target class's erasure.Policy
    todo: list  # the extent rows it replaces
    payloads: list[bytearray]  # the new stripes' data
    new_extents: list  # (file_offset, length, payload index, offset in payload)
    packed: list  # each payload compressed, or kept raw
    encoded: list  # each packed payload's fragments
    layout: list = field(default_factory=list)  # (payload index, fragment index) per placement


def _next_batch(rows, target: str, only_stripes: set[int] | None):
    """The extents of the next batch (those not already in ``target``), their bytes, and where
    the batch after it starts (None: this one reaches the end)."""
    todo: list = []
    total = 0
    for row in rows:
        if row.band_class == target:
            continue
        if only_stripes is not None and row.stripe_id not in only_stripes:
            continue
        if total and total + row.length > MOVE_BATCH_BYTES:
            return todo, total, row.file_offset
        todo.append(row)
        total += row.length
    return todo, total, None


def _pack(ino: int, target: str, policy, todo: list, pieces: list) -> _Move:
    """Pack the bytes into stripes of the target class (small extents coalesce into full
    stripes), compressed and erasure coded."""
    payloads: list[bytearray] = [bytearray()]
    new_extents = []
    for row, data in pieces:
        pos = 0
        while pos < len(data):
            room = policy.stripe_size - len(payloads[-1])
            if room == 0:
                payloads.append(bytearray())
                room = policy.stripe_size
            take = min(room, len(data) - pos)
            new_extents.append((row.file_offset + pos, take, len(payloads) - 1, len(payloads[-1])))
            payloads[-1] += data[pos : pos + take]
            pos += take
    # compressed per stripe, so a read decompresses one stripe, and a stripe that does
    # not shrink (token shards) is kept raw
    packed = [compression.pack(p, policy.compression, policy.compression_level) for p in payloads]
    encoded = [policy.encode(p.data) for p in packed]
    return _Move(ino, target, policy, todo, payloads, new_extents, packed, encoded)


def _spread(move: _Move, media: Media) -> tuple[list, list]:
    """Each stripe's fragments on distinct writable drives, stripes rotated over the drives:
    the (drive, fragment) items to append and their (payload index, fragment index)."""
    policy = move.policy
    items, layout = [], []
    for n, fragments in enumerate(move.encoded):
        drives = media.writable_drives(want=policy.width)
        if len(drives) < policy.width:
            raise errors.NoSpace(
                f"{move.target} stripe needs {policy.width} writable drives with room, "
                f"{len(drives)} have it"
            )
        shift = n % len(drives)
        drives = (drives[shift:] + drives[:shift])[: policy.width]
        for idx, (drive_id, fragment) in enumerate(zip(drives, fragments, strict=True)):
            items.append((drive_id, fragment))
            layout.append((n, idx))
    return items, layout


def _insert_stripes(conn, move: _Move, now: int) -> list[int]:
    policy = move.policy
    stripe_ids = []
    for payload, stored, fragments in zip(move.payloads, move.packed, move.encoded, strict=True):
        stripe_ids.append(
            conn.execute(
                STRIPES.insert().values(
                    band_class=move.target,
                    layout=policy.layout,
                    k=policy.k,
                    m=policy.m,
                    backend=policy.backend,
                    data_length=len(payload),
                    fragment_length=len(fragments[0]),
                    compression=stored.codec,
                    stored_length=stored.stored_length,
                    live_bytes=0,
                    created_ns=now,
                )
            ).inserted_primary_key[0]
        )
    return stripe_ids


def _move_live_bytes(conn, move: _Move, stripe_ids: list[int], placements) -> None:
    """The old stripes lose the moved bytes, the new ones gain them."""
    deltas: dict[int, int] = {}
    for row in move.todo:
        deltas[row.stripe_id] = deltas.get(row.stripe_id, 0) - row.length
    for _fo, length, n, _so in move.new_extents:
        deltas[stripe_ids[n]] = deltas.get(stripe_ids[n], 0) + length
    known = {}
    for n, sid in enumerate(stripe_ids):
        known[sid] = (
            len(move.payloads[n]),
            0,
            [
                (p.zone_id, p.length)
                for (m, _i), p in zip(move.layout, placements, strict=True)
                if m == n
            ],
        )
    adjust_live(conn, deltas, known)


def tier_run(
    namespace,
    datapath,
    catalog: Catalog,
    *,
    policy: TieringPolicy | None = None,
    reads: ReadTracker | None = None,
    progress: Progress | None = None,
    actor: str = "system",
) -> TieringReport:
    return Tiering(namespace, datapath, catalog, policy, reads=reads).run(
        progress=progress, actor=actor
    )
