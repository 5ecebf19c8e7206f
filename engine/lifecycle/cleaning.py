"""Band cleaning: reclaim zones whose data is mostly garbage.

Victims are full zones picked by the LFS cost-benefit rule
``(1 - u) * age / (1 + u)``: u is the zone's live fraction (live bytes over its
write pointer) and age the time since its last write, so a cold, mostly dead band
goes first and a young band whose data may still die waits. A zone with u = 0
needs no copying at all.

Cleaning a zone copies each fragment still in it (checksum verified; rebuilt
from redundancy if bad) to a cleaning band of the same class on the same drive,
so a stripe keeps its fragments on distinct drives, and repoints the fragments in
one durable transaction per batch. The zone is reset only once no fragment row
points into it (invariant 6), through the data path's reclaim. Cleaning may use
the zones reserved for it (``DataPath.reserve_zones``), so it cannot deadlock on a
full drive: it needs at most one empty zone per drive to make progress.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from functools import partial

from sqlalchemy import func, select

from engine.admin.events import record
from engine.base import errors
from engine.catalog.database import Catalog
from engine.catalog.models import Drive, Fragment, Zone
from engine.lifecycle.media import Media, media_for
from engine.lifecycle.pacing import Progress, RateLimiter, Tracker
from engine.lifecycle.repair import Reconstructor, fragment_row, load_stripes, relocate

ZONES = Zone.__table__
DRIVES = Drive.__table__
FRAGMENTS = Fragment.__table__
BATCH_BYTES = 8 << 20  # fragment bytes per copy transaction
MAX_UTILIZATION = 0.9  # a zone more live than this gains too little to be worth copying


def cost_benefit(live_bytes: int, written_bytes: int, age_s: float) -> float:
    """The LFS cleaning score: (1 - u) * age / (1 + u)."""
    if written_bytes <= 0:
        return 0.0
    u = min(max(live_bytes / written_bytes, 0.0), 1.0)
    return (1 - u) * max(age_s, 0.0) / (1 + u)


@dataclass(frozen=True)
class Victim:
    zone_id: int
    drive_id: int
    zone_idx: int
    band_class: str | None
    write_pointer: int
    live_bytes: int
    age_s: float
    score: float

    @property
    def utilization(self) -> float:
        return self.live_bytes / self.write_pointer if self.write_pointer else 0.0


@dataclass
class CleaningReport:
    zones_cleaned: int = 0
    zones_reset: int = 0
    fragments_copied: int = 0
    fragments_rebuilt: int = 0  # bad or unreadable in the victim: rebuilt from redundancy instead
    bytes_copied: int = 0  # media bytes written by cleaning
    live_bytes_moved: int = 0
    bytes_freed: int = 0  # write pointers of the zones given back
    elapsed_s: float = 0.0
    victims: list = field(default_factory=list)  # (zone id, utilization, score)

    def to_dict(self) -> dict:
        return asdict(self)


def pick_victims(
    catalog: Catalog,
    *,
    now_ns: int | None = None,
    band_class: str | None = None,
    drive_ids=None,
    max_utilization: float = MAX_UTILIZATION,
) -> list[Victim]:
    """Full zones on online drives with garbage in them, best cost-benefit first."""
    now_ns = now_ns or time.time_ns()

    def work(conn):
        query = (
            select(
                ZONES.c.id,
                ZONES.c.drive_id,
                ZONES.c.idx,
                ZONES.c.band_class,
                ZONES.c.write_pointer,
                ZONES.c.live_bytes,
                ZONES.c.last_write_ns,
                ZONES.c.opened_ns,
            )
            .select_from(ZONES.join(DRIVES, DRIVES.c.id == ZONES.c.drive_id))
            .where(
                ZONES.c.state == "full",
                ZONES.c.write_pointer > 0,
                ZONES.c.garbage_bytes > 0,
                DRIVES.c.state == "online",
            )
        )
        if band_class is not None:
            query = query.where(ZONES.c.band_class == band_class)
        if drive_ids is not None:
            query = query.where(ZONES.c.drive_id.in_(list(drive_ids)))
        return conn.execute(query).all()

    victims = []
    for row in catalog.read(work):
        if row.live_bytes > max_utilization * row.write_pointer:
            continue
        written_ns = row.last_write_ns or row.opened_ns or now_ns
        age_s = (now_ns - written_ns) / 1e9
        victims.append(
            Victim(
                row.id,
                row.drive_id,
                row.idx,
                row.band_class,
                row.write_pointer,
                row.live_bytes,
                age_s,
                cost_benefit(row.live_bytes, row.write_pointer, age_s),
            )
        )
    # ties (same age) fall back to the least live zone: the cheapest to clean
    victims.sort(key=lambda v: (-v.score, v.utilization, v.zone_id))
    return victims


class Cleaner:
    def __init__(
        self,
        datapath,
        catalog: Catalog,
        *,
        bytes_per_s: float | None = None,
        max_utilization: float = MAX_UTILIZATION,
    ):
        self.dp = datapath
        self.catalog = catalog
        self.limiter = RateLimiter(bytes_per_s)
        self.max_utilization = max_utilization

    def free_zones(self) -> dict[int, int]:
        """Empty zones per writable drive, as the data path sees them now."""
        return self.dp.space.empty_zone_counts()

    def run(
        self,
        *,
        progress: Progress | None = None,
        actor: str = "system",
        max_zones: int | None = None,
        target_free_zones: int | None = None,
        band_class: str | None = None,
    ) -> CleaningReport:
        """Clean victims in cost-benefit order: up to ``max_zones``, or until every writable drive
        has ``target_free_zones`` empty zones (both None: every victim)."""
        started = time.monotonic()
        report = CleaningReport()
        self.dp.refresh_drive_states()
        drive_filter = None
        if target_free_zones is not None:
            drive_filter = [d for d, n in self.free_zones().items() if n < target_free_zones]
        victims = pick_victims(
            self.catalog,
            band_class=band_class,
            drive_ids=drive_filter,
            max_utilization=self.max_utilization,
        )
        if max_zones is not None:
            victims = victims[:max_zones]
        tracker = Tracker(sum(v.live_bytes for v in victims), progress, "cleaning")
        media = media_for(self.dp)
        fixer = Reconstructor(media)
        try:
            for victim in victims:
                if (
                    target_free_zones is not None
                    and self.free_zones().get(victim.drive_id, 0) >= target_free_zones
                ):
                    continue
                if self._pinned(victim.zone_id):
                    continue
                self.dp.space.pin(
                    victim.zone_id
                )  # not reset (and reused) while its fragments are copied
                try:
                    copied = self._clean_zone(victim, media, fixer, report, tracker)
                finally:
                    self.dp.space.unpin(victim.zone_id)
                if copied is None:
                    continue
                report.zones_cleaned += 1
                report.victims.append(
                    (victim.zone_id, round(victim.utilization, 3), round(victim.score, 1))
                )
                # give back whatever is empty now (the victims, and any zone that died meanwhile)
                before = self._written(victim.zone_id)
                report.zones_reset += self.dp.space.reclaim_zones()
                if self._written(victim.zone_id) == 0:
                    report.bytes_freed += before
        finally:
            media.finish()
        report.elapsed_s = time.monotonic() - started
        tracker.finish(
            f"cleaning: {report.zones_cleaned} zones cleaned, {report.bytes_copied} bytes copied"
        )
        record(
            self.catalog,
            "clean.run",
            f"cleaning: {report.zones_cleaned} zones cleaned, {report.zones_reset} reset, "
            f"{report.bytes_copied / 1e6:.1f} MB copied, {report.bytes_freed / 1e6:.1f} MB freed",
            actor=actor,
            details={k: v for k, v in report.to_dict().items() if k != "victims"},
        )
        return report

    def _pinned(self, zone_id: int) -> bool:
        return self.dp.space.busy(zone_id)

    def _written(self, zone_id: int) -> int:
        return self.catalog.read(
            lambda conn: conn.execute(
                select(ZONES.c.write_pointer).where(ZONES.c.id == zone_id)
            ).scalar_one()
        )

    def _clean_zone(
        self,
        victim: Victim,
        media: Media,
        fixer: Reconstructor,
        report: CleaningReport,
        tracker: Tracker,
    ) -> int | None:
        """Copy every fragment out of the victim; returns bytes copied, None if
        it could not be emptied."""
        rows = self.catalog.read(
            lambda conn: [
                fragment_row(r)
                for r in conn.execute(
                    select(FRAGMENTS)
                    .where(FRAGMENTS.c.zone_id == victim.zone_id)
                    .order_by(FRAGMENTS.c.zone_offset)
                )
            ]
        )
        copied = 0
        batch, batch_bytes = [], 0
        for fragment in rows:
            data = fixer.fetch(fragment)
            if data is None:  # bad or unreadable here: rebuild it from the rest of its stripe
                stripes = self.catalog.read(partial(load_stripes, stripe_ids=[fragment.stripe_id]))
                stripe = stripes.get(fragment.stripe_id)
                if stripe is None or stripe.fragments.get(fragment.idx) != fragment:
                    continue  # died or moved meanwhile
                try:
                    data = fixer.rebuild(stripe, [fragment.idx])[fragment.idx]
                except errors.IOFailure:
                    return None
                report.fragments_rebuilt += 1
            batch.append(fragment_and_data(fragment, data, victim))
            batch_bytes += len(data)
            if batch_bytes >= BATCH_BYTES:
                copied += self._copy(batch, victim, media, report, tracker)
                batch, batch_bytes = [], 0
        copied += self._copy(batch, victim, media, report, tracker)
        left = self.catalog.read(
            lambda conn: conn.execute(
                select(func.count())
                .select_from(FRAGMENTS)
                .where(FRAGMENTS.c.zone_id == victim.zone_id)
            ).scalar_one()
        )
        return copied if left == 0 else None

    def _copy(
        self, batch, victim: Victim, media: Media, report: CleaningReport, tracker: Tracker
    ) -> int:
        if not batch:
            return 0
        band_class = victim.band_class or self.dp.default_class
        moved = relocate(media, self.catalog, band_class, batch, purpose="clean", use_reserve=True)
        nbytes = sum(len(d) for _f, d, _t in batch)
        report.fragments_copied += moved
        report.bytes_copied += nbytes
        share = nbytes * victim.live_bytes // victim.write_pointer if victim.write_pointer else 0
        report.live_bytes_moved += share
        tracker.add(share)
        self.limiter.spend(nbytes)
        return nbytes


def fragment_and_data(fragment, data: bytes, victim: Victim):
    """A cleaning move stays on the victim's drive: the stripe keeps its drives distinct."""
    return (fragment, data, victim.drive_id)


def clean(
    datapath,
    catalog: Catalog,
    *,
    progress: Progress | None = None,
    actor: str = "system",
    max_zones: int | None = None,
    target_free_zones: int | None = None,
    bytes_per_s: float | None = None,
) -> CleaningReport:
    return Cleaner(datapath, catalog, bytes_per_s=bytes_per_s).run(
        progress=progress, actor=actor, max_zones=max_zones, target_free_zones=target_free_zones
    )
