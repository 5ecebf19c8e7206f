"""Rebuild and drain: restore full redundancy after a drive fails, or empty a drive.

- A fragment on a ``failed`` or ``removed`` drive (or one whose drive cannot be
  read) is rebuilt from the stripe's other fragments (pyeclib reconstruct, or a
  good replica) and written to a writable drive that holds no other fragment of
  the stripe, so every stripe keeps its k+m fragments on k+m different drives.
- A fragment on a ``draining`` drive is copied as it is (checksum verified; rebuilt
  if bad) to such a drive. When a draining drive holds no fragment any more it
  becomes ``removed`` (event ``drive.drained``).

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

from engine.admin.events import record, record_in
from engine.base import errors
from engine.base.ordered_lock import lock
from engine.catalog.database import Catalog
from engine.catalog.models import Drive, Fragment
from engine.lifecycle import drives as drive_states
from engine.lifecycle.hosts import host_name, spread_targets
from engine.lifecycle.media import Media, media_for
from engine.lifecycle.pacing import Progress, RateLimiter, Tracker
from engine.lifecycle.repair import Reconstructor, load_stripes, relocate

FRAGMENTS = Fragment.__table__
DRIVES = Drive.__table__
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

    def _prepare(self, stripe, states, media: Media, fixer: Reconstructor, only: set[int] | None):
        """(lost indexes, {index: bytes} to write) for one stripe; raises
        IOFailure if beyond repair."""
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
        moves_by_class: dict[str, list] = {}

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
            candidates = media.writable_drives(exclude=stripe.drives(), want=len(wanted))
            if candidates:
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
                candidates = spread_targets(candidates, media.host_of, held, len(wanted))
            for target, (idx, data) in zip(candidates, sorted(wanted.items()), strict=False):
                moves_by_class.setdefault(stripe.band_class, []).append(
                    (stripe.fragments[idx], data, target, idx in lost)
                )
            report.unplaced += max(len(wanted) - len(candidates), 0)
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
