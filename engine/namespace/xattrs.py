"""Extended attributes of inodes."""

from __future__ import annotations

import time

from engine.base import errors
from engine.catalog.database import sql as _sql
from engine.catalog.database import sql_all as _sql_all
from engine.catalog.database import sql_one as _sql_one
from engine.namespace.cache import NameCache
from engine.namespace.common import (
    R_OK,
    W_OK,
    XATTR_NAME_MAX,
    XATTR_VALUE_MAX,
    XATTRS,
    Cred,
    load,
    require,
    touch,
)
from engine.namespace.readonly import ReadOnlyViews
from engine.namespace.transactions import Transactions

XATTR_CACHE_BYTES = 4096  # larger maps (streams, big values) are read each time


class Xattrs:
    """Part of Namespace: getxattr, listxattr, setxattr, removexattr."""

    def __init__(self, cache: NameCache, readonly: ReadOnlyViews, writes: Transactions):
        self.catalog = writes.catalog
        self.cache = cache
        self.readonly = readonly
        self.writes = writes

    def _xattr_map(self, cred: Cred, ino: int) -> dict[str, bytes]:
        """Every extended attribute of ``ino`` after a read-permission check, through the cache:
        Samba asks for several (DOS attributes, streams) of every entry it lists, and most files
        have none. Small maps are cached like attributes and evicted by the same changes."""
        cache = self.cache
        cacheable = cache.valid()
        gen, read_at = cache.gen, time.monotonic()
        if cacheable:
            hit = cache.cached(cache.xattrs, ino)
            attr = cache.cached(cache.attrs, ino)
            if hit is not None and attr is not None:
                require(cred, attr, R_OK)
                return hit

        def work(conn):
            attr = load(conn, ino)
            require(cred, attr, R_OK)
            rows = _sql(conn, "SELECT name, value FROM xattrs WHERE ino = ?", (ino,))
            return attr, {name: bytes(value) for name, value in rows}

        attr, found = self.catalog.read(work)
        if cacheable and sum(len(v) for v in found.values()) <= XATTR_CACHE_BYTES:
            cache.remember_xattrs(gen, read_at, attr, found)
        return found

    def getxattr(self, cred: Cred, ino: int, name: str) -> bytes:
        value = self._xattr_map(cred, ino).get(name)
        if value is None:
            raise errors.NoData(f"no extended attribute {name!r} on inode {ino}")
        return value

    def listxattr(self, cred: Cred, ino: int) -> list[str]:
        return sorted(self._xattr_map(cred, ino))

    def setxattr(
        self,
        cred: Cred,
        ino: int,
        name: str,
        value: bytes,
        *,
        create: bool = False,
        replace_only: bool = False,
    ) -> None:
        if not name or len(name.encode()) > XATTR_NAME_MAX:
            raise errors.InvalidArgument(
                f"extended attribute name {name!r}: expected 1-{XATTR_NAME_MAX} bytes"
            )
        if len(value) > XATTR_VALUE_MAX:
            raise errors.InvalidArgument(
                f"extended attribute value of {len(value)} bytes exceeds {XATTR_VALUE_MAX}"
            )

        def work(conn, touched):
            self.readonly.check_writable(ino, conn=conn)
            require(cred, load(conn, ino), W_OK)
            exists = _sql_one(conn, "SELECT 1 FROM xattrs WHERE ino = ? AND name = ?", (ino, name))
            if exists and create:
                raise errors.Exists(f"extended attribute {name!r} exists")
            if not exists and replace_only:
                raise errors.NoData(f"no extended attribute {name!r} on inode {ino}")
            if exists:
                _sql(
                    conn,
                    "UPDATE xattrs SET value = ? WHERE ino = ? AND name = ?",
                    (value, ino, name),
                )
            else:
                _sql(
                    conn,
                    "INSERT INTO xattrs (ino, name, value) VALUES (?, ?, ?)",
                    (ino, name, value),
                )
            now = touch(conn, ino, ctime=True, returning=True)
            if now is not None:  # Samba reads the attribute back at once: cache what is now
                touched.known[ino] = now
                rows = _sql_all(conn, "SELECT name, value FROM xattrs WHERE ino = ?", (ino,))
                found = {key: bytes(val) for key, val in rows}
                if sum(len(v) for v in found.values()) <= XATTR_CACHE_BYTES:
                    touched.xattrs[ino] = found

        self.writes.write(work, (ino,))

    def removexattr(self, cred: Cred, ino: int, name: str) -> None:
        def work(conn, touched):
            self.readonly.check_writable(ino, conn=conn)
            require(cred, load(conn, ino), W_OK)
            removed = conn.execute(
                XATTRS.delete().where(XATTRS.c.ino == ino, XATTRS.c.name == name)
            )
            if not removed.rowcount:
                raise errors.NoData(f"no extended attribute {name!r} on inode {ino}")
            touch(conn, ino, ctime=True)

        self.writes.write(work, (ino,))
