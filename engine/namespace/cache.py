"""The namespace's in-process cache of attributes, names and small extended-attribute maps.

Attributes and names are cached in process. Another process's commit evicts what its change
record names (engine/catalog/changelog.py: the heads of `serve --heads N` publish one with every
namespace write, data commit and background write); a commit without one (untracked, of this
process or another, or whose record was lost) clears it all; this process's
tracked namespace and data-path commits evict just what they changed and keep the rest
(``evict``), so a write does not cost every later lookup a catalog query. No entry is served
CACHE_TTL_S after it was read (each carries its deadline): emptying the whole cache at that age
instead sent every lookup after it to the catalog at once, and a stat pass over files made just
before ran from the NFS workers. While Catalog.epoch is None (PostgreSQL's change watch not
caught up or down) nothing is cached or served from it.

A small directory whose names were all read in one transaction is "complete" until the deadline
of those entries: a name missing from ``names`` is then missing from the directory (an OPEN of a
name not there yet, as nfs-rs sends before each create, needs no catalog). A change of a name in
it keeps that only when the change's commit says what the name is now (a create's fresh entry,
an unlink); any other (a rename, a failed write) forgets it."""

from __future__ import annotations

import time
from typing import TypeVar

from engine.base.ordered_lock import lock
from engine.catalog.database import Catalog
from engine.catalog.epoch import commits_between
from engine.namespace.common import CACHE_MAX_ENTRIES, CACHE_TTL_S, DIR, Attr

K = TypeVar("K")
V = TypeVar("V")

__all__ = ["CACHE_MAX_ENTRIES", "CACHE_TTL_S", "NameCache"]


