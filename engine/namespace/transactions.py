"""The namespace's write transactions: each change is one tracked catalog transaction, after
which the cache forgets (or takes in) what it changed and the change listeners hear of it; and
the freeing of inodes that lost their last name and opener."""

from __future__ import annotations

import logging

from sqlalchemy.engine import Connection

from engine.catalog.database import Catalog
from engine.catalog.database import sql as _sql
from engine.catalog.database import sql_one as _one
from engine.namespace.cache import NameCache
from engine.namespace.common import (
    FREE_CHUNK_EXTENTS,
    Attr,
    ChangeListeners,
    FileData,
    Touched,
    load_many,
)
from engine.namespace.openrefs import OpenRefs

log = logging.getLogger("shingle.namespace")

__all__ = ["FREE_CHUNK_EXTENTS", "Transactions"]


class Transactions:
    """Part of Namespace: ``write`` runs a change, ``changed`` tells the cache and listeners."""

    def __init__(
        self,
        catalog: Catalog,
        data: FileData | None,
        cache: NameCache,
        listeners: ChangeListeners,
        open_refs: OpenRefs,
    ):
        self.catalog = catalog
        self.data = data
        self.cache = cache
        self.listeners = listeners
        self.open_refs = open_refs

    def write(self, work, inos=(), names=()):
        """A namespace write transaction ``work(conn, touched)``; afterwards evict ``inos`` and
        ``names`` plus what the work added to the ``touched`` set it receives (inodes found
        inside, like a victim), and cache their new attributes, read at the end of the same
        transaction. An inode it freed only in part (``free``) is freed the rest of the way in
        transactions of its own."""
        result, unfreed = self._write_once(work, inos, names)
        if unfreed:
            self.free_orphans(unfreed)
        return result

    def free(self, conn: Connection, ino: int, touched: Touched) -> None:
        """Free an inode with no name and no opener; a big file keeps its inode row (an orphan, as
        if open) until later transactions have freed the rest of its extents (touched.unfreed)."""
        if self.data is not None and not self.data.release(conn, ino, FREE_CHUNK_EXTENTS):
            touched.unfreed.append(ino)
            return
        _sql(conn, "DELETE FROM symlinks WHERE ino = ?", (ino,))
        _sql(conn, "DELETE FROM xattrs WHERE ino = ?", (ino,))
        _sql(conn, "DELETE FROM inodes WHERE ino = ?", (ino,))

    def free_orphans(self, inos) -> None:
        """Free orphans a chunk of extents per transaction, so that other writers get the catalog
        in between. Already committed: the name is gone, so a failure here only leaves the orphan
        for the next start (reclaim_orphans), it is not the caller's error."""
        todo = list(inos)
        while todo:
            ino = todo.pop()

            def work(conn, touched, ino=ino):
                row = _one(conn, "SELECT nlink FROM inodes WHERE ino = ?", (ino,))
                # opened again meanwhile (by file handle): its last close frees it
                if row is not None and row[0] == 0 and not self.open_refs.is_open(ino):
                    self.free(conn, ino, touched)

            try:
                todo.extend(self._write_once(work, (ino,))[1])
            except Exception as exc:  # noqa: BLE001 - see above
                log.warning("freeing removed inode %s: %s; it is freed at the next start", ino, exc)

    def _write_once(self, work, inos=(), names=()):
        cache = self.cache
        cache.valid()  # take in other processes' commits before ours moves the epoch
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
            # other processes' caches evict what this commit changed (engine/catalog/changelog.py)
            Catalog.changes(conn, touched, (*names, *touched.names, *touched.gone))
            if cache.epoch is not None and touched:
                known = touched.known
                unknown = [ino for ino in touched if ino not in known]
                if unknown:
                    fresh.extend(load_many(conn, unknown))
                fresh.extend(attr for ino, attr in known.items() if ino in touched)
            # taken while this transaction holds the write lock: if no eviction runs between here
            # and changed(), no commit of this process after ours has been seen yet
            gen[0] = cache.gen
            return result

        committed = False
        try:
            # changed() accounts for it here, its record in the other processes
            result = self.catalog.run(run, tracked=True, published=True)
            committed = True
            return result, touched.unfreed
        except BaseException:
            fresh.clear()
            raise
        finally:
            if committed and self.data is not None:
                self.data.changed(touched)  # the change buffered writes show moves too
            self.changed(
                touched,
                names,
                fresh,
                gen[0],
                touched.names,
                touched.gone,
                touched.xattrs,
                touched.xattrs_kept,
            )

    def changed(self, inos, names=(), *fresh_facts, **fresh_named) -> None:
        """This process changed ``inos`` and the (dir, name) entries ``names`` in a tracked
        commit: the listeners hear of it, then the cache evicts it (NameCache.evict, which takes
        the rest of the arguments: what the commit made of them)."""
        self.listeners.notify(inos, names)
        self.cache.evict(inos, names, *fresh_facts, **fresh_named)
