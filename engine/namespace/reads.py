"""Reading the namespace, through the cache where it is valid: getattr, lookup, resolve, paths,
readlink, access, readdir, statfs."""

from __future__ import annotations

import functools
import time
from dataclasses import replace

from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from engine.base import errors
from engine.catalog.database import Catalog, sql_all
from engine.catalog.database import sql_one as _one
from engine.namespace.cache import NameCache
from engine.namespace.common import (
    ATTR_COLUMNS,
    ATTR_SQL,
    COMPLETE_DIR_MAX,
    COMPLETE_DIR_RETRY_S,
    DIR,
    DIRENTS,
    INODES,
    LNK,
    R_OK,
    REG,
    ROOT,
    SYMLINKS,
    W_OK,
    X_OK,
    Attr,
    Cred,
    DirEntry,
    FileData,
    StatFs,
    attr_of_row,
    check_name,
    load,
    may,
    require,
)
from engine.namespace.lazyclones import PendingDirectory, materialize
from engine.namespace.readonly import SNAPSHOT_DIR_NAME, ReadOnlyViews

# files whose attributes with their buffered writes are kept (with_pending); all are let go
# when there are more
MERGED_KEEP = 4096


class Reads:
    """Part of Namespace: reads, through the cache where it is valid."""

    def __init__(
        self,
        catalog: Catalog,
        data: FileData | None,
        cache: NameCache,
        readonly: ReadOnlyViews,
        root_ino: int,
        *,
        snapshots_visible: bool = False,
    ):
        self.catalog = catalog
        self.data = data
        self.cache = cache
        self.readonly = readonly
        self.root_ino = root_ino
        # DIR/.snapshots listed in DIR's readdir (config snapshots.visible; ZFS's snapdir)
        self.snapshots_visible = snapshots_visible
        # ino -> (cached attributes, buffered (size, change, mtime), the two merged): a WRITE
        # asks for a file's attributes three times (PUTFH, the I/O rights, the write itself)
        # and the merge, a new frozen Attr, was about 9 us each time
        self._merged: dict[int, tuple[Attr, tuple, Attr]] = {}

    def with_pending(self, attr: Attr) -> Attr:
        """``attr`` with the file's buffered writes: their size, and the change attribute and
        mtime/ctime they moved (a same-size rewrite shows before its COMMIT)."""
        if self.data is not None and attr.type == REG:
            pending = self.data.pending_attrs(attr.ino)
            if pending is not None:
                size, change, mtime_ns = pending
                if (size, change, mtime_ns) != (attr.size, attr.change, attr.mtime_ns):
                    last = self._merged.get(attr.ino)
                    if last is not None and last[0] is attr and last[1] == pending:
                        return last[2]
                    merged = replace(
                        attr,
                        size=size,
                        change=max(attr.change, change),
                        mtime_ns=max(attr.mtime_ns, mtime_ns),
                        ctime_ns=max(attr.ctime_ns, mtime_ns),
                    )
                    if len(self._merged) >= MERGED_KEEP:
                        self._merged.clear()
                    self._merged[attr.ino] = (attr, pending, merged)
                    return merged
        return attr

    def getattr(self, ino: int) -> Attr:
        cache = self.cache
        cacheable = cache.valid()
        gen, read_at = cache.gen, time.monotonic()
        if cacheable:
            hit = cache.cached(cache.attrs, ino)
            if hit is not None:
                return self.with_pending(hit)
        attr = self.catalog.read(lambda conn: load(conn, ino))
        if cacheable:
            cache.remember(gen, read_at, (attr,))
        return self.with_pending(attr)

    def lookup(self, cred: Cred, dir_ino: int, name: str) -> Attr:
        cache = self.cache
        cacheable = cache.valid()
        gen, read_at = cache.gen, time.monotonic()
        if cacheable:
            parent = cache.cached(cache.attrs, dir_ino)
            if parent is not None:
                child = cache.cached(cache.names, (dir_ino, name))
                if child is not None:
                    require(cred, parent, X_OK)
                    return self.getattr(child)
                if (
                    parent.type == DIR
                    and cache.known_missing(dir_ino, name)
                    and name not in (".", "..")
                ):
                    require(cred, parent, X_OK)
                    check_name(name)
                    raise errors.NotFound(f"{name!r} not found in directory {dir_ino}")
        listing = None

        def work(conn):
            parent = load(conn, dir_ino)
            if parent.type != DIR:
                raise errors.NotADirectory(f"inode {dir_ino} is not a directory")
            require(cred, parent, X_OK)
            if self.readonly.needs_copy(dir_ino, conn):
                raise PendingDirectory(dir_ino)
            if name == ".":
                return parent, parent
            if name == "..":
                return parent, load(conn, self.parent_of(conn, dir_ino))
            check_name(name)
            row = _one(
                conn,
                f"SELECT {ATTR_SQL} FROM dirents "
                "JOIN inodes ON dirents.child = inodes.ino "
                "WHERE dirents.parent = ? AND dirents.name = ?",
                (dir_ino, name),
            )
            if row is None:
                # at most once a COMPLETE_DIR_RETRY_S per directory: one whose completeness is
                # forgotten again and again (renames into it) is not read whole each time. Only
                # where the epoch is exact: another process's create must never meet a missing
                # name answered from a cache that has not heard of it yet (PostgreSQL)
                if (
                    cacheable
                    and self.catalog.epoch_is_exact
                    and cache.dirs_listed.get(dir_ino, 0.0) <= read_at
                ):
                    nonlocal listing
                    cache.dirs_listed[dir_ino] = read_at + COMPLETE_DIR_RETRY_S
                    listing = self._listing(conn, dir_ino)
                return parent, None
            return parent, attr_of_row(row)

        parent, child = self.read_copied(work)
        if child is None:
            if listing is not None:
                cache.remember(gen, read_at, (parent,), None, (dir_ino, listing))
            raise errors.NotFound(f"{name!r} not found in directory {dir_ino}")
        if cacheable:
            cache.remember(
                gen,
                read_at,
                (parent, child),
                None if name in (".", "..") else ((dir_ino, name), child.ino),
            )
        return self.with_pending(child)

    def read_copied(self, work):
        """``catalog.read(work)``; a clone's directory whose names are not copied yet
        (lazyclones.py) is copied in a transaction of its own first (not tracked: every cache
        reads again), then read."""
        while True:
            try:
                return self.catalog.read(work)
            except PendingDirectory as pending:
                self.catalog.run(functools.partial(_copy_pending, dir_ino=pending.dir_ino))
                self.readonly.forget()

    @staticmethod
    def _listing(conn: Connection, dir_ino: int) -> list[tuple[str, int]] | None:
        """Every (name, ino) of a directory of at most COMPLETE_DIR_MAX names, or None."""
        rows = sql_all(
            conn,
            "SELECT name, child FROM dirents WHERE parent = ? LIMIT ?",
            (dir_ino, COMPLETE_DIR_MAX + 1),
        )
        return None if len(rows) > COMPLETE_DIR_MAX else [(row[0], row[1]) for row in rows]

    def parent_of(self, conn: Connection, dir_ino: int) -> int:
        if dir_ino == self.root_ino:
            return dir_ino
        parent = conn.execute(
            select(DIRENTS.c.parent).where(DIRENTS.c.child == dir_ino).limit(1)
        ).scalar()
        if parent is None:
            raise errors.NotFound(f"directory {dir_ino} has no parent (removed)")
        return parent

    def parent(self, dir_ino: int) -> Attr:
        return self.catalog.read(lambda conn: load(conn, self.parent_of(conn, dir_ino)))

    def resolve(self, path: str, cred: Cred = ROOT, follow: bool = True) -> Attr:
        """Walk an absolute path (for admin code: CLI, web UI, retention)."""
        attr = self.getattr(self.root_ino)
        parts = [p for p in path.split("/") if p]
        for depth, part in enumerate(parts):
            attr = self.lookup(cred, attr.ino, part)
            last = depth == len(parts) - 1
            if attr.type == LNK and (follow or not last):
                target = self.readlink(attr.ino).decode("utf-8", "surrogateescape")
                if target.startswith("/"):
                    base = target
                else:
                    base = "/" + "/".join(parts[:depth] + [target])
                rest = "/".join(parts[depth + 1 :])
                return self.resolve(base + ("/" + rest if rest else ""), cred, follow)
        return attr

    def path_of(self, ino: int) -> str:
        """One path to ``ino`` (the first link found), for events and admin pages."""

        def work(conn):
            parts: list[str] = []  # names from ino up to the root
            current = ino
            for _ in range(4096):
                if current == self.root_ino:
                    return "/" + "/".join(reversed(parts))
                row = conn.execute(
                    select(DIRENTS.c.parent, DIRENTS.c.name)
                    .where(DIRENTS.c.child == current)
                    .limit(1)
                ).first()
                if row is None:
                    raise errors.NotFound(f"inode {ino} is not linked in the namespace")
                parts.append(row.name)
                current = row.parent
            raise errors.IOFailure(f"path of inode {ino} is deeper than 4096 levels")

        return self.catalog.read(work)

    def readlink(self, ino: int) -> bytes:
        def work(conn):
            attr = load(conn, ino)
            if attr.type != LNK:
                raise errors.InvalidArgument(f"inode {ino} is not a symbolic link")
            return conn.execute(select(SYMLINKS.c.target).where(SYMLINKS.c.ino == ino)).scalar_one()

        return self.catalog.read(work)

    def access(self, cred: Cred, ino: int, want: int) -> int:
        """The subset of ``want`` (R_OK|W_OK|X_OK) that ``cred`` is granted."""
        attr = self.getattr(ino)
        return sum(bit for bit in (R_OK, W_OK, X_OK) if want & bit and may(cred, attr, bit))

    def readdir(
        self,
        cred: Cred,
        dir_ino: int,
        cookie: int = 0,
        limit: int = 1024,
        *,
        show_snapshots: bool | None = None,
    ) -> tuple[list[DirEntry], bool]:
        """Entries after ``cookie`` in cookie order, and whether the listing is complete.

        Cookies are dirent ids, which only grow: a cookie stays valid while the
        directory changes, and no unchanged entry is skipped or repeated. ``DIR/.snapshots``
        is listed when ``show_snapshots`` is true (None: the namespace's ``snapshots_visible``);
        it is reached by name either way."""
        if show_snapshots is None:
            show_snapshots = self.snapshots_visible

        def work(conn):
            parent = load(conn, dir_ino)
            if parent.type != DIR:
                raise errors.NotADirectory(f"inode {dir_ino} is not a directory")
            require(cred, parent, R_OK)
            if self.readonly.needs_copy(dir_ino, conn):
                raise PendingDirectory(dir_ino)
            rows = conn.execute(
                select(DIRENTS.c.id, DIRENTS.c.name, *ATTR_COLUMNS)
                .select_from(DIRENTS.join(INODES, DIRENTS.c.child == INODES.c.ino))
                .where(DIRENTS.c.parent == dir_ino, DIRENTS.c.id > cookie)
                .order_by(DIRENTS.c.id)
                .limit(limit + 1)
            ).all()
            if not show_snapshots and any(row[1] == SNAPSHOT_DIR_NAME for row in rows):
                hidden.update(self.readonly.snapshot_dirs(conn))
            return rows

        hidden: set[int] = set()  # DIR/.snapshots is reached by name only, as ZFS's snapdir
        rows = self.read_copied(work)
        eof = len(rows) <= limit
        entries = [
            DirEntry(row[0], row[1], self.with_pending(attr_of_row(row[2:])))
            for row in rows[:limit]
            if not (hidden and row[2] in hidden)
        ]
        return entries, eof

    def statfs(self) -> StatFs:
        def count(conn):
            return conn.execute(select(func.count()).select_from(INODES)).scalar_one()

        files = self.catalog.read(count)
        total_files = 1 << 32
        if self.data is not None:
            total, free = self.data.capacity()
        else:
            total = free = 0
        return StatFs(total, free, free, total_files, max(total_files - files, 0))


def _copy_pending(conn, dir_ino: int) -> None:
    materialize(conn, dir_ino)
