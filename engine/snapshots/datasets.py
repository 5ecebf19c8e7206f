"""What the datasets page and API show: the datasets, and what a snapshot change would do.

A dataset is a directory with snapshots (it has a ``.snapshots`` directory) or a snapshot
schedule. ``preview`` says, before anything changes, what creating, deleting or rolling back
a snapshot does: the files and bytes it holds, what deleting frees (its unique bytes), which
paths a rollback removes, restores and reverts (the snapshot's diff against the live tree)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from sqlalchemy import select

from engine.base import errors
from engine.base.units import format_size
from engine.catalog.models import REG, SnapshotDir
from engine.namespace.paths import join_path, split_path, walk_subtree
from engine.namespace.readonly import SNAPSHOT_DIR_NAME
from engine.snapshots.schedules import SnapshotScheduler, name_pattern
from engine.snapshots.service import SnapshotInfo, Snapshots

SNAPSHOT_DIRS = SnapshotDir.__table__
ACTIONS = ("create", "delete", "rollback")
PREVIEW_PATHS = 200  # paths listed per kind in a rollback preview; the rest are counted
CREATE_WALK_LIMIT = 200_000  # entries a create preview counts before it stops


@dataclass(frozen=True)
class Dataset:
    path: str
    snapshots: int
    schedules: int
    referenced_bytes: int  # by all its snapshots (shared bytes count once per snapshot)
    unique_bytes: int  # sum of each snapshot's unique bytes
    pending_bytes: int = 0  # what the reclaim of its deleted snapshots will still free
    pending_deletions: int = 0  # deleted snapshots not reclaimed yet (some maybe not counted)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class SnapshotPreview:
    action: str  # create | delete | rollback
    path: str
    name: str
    summary: str
    files: int = 0
    referenced_bytes: int = 0
    frees_bytes: int = 0  # delete: what it frees (in the background reclaim)
    removed: list = field(default_factory=list)  # rollback: paths made since the snapshot
    restored: list = field(default_factory=list)  # paths gone since, that come back
    reverted: list = field(default_factory=list)  # paths changed since, that go back
    more: int = 0  # paths beyond PREVIEW_PATHS per kind, not listed
    schedule_id: int | None = None  # delete: the schedule that named it, if one did

    def to_dict(self) -> dict:
        return asdict(self)


def clean_path(path: str) -> str:
    return join_path(split_path(path, "dataset path"))


def split_snapshot_path(path: str) -> tuple[str, str]:
    """(dataset, snapshot name) of a snapshot's path, ``DIR/.snapshots/NAME``."""
    parts = split_path(path, "snapshot")
    if len(parts) < 2 or parts[-2] != SNAPSHOT_DIR_NAME:
        raise errors.InvalidArgument(
            f"snapshot {path!r}: expected DIR/{SNAPSHOT_DIR_NAME}/NAME, e.g. "
            f"/datasets/web/{SNAPSHOT_DIR_NAME}/monday"
        )
    return join_path(parts[:-2]), parts[-1]


def dataset_paths(namespace, scheduler: SnapshotScheduler) -> list[str]:
    """Every directory with snapshots or a schedule, sorted."""
    inos = namespace.catalog.read(
        lambda conn: list(conn.execute(select(SNAPSHOT_DIRS.c.dataset_ino)).scalars())
    )
    paths = {s.path for s in scheduler.list_schedules()}
    for ino in inos:
        try:
            paths.add(namespace.path_of(ino))
        except errors.NotFound:
            continue  # in a snapshot's frozen tree, or not linked any more
    return sorted(paths)


def datasets(namespace, scheduler: SnapshotScheduler, snapshots: Snapshots) -> list[Dataset]:
    schedules = scheduler.list_schedules()
    out = []
    for path in dataset_paths(namespace, scheduler):
        try:
            held = snapshots.list(path)
            pending = snapshots.pending(path)
        except errors.FsError:
            held, pending = [], []  # a schedule's dataset that is gone: the schedule says so
        out.append(
            Dataset(
                path,
                len(held),
                sum(1 for s in schedules if s.path == path),
                sum(s.referenced_bytes for s in held),
                sum(s.unique_bytes for s in held),
                sum(p.pending_bytes or 0 for p in pending),
                len(pending),
            )
        )
    return out


