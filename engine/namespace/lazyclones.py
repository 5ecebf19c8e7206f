"""Writable clones of a snapshot in constant time: directories copied on first need.

A clone (engine/snapshots/service.py ``clone``) is numbered ``snapshot ino + delta`` like a
copy, but only its root row is written when it is made, with a ``clone_pending`` row. A
pending directory's names, and its children's rows (inode, extents counted in their stripes,
xattrs, symlink target), are copied from its source ``dir_ino - delta`` the first time they are
needed, in one transaction; child directories become pending in turn. The source is a
snapshot's frozen directory, whose rows never change, so this copy is what an eager one would
have made at clone time, whenever it runs. A child already copied through another hard link is
left as it is.

"Needed" means any read or change that would otherwise see the directory without its names:
the namespace's lookup and readdir of it (so any inode a client can name was copied by the
lookup or readdir that named it), a change in it (``ReadOnlyViews.check_writable`` with the
change's connection: a create must see the names it would collide with), rmdir of it and a
rename over it (their emptiness checks), a rename of it between quota trees and a new quota
above it (their usage counts), and the engine's whole-tree statements (a snapshot or rollback
of a tree holding it, diff). Deleting the clone's snapshot copies its pending directories
first, before any of the snapshot's rows are freed. Invariant: no pending directory lies under
a quota's root (a clone made under one is copied at once), so quota counters and fsck's
recount never meet one."""

from __future__ import annotations

from engine.catalog.changelog import SNAPSHOTS
from engine.catalog.database import Catalog, in_list, sql, sql_all, sql_one
from engine.catalog.models import DIR
from engine.datapath.accounting import chunks
from engine.datapath.sharing import add_counts

# INODE_COLUMNS: re-exported (the snapshot service copies inode rows with it too)
from engine.namespace.lazyviews import INODE_COLUMNS as INODE_COLUMNS
from engine.namespace.lazyviews import LAZY_SOURCE, VIEW_PENDING, clone_materialize
from engine.namespace.lazyviews import materialize as view_materialize

PENDING_BATCH = 64  # pending directories copied per transaction by ``materialize_batch``


class PendingDirectory(Exception):  # noqa: N818 - a signal, not an error
    """Raised inside a read transaction that met a pending directory: copy it, read again."""

    def __init__(self, dir_ino: int):
        super().__init__(dir_ino)
        self.dir_ino = dir_ino


def is_pending(conn, dir_ino: int) -> bool:
    return (
        sql_one(conn, "SELECT delta FROM clone_pending WHERE dir_ino = ?", (dir_ino,)) is not None
    )


def pending_dirs(conn) -> frozenset[int]:
    return frozenset(row[0] for row in sql_all(conn, "SELECT dir_ino FROM clone_pending"))


def copy_rows(conn, inos: list[int], delta: int) -> None:
    """Copy inodes ``inos`` (none copied yet) to ``ino + delta``: rows, symlink, xattrs and
    extents, counted in their stripes."""
    for part in chunks(inos):
        where = f"ino IN {in_list(part)}"
        sql(
            conn,
            f"INSERT INTO inodes (ino, {INODE_COLUMNS}) SELECT ino + ?, {INODE_COLUMNS} "
            f"FROM inodes WHERE {where}",
            (delta, *part),
        ).close()
        for table, columns in (("symlinks", "target"), ("xattrs", "name, value")):
            sql(
                conn,
                f"INSERT INTO {table} (ino, {columns}) SELECT ino + ?, {columns} FROM {table} "
                f"WHERE {where}",
                (delta, *part),
            ).close()
        sql(
            conn,
            "INSERT INTO extents (ino, file_offset, length, stripe_id, stripe_offset) "
            f"SELECT ino + ?, file_offset, length, stripe_id, stripe_offset FROM extents "
            f"WHERE {where}",
            (delta, *part),
        ).close()
        copied = [ino + delta for ino in part]
        add_counts(conn, f"ino IN {in_list(copied)}", tuple(copied))


