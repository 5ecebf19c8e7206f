"""Quotas as an admin service: set, change, remove, list and recount the limits of directory
trees, through a Namespace (which resolves paths and shares its tracker).

The counters and the checks on every write live below the namespace, in engine/namespace/quotas.py;
this module sits above it (it resolves paths under an export's name), so the two are apart.
"""

from __future__ import annotations

import builtins
import time
from dataclasses import asdict, dataclass

from engine.admin.events import record_in
from engine.admin.exports import list_exports
from engine.base import errors
from engine.catalog.database import Catalog, sql, sql_all, sql_one
from engine.catalog.models import DIR
from engine.namespace.lazyclones import materialize_subtree
from engine.namespace.quotas import usage_below


@dataclass(frozen=True)
class QuotaInfo:
    id: int
    path: str
    root_ino: int
    bytes_limit: int | None
    files_limit: int | None
    soft_bytes: int | None
    soft_files: int | None
    used_bytes: int
    used_files: int

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Mismatch:
    """A counter that differs from a recount."""

    id: int
    path: str
    counted_bytes: int
    counted_files: int
    recorded_bytes: int
    recorded_files: int

    def __str__(self) -> str:
        return (
            f"quota {self.id} ({self.path}): counters say {self.recorded_bytes} bytes, "
            f"{self.recorded_files} files; the tree holds {self.counted_bytes} bytes, "
            f"{self.counted_files} files"
        )


def _limit(name: str, value: int | None) -> int | None:
    """0 or None: no limit."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise errors.InvalidArgument(f"quota {name} = {value!r}: expected an integer >= 0")
    return value or None


class QuotaService:
    """Quotas through a Namespace (which resolves paths and shares its tracker)."""

    FIELDS = ("bytes_limit", "files_limit", "soft_bytes", "soft_files")

    def __init__(self, namespace):
        self.ns = namespace
        self.catalog: Catalog = namespace.catalog

    def _resolve(self, path: str):
        """A namespace path, or a path under an export's name (``/export/team`` with the default
        export, whose directory is the namespace's root)."""
        try:
            return self.ns.resolve(path)
        except errors.NotFound:
            for export in sorted(list_exports(self.catalog), key=lambda e: -len(e.name)):
                name = export.name.rstrip("/")
                if path == name or path.startswith(name + "/"):
                    rest = path[len(name) :].strip("/")
                    return self.ns.resolve(export.path.rstrip("/") + "/" + rest)
            raise

    def _dir(self, path: str) -> int:
        attr = self._resolve(path)
        if attr.type != DIR:
            raise errors.NotADirectory(f"{path}: a quota applies to a directory")
        if self.ns.is_read_only(attr.ino):
            raise errors.ReadOnly(f"{path} is inside a snapshot")
        return attr.ino

    def _run(self, work):
        try:
            # not tracked: every process reads the quotas again
            return self.catalog.run(work)
        finally:
            self.ns.quotas.forget()

    def set(self, path: str, *, actor: str = "cli", **limits: int | None) -> QuotaInfo:
        """Create the quota of directory ``path`` (counting its tree once) or change the limits
        given (None leaves one as it is, 0 removes it). A limit below what is used already is
        allowed: the tree then only shrinks."""
        unknown = set(limits) - set(self.FIELDS)
        if unknown:
            raise errors.InvalidArgument(f"unknown quota fields {sorted(unknown)}")
        # None: leave that limit as it is
        values = {k: _limit(k, v) for k, v in limits.items() if v is not None}
        ino = self._dir(path)

        def work(conn):
            row = sql_one(conn, "SELECT id FROM quotas WHERE root_ino = ?", (ino,))
            if row is None:
                materialize_subtree(conn, ino)  # no clone's directory stays pending under it
                used_bytes, used_files = usage_below(conn, ino)
                full = {k: values.get(k) for k in self.FIELDS}
                sql(
                    conn,
                    "INSERT INTO quotas (root_ino, path, bytes_limit, files_limit, soft_bytes, "
                    "soft_files, used_bytes, used_files, created_ns) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (ino, path, *full.values(), used_bytes, used_files, time.time_ns()),
                ).close()
            elif values:
                columns = ", ".join(f"{k} = ?" for k in values)
                sql(
                    conn,
                    f"UPDATE quotas SET {columns} WHERE id = ?",
                    (*values.values(), row[0]),
                ).close()
            record_in(conn, "quota.set", f"quota on {path} set: {values}", actor=actor)

        self._run(work)
        return self.get(path)

    def remove(self, path: str, *, actor: str = "cli") -> None:
        ino = self._resolve(path).ino

        def work(conn):
            row = sql_one(conn, "SELECT id FROM quotas WHERE root_ino = ?", (ino,))
            if row is None:
                raise errors.NotFound(f"no quota on {path}")
            sql(conn, "DELETE FROM quotas WHERE id = ?", (row[0],)).close()
            record_in(conn, "quota.remove", f"quota on {path} removed", actor=actor)

        self._run(work)

    def _rows(self, conn, where: str = "", params: tuple = ()):
        return sql_all(
            conn,
            "SELECT id, root_ino, bytes_limit, files_limit, soft_bytes, soft_files, used_bytes, "
            f"used_files, path FROM quotas {where} ORDER BY id",
            params,
        )

    def _path(self, root: int, given: str | None = None) -> str:
        """The path the quota was set with while it still names its directory (it may be an
        export's), else the directory's namespace path now (it was renamed)."""
        if given is not None:
            try:
                if self._resolve(given).ino == root:
                    return given
            except errors.FsError:
                pass
        try:
            return self.ns.path_of(root)
        except errors.FsError:
            return f"(inode {root})"

    def _info(self, row) -> QuotaInfo:
        qid, root, *rest, given = row
        return QuotaInfo(qid, self._path(root, given), root, *rest)

    def list(self) -> list[QuotaInfo]:
        return [self._info(row) for row in self.catalog.read(self._rows)]

    def get(self, path: str) -> QuotaInfo:
        ino = self._resolve(path).ino
        rows = self.catalog.read(lambda conn: self._rows(conn, "WHERE root_ino = ?", (ino,)))
        if not rows:
            raise errors.NotFound(f"no quota on {path}")
        return self._info(rows[0])

    def get_by_id(self, quota_id: int) -> QuotaInfo:
        rows = self.catalog.read(lambda conn: self._rows(conn, "WHERE id = ?", (quota_id,)))
        if not rows:
            raise errors.NotFound(f"no quota {quota_id}")
        return self._info(rows[0])

    def recount(self, *, fix: bool = True) -> builtins.list[Mismatch]:
        """Count every quota's tree again in one transaction; with ``fix`` the counters take
        the counted values. Returns the counters that were wrong."""

        def work(conn):
            found = []
            for qid, root, *_limits, used_bytes, used_files, given in self._rows(conn):
                counted_bytes, counted_files = usage_below(conn, root)
                if (counted_bytes, counted_files) != (used_bytes, used_files):
                    found.append(
                        (qid, root, given, counted_bytes, counted_files, used_bytes, used_files)
                    )
                    if fix:
                        sql(
                            conn,
                            "UPDATE quotas SET used_bytes = ?, used_files = ? WHERE id = ?",
                            (counted_bytes, counted_files, qid),
                        ).close()
            if fix and found:
                record_in(conn, "quota.recount", f"{len(found)} quota counters corrected")
            return found

        rows = self._run(work) if fix else self.catalog.read(work)
        return [Mismatch(qid, self._path(root, given), *n) for qid, root, given, *n in rows]
