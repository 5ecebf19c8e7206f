"""The namespace's in-process cache of attributes and names, and its write transactions."""

from __future__ import annotations

import logging
import threading
import time
from typing import TypeVar

from sqlalchemy.engine import Connection

from engine.catalog.database import Catalog, commits_between
from engine.catalog.database import sql_one as _one
from engine.namespace.common import (
    CACHE_MAX_ENTRIES,
    CACHE_TTL_S,
    DIR,
    Attr,
    FileData,
    Touched,
)
from engine.quotas import QuotaTracker

log = logging.getLogger("shingle.namespace")
K = TypeVar("K")
V = TypeVar("V")


class AttrCache:
    """Part of Namespace: the cache and ``_write``; uses the attributes Namespace.__init__ sets."""

    # the state every part shares, set by Namespace.__init__
    catalog: Catalog
    data: FileData | None
    root_ino: int
    # each entry with the time.monotonic() after which it is not served (_cached)
    _cache: dict[int, tuple[Attr, float]]
    _names: dict[tuple[int, str], tuple[int, float]]
    _complete_dirs: dict[int, float]  # directories whose every name is in _names, to a deadline
    _dirs_listed: dict[int, float]  # directories read whole (or tried), until when not again
    _xattr_cache: dict[int, tuple[dict[str, bytes], float]]
    _space_used: dict[int, tuple[tuple[int, int, int], int]]  # see ranges.py
    _cache_epoch: int | None
    _cache_since: float
    _cache_gen: int
    _cache_lock: threading.Lock
    _open_refs: dict[int, int]
    _open_lock: threading.Lock
    _change_listeners: tuple
    _readonly: tuple | None  # see readonly.py
    quotas: QuotaTracker  # engine/quotas.py: hard-limit checks and counters

    # -- cache -----------------------------------------------------------------
    # Attributes and names are cached in process. A commit the cache cannot account for (by
    # another process, or an untracked one of this process: Catalog.only_tracked) clears it all;
    # this process's tracked namespace and data-path commits evict just what they changed and
    # keep the rest (_changed), so a write does not cost every later lookup a catalog query. No
    # entry is served CACHE_TTL_S after it was read (each carries its deadline): emptying the
    # whole cache at that age instead sent every lookup after it to the catalog at once, and a
    # stat pass over files made just before ran from the NFS workers. While Catalog.epoch is None
    # (PostgreSQL's change watch not caught up or down) nothing is cached or served from it.
    # A small directory whose names were all read in one transaction is "complete" until the
    # deadline of those entries: a name missing from _names is then missing from the directory
    # (an OPEN of a name not there yet, as nfs-rs sends before each create, needs no catalog).
    # A change of a name in it keeps that only when the change's commit says what the name is
    # now (a create's fresh entry, an unlink); any other (a rename, a failed write) forgets it.
    def _cache_valid(self) -> bool:
        """Whether the cache may be used, after clearing it if a commit it cannot account for
        ran."""
        epoch = self.catalog.epoch()
        if epoch is None:
            return False
        if epoch != self._cache_epoch:
            with self._cache_lock:
                known = self._cache_epoch
                if known is None or not self.catalog.only_tracked(known, epoch):
                    self._clear_cache(epoch)
                elif commits_between(known, epoch) > 0:  # newer (an older read changes nothing)
                    self._cache_epoch = epoch
        return True

    def _clear_cache(self, epoch: int | None) -> None:
        """Forget every entry (caller holds the cache lock); loads under way will not be cached."""
        self._cache.clear()
        self._names.clear()
        self._complete_dirs.clear()
        self._dirs_listed.clear()
        self._xattr_cache.clear()
        self._cache_gen += 1
        self._cache_epoch = epoch
        self._cache_since = time.monotonic()

    @staticmethod
    def _cached(table: dict[K, tuple[V, float]], key: K) -> V | None:
        """The entry of ``table`` (``_cache``, ``_names``, ``_xattr_cache``; the caller checked
        _cache_valid), or None when there is none or it is past its deadline."""
        hit = table.get(key)
        return hit[0] if hit is not None and hit[1] > time.monotonic() else None

    @staticmethod
    def _cache_until(read_at: float) -> float:
        """The deadline of an entry read at ``read_at``."""
        return read_at + CACHE_TTL_S

    def _remember(self, gen: int, read_at: float, attrs=(), name=None, listing=None) -> None:
        """Cache what a load that began at ``read_at`` (time.monotonic()) found, unless an
        eviction ran since it began (it may be stale). ``listing``: (dir ino, every (name, ino)
        of it), read in the same transaction."""
        until = self._cache_until(read_at)
        with self._cache_lock:
            if gen != self._cache_gen:
                return
            if len(self._cache) + len(self._names) + len(self._xattr_cache) > CACHE_MAX_ENTRIES:
                # a crude bound, reached only by walks of huge trees
                self._clear_cache(self._cache_epoch)
                return
            for attr in attrs:
                self._cache[attr.ino] = (attr, until)
            if name is not None:
                self._names[name[0]] = (name[1], until)
            if listing is not None:
                dir_ino, entries = listing
                names = self._names
                for entry_name, child in entries:
                    names[(dir_ino, entry_name)] = (child, until)
                self._complete_dirs[dir_ino] = until

    def _known_missing(self, dir_ino: int, name: str) -> bool:
        """Whether the cache proves ``name`` absent from ``dir_ino`` (the caller checked
        _cache_valid): the directory is complete, and no entry of the name is held. While it is
        complete, every entry of it lives at least as long (read with it or after it)."""
        until = self._complete_dirs.get(dir_ino)
        return until is not None and until > time.monotonic() and (dir_ino, name) not in self._names

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
        touched = Touched(inos)
        fresh: list[Attr] = []
        gen: list[int | None] = [None]  # the cache generation the transaction saw, set in run

        def run(conn):
            fresh.clear()
            touched.known.clear()  # a retried work must not cache what a rolled-back try made
            touched.gone.clear()
            touched.xattrs.clear()
            touched.xattrs_kept.clear()
            result = work(conn, touched)
            if self._cache_epoch is not None and touched:
                known = touched.known
                unknown = [ino for ino in touched if ino not in known]
                if unknown:
                    fresh.extend(self._load_many(conn, unknown))
                fresh.extend(attr for ino, attr in known.items() if ino in touched)
            # taken while this transaction holds the write lock: if no eviction runs between here
            # and _changed, no commit of this process after ours has been seen yet
            gen[0] = self._cache_gen
            return result

        committed = False
        try:
            result = self.catalog.run(run, tracked=True)  # _changed accounts for it
            committed = True
            return result, touched.unfreed
        except BaseException:
            fresh.clear()
            raise
        finally:
            if committed and self.data is not None:
                self.data.changed(touched)  # the change buffered writes show moves too
            self._changed(
                touched,
                names,
                fresh,
                gen[0],
                touched.names,
                touched.gone,
                touched.xattrs,
                touched.xattrs_kept,
            )

    def _changed(
        self,
        inos,
        names=(),
        fresh=(),
        fresh_gen=None,
        fresh_names=(),
        fresh_gone=(),
        fresh_xattrs=None,
        xattrs_kept=(),
    ) -> None:
        """This process changed ``inos`` and the (dir, name) entries ``names`` in a tracked commit:
        evict them (the rest of the cache stays valid: _cache_valid adopts the commit).
        ``fresh_names`` and ``fresh_gone``: what the commit made of names (ino, or removed).
        ``fresh_xattrs``: inodes' extended attributes at commit; ``xattrs_kept``: inodes whose
        extended attributes the commit left alone (Samba reads a file's and its folder's right
        after each create and each setxattr: keeping them saves a catalog read each)."""
        for listener in self._change_listeners:
            listener(inos, names)
        with self._cache_lock:
            current = self._cache_gen
            self._cache_gen += 1
            adopt = self._cache_epoch is not None and fresh and fresh_gen == current
            kept = xattrs_kept if adopt else ()
            for ino in inos:
                self._cache.pop(ino, None)
                if ino not in kept:
                    self._xattr_cache.pop(ino, None)
            known = dict(fresh_names) if adopt else {}
            complete = self._complete_dirs
            gone = fresh_gone if adopt else ()
            for key in names:
                self._names.pop(key, None)
                if complete and key not in known and key not in gone:
                    complete.pop(key[0], None)  # what the name is now is not known here
            if complete:
                # a directory removed, or its inode number given to another inode, is not
                still_dirs = {attr.ino for attr in fresh if attr.type == DIR} if adopt else ()
                for ino in inos:
                    if ino in complete and ino not in still_dirs:
                        del complete[ino]
            if adopt:
                # read at the end of the transaction that just committed
                until = self._cache_until(time.monotonic())
                for attr in fresh:
                    self._cache[attr.ino] = (attr, until)
                for key, ino in known.items():
                    self._names[key] = (ino, until)
                if fresh_xattrs:
                    alive = {attr.ino for attr in fresh}
                    for ino, found in fresh_xattrs.items():
                        if ino in alive:
                            self._xattr_cache[ino] = (found, until)

    def _fresh_attrs(self, conn, inos):
        """Inside a data-path commit: the changed files' new attributes and the space used of
        the small ones, for _data_committed."""
        if not inos or not self._cache_valid():  # first take in whatever others committed before us
            return None
        attrs = self._load_many(conn, inos)
        # gen: taken under the write lock, as in _write
        return attrs, self._cache_gen, self._space_used_at_commit(conn, attrs)

    def _data_committed(self, inos, found) -> None:
        fresh, gen, used = found if found is not None else ((), None, {})
        self._changed(inos, (), fresh, gen, xattrs_kept=inos)  # data commits change no xattrs
        for attr in fresh:
            if attr.ino in used:
                self._remember_space_used(attr, used[attr.ino])
        self.quotas.committed(inos)

    # defined by RangeOps, which owns space used (NFS space_used, st_blocks)
    def _space_used_at_commit(self, conn, attrs) -> dict[int, int]:
        raise NotImplementedError

    def _remember_space_used(self, attr: Attr, used: int) -> None:
        raise NotImplementedError

    # defined by Lookup (_load_many) and DirectoryOps (_free, _touch), which own reading and
    # freeing inodes; declared on the base every part shares because parts that are not their
    # subclasses call them (this cache, FileOps, Xattrs), and Namespace combines them all
    @staticmethod
    def _load_many(conn: Connection, inos) -> list[Attr]:
        raise NotImplementedError

    def _free(self, conn: Connection, ino: int, touched: Touched) -> None:
        raise NotImplementedError

    @staticmethod
    def _touch(
        conn: Connection,
        ino: int,
        *,
        mtime: bool = False,
        ctime: bool = True,
        nlink_delta: int = 0,
        returning: bool = False,
    ) -> Attr | None:
        raise NotImplementedError

    # -- change listeners ------------------------------------------------------------------------
    # Called after each change this process makes (namespace writes, data-path commits, buffered
    # writes that grow a file) with the inodes and (dir, name) entries it changed, in the changing
    # thread: a listener must only take note (the FUSE mount queues kernel cache invalidations).
    def add_change_listener(self, listener) -> None:
        self._change_listeners = (*self._change_listeners, listener)

    def remove_change_listener(self, listener) -> None:
        self._change_listeners = tuple(x for x in self._change_listeners if x != listener)

    def invalidate(self) -> None:
        with self._cache_lock:
            self._clear_cache(None)
