"""Archiving a snapshot to the cold tier: its unique stripes rewritten as cold stripes.

A snapshot's files share stripes with the live tree, clones and other snapshots (invariant 9:
a stripe's ``live_bytes`` is the sum of every extent referencing it). Moving a shared stripe
would have to move every reference with it, i.e. the live files too, which is not archiving a
snapshot; rewriting only the snapshot's extents of a shared stripe would keep the old stripe
alive for the others and add a cold copy: more space, nothing freed. So the archive moves the
stripes only this snapshot references (those whose whole reference count comes from its files:
what ``unique_bytes`` counts) and leaves shared ones where they are, reporting their bytes.

The move is tiering's (engine/lifecycle/tiering.py ``Tiering.move_file`` limited to those
stripes): read through the old extents, write cold stripes through the data path's writers,
swap the extents in one transaction that checks they did not change. So it needs the data
path: it runs in the daemon as a ``snapshot-archive`` job. Later tiering rounds treat the
archived files as any cold file (read often, they come back to warm)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from sqlalchemy import func, select

from engine.admin.events import record
from engine.base import errors
from engine.base.units import format_size
from engine.catalog.models import REG, Extent, Stripe
from engine.datapath.accounting import chunks
from engine.lifecycle.media import media_for
from engine.lifecycle.pacing import Progress, Tracker
from engine.lifecycle.tiering import COLD, Tiering
from engine.namespace.paths import join_path, split_path, walk_subtree
from engine.namespace.readonly import SNAPSHOT_DIR_NAME
from engine.snapshots.service import Snapshots

EXTENTS = Extent.__table__
STRIPES = Stripe.__table__


@dataclass
class ArchiveReport:
    path: str
    name: str
    files: int = 0  # regular files in the snapshot
    files_moved: int = 0
    unique_bytes: int = 0  # referenced in stripes only this snapshot references
    shared_bytes: int = 0  # referenced in stripes others reference too: left where they are
    already_cold_bytes: int = 0  # unique bytes that were cold already
    bytes_moved: int = 0  # user bytes rewritten to cold
    media_bytes_written: int = 0
    elapsed_s: float = 0.0
    skipped: list = field(default_factory=list)  # files changed or gone meanwhile

    def to_dict(self) -> dict:
        return asdict(self)


def _references(catalog, inos: list[int]) -> tuple[dict[int, int], dict[int, tuple[int, str]]]:
    """(stripe -> bytes the files reference in it, stripe -> (its live bytes, band class))."""

    def work(conn):
        refs: dict[int, int] = {}
        stripes: dict[int, tuple[int, str]] = {}
        for part in chunks(inos):
            for sid, n, live, band_class in conn.execute(
                select(
                    EXTENTS.c.stripe_id,
                    func.sum(EXTENTS.c.length),
                    STRIPES.c.live_bytes,
                    STRIPES.c.band_class,
                )
                .select_from(EXTENTS.join(STRIPES, STRIPES.c.id == EXTENTS.c.stripe_id))
                .where(EXTENTS.c.ino.in_(part))
                .group_by(EXTENTS.c.stripe_id, STRIPES.c.live_bytes, STRIPES.c.band_class)
            ):
                refs[sid] = refs.get(sid, 0) + int(n)
                stripes[sid] = (int(live), band_class)
        return refs, stripes

    return catalog.read(work)


def _files_in(catalog, inos: list[int], stripe_ids: set[int]) -> list[int]:
    """The files among ``inos`` with an extent in one of ``stripe_ids``."""

    def work(conn):
        found: set[int] = set()
        for part in chunks(inos):
            for ino, sid in conn.execute(
                select(EXTENTS.c.ino, EXTENTS.c.stripe_id).where(EXTENTS.c.ino.in_(part))
            ):
                if sid in stripe_ids:
                    found.add(ino)
        return sorted(found)

    return catalog.read(work)


def archive_snapshot(
    namespace,
    datapath,
    path: str,
    name: str,
    *,
    progress: Progress | None = None,
    actor: str = "system",
) -> ArchiveReport:
    """Move the stripes only snapshot ``name`` of dataset ``path`` references to the cold
    class; shared stripes stay (their bytes are in the report's ``shared_bytes``)."""
    if datapath is None:
        raise errors.InvalidArgument("archiving a snapshot moves data: it needs the data path")
    if COLD not in datapath.policies:
        raise errors.InvalidArgument(
            f"no {COLD!r} band class configured: expected one of {', '.join(datapath.policies)}"
        )
    started = time.monotonic()
    # a deleted snapshot's references not reclaimed yet would count as shared and stay
    Snapshots(namespace).finish_deletions()
    dataset = join_path(split_path(path, "dataset path"))
    report = ArchiveReport(dataset, name)
    root = namespace.resolve(f"{dataset.rstrip('/')}/{SNAPSHOT_DIR_NAME}/{name}")
    if not namespace.is_read_only(root.ino):
        raise errors.NotFound(f"no snapshot {name!r} of {dataset}")
    inos = sorted({a.ino for a in walk_subtree(namespace, root) if a.type == REG})
    report.files = len(inos)
    refs, stripes = _references(namespace.catalog, inos)
    unique = {sid for sid, n in refs.items() if n >= stripes[sid][0]}
    report.shared_bytes = sum(n for sid, n in refs.items() if sid not in unique)
    report.unique_bytes = sum(refs[sid] for sid in unique)
    to_move = {sid for sid in unique if stripes[sid][1] != COLD}
    report.already_cold_bytes = report.unique_bytes - sum(refs[sid] for sid in to_move)
    movers = _files_in(namespace.catalog, inos, to_move)
    tracker = Tracker(len(movers), progress, "archive", unit="files")
    tiering = Tiering(namespace, datapath, namespace.catalog)
    media = media_for(datapath)
    try:
        for ino in movers:
            try:
                moved, written = tiering.move_file(ino, COLD, media, only_stripes=to_move)
            except (errors.StaleHandle, errors.NotFound):
                moved = written = 0  # the snapshot was deleted meanwhile
            if moved:
                report.files_moved += 1
                report.bytes_moved += moved
                report.media_bytes_written += written
            else:
                report.skipped.append(ino)
            tracker.add(1)
    finally:
        media.finish()
    report.elapsed_s = time.monotonic() - started
    message = (
        f"snapshot {name} of {dataset} archived: {format_size(report.bytes_moved)} of "
        f"{report.files_moved} files moved to {COLD}"
        + (
            f", {format_size(report.already_cold_bytes)} cold already"
            if report.already_cold_bytes
            else ""
        )
        + (
            f"; {format_size(report.shared_bytes)} shared with the live tree, clones or other "
            "snapshots stay where they are"
            if report.shared_bytes
            else ""
        )
    )
    tracker.finish(message)
    record(namespace.catalog, "snapshot.archive", message, actor=actor, details=report.to_dict())
    return report
