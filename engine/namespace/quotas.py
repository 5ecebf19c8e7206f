"""Quotas: limits on the bytes and the files of a directory tree (an export's root or any
directory below it), hard (refused with EDQUOT) and soft (an alert, engine/admin/alerts.py).

What counts (docs/namespace.md, "Quotas", says why):
- bytes: the logical size of every regular file in the tree (what ``ls -l`` shows), not the
  media its stripes take: parity, replicas, tiering and shared extents would make one file's
  cost change while nobody touches it;
- files: every inode below the root (files, directories, symlinks, ...), the root itself not;
- a snapshot's frozen files and the ``.snapshots`` directory do not count; a clone or a
  rollback counts the files it makes at their logical size (snapshots.py recounts after them).

Counters (``quotas.used_bytes``, ``used_files``) move in the same catalog transaction as the
change: creates and removals in the namespace's transaction, size changes in the truncate's
or the data path's commit transaction (``QuotaTracker.before``/``after``, a size watch of the
data path). Nothing scans the catalog on a write. A write is checked when it is accepted into
the data path's buffer, before any byte is kept: the limit is compared with the committed
counter plus what buffered writes of the tree have been admitted and not committed yet
(``QuotaTracker.admit``), so a WRITE that would pass the limit fails whole.
``QuotaService.recount`` (engine/admin/quota_service.py, the admin side above the namespace) counts
the trees again (fsck compares, ``shingle quota recount`` fixes)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from engine.base import errors
from engine.base.blocking import holding
from engine.base.ordered_lock import lock
from engine.catalog.changelog import QUOTAS as QUOTA_ROWS
from engine.catalog.database import Catalog, in_list, sql, sql_all, sql_one
from engine.catalog.epoch import commits_between
from engine.catalog.models import REG
from engine.catalog.models import Quota as QuotaRow

QUOTAS = QuotaRow.__table__

# the quotas whose root is ``?`` or one of its ancestors (a file has one parent per link)
_ROOTS_SQL = (
    "WITH RECURSIVE up(ino) AS (SELECT CAST(? AS BIGINT) UNION SELECT d.parent FROM dirents d "
    "JOIN up ON d.child = up.ino WHERE up.ino <> ?) SELECT q.id, q.root_ino, q.bytes_limit, "
    "q.files_limit, q.used_bytes, q.used_files, q.soft_bytes FROM quotas q JOIN up ON "
    "q.root_ino = up.ino"
)
# the live tree below ``?`` (snapshot views left out; a file with two names in it counts once)
_TREE_SQL = (
    "WITH RECURSIVE t(ino) AS (SELECT d.child FROM dirents d WHERE d.parent = ? AND d.child NOT "
    "IN (SELECT dir_ino FROM snapshot_dirs) UNION SELECT d.child FROM dirents d JOIN t ON "
    "d.parent = t.ino WHERE d.child NOT IN (SELECT dir_ino FROM snapshot_dirs)) "
    f"SELECT COUNT(*), COALESCE(SUM(CASE WHEN i.type = {REG} THEN i.size ELSE 0 END), 0) "
    "FROM t JOIN inodes i ON i.ino = t.ino"
)


@dataclass(frozen=True, slots=True)
class QuotaRoot:
    """A quota over some inode, as one transaction saw it."""

    id: int
    root_ino: int
    bytes_limit: int | None
    files_limit: int | None
    used_bytes: int
    used_files: int
    soft_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class QuotaSpace:
    """What NFSv4's quota attributes say of one inode (bytes): room before the hard limit and
    before the soft one, and the usage of the tree whose limit binds first."""

    avail_hard: int
    avail_soft: int
    used: int


def roots_of(conn, ino: int, root_ino: int, *, include_self: bool = True) -> list[QuotaRoot]:
    """The quotas whose tree holds ``ino`` (with ``include_self``, also a quota on ``ino``)."""
    rows = sql_all(conn, _ROOTS_SQL, (ino, root_ino))
    return [QuotaRoot(*row) for row in rows if include_self or row[1] != ino]


def usage_below(conn, ino: int) -> tuple[int, int]:
    """(bytes, files) of the live tree below directory ``ino``, counted."""
    files, size = sql_one(conn, _TREE_SQL, (ino,))
    return int(size), int(files)


def charge(conn, roots, add_bytes: int, add_files: int) -> None:
    """Move the counters of ``roots`` (inside the transaction of the change)."""
    ids = sorted({r.id for r in roots})
    if not ids or not (add_bytes or add_files):
        return
    Catalog.changes(conn, topics=QUOTA_ROWS)  # other processes' copies drop their rows
    sql(
        conn,
        "UPDATE quotas SET used_bytes = used_bytes + ?, used_files = used_files + ? "
        f"WHERE id IN {in_list(ids)}",
        (add_bytes, add_files, *ids),
    ).close()


def _exceeded(root: QuotaRoot, what: str, used: int, add: int, limit: int) -> errors.QuotaExceeded:
    return errors.QuotaExceeded(
        f"quota {root.id} (directory inode {root.root_ino}): {what} {used} + {add} would pass "
        f"the hard limit of {limit}"
    )


def check(roots, add_bytes: int, add_files: int, reserved: dict[int, int] | None = None) -> None:
    """EDQUOT when adding would pass a hard limit of ``roots``; ``reserved``: quota id -> bytes
    admitted into buffers and not committed yet. Growth only: shrinking is always allowed."""
    for root in roots:
        used = root.used_bytes + (reserved or {}).get(root.id, 0)
        if add_bytes > 0 and root.bytes_limit is not None and used + add_bytes > root.bytes_limit:
            raise _exceeded(root, "bytes", used, add_bytes, root.bytes_limit)
        limit = root.files_limit
        if add_files > 0 and limit is not None and root.used_files + add_files > limit:
            raise _exceeded(root, "files", root.used_files, add_files, limit)


ADMITTED_MAX = 10_000  # files remembered with nothing reserved (their committed size)


@dataclass(slots=True)
class _Admitted:
    """Bytes of a file's buffered writes admitted against its quotas, not committed yet."""

    quota_ids: tuple[int, ...]
    end: int  # the highest end of a write admitted
    committed: int  # the file's committed size, as last seen

    @property
    def reserved(self) -> int:
        return max(self.end - self.committed, 0)


