"""Directory changes: create, mknod, mkdir, symlink, link, unlink, rmdir, rename."""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy import select
from sqlalchemy.engine import Connection

from engine.base import errors
from engine.catalog.database import sql as _sql
from engine.catalog.database import sql_one as _one
from engine.namespace import quotas
from engine.namespace.common import (
    ATTR_SQL,
    BLK,
    CHR,
    DIR,
    DIRENTS,
    FIFO,
    LNK,
    MAX_LINKS,
    REG,
    S_ISGID,
    S_ISVTX,
    SOCK,
    SYMLINK_MAX,
    SYMLINKS,
    W_OK,
    X_OK,
    Attr,
    Cred,
    Entry,
    Touched,
    attr_of_row,
    check_name,
    load,
    require,
    touch,
)
from engine.namespace.lazyclones import materialize_subtree
from engine.namespace.openrefs import OpenRefs
from engine.namespace.quotas import QuotaTracker
from engine.namespace.readonly import ReadOnlyViews
from engine.namespace.reads import Reads
from engine.namespace.transactions import Transactions


class DirectoryOps:
    """Part of Namespace: every change of names, each one write transaction."""

    def __init__(
        self,
        reads: Reads,
        readonly: ReadOnlyViews,
        writes: Transactions,
        quotas: QuotaTracker,
        open_refs: OpenRefs,
    ):
        self.data = writes.data
        self.reads = reads
        self.readonly = readonly
        self.writes = writes
        self.quotas = quotas
        self.open_refs = open_refs
        self.root_ino = reads.root_ino

    def _dir_for_change(self, conn: Connection, cred: Cred, dir_ino: int) -> Attr:
        return self._check_dir_for_change(cred, dir_ino, load(conn, dir_ino))

    def _dir_and_entry(
        self, conn: Connection, cred: Cred, dir_ino: int, name: str
    ) -> tuple[Attr, Entry | None]:
        """``_dir_for_change`` and ``_entry`` in one query (on PostgreSQL each is a round trip)."""
        row = _one(
            conn,
            f"SELECT {ATTR_SQL}, dirents.id, dirents.child FROM inodes "
            "LEFT JOIN dirents ON dirents.parent = inodes.ino AND dirents.name = ? "
            "WHERE inodes.ino = ?",
            (name, dir_ino),
        )
        if row is None:
            raise errors.StaleHandle(f"inode {dir_ino} does not exist")
        parent = self._check_dir_for_change(cred, dir_ino, attr_of_row(row[:-2]))
        return parent, None if row[-2] is None else Entry(row[-2], row[-1])

    def _check_dir_for_change(self, cred: Cred, dir_ino: int, parent: Attr) -> Attr:
        if parent.type != DIR:
            raise errors.NotADirectory(f"inode {dir_ino} is not a directory")
        if parent.nlink == 0:
            raise errors.NotFound(f"directory {dir_ino} has been removed")
        require(cred, parent, W_OK | X_OK)
        return parent

    @staticmethod
    def _entry(conn: Connection, dir_ino: int, name: str):
        row = _one(
            conn, "SELECT id, child FROM dirents WHERE parent = ? AND name = ?", (dir_ino, name)
        )
        return None if row is None else Entry(*row)

    @staticmethod
    def _check_sticky(cred: Cred, parent: Attr, victim: Attr) -> None:
        if (
            parent.mode & S_ISVTX
            and cred.uid != 0
            and not cred.owns(parent)
            and not cred.owns(victim)
        ):
            raise errors.NotPermitted(
                f"sticky directory {parent.ino}: uid {cred.uid} may not remove inode {victim.ino}"
            )

    def _new_inode(
        self,
        conn: Connection,
        cred: Cred,
        parent: Attr,
        ftype: int,
        mode: int,
        rdev: int = 0,
        size: int = 0,
    ) -> Attr:
        now = time.time_ns()
        gid = parent.gid if parent.mode & S_ISGID else cred.gid
        mode &= 0o7777
        if ftype == DIR and parent.mode & S_ISGID:
            mode |= S_ISGID
        elif mode & S_ISGID and cred.uid != 0 and not cred.in_group(gid):
            mode &= ~S_ISGID
        nlink = 2 if ftype == DIR else 1
        ino = _one(
            conn,
            "INSERT INTO inodes (generation, type, mode, uid, gid, size, nlink, rdev, "
            "atime_ns, mtime_ns, ctime_ns, btime_ns, change) "
            "VALUES (1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1) RETURNING ino",
            (ftype, mode, cred.uid, gid, size, nlink, rdev, now, now, now, now),
        )[0]
        return Attr(ino, 1, ftype, mode, cred.uid, gid, size, nlink, rdev, now, now, now, now, 1)

    def _make(
        self,
        cred: Cred,
        dir_ino: int,
        name: str,
        ftype: int,
        mode: int,
        *,
        rdev: int = 0,
        target: bytes | None = None,
        exclusive: bool = True,
        also=None,
    ) -> Attr:
        check_name(name)

        def work(conn, touched):
            self.readonly.check_writable(dir_ino, conn=conn)
            parent, existing = self._dir_and_entry(conn, cred, dir_ino, name)
            if existing is not None:
                if exclusive or ftype != REG:
                    raise errors.Exists(f"{name!r} exists in directory {dir_ino}")
                attr = load(conn, existing.child)
                if attr.type == DIR:
                    raise errors.IsADirectory(f"{name!r} is a directory")
                return attr
            if ftype == DIR and parent.nlink >= MAX_LINKS:
                raise errors.TooManyLinks(f"directory {dir_ino} has {parent.nlink} links")
            roots = self.quotas.roots(conn, dir_ino)
            quotas.check(roots, 0, 1)
            attr = self._new_inode(
                conn, cred, parent, ftype, mode, rdev, size=len(target) if target else 0
            )
            if target is not None:
                conn.execute(SYMLINKS.insert().values(ino=attr.ino, target=target))
            _sql(
                conn,
                "INSERT INTO dirents (parent, name, child) VALUES (?, ?, ?)",
                (dir_ino, name, attr.ino),
            )
            parent_now = touch(
                conn, dir_ino, mtime=True, nlink_delta=1 if ftype == DIR else 0, returning=True
            )
            self.quotas.charge(conn, roots, 0, 1)
            if ftype == REG and self.data is not None:
                self.data.created(conn, attr.ino)  # its first write then needs no catalog read
            touched.add(attr.ino)
            touched.names[(dir_ino, name)] = attr.ino
            # nothing below changes either row: _write caches them without reading them again
            touched.known[attr.ino] = attr
            touched.xattrs[attr.ino] = {}  # a new inode has none
            touched.xattrs_kept.add(dir_ino)
            if parent_now is not None:
                touched.known[dir_ino] = parent_now
            if also is not None:
                also(conn, attr)
            return attr

        return self.writes.write(work, (dir_ino,), ((dir_ino, name),))

    def _drop_link(self, conn: Connection, ino: int, touched: Touched, dir_ino: int) -> None:
        """One name of ``ino`` (in ``dir_ino``) is gone: free it when no name and no opener
        remain. With its last name it leaves the quota trees of ``dir_ino`` (an open file's
        later writes count nowhere)."""
        self.readonly.preserve(conn, ino)  # its link count and ctime change
        attr = load(conn, ino)
        nlink = 0 if attr.type == DIR else attr.nlink - 1
        if nlink == 0 and self.quotas.active(conn):
            size = attr.size if attr.type == REG else 0
            self.quotas.charge(conn, self.quotas.roots(conn, dir_ino), -size, -1)
            if attr.type == DIR:
                _sql(conn, "DELETE FROM quotas WHERE root_ino = ?", (ino,))
            self.quotas.drop(ino)
        _sql(
            conn,
            "UPDATE inodes SET nlink = ?, ctime_ns = ?, change = change + 1 WHERE ino = ?",
            (nlink, time.time_ns(), ino),
        )
        if nlink == 0 and not self.open_refs.is_open(ino):
            self.writes.free(conn, ino, touched)

    # -- changes ---------------------------------------------------------------------
    def create(
        self,
        cred: Cred,
        dir_ino: int,
        name: str,
        mode: int = 0o644,
        *,
        exclusive: bool = True,
        also: Callable[[Connection, Attr], None] | None = None,
    ) -> Attr:
        """A regular file; with ``exclusive=False`` an existing file is returned. ``also(conn,
        attr)``: the caller's own rows of a file it made, written in the same transaction (not
        called for an existing file)."""
        return self._make(cred, dir_ino, name, REG, mode, exclusive=exclusive, also=also)

    def mknod(
        self, cred: Cred, dir_ino: int, name: str, ftype: int, mode: int, rdev: int = 0
    ) -> Attr:
        if ftype not in (BLK, CHR, SOCK, FIFO):
            raise errors.InvalidArgument(
                f"mknod of file type {ftype}: expected a device, socket or fifo"
            )
        if ftype in (BLK, CHR) and cred.uid != 0:
            raise errors.NotPermitted("only root may create device nodes")
        return self._make(cred, dir_ino, name, ftype, mode, rdev=rdev)

    def mkdir(self, cred: Cred, dir_ino: int, name: str, mode: int = 0o755) -> Attr:
        return self._make(cred, dir_ino, name, DIR, mode)

    def symlink(self, cred: Cred, dir_ino: int, name: str, target: bytes | str) -> Attr:
        if isinstance(target, str):
            target = target.encode("utf-8", "surrogateescape")
        if not target or len(target) > SYMLINK_MAX or b"\0" in target:
            raise errors.InvalidArgument(
                f"symlink target of {len(target)} bytes: expected 1-{SYMLINK_MAX}, no NUL"
            )
        return self._make(cred, dir_ino, name, LNK, 0o777, target=target)

    def link(self, cred: Cred, ino: int, dir_ino: int, name: str) -> Attr:
        check_name(name)

        def work(conn, touched):
            self.readonly.check_writable(ino, dir_ino, conn=conn)
            attr = load(conn, ino)
            if attr.type == DIR:
                raise errors.NotPermitted(f"hard link to directory {ino}")
            if attr.nlink == 0:
                raise errors.NotFound(f"inode {ino} has been removed")
            if attr.nlink >= MAX_LINKS:
                raise errors.TooManyLinks(f"inode {ino} has {attr.nlink} links")
            if self._dir_and_entry(conn, cred, dir_ino, name)[1] is not None:
                raise errors.Exists(f"{name!r} exists in directory {dir_ino}")
            if self.quotas.active(conn) and self._quota_ids(conn, dir_ino) != self._quota_ids(
                conn, ino, include_self=False
            ):
                # one inode counted in two sets of trees could not be uncounted right
                raise errors.CrossDevice(f"a link of inode {ino} into another quota tree")
            conn.execute(DIRENTS.insert().values(parent=dir_ino, name=name, child=ino))
            touch(conn, ino, nlink_delta=1)
            touch(conn, dir_ino, mtime=True)
            return load(conn, ino)

        return self.writes.write(work, (ino, dir_ino), ((dir_ino, name),))

    def unlink(self, cred: Cred, dir_ino: int, name: str) -> None:
        check_name(name)

        def work(conn, touched):
            self.readonly.check_writable(dir_ino, conn=conn)
            parent, entry = self._dir_and_entry(conn, cred, dir_ino, name)
            if entry is None:
                raise errors.NotFound(f"{name!r} not found in directory {dir_ino}")
            victim = load(conn, entry.child)
            if victim.type == DIR:
                raise errors.IsADirectory(f"{name!r} is a directory: use rmdir")
            self._check_sticky(cred, parent, victim)
            _sql(conn, "DELETE FROM dirents WHERE id = ?", (entry.id,))
            touch(conn, dir_ino, mtime=True)
            touched.add(victim.ino)
            touched.gone.add((dir_ino, name))
            self._drop_link(conn, victim.ino, touched, dir_ino)

        self.writes.write(work, (dir_ino,), ((dir_ino, name),))

    def rmdir(self, cred: Cred, dir_ino: int, name: str) -> None:
        if name == ".":
            raise errors.InvalidArgument("rmdir of '.'")
        if name == "..":
            raise errors.NotEmpty("rmdir of '..'")
        check_name(name)

        def work(conn, touched):
            self.readonly.check_writable(dir_ino, conn=conn)
            snapshot_dirs = self.readonly.snapshot_dirs(conn)
            parent, entry = self._dir_and_entry(conn, cred, dir_ino, name)
            if entry is None:
                raise errors.NotFound(f"{name!r} not found in directory {dir_ino}")
            victim = load(conn, entry.child)
            if victim.ino in snapshot_dirs:
                raise errors.ReadOnly(f"{name!r} holds snapshots: delete them instead")
            if victim.type != DIR:
                raise errors.NotADirectory(f"{name!r} is not a directory")
            self._check_sticky(cred, parent, victim)
            self.readonly.materialize(conn, victim.ino)  # a clone's: its names first
            if conn.execute(
                select(DIRENTS.c.id).where(DIRENTS.c.parent == victim.ino).limit(1)
            ).first():
                raise errors.NotEmpty(f"directory {name!r} is not empty")
            conn.execute(DIRENTS.delete().where(DIRENTS.c.id == entry.id))
            touch(conn, dir_ino, mtime=True, nlink_delta=-1)
            touched.add(victim.ino)
            touched.gone.add((dir_ino, name))
            self._drop_link(conn, victim.ino, touched, dir_ino)

        self.writes.write(work, (dir_ino,), ((dir_ino, name),))

    def rename(self, cred: Cred, src_dir: int, src_name: str, dst_dir: int, dst_name: str) -> None:
        """POSIX rename in one transaction: a reader sees the old or the new name."""
        check_name(src_name)
        check_name(dst_name)

        def work(conn, touched):
            self.readonly.check_writable(src_dir, dst_dir, conn=conn)
            snapshot_dirs = self.readonly.snapshot_dirs(conn)
            src_parent = self._dir_for_change(conn, cred, src_dir)
            dst_parent = (
                src_parent if dst_dir == src_dir else self._dir_for_change(conn, cred, dst_dir)
            )
            entry = self._entry(conn, src_dir, src_name)
            if entry is None:
                raise errors.NotFound(f"{src_name!r} not found in directory {src_dir}")
            moving = load(conn, entry.child)
            if moving.ino in snapshot_dirs:
                raise errors.ReadOnly(f"{src_name!r} holds snapshots and cannot move")
            touched.add(moving.ino)
            self._check_sticky(cred, src_parent, moving)
            if moving.type == DIR and dst_dir != src_dir:
                self._refuse_loop(conn, moving.ino, dst_dir)
                # moving a directory rewrites its '..': needs write permission on it
                require(cred, moving, W_OK)
            target = self._entry(conn, dst_dir, dst_name)
            if target is not None:
                if target.child == moving.ino:
                    return  # both names are links to the same file: POSIX says do nothing
                victim = load(conn, target.child)
                if victim.ino in snapshot_dirs:
                    raise errors.ReadOnly(f"{dst_name!r} holds snapshots and cannot be replaced")
                self._check_sticky(cred, dst_parent, victim)
                if moving.type == DIR:
                    if victim.type != DIR:
                        raise errors.NotADirectory(
                            f"cannot replace non-directory {dst_name!r} with a directory"
                        )
                    self.readonly.materialize(conn, victim.ino)  # a clone's: its names first
                    if conn.execute(
                        select(DIRENTS.c.id).where(DIRENTS.c.parent == victim.ino).limit(1)
                    ).first():
                        raise errors.NotEmpty(f"directory {dst_name!r} is not empty")
                elif victim.type == DIR:
                    raise errors.IsADirectory(
                        f"cannot replace directory {dst_name!r} with a non-directory"
                    )
                conn.execute(DIRENTS.delete().where(DIRENTS.c.id == target.id))
                if victim.type == DIR:
                    touch(conn, dst_dir, nlink_delta=-1)
                touched.add(victim.ino)
                self._drop_link(conn, victim.ino, touched, dst_dir)
            if dst_dir != src_dir and self.quotas.active(conn):
                self._move_usage(conn, moving, src_dir, dst_dir)
            self.readonly.preserve(conn, moving.ino)  # its ctime changes
            _sql(
                conn,
                "UPDATE dirents SET parent = ?, name = ? WHERE id = ?",
                (dst_dir, dst_name, entry.id),
            )
            touch(conn, moving.ino)
            delta = 1 if moving.type == DIR and dst_dir != src_dir else 0
            touch(conn, src_dir, mtime=True, nlink_delta=-delta)
            if dst_dir != src_dir:
                touch(conn, dst_dir, mtime=True, nlink_delta=delta)

        self.writes.write(work, (src_dir, dst_dir), ((src_dir, src_name), (dst_dir, dst_name)))

    def _quota_ids(self, conn: Connection, ino: int, *, include_self: bool = True) -> set[int]:
        return {r.id for r in self.quotas.roots(conn, ino, include_self=include_self)}

    def _move_usage(self, conn: Connection, moving: Attr, src_dir: int, dst_dir: int) -> None:
        """A rename to another directory: the moved file or tree leaves the quota trees only the
        source is in and enters those only the destination is in (a directory's usage is
        counted here, once per such move; EDQUOT when the destination has no room)."""
        src = self.quotas.roots(conn, src_dir)
        dst = self.quotas.roots(conn, dst_dir)
        src_ids, dst_ids = {r.id for r in src}, {r.id for r in dst}
        leaving = [r for r in src if r.id not in dst_ids]
        entering = [r for r in dst if r.id not in src_ids]
        if not leaving and not entering:
            return
        if moving.type == DIR:
            # no clone's directory is pending under a quota's root (lazyclones.py)
            materialize_subtree(conn, moving.ino)
            size, files = quotas.usage_below(conn, moving.ino)
            files += 1
        else:
            if moving.nlink > 1:
                raise errors.CrossDevice(
                    f"inode {moving.ino} has other links: it cannot move to another quota tree"
                )
            size, files = (moving.size if moving.type == REG else 0), 1
        quotas.check(entering, size, files, self.quotas.reserved())
        self.quotas.charge(conn, leaving, -size, -files)
        self.quotas.charge(conn, entering, size, files)

    def _refuse_loop(self, conn: Connection, moving: int, dst_dir: int) -> None:
        current = dst_dir
        while True:
            if current == moving:
                raise errors.InvalidArgument(f"cannot move directory {moving} into its own subtree")
            if current == self.root_ino:
                return
            current = self.reads.parent_of(conn, current)
