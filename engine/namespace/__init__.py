"""The namespace API: the one entry point to files and directories.

Its calls mirror POSIX (and so NFS) operations on inode numbers. The NFS
server, the SMB bridge, the web UI, the CLI and the tests all use it. Each
call is one catalog transaction (``Catalog.run``); errors are the typed
``engine.errors`` exceptions carrying an errno.

File data goes through a ``FileData`` object (engine.datapath) attached at
construction; the namespace calls it inside its own transactions where
metadata and data must change together (truncate, freeing an inode).

Package layout (one class ``Namespace`` made of parts; each part is a mixin over the same state):
- common.py: Cred, Attr, DirEntry, StatFs, FileData, limits, ``may``/``check_name``
- cache.py: AttrCache, the in-process attribute and name cache and ``_write`` transactions
- lookup.py: Lookup, getattr/lookup/resolve/path_of/readlink/access/readdir/statfs
- xattrs.py: Xattrs; directory.py: DirectoryOps (create ... rename, freeing inodes)
- files.py: FileOps, setattr, read/write/commit, open references, orphans
- ranges.py: RangeOps, clone_range/copy_range/seek_data/seek_hole/allocate/deallocate
- readonly.py: ReadOnlyInodes, snapshot views (``DIR/.snapshots/NAME``) refuse changes (EROFS)
- ancestry.py: Ancestry, ``is_inside`` (an inode within a directory's subtree: export
  confinement), its cache forgotten by the renames and links it wraps
"""

from __future__ import annotations

import threading
import time

from engine.catalog.database import Catalog
from engine.namespace.ancestry import Ancestry
from engine.namespace.common import (  # noqa: F401 - the package's public names
    CACHE_MAX_ENTRIES,
    CACHE_TTL_S,
    DIR,
    DIRENTS,
    FREE_CHUNK_EXTENTS,
    INODES,
    MAX_LINKS,
    NAME_MAX,
    R_OK,
    ROOT,
    ROOT_INO_KEY,
    S_ISGID,
    S_ISUID,
    S_ISVTX,
    SET_TO_NOW,
    SYMLINK_MAX,
    SYMLINKS,
    W_OK,
    X_OK,
    XATTR_NAME_MAX,
    XATTR_VALUE_MAX,
    XATTRS,
    Attr,
    Cred,
    DirEntry,
    FileData,
    StatFs,
    check_name,
    may,
)
from engine.namespace.directory import DirectoryOps
from engine.namespace.ranges import RangeOps
from engine.namespace.xattrs import Xattrs
from engine.quotas import QuotaTracker


# each part builds on AttrCache (most through Lookup <- ReadOnlyInodes), so the type checker
# sees what they share
class Namespace(Ancestry, Xattrs, DirectoryOps, RangeOps):
    def __init__(
        self, catalog: Catalog, data: FileData | None = None, *, snapshots_visible: bool = False
    ):
        self.catalog = catalog
        self.data = data
        # DIR/.snapshots listed in DIR's readdir (config snapshots.visible; ZFS's snapdir)
        self.snapshots_visible = snapshots_visible
        # each entry with its deadline (AttrCache._cached)
        self._cache: dict[int, tuple[Attr, float]] = {}
        self._names: dict[tuple[int, str], tuple[int, float]] = {}
        self._complete_dirs: dict[int, float] = {}  # dir ino -> deadline: see AttrCache
        self._dirs_listed: dict[int, float] = {}  # dir ino -> until when it is not read whole
        self._xattr_cache: dict[int, tuple[dict[str, bytes], float]] = {}  # ino -> small xattrs
        self._space_used: dict[int, tuple[tuple[int, int, int], int]] = {}  # RangeOps.space_used
        self._cache_epoch: int | None = None
        self._cache_since = 0.0
        self._cache_gen = 0  # bumped by every eviction: a load that began before it is not cached
        self._cache_lock = threading.Lock()
        self._open_refs: dict[int, int] = {}
        self._open_lock = threading.Lock()
        self._readonly = None  # (epoch, lows, highs, .snapshots dirs): see readonly.py
        self._change_listeners: tuple = ()  # see AttrCache.add_change_listener
        self._init_ancestry()
        root = catalog.get_setting(ROOT_INO_KEY)
        self.root_ino = int(root) if root is not None else self._make_root()
        self.quotas = QuotaTracker(catalog, self.root_ino)
        self.add_change_listener(self.quotas.names_changed)
        listen = getattr(data, "add_commit_listener", None)
        if listen is not None:
            # data-path commits change sizes and times
            listen(self._data_committed, self._fresh_attrs)
        watch = getattr(data, "add_size_watch", None)
        if watch is not None:
            watch(self.quotas)  # and move the quota counters in their own transaction

    # -- set-up --------------------------------------------------------------
    def _make_root(self) -> int:
        def work(conn):
            now = time.time_ns()
            ino = conn.execute(
                INODES.insert().values(
                    type=DIR,
                    mode=0o755,
                    uid=0,
                    gid=0,
                    size=0,
                    nlink=2,
                    rdev=0,
                    generation=1,
                    atime_ns=now,
                    mtime_ns=now,
                    ctime_ns=now,
                    btime_ns=now,
                    change=1,
                )
            ).inserted_primary_key[0]
            return ino

        ino = self.catalog.run(work)
        self.catalog.set_setting(ROOT_INO_KEY, str(ino))
        return ino
