"""The namespace API: the one entry point to files and directories.

Its calls mirror POSIX (and so NFS) operations on inode numbers. The NFS
server, the SMB bridge, the web UI, the CLI and the tests all use it. Each
call is one catalog transaction (``Catalog.run``); errors are the typed
``engine.errors`` exceptions carrying an errno.

File data goes through a ``FileData`` object (engine.datapath) attached at
construction; the namespace calls it inside its own transactions where
metadata and data must change together (truncate, freeing an inode).
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace
from typing import NamedTuple, Protocol

from sqlalchemy import and_, func, select
from sqlalchemy.engine import Connection

from engine import errors
from engine.catalog.database import Catalog, commits_between, in_list, sql as _sql, sql_one as _one
from engine.catalog.models import BLK, CHR, DIR, FIFO, LNK, REG, SOCK, Dirent, Inode, Symlink, Xattr

log = logging.getLogger("shingle.namespace")

INODES = Inode.__table__
DIRENTS = Dirent.__table__
SYMLINKS = Symlink.__table__
XATTRS = Xattr.__table__

NAME_MAX = 255
SYMLINK_MAX = 4095
XATTR_NAME_MAX = 255
XATTR_VALUE_MAX = 64 * 1024
MAX_LINKS = 65000
S_ISUID, S_ISGID, S_ISVTX = 0o4000, 0o2000, 0o1000
R_OK, W_OK, X_OK = 4, 2, 1
ROOT_INO_KEY = "root_ino"


class _Now:
    """Marker for setattr: set this time to the server's clock."""

    def __repr__(self):
        return "SET_TO_NOW"


SET_TO_NOW = _Now()


@dataclass(frozen=True, slots=True)
class Cred:
    uid: int
    gid: int
    groups: tuple[int, ...] = ()

    def in_group(self, gid: int) -> bool:
        return gid == self.gid or gid in self.groups


ROOT = Cred(0, 0)
# A backstop: the cache is emptied at this age even if every commit since was accounted for.
# At 1 s the stat of 2,000 files cost a query each after every clear (2,840/s, now 4,400/s with
# nfs4fs).
CACHE_TTL_S = 10.0
CACHE_MAX_ENTRIES = 200_000  # attributes + names; about 60 MB at most
# extents freed per transaction: removing a 100 GB checkpoint (100,000 extents when written in
# 1 MiB commits) must not hold the catalog's write lock for seconds while other clients COMMIT
FREE_CHUNK_EXTENTS = 128


@dataclass(frozen=True, slots=True)
class Attr:
    ino: int
    generation: int
    type: int
    mode: int
    uid: int
    gid: int
    size: int
    nlink: int
    rdev: int
    atime_ns: int
    mtime_ns: int
    ctime_ns: int
    btime_ns: int
    change: int

    @property
    def is_dir(self) -> bool:
        return self.type == DIR


@dataclass(frozen=True, slots=True)
class DirEntry:
    cookie: int
    name: str
    attr: Attr


@dataclass(frozen=True, slots=True)
class StatFs:
    total_bytes: int
    free_bytes: int
    avail_bytes: int
    total_files: int
    free_files: int
    name_max: int = NAME_MAX


class FileData(Protocol):
    """The seam to the data path (engine.datapath implements it)."""

    def read(self, ino: int, offset: int, length: int, size: int) -> bytes: ...  # or a bytearray
    def write(self, ino: int, offset: int, data: bytes) -> int: ...  # returns new pending size
    def flush(self, ino: int) -> None: ...  # durable and committed on return
    def pending_size(self, ino: int) -> int | None: ...  # size counting buffered writes
    def truncate(self, conn: Connection, ino: int, old_size: int, new_size: int) -> None: ...
    def created(self, conn: Connection, ino: int) -> None: ...  # a new regular file, in its create transaction
    def release(self, conn: Connection, ino: int, limit: int | None = None) -> bool: ...  # inode freed: extents garbage
    def capacity(self) -> tuple[int, int]: ...  # usable (total, free) bytes


_ATTR_COLUMNS = [INODES.c[name] for name in Attr.__slots__]
_ATTR_SQL = ", ".join(f"inodes.{name}" for name in Attr.__slots__)


class _Touched(set):
    """Inodes a write transaction changed, and the names it created ((dir, name) -> ino)."""

    def __init__(self, inos=()):
        super().__init__(inos)
        self.names: dict[tuple[int, str], int] = {}
        self.unfreed: list[int] = []  # orphans with extents left to free after this commit


class _Entry(NamedTuple):
    id: int
    child: int


def _attr(row) -> Attr:
    return Attr(*row)


def check_name(name: str) -> str:
    if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\0" in name:
        raise errors.InvalidArgument(f"invalid file name {name!r}")
    if len(name.encode("utf-8", "surrogateescape")) > NAME_MAX:
        raise errors.NameTooLong(f"name of {len(name.encode())} bytes exceeds {NAME_MAX}")
    return name


