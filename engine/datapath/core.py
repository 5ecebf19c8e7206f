"""DataPath: the FileData implementation behind the namespace (see the package docstring).

A facade over the parts, each with its own lock and a public interface:
``space`` (space.Space: drives, zones, reservations, placement, pins, reclaim),
``writers`` (writers.DriveWriters: one writer and syncer thread per drive),
``dispatcher`` (stripes.Dispatcher: encode and place in submission order),
``commits`` (commit.Committer: the durable batch transaction),
``buffers`` (buffers.FileBuffers: write, flush, truncate, release),
``extents`` (extents.ExtentCache) and ``reads`` (extents.Reads), ``repairs`` (repair.Repairer),
``sharing`` (sharing.Sharing: clone_range, punch, data_ranges over shared extents),
``drive_watch`` (drivewatch.DriveWatch: drives gone or failing become drive states).
The hot calls (write, flush, read) are the parts' own bound methods, set on the instance, so
the facade adds no call of its own to them."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from engine.base import errors
from engine.catalog.database import sql_one
from engine.catalog.models import BandClass
from engine.coding.erasure import DEFAULT_CLASS, HOT_CLASS, Policy, inline_policy
from engine.datapath.buffers import FileBuffers
from engine.datapath.commit import Committer
from engine.datapath.drivewatch import DriveWatch
from engine.datapath.extents import ExtentCache, Reads
from engine.datapath.reader import StripeReader
from engine.datapath.recovery import RecoveryReport, recover
from engine.datapath.repair import Repairer
from engine.datapath.sharing import Sharing
from engine.datapath.space import Space
from engine.datapath.stripes import Dispatcher, InlineBudget
from engine.datapath.writers import DriveWriters

BAND_CLASSES = BandClass.__table__

# Durable flushes up to INLINE_WRITE_BYTES that would go to the hot class are kept in the catalog
# instead (stripes of layout "inline"): their bytes ride in the flush's one catalog transaction, so
# a 4 KiB COMMIT costs one fsync round instead of two (drives, then catalog). Tiering folds them
# into erasure-coded stripes like other hot data; INLINE_BUDGET_BYTES bounds what the catalog
# holds.
INLINE_WRITE_BYTES = 64 << 10
INLINE_BUDGET_BYTES = 256 << 20


def _check_count(key: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise errors.ConfigError(key, value, "an integer >= 0")


class DataPath:
    def __init__(
        self,
        catalog,
        policies: dict[str, Policy],
        *,
        reserve_zones: int = 2,
        smr_model=None,
        encoders: int = 2,
        read_threads: int = 12,
        max_inflight_stripes: int = 24,
        cache_bytes: int = 256 << 20,
        small_write_bytes: int | None = None,
        inline_write_bytes: int = INLINE_WRITE_BYTES,
        inline_budget_bytes: int = INLINE_BUDGET_BYTES,
        zone_share: tuple[int, int] = (0, 1),
    ):
        if not policies:
            raise errors.ConfigError("band_classes", policies, "at least one band class policy")
        _check_count("datapath.reserve_zones", reserve_zones)
        _check_count("storage.inline_write_bytes", inline_write_bytes)
        _check_count("storage.inline_budget_bytes", inline_budget_bytes)
        self.catalog = catalog
        self.policies = dict(policies)
        self.default_class = DEFAULT_CLASS if DEFAULT_CLASS in policies else next(iter(policies))
        self.reserve_zones = reserve_zones
        self.smr_model = smr_model
        self.max_fragment = max(p.max_fragment_length for p in self.policies.values())
        self.max_extent = max(p.stripe_size for p in self.policies.values())
        # flushes smaller than this go to the hot (replicated) class; default: one fragment
        # of the default class
        self.small_write_bytes = (
            self.policies[self.default_class].fragment_size
            if small_write_bytes is None
            else small_write_bytes
        )
        self._write_band_classes()
        use_inline = bool(HOT_CLASS in self.policies and inline_write_bytes and inline_budget_bytes)
        self.inline = inline_policy(HOT_CLASS, inline_write_bytes) if use_inline else None
        self.inline_budget_bytes = inline_budget_bytes
        self.stats: defaultdict = defaultdict(float)

        self.space = Space(
            catalog,
            self.policies,
            self.default_class,
            reserve_zones,
            self.stats,
            smr_model=smr_model,
            zone_share=zone_share,
        )
        self._check_fragments_fit()
        self._build_parts(
            read_threads=read_threads,
            cache_bytes=cache_bytes,
            budget=InlineBudget(catalog, inline_budget_bytes, use_inline),
            max_inflight_stripes=max_inflight_stripes,
            encoders=encoders,
        )
        self._closed = False
        self._bind_hot_calls()

        self.recovery_report = recover(catalog, self.space)
        self.drive_watch.note_faulty_zones(self.recovery_report.faulty_zones)
        self.drive_watch.start()
        self.writers.start()
        self.dispatcher.start()
        self.commits.start(self.dispatcher)

    def _check_fragments_fit(self) -> None:
        for policy in self.policies.values():
            for drive in self.space.drives.values():
                if policy.max_fragment_length > drive.zone_size:
                    raise errors.ConfigError(
                        f"band_classes.{policy.name}.fragment_size",
                        policy.fragment_size,
                        f"fragments that fit drive {drive.id}'s zones of {drive.zone_size} bytes",
                    )

    def _build_parts(
        self,
        *,
        read_threads: int,
        cache_bytes: int,
        budget: InlineBudget,
        max_inflight_stripes: int,
        encoders: int,
    ) -> None:
        """The parts over ``space``, each given the ones it calls (the module docstring's list)."""
        catalog = self.catalog
        self.writers = self.space.writers = DriveWriters(self.space.drives, self.stats)
        self.reader = StripeReader(
            self.space.drives,
            self.space.zones,
            threads=read_threads,
            cache_bytes=cache_bytes,
            load_inline=self._load_inline,
        )
        self.extents = ExtentCache(catalog, self.reader)
        self.commits = Committer(
            catalog,
            self.space,
            self.reader,
            self.extents,
            inline=self.inline,
            stats=self.stats,
        )
        self.dispatcher = Dispatcher(
            self.space,
            self.commits,
            self.writers,
            self.policies,
            self.inline,
            budget,
            self.small_write_bytes,
            max_inflight_stripes,
            encoders,
            self.stats,
        )
        self.buffers = FileBuffers(
            catalog,
            self.policies,
            self.default_class,
            self.space,
            self.dispatcher,
            self.commits,
            self.extents,
            self.reader,
            max_extent=self.max_extent,
        )
        self.extents.on_invalidate = self.buffers.forget_settled
        self.reads = Reads(self.buffers.files, self.extents, self.reader)
        self.repairs = Repairer(catalog, self.space, self.writers, self.extents)
        self.sharing = Sharing(self.buffers, self.extents, self.reader)
        self.reader.repair_hook = self.repairs.queue
        self.drive_watch = DriveWatch(catalog, self.space, self.writers, self.reader)

    def _bind_hot_calls(self) -> None:
        """The FileData calls, bound straight to the parts (no facade call on the hot paths)."""
        self.write = self.buffers.write
        self.flush = self.buffers.flush
        self.flush_all = self.buffers.flush_all
        self.pending_size = self.buffers.pending_size
        self.pending_attrs = self.buffers.pending_attrs
        self.changed = self.buffers.changed
        self.times_set = self.buffers.times_set
        self.created = self.buffers.created
        self.truncate = self.buffers.truncate
        self.release = self.buffers.release
        self.clone_range = self.sharing.clone_range
        self.punch = self.sharing.punch
        self.data_ranges = self.sharing.data_ranges
        self.few_data_ranges = self.sharing.few_data_ranges
        self.read = self.reads.read
        self.capacity = self.space.capacity
        self.refresh_drive_states = self.space.refresh_drive_states
        self.invalidate_stripes = self.extents.invalidate_stripes
        self.wait_repairs = self.repairs.wait
        self.check_drives = self.drive_watch.check

    def add_drive(self, drive_id: int) -> None:
        """Start using a drive that was added to the catalog while running (``drives add``,
        engine/lifecycle/drives.py): placement, reads, its writer thread and the drive watch."""
        if drive_id in self.space.drives:
            return
        drive = self.space.add_drive(drive_id, self.smr_model)
        drive.on_gone = self.drive_watch.note_gone
        self.writers.start_drive(drive)

    def _write_band_classes(self) -> None:
        def work(conn):
            for policy in self.policies.values():
                row = policy.as_row()
                done = conn.execute(
                    BAND_CLASSES.update().where(BAND_CLASSES.c.name == policy.name).values(**row)
                ).rowcount
                if not done:
                    conn.execute(BAND_CLASSES.insert().values(**row))

        self.catalog.run(work)

    def _load_inline(self, stripe_id: int):
        """(data, checksum) of an inline stripe, or None when it no longer exists."""
        return self.catalog.read(
            lambda conn: sql_one(
                conn, "SELECT data, checksum FROM inline_data WHERE stripe_id = ?", (stripe_id,)
            )
        )

    def recover(self) -> RecoveryReport:
        """Compare each zone's medium write pointer with the catalog again (the constructor did it
        once, before any write; see ``recovery_report``): buffered writes are flushed first."""
        self.flush_all()
        return recover(self.catalog, self.space)

    def set_read_hook(self, hook: Callable[[int], None] | None) -> None:
        """Call ``hook(ino)`` on every tracked read (tiering counts reads); None removes it."""
        self.reads.hook = hook

    def add_commit_listener(self, listener, reader=None) -> None:
        """Call ``listener(inos, found)`` after each commit batch that changed the size and times of
        ``inos`` (the namespace updates its attribute cache). ``reader(conn, inos)``, if given, runs
        at the end of the batch's transaction; ``found`` is what it returned (None if the commit
        failed): the namespace reads the new attributes there instead of in a transaction of
        its own."""
        self.commits.add_listener(listener, reader)

    def add_size_watch(self, watch) -> None:
        """``watch.before(conn, inos)`` and ``watch.after(conn, state)`` run inside each commit
        batch's transaction, around its size changes (engine.namespace.quotas.QuotaTracker)."""
        self.commits.size_watches.append(watch)

    @property
    def writes_lost(self) -> int:
        """How many times buffered writes were let go because the catalog was unreachable at
        their commit (errors.WritesNotRecorded): NFS changes its write verifier with it."""
        return self.commits.writes_lost

    def counters(self) -> dict[str, float]:
        """Cumulative counters for the web UI's charts (names: engine/admin/metrics.py)."""
        out = {
            "client_bytes_written": self.stats["client_bytes_written"],
            "media_bytes_written": self.stats["media_bytes_written"],
        }
        for name in ("stripes_decompressed", "decompressed_bytes", "decompress_s"):
            out[name] = self.reader.stats[name]
        for drive in self.space.drives.values():  # each drive's own I/O: drive_<id>_<counter>
            if drive.backend is not None:
                counters = drive.backend.io_counters()
                out.update({f"drive_{drive.id}_{k}": v for k, v in counters.items()})
        return out

    def close(self) -> None:
        if self._closed:
            return
        try:
            self.flush_all()
            self.repairs.wait()
        finally:
            self._closed = self.buffers.closed = self.repairs.closed = True
            self.dispatcher.stop()
            self.commits.stop()
            self.drive_watch.stop()
            self.writers.stop()
            self.dispatcher.close_encoders()
            self.reader.close()
            self.repairs.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
