"""Trash: deleted entries wait in a per-export trash directory until they are purged.

Layout: each export has ``<export path>/.trash`` (root-owned, mode 0700, so clients
cannot browse what others deleted). A trashed entry is renamed there, in one
namespace transaction, as ``<UTC timestamp>-<name>``; its original path, deletion
time and actor are extended attributes on the entry's inode (``trusted.shingle.trash.*``),
so the trash needs no table of its own and survives a catalog copy.

Purging (and any permanent delete of a subtree, e.g. by retention) first renames
the entry into ``.trash/.purging`` (one transaction: it vanishes from every listing
at once) and only then removes its subtree file by file through the namespace API.
A crash in the middle leaves the rest in ``.purging``; the next purge finishes it.
Paths under no export use the trash at the namespace root with DEFAULT_TRASH_DAYS.
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from sqlalchemy import select

from engine.admin.events import record
from engine.base import errors
from engine.catalog.database import Catalog
from engine.catalog.models import DIR, Export
from engine.namespace import NAME_MAX, ROOT, Attr, Namespace
from engine.namespace.paths import iter_dir, join_path, remove_tree, split_path

EXPORTS = Export.__table__

TRASH_DIR = ".trash"
PURGING_DIR = ".purging"
TRASH_MODE = 0o700
DEFAULT_TRASH_DAYS = 7
XATTR_ORIGIN = "trusted.shingle.trash.origin"
XATTR_DELETED = "trusted.shingle.trash.deleted_ns"
XATTR_ACTOR = "trusted.shingle.trash.actor"
TRASH_XATTRS = (XATTR_ORIGIN, XATTR_DELETED, XATTR_ACTOR)

Progress = Callable[[int, int, str], None]


def _stamp(ns: int) -> str:
    return (
        time.strftime("%Y%m%dT%H%M%S", time.gmtime(ns // 1_000_000_000))
        + f".{ns // 1000 % 1_000_000:06d}Z"
    )


def _fit_name(prefix: str, name: str) -> str:
    """``prefix + name`` cut to NAME_MAX bytes (the full original path is in an xattr)."""
    while len((prefix + name).encode("utf-8", "surrogateescape")) > NAME_MAX:
        name = name[:-1]
    return prefix + name


@dataclass(frozen=True)
class TrashEntry:
    id: int  # inode number of the trashed entry: stable while it sits in the trash
    name: str  # its name inside the trash directory
    trash_path: str
    original_path: str | None  # None when the xattr is missing (entry put there by hand)
    deleted_ns: int | None
    actor: str | None
    is_dir: bool
    size: int
    export: str | None  # export name, None for the root trash
    trash_days: int

    @property
    def expires_ns(self) -> int | None:
        return (
            None if self.deleted_ns is None else self.deleted_ns + self.trash_days * 86400 * 10**9
        )

    def to_dict(self) -> dict:
        data = asdict(self)
        data["expires_ns"] = self.expires_ns
        return data


@dataclass(frozen=True)
class _TrashHome:
    export: str | None
    root: tuple[str, ...]  # components of the export's directory
    trash_days: int

    @property
    def trash_path(self) -> str:
        return join_path(self.root + (TRASH_DIR,))


class TrashHomes:
    """Where an entry's trash is: the trash folder of the export whose path is the longest
    prefix of the entry's (the namespace root's for paths under no export), made on demand."""

    def __init__(self, namespace: Namespace, catalog: Catalog):
        self.namespace = namespace
        self.catalog = catalog

    def by_depth(self) -> list[_TrashHome]:
        """Every trash home, the longest export path first."""
        rows = self.catalog.read(
            lambda conn: conn.execute(
                select(EXPORTS.c.name, EXPORTS.c.path, EXPORTS.c.trash_days)
            ).all()
        )
        homes: dict[tuple[str, ...], _TrashHome] = {(): _TrashHome(None, (), DEFAULT_TRASH_DAYS)}
        for row in rows:
            try:
                root = tuple(split_path(row.path or "/", "export path"))
            except errors.InvalidArgument:
                continue  # a broken export row must not stop the trash of the others
            homes[root] = _TrashHome(row.name, root, row.trash_days)
        return sorted(homes.values(), key=lambda h: len(h.root), reverse=True)

    def of(self, parts: list[str]) -> _TrashHome:
        for home in self.by_depth():  # longest export path first
            if tuple(parts[: len(home.root)]) == home.root:
                return home
        raise AssertionError("the root trash home matches every path")

    def trash_dir(self, home: _TrashHome, create: bool) -> Attr | None:
        try:
            base = self.namespace.resolve(join_path(home.root), follow=False)
        except (errors.NotFound, errors.NotADirectory):
            return None
        if base.type != DIR:
            return None
        return self.subdir(base.ino, TRASH_DIR, create)

    def made_trash_dir(self, home: _TrashHome) -> Attr:
        """The trash folder of ``home``, created if missing."""
        trash_dir = self.trash_dir(home, create=True)
        if trash_dir is None:
            raise errors.NotADirectory(
                f"export root {join_path(home.root)} is not a directory: it has no trash"
            )
        return trash_dir

    def made_subdir(self, dir_ino: int, name: str) -> Attr:
        attr = self.subdir(dir_ino, name, create=True)
        assert attr is not None  # only a lookup without create finds nothing
        return attr

    def subdir(self, dir_ino: int, name: str, create: bool) -> Attr | None:
        try:
            attr = self.namespace.lookup(ROOT, dir_ino, name)
        except errors.NotFound:
            if not create:
                return None
            try:
                attr = self.namespace.mkdir(ROOT, dir_ino, name, TRASH_MODE)
            except errors.Exists:
                attr = self.namespace.lookup(ROOT, dir_ino, name)
        if attr.type != DIR:
            raise errors.NotADirectory(
                f"{name!r} in directory {dir_ino} exists but is not a directory: "
                "rename it so the trash can be created"
            )
        return attr


class Trash:
    """Per-export trash: move_to_trash, list, restore, purge (and delete, bypassing it)."""

    def __init__(
        self, namespace: Namespace, catalog: Catalog, *, clock: Callable[[], int] = time.time_ns
    ):
        self.namespace = namespace
        self.catalog = catalog
        self.clock = clock  # ns since the epoch; tests move it to expire entries
        self.homes = TrashHomes(namespace, catalog)

    def _check_trashable(self, path: str, parts: list[str], home: _TrashHome) -> None:
        if not parts:
            raise errors.InvalidArgument(
                f"cannot move {path!r} to the trash: it is the namespace root"
            )
        if tuple(parts) == home.root:
            raise errors.InvalidArgument(
                f"cannot move {path!r} to the trash: it is the root of export {home.export!r}"
            )
        if TRASH_DIR in parts[len(home.root) : len(home.root) + 1]:
            raise errors.InvalidArgument(
                f"{path!r} is in the trash already: restore or purge it instead"
            )

    # -- moving in ---------------------------------------------------------------------
    def move_to_trash(
        self,
        path: str,
        actor: str = "system",
        *,
        event_kind: str = "trash.move",
        details: dict | None = None,
    ) -> TrashEntry:
        """Move ``path`` (a file or a whole directory) into its export's trash."""
        parts = split_path(path)
        home = self.homes.of(parts)
        self._check_trashable(path, parts, home)
        path = join_path(parts)
        parent = self.namespace.resolve(join_path(parts[:-1]), follow=False)
        name = parts[-1]
        victim = self.namespace.lookup(ROOT, parent.ino, name)
        trash_dir = self.homes.made_trash_dir(home)
        now = self.clock()
        # The xattrs go on the inode first: should the rename fail, the entry is still in place.
        for key, value in ((XATTR_ORIGIN, path), (XATTR_DELETED, str(now)), (XATTR_ACTOR, actor)):
            self.namespace.setxattr(ROOT, victim.ino, key, value.encode("utf-8", "surrogateescape"))
        trash_name = self._free_name(trash_dir.ino, _fit_name(_stamp(now) + "-", name))
        try:
            self.namespace.rename(ROOT, parent.ino, name, trash_dir.ino, trash_name)
        except errors.FsError:
            self._drop_xattrs(victim.ino)
            raise
        entry = TrashEntry(
            victim.ino,
            trash_name,
            join_path(home.root + (TRASH_DIR, trash_name)),
            path,
            now,
            actor,
            victim.type == DIR,
            victim.size,
            home.export,
            home.trash_days,
        )
        record(
            self.catalog,
            event_kind,
            f"moved {path} to the trash as {entry.trash_path}",
            actor=actor,
            details={
                "path": path,
                "trash_path": entry.trash_path,
                "ino": victim.ino,
                **(details or {}),
            },
        )
        return entry

    def _free_name(self, dir_ino: int, name: str) -> str:
        candidate, n = name, 1
        while True:
            try:
                self.namespace.lookup(ROOT, dir_ino, candidate)
            except errors.NotFound:
                return candidate
            n += 1
            candidate = _fit_name(f"{name.split('-', 1)[0]}-{n}-", name.split("-", 1)[-1])

    def _drop_xattrs(self, ino: int) -> None:
        for key in TRASH_XATTRS:
            try:
                self.namespace.removexattr(ROOT, ino, key)
            except (errors.NoData, errors.StaleHandle):
                pass

    # -- listing ----------------------------------------------------------------------------
    def _xattr(self, ino: int, key: str) -> str | None:
        try:
            return self.namespace.getxattr(ROOT, ino, key).decode("utf-8", "surrogateescape")
        except (errors.NoData, errors.StaleHandle):
            return None

    def _entries(self, home: _TrashHome, trash_dir: Attr) -> list[TrashEntry]:
        found = []
        for item in iter_dir(self.namespace, trash_dir.ino):
            if item.name == PURGING_DIR:
                continue
            deleted = self._xattr(item.attr.ino, XATTR_DELETED)
            found.append(
                TrashEntry(
                    item.attr.ino,
                    item.name,
                    join_path(home.root + (TRASH_DIR, item.name)),
                    self._xattr(item.attr.ino, XATTR_ORIGIN),
                    int(deleted) if deleted and deleted.isdigit() else None,
                    self._xattr(item.attr.ino, XATTR_ACTOR),
                    item.attr.type == DIR,
                    item.attr.size,
                    home.export,
                    home.trash_days,
                )
            )
        return found

    def list(self) -> list[TrashEntry]:
        """Every trashed entry of every export, oldest deletion first."""
        entries = []
        seen = set()
        for home in self.homes.by_depth():
            trash_dir = self.homes.trash_dir(home, create=False)
            if trash_dir is None or trash_dir.ino in seen:
                continue
            seen.add(trash_dir.ino)
            entries.extend(self._entries(home, trash_dir))
        return sorted(entries, key=lambda e: (e.deleted_ns or 0, e.id))

    def find(self, entry_id_or_path: int | str) -> TrashEntry:
        """An entry by id (inode number), by its path in the trash, or by its original
        path (the most recently deleted entry of that path)."""
        entries = self.list()
        key = entry_id_or_path
        if isinstance(key, str) and key.strip().isdigit():
            key = int(key.strip())
        if isinstance(key, int) and not isinstance(key, bool):
            for entry in entries:
                if entry.id == key:
                    return entry
            raise errors.NotFound(f"no trash entry with id {key}: see `shingle trash list`")
        if not isinstance(key, str):
            raise errors.InvalidArgument(f"trash entry {key!r}: expected an id or a path")
        wanted = join_path(split_path(key))
        for entry in entries:
            if entry.trash_path == wanted:
                return entry
        matches = [e for e in entries if e.original_path == wanted]
        if not matches:
            raise errors.NotFound(f"nothing deleted from {wanted!r} is in the trash")
        return max(matches, key=lambda e: (e.deleted_ns or 0, e.id))

    # -- restoring ---------------------------------------------------------------------------
    def restore(
        self, entry_id_or_path: int | str, actor: str = "system", *, to: str | None = None
    ) -> str:
        """Put a trashed entry back at its original path (or ``to``); returns that path.

        Missing parent directories are recreated; an existing entry at the target is
        never replaced (Exists is raised and both stay as they are)."""
        entry = self.find(entry_id_or_path)
        target = to if to is not None else entry.original_path
        if target is None:
            raise errors.InvalidArgument(
                f"trash entry {entry.trash_path} has no recorded original path: "
                "give a target path to restore it to"
            )
        parts = split_path(target, "restore target")
        if not parts:
            raise errors.InvalidArgument("cannot restore onto the namespace root")
        parent, created = self._make_parents(parts[:-1])
        try:
            self.namespace.lookup(ROOT, parent.ino, parts[-1])
        except errors.NotFound:
            pass
        else:
            raise errors.Exists(
                f"cannot restore {entry.trash_path}: {join_path(parts)} exists; "
                "move it away or restore to another path"
            )
        trash_dir = self.namespace.resolve(
            join_path(split_path(entry.trash_path)[:-1]), follow=False
        )
        self.namespace.rename(ROOT, trash_dir.ino, entry.name, parent.ino, parts[-1])
        self._drop_xattrs(entry.id)
        restored = join_path(parts)
        record(
            self.catalog,
            "trash.restore",
            f"restored {entry.trash_path} to {restored}",
            actor=actor,
            details={
                "trash_path": entry.trash_path,
                "path": restored,
                "ino": entry.id,
                "created_parents": created,
            },
        )
        return restored

    def _make_parents(self, parts: builtins.list[str]) -> tuple[Attr, builtins.list[str]]:
        attr = self.namespace.getattr(self.namespace.root_ino)
        created = []
        for depth, part in enumerate(parts):
            try:
                attr = self.namespace.lookup(ROOT, attr.ino, part)
            except errors.NotFound:
                try:
                    attr = self.namespace.mkdir(ROOT, attr.ino, part, 0o755)
                    created.append(join_path(parts[: depth + 1]))
                except errors.Exists:
                    attr = self.namespace.lookup(ROOT, attr.ino, part)
            if attr.type != DIR:
                raise errors.NotADirectory(
                    f"cannot restore below {join_path(parts[: depth + 1])}: not a directory"
                )
        return attr, created

    # -- removing for good ---------------------------------------------------------------------
    def delete(
        self,
        path: str,
        actor: str = "system",
        *,
        event_kind: str = "trash.delete",
        details: dict | None = None,
        expect_ino: int | None = None,
    ) -> int:
        """Remove ``path`` and its subtree for good, bypassing the trash. Returns entries removed.

        The entry leaves its directory in one transaction (a rename into ``.purging``)."""
        parts = split_path(path)
        home = self.homes.of(parts)
        if not parts or tuple(parts) == home.root:
            raise errors.InvalidArgument(
                f"cannot delete {path!r}: it is the root of the namespace or an export"
            )
        parent = self.namespace.resolve(join_path(parts[:-1]), follow=False)
        victim = self.namespace.lookup(ROOT, parent.ino, parts[-1])
        if expect_ino is not None and victim.ino != expect_ino:
            raise errors.StaleHandle(
                f"{path} now names inode {victim.ino}, not {expect_ino}: left alone"
            )
        removed = self._stage_and_remove(home, parent.ino, parts[-1], victim)
        record(
            self.catalog,
            event_kind,
            f"deleted {join_path(parts)} ({removed} entries)",
            actor=actor,
            details={
                "path": join_path(parts),
                "ino": victim.ino,
                "entries": removed,
                **(details or {}),
            },
        )
        return removed

    def _stage_and_remove(self, home: _TrashHome, dir_ino: int, name: str, victim: Attr) -> int:
        trash_dir = self.homes.made_trash_dir(home)
        purging = self.homes.made_subdir(trash_dir.ino, PURGING_DIR)
        staged = self._free_name(purging.ino, f"{victim.ino}-{self.clock()}")
        self.namespace.rename(ROOT, dir_ino, name, purging.ino, staged)
        return remove_tree(self.namespace, purging.ino, staged)

    def _finish_interrupted(self) -> int:
        removed = 0
        for home in self.homes.by_depth():
            trash_dir = self.homes.trash_dir(home, create=False)
            purging = trash_dir and self.homes.subdir(trash_dir.ino, PURGING_DIR, create=False)
            if purging is None:
                continue
            for item in list(iter_dir(self.namespace, purging.ino)):
                removed += remove_tree(self.namespace, purging.ino, item.name)
        return removed

    def purge(
        self,
        older_than_s: float | None = None,
        actor: str = "system",
        *,
        progress: Progress | None = None,
    ) -> builtins.list[TrashEntry]:
        """Remove trashed entries for good: those older than their export's ``trash_days``,
        or, with ``older_than_s``, those deleted more than that many seconds ago
        (0 empties the trash). Returns the purged entries."""
        if older_than_s is not None and (
            isinstance(older_than_s, bool)
            or not isinstance(older_than_s, (int, float))
            or older_than_s < 0
        ):
            raise errors.InvalidArgument(
                f"older_than_s {older_than_s!r}: expected a number of seconds >= 0"
            )
        leftovers = self._finish_interrupted()
        now = self.clock()
        due = []
        for entry in self.list():
            limit_ns = (
                int(older_than_s * 10**9)
                if older_than_s is not None
                else entry.trash_days * 86400 * 10**9
            )
            if entry.deleted_ns is None:
                # No deletion time (put there by hand): it goes only when the trash is emptied.
                if older_than_s == 0:
                    due.append(entry)
            elif now - entry.deleted_ns >= limit_ns:
                due.append(entry)
        purged = []
        homes = {home.export: home for home in self.homes.by_depth()}
        for done, entry in enumerate(due):
            if progress:
                progress(done, len(due), f"purging {entry.trash_path}")
            home = homes.get(entry.export) or self.homes.of(split_path(entry.trash_path))
            trash_dir = self.homes.trash_dir(home, create=False)
            if trash_dir is None:
                continue  # the trash folder itself went meanwhile, and the entry with it
            try:
                victim = self.namespace.lookup(ROOT, trash_dir.ino, entry.name)
                if victim.ino != entry.id:
                    continue  # replaced meanwhile: not the entry we judged
                removed = self._stage_and_remove(home, trash_dir.ino, entry.name, victim)
            except (errors.NotFound, errors.StaleHandle):
                continue  # restored or purged by someone else meanwhile
            purged.append(entry)
            record(
                self.catalog,
                "trash.purge",
                f"purged {entry.trash_path} (deleted from "
                f"{entry.original_path}, {removed} entries)",
                actor=actor,
                details={
                    "trash_path": entry.trash_path,
                    "path": entry.original_path,
                    "ino": entry.id,
                    "entries": removed,
                    "older_than_s": older_than_s,
                },
            )
        if progress:
            progress(len(due), len(due), f"purged {len(purged)} entries")
        if leftovers:
            record(
                self.catalog,
                "trash.purge",
                f"finished an interrupted purge ({leftovers} entries)",
                actor=actor,
            )
        return purged
