"""The namespace API: the one entry point to files and directories.

Its calls mirror POSIX (and so NFS) operations on inode numbers. The NFS
server, the SMB bridge, the web UI, the CLI and the tests all use it. Each
call is one catalog transaction (``Catalog.run``); errors are the typed
``engine.base.errors`` exceptions carrying an errno.

File data goes through a ``FileData`` object (engine.datapath) attached at
construction; the namespace calls it inside its own transactions where
metadata and data must change together (truncate, freeing an inode).

A Namespace is made of parts, each an object that owns its own state; the Namespace builds
them, wires them together and offers their public methods as its own (bound in ``__init__``: a
call reaches the part with no extra frame on the hot path):
- common.py: Cred, Attr, DirEntry, StatFs, FileData, limits, ``may``/``check_name``, the inode
  statements every part shares (``load``, ``touch``, ``require``), ChangeListeners
- cache.py: NameCache, the in-process attribute, name and small-xattr cache
- transactions.py: Transactions, the write transactions (``write``) and the freeing of inodes
- readonly.py: ReadOnlyViews, snapshot views (``DIR/.snapshots/NAME``) refuse changes (EROFS)
- reads.py: Reads, getattr/lookup/resolve/path_of/readlink/access/readdir/statfs
- ancestry.py: Ancestry, ``is_inside`` (an inode within a directory's subtree: export
  confinement), its cache forgotten by the renames and links it hears of
- xattrs.py: Xattrs; directory.py: DirectoryOps (create ... rename)
- files.py: FileOps, setattr, read/write/commit, the last close, orphans
- openrefs.py: OpenRefs, open references (a file unlinked while open keeps its data)
- space.py: SpaceUsed, a file's space used (st_blocks); ranges.py: RangeOps,
  clone_range/copy_range/seek_data/seek_hole/allocate/deallocate
- engine/namespace/quotas.py: QuotaTracker (``namespace.quotas``), hard-limit checks and counters
"""

from __future__ import annotations

import time

from engine.catalog.database import Catalog
from engine.namespace.ancestry import Ancestry
from engine.namespace.cache import NameCache
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
    ChangeListeners,
    Cred,
    DirEntry,
    FileData,
    StatFs,
    check_name,
    load_many,
    may,
)
from engine.namespace.directory import DirectoryOps
from engine.namespace.files import FileOps
from engine.namespace.lazyviews import CopyUpWatch
from engine.namespace.openrefs import OpenRefs
from engine.namespace.quotas import QuotaTracker
from engine.namespace.ranges import RangeOps
from engine.namespace.readonly import ReadOnlyViews
from engine.namespace.reads import Reads
from engine.namespace.space import SpaceUsed
from engine.namespace.transactions import Transactions
from engine.namespace.xattrs import Xattrs


