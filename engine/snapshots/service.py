"""Versioned datasets: snapshots of a directory tree, their views, rollback, clones and diffs.

How a snapshot is stored (docs/snapshots.md has the measurements):
a snapshot is a frozen copy of the dataset's inode, name, symlink, xattr and extent rows, made
by a handful of set statements (INSERT ... SELECT) in one transaction, with each copied inode
numbered densely in the tree's order: the copy is one contiguous range [ino_lo, ino_hi] that
nothing else is ever numbered in, so "is this inode frozen" is a range check (readonly.py)
and deleting a snapshot is range deletes. No data is copied: the copied extents reference the
same stripes, whose ``live_bytes`` count every reference (invariant 9). The live namespace's
rows and queries are untouched, so the live create/stat/write paths pay nothing for snapshots.
A lazy view (engine/namespace/lazyviews.py; made by create only when ``lazyviews.ENABLED``, off
on main, or with ``whole=False``) is its row and root; it has many blocks of numbers, handed out
as it copies: the readers of a whole snapshot (``_members``) read its blocks, a lazy view's after
its folders are copied (``_make_whole``); its space is counted through its lookup, and its
clones copy from that lookup.

Views: the first snapshot of DIR creates ``DIR/.snapshots`` (a real directory inode, hidden
from DIR's readdir, refused to every change); each snapshot's frozen root is named there.
Every change here is one catalog transaction that is not tracked, so every cache of every
process (namespace attributes and names, the read-only ranges, the data path's settled sizes)
reads the catalog again. A snapshot holds what was committed when it was taken; in a process
with a data path, buffered writes are flushed first."""

from __future__ import annotations

import builtins
import time
from dataclasses import asdict, dataclass

from engine.base import errors
from engine.catalog.database import in_list, sql, sql_all, sql_one
from engine.catalog.models import DIR
from engine.datapath.accounting import adjust_live, chunks
from engine.datapath.sharing import add_references, drop_counts
from engine.lifecycle.pacing import RateLimiter
from engine.namespace import lazyviews
from engine.namespace.common import ROOT, check_name
from engine.namespace.lazyclones import INODE_COLUMNS, materialize_batch, materialize_subtree
from engine.namespace.quotas import recount_around, roots_of
from engine.namespace.readonly import SNAPSHOT_DIR_NAME

_INODE_COLUMNS = INODE_COLUMNS
# what a path must keep to count as unchanged in a diff
_SIGNATURE = "type, size, mode, uid, gid, mtime_ns, ctime_ns, change"
# a PostgreSQL sequence is moved past a copied range; creates racing the move get numbers
# below this margin, never inside the range
_PG_SEQUENCE_MARGIN = 1000
# inode numbers of a snapshot freed per transaction: deleting 100,000 files in one held the
# catalog's write lock for seconds, and every other client's COMMIT waited behind it
DELETE_CHUNK_INODES = 4096
# the pace of a deleted snapshot's background reclaim (the daemon's ``snapshot-reclaim`` job;
# config snapshots.reclaim_inodes_per_s), so that other writers take the catalog's write lock
# between its chunks
RECLAIM_INODES_PER_S = 50_000


@dataclass(frozen=True)
class SnapshotInfo:
    name: str
    created: int  # ns since the epoch
    referenced_bytes: int  # bytes the snapshot's files reference (its logical size)
    unique_bytes: int  # live bytes only it references: what deleting it frees
    files: int  # inodes in the frozen tree, its root included
    id: int = 0
    # bytes it references in stripes that live files, clones or other snapshots reference too
    shared_bytes: int = 0
    # when the space figures were counted (ns since the epoch; 0: stale, a recount is due):
    # listings read stored figures, which changes of the live tree age (``recount_space``)
    counted: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class PendingReclaim:
    """A deleted snapshot whose rows the background reclaim has not freed yet."""

    id: int
    dataset_ino: int
    name: str  # the name it had
    pending_bytes: int | None  # what freeing the rest will give back; None: not counted yet
    inodes_left: int  # inode numbers still to free (an upper bound: the range left)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class DiffEntry:
    change: str  # "added" | "changed" | "removed"
    path: str  # relative to the dataset's root

    def to_dict(self) -> dict:
        return asdict(self)


def _fill_tree(conn, root: int, *, with_root: bool) -> None:
    """The temporary table ``snapshot_tree`` := the inodes under ``root`` (its own .snapshots and
    those of datasets inside it excluded); clones' directories under it are copied first."""
    materialize_subtree(conn, root)
    if conn.dialect.name == "sqlite":
        sql(conn, "CREATE TEMP TABLE IF NOT EXISTS snapshot_tree (ino INTEGER PRIMARY KEY)").close()
    else:
        sql(conn, "CREATE TEMP TABLE IF NOT EXISTS snapshot_tree (ino BIGINT PRIMARY KEY)").close()
    sql(conn, "DELETE FROM snapshot_tree").close()
    # the recursion walks directories only (a step per directory, not per file); their other
    # children come in one indexed statement (directories, and a file with several names there,
    # are in the table once: no join on inodes for the type)
    sql(
        conn,
        "WITH RECURSIVE t(ino) AS (SELECT CAST(? AS BIGINT) UNION ALL "
        "SELECT d.child FROM dirents d JOIN t ON d.parent = t.ino "
        "JOIN inodes i ON i.ino = d.child WHERE i.type = ? "
        "AND d.child NOT IN (SELECT dir_ino FROM snapshot_dirs)) "
        "INSERT INTO snapshot_tree (ino) SELECT ino FROM t",
        (root, DIR),
    ).close()
    sql(
        conn,
        "INSERT INTO snapshot_tree (ino) SELECT child FROM dirents "
        "WHERE parent IN (SELECT ino FROM snapshot_tree) "
        "AND child NOT IN (SELECT dir_ino FROM snapshot_dirs) ON CONFLICT DO NOTHING",
    ).close()
    if not with_root:
        sql(conn, "DELETE FROM snapshot_tree WHERE ino = ?", (root,)).close()


def _materialize_clones_under(conn, dataset: int) -> None:
    """Copy the clones' folders not copied yet (lazyclones.py) that lie inside ``dataset``:
    each pending clone folder is placed by walking up its parents (not the dataset's tree, so a
    lazy create pays for the clones pending, not for the files)."""
    pending = [
        int(r[0])
        for r in sql_all(
            conn, "SELECT dir_ino FROM clone_pending WHERE delta <> ?", (lazyviews.VIEW_PENDING,)
        )
    ]
    inside: dict[int, bool] = {dataset: True}
    for top in pending:
        path = []
        ino = top
        while ino not in inside:
            path.append(ino)
            row = sql_one(conn, "SELECT parent FROM dirents WHERE child = ? LIMIT 1", (ino,))
            if row is None:
                inside[ino] = False
                break
            ino = int(row[0])
        for step in path:
            inside[step] = inside[ino]
    for top in pending:
        if inside[top]:
            materialize_subtree(conn, top)


