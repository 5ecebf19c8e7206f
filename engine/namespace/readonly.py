"""Read-only views: the snapshot views under ``DIR/.snapshots/``.

A snapshot's frozen inodes lie in its blocks of inode numbers (table ``snapshot_blocks``; a
snapshot copied whole at create has one, [ino_lo, ino_hi]: engine/snapshots/service.py numbers a
tree's copy densely, and nothing else is ever numbered inside a block), and each dataset has one
``.snapshots`` directory inode. Every
change of such an inode, or of a name in such a directory, fails with EROFS. The ranges are kept in
memory and read again after any commit this process cannot account for (snapshot changes are never
tracked commits; another process's published commit whose change record names no SNAPSHOTS
topic changed none of them), so the check on a write costs a memory read of the catalog's epoch
and a bisect."""

from __future__ import annotations

import bisect
import functools

from engine.base import errors
from engine.catalog.changelog import SNAPSHOTS
from engine.catalog.database import Catalog, sql_all
from engine.catalog.epoch import commits_between
from engine.namespace import lazyviews
from engine.namespace.lazyclones import is_pending, materialize, pending_dirs

SNAPSHOT_DIR_NAME = ".snapshots"


class ReadOnlyViews:
    """Part of Namespace: which inodes are snapshot views, and the EROFS checks."""

    def __init__(self, catalog: Catalog):
        self.catalog = catalog
        # (epoch read at, lows, highs, .snapshots dirs, clones' pending dirs, lazy chains), None
        # until read or after a forget
        self.state: tuple | None = None
        # live inodes already preserved (copied up, or in no lazy snapshot) under the lazy
        # chains ``done_for``: a view never changes, so it holds until the chains do
        self.done: set[int] = set()
        self.done_for: object = None

    def _current(self, conn=None) -> tuple:
        """(lows, highs, .snapshots dirs, pending clone dirs, lazy chains); read through ``conn``
        (the caller's transaction) when the memory copy is not known valid (Catalog.epoch moved, or
        is None)."""
        epoch = self.catalog.epoch()
        state = self.state
        if state is not None and epoch is not None and state[0] is not None:
            if state[0] == epoch:
                return state[1:]
            changes = self.catalog.changes_since(state[0], epoch)
            if changes is not None and not any(c.topics & SNAPSHOTS for c in changes):
                if commits_between(state[0], epoch) > 0:
                    self.state = (epoch, *state[1:])
                return state[1:]

        def work(conn):
            ranges = sorted(sql_all(conn, "SELECT ino_lo, ino_hi FROM snapshot_blocks"))
            dirs = frozenset(row[0] for row in sql_all(conn, "SELECT dir_ino FROM snapshot_dirs"))
            return ranges, dirs, pending_dirs(conn), lazyviews.chains(conn)

        ranges, dirs, pending, lazy = work(conn) if conn is not None else self.catalog.read(work)
        lows = [int(lo) for lo, _hi in ranges]
        highs = [int(hi) for _lo, hi in ranges]
        self.state = (epoch, lows, highs, dirs, pending, lazy)
        return lows, highs, dirs, pending, lazy

    def is_read_only(self, ino: int, conn=None) -> bool:
        """Whether ``ino`` is part of a snapshot view (a frozen inode or a ``.snapshots`` dir)."""
        lows, highs, dirs, _pending, _lazy = self._current(conn)
        if ino in dirs:
            return True
        i = bisect.bisect_right(lows, ino) - 1
        return i >= 0 and ino <= highs[i]

    def snapshot_dirs(self, conn=None) -> frozenset[int]:
        return self._current(conn)[2]

    def needs_copy(self, ino: int, conn) -> bool:
        """Inside a read: whether directory ``ino`` is a clone's, its names not copied yet. The
        memory set is a superset of the pending directories (a change that copied one in a
        tracked commit leaves it there), so the catalog is asked only when it is not empty."""
        return bool(self._current(conn)[3]) and is_pending(conn, ino)

    def materialize(self, conn, ino: int) -> None:
        """Inside a change's transaction: copy ``ino``'s names first if it is pending (the
        child directories it makes pending join the memory set, which stays a superset)."""
        if ino not in self._current(conn)[3]:
            return
        made = materialize(conn, ino)
        if made and self.state is not None:
            self.state = (*self.state[:4], self.state[4] | frozenset(made), *self.state[5:])

    def check_writable(self, *inos: int, conn=None) -> None:
        """EROFS for snapshot views; inside a transaction pass its ``conn`` (a clone's pending
        directory among ``inos`` then gets its names copied first, so the change sees them)."""
        for ino in inos:
            if self.is_read_only(ino, conn):
                raise errors.ReadOnly(f"inode {ino} is in a snapshot: snapshots are read-only")
            if conn is not None:
                self.materialize(conn, ino)
                self.preserve(conn, ino)

    def preserve(self, conn, *inos: int) -> None:
        """Inside a change's transaction, before live inodes ``inos`` change (rows, or a
        directory's names): each lazy snapshot chain's newest snapshot holding one gets its
        copy first (lazyviews.copy_up). SQLite: the chains as this process knows them (a create
        is a commit without a change record: every process reads them again; writers are
        serialised). PostgreSQL: read in the transaction, so that a create committing meanwhile
        conflicts with it (SERIALIZABLE) or is seen."""
        if not lazyviews.ENABLED:
            return
        if conn.dialect.name == "postgresql":
            lazy = lazyviews.chains(conn)
        else:
            lazy = self._current(conn)[4]
        if not lazy:
            return
        if lazy != self.done_for:
            self.done, self.done_for = set(), lazy
        top = max(chain[-1][1] for chain in lazy.values())
        for ino in inos:
            if ino > top or ino in self.done:
                continue  # numbered after every lazy snapshot, or preserved already
            if lazyviews.copy_up(conn, ino, known=lazy):
                # the new copies' blocks: every process reads the views again
                Catalog.changes(conn, topics=SNAPSHOTS)
            # marked once committed: a change rolled back leaves no copy behind
            Catalog.after_commit(conn, functools.partial(self._preserved, ino, lazy))

    def _preserved(self, ino: int, chains) -> None:
        if chains == self.done_for:
            self.done.add(ino)

    def forget(self) -> None:
        """Read the ranges again at the next check (after this process changed snapshots)."""
        self.state = None