class NameCache:
    """Part of Namespace: what it read, until a commit changes it or it ages."""

    def __init__(self, catalog: Catalog):
        self.catalog = catalog
        # each entry with the time.monotonic() after which it is not served (``cached``)
        self.attrs: dict[int, tuple[Attr, float]] = {}
        self.names: dict[tuple[int, str], tuple[int, float]] = {}
        self.complete_dirs: dict[int, float] = {}  # dirs whose every name is in ``names``
        self.dirs_listed: dict[int, float] = {}  # dirs read whole (or tried), until when not again
        self.xattrs: dict[int, tuple[dict[str, bytes], float]] = {}  # ino -> small xattr maps
        self.epoch: int | None = None  # the catalog epoch the entries are valid at
        self.since = 0.0  # when it was last emptied (Ancestry follows it)
        self.gen = 0  # bumped by every eviction: a load that began before it is not cached
        # other processes' commits: taken in by evicting what their records name, or (a record
        # missing or gone) by emptying the whole cache
        self.evicted = 0
        self.emptied = 0
        self.lock = lock("namespace.cache")

    def valid(self) -> bool:
        """Whether the cache may be used, after clearing it if a commit it cannot account for
        ran."""
        epoch = self.catalog.epoch()
        if epoch is None:
            return False
        if epoch != self.epoch:
            with self.lock:
                known = self.epoch
                if known is None:
                    self.clear(epoch)
                    return True
                changes = self.catalog.changes_since(known, epoch)
                if changes is None:  # a commit without a record (or it is gone)
                    self.clear(epoch)
                    self.emptied += 1
                    return True
                if changes:
                    self.forget(changes)
                if commits_between(known, epoch) > 0:  # an older read changes nothing
                    self.epoch = epoch
        return True

    def forget(self, changes) -> None:
        """Other processes' commits changed these (changelog.Change records; the caller holds
        the lock): their entries go, the rest stays; loads under way are not cached."""
        self.gen += 1
        self.evicted += 1
        attrs, xattrs, names = self.attrs, self.xattrs, self.names
        complete = self.complete_dirs
        moved = False
        for change in changes:
            if not (change.inos or change.names):
                continue  # topics only: tables this cache does not keep
            for ino in change.inos:
                attrs.pop(ino, None)
                xattrs.pop(ino, None)
                complete.pop(ino, None)  # a directory removed or changed
            for key in change.names:
                names.pop(key, None)
                complete.pop(key[0], None)  # what the name is now is not known here
                moved = True
        if moved:
            self.since = time.monotonic()  # links changed: Ancestry forgets its answers

    def clear(self, epoch: int | None) -> None:
        """Forget every entry (caller holds the lock); loads under way will not be cached."""
        self.attrs.clear()
        self.names.clear()
        self.complete_dirs.clear()
        self.dirs_listed.clear()
        self.xattrs.clear()
        self.gen += 1
        self.epoch = epoch
        self.since = time.monotonic()

    def invalidate(self) -> None:
        with self.lock:
            self.clear(None)

    @staticmethod
    def cached(table: dict[K, tuple[V, float]], key: K) -> V | None:
        """The entry of ``table`` (``attrs``, ``names``, ``xattrs``; the caller checked
        ``valid``), or None when there is none or it is past its deadline."""
        hit = table.get(key)
        return hit[0] if hit is not None and hit[1] > time.monotonic() else None

    @staticmethod
    def until(read_at: float) -> float:
        """The deadline of an entry read at ``read_at``."""
        return read_at + CACHE_TTL_S

    def remember(self, gen: int, read_at: float, attrs=(), name=None, listing=None) -> None:
        """Cache what a load that began at ``read_at`` (time.monotonic()) found, unless an
        eviction ran since it began (it may be stale). ``listing``: (dir ino, every (name, ino)
        of it), read in the same transaction."""
        until = self.until(read_at)
        with self.lock:
            if gen != self.gen:
                return
            if len(self.attrs) + len(self.names) + len(self.xattrs) > CACHE_MAX_ENTRIES:
                # a crude bound, reached only by walks of huge trees
                self.clear(self.epoch)
                return
            for attr in attrs:
                self.attrs[attr.ino] = (attr, until)
            if name is not None:
                self.names[name[0]] = (name[1], until)
            if listing is not None:
                dir_ino, entries = listing
                names = self.names
                for entry_name, child in entries:
                    names[(dir_ino, entry_name)] = (child, until)
                self.complete_dirs[dir_ino] = until

    def remember_xattrs(
        self, gen: int, read_at: float, attr: Attr, found: dict[str, bytes]
    ) -> None:
        """Cache an inode's attributes and its every extended attribute, read together."""
        with self.lock:
            if gen == self.gen:
                until = self.until(read_at)
                self.attrs[attr.ino] = (attr, until)
                self.xattrs[attr.ino] = (found, until)

    def known_missing(self, dir_ino: int, name: str) -> bool:
        """Whether the cache proves ``name`` absent from ``dir_ino`` (the caller checked
        ``valid``): the directory is complete, and no entry of the name is held. While it is
        complete, every entry of it lives at least as long (read with it or after it)."""
        until = self.complete_dirs.get(dir_ino)
        return until is not None and until > time.monotonic() and (dir_ino, name) not in self.names

    def evict(
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
        evict them (the rest of the cache stays valid: ``valid`` adopts the commit). ``fresh``:
        the attributes at commit, read at the end of the transaction while ``gen`` was
        ``fresh_gen`` (kept only if no eviction ran since). ``fresh_names`` and ``fresh_gone``:
        what the commit made of names (ino, or removed). ``fresh_xattrs``: inodes' extended
        attributes at commit; ``xattrs_kept``: inodes whose extended attributes the commit left
        alone (Samba reads a file's and its folder's right after each create and each setxattr:
        keeping them saves a catalog read each)."""
        with self.lock:
            current = self.gen
            self.gen += 1
            adopt = self.epoch is not None and fresh and fresh_gen == current
            kept = xattrs_kept if adopt else ()
            for ino in inos:
                self.attrs.pop(ino, None)
                if ino not in kept:
                    self.xattrs.pop(ino, None)
            known = dict(fresh_names) if adopt else {}
            complete = self.complete_dirs
            gone = fresh_gone if adopt else ()
            for key in names:
                self.names.pop(key, None)
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
                until = self.until(time.monotonic())
                for attr in fresh:
                    self.attrs[attr.ino] = (attr, until)
                for key, ino in known.items():
                    self.names[key] = (ino, until)
                if fresh_xattrs:
                    alive = {attr.ino for attr in fresh}
                    for ino, found in fresh_xattrs.items():
                        if ino in alive:
                            self.xattrs[ino] = (found, until)