def _reserve_inodes(conn, lo_old: int, hi_old: int) -> int:
    """A delta such that [lo_old + delta, hi_old + delta] holds no inode and never will."""
    if conn.dialect.name == "sqlite":
        top = max(
            sql_one(conn, "SELECT COALESCE(MAX(ino), 0) FROM inodes")[0],
            (sql_one(conn, "SELECT seq FROM sqlite_sequence WHERE name = 'inodes'") or (0,))[0],
        )
        # AUTOINCREMENT remembers the largest number inserted, explicit ones included
        return top + 1 - lo_old
    seq = sql_one(conn, "SELECT pg_get_serial_sequence('inodes', 'ino')")[0]
    base = sql_one(conn, "SELECT nextval(?::regclass)", (seq,))[0]
    base += _PG_SEQUENCE_MARGIN
    sql(conn, "SELECT setval(?::regclass, ?)", (seq, base + hi_old - lo_old)).close()
    return base - lo_old


def _copy_tree(conn, root: int):
    """Copy the inodes of ``snapshot_tree`` (filled from ``root``, itself included), with their
    names, symlinks, xattrs and extents (sharing the stripes), numbered densely: the n-th
    smallest inode of the tree becomes ``base + n``, so the snapshot's range is as wide as the
    tree has inodes. (Numbering ``ino + delta`` reserved the span of the tree's numbers, which
    holds every earlier snapshot's range once a file is made after it: each snapshot reserved
    twice the numbers of the one before.) Returns (root's copy, lo, hi, count, referenced)."""
    _fill_tree(conn, root, with_root=True)
    integer = "INTEGER" if conn.dialect.name == "sqlite" else "BIGINT"
    sql(
        conn,
        f"CREATE TEMP TABLE IF NOT EXISTS snapshot_numbers (ino {integer} PRIMARY KEY, "
        f"new {integer} NOT NULL)",
    ).close()
    sql(conn, "DELETE FROM snapshot_numbers").close()
    count = sql_one(conn, "SELECT COUNT(*) FROM snapshot_tree")[0]
    base = _reserve_inodes(conn, 1, count)
    sql(
        conn,
        "INSERT INTO snapshot_numbers (ino, new) "
        "SELECT ino, ? + ROW_NUMBER() OVER (ORDER BY ino) FROM snapshot_tree",
        (base,),
    ).close()
    lo, hi = base + 1, base + count
    numbered = "FROM {0} t JOIN snapshot_numbers m ON m.ino = t.ino"
    sql(
        conn,
        f"INSERT INTO inodes (ino, {_INODE_COLUMNS}) SELECT m.new, "
        f"{', '.join('t.' + c.strip() for c in _INODE_COLUMNS.split(','))} "
        + numbered.format("inodes"),
    ).close()
    sql(
        conn,
        "INSERT INTO dirents (parent, name, child) SELECT p.new, d.name, c.new FROM dirents d "
        "JOIN snapshot_numbers p ON p.ino = d.parent JOIN snapshot_numbers c ON c.ino = d.child",
    ).close()
    sql(
        conn,
        "INSERT INTO symlinks (ino, target) SELECT m.new, t.target " + numbered.format("symlinks"),
    ).close()
    sql(
        conn,
        "INSERT INTO xattrs (ino, name, value) SELECT m.new, t.name, t.value "
        + numbered.format("xattrs"),
    ).close()
    sql(
        conn,
        "INSERT INTO extents (ino, file_offset, length, stripe_id, stripe_offset) "
        "SELECT m.new, t.file_offset, t.length, t.stripe_id, t.stripe_offset "
        + numbered.format("extents"),
    ).close()
    referenced = add_references(conn, lo, hi)
    # a file with links outside the tree has fewer names in the copy, and a dataset's copy has
    # no .snapshots directory
    lazyviews.count_links_between(conn, lo, hi)
    sql(
        conn,
        "UPDATE inodes SET nlink = nlink - 1 WHERE ino IN (SELECT new FROM snapshot_numbers "
        "WHERE ino IN (SELECT dataset_ino FROM snapshot_dirs))",
    ).close()
    copied_root = sql_one(conn, "SELECT new FROM snapshot_numbers WHERE ino = ?", (root,))[0]
    sql(conn, "DELETE FROM snapshot_numbers").close()
    sql(conn, "DELETE FROM snapshot_tree").close()
    return copied_root, lo, hi, count, referenced


def _copy_range(conn, snapshot_id: int):
    """Copy a snapshot's inodes, which are exactly its blocks (reserved at its create, or at
    copy time for a lazy view made whole first, frozen since: fsck checks it), as
    ``_copy_tree`` does, without walking the tree (range scans of the primary keys instead).
    Returns (delta, lo, hi, referenced bytes)."""
    member, params, lo, hi = _members(conn, snapshot_id)
    return _copy_rows(conn, member, params, lo, hi, None)


def _is_lazy(conn, snapshot_id: int) -> bool:
    """Whether the snapshot is a lazy view (``top_ino`` set: lazyviews.py), not a whole copy."""
    row = sql_one(conn, "SELECT top_ino FROM snapshots WHERE id = ?", (snapshot_id,))
    return row is not None and row[0] is not None


def _members(conn, snapshot_id: int) -> tuple[str, tuple, int, int]:
    """(predicate on the column named by ``{}``/``{0}``, its params, lo, hi) that selects the
    snapshot's inodes: the numbers in its blocks. A snapshot copied whole has one block, its
    range (the predicate is that range check); a lazy view has many, handed out at copy time
    (lazyviews.py), and is read whole only after ``lazyviews.materialize_all``. Blocks of all
    snapshots are disjoint, so a number's block is the one starting last at or below it."""
    blocks = sql_all(
        conn,
        "SELECT ino_lo, ino_hi FROM snapshot_blocks WHERE snapshot_id = ? ORDER BY ino_lo",
        (snapshot_id,),
    )
    if not blocks:
        return "{0} < 0", (), 0, -1  # nothing left
    lo, hi = int(blocks[0][0]), int(blocks[-1][1])
    if len(blocks) == 1:
        return "{0} BETWEEN ? AND ?", (lo, hi), lo, hi
    return (
        "{0} BETWEEN ? AND ? AND ? = (SELECT CASE WHEN b.ino_hi >= {0} THEN b.snapshot_id END "
        "FROM snapshot_blocks b WHERE b.ino_lo <= {0} ORDER BY b.ino_lo DESC LIMIT 1)",
        (lo, hi, snapshot_id),
        lo,
        hi,
    )