def find(snapshots: Snapshots, path: str, name: str) -> SnapshotInfo:
    for info in snapshots.list(path):
        if info.name == name:
            return info
    raise errors.NotFound(f"no snapshot {name!r} of {path}")


def preview(
    namespace, snapshots: Snapshots, scheduler: SnapshotScheduler, action: str, path: str, name: str
) -> SnapshotPreview:
    """What ``action`` on snapshot ``name`` of ``path`` would do; nothing changes."""
    path = clean_path(path)
    if action == "create":
        return _preview_create(namespace, snapshots, path, name)
    if action not in ACTIONS:
        raise errors.InvalidArgument(f"action {action!r}: expected one of {', '.join(ACTIONS)}")
    if action == "delete":  # what it frees, counted now (the stored figures may be old)
        snapshots.recount_space(path, name=name)
    info = find(snapshots, path, name)
    if action == "delete":
        owner = next(
            (
                s.id
                for s in scheduler.list_schedules(path)
                if name_pattern(s.prefix).fullmatch(name)
            ),
            None,
        )
        summary = (
            f"Deleting snapshot {name} of {path} frees {format_size(info.unique_bytes)} (the "
            "data only it references), in the background: pending until then; of the "
            f"{format_size(info.referenced_bytes)} it references, the rest stays with the live "
            "files, clones and other snapshots. "
            f"{path}/.snapshots/{name} goes away. This cannot be undone."
        )
        if owner is not None:
            summary += f" Schedule {owner} took it; the schedule goes on."
        return SnapshotPreview(
            "delete",
            path,
            name,
            summary,
            files=info.files,
            referenced_bytes=info.referenced_bytes,
            frees_bytes=info.unique_bytes,
            schedule_id=owner,
        )
    changes = snapshots.diff(path, name)  # from the snapshot to the live tree
    kinds: dict[str, list[str]] = {"added": [], "removed": [], "changed": []}
    for entry in changes:
        kinds[entry.change].append(entry.path)
    more = sum(max(0, len(v) - PREVIEW_PATHS) for v in kinds.values())
    summary = (
        f"Rolling {path} back to snapshot {name} removes {len(kinds['added'])} paths made since, "
        f"restores {len(kinds['removed'])} removed since and reverts {len(kinds['changed'])} "
        "changed since. The current files' data is freed where nothing else references it, and "
        "files open on clients go stale. Other snapshots stay. This cannot be undone: take a "
        "snapshot first to keep the current state."
    )
    return SnapshotPreview(
        "rollback",
        path,
        name,
        summary,
        files=info.files,
        referenced_bytes=info.referenced_bytes,
        removed=kinds["added"][:PREVIEW_PATHS],
        restored=kinds["removed"][:PREVIEW_PATHS],
        reverted=kinds["changed"][:PREVIEW_PATHS],
        more=more,
    )


def _preview_create(namespace, snapshots: Snapshots, path: str, name: str) -> SnapshotPreview:
    from engine.namespace.common import check_name

    check_name(name)
    if any(s.name == name for s in snapshots.list(path)):
        raise errors.Exists(f"snapshot {name!r} of {path} exists")
    files = size = 0
    for n, attr in enumerate(walk_subtree(namespace, namespace.resolve(path))):
        if n >= CREATE_WALK_LIMIT:
            break
        if attr.type == REG:
            files += 1
            size += attr.size
    counted = "at least " if files and n >= CREATE_WALK_LIMIT else ""
    summary = (
        f"Snapshot {name} of {path} will hold {counted}{files} file{'' if files == 1 else 's'} "
        f"({format_size(size)}) as "
        f"they are now, read-only at {path}/.snapshots/{name}. No data is copied: it takes "
        "space only as the live files change."
    )
    return SnapshotPreview("create", path, name, summary, files=files, referenced_bytes=size)