def materialize(conn, dir_ino: int) -> list[int] | None:
    """Copy pending directory ``dir_ino``'s names and children from its snapshot; returns the
    child directories now pending, None if it was not pending."""
    # PostgreSQL: a second copier of the same directory waits here, then finds it copied
    lock = " FOR UPDATE" if conn.dialect.name == "postgresql" else ""
    row = sql_one(
        conn, f"SELECT delta, snapshot_id FROM clone_pending WHERE dir_ino = ?{lock}", (dir_ino,)
    )
    if row is None:
        return None
    # a published write's record says so: other processes read the pending dirs and the
    # snapshot blocks again (readonly.py), which this copy changes
    Catalog.changes(conn, topics=SNAPSHOTS)
    delta, snapshot_id = int(row[0]), int(row[1])
    if delta == VIEW_PENDING:  # a lazy snapshot's view folder (lazyviews.py)
        return view_materialize(conn, dir_ino, snapshot_id)
    if delta == LAZY_SOURCE:  # a folder of a clone of a lazy view
        return clone_materialize(conn, dir_ino, snapshot_id)
    source = dir_ino - delta
    children = {
        int(child): kind
        for child, kind in sql_all(
            conn,
            "SELECT d.child, i.type FROM dirents d JOIN inodes i ON i.ino = d.child "
            "WHERE d.parent = ?",
            (source,),
        )
    }
    there: set[int] = set()
    for part in chunks(sorted(children)):
        shifted = [c + delta for c in part]
        there |= {
            int(r[0]) - delta
            for r in sql_all(
                conn, f"SELECT ino FROM inodes WHERE ino IN {in_list(shifted)}", tuple(shifted)
            )
        }
    new = [c for c in sorted(children) if c not in there]  # another hard link copied the rest
    copy_rows(conn, new, delta)
    sql(
        conn,
        "INSERT INTO dirents (parent, name, child) SELECT ?, name, child + ? FROM dirents "
        "WHERE parent = ?",
        (dir_ino, delta, source),
    ).close()
    dirs = [child + delta for child in new if children[child] == DIR]
    for child in dirs:
        sql(
            conn,
            "INSERT INTO clone_pending (dir_ino, delta, snapshot_id) VALUES (?, ?, ?)",
            (child, delta, snapshot_id),
        ).close()
    sql(conn, "DELETE FROM clone_pending WHERE dir_ino = ?", (dir_ino,)).close()
    return dirs


def materialize_subtree(conn, top: int) -> int:
    """Copy every pending directory at or under ``top``; returns how many."""
    if sql_one(conn, "SELECT dir_ino FROM clone_pending LIMIT 1") is None:
        return 0  # the usual case: no walk
    done = 0
    todo = [top]
    while todo:
        ino = todo.pop()
        done += materialize(conn, ino) is not None
        todo += [
            int(r[0])
            for r in sql_all(
                conn,
                "SELECT d.child FROM dirents d JOIN inodes i ON i.ino = d.child "
                "WHERE d.parent = ? AND i.type = ? AND d.child NOT IN "
                "(SELECT dir_ino FROM snapshot_dirs)",
                (ino, DIR),
            )
        ]
    return done


def materialize_batch(conn, snapshot_id: int | None = None, limit: int = PENDING_BATCH) -> int:
    """Copy up to ``limit`` pending directories of clones (of ``snapshot_id``, or any; a lazy
    view's own folders wait for their first read); returns how many were copied (0: none
    left)."""
    where = "WHERE delta <> ?"
    params: tuple[int, ...] = (VIEW_PENDING,)
    if snapshot_id is not None:
        where, params = where + " AND snapshot_id = ?", (*params, snapshot_id)
    rows = sql_all(
        conn,
        f"SELECT dir_ino FROM clone_pending {where} ORDER BY dir_ino LIMIT ?",
        (*params, limit),
    )
    return sum(materialize(conn, int(r[0])) is not None for r in rows)
