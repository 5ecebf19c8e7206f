"""Whether an inode lies inside a directory's subtree: the check that confines an export to
the files under its root, made on every file handle a client presents.

A directory has one parent, a file one per link: an inode is inside ``top`` when one of
its paths up to the namespace root passes through ``top`` (one recursive query). Answers
are cached per (top, inode) while the attribute cache is valid (SQLite; PostgreSQL has no
cheap change signal, so there every check queries). What can change an answer:

- a rename from one directory to another (a directory moved takes its whole subtree
  along): the cache is emptied, after the commit;
- a link added or removed (link, unlink, rename over a name): that inode is forgotten;
- a commit of another process (the attribute cache clears itself: so does this one).

A check that began before such a change is not cached (the generation moved), so a stale
"inside" can only be answered to a request that overlapped the rename."""
from __future__ import annotations

import threading

from engine.catalog.database import sql_one

_INSIDE_SQL = (
    "WITH RECURSIVE up(ino) AS ("
    " SELECT parent FROM dirents WHERE child = ?"
    " UNION"
    " SELECT dirents.parent FROM dirents JOIN up ON dirents.child = up.ino WHERE up.ino <> ?"
    ") SELECT 1 FROM up WHERE ino = ? LIMIT 1")
ANCESTRY_MAX_ENTRIES = 100_000


class Ancestry:
    """Part of Namespace (first in its bases: it wraps the changes that move names)."""

    _ancestry: dict[int, dict[int, bool]]  # inode -> {top: inside}
    _ancestry_gen: int
    _ancestry_lock: threading.Lock

    def _init_ancestry(self) -> None:
        self._ancestry = {}
        self._ancestry_gen = 0
        self._ancestry_lock = threading.Lock()

    def is_inside(self, top: int, ino: int, nlink: int = 1) -> bool:
        """Whether ``ino`` is ``top`` or lies in its subtree. ``nlink`` 0: an unlinked file
        still open (only a handle from before its unlink names it) counts as inside."""
        if ino == top or top == self.root_ino or nlink == 0:
            return True
        cacheable = self._cache_valid()
        if cacheable:
            hit = self._ancestry.get(ino)
            if hit is not None:
                known = hit.get(top)
                if known is not None:
                    return known
        gen = self._ancestry_gen
        inside = self.catalog.read(
            lambda conn: sql_one(conn, _INSIDE_SQL, (ino, top, top)) is not None)
        if cacheable:
            with self._ancestry_lock:
                if gen == self._ancestry_gen:
                    if len(self._ancestry) > ANCESTRY_MAX_ENTRIES:
                        self._ancestry.clear()
                    self._ancestry.setdefault(ino, {})[top] = inside
        return inside

    def _forget_ancestry(self, ino: int | None = None) -> None:
        """After a commit that changed the links of ``ino`` (None: moved a subtree)."""
        with self._ancestry_lock:
            self._ancestry_gen += 1
            if ino is None:
                self._ancestry.clear()
            else:
                self._ancestry.pop(ino, None)

    # -- the changes that move names (the wrapped calls commit before they return) -----------
    def rename(self, cred, src_dir: int, src_name: str, dst_dir: int, dst_name: str) -> None:
        try:
            super().rename(cred, src_dir, src_name, dst_dir, dst_name)
        finally:
            if src_dir != dst_dir:  # within one directory no path changes (but a replaced
                self._forget_ancestry()  # file's: _drop_link)

    def link(self, cred, ino: int, dir_ino: int, name: str):
        try:
            return super().link(cred, ino, dir_ino, name)
        finally:
            self._forget_ancestry(ino)

    def _drop_link(self, conn, ino: int, touched) -> None:
        # inside the transaction of unlink, rmdir or a rename over a name: forget the inode
        # once that commits (a file with another link may now lie only outside)
        super()._drop_link(conn, ino, touched)
        self.catalog.after_commit(conn, lambda: self._forget_ancestry(ino))

    def _clear_cache(self, epoch) -> None:
        super()._clear_cache(epoch)
        self._forget_ancestry()
