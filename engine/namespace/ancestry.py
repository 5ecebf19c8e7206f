"""Whether an inode lies inside a directory's subtree: the check that confines an export to
the files under its root, made on every file handle a client presents.

A directory has one parent, a file one per link: an inode is inside ``top`` when one of
its paths up to the namespace root passes through ``top`` (one recursive query). Answers
are cached per (top, inode) while the attribute cache is valid (``Catalog.epoch``, on either
database). What can change an answer, seen by a
change listener of the namespace after each commit of this process:

- a rename from one directory to another (a directory moved takes its whole subtree
  along): the cache is emptied;
- a link added or removed (link, unlink, rename over a name): the files it touched are
  forgotten (a directory's answer changes only when it moves to another directory);
- a commit of another process: the attribute cache clears itself (``NameCache.since`` moves),
  and this cache follows;
- its age: emptied CACHE_TTL_S after it was last emptied, as a backstop.

A check that began before such a change is not cached (the generation moved), so a stale
"inside" can only be answered to a request that overlapped the rename."""

from __future__ import annotations

import time

from engine.base.ordered_lock import lock
from engine.catalog.database import Catalog, sql_one
from engine.namespace.cache import NameCache
from engine.namespace.common import CACHE_TTL_S, DIR, Attr

_INSIDE_SQL = (
    "WITH RECURSIVE up(ino) AS ( SELECT parent FROM dirents WHERE child = ? UNION SELECT "
    "dirents.parent FROM dirents JOIN up ON dirents.child = up.ino WHERE up.ino <> ?) SELECT 1 "
    "FROM up WHERE ino = ? LIMIT 1"
)
ANCESTRY_MAX_ENTRIES = 100_000


class Ancestry:
    """Part of Namespace: ``is_inside`` and its cache (``changed`` listens to the namespace)."""

    def __init__(self, catalog: Catalog, cache: NameCache, root_ino: int):
        self.catalog = catalog
        self.cache = cache
        self.root_ino = root_ino
        self._dirs: dict[int, dict[int, bool]] = {}  # directory inode -> {top: inside}
        self._files: dict[int, dict[int, bool]] = {}  # other inodes
        self._gen = 0  # bumped by every forgetting: a check that began before is not cached
        self._since = cache.since  # the attribute cache's clearing these answers follow
        self._emptied_at = time.monotonic()
        # a leaf: nothing is taken under it (the catalog is read outside it)
        self.lock = lock("namespace.ancestry")

    def is_inside(self, top: int, attr: Attr) -> bool:
        """Whether ``attr``'s inode is ``top`` or lies in its subtree. An unlinked file still
        open (nlink 0: only a handle from before its unlink names it) counts as inside."""
        ino = attr.ino
        if ino == top or top == self.root_ino or attr.nlink == 0:
            return True
        cacheable = self.cache.valid()
        table = self._dirs if attr.type == DIR else self._files
        with self.lock:
            if (
                self._since != self.cache.since  # the attribute cache was cleared
                or time.monotonic() - self._emptied_at > CACHE_TTL_S
            ):
                self._forget_all()
            gen = self._gen
            known = table.get(ino, {}).get(top) if cacheable else None
        if known is not None:
            return known
        inside = self.catalog.read(
            lambda conn: sql_one(conn, _INSIDE_SQL, (ino, top, top)) is not None
        )
        if cacheable:
            with self.lock:
                if gen == self._gen:
                    if len(table) > ANCESTRY_MAX_ENTRIES:
                        table.clear()
                    table.setdefault(ino, {})[top] = inside
        return inside

    def _forget_all(self) -> None:
        """(Holding the lock.)"""
        self._dirs.clear()
        self._files.clear()
        self._gen += 1
        self._since = self.cache.since
        self._emptied_at = time.monotonic()

    def changed(self, inos, names) -> None:
        """After a commit of this process that changed ``inos`` and the (dir, name) entries
        ``names`` (a data-path commit names none: it changes no link)."""
        if not names:
            return
        with self.lock:
            if len({parent for parent, _ in names}) > 1:  # a rename to another directory
                self._forget_all()
                return
            self._gen += 1
            for ino in inos:
                self._files.pop(ino, None)