def _make_whole(conn, snapshot_id: int) -> None:
    """A lazy view's every folder copied (its names and rows as it holds them), so that its
    blocks hold its whole tree as a copy made at create would: the whole-view readers (space
    count, rollback, clone, diff) then read its blocks."""
    if _is_lazy(conn, snapshot_id):
        lazyviews.materialize_all(conn, snapshot_id)


def _make_lazy_views_whole(conn) -> None:
    """Every lazy view made whole (``_make_whole``), and its clones' pending folders copied:
    before the live tree is replaced wholesale (rollback), which they may still read."""
    for (sid,) in sql_all(conn, "SELECT id FROM snapshots WHERE top_ino IS NOT NULL"):
        # their clones' folders not copied yet read the same rows
        while materialize_batch(conn, int(sid)):
            pass
    for (sid,) in sql_all(
        conn, "SELECT id FROM snapshots WHERE top_ino IS NOT NULL AND deleting = ?", (False,)
    ):
        lazyviews.materialize_all(conn, int(sid))


def _copy_rows(conn, member: str, params: tuple, lo_old: int, hi_old: int, parent_map):
    """The rows of the inodes for which ``member`` (a predicate on the column named by ``{}``
    or ``{0}``, with ``params``) holds, copied as ``ino + delta`` into a range reserved for
    [lo_old, hi_old]; ``parent_map`` (old, new): names in directory ``old`` go to directory
    ``new`` (rollback keeps the dataset's own inode). Returns (delta, lo, hi, referenced)."""
    delta = _reserve_inodes(conn, lo_old, hi_old)
    in_tree = member.format("ino")
    sql(
        conn,
        f"INSERT INTO inodes (ino, {_INODE_COLUMNS}) SELECT ino + ?, {_INODE_COLUMNS} "
        f"FROM inodes WHERE {in_tree}",
        (delta, *params),
    ).close()
    old_parent, new_parent = parent_map or (-1, -1)
    parents = member.format("parent")
    if parent_map is not None:
        parents = f"({parents} OR parent = {int(old_parent)})"
    sql(
        conn,
        "INSERT INTO dirents (parent, name, child) "
        "SELECT CASE WHEN parent = ? THEN ? ELSE parent + ? END, name, child + ? "
        f"FROM dirents WHERE {parents} AND {member.format('child')}",
        (old_parent, new_parent, delta, delta, *params, *params),
    ).close()
    sql(
        conn,
        f"INSERT INTO symlinks (ino, target) SELECT ino + ?, target FROM symlinks WHERE {in_tree}",
        (delta, *params),
    ).close()
    sql(
        conn,
        "INSERT INTO xattrs (ino, name, value) SELECT ino + ?, name, value FROM xattrs "
        f"WHERE {in_tree}",
        (delta, *params),
    ).close()
    sql(
        conn,
        "INSERT INTO extents (ino, file_offset, length, stripe_id, stripe_offset) "
        "SELECT ino + ?, file_offset, length, stripe_id, stripe_offset FROM extents "
        f"WHERE {in_tree}",
        (delta, *params),
    ).close()
    lo, hi = lo_old + delta, hi_old + delta
    referenced = add_references(conn, lo, hi)
    # a file with links outside the tree has fewer names in the copy, and a dataset's copy has
    # no .snapshots directory
    lazyviews.count_links_between(conn, lo, hi)
    sql(
        conn,
        "UPDATE inodes SET nlink = nlink - 1 WHERE ino BETWEEN ? AND ? "
        "AND ino - ? IN (SELECT dataset_ino FROM snapshot_dirs)",
        (lo, hi, delta),
    ).close()
    return delta, lo, hi, referenced


