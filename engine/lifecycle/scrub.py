"""Scrub: read every fragment, verify its crc32c, repair bad ones from redundancy.

Inline stripes (small durable writes kept in the catalog, engine/datapath/core.py)
are verified too; they have no second copy, so a bad one is reported unrepairable.

Fragments are read in medium order (drive, zone, offset) so each drive streams.
A bad fragment (checksum mismatch, read error, or a zone shorter than the catalog
says) is rebuilt from the stripe's other fragments and appended to a repair band
on the same drive (zones are append-only: nothing is rewritten in place); the
fragment row then points at the new copy in one durable transaction, and the old
bytes become garbage for cleaning. Fragments on drives that are failed or missing
are rebuild's work and only counted here. Like Swift's auditor the scrub is rate
limited in bytes/s and fragments/s, and every repair or loss is an event.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import crc32c
from sqlalchemy import func, select

from engine.admin.events import record, record_in
from engine.base import errors
from engine.catalog.database import sql_all
from engine.catalog.models import Fragment
from engine.lifecycle.media import Media, media_for
from engine.lifecycle.pacing import Progress, RateLimiter, Tracker
from engine.lifecycle.repair import Reconstructor, fragment_row, load_stripes, relocate

FRAGMENTS = Fragment.__table__
BATCH = 500


@dataclass
class ScrubReport:
    fragments_checked: int = 0
    inline_checked: int = 0  # inline stripes verified (their bytes live in the catalog)
    bytes_checked: int = 0
    bad: int = 0
    repaired: int = 0
    unrepairable: int = 0
    skipped_unreadable_drive: int = 0
    elapsed_s: float = 0.0
    problems: list = field(default_factory=list)  # (stripe id, fragment idx, what)

    @property
    def mb_per_s(self) -> float:
        return self.bytes_checked / 1e6 / self.elapsed_s if self.elapsed_s else 0.0

    def to_dict(self) -> dict:
        data = asdict(self)
        data["mb_per_s"] = self.mb_per_s
        return data


class Scrubber:
    def __init__(
        self,
        datapath,
        catalog,
        *,
        bytes_per_s: float | None = None,
        fragments_per_s: float | None = None,
    ):
        self.dp = datapath
        self.catalog = catalog
        self.limiter = RateLimiter(bytes_per_s, fragments_per_s)

    def run(
        self,
        *,
        progress: Progress | None = None,
        actor: str = "system",
        drive_id: int | None = None,
    ) -> ScrubReport:
        """Verify every fragment (of one drive, or all); returns what was found and done."""
        started = time.monotonic()
        report = ScrubReport()
        media = media_for(self.dp)
        fixer = Reconstructor(media)
        self.dp.refresh_drive_states()

        def total(conn):
            query = select(
                func.count(), func.coalesce(func.sum(FRAGMENTS.c.length), 0)
            ).select_from(FRAGMENTS)
            if drive_id is not None:
                query = query.where(FRAGMENTS.c.drive_id == drive_id)
            return conn.execute(query).one()

        count, nbytes = self.catalog.read(total)
        tracker = Tracker(int(nbytes), progress, "scrub")
        after = 0
        try:
            while True:

                def page(conn, after=after):
                    query = (
                        select(FRAGMENTS)
                        .where(FRAGMENTS.c.id > after)
                        .order_by(FRAGMENTS.c.id)
                        .limit(BATCH)
                    )
                    if drive_id is not None:
                        query = query.where(FRAGMENTS.c.drive_id == drive_id)
                    return [fragment_row(r) for r in conn.execute(query)]

                batch = self.catalog.read(page)
                if not batch:
                    break
                after = batch[-1].id
                batch.sort(key=lambda f: (f.drive_id, f.zone_id, f.zone_offset))
                for fragment in batch:
                    self._check(fragment, media, fixer, report, actor)
                    tracker.add(fragment.length)
                    self.limiter.spend(fragment.length)
            if drive_id is None:
                self._check_inline(report, actor)
        finally:
            media.finish()
        report.elapsed_s = time.monotonic() - started
        tracker.finish(
            f"scrub: {report.fragments_checked} fragments and {report.inline_checked} inline "
            f"stripes checked, {report.bad} bad, {report.repaired} repaired, {report.unrepairable} "
            "unrepairable"
        )
        severity = "error" if report.unrepairable else "warning" if report.bad else "info"
        record(
            self.catalog,
            "scrub.run",
            f"scrub checked {report.fragments_checked} fragments and {report.inline_checked} "
            f"inline stripes ({report.bytes_checked / 1e6:.1f} MB): {report.bad} bad, "
            f"{report.repaired} repaired, {report.unrepairable} unrepairable, "
            f"{report.skipped_unreadable_drive} on unreadable drives",
            severity=severity,
            actor=actor,
            details={k: v for k, v in report.to_dict().items() if k != "problems"},
        )
        return report

    def _check(
        self, fragment, media: Media, fixer: Reconstructor, report: ScrubReport, actor: str
    ) -> None:
        if not media.readable(fragment.drive_id):
            report.skipped_unreadable_drive += 1
            return
        report.fragments_checked += 1
        try:
            data = media.read(
                fragment.drive_id, fragment.zone_id, fragment.zone_offset, fragment.length
            )
            report.bytes_checked += len(data)
            if crc32c.crc32c(data) == fragment.checksum:
                return
            what = "checksum mismatch"
        except (OSError, errors.FsError) as exc:
            what = f"read error: {exc}"
        # the stripe may have died or moved since this page was read: judge the current row
        stripes = self.catalog.read(lambda conn: load_stripes(conn, [fragment.stripe_id]))
        stripe = stripes.get(fragment.stripe_id)
        current = stripe.fragments.get(fragment.idx) if stripe else None
        if current is None or current != fragment:
            return
        report.bad += 1
        report.problems.append((fragment.stripe_id, fragment.idx, what))
        details = {
            "stripe_id": fragment.stripe_id,
            "fragment": fragment.idx,
            "drive_id": fragment.drive_id,
            "zone_id": fragment.zone_id,
            "zone_offset": fragment.zone_offset,
            "problem": what,
        }
        try:
            rebuilt = fixer.rebuild(stripe, [fragment.idx])[fragment.idx]
            targets = [fragment.drive_id] if media.drive(fragment.drive_id).writable() else []
            targets += media.writable_drives(exclude=stripe.drives())
            if not targets:
                raise errors.NoSpace(f"no drive can take a repaired fragment of stripe {stripe.id}")

            def also(conn, moved):
                if moved:
                    record_in(
                        conn,
                        "scrub.repair",
                        f"scrub repaired stripe {stripe.id} fragment {fragment.idx} "
                        f"on drive {fragment.drive_id} ({what})",
                        severity="warning",
                        actor=actor,
                        details={
                            **details,
                            "new_drive_id": moved[0][1].drive_id,
                            "new_zone_id": moved[0][1].zone_id,
                        },
                    )

            if relocate(
                media,
                self.catalog,
                stripe.band_class,
                [(fragment, rebuilt, targets[0])],
                purpose="repair",
                use_reserve=True,
                also=also,
            ):
                report.repaired += 1
        except (OSError, errors.FsError) as exc:
            report.unrepairable += 1
            record(
                self.catalog,
                "scrub.unrepairable",
                f"scrub could not repair stripe {fragment.stripe_id} "
                f"fragment {fragment.idx}: {exc}",
                severity="error",
                actor=actor,
                details={**details, "error": str(exc)},
            )

    def _check_inline(self, report: ScrubReport, actor: str) -> None:
        """Verify inline stripes; with no second copy, a bad one can only be reported."""
        after = 0
        while True:
            rows = self.catalog.read(
                lambda conn, after=after: sql_all(
                    conn,
                    "SELECT stripe_id, length, checksum, data FROM inline_data WHERE stripe_id > ? "
                    "ORDER BY stripe_id LIMIT ?",
                    (after, BATCH),
                )
            )
            if not rows:
                return
            after = rows[-1][0]
            for stripe_id, length, checksum, data in rows:
                report.inline_checked += 1
                report.bytes_checked += len(data)
                self.limiter.spend(len(data))
                if len(data) == length and crc32c.crc32c(data) == checksum:
                    continue
                what = (
                    f"inline bytes: {len(data)} of {length} with crc32c "
                    f"{crc32c.crc32c(data):#010x}, expected {checksum:#010x}"
                )
                report.bad += 1
                report.unrepairable += 1
                report.problems.append((stripe_id, 0, what))
                record(
                    self.catalog,
                    "scrub.unrepairable",
                    f"scrub found inline stripe {stripe_id} damaged ({what}); "
                    "its bytes are kept only in the catalog, so there is nothing to repair it from",
                    severity="error",
                    actor=actor,
                    details={"stripe_id": stripe_id, "problem": what},
                )


def scrub(
    datapath,
    catalog,
    *,
    progress: Progress | None = None,
    actor: str = "system",
    bytes_per_s: float | None = None,
    fragments_per_s: float | None = None,
    drive_id: int | None = None,
) -> ScrubReport:
    """Verify every fragment (of one drive, or all) and repair the bad ones."""
    return Scrubber(
        datapath, catalog, bytes_per_s=bytes_per_s, fragments_per_s=fragments_per_s
    ).run(progress=progress, actor=actor, drive_id=drive_id)
