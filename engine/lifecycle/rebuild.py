"""Rebuild and drain: restore full redundancy after a drive fails, or empty a drive.

- A fragment on a ``failed`` or ``removed`` drive (or one whose drive cannot be
  read) is rebuilt from the stripe's other fragments (pyeclib reconstruct, or a
  good replica) and written to a writable drive that holds no other fragment of
  the stripe, so every stripe keeps its k+m fragments on k+m different drives.
- A fragment on a ``draining`` drive is copied as it is (checksum verified; rebuilt
  if bad) to such a drive. When a draining drive holds no fragment any more it
  becomes ``removed`` (event ``drive.drained``).
- A stripe born short of its width (written while drives or hosts were away, or one of
  its appends failed: the write quorum let it commit) gets its absent fragments rebuilt
  and recorded, spread over hosts the same way (not in a drain, which moves one drive's).

Stripes are processed in batches: the batch's fragments are written in parallel
(one writer per drive) and repointed in one durable transaction. The job is rate
limited (bytes/s), reports progress with an ETA, and ends with the redundancy
status (how many stripes still run with reduced redundancy).
"""

from __future__ import annotations

import time
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from engine.admin.events import record, record_in
from engine.base import errors
from engine.base.ordered_lock import lock
from engine.catalog.database import Catalog
from engine.catalog.models import Drive, Fragment, Stripe
from engine.coding.erasure import INLINE
from engine.lifecycle import drives as drive_states
from engine.lifecycle.hosts import host_name, spread_targets
from engine.lifecycle.media import Media, media_for
from engine.lifecycle.pacing import Progress, RateLimiter, Tracker
from engine.lifecycle.repair import Reconstructor, StripeRow, complete, load_stripes, relocate

FRAGMENTS = Fragment.__table__
DRIVES = Drive.__table__
STRIPES = Stripe.__table__
LOST_STATES = (drive_states.FAILED, drive_states.REMOVED)
STRIPES_PER_BATCH = 128
STRIPE_THREADS = 4


@dataclass
class RebuildReport:
    stripes: int = 0  # stripes that had something to rebuild or move
    fragments_rebuilt: int = 0  # reconstructed from the other fragments
    fragments_moved: int = 0  # copied off a draining drive
    bytes_written: int = 0
    unrecoverable: list = field(default_factory=list)  # stripe ids with fewer than k good fragments
    unplaced: int = 0  # fragments with no drive to go to (too few drives or no space)
    drives_drained: list = field(default_factory=list)
    # bytes written onto each host: where a host's rebuild or drain sends its fragments
    written_by_host: dict = field(default_factory=dict)
    elapsed_s: float = 0.0
    status: dict = field(default_factory=dict)  # redundancy status afterwards

    @property
    def mb_per_s(self) -> float:
        return self.bytes_written / 1e6 / self.elapsed_s if self.elapsed_s else 0.0

    def to_dict(self) -> dict:
        data = asdict(self)
        data["mb_per_s"] = self.mb_per_s
        return data


_STRIPE_POOL: ThreadPoolExecutor | None = None
_STRIPE_POOL_LOCK = lock("lifecycle.stripe_pool")


def _stripe_pool() -> ThreadPoolExecutor:
    global _STRIPE_POOL
    with _STRIPE_POOL_LOCK:
        if _STRIPE_POOL is None:
            _STRIPE_POOL = ThreadPoolExecutor(STRIPE_THREADS, thread_name_prefix="shingle-rebuild")
        return _STRIPE_POOL


def pending_work(
    catalog: Catalog, drives: int | Collection[int] | None = None
) -> tuple[int, int, int]:
    """(stripes, fragments, bytes) waiting on failed, removed or draining drives (on ``drives``
    only, one id or several, when given)."""
    drive_ids = [drives] if isinstance(drives, int) else None if drives is None else list(drives)

    def work(conn):
        query = (
            select(
                func.count(func.distinct(FRAGMENTS.c.stripe_id)),
                func.count(),
                func.coalesce(func.sum(FRAGMENTS.c.length), 0),
            )
            .select_from(FRAGMENTS.join(DRIVES, DRIVES.c.id == FRAGMENTS.c.drive_id))
            .where(DRIVES.c.state.in_(LOST_STATES + (drive_states.DRAINING,)))
        )
        if drive_ids is not None:
            query = query.where(FRAGMENTS.c.drive_id.in_(drive_ids))
        return tuple(int(v) for v in conn.execute(query).one())

    return catalog.read(work)