class QuotaTracker:
    """A namespace's view of the quotas: whether any exist, the hard-limit checks, the bytes of
    buffered writes admitted per file, and the data path's size watch that moves the counters in
    its commits.

    The write path's check (``admit``) reads no catalog on an append that grows a file already
    admitted: the quota ids of each file's trees and each quota's row are kept in memory while
    no commit since they were read changed them: this process's own tracked commits, whose
    charges reach the copy once they commit (``charge``), and other processes' whose change
    records (engine/catalog/changelog.py) name no quota row (a charge names one) and, for a
    file's trees, none of its names; a commit without a record drops the copy. Creates,
    truncates and renames check inside their transaction against the catalog's rows."""

    def __init__(self, catalog: Catalog, root_ino: int):
        self.catalog = catalog
        self.root_ino = root_ino
        self._known: tuple[int, bool] | None = None  # (catalog epoch, any quota exists)
        self._lock = lock("quotas.tracker")
        self._admitted: dict[int, _Admitted] = {}
        # the memory copy (under _lock): valid as of _epoch while only tracked commits followed
        self._epoch: int | None = None
        self._rows: dict[int, QuotaRoot] = {}  # quota id -> row, with this process's charges
        self._trees: dict[int, tuple[int, ...]] = {}  # file -> quota ids of its trees
        self._gen = 0  # bumped by every charge applied and every forget: a racing load is dropped

    # -- whether any quota exists ------------------------------------------------------------
    def active(self, conn=None) -> bool:
        epoch = self.catalog.epoch()
        known = self._known
        if known is not None and epoch is not None:
            if known[0] == epoch:
                return known[1]
            changes = self.catalog.changes_since(known[0], epoch)
            if changes is not None and not any(c.topics & QUOTA_ROWS for c in changes):
                if commits_between(known[0], epoch) > 0:  # changes_since walks every commit since
                    self._known = (epoch, known[1])
                return known[1]

        def work(c):
            return sql_one(c, "SELECT 1 FROM quotas LIMIT 1") is not None

        found = work(conn) if conn is not None else self.catalog.read(work)
        if epoch is not None:
            self._known = (epoch, found)
        return found

    def forget(self) -> None:
        """Read the quotas again (after this process changed them)."""
        self._known = None
        with self._lock:
            self._drop_copy()

    def space(self, ino: int, free: int) -> QuotaSpace | None:
        """The room the byte limits of ``ino``'s trees leave (at most ``free``, the pool's);
        None when no tree of it has a byte limit."""
        if not self.active():
            return None
        roots = self.catalog.read(lambda conn: roots_of(conn, ino, self.root_ino))
        limited = [r for r in roots if r.bytes_limit is not None or r.soft_bytes is not None]
        if not limited:
            return None

        def room(limit: int | None, used: int) -> int:
            return free if limit is None else max(min(limit - used, free), 0)

        binding = min(limited, key=lambda r: (room(r.bytes_limit, r.used_bytes), r.id))
        return QuotaSpace(
            min(room(r.bytes_limit, r.used_bytes) for r in limited),
            min(room(r.soft_bytes, r.used_bytes) for r in limited),
            binding.used_bytes,
        )

    def names_changed(self, inos, names) -> None:
        """A namespace change listener: a rename to another directory may move whole trees into
        other quotas; a link or unlink changes the trees of the files it touched."""
        if not names:
            return
        with self._lock:
            if len({parent for parent, _ in names}) > 1:
                self._trees.clear()
            for ino in inos:
                self._trees.pop(ino, None)
            self._gen += 1

    def roots(self, conn, ino: int, *, include_self: bool = True) -> list[QuotaRoot]:
        if not self.active(conn):
            return []
        return roots_of(conn, ino, self.root_ino, include_self=include_self)

    def charge(self, conn, roots, add_bytes: int, add_files: int) -> None:
        """``charge`` inside the caller's transaction; the memory copy follows once it commits."""
        charge(conn, roots, add_bytes, add_files)
        ids = {r.id for r in roots}
        if ids and (add_bytes or add_files):
            self.catalog.after_commit(conn, lambda: self._charged(ids, add_bytes, add_files))

    def _charged(self, ids, add_bytes: int, add_files: int) -> None:
        with self._lock:
            for qid in ids:
                row = self._rows.get(qid)
                if row is not None:
                    self._rows[qid] = replace(
                        row,
                        used_bytes=row.used_bytes + add_bytes,
                        used_files=row.used_files + add_files,
                    )
            self._gen += 1

    # -- the memory copy (callers hold _lock) ------------------------------------------------
    def _drop_copy(self) -> None:
        self._epoch = None
        self._rows.clear()
        self._trees.clear()
        self._gen += 1

    def _copy_valid(self) -> bool:
        epoch = self.catalog.epoch()
        if epoch is None or self._epoch is None:
            self._drop_copy()
            return False
        if epoch == self._epoch:
            return True
        changes = self.catalog.changes_since(self._epoch, epoch)
        if changes is None:  # a commit without a record (or it is gone)
            self._drop_copy()
            return False
        for change in changes:  # other processes' commits: drop what they changed
            if change.topics & QUOTA_ROWS:
                self._rows.clear()
                self._gen += 1
            if change.names:  # as names_changed, for their links
                if len({parent for parent, _ in change.names}) > 1:
                    self._trees.clear()
                for ino in change.inos:
                    self._trees.pop(ino, None)
                self._gen += 1
        if commits_between(self._epoch, epoch) > 0:
            self._epoch = epoch  # newer: changes_since keeps a bounded history
        return True

    def _load(self, ino: int) -> tuple[list[QuotaRoot], int]:
        """(the quotas of ``ino``'s trees, its committed size) from the catalog; remembered
        unless a charge or a change of names ran meanwhile."""
        epoch, gen = self.catalog.epoch(), self._gen

        def work(conn):
            roots = self.roots(conn, ino, include_self=False)
            size = sql_one(conn, "SELECT size FROM inodes WHERE ino = ?", (ino,))
            return roots, int(size[0]) if size is not None else 0

        roots, committed = self.catalog.read(work)
        if epoch is not None and gen == self._gen:
            if self._epoch is None:
                self._epoch = epoch
            if self._epoch == epoch or self._copy_valid():
                self._trees[ino] = tuple(r.id for r in roots)
                self._rows.update((r.id, r) for r in roots)
        return roots, committed

    # -- buffered writes -----------------------------------------------------------------------
    def reserved(self, exclude: int | None = None) -> dict[int, int]:
        """Quota id -> bytes admitted into buffers and not committed (``exclude``: one file's).
        Takes no lock: it runs inside write transactions, and ``admit`` holds the lock across a
        catalog read (a transaction waiting for it could starve that read of a connection)."""
        return self._reserved(exclude)

    def _reserved(self, exclude: int | None) -> dict[int, int]:
        out: dict[int, int] = {}
        for ino, entry in list(self._admitted.items()):  # a copy, made under the GIL
            if ino == exclude:
                continue
            for qid in entry.quota_ids:
                out[qid] = out.get(qid, 0) + entry.reserved
        return out

    def admit(self, ino: int, end: int) -> None:
        """A write to ``ino`` ending at ``end`` grows it: refuse it (EDQUOT) before any byte is
        buffered if that would pass a hard limit of its trees, else count it as admitted."""
        # the check and the bookkeeping hold the lock, so two writers of one tree cannot both
        # take the last bytes (a catalog read at most; no commit waits for this lock); on the
        # event loop a lock held elsewhere or a catalog read raises WouldBlock before any change
        with holding(self._lock, "a quota check"):
            entry = self._admitted.get(ino)
            if entry is not None and end <= entry.end:
                return
            ids = self._trees.get(ino) if self._copy_valid() else None
            rows = [self._rows.get(qid) for qid in ids] if ids is not None else None
            if entry is not None and rows is not None and None not in rows:
                roots = [r for r in rows if r is not None]
                committed = entry.committed
            else:
                roots, committed = self._load(ino)
                if entry is not None:
                    committed = max(committed, entry.committed)
            if not roots:
                self._admitted.pop(ino, None)
                return
            check(roots, max(end - committed, 0), 0, self._reserved(exclude=ino))
            self._admitted[ino] = _Admitted(tuple(r.id for r in roots), end, committed)

    def committed(self, inos) -> None:
        """After a data-path commit: those files' committed sizes moved; drop what is covered."""
        with self._lock:
            watched = [ino for ino in inos if ino in self._admitted]
        if not watched:
            return
        sizes = dict(
            self.catalog.read(
                lambda conn: sql_all(
                    conn,
                    f"SELECT ino, size FROM inodes WHERE ino IN {in_list(watched)}",
                    tuple(watched),
                )
            )
        )
        with self._lock:
            for ino in watched:
                entry = self._admitted.get(ino)
                if entry is None:
                    continue
                if ino not in sizes:
                    self._admitted.pop(ino, None)
                    continue
                # kept with nothing reserved: the next append knows the committed size
                entry.committed = max(entry.committed, int(sizes[ino]))
            if len(self._admitted) > ADMITTED_MAX:
                for ino in [i for i, e in self._admitted.items() if not e.reserved]:
                    self._admitted.pop(ino, None)

    def drop(self, ino: int) -> None:
        """The file was truncated (its buffer flushed first) or left the tree. No lock (see
        ``reserved``): one dict operation."""
        self._admitted.pop(ino, None)

    # -- the data path's size watch (inside its commit transaction) ---------------------------
    def before(self, conn, inos) -> dict[int, int] | None:
        if not self.active(conn):
            return None
        ids = sorted(inos)
        if not ids:
            return None
        return dict(
            sql_all(conn, f"SELECT ino, size FROM inodes WHERE ino IN {in_list(ids)}", tuple(ids))
        )

    def after(self, conn, before: dict[int, int] | None) -> None:
        if not before:
            return
        ids = sorted(before)
        after = dict(
            sql_all(conn, f"SELECT ino, size FROM inodes WHERE ino IN {in_list(ids)}", tuple(ids))
        )
        for ino, old in before.items():
            delta = int(after.get(ino, old)) - int(old)
            if delta:
                self.charge(conn, roots_of(conn, ino, self.root_ino, include_self=False), delta, 0)