class Namespace:
    def __init__(
        self, catalog: Catalog, data: FileData | None = None, *, snapshots_visible: bool = False
    ):
        self.catalog = catalog
        self.data = data
        root = catalog.get_setting(ROOT_INO_KEY)
        self.root_ino = int(root) if root is not None else self._make_root()
        # the parts, each given the parts it uses (built in that order)
        self.cache = cache = NameCache(catalog)
        self.listeners = listeners = ChangeListeners()
        self.open_refs = open_refs = OpenRefs()
        self.readonly = readonly = ReadOnlyViews(catalog)
        self.writes = writes = Transactions(catalog, data, cache, listeners, open_refs)
        self.reads = reads = Reads(
            catalog, data, cache, readonly, self.root_ino, snapshots_visible=snapshots_visible
        )
        self.ancestry = ancestry = Ancestry(catalog, cache, self.root_ino)
        self.quotas = quotas = QuotaTracker(catalog, self.root_ino)
        self.space = space = SpaceUsed(catalog, data)
        self.xattrs = xattrs = Xattrs(cache, readonly, writes)
        self.dirs = dirs = DirectoryOps(reads, readonly, writes, quotas, open_refs)
        self.files = files = FileOps(reads, readonly, writes, quotas, open_refs, listeners)
        self.ranges = ranges = RangeOps(reads, readonly, files)
        listeners.add(ancestry.changed)  # a link or rename changes what is inside what
        listeners.add(quotas.names_changed)
        # set by a protocol server whose clients cache files (NFSv4 delegations): the local
        # mount asks it before a change (``held(ino)``, then ``wait_returned(ino)`` in a thread)
        self.change_guard = None

        # the public API: each part's methods, bound here once
        self.add_change_listener, self.remove_change_listener = listeners.add, listeners.remove
        self.invalidate = cache.invalidate
        self.is_read_only, self.snapshot_dirs = readonly.is_read_only, readonly.snapshot_dirs
        self.forget_read_only = readonly.forget
        self.getattr, self.lookup, self.parent = reads.getattr, reads.lookup, reads.parent
        self.resolve, self.path_of, self.readlink = reads.resolve, reads.path_of, reads.readlink
        self.access, self.readdir, self.statfs = reads.access, reads.readdir, reads.statfs
        self.is_inside = ancestry.is_inside
        self.getxattr, self.listxattr = xattrs.getxattr, xattrs.listxattr
        self.setxattr, self.removexattr = xattrs.setxattr, xattrs.removexattr
        self.create, self.mknod, self.mkdir = dirs.create, dirs.mknod, dirs.mkdir
        self.symlink, self.link, self.unlink = dirs.symlink, dirs.link, dirs.unlink
        self.rmdir, self.rename = dirs.rmdir, dirs.rename
        self.setattr, self.read, self.write = files.setattr, files.read, files.write
        self.commit, self.reclaim_orphans = files.commit, files.reclaim_orphans
        self.open_ref, self.is_open = open_refs.open_ref, open_refs.is_open
        self.close_ref, self.close_ref_is_cheap = files.close_ref, files.close_ref_is_cheap
        self.space_used = space.space_used
        self.clone_range, self.copy_range = ranges.clone_range, ranges.copy_range
        self.seek_data, self.seek_hole = ranges.seek_data, ranges.seek_hole
        self.allocate, self.deallocate = ranges.allocate, ranges.deallocate

        listen = getattr(data, "add_commit_listener", None)
        if listen is not None:
            # data-path commits change sizes and times
            listen(self._data_committed, self._fresh_attrs)
        watch = getattr(data, "add_size_watch", None)
        if watch is not None:
            watch(quotas)  # and move the quota counters in their own transaction
            watch(CopyUpWatch(readonly))  # lazy snapshot views copy a file before it changes

    @property
    def snapshots_visible(self) -> bool:
        """DIR/.snapshots listed in DIR's readdir (config snapshots.visible; ZFS's snapdir)."""
        return self.reads.snapshots_visible

    @snapshots_visible.setter
    def snapshots_visible(self, visible: bool) -> None:
        self.reads.snapshots_visible = visible

    # -- data-path commits ---------------------------------------------------------------
    def _fresh_attrs(self, conn, inos):
        """Inside a data-path commit: the changed files' new attributes and the space used of
        the small ones, for _data_committed."""
        cache = self.cache
        if not inos or not cache.valid():  # first take in whatever others committed before us
            return None
        attrs = load_many(conn, inos)
        # gen: taken under the write lock, as in Transactions.write
        return attrs, cache.gen, self.space.at_commit(conn, attrs)

    def _data_committed(self, inos, found) -> None:
        fresh, gen, used = found if found is not None else ((), None, {})
        self.writes.changed(inos, (), fresh, gen, xattrs_kept=inos)  # data commits change no xattrs
        for attr in fresh:
            if attr.ino in used:
                self.space.remember(attr, used[attr.ino])
        self.quotas.committed(inos)

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