def short_stripes_query():
    """Live stripes on drives with fewer fragments than their width: (id, absent fragments,
    bytes of those)."""
    count = func.count(FRAGMENTS.c.id)
    width = STRIPES.c.k + STRIPES.c.m
    return (
        select(
            STRIPES.c.id,
            (width - count).label("absent"),
            ((width - count) * STRIPES.c.fragment_length).label("nbytes"),
        )
        .select_from(STRIPES.outerjoin(FRAGMENTS, FRAGMENTS.c.stripe_id == STRIPES.c.id))
        .where(STRIPES.c.live_bytes > 0, STRIPES.c.layout != INLINE)
        .group_by(STRIPES.c.id, STRIPES.c.k, STRIPES.c.m, STRIPES.c.fragment_length)
        .having(count < width)
    )


def short_work(conn: Connection) -> tuple[int, int, int]:
    """(stripes, fragments, bytes) absent from stripes born short of their width."""
    found = short_stripes_query().subquery()
    row = conn.execute(
        select(
            func.count(),
            func.coalesce(func.sum(found.c.absent), 0),
            func.coalesce(func.sum(found.c.nbytes), 0),
        ).select_from(found)
    ).one()
    stripes, fragments, nbytes = (int(v) for v in row)
    return stripes, fragments, nbytes


