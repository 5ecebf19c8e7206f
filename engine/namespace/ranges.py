"""Ranges of files over shared extents: clone, copy, seek data and holes, allocate, deallocate.

These are what NFSv4.2's CLONE, COPY, SEEK, ALLOCATE and DEALLOCATE need (RFC 7862). A clone
shares the source's stripes (the data path's ``clone_range``): it costs catalog rows per extent
and writes no data. Each call is one namespace transaction."""

from __future__ import annotations

import time

from engine.base import errors
from engine.catalog.database import sql as _sql
from engine.namespace.common import DIR, R_OK, REG, W_OK, Attr, Cred, load, require
from engine.namespace.files import FileOps
from engine.namespace.readonly import ReadOnlyViews
from engine.namespace.reads import Reads

# copy_range copies ranges shorter than this through read and write instead of sharing them:
# a small piece shared keeps a whole stripe (up to 8 MiB) alive after the source changes
COPY_SHARE_MIN = 64 << 10


class RangeOps:
    """Part of Namespace: ranges of regular files, over the data path's shared extents."""

    def __init__(self, reads: Reads, readonly: ReadOnlyViews, files: FileOps):
        self.catalog = reads.catalog
        self.reads = reads
        self.readonly = readonly
        self.files = files
        self.writes = files.writes

    def _regular(self, conn, cred: Cred | None, ino: int, want: int = 0) -> Attr:
        attr = load(conn, ino)
        if attr.type == DIR:
            raise errors.IsADirectory(f"inode {ino} is a directory")
        if attr.type != REG:
            raise errors.InvalidArgument(f"inode {ino} is not a regular file")
        if cred is not None and want:
            require(cred, attr, want)
        return attr

    @staticmethod
    def _check_range(offset: int, length: int) -> None:
        if offset < 0 or length < 0:
            raise errors.InvalidArgument(f"range at {offset} of {length} bytes: expected >= 0")

    def clone_range(
        self, cred: Cred, src_ino: int, src_off: int, dst_ino: int, dst_off: int, length: int
    ) -> Attr:
        """Make [dst_off, dst_off + length) of ``dst_ino`` share the bytes of
        [src_off, src_off + length) of ``src_ino``; ``length`` 0 means to the source's end. The
        destination grows to cover the range. Returns the destination's new attributes."""
        self._check_range(src_off, length)
        self._check_range(dst_off, 0)
        data = self.files.data_path()
        data.flush(src_ino)  # buffered bytes are part of what is cloned, and must not land later
        data.flush(dst_ino)

        def work(conn, touched):
            self.readonly.check_writable(dst_ino, conn=conn)
            src = self._regular(conn, cred, src_ino)
            require(cred, src, R_OK)
            dst = self._regular(conn, cred, dst_ino, W_OK)
            count = length or max(src.size - src_off, 0)
            if src_off + count > src.size:
                raise errors.InvalidArgument(
                    f"clone of {count} bytes at {src_off}: source inode {src_ino} has "
                    f"{src.size} bytes"
                )
            end = dst_off + count
            self.files.charge_size(conn, dst_ino, max(end - dst.size, 0))
            data.clone_range(conn, src_ino, src_off, dst_ino, dst_off, count)
            now = time.time_ns()
            _sql(
                conn,
                "UPDATE inodes SET size = CASE WHEN size < ? THEN ? ELSE size END, "
                "mtime_ns = ?, ctime_ns = ?, change = change + 1 WHERE ino = ?",
                (end, end, now, now, dst.ino),
            )
            return load(conn, dst_ino)

        return self.writes.write(work, (dst_ino,))

    def copy_range(
        self, cred: Cred, src_ino: int, src_off: int, dst_ino: int, dst_off: int, length: int
    ) -> int:
        """Copy inside the server: shared where the range is large enough to be worth a stripe
        (COPY_SHARE_MIN), read and written otherwise. Short at the source's end (like
        copy_file_range); returns the bytes copied."""
        self._check_range(src_off, length)
        self._check_range(dst_off, 0)
        size = self.reads.getattr(src_ino).size
        count = max(min(length or size, size - src_off), 0)
        if count >= COPY_SHARE_MIN:
            self.clone_range(cred, src_ino, src_off, dst_ino, dst_off, count)
            return count
        if count:
            self.readonly.check_writable(dst_ino)
            attr = self.reads.getattr(dst_ino)
            require(cred, attr, W_OK)
            self.files.write(
                dst_ino, dst_off, self.files.read(src_ino, src_off, count), stable=True
            )
        return count

    def _ranges(self, ino: int) -> tuple[Attr, list[tuple[int, int]]]:
        data = self.files.data_path()
        data.flush(ino)
        attr = self.files.file_in_use(ino)
        if attr.type != REG:
            raise errors.InvalidArgument(f"inode {ino} is not a regular file")
        return attr, self.catalog.read(lambda conn: data.data_ranges(conn, ino))

    def seek_data(self, ino: int, offset: int) -> int:
        """The first offset >= ``offset`` holding data (SEEK_DATA); ENXIO past the last data."""
        attr, ranges = self._ranges(ino)
        if offset < 0:
            raise errors.InvalidArgument(f"seek to {offset}")
        for start, end in ranges:
            if end > offset and start < attr.size:
                return max(start, offset)
        raise errors.NoSuchOffset(f"no data at or after {offset} in inode {ino}")

    def seek_hole(self, ino: int, offset: int) -> int:
        """The first offset >= ``offset`` in a hole (SEEK_HOLE); the end of the file counts as
        one. ENXIO at or past the end."""
        attr, ranges = self._ranges(ino)
        if offset < 0:
            raise errors.InvalidArgument(f"seek to {offset}")
        if offset >= attr.size:
            raise errors.NoSuchOffset(f"offset {offset} is past the end of inode {ino}")
        position = offset
        for start, end in ranges:
            if start > position:
                break
            position = max(position, end)
        return min(position, attr.size)

    def allocate(self, cred: Cred, ino: int, offset: int, length: int) -> Attr:
        """fallocate / NFS ALLOCATE: the file grows to cover the range. A log-structured layout
        writes every byte anew, so nothing can be set aside: the call fails with ENOSPC when the
        free space is short of the range's holes, and reserves nothing."""
        self._check_range(offset, length)
        self.readonly.check_writable(ino)
        attr, ranges = self._ranges(ino)
        require(cred, attr, W_OK)
        end = offset + length
        covered = sum(max(0, min(b, end) - max(a, offset)) for a, b in ranges)
        _total, free = self.files.data_path().capacity()
        if length - covered > free:
            raise errors.NoSpace(f"allocate of {length - covered} bytes: {free} bytes are free")
        if end <= attr.size:
            return attr
        return self.files.setattr(cred, ino, size=end)

    def deallocate(self, cred: Cred, ino: int, offset: int, length: int) -> Attr:
        """Punch a hole (fallocate PUNCH_HOLE, NFS DEALLOCATE): the range reads as zeros, the size
        stays, and extents that no other file, clone or snapshot references are freed."""
        self._check_range(offset, length)
        data = self.files.data_path()
        data.flush(ino)

        def work(conn, touched):
            self.readonly.check_writable(ino, conn=conn)
            attr = self._regular(conn, cred, ino, W_OK)
            end = min(offset + length, attr.size)
            if end > offset:
                data.punch(conn, ino, offset, end - offset)
                now = time.time_ns()
                _sql(
                    conn,
                    "UPDATE inodes SET mtime_ns = ?, ctime_ns = ?, change = change + 1 "
                    "WHERE ino = ?",
                    (now, now, ino),
                )
            return load(conn, ino)

        return self.writes.write(work, (ino,))