def recount_around(conn, ino: int, *, new_tree: bool = False) -> None:
    """Count again, in the caller's transaction, every quota whose tree holds ``ino`` or lies
    below it: after a change that rewrote a tree without the namespace (snapshot rollback,
    clone). ``new_tree``: ``ino`` heads inodes just made (a clone), on which no quota can be
    set yet, so only the quotas above it are counted (no walk of the new tree)."""
    rows = []
    if not new_tree:
        rows = sql_all(
            conn,
            "WITH RECURSIVE below(ino) AS (SELECT CAST(? AS BIGINT) UNION SELECT d.child FROM "
            "dirents d JOIN below ON d.parent = below.ino) SELECT q.id, q.root_ino FROM "
            "quotas q JOIN below ON q.root_ino = below.ino",
            (ino,),
        )
    root = sql_one(conn, "SELECT value FROM settings WHERE key = 'root_ino'")
    above = roots_of(conn, ino, int(root[0]) if root else ino)
    for qid, quota_root in {*rows, *((r.id, r.root_ino) for r in above)}:
        used_bytes, used_files = usage_below(conn, quota_root)
        sql(
            conn,
            "UPDATE quotas SET used_bytes = ?, used_files = ? WHERE id = ?",
            (used_bytes, used_files, qid),
        ).close()