class Rebuilder:
    def __init__(self, datapath, catalog: Catalog, *, bytes_per_s: float | None = None):
        self.dp = datapath
        self.catalog = catalog
        self.limiter = RateLimiter(bytes_per_s)

    def run(
        self,
        *,
        progress: Progress | None = None,
        actor: str = "system",
        drive_id: int | None = None,
        drive_ids: Collection[int] | None = None,
    ) -> RebuildReport:
        """Everything waiting on failed, removed or draining drives; only what lies on
        ``drive_id`` or ``drive_ids`` when one is given (a drive's or a host's drain)."""
        started = time.monotonic()
        self.dp.refresh_drive_states()
        report = RebuildReport()
        only = {drive_id} if drive_id is not None else set(drive_ids) if drive_ids else None
        _stripes, _fragments, nbytes = pending_work(self.catalog, only)
        if only is None:
            nbytes += self.catalog.read(short_work)[2]
        tracker = Tracker(nbytes, progress, "rebuild")
        media = media_for(self.dp)
        fixer = Reconstructor(media)
        done: set[int] = set()  # stripes already handled (or given up) in this run
        try:
            while True:

                def next_batch(conn):
                    query = (
                        select(FRAGMENTS.c.stripe_id)
                        .distinct()
                        .select_from(FRAGMENTS.join(DRIVES, DRIVES.c.id == FRAGMENTS.c.drive_id))
                        .where(DRIVES.c.state.in_(LOST_STATES + (drive_states.DRAINING,)))
                        .order_by(FRAGMENTS.c.stripe_id)
                    )
                    if only is not None:
                        query = query.where(FRAGMENTS.c.drive_id.in_(list(only)))
                    if done:
                        query = query.where(FRAGMENTS.c.stripe_id > max(done))
                    ids = list(conn.execute(query.limit(STRIPES_PER_BATCH)).scalars())
                    states = dict(conn.execute(select(DRIVES.c.id, DRIVES.c.state)).all())
                    return load_stripes(conn, ids), states

                stripes, states = self.catalog.read(next_batch)
                if not stripes:
                    break
                done.update(stripes)
                self._batch(list(stripes.values()), states, media, fixer, report, tracker, only)
            if only is None:
                self._complete_short(done, media, fixer, report, tracker)
            self._finish_drains(report, actor)
        finally:
            media.finish()
        report.elapsed_s = time.monotonic() - started
        report.status = drive_states.redundancy_status(self.catalog).to_dict()
        tracker.finish(
            f"rebuild: {report.fragments_rebuilt} fragments rebuilt, {report.fragments_moved} "
            f"moved, {report.mb_per_s:.1f} MB/s; {report.status['reduced']} stripes with reduced "
            "redundancy"
        )
        severity = "error" if report.unrecoverable else "warning" if report.unplaced else "info"
        record(
            self.catalog,
            "rebuild.run",
            f"rebuild: {report.stripes} stripes, {report.fragments_rebuilt} fragments rebuilt, "
            f"{report.fragments_moved} moved, {report.bytes_written / 1e6:.1f} MB in "
            f"{report.elapsed_s:.1f} s; {len(report.unrecoverable)} unrecoverable, "
            f"{report.unplaced} unplaced; {report.status['reduced']} stripes still with reduced "
            "redundancy",
            severity=severity,
            actor=actor,
            details=report.to_dict(),
        )
        return report

    def _complete_short(
        self, done: set[int], media: Media, fixer: Reconstructor, report, tracker: Tracker
    ) -> None:
        """Stripes born short of their width, not among ``done`` (the stripes the lost drives'
        pass handled, absent fragments included): their absent fragments rebuilt."""
        after = 0
        while True:

            def next_batch(conn, after=after):
                query = (
                    short_stripes_query()
                    .where(STRIPES.c.id > after)
                    .order_by(STRIPES.c.id)
                    .limit(STRIPES_PER_BATCH)
                )
                ids = [r.id for r in conn.execute(query)]
                states = dict(conn.execute(select(DRIVES.c.id, DRIVES.c.state)).all())
                return ids, load_stripes(conn, [i for i in ids if i not in done]), states

            ids, stripes, states = self.catalog.read(next_batch)
            if not ids:
                return
            after = max(ids)
            if stripes:
                self._batch(list(stripes.values()), states, media, fixer, report, tracker, None)

    def _prepare(self, stripe, states, media: Media, fixer: Reconstructor, only: set[int] | None):
        """(lost indexes, {index: bytes} to write) for one stripe (its absent fragments too,
        unless only some drives' are wanted); raises IOFailure if beyond repair."""
        lost, drain = [], {}
        for idx, fragment in stripe.fragments.items():
            state = states.get(fragment.drive_id)
            if only is not None and fragment.drive_id not in only:
                continue
            if state in LOST_STATES or (
                state == drive_states.DRAINING and not media.readable(fragment.drive_id)
            ):
                lost.append(idx)
            elif state == drive_states.DRAINING:
                data = fixer.fetch(fragment)
                if data is None:
                    lost.append(idx)
                else:
                    drain[idx] = data
        if only is None:
            lost += stripe.absent()
        rebuilt = fixer.rebuild(stripe, lost, good=drain) if lost else {}
        return lost, {**drain, **rebuilt}

    def _batch(
        self,
        stripes,
        states,
        media: Media,
        fixer: Reconstructor,
        report: RebuildReport,
        tracker: Tracker,
        only: set[int] | None,
    ) -> None:
        moves_by_class: dict[str, list] = {}  # fragments to repoint
        adds_by_class: dict[str, list] = {}  # fragments a stripe was born without

        def prepare(stripe):
            try:
                return self._prepare(stripe, states, media, fixer, only)
            except errors.IOFailure as exc:
                return exc

        # stripes are read and decoded in parallel (each stripe's fragment reads are parallel too)
        for n, (stripe, result) in enumerate(
            zip(stripes, _stripe_pool().map(prepare, stripes), strict=True)
        ):
            if isinstance(result, errors.IOFailure):
                report.stripes += 1
                report.unrecoverable.append(stripe.id)
                continue
            lost, wanted = result
            if not wanted:
                continue
            report.stripes += 1
            candidates = self._targets(stripe, wanted, media, n)
            for target, (idx, data) in zip(candidates, sorted(wanted.items()), strict=False):
                if idx in stripe.fragments:
                    moves_by_class.setdefault(stripe.band_class, []).append(
                        (stripe.fragments[idx], data, target, idx in lost)
                    )
                else:
                    adds_by_class.setdefault(stripe.band_class, []).append(
                        (stripe, idx, data, target)
                    )
            report.unplaced += max(len(wanted) - len(candidates), 0)
        for band_class, adds in adds_by_class.items():
            self._complete(media, band_class, adds, report, tracker)
        for band_class, moves in moves_by_class.items():
            try:
                moved = relocate(
                    media,
                    self.catalog,
                    band_class,
                    [(f, d, t) for f, d, t, _r in moves],
                    purpose="rebuild",
                )
            except errors.NoSpace:
                report.unplaced += len(moves)
                continue
            nbytes = sum(len(d) for _f, d, _t, _r in moves)
            report.bytes_written += nbytes
            for _f, data, target, _r in moves:
                host = host_name(media.host_of(target))
                report.written_by_host[host] = report.written_by_host.get(host, 0) + len(data)
            if moved:
                report.fragments_rebuilt += sum(1 for *_x, r in moves if r)
                report.fragments_moved += sum(1 for *_x, r in moves if not r)
            tracker.add(nbytes)
            self.limiter.spend(nbytes)

    @staticmethod
    def _targets(stripe: StripeRow, wanted: dict, media: Media, n: int) -> list[int]:
        """Drives for the ``wanted`` fragments of the batch's ``n``-th stripe, best first."""
        candidates = media.writable_drives(exclude=stripe.drives(), want=len(wanted))
        if not candidates:
            return candidates
        # spread the batch over the drives with the most room (an empty replacement drive
        # takes everything until it has no more room than the others)
        most = media.empty_zones(candidates[0])
        top = [d for d in candidates if media.empty_zones(d) >= most - 1]
        shift = n % len(top)
        candidates = top[shift:] + top[:shift] + candidates[len(top) :]
        # and over hosts: never two of the stripe's fragments on one host while another
        # host holds fewer (the failure domains placement keeps, engine/lifecycle/hosts.py)
        held: dict[str, int] = {}
        for idx, fragment in stripe.fragments.items():
            if idx not in wanted:
                host = media.host_of(fragment.drive_id)
                held[host] = held.get(host, 0) + 1
        return spread_targets(candidates, media.host_of, held, len(wanted))

    def _complete(
        self,
        media: Media,
        band_class: str,
        adds: list[tuple[StripeRow, int, bytes, int]],
        report: RebuildReport,
        tracker: Tracker,
    ) -> None:
        try:
            added = complete(media, self.catalog, band_class, adds, purpose="rebuild")
        except errors.NoSpace:
            report.unplaced += len(adds)
            return
        nbytes = sum(len(data) for _s, _i, data, _t in adds)
        report.bytes_written += nbytes
        for _s, _i, data, target in adds:
            host = host_name(media.host_of(target))
            report.written_by_host[host] = report.written_by_host.get(host, 0) + len(data)
        report.fragments_rebuilt += added
        tracker.add(nbytes)
        self.limiter.spend(nbytes)

    def _finish_drains(self, report: RebuildReport, actor: str) -> None:
        def work(conn):
            drained = []
            draining = (
                conn.execute(select(DRIVES.c.id).where(DRIVES.c.state == drive_states.DRAINING))
                .scalars()
                .all()
            )
            for drive_id in draining:
                left = conn.execute(
                    select(func.count())
                    .select_from(FRAGMENTS)
                    .where(FRAGMENTS.c.drive_id == drive_id)
                ).scalar_one()
                if left:
                    continue
                drive_states.set_drive_state_in(
                    conn,
                    drive_id,
                    drive_states.REMOVED,
                    actor=actor,
                    reason="drained: no fragment left on it",
                )
                record_in(
                    conn,
                    "drive.drained",
                    f"drive {drive_id} is drained and removed from the pool",
                    actor=actor,
                    details={"drive_id": drive_id},
                )
                drained.append(drive_id)
            return drained

        report.drives_drained = self.catalog.run(work)
        if report.drives_drained:
            self.dp.refresh_drive_states()


def rebuild(
    datapath,
    catalog: Catalog,
    *,
    progress: Progress | None = None,
    actor: str = "system",
    bytes_per_s: float | None = None,
) -> RebuildReport:
    """Rebuild every fragment on failed/removed drives and move everything off draining ones."""
    return Rebuilder(datapath, catalog, bytes_per_s=bytes_per_s).run(progress=progress, actor=actor)


def drain_drive(
    datapath,
    catalog: Catalog,
    drive: int | str,
    *,
    progress: Progress | None = None,
    actor: str = "system",
    bytes_per_s: float | None = None,
) -> RebuildReport:
    """Mark a drive draining and move every fragment off it; it ends ``removed`` when empty."""
    old, _new = drive_states.start_drain(catalog, drive, actor=actor)
    drive_id = drive_states.get_drive(catalog, drive).id
    datapath.refresh_drive_states()
    return Rebuilder(datapath, catalog, bytes_per_s=bytes_per_s).run(
        progress=progress, actor=actor, drive_id=drive_id
    )
