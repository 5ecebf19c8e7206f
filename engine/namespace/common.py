"""What every part of the namespace shares: credentials, attributes, limits, permission checks,
the statements that read and touch an inode row, and the change listeners.

Also the seam to the data path (``FileData``) and the tables' names."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from sqlalchemy.engine import Connection

from engine.base import errors
from engine.catalog.database import in_list, sql, sql_one
from engine.catalog.models import (  # noqa: F401 - the file types, for the package's users
    BLK,
    CHR,
    DIR,
    FIFO,
    LNK,
    REG,
    SOCK,
    Dirent,
    Inode,
    Symlink,
    Xattr,
)

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
    # folders of this uid that this identity does not own: the export folders given to an
    # export's anonymous user, whose uid every squashed client shares (invariant 12)
    disowned: frozenset[int] = frozenset()

    def in_group(self, gid: int) -> bool:
        return gid == self.gid or gid in self.groups

    def owns(self, attr: Attr) -> bool:
        """Whether this identity has owner rights over ``attr`` (root aside)."""
        return self.uid == attr.uid and attr.ino not in self.disowned


ROOT = Cred(0, 0)
# A backstop: no cache entry is served this long after it was read, even if every commit since
# was accounted for (each entry has its own deadline: the cache is never emptied at once for it).
# At 1 s the stat of 2,000 files cost a query each after every clear (2,840/s, now 4,400/s with
# nfs4fs).
CACHE_TTL_S = 10.0
CACHE_MAX_ENTRIES = 200_000  # attributes + names; about 60 MB at most
# a directory of at most this many names is read whole at a lookup of a name it lacks, so that
# the next such lookups are answered from the cache (NameCache, "complete")
COMPLETE_DIR_MAX = 4096
COMPLETE_DIR_RETRY_S = 1.0  # a directory is read whole at most once in this time
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

    def read(self, ino: int, offset: int, length: int, size: int) -> bytes | bytearray: ...
    # returns the new pending size
    def write(
        self, ino: int, offset: int, data: bytes | bytearray, *, seen_change: int = 0
    ) -> int: ...
    def flush(self, ino: int) -> None: ...  # durable and committed on return
    def pending_size(self, ino: int) -> int | None: ...  # size counting buffered writes
    # (size, change, mtime_ns) counting buffered writes, or None
    def pending_attrs(self, ino: int) -> tuple[int, int, int] | None: ...
    # a namespace transaction changed these inodes (their change attribute moved)
    def changed(self, inos) -> None: ...
    # a setattr sets the mtime explicitly, in its transaction: buffered writes keep that time
    def times_set(self, ino: int) -> None: ...
    def truncate(self, conn: Connection, ino: int, old_size: int, new_size: int) -> None: ...
    # a new regular file, in its create transaction
    def created(self, conn: Connection, ino: int) -> None: ...
    # inode freed: its extents become garbage
    def release(self, conn: Connection, ino: int, limit: int | None = None) -> bool: ...
    def capacity(self) -> tuple[int, int]: ...  # usable (total, free) bytes
    # the file's data as sorted, merged [start, end) ranges
    def data_ranges(self, conn: Connection, ino: int) -> list[tuple[int, int]]: ...
    # the same, or None when the file has more than ``most`` extents
    def few_data_ranges(
        self, conn: Connection, ino: int, most: int
    ) -> list[tuple[int, int]] | None: ...
    # [dst_off, +length) of dst shares src's stripes at [src_off, +length); returns extents shared
    def clone_range(
        self, conn: Connection, src: int, src_off: int, dst: int, dst_off: int, length: int
    ) -> int: ...
    # a hole at [offset, +length) (the size stays); returns the bytes that were referenced there
    def punch(self, conn: Connection, ino: int, offset: int, length: int) -> int: ...


ATTR_COLUMNS = [INODES.c[name] for name in Attr.__slots__]
ATTR_SQL = ", ".join(f"inodes.{name}" for name in Attr.__slots__)
ATTR_RETURNING = ", ".join(Attr.__slots__)  # RETURNING takes no table-qualified names


class Touched(set):
    """Inodes a write transaction changed, and the names it created ((dir, name) -> ino) and
    removed."""

    def __init__(self, inos=()):
        super().__init__(inos)
        self.names: dict[tuple[int, str], int] = {}
        self.gone: set[tuple[int, str]] = set()  # (dir, name) entries the work removed
        self.unfreed: list[int] = []  # orphans with extents left to free after this commit
        # inodes whose attributes at commit the work already has (no statement after it changes
        # them): _write caches these instead of reading them again (a round trip on PostgreSQL)
        self.known: dict[int, Attr] = {}
        # extended attributes: every one of an inode at commit (cached like ``known``), and the
        # inodes whose extended attributes the work left alone (a cached map of them stays)
        self.xattrs: dict[int, dict[str, bytes]] = {}
        self.xattrs_kept: set[int] = set()


class Entry(NamedTuple):
    id: int
    child: int


def attr_of_row(row) -> Attr:
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
    if cred.owns(attr):
        bits = (attr.mode >> 6) & 7
    elif cred.in_group(attr.gid):
        bits = (attr.mode >> 3) & 7
    else:
        bits = attr.mode & 7
    return bits & want == want


def mode_bits(want: int) -> str:
    return "".join(ch for bit, ch in ((R_OK, "r"), (W_OK, "w"), (X_OK, "x")) if want & bit)


# -- reading and changing inode rows: the statements every part shares -----------------------
def load_many(conn: Connection, inos) -> list[Attr]:
    """The attributes of those of ``inos`` that exist."""
    ids = sorted(inos)
    return [
        attr_of_row(row)
        for row in sql(
            conn, f"SELECT {ATTR_SQL} FROM inodes WHERE ino IN {in_list(ids)}", tuple(ids)
        )
    ]


def load(conn: Connection, ino: int) -> Attr:
    row = sql_one(conn, f"SELECT {ATTR_SQL} FROM inodes WHERE ino = ?", (ino,))
    if row is None:
        raise errors.StaleHandle(f"inode {ino} does not exist")
    return attr_of_row(row)


def touch(
    conn: Connection,
    ino: int,
    *,
    mtime: bool = False,
    ctime: bool = True,
    nlink_delta: int = 0,
    returning: bool = False,
) -> Attr | None:
    """Bump ``ino``'s change counter and times; ``returning``: its attributes afterwards."""
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
    text = f"UPDATE inodes SET {', '.join(sets)} WHERE ino = ?"
    if not returning:
        sql(conn, text, (*params, ino))
        return None
    row = sql_one(conn, f"{text} RETURNING {ATTR_RETURNING}", (*params, ino))
    return None if row is None else attr_of_row(row)


def require(cred: Cred, attr: Attr, want: int) -> None:
    """EACCES unless ``cred`` is granted ``want`` (R_OK|W_OK|X_OK bits) on ``attr``."""
    if not may(cred, attr, want):
        raise errors.AccessDenied(
            f"uid {cred.uid} lacks {mode_bits(want)} permission on inode "
            f"{attr.ino} "
            f"(mode {attr.mode:o}, owner {attr.uid}:{attr.gid})"
        )


class ChangeListeners:
    """Called after each change this process makes (namespace writes, data-path commits, buffered
    writes that grow a file) with the inodes and (dir, name) entries it changed, in the changing
    thread: a listener must only take note (the FUSE mount queues kernel cache invalidations)."""

    def __init__(self) -> None:
        self.listeners: tuple = ()  # replaced whole, so a notify needs no lock

    def add(self, listener) -> None:
        self.listeners = (*self.listeners, listener)

    def remove(self, listener) -> None:
        self.listeners = tuple(x for x in self.listeners if x != listener)

    def notify(self, inos, names=()) -> None:
        for listener in self.listeners:
            listener(inos, names)
