"""Extended attributes of inodes."""
from __future__ import annotations

from sqlalchemy import select

from engine import errors
from engine.namespace.common import R_OK, W_OK, XATTR_NAME_MAX, XATTR_VALUE_MAX, XATTRS, Cred


class Xattrs:
    """Part of Namespace: getxattr, listxattr, setxattr, removexattr."""

    # -- extended attributes ------------------------------------------------------
    def getxattr(self, cred: Cred, ino: int, name: str) -> bytes:
        def work(conn):
            self._require(cred, self._load(conn, ino), R_OK)
            value = conn.execute(select(XATTRS.c.value)
                                 .where(XATTRS.c.ino == ino, XATTRS.c.name == name)).scalar()
            if value is None:
                raise errors.NoData(f"no extended attribute {name!r} on inode {ino}")
            return value
        return self.catalog.read(work)

    def listxattr(self, cred: Cred, ino: int) -> list[str]:
        def work(conn):
            self._require(cred, self._load(conn, ino), R_OK)
            return list(conn.execute(select(XATTRS.c.name).where(XATTRS.c.ino == ino)
                                     .order_by(XATTRS.c.name)).scalars())
        return self.catalog.read(work)

    def setxattr(self, cred: Cred, ino: int, name: str, value: bytes, *, create: bool = False,
                 replace_only: bool = False) -> None:
        if not name or len(name.encode()) > XATTR_NAME_MAX:
            raise errors.InvalidArgument(f"extended attribute name {name!r}: expected "
                                         f"1-{XATTR_NAME_MAX} bytes")
        if len(value) > XATTR_VALUE_MAX:
            raise errors.InvalidArgument(f"extended attribute value of {len(value)} bytes exceeds "
                                         f"{XATTR_VALUE_MAX}")

        def work(conn, touched):
            self._check_writable(ino, conn=conn)
            attr = self._load(conn, ino)
            self._require(cred, attr, W_OK)
            exists = conn.execute(select(XATTRS.c.name)
                                  .where(XATTRS.c.ino == ino, XATTRS.c.name == name)).first()
            if exists and create:
                raise errors.Exists(f"extended attribute {name!r} exists")
            if not exists and replace_only:
                raise errors.NoData(f"no extended attribute {name!r} on inode {ino}")
            if exists:
                conn.execute(XATTRS.update().where(XATTRS.c.ino == ino, XATTRS.c.name == name)
                             .values(value=value))
            else:
                conn.execute(XATTRS.insert().values(ino=ino, name=name, value=value))
            self._touch(conn, ino, ctime=True)
        self._write(work, (ino,))

    def removexattr(self, cred: Cred, ino: int, name: str) -> None:
        def work(conn, touched):
            self._check_writable(ino, conn=conn)
            self._require(cred, self._load(conn, ino), W_OK)
            removed = conn.execute(XATTRS.delete()
                                   .where(XATTRS.c.ino == ino, XATTRS.c.name == name))
            if not removed.rowcount:
                raise errors.NoData(f"no extended attribute {name!r} on inode {ino}")
            self._touch(conn, ino, ctime=True)
        self._write(work, (ino,))