class Snapshots:
    """Snapshots of datasets through a Namespace (and its data path, if it has one)."""

    def __init__(self, namespace):
        self.ns = namespace
        self.catalog = namespace.catalog

    # -- helpers ---------------------------------------------------------------------
    def _dataset(self, path: str) -> int:
        attr = self.ns.resolve(path, ROOT)
        if attr.type != DIR:
            raise errors.NotADirectory(f"{path}: a dataset is a directory")
        if self.ns.is_read_only(attr.ino):
            raise errors.ReadOnly(f"{path} is inside a snapshot")
        return attr.ino

    def _run(self, work, *, flush: bool = True, foreign_keys: bool = True):
        data = self.ns.data
        if data is not None and flush:
            data.flush_all()  # buffered writes belong to the state being captured or replaced
        try:
            # not tracked: every cache of every process reads the catalog again
            return self.catalog.run(work, durable=True, foreign_keys=foreign_keys)
        finally:
            self.ns.forget_read_only()
            self.ns.invalidate()

    @staticmethod
    def _snapshot_row(conn, dataset: int, name: str):
        row = sql_one(
            conn,
            "SELECT id, root_ino, ino_lo, ino_hi, created_ns FROM snapshots "
            "WHERE source_ino = ? AND name = ? AND deleting = ?",
            (dataset, name, False),
        )
        if row is None:
            raise errors.NotFound(f"no snapshot {name!r} of dataset inode {dataset}")
        return row

    @staticmethod
    def _touch(conn, ino: int, nlink_delta: int = 0) -> None:
        now = time.time_ns()
        sql(
            conn,
            "UPDATE inodes SET nlink = nlink + ?, mtime_ns = ?, ctime_ns = ?, "
            "change = change + 1 WHERE ino = ?",
            (nlink_delta, now, now, ino),
        ).close()

    def _snapshot_dir(self, conn, dataset: int) -> int:
        row = sql_one(conn, "SELECT dir_ino FROM snapshot_dirs WHERE dataset_ino = ?", (dataset,))
        if row is not None:
            return row[0]
        if (
            sql_one(
                conn,
                "SELECT id FROM dirents WHERE parent = ? AND name = ?",
                (dataset, SNAPSHOT_DIR_NAME),
            )
            is not None
        ):
            raise errors.Exists(
                f"{SNAPSHOT_DIR_NAME!r} exists in dataset inode {dataset}: "
                "rename it before taking a snapshot"
            )
        uid, gid = sql_one(conn, "SELECT uid, gid FROM inodes WHERE ino = ?", (dataset,))
        now = time.time_ns()
        dir_ino = sql_one(
            conn,
            "INSERT INTO inodes (generation, type, mode, uid, gid, size, "
            "nlink, rdev, atime_ns, mtime_ns, ctime_ns, btime_ns, change) "
            "VALUES (1, ?, ?, ?, ?, 0, 2, 0, ?, ?, ?, ?, 1) RETURNING ino",
            (DIR, 0o555, uid, gid, now, now, now, now),
        )[0]
        sql(
            conn,
            "INSERT INTO dirents (parent, name, child) VALUES (?, ?, ?)",
            (dataset, SNAPSHOT_DIR_NAME, dir_ino),
        ).close()
        sql(
            conn,
            "INSERT INTO snapshot_dirs (dataset_ino, dir_ino) VALUES (?, ?)",
            (dataset, dir_ino),
        ).close()
        self._touch(conn, dataset, nlink_delta=1)
        return dir_ino

    # -- the operations ----------------------------------------------------------------
    def create(self, path: str, name: str, *, whole: bool | None = None) -> SnapshotInfo:
        """A read-only copy of the tree at ``path``, seen at ``path/.snapshots/name``: a lazy
        view (``_create_lazy``) when live changes copy up (``lazyviews.ENABLED``), else, or with
        ``whole``, every row copied now."""
        check_name(name)
        if whole is None:
            whole = not lazyviews.ENABLED
        if not whole:
            return self._create_lazy(path, name)
        dataset = self._dataset(path)

        def work(conn):
            snapdir = self._snapshot_dir(conn, dataset)
            _refuse_taken_name(conn, dataset, name, path)
            root, lo, hi, count, referenced = _copy_tree(conn, dataset)
            sql(
                conn,
                "INSERT INTO dirents (parent, name, child) VALUES (?, ?, ?)",
                (snapdir, name, root),
            ).close()
            self._touch(conn, snapdir, nlink_delta=1)
            now = time.time_ns()
            # nothing is unique yet: every stripe it references, the live tree references too
            snapshot_id = sql_one(
                conn,
                "INSERT INTO snapshots (name, source_ino, root_ino, ino_lo, ino_hi, "
                "created_ns, deleting, files, referenced_bytes, unique_bytes, shared_bytes, "
                "space_counted_ns) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 0, ?, ?) RETURNING id",
                (name, dataset, root, lo, hi, now, False, count, referenced, referenced, now),
            )[0]
            # copied whole: its range is its one block of inode numbers
            sql(
                conn,
                "INSERT INTO snapshot_blocks (ino_lo, ino_hi, snapshot_id) VALUES (?, ?, ?)",
                (lo, hi, snapshot_id),
            ).close()
            return snapshot_id, now, count, referenced

        # inserts only (rows copied from rows that hold, onto inodes inserted first): SQLite's
        # foreign-key lookups of each copied row are skipped (_copy_tree)
        snapshot_id, created, count, referenced = self._run(work, foreign_keys=False)
        # nothing is unique yet: the live tree references every stripe the copy does
        return SnapshotInfo(
            name,
            created,
            referenced,
            0,
            files=count,
            id=snapshot_id,
            shared_bytes=referenced,
            counted=created,
        )

    def _create_lazy(self, path: str, name: str) -> SnapshotInfo:
        """A lazy view (engine/namespace/lazyviews.py), whatever the tree holds: the snapshot
        row with ``top_ino`` (the largest inode number now: every live inode above it was made
        after), its root's row and name, no other row copied. Live changes copy up what the
        view holds before changing it; its folders are copied when first read; its space is
        counted by the ``snapshot-space`` job through its lookup (``counted`` 0 until then)."""
        dataset = self._dataset(path)

        def work(conn):
            snapdir = self._snapshot_dir(conn, dataset)
            _refuse_taken_name(conn, dataset, name, path)
            # clones' folders inside the dataset not copied yet: the view reads live names,
            # and would read them empty
            _materialize_clones_under(conn, dataset)
            top = sql_one(conn, "SELECT MAX(ino) FROM inodes")[0]
            now = time.time_ns()
            sid = sql_one(
                conn,
                "INSERT INTO snapshots (name, source_ino, root_ino, ino_lo, ino_hi, created_ns, "
                "deleting, top_ino) VALUES (?, ?, ?, 0, 0, ?, ?, ?) RETURNING id",
                (name, dataset, dataset, now, False, top),
            )[0]
            root = lazyviews.create(conn, dataset, sid)
            sql(
                conn,
                "UPDATE snapshots SET root_ino = ?, ino_lo = ?, ino_hi = ? WHERE id = ?",
                (root, root, root, sid),
            ).close()
            sql(
                conn,
                "INSERT INTO dirents (parent, name, child) VALUES (?, ?, ?)",
                (snapdir, name, root),
            ).close()
            self._touch(conn, snapdir, nlink_delta=1)
            return sid, now

        sid, created = self._run(work)
        return SnapshotInfo(name, created, 0, 0, files=0, id=sid, shared_bytes=0, counted=0)

    def list(self, path: str, *, recount: bool = False) -> list[SnapshotInfo]:
        """The dataset's snapshots, oldest first, with their space as last counted (one read of
        their rows: a page load does not group every extent of every snapshot); ``recount``:
        count every snapshot's space first (``recount_space``). Figures never counted (rows
        from before they were stored) are counted in this read."""
        dataset = self._dataset(path)
        if recount:
            self.recount_space(path)

        def work(conn):
            out = []
            for sid, name, created, *stored in sql_all(
                conn,
                "SELECT id, name, created_ns, files, referenced_bytes, "
                "unique_bytes, shared_bytes, space_counted_ns FROM snapshots "
                "WHERE source_ino = ? AND deleting = ? ORDER BY created_ns, id",
                (dataset, False),
            ):
                files, referenced, unique, shared, counted = stored
                if counted is None and _is_lazy(conn, sid):
                    # a lazy view is counted by the background job (it copies its folders)
                    files, referenced, unique, shared, counted = 0, 0, 0, 0, 0
                elif counted is None:
                    counted = time.time_ns()
                    files, referenced, unique, shared = self._count_space(conn, sid)
                out.append(
                    SnapshotInfo(
                        name, created, referenced, unique, files, sid, shared, int(counted)
                    )
                )
            return out

        return self.catalog.read(work)

    def _count_space(self, conn, snapshot_id: int) -> tuple[int, int, int, int]:
        """(files, referenced, unique, shared) of the snapshot's inodes (a lazy view: those
        copied so far; ``_make_whole`` first for its whole tree)."""
        member, params, _lo, _hi = _members(conn, snapshot_id)
        where = member.format("ino")
        files = sql_one(conn, f"SELECT COUNT(*) FROM inodes WHERE {where}", params)[0]
        return (int(files), *self._space_in(conn, member, params))

    def recount_space(
        self,
        path: str | None = None,
        *,
        name: str | None = None,
        older_than_s: float | None = None,
        progress=None,
    ) -> int:
        """Count the space of the snapshots (of the dataset at ``path``, or of all; only
        ``name`` if given) whose figures were counted more than ``older_than_s`` ago (None:
        every one) and store it;
        returns how many were counted. Each is one read of its extents and a small write, so
        other writers are not held; the time taken before the read is stored, so a change
        during the read leaves the figures due again. The daemon runs this as the
        ``snapshot-space`` job every ``snapshots.space_recount_s``."""
        dataset = None if path is None else self._dataset(path)
        where = "deleting = ?"
        params: list[object] = [False]
        if dataset is not None:
            where, params = where + " AND source_ino = ?", [*params, dataset]
        if name is not None:
            where, params = where + " AND name = ?", [*params, name]
        if older_than_s is not None:
            where += " AND (space_counted_ns IS NULL OR space_counted_ns < ?)"
            params.append(time.time_ns() - int(older_than_s * 1e9))
        due = self.catalog.read(
            lambda conn: sql_all(
                conn,
                f"SELECT id, top_ino FROM snapshots WHERE {where} ORDER BY id",
                tuple(params),
            )
        )
        for done, (sid, top) in enumerate(due, 1):
            stamp = time.time_ns()
            if top is not None:  # a lazy view: counted through its lookup, nothing copied
                figures = self.catalog.read(lambda conn, s=sid: lazyviews.count_space(conn, s))
            else:
                figures = self.catalog.read(lambda conn, s=sid: self._count_space(conn, s))
            # tracked: nothing any cache holds changes
            self.catalog.run(
                lambda conn, sid=sid, f=figures, t=stamp: sql(
                    conn,
                    "UPDATE snapshots SET files = ?, referenced_bytes = ?, unique_bytes = ?, "
                    "shared_bytes = ?, space_counted_ns = ? WHERE id = ? AND deleting = ?",
                    (*f, t, sid, False),
                ).close(),
                tracked=True,
            )
            if progress is not None:
                progress(done, len(due), "counting snapshot space")
        return len(due)

    def space_of(self, path: str, name: str) -> SnapshotInfo:
        """Snapshot ``name`` of ``path`` with its space counted now (and stored)."""
        self.recount_space(path, name=name)
        for info in self.list(path):
            if info.name == name:
                return info
        raise errors.NotFound(f"no snapshot {name!r} of {path}")

    def space_due(self, older_than_s: float) -> bool:
        """Whether some snapshot's space figures are older than ``older_than_s`` (or stale):
        one read of the snapshot rows, for the daemon's maintenance round."""
        cutoff = time.time_ns() - int(older_than_s * 1e9)
        return (
            self.catalog.read(
                lambda conn: sql_one(
                    conn,
                    "SELECT id FROM snapshots WHERE deleting = ? AND (space_counted_ns IS NULL "
                    "OR space_counted_ns < ?) LIMIT 1",
                    (False, cutoff),
                )
            )
            is not None
        )

    @staticmethod
    def _space_stale(conn, source_ino: int | None = None) -> None:
        """The stored space figures of the snapshots (of one dataset, or all) no longer hold
        (stripes they share lost or gained references): the next maintenance round recounts
        them; listings show the old figures until then."""
        where = "deleting = ? AND space_counted_ns IS NOT NULL"
        params: list[object] = [False]
        if source_ino is not None:
            where, params = where + " AND source_ino = ?", [*params, source_ino]
        sql(conn, f"UPDATE snapshots SET space_counted_ns = 0 WHERE {where}", tuple(params)).close()

    @staticmethod
    def _space_in(conn, member: str, params: tuple) -> tuple[int, int, int]:
        """(referenced, unique, shared bytes) of the inodes for which ``member`` (a predicate
        on ``{0}``, as ``_members`` gives) holds: unique are the live bytes of stripes that no
        other inode references; shared, their references into stripes that some other inode
        references too."""
        referenced, unique, shared = sql_one(
            conn,
            "SELECT COALESCE(SUM(r.refs), 0), COALESCE(SUM(CASE WHEN s.live_bytes = r.refs THEN "
            "(CASE WHEN s.live_bytes < s.data_length THEN s.live_bytes ELSE s.data_length END) "
            "ELSE 0 END), 0), COALESCE(SUM(CASE WHEN s.live_bytes = r.refs THEN 0 ELSE r.refs "
            "END), 0) FROM (SELECT stripe_id, SUM(length) AS refs FROM extents "
            f"WHERE {member.format('ino')} GROUP BY stripe_id) r "
            "JOIN stripes s ON s.id = r.stripe_id",
            params,
        )
        return int(referenced), int(unique), int(shared)

    def delete(self, path: str, name: str) -> None:
        """Remove a snapshot: one transaction of a few indexed statements, whatever it holds.

        It takes the name away (the snapshot is gone for every reader from then on) and marks
        the row ``deleting``; its rows and the space only it held are freed afterwards by
        ``reclaim`` (the daemon's paced ``snapshot-reclaim`` job), DELETE_CHUNK_INODES inode
        numbers per transaction. Until then ``pending`` shows what that will free. A crash
        anywhere leaves the snapshot whole (before the commit) or pending (after)."""
        dataset = self._dataset(path)

        def work(conn):
            sid, root, _lo, _hi, _created = self._snapshot_row(conn, dataset, name)
            snapdir = sql_one(
                conn, "SELECT dir_ino FROM snapshot_dirs WHERE dataset_ino = ?", (dataset,)
            )[0]
            sql(conn, "DELETE FROM dirents WHERE parent = ? AND child = ?", (snapdir, root)).close()
            self._touch(conn, snapdir, nlink_delta=-1)
            # "/" cannot be in a name: the name is free at once for a new snapshot
            sql(
                conn,
                "UPDATE snapshots SET deleting = ?, name = ?, root_ino = source_ino, "
                "pending_bytes = NULL WHERE id = ?",
                (True, f"{name}/{sid}", sid),
            ).close()
            # a lazy view's folders not copied yet never will be (its clones' stay pending)
            sql(
                conn,
                "DELETE FROM clone_pending WHERE snapshot_id = ? AND delta = ?",
                (sid, lazyviews.VIEW_PENDING),
            ).close()

        self._run(work, flush=False)

    def pending(self, path: str | None = None) -> builtins.list[PendingReclaim]:
        """Deleted snapshots whose space the background reclaim has not freed yet (of the
        dataset at ``path``, or of all); one indexed read of the snapshot rows."""
        dataset = None if path is None else self.ns.resolve(path, ROOT).ino

        def work(conn):
            where, params = "deleting = ?", [True]
            if dataset is not None:
                where, params = "deleting = ? AND source_ino = ?", [True, dataset]
            return sql_all(
                conn,
                "SELECT id, source_ino, name, pending_bytes, (SELECT SUM(b.ino_hi - b.ino_lo + 1) "
                "FROM snapshot_blocks b WHERE b.snapshot_id = snapshots.id) FROM snapshots "
                f"WHERE {where} ORDER BY id",
                tuple(params),
            )

        return [
            PendingReclaim(
                sid,
                source,
                name.rpartition("/")[0] or name,
                None if pending is None else int(pending),
                int(left or 0),
            )
            for sid, source, name, pending, left in self.catalog.read(work)
        ]

    def finish_deletions(self) -> int:
        """Free every deleted snapshot's rows now, unpaced; returns the stripes freed."""
        return self.reclaim(inodes_per_s=0)

    def reclaim(self, inodes_per_s: float = RECLAIM_INODES_PER_S, progress=None) -> int:
        """Free the rows of every deleted snapshot (oldest first), DELETE_CHUNK_INODES inode
        numbers per transaction, at most ``inodes_per_s`` on average (0: unpaced); returns the
        stripes freed.
        ``progress(done, total, message)`` is called after each chunk. Each chunk starts where
        the catalog says the last one ended (``ino_lo``), so a reclaim cut short by a crash, or
        running in two processes at once, frees every row once."""
        pending = self.pending()
        total = sum(p.inodes_left for p in pending)
        pace = RateLimiter(items_per_s=inodes_per_s)
        done = freed = 0
        for item in pending:
            # its clones' directories not copied yet read its rows: copied before any is freed
            while self._run(
                lambda conn, i=item: materialize_batch(conn, i.id), flush=False, foreign_keys=False
            ):
                pass
            # older lazy views of its dataset may read its copies: each goes to the one that
            # reads it first (lazyviews.hand_down), a batch per transaction
            after: int | None = 0
            while after is not None:
                after = self._run(
                    lambda conn, i=item, a=after: lazyviews.hand_down(conn, i.id, a),
                    flush=False,
                    foreign_keys=False,
                )
            counted = item.pending_bytes
            if counted is None:  # counted outside the chunks' write transactions
                counted = self.catalog.read(lambda conn, i=item: self._pending_of(conn, i.id))
            while True:
                dead, numbers, inodes, finished = self._run(
                    lambda conn, i=item, c=counted: self._reclaim_chunk(conn, i.id, c),
                    flush=False,
                    foreign_keys=False,
                )
                self._forget_stripes(dead)
                freed += len(dead)
                done += numbers
                if progress is not None:
                    progress(min(done, total), total, f"reclaiming deleted snapshot {item.name}")
                if finished:
                    break
                pace.spend(items=inodes)  # the rows freed, not the numbers skipped
        return freed

    def _pending_of(self, conn, snapshot_id: int) -> int:
        return self._space_in(conn, *_members(conn, snapshot_id)[:2])[1]

    def _reclaim_chunk(self, conn, snapshot_id: int, counted: int):
        """One chunk of a deleted snapshot's rows, from where the last one ended (the start of
        its lowest block left): (dead stripes, inode numbers covered, inodes freed, whether the
        snapshot is now wholly freed)."""
        lock = " FOR UPDATE" if conn.dialect.name == "postgresql" else ""  # one reclaimer a row
        row = sql_one(
            conn,
            f"SELECT pending_bytes FROM snapshots WHERE id = ? AND deleting = ?{lock}",
            (snapshot_id, True),
        )
        if row is None:
            return [], 0, 0, True  # another process finished it
        pending = row[0]
        block = sql_one(
            conn,
            "SELECT ino_lo, ino_hi FROM snapshot_blocks WHERE snapshot_id = ? "
            "ORDER BY ino_lo LIMIT 1",
            (snapshot_id,),
        )
        if block is None:  # nothing left (or never copied): the row goes, its blocks did
            self._drop_snapshot_row(conn, snapshot_id)
            self._space_stale(conn)
            return [], 0, 0, True
        lo, hi = int(block[0]), int(block[1])
        # a range numbered before creates numbered densely spans every earlier snapshot's range
        # and holds few inodes: a chunk starts at the next inode, not the next number
        first = sql_one(conn, "SELECT MIN(ino) FROM inodes WHERE ino BETWEEN ? AND ?", (lo, hi))[0]
        start = hi if first is None else int(first)
        if hi - start + 1 < DELETE_CHUNK_INODES:
            grouped = self._reclaim_blocks(
                conn, snapshot_id, start, counted if pending is None else int(pending)
            )
            if grouped is not None:
                return grouped
        end = min(start + DELETE_CHUNK_INODES - 1, hi)
        rows = sql_one(conn, "SELECT COUNT(*) FROM inodes WHERE ino BETWEEN ? AND ?", (start, end))[
            0
        ]
        # the unique bytes that die with this chunk
        freeing = self._space_in(conn, "{0} BETWEEN ? AND ?", (start, end))[1]
        dead = self._purge_range(conn, start, end)
        if end >= hi:
            sql(conn, "DELETE FROM snapshot_blocks WHERE ino_lo = ?", (lo,)).close()
        else:
            sql(
                conn, "UPDATE snapshot_blocks SET ino_lo = ? WHERE ino_lo = ?", (end + 1, lo)
            ).close()
        more = sql_one(
            conn, "SELECT MIN(ino_lo) FROM snapshot_blocks WHERE snapshot_id = ?", (snapshot_id,)
        )[0]
        if more is None:
            self._drop_snapshot_row(conn, snapshot_id)
            # what it shared with other snapshots (of any dataset: clones copy rows) may now be
            # theirs alone
            self._space_stale(conn)
            return dead, end - lo + 1, int(rows), True
        left = max(0, (counted if pending is None else int(pending)) - freeing)
        sql(
            conn,
            "UPDATE snapshots SET ino_lo = ?, pending_bytes = ? WHERE id = ?",
            (int(more), left, snapshot_id),
        ).close()
        return dead, end - lo + 1, int(rows), False

    def _reclaim_blocks(self, conn, snapshot_id: int, start: int, pending: int):
        """A chunk of several small blocks (a lazy view's, handed out a copy at a time and
        interleaved with live numbers), whole, up to DELETE_CHUNK_INODES numbers from
        ``start`` (in the first one): as ``_reclaim_chunk``, None when the first block alone
        fills the chunk (it goes through the range path)."""
        blocks = sql_all(
            conn,
            "SELECT ino_lo, ino_hi FROM snapshot_blocks WHERE snapshot_id = ? "
            "ORDER BY ino_lo LIMIT ?",
            (snapshot_id, DELETE_CHUNK_INODES),
        )
        numbers = int(blocks[0][1]) - start + 1
        taken = 1
        for b_lo, b_hi in blocks[1:]:
            if numbers + int(b_hi) - int(b_lo) + 1 > DELETE_CHUNK_INODES:
                break
            numbers += int(b_hi) - int(b_lo) + 1
            taken += 1
        if taken == 1:
            return None
        first_lo, cut = int(blocks[0][0]), int(blocks[taken - 1][0])
        integer = "INTEGER" if conn.dialect.name == "sqlite" else "BIGINT"
        sql(
            conn, f"CREATE TEMP TABLE IF NOT EXISTS reclaim_inodes (ino {integer} PRIMARY KEY)"
        ).close()
        sql(conn, "DELETE FROM reclaim_inodes").close()
        sql(
            conn,
            "INSERT INTO reclaim_inodes (ino) SELECT i.ino FROM snapshot_blocks b JOIN inodes i "
            "ON i.ino BETWEEN b.ino_lo AND b.ino_hi WHERE b.snapshot_id = ? "
            "AND b.ino_lo BETWEEN ? AND ?",
            (snapshot_id, first_lo, cut),
        ).close()
        member = "{0} IN (SELECT ino FROM reclaim_inodes)"
        rows = sql_one(conn, "SELECT COUNT(*) FROM reclaim_inodes")[0]
        freeing = self._space_in(conn, member, ())[1]
        dead = self._purge(conn, member, ())
        sql(conn, "DELETE FROM reclaim_inodes").close()
        sql(
            conn,
            "DELETE FROM snapshot_blocks WHERE snapshot_id = ? AND ino_lo BETWEEN ? AND ?",
            (snapshot_id, first_lo, cut),
        ).close()
        more = sql_one(
            conn, "SELECT MIN(ino_lo) FROM snapshot_blocks WHERE snapshot_id = ?", (snapshot_id,)
        )[0]
        if more is None:
            self._drop_snapshot_row(conn, snapshot_id)
            self._space_stale(conn)
            return dead, numbers, int(rows), True
        sql(
            conn,
            "UPDATE snapshots SET ino_lo = ?, pending_bytes = ? WHERE id = ?",
            (int(more), max(0, pending - freeing), snapshot_id),
        ).close()
        return dead, numbers, int(rows), False

    @staticmethod
    def _drop_snapshot_row(conn, snapshot_id: int) -> None:
        """The row of a reclaimed snapshot, with what refers to it (the reclaim runs without
        SQLite's foreign-key cascades)."""
        for table in ("snapshot_names", "snapshot_inodes", "snapshot_blocks"):
            sql(conn, f"DELETE FROM {table} WHERE snapshot_id = ?", (snapshot_id,)).close()
        sql(conn, "DELETE FROM snapshots WHERE id = ?", (snapshot_id,)).close()

    @classmethod
    def _purge_range(cls, conn, lo: int, hi: int) -> builtins.list[int]:
        """Delete the rows of inodes [lo, hi], every row that references them first: it runs
        without SQLite's foreign-key checks, whose lookups and cascades for each deleted inode
        cost more than the deletes (0.7 of 1.2 s at 100,000 files). Nothing outside the range
        references a frozen inode once its snapshot's name is gone (its root's name and the
        snapshot row's ``root_ino`` went in the first transaction); a dead stripe's fragments
        go with it in ``adjust_live``, its inline data here."""
        return cls._purge(conn, "{0} BETWEEN ? AND ?", (lo, hi))

    @staticmethod
    def _purge(conn, member: str, params: tuple) -> builtins.list[int]:
        """``_purge_range`` for the inodes for which ``member`` (a predicate on ``{0}``) holds."""
        where = member.format("ino")
        dead = drop_counts(
            conn,
            where,
            params,
            lambda conn: sql(conn, f"DELETE FROM extents WHERE {where}", params).close(),
        )
        for part in chunks(dead):  # what the cascade from a dead stripe would delete
            sql(
                conn, f"DELETE FROM inline_data WHERE stripe_id IN {in_list(part)}", tuple(part)
            ).close()
        for table in ("symlinks", "xattrs"):
            sql(conn, f"DELETE FROM {table} WHERE {where}", params).close()
        for column in ("parent", "child"):
            sql(conn, f"DELETE FROM dirents WHERE {member.format(column)}", params).close()
        sql(conn, f"DELETE FROM inodes WHERE {where}", params).close()
        return dead

    def _forget_stripes(self, dead) -> None:
        data = self.ns.data
        if data is not None and dead:
            data.reader.forget(set(dead))

    def rollback(self, path: str, name: str) -> None:
        """Make the dataset what the snapshot holds: its current files are freed (stripes nothing
        else references die) and the snapshot's are copied in as new writable inodes (open
        handles to the old ones go stale). Other snapshots stay."""
        dataset = self._dataset(path)

        def work(conn):
            sid, root, _lo, _hi, _created = self._snapshot_row(conn, dataset, name)
            snapdir = sql_one(
                conn, "SELECT dir_ino FROM snapshot_dirs WHERE dataset_ino = ?", (dataset,)
            )[0]
            # lazy views read live rows that are about to go: each is copied whole first
            _make_lazy_views_whole(conn)
            member, params, lo, hi = _members(conn, sid)
            dead = self._free_contents(conn, dataset, snapdir)
            # the snapshot's inodes but its root, whose names go to the dataset's own inode
            _copy_rows(conn, member + " AND {0} <> ?", (*params, root), lo, hi, (root, dataset))
            mode, uid, gid, mtime = sql_one(
                conn, "SELECT mode, uid, gid, mtime_ns FROM inodes WHERE ino = ?", (root,)
            )
            subdirs = sql_one(
                conn,
                "SELECT COUNT(*) FROM dirents d JOIN inodes i ON i.ino = "
                "d.child WHERE d.parent = ? AND i.type = ?",
                (dataset, DIR),
            )[0]
            sql(
                conn,
                "UPDATE inodes SET mode = ?, uid = ?, gid = ?, mtime_ns = ?, ctime_ns = ?, "
                "nlink = ?, change = change + 1 WHERE ino = ?",
                (mode, uid, gid, mtime, time.time_ns(), 2 + subdirs, dataset),
            ).close()
            recount_around(conn, dataset)  # the dataset's files were replaced wholesale
            self._space_stale(conn, dataset)  # what the freed files shared is theirs alone now
            return dead

        self._forget_stripes(self._run(work))

    @staticmethod
    def _free_contents(conn, dataset: int, snapdir: int) -> builtins.list[int]:
        """Remove everything under ``dataset`` but its .snapshots; returns the dead stripes."""
        _fill_tree(conn, dataset, with_root=False)
        nested = sql_one(
            conn,
            "SELECT COUNT(*) FROM snapshot_dirs WHERE dataset_ino IN "
            "(SELECT ino FROM snapshot_tree)",
        )[0]
        if nested:
            raise errors.NotEmpty(
                f"dataset inode {dataset} holds {nested} datasets with "
                "snapshots: delete those first"
            )
        tree = "(SELECT ino FROM snapshot_tree)"
        sql(
            conn,
            f"DELETE FROM dirents WHERE (parent IN {tree} OR parent = ?) AND child <> ?",
            (dataset, snapdir),
        ).close()
        # files also named outside the dataset keep those names
        sql(
            conn,
            f"UPDATE inodes SET nlink = (SELECT COUNT(*) FROM dirents WHERE "
            f"child = inodes.ino) WHERE ino IN {tree} AND type <> ? AND ino IN "
            "(SELECT child FROM dirents)",
            (DIR,),
        ).close()
        sql(conn, "DELETE FROM snapshot_tree WHERE ino IN (SELECT child FROM dirents)").close()
        deltas = {
            sid: -int(n)
            for sid, n in sql_all(
                conn,
                f"SELECT stripe_id, SUM(length) FROM extents WHERE ino IN {tree} "
                "GROUP BY stripe_id",
            )
        }
        for table in ("extents", "symlinks", "xattrs"):
            sql(conn, f"DELETE FROM {table} WHERE ino IN {tree}").close()
        sql(conn, f"DELETE FROM inodes WHERE ino IN {tree}").close()
        sql(conn, "DELETE FROM snapshot_tree").close()
        return adjust_live(conn, deltas)

    def clone(self, path: str, name: str, new_path: str) -> int:
        """A writable copy of the snapshot at ``new_path`` (a new name in an existing directory),
        sharing every stripe; returns its inode."""
        dataset = self._dataset(path)
        parent_path, _, new_name = new_path.rstrip("/").rpartition("/")
        check_name(new_name)
        parent = self._dataset(parent_path or "/")

        def work(conn):
            sid, root, _lo, _hi, _created = self._snapshot_row(conn, dataset, name)
            self.ns.readonly.check_writable(parent, conn=conn)
            if (
                sql_one(
                    conn, "SELECT id FROM dirents WHERE parent = ? AND name = ?", (parent, new_name)
                )
                is not None
            ):
                raise errors.Exists(f"{new_path} exists")
            quota = roots_of(conn, parent, self.ns.root_ino)
            if _is_lazy(conn, sid) and not quota:
                # the root alone; each folder copied when first needed from what the view
                # reads through its lookup, numbered as it is copied (lazyviews.clone_root)
                made = lazyviews.clone_root(conn, sid)
                delta = made - root
            elif quota:
                _make_whole(conn, sid)  # a lazy view: its blocks then hold its whole tree
                # under a quota: copied now, so its counters and fsck's recount see every file
                delta = _copy_range(conn, sid)[0]
            else:  # the root alone; each directory's names when first needed (lazyclones.py)
                _member, _params, lo, hi = _members(conn, sid)
                delta = _reserve_inodes(conn, lo, hi)
                if conn.dialect.name == "sqlite":  # no later inode may be numbered in the range
                    sql(
                        conn,
                        "UPDATE sqlite_sequence SET seq = ? WHERE name = 'inodes' AND seq < ?",
                        (hi + delta, hi + delta),
                    ).close()
                sql(
                    conn,
                    f"INSERT INTO inodes (ino, {_INODE_COLUMNS}) SELECT ino + ?, "
                    f"{_INODE_COLUMNS} FROM inodes WHERE ino = ?",
                    (delta, root),
                ).close()
                sql(
                    conn,
                    "INSERT INTO xattrs (ino, name, value) SELECT ino + ?, name, value "
                    "FROM xattrs WHERE ino = ?",
                    (delta, root),
                ).close()
                sql(
                    conn,
                    "INSERT INTO clone_pending (dir_ino, delta, snapshot_id) VALUES (?, ?, ?)",
                    (root + delta, delta, sid),
                ).close()
            sql(
                conn,
                "INSERT INTO dirents (parent, name, child) VALUES (?, ?, ?)",
                (parent, new_name, root + delta),
            ).close()
            self._touch(conn, parent, nlink_delta=1)
            # the clone counts at its files' logical sizes in the quotas above it
            recount_around(conn, root + delta, new_tree=True)
            self._space_stale(conn, dataset)  # the snapshot's stripes are the clone's too now
            return root + delta

        return self._run(work, foreign_keys=False)  # inserts only, as in create

    def diff(self, path: str, a: str, b: str | None = None) -> builtins.list[DiffEntry]:
        """Paths added, changed or removed from snapshot ``a`` to snapshot ``b`` (or the live
        tree), sorted by path."""
        dataset = self._dataset(path)
        if b is None:  # the live tree's clones, copied first: the walk reads names
            self._run(lambda conn: materialize_subtree(conn, dataset), flush=False)

        def lazy(conn):
            return [
                sid
                for sid in (self._snapshot_row(conn, dataset, n)[0] for n in (a, b) if n)
                if _is_lazy(conn, sid)
            ]

        views = self.catalog.read(lazy)
        if views:  # lazy views' folders copied first: the walk reads names

            def whole(conn):
                for sid in views:
                    _make_whole(conn, sid)

            self._run(whole, flush=False)

        def work(conn):
            old = self._paths(conn, self._snapshot_row(conn, dataset, a)[1])
            new = self._paths(
                conn, dataset if b is None else self._snapshot_row(conn, dataset, b)[1]
            )
            return old, new

        old, new = self.catalog.read(work)
        out = [DiffEntry("removed", p) for p in old.keys() - new.keys()]
        out += [DiffEntry("added", p) for p in new.keys() - old.keys()]
        out += [DiffEntry("changed", p) for p in old.keys() & new.keys() if old[p] != new[p]]
        return sorted(out, key=lambda e: (e.path, e.change))

    @staticmethod
    def _paths(conn, root: int) -> dict[str, tuple]:
        """Relative path -> signature of every name under ``root`` (one read: no temp table)."""
        columns = ", ".join("i." + c for c in _SIGNATURE.split(", "))
        rows = sql_all(
            conn,
            "WITH RECURSIVE t(ino) AS (SELECT CAST(? AS BIGINT) UNION "
            "SELECT d.child FROM dirents d JOIN t ON d.parent = t.ino "
            "WHERE d.child NOT IN (SELECT dir_ino FROM snapshot_dirs)) "
            f"SELECT d.parent, d.name, d.child, {columns} FROM dirents d "
            "JOIN t ON d.parent = t.ino JOIN inodes i ON i.ino = d.child "
            "WHERE d.child NOT IN (SELECT dir_ino FROM snapshot_dirs)",
            (root,),
        )
        names = {child: (parent, name) for parent, name, child, *_ in rows}
        out = {}
        for parent, name, _child, *signature in rows:
            parts = [name]
            current = parent
            while current != root:
                current, part = names[current]
                parts.append(part)
            out["/".join(reversed(parts))] = tuple(signature)
        return out


def _refuse_taken_name(conn, dataset: int, name: str, path: str) -> None:
    """A dataset's snapshot names are unique: create refuses one already taken."""
    if (
        sql_one(conn, "SELECT id FROM snapshots WHERE source_ino = ? AND name = ?", (dataset, name))
        is not None
    ):
        raise errors.Exists(f"snapshot {name!r} of {path} exists")