def may(cred: Cred, attr: Attr, want: int) -> bool:
    """POSIX permission check of ``want`` (R_OK|W_OK|X_OK bits) on ``attr``."""
    if cred.uid == 0:
        # root may execute only what someone may execute (directories: always search)
        return not (want & X_OK) or attr.type == DIR or bool(attr.mode & 0o111)
    if cred.uid == attr.uid:
        bits = (attr.mode >> 6) & 7
    elif cred.in_group(attr.gid):
        bits = (attr.mode >> 3) & 7
    else:
        bits = attr.mode & 7
    return bits & want == want


class Namespace:
    def __init__(self, catalog: Catalog, data: FileData | None = None):
        self.catalog = catalog
        self.data = data
        self._cache: dict[int, Attr] = {}
        self._names: dict[tuple[int, str], int] = {}
        self._cache_epoch: int | None = None
        self._cache_since = 0.0
        self._cache_gen = 0  # bumped by every eviction: a load that began before it is not cached
        self._cache_lock = threading.Lock()
        self._open_refs: dict[int, int] = {}
        self._open_lock = threading.Lock()
        root = catalog.get_setting(ROOT_INO_KEY)
        self.root_ino = int(root) if root is not None else self._make_root()
        listen = getattr(data, "add_commit_listener", None)
        if listen is not None:
            listen(self._data_committed, self._fresh_attrs)  # data-path commits change sizes and times

    # -- set-up --------------------------------------------------------------
    def _make_root(self) -> int:
        def work(conn):
            now = time.time_ns()
            ino = conn.execute(INODES.insert().values(
                type=DIR, mode=0o755, uid=0, gid=0, size=0, nlink=2, rdev=0, generation=1,
                atime_ns=now, mtime_ns=now, ctime_ns=now, btime_ns=now, change=1,
            )).inserted_primary_key[0]
            return ino
        ino = self.catalog.run(work)
        self.catalog.set_setting(ROOT_INO_KEY, str(ino))
        return ino

    # -- cache -----------------------------------------------------------------
    # Attributes and names are cached in process. A commit the cache cannot account for (by
    # another process, or an untracked one of this process: Catalog.only_tracked) or
    # CACHE_TTL_S of age clears it all; this process's tracked namespace and data-path commits
    # evict just what they changed and keep the rest (_changed), so a write does not cost every
    # later lookup a catalog query. PostgreSQL has no cheap signal: no cache.
    def _cache_valid(self) -> bool:
        """Whether the cache may be used, after clearing it if a commit it cannot account for ran."""
        epoch = self.catalog.epoch()
        if epoch is None:
            return False
        if epoch != self._cache_epoch or time.monotonic() - self._cache_since > CACHE_TTL_S:
            with self._cache_lock:
                known = self._cache_epoch
                if (known is None or time.monotonic() - self._cache_since > CACHE_TTL_S
                        or not self.catalog.only_tracked(known, epoch)):
                    self._clear_cache(epoch)
                elif commits_between(known, epoch) > 0:  # newer (an older read changes nothing)
                    self._cache_epoch = epoch
        return True

    def _clear_cache(self, epoch: int | None) -> None:
        """Forget every entry (caller holds the cache lock); loads under way will not be cached."""
        self._cache.clear()
        self._names.clear()
        self._cache_gen += 1
        self._cache_epoch = epoch
        self._cache_since = time.monotonic()

    def _remember(self, gen: int, attrs=(), name=None) -> None:
        """Cache what a load found, unless an eviction ran since it began (it may be stale)."""
        with self._cache_lock:
            if gen != self._cache_gen:
                return
            if len(self._cache) + len(self._names) > CACHE_MAX_ENTRIES:
                self._clear_cache(self._cache_epoch)  # a crude bound, reached only by walks of huge trees
                return
            for attr in attrs:
                self._cache[attr.ino] = attr
            if name is not None:
                self._names[name[0]] = name[1]

    def _write(self, work, inos=(), names=()):
        """A namespace write transaction; afterwards evict ``inos`` and ``names`` plus what the
        work added to the ``touched`` set it receives (inodes found inside, like a victim), and
        cache their new attributes, read at the end of the same transaction. An inode it freed
        only in part (``_free``) is freed the rest of the way in transactions of its own."""
        result, unfreed = self._write_once(work, inos, names)
        if unfreed:
            self._free_orphans(unfreed)
        return result

    def _free_orphans(self, inos) -> None:
        """Free orphans a chunk of extents per transaction, so that other writers get the catalog
        in between. Already committed: the name is gone, so a failure here only leaves the orphan
        for the next start (reclaim_orphans), it is not the caller's error."""
        todo = list(inos)
        while todo:
            ino = todo.pop()

            def work(conn, touched, ino=ino):
                row = _one(conn, "SELECT nlink FROM inodes WHERE ino = ?", (ino,))
                # opened again meanwhile (by file handle): its last close frees it
                if row is not None and row[0] == 0 and not self._open_refs.get(ino):
                    self._free(conn, ino, touched)
            try:
                todo.extend(self._write_once(work, (ino,))[1])
            except Exception as exc:  # noqa: BLE001 - see above
                log.warning("freeing removed inode %s: %s; it is freed at the next start", ino, exc)

    def _write_once(self, work, inos=(), names=()):
        self._cache_valid()  # take in other processes' commits before ours moves the epoch
        touched = _Touched(inos)
        fresh: list[Attr] = []
        gen = [None]

        def run(conn):
            fresh.clear()
            result = work(conn, touched)
            if self._cache_epoch is not None and touched:
                fresh.extend(self._load_many(conn, touched))
            # taken while this transaction holds the write lock: if no eviction runs between here
            # and _changed, no commit of this process after ours has been seen yet
            gen[0] = self._cache_gen
            return result
        try:
            return self.catalog.run(run, tracked=True), touched.unfreed  # _changed accounts for it
        except BaseException:
            fresh.clear()
            raise
        finally:
            self._changed(touched, names, fresh, gen[0], touched.names)

    def _changed(self, inos, names=(), fresh=(), fresh_gen=None, fresh_names=()) -> None:
        """This process changed ``inos`` and the (dir, name) entries ``names`` in a tracked commit:
        evict them (the rest of the cache stays valid: _cache_valid adopts the commit)."""
        with self._cache_lock:
            current = self._cache_gen
            self._cache_gen += 1
            for ino in inos:
                self._cache.pop(ino, None)
            for key in names:
                self._names.pop(key, None)
            if self._cache_epoch is not None and fresh and fresh_gen == current:
                for attr in fresh:
                    self._cache[attr.ino] = attr
                self._names.update(fresh_names)

    def _fresh_attrs(self, conn, inos):
        """Inside a data-path commit: the changed files' new attributes, for _data_committed."""
        if not inos or not self._cache_valid():  # first take in whatever others committed before us
            return None
        return self._load_many(conn, inos), self._cache_gen  # gen: taken under the write lock, as in _write

    def _data_committed(self, inos, found) -> None:
        fresh, gen = found if found is not None else ((), None)
        self._changed(inos, (), fresh, gen)

    def invalidate(self) -> None:
        with self._cache_lock:
            self._clear_cache(None)

    # -- reading ----------------------------------------------------------------
    @staticmethod
    def _load_many(conn: Connection, inos) -> list[Attr]:
        """The attributes of those of ``inos`` that exist."""
        ids = sorted(inos)
        return [_attr(row) for row in _sql(conn, f"SELECT {_ATTR_SQL} FROM inodes WHERE ino IN {in_list(ids)}",
                                           tuple(ids))]

    @staticmethod
    def _load(conn: Connection, ino: int) -> Attr:
        row = _one(conn, f"SELECT {_ATTR_SQL} FROM inodes WHERE ino = ?", (ino,))
        if row is None:
            raise errors.StaleHandle(f"inode {ino} does not exist")
        return _attr(row)

    def _with_pending(self, attr: Attr) -> Attr:
        if self.data is not None and attr.type == REG:
            pending = self.data.pending_size(attr.ino)
            if pending is not None and pending != attr.size:
                return replace(attr, size=pending)
        return attr

    def getattr(self, ino: int) -> Attr:
        cacheable = self._cache_valid()
        gen = self._cache_gen
        if cacheable:
            hit = self._cache.get(ino)
            if hit is not None:
                return self._with_pending(hit)
        attr = self.catalog.read(lambda conn: self._load(conn, ino))
        if cacheable:
            self._remember(gen, (attr,))
        return self._with_pending(attr)

    def lookup(self, cred: Cred, dir_ino: int, name: str) -> Attr:
        cacheable = self._cache_valid()
        gen = self._cache_gen
        if cacheable:
            parent = self._cache.get(dir_ino)
            child = self._names.get((dir_ino, name))
            if parent is not None and child is not None:
                self._require(cred, parent, X_OK)
                return self.getattr(child)

        def work(conn):
            parent = self._load(conn, dir_ino)
            if parent.type != DIR:
                raise errors.NotADirectory(f"inode {dir_ino} is not a directory")
            self._require(cred, parent, X_OK)
            if name == ".":
                return parent, parent
            if name == "..":
                return parent, self._load(conn, self._parent_of(conn, dir_ino))
            check_name(name)
            row = _one(conn, f"SELECT {_ATTR_SQL} FROM dirents JOIN inodes ON dirents.child = inodes.ino "
                             "WHERE dirents.parent = ? AND dirents.name = ?", (dir_ino, name))
            if row is None:
                raise errors.NotFound(f"{name!r} not found in directory {dir_ino}")
            return parent, _attr(row)
        parent, child = self.catalog.read(work)
        if cacheable:
            self._remember(gen, (parent, child), None if name in (".", "..") else ((dir_ino, name), child.ino))
        return self._with_pending(child)

    def _parent_of(self, conn: Connection, dir_ino: int) -> int:
        if dir_ino == self.root_ino:
            return dir_ino
        parent = conn.execute(select(DIRENTS.c.parent).where(DIRENTS.c.child == dir_ino).limit(1)).scalar()
        if parent is None:
            raise errors.NotFound(f"directory {dir_ino} has no parent (removed)")
        return parent

    def parent(self, dir_ino: int) -> Attr:
        return self.catalog.read(lambda conn: self._load(conn, self._parent_of(conn, dir_ino)))

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
                rest = "/".join(parts[depth + 1:])
                return self.resolve(base + ("/" + rest if rest else ""), cred, follow)
        return attr

    def path_of(self, ino: int) -> str:
        """One path to ``ino`` (the first link found), for events and admin pages."""
        def work(conn):
            parts = []
            current = ino
            for _ in range(4096):
                if current == self.root_ino:
                    return "/" + "/".join(reversed(parts))
                row = conn.execute(select(DIRENTS.c.parent, DIRENTS.c.name)
                                   .where(DIRENTS.c.child == current).limit(1)).first()
                if row is None:
                    raise errors.NotFound(f"inode {ino} is not linked in the namespace")
                parts.append(row.name)
                current = row.parent
            raise errors.IOFailure(f"path of inode {ino} is deeper than 4096 levels")
        return self.catalog.read(work)

    def readlink(self, ino: int) -> bytes:
        def work(conn):
            attr = self._load(conn, ino)
            if attr.type != LNK:
                raise errors.InvalidArgument(f"inode {ino} is not a symbolic link")
            return conn.execute(select(SYMLINKS.c.target).where(SYMLINKS.c.ino == ino)).scalar_one()
        return self.catalog.read(work)

    def access(self, cred: Cred, ino: int, want: int) -> int:
        """The subset of ``want`` (R_OK|W_OK|X_OK) that ``cred`` is granted."""
        attr = self.getattr(ino)
        return sum(bit for bit in (R_OK, W_OK, X_OK) if want & bit and may(cred, attr, bit))

    def readdir(self, cred: Cred, dir_ino: int, cookie: int = 0, limit: int = 1024) -> tuple[list[DirEntry], bool]:
        """Entries after ``cookie`` in cookie order, and whether the listing is complete.

        Cookies are dirent ids, which only grow: a cookie stays valid while the
        directory changes, and no unchanged entry is skipped or repeated."""
        def work(conn):
            parent = self._load(conn, dir_ino)
            if parent.type != DIR:
                raise errors.NotADirectory(f"inode {dir_ino} is not a directory")
            self._require(cred, parent, R_OK)
            rows = conn.execute(
                select(DIRENTS.c.id, DIRENTS.c.name, *_ATTR_COLUMNS)
                .select_from(DIRENTS.join(INODES, DIRENTS.c.child == INODES.c.ino))
                .where(DIRENTS.c.parent == dir_ino, DIRENTS.c.id > cookie)
                .order_by(DIRENTS.c.id).limit(limit + 1)).all()
            return rows
        rows = self.catalog.read(work)
        eof = len(rows) <= limit
        entries = [DirEntry(row[0], row[1], self._with_pending(_attr(row[2:]))) for row in rows[:limit]]
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

    # -- extended attributes ------------------------------------------------------
    def getxattr(self, cred: Cred, ino: int, name: str) -> bytes:
        def work(conn):
            self._require(cred, self._load(conn, ino), R_OK)
            value = conn.execute(select(XATTRS.c.value).where(XATTRS.c.ino == ino, XATTRS.c.name == name)).scalar()
            if value is None:
                raise errors.NoData(f"no extended attribute {name!r} on inode {ino}")
            return value
        return self.catalog.read(work)

    def listxattr(self, cred: Cred, ino: int) -> list[str]:
        def work(conn):
            self._require(cred, self._load(conn, ino), R_OK)
            return list(conn.execute(select(XATTRS.c.name).where(XATTRS.c.ino == ino).order_by(XATTRS.c.name)).scalars())
        return self.catalog.read(work)

    def setxattr(self, cred: Cred, ino: int, name: str, value: bytes, *, create: bool = False, replace_only: bool = False) -> None:
        if not name or len(name.encode()) > XATTR_NAME_MAX:
            raise errors.InvalidArgument(f"extended attribute name {name!r}: expected 1-{XATTR_NAME_MAX} bytes")
        if len(value) > XATTR_VALUE_MAX:
            raise errors.InvalidArgument(f"extended attribute value of {len(value)} bytes exceeds {XATTR_VALUE_MAX}")

        def work(conn, touched):
            attr = self._load(conn, ino)
            self._require(cred, attr, W_OK)
            exists = conn.execute(select(XATTRS.c.name).where(XATTRS.c.ino == ino, XATTRS.c.name == name)).first()
            if exists and create:
                raise errors.Exists(f"extended attribute {name!r} exists")
            if not exists and replace_only:
                raise errors.NoData(f"no extended attribute {name!r} on inode {ino}")
            if exists:
                conn.execute(XATTRS.update().where(XATTRS.c.ino == ino, XATTRS.c.name == name).values(value=value))
            else:
                conn.execute(XATTRS.insert().values(ino=ino, name=name, value=value))
            self._touch(conn, ino, ctime=True)
        self._write(work, (ino,))

    def removexattr(self, cred: Cred, ino: int, name: str) -> None:
        def work(conn, touched):
            self._require(cred, self._load(conn, ino), W_OK)
            if not conn.execute(XATTRS.delete().where(XATTRS.c.ino == ino, XATTRS.c.name == name)).rowcount:
                raise errors.NoData(f"no extended attribute {name!r} on inode {ino}")
            self._touch(conn, ino, ctime=True)
        self._write(work, (ino,))

    # -- helpers for changes ----------------------------------------------------------
    @staticmethod
    def _require(cred: Cred, attr: Attr, want: int) -> None:
        if not may(cred, attr, want):
            raise errors.AccessDenied(f"uid {cred.uid} lacks {_bits(want)} permission on inode {attr.ino} "
                                      f"(mode {attr.mode:o}, owner {attr.uid}:{attr.gid})")

    def _dir_for_change(self, conn: Connection, cred: Cred, dir_ino: int) -> Attr:
        parent = self._load(conn, dir_ino)
        if parent.type != DIR:
            raise errors.NotADirectory(f"inode {dir_ino} is not a directory")
        if parent.nlink == 0:
            raise errors.NotFound(f"directory {dir_ino} has been removed")
        self._require(cred, parent, W_OK | X_OK)
        return parent

    @staticmethod
    def _touch(conn: Connection, ino: int, *, mtime: bool = False, ctime: bool = True, nlink_delta: int = 0) -> None:
        now = time.time_ns()
        sets, params = ["change = change + 1"], []
        if mtime:
            sets.append("mtime_ns = ?")
            params.append(now)
        if ctime:
            sets.append("ctime_ns = ?")
            params.append(now)
        if nlink_delta:
            sets.append("nlink = nlink + ?")
            params.append(nlink_delta)
        _sql(conn, f"UPDATE inodes SET {', '.join(sets)} WHERE ino = ?", (*params, ino))

    @staticmethod
    def _entry(conn: Connection, dir_ino: int, name: str):
        row = _one(conn, "SELECT id, child FROM dirents WHERE parent = ? AND name = ?", (dir_ino, name))
        return None if row is None else _Entry(*row)

    @staticmethod
    def _check_sticky(cred: Cred, parent: Attr, victim: Attr) -> None:
        if parent.mode & S_ISVTX and cred.uid not in (0, parent.uid, victim.uid):
            raise errors.NotPermitted(f"sticky directory {parent.ino}: uid {cred.uid} may not remove inode {victim.ino}")

    def _new_inode(self, conn: Connection, cred: Cred, parent: Attr, ftype: int, mode: int,
                   rdev: int = 0, size: int = 0) -> Attr:
        now = time.time_ns()
        gid = parent.gid if parent.mode & S_ISGID else cred.gid
        mode &= 0o7777
        if ftype == DIR and parent.mode & S_ISGID:
            mode |= S_ISGID
        elif mode & S_ISGID and cred.uid != 0 and not cred.in_group(gid):
            mode &= ~S_ISGID
        nlink = 2 if ftype == DIR else 1
        ino = _one(conn, "INSERT INTO inodes (generation, type, mode, uid, gid, size, nlink, rdev, atime_ns, "
                   "mtime_ns, ctime_ns, btime_ns, change) VALUES (1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1) "
                   "RETURNING ino", (ftype, mode, cred.uid, gid, size, nlink, rdev, now, now, now, now))[0]
        return Attr(ino, 1, ftype, mode, cred.uid, gid, size, nlink, rdev, now, now, now, now, 1)

    def _make(self, cred: Cred, dir_ino: int, name: str, ftype: int, mode: int, *, rdev: int = 0,
              target: bytes | None = None, exclusive: bool = True) -> Attr:
        check_name(name)

        def work(conn, touched):
            parent = self._dir_for_change(conn, cred, dir_ino)
            existing = self._entry(conn, dir_ino, name)
            if existing is not None:
                if exclusive or ftype != REG:
                    raise errors.Exists(f"{name!r} exists in directory {dir_ino}")
                attr = self._load(conn, existing.child)
                if attr.type == DIR:
                    raise errors.IsADirectory(f"{name!r} is a directory")
                return attr
            if ftype == DIR and parent.nlink >= MAX_LINKS:
                raise errors.TooManyLinks(f"directory {dir_ino} has {parent.nlink} links")
            attr = self._new_inode(conn, cred, parent, ftype, mode, rdev, size=len(target) if target else 0)
            if target is not None:
                conn.execute(SYMLINKS.insert().values(ino=attr.ino, target=target))
            _sql(conn, "INSERT INTO dirents (parent, name, child) VALUES (?, ?, ?)", (dir_ino, name, attr.ino))
            self._touch(conn, dir_ino, mtime=True, nlink_delta=1 if ftype == DIR else 0)
            if ftype == REG and self.data is not None:
                self.data.created(conn, attr.ino)  # its first write then needs no catalog read
            touched.add(attr.ino)
            touched.names[(dir_ino, name)] = attr.ino
            return attr
        return self._write(work, (dir_ino,), ((dir_ino, name),))

    def _drop_link(self, conn: Connection, ino: int, touched: _Touched) -> None:
        """One name of ``ino`` is gone: free it when no name and no opener remain."""
        attr = self._load(conn, ino)
        nlink = 0 if attr.type == DIR else attr.nlink - 1
        _sql(conn, "UPDATE inodes SET nlink = ?, ctime_ns = ?, change = change + 1 WHERE ino = ?",
             (nlink, time.time_ns(), ino))
        if nlink == 0 and not self._open_refs.get(ino):
            self._free(conn, ino, touched)

    def _free(self, conn: Connection, ino: int, touched: _Touched) -> None:
        """Free an inode with no name and no opener; a big file keeps its inode row (an orphan, as
        if open) until later transactions have freed the rest of its extents (touched.unfreed)."""
        if self.data is not None and not self.data.release(conn, ino, FREE_CHUNK_EXTENTS):
            touched.unfreed.append(ino)
            return
        _sql(conn, "DELETE FROM symlinks WHERE ino = ?", (ino,))
        _sql(conn, "DELETE FROM xattrs WHERE ino = ?", (ino,))
        _sql(conn, "DELETE FROM inodes WHERE ino = ?", (ino,))

    # -- changes ---------------------------------------------------------------------
    def create(self, cred: Cred, dir_ino: int, name: str, mode: int = 0o644, *, exclusive: bool = True) -> Attr:
        """A regular file; with ``exclusive=False`` an existing file is returned."""
        return self._make(cred, dir_ino, name, REG, mode, exclusive=exclusive)

    def mknod(self, cred: Cred, dir_ino: int, name: str, ftype: int, mode: int, rdev: int = 0) -> Attr:
        if ftype not in (BLK, CHR, SOCK, FIFO):
            raise errors.InvalidArgument(f"mknod of file type {ftype}: expected a device, socket or fifo")
        if ftype in (BLK, CHR) and cred.uid != 0:
            raise errors.NotPermitted("only root may create device nodes")
        return self._make(cred, dir_ino, name, ftype, mode, rdev=rdev)

    def mkdir(self, cred: Cred, dir_ino: int, name: str, mode: int = 0o755) -> Attr:
        return self._make(cred, dir_ino, name, DIR, mode)

    def symlink(self, cred: Cred, dir_ino: int, name: str, target: bytes | str) -> Attr:
        if isinstance(target, str):
            target = target.encode("utf-8", "surrogateescape")
        if not target or len(target) > SYMLINK_MAX or b"\0" in target:
            raise errors.InvalidArgument(f"symlink target of {len(target)} bytes: expected 1-{SYMLINK_MAX}, no NUL")
        return self._make(cred, dir_ino, name, LNK, 0o777, target=target)

    def link(self, cred: Cred, ino: int, dir_ino: int, name: str) -> Attr:
        check_name(name)

        def work(conn, touched):
            attr = self._load(conn, ino)
            if attr.type == DIR:
                raise errors.NotPermitted(f"hard link to directory {ino}")
            if attr.nlink == 0:
                raise errors.NotFound(f"inode {ino} has been removed")
            if attr.nlink >= MAX_LINKS:
                raise errors.TooManyLinks(f"inode {ino} has {attr.nlink} links")
            self._dir_for_change(conn, cred, dir_ino)
            if self._entry(conn, dir_ino, name) is not None:
                raise errors.Exists(f"{name!r} exists in directory {dir_ino}")
            conn.execute(DIRENTS.insert().values(parent=dir_ino, name=name, child=ino))
            self._touch(conn, ino, nlink_delta=1)
            self._touch(conn, dir_ino, mtime=True)
            return self._load(conn, ino)
        return self._write(work, (ino, dir_ino), ((dir_ino, name),))

    def unlink(self, cred: Cred, dir_ino: int, name: str) -> None:
        check_name(name)

        def work(conn, touched):
            parent = self._dir_for_change(conn, cred, dir_ino)
            entry = self._entry(conn, dir_ino, name)
            if entry is None:
                raise errors.NotFound(f"{name!r} not found in directory {dir_ino}")
            victim = self._load(conn, entry.child)
            if victim.type == DIR:
                raise errors.IsADirectory(f"{name!r} is a directory: use rmdir")
            self._check_sticky(cred, parent, victim)
            _sql(conn, "DELETE FROM dirents WHERE id = ?", (entry.id,))
            self._touch(conn, dir_ino, mtime=True)
            touched.add(victim.ino)
            self._drop_link(conn, victim.ino, touched)
        self._write(work, (dir_ino,), ((dir_ino, name),))

    def rmdir(self, cred: Cred, dir_ino: int, name: str) -> None:
        if name == ".":
            raise errors.InvalidArgument("rmdir of '.'")
        if name == "..":
            raise errors.NotEmpty("rmdir of '..'")
        check_name(name)

        def work(conn, touched):
            parent = self._dir_for_change(conn, cred, dir_ino)
            entry = self._entry(conn, dir_ino, name)
            if entry is None:
                raise errors.NotFound(f"{name!r} not found in directory {dir_ino}")
            victim = self._load(conn, entry.child)
            if victim.type != DIR:
                raise errors.NotADirectory(f"{name!r} is not a directory")
            self._check_sticky(cred, parent, victim)
            if conn.execute(select(DIRENTS.c.id).where(DIRENTS.c.parent == victim.ino).limit(1)).first():
                raise errors.NotEmpty(f"directory {name!r} is not empty")
            conn.execute(DIRENTS.delete().where(DIRENTS.c.id == entry.id))
            self._touch(conn, dir_ino, mtime=True, nlink_delta=-1)
            touched.add(victim.ino)
            self._drop_link(conn, victim.ino, touched)
        self._write(work, (dir_ino,), ((dir_ino, name),))

    def rename(self, cred: Cred, src_dir: int, src_name: str, dst_dir: int, dst_name: str) -> None:
        """POSIX rename in one transaction: a reader sees the old or the new name."""
        check_name(src_name)
        check_name(dst_name)

        def work(conn, touched):
            src_parent = self._dir_for_change(conn, cred, src_dir)
            dst_parent = src_parent if dst_dir == src_dir else self._dir_for_change(conn, cred, dst_dir)
            entry = self._entry(conn, src_dir, src_name)
            if entry is None:
                raise errors.NotFound(f"{src_name!r} not found in directory {src_dir}")
            moving = self._load(conn, entry.child)
            touched.add(moving.ino)
            self._check_sticky(cred, src_parent, moving)
            if moving.type == DIR and dst_dir != src_dir:
                self._refuse_loop(conn, moving.ino, dst_dir)
                # moving a directory rewrites its '..': needs write permission on it
                self._require(cred, moving, W_OK)
            target = self._entry(conn, dst_dir, dst_name)
            if target is not None:
                if target.child == moving.ino:
                    return  # both names are links to the same file: POSIX says do nothing
                victim = self._load(conn, target.child)
                self._check_sticky(cred, dst_parent, victim)
                if moving.type == DIR:
                    if victim.type != DIR:
                        raise errors.NotADirectory(f"cannot replace non-directory {dst_name!r} with a directory")
                    if conn.execute(select(DIRENTS.c.id).where(DIRENTS.c.parent == victim.ino).limit(1)).first():
                        raise errors.NotEmpty(f"directory {dst_name!r} is not empty")
                elif victim.type == DIR:
                    raise errors.IsADirectory(f"cannot replace directory {dst_name!r} with a non-directory")
                conn.execute(DIRENTS.delete().where(DIRENTS.c.id == target.id))
                if victim.type == DIR:
                    self._touch(conn, dst_dir, nlink_delta=-1)
                touched.add(victim.ino)
                self._drop_link(conn, victim.ino, touched)
            _sql(conn, "UPDATE dirents SET parent = ?, name = ? WHERE id = ?", (dst_dir, dst_name, entry.id))
            self._touch(conn, moving.ino)
            delta = 1 if moving.type == DIR and dst_dir != src_dir else 0
            self._touch(conn, src_dir, mtime=True, nlink_delta=-delta)
            if dst_dir != src_dir:
                self._touch(conn, dst_dir, mtime=True, nlink_delta=delta)
        self._write(work, (src_dir, dst_dir), ((src_dir, src_name), (dst_dir, dst_name)))

    def _refuse_loop(self, conn: Connection, moving: int, dst_dir: int) -> None:
        current = dst_dir
        while True:
            if current == moving:
                raise errors.InvalidArgument(f"cannot move directory {moving} into its own subtree")
            if current == self.root_ino:
                return
            current = self._parent_of(conn, current)

    def setattr(self, cred: Cred, ino: int, *, mode: int | None = None, uid: int | None = None,
                gid: int | None = None, size: int | None = None, atime_ns=None, mtime_ns=None) -> Attr:
        """chmod/chown/truncate/utimes. Times are ns, or SET_TO_NOW.

        A call that would change nothing (the same mode, owner or size, no times) is checked and
        answered from the cache without a write: like ext4's truncate to the same size, it then
        leaves ctime alone. Clients send such calls on every create (mode right after OPEN,
        size 0 on a new file), and each write transaction costs more than the rest of the call."""
        if size is not None and size < 0:
            raise errors.InvalidArgument(f"size {size}: expected >= 0")
        if mode is not None and not 0 <= mode <= 0o7777:
            raise errors.InvalidArgument(f"mode {mode:o}: expected 0-7777 (octal)")
        if self.data is not None and size is not None:
            self.data.flush(ino)  # buffered writes land before the cut
        wanted = dict(mode=mode, uid=uid, gid=gid, size=size, atime_ns=atime_ns, mtime_ns=mtime_ns)
        if atime_ns is None and mtime_ns is None and self._cache_valid():
            cached = self._cache.get(ino)
            if cached is not None and not self._setattr_values(cred, cached, now=0, **wanted):
                return self._with_pending(cached)

        def work(conn, touched):
            attr = self._load(conn, ino)
            now = time.time_ns()
            values = self._setattr_values(cred, attr, now=now, **wanted)
            if "size" in values and self.data is not None:
                self.data.truncate(conn, ino, attr.size, size)
            values["ctime_ns"] = now
            _sql(conn, f"UPDATE inodes SET {', '.join(f'{key} = ?' for key in values)}, change = change + 1 "
                       "WHERE ino = ?", (*values.values(), ino))
            return self._load(conn, ino)
        return self._write(work, (ino,))

    @staticmethod
    def _setattr_values(cred: Cred, attr: Attr, *, now: int, mode, uid, gid, size, atime_ns, mtime_ns) -> dict:
        """The columns a setattr changes (ctime aside), after its permission checks."""
        ino = attr.ino
        owner = cred.uid in (0, attr.uid)
        values: dict = {}
        new_mode = attr.mode
        if uid is not None and uid != attr.uid:
            if cred.uid != 0:
                raise errors.NotPermitted(f"uid {cred.uid} may not give inode {ino} to uid {uid}")
            values["uid"] = uid
        if gid is not None and gid != attr.gid:
            if cred.uid != 0 and not (cred.uid == attr.uid and cred.in_group(gid)):
                raise errors.NotPermitted(f"uid {cred.uid} may not set group {gid} on inode {ino}")
            values["gid"] = gid
        if values and attr.type != DIR and cred.uid != 0:
            new_mode &= ~(S_ISUID | S_ISGID)  # chown by a user drops set-id bits
        if mode is not None:
            if not owner:
                raise errors.NotPermitted(f"uid {cred.uid} does not own inode {ino}")
            new_mode = mode
            if cred.uid != 0 and not cred.in_group(values.get("gid", attr.gid)):
                new_mode &= ~S_ISGID
        if new_mode != attr.mode:
            values["mode"] = new_mode
        for key, wanted in (("atime_ns", atime_ns), ("mtime_ns", mtime_ns)):
            if wanted is None:
                continue
            if wanted is SET_TO_NOW:
                if not owner and not may(cred, attr, W_OK):
                    raise errors.AccessDenied(f"uid {cred.uid} may not touch inode {ino}")
                values[key] = now
            else:
                if not owner:
                    raise errors.NotPermitted(f"uid {cred.uid} may not set times of inode {ino}")
                values[key] = int(wanted)
        if size is not None:
            if attr.type == DIR:
                raise errors.IsADirectory(f"inode {ino} is a directory")
            if attr.type != REG:
                raise errors.InvalidArgument(f"inode {ino} is not a regular file")
            if not may(cred, attr, W_OK) and cred.uid != attr.uid:
                raise errors.AccessDenied(f"uid {cred.uid} may not write inode {ino}")
            if size != attr.size:
                values["size"] = size
                values.setdefault("mtime_ns", now)
        return values

    # -- file data -------------------------------------------------------------------
    def _data(self) -> FileData:
        if self.data is None:
            raise errors.IOFailure("no data path attached to this namespace")
        return self.data

    def _file_in_use(self, ino: int) -> Attr:
        """getattr for reads and writes: a file with no name and no opener is being freed (a chunk
        of extents per transaction), so its handle is stale, as once it is gone; a read must never
        see the holes its freed extents leave."""
        attr = self.getattr(ino)
        if attr.nlink == 0 and attr.type == REG and not self.is_open(ino):
            raise errors.StaleHandle(f"inode {ino} has been removed")
        return attr

    def read(self, ino: int, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes at ``offset``; short at end of file."""
        if offset < 0 or length < 0:
            raise errors.InvalidArgument(f"read at {offset} of {length} bytes")
        attr = self._file_in_use(ino)
        if attr.type == DIR:
            raise errors.IsADirectory(f"inode {ino} is a directory")
        if attr.type != REG:
            raise errors.InvalidArgument(f"inode {ino} is not a regular file")
        if offset >= attr.size or length == 0:
            return b""
        return self._data().read(ino, offset, min(length, attr.size - offset), attr.size)

    def write(self, ino: int, offset: int, data: bytes, *, stable: bool = False) -> int:
        """Write ``data`` at ``offset``; with ``stable`` it is durable on return."""
        if offset < 0:
            raise errors.InvalidArgument(f"write at offset {offset}")
        attr = self._file_in_use(ino)
        if attr.type == DIR:
            raise errors.IsADirectory(f"inode {ino} is a directory")
        if attr.type != REG:
            raise errors.InvalidArgument(f"inode {ino} is not a regular file")
        store = self._data()
        store.write(ino, offset, data)
        if stable:
            store.flush(ino)
        return len(data)

    def commit(self, ino: int) -> None:
        """Make every write to ``ino`` so far durable (NFS COMMIT, fsync)."""
        if self.data is not None:
            self.data.flush(ino)

    # -- open references (files unlinked while open keep their data) ------------------
    def open_ref(self, ino: int) -> None:
        with self._open_lock:
            self._open_refs[ino] = self._open_refs.get(ino, 0) + 1

    def is_open(self, ino: int) -> bool:
        """Whether some caller of this Namespace holds ``ino`` open (retention skips it)."""
        with self._open_lock:
            return self._open_refs.get(ino, 0) > 0

    def close_ref(self, ino: int) -> None:
        with self._open_lock:
            left = self._open_refs.get(ino, 0) - 1
            if left > 0:
                self._open_refs[ino] = left
                return
            self._open_refs.pop(ino, None)
        try:
            if self.getattr(ino).nlink > 0:
                return  # still named: nothing to free (the common close, with no write transaction)
        except errors.StaleHandle:
            return

        def work(conn, touched):
            row = conn.execute(select(INODES.c.nlink).where(INODES.c.ino == ino)).first()
            if row is not None and row.nlink == 0:
                self._free(conn, ino, touched)
        self._write(work, (ino,))

    def reclaim_orphans(self) -> int:
        """Free inodes left with no name by a crash while they were open."""
        orphans = self.catalog.read(lambda conn: list(conn.execute(select(INODES.c.ino).where(
            and_(INODES.c.nlink == 0, INODES.c.ino != self.root_ino))).scalars()))
        self._free_orphans(orphans)  # each is checked again (and skipped if open) in its transaction
        self.invalidate()
        return len(orphans)


def _bits(want: int) -> str:
    return "".join(ch for bit, ch in ((R_OK, "r"), (W_OK, "w"), (X_OK, "x")) if want & bit)
