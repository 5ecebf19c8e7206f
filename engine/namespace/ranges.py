"""Ranges of files over shared extents: clone, copy, seek data and holes, allocate, deallocate.

These are what NFSv4.2's CLONE, COPY, SEEK, ALLOCATE and DEALLOCATE need (RFC 7862). A clone
shares the source's stripes (the data path's ``clone_range``): it costs catalog rows per extent
and writes no data. Each call is one namespace transaction."""

from __future__ import annotations

import time

from engine import errors
from engine.catalog.database import sql as _sql
from engine.namespace.common import DIR, R_OK, REG, W_OK, Attr, Cred
from engine.namespace.files import FileOps

# copy_range copies ranges shorter than this through read and write instead of sharing them:
# a small piece shared keeps a whole stripe (up to 8 MiB) alive after the source changes
COPY_SHARE_MIN = 64 << 10
# files whose space used (st_blocks) is remembered, keyed by their change counter and size
SPACE_USED_CACHE = 16384
# a data-path commit counts the space used of the small files it changed (at most this size and
# this many extents), so the GETATTR after a COMMIT reads no catalog; the others count on
# demand, and a growing checkpoint does not pay an extent query in every COMMIT
SPACE_USED_AT_COMMIT_BYTES = 4 << 20
SPACE_USED_AT_COMMIT_EXTENTS = 64
BLOCK = 4096  # the unit space used is counted in


def _blocks(length: int) -> int:
    return (length + BLOCK - 1) // BLOCK * BLOCK


def _used_within(size: int, ranges) -> int:
    """The 4 KiB blocks of data ``ranges`` (sorted, merged) within a file of ``size`` bytes."""
    return sum(_blocks(min(end, size) - start) for start, end in ranges if start < size)


class RangeOps(FileOps):
    """Part of Namespace: ranges of regular files, over the data path's shared extents."""

    def _regular(self, conn, cred: Cred | None, ino: int, want: int = 0) -> Attr:
        attr = self._load(conn, ino)
        if attr.type == DIR:
            raise errors.IsADirectory(f"inode {ino} is a directory")
        if attr.type != REG:
            raise errors.InvalidArgument(f"inode {ino} is not a regular file")
        if cred is not None and want:
            self._require(cred, attr, want)
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
        data = self._data()
        data.flush(src_ino)  # buffered bytes are part of what is cloned, and must not land later
        data.flush(dst_ino)

        def work(conn, touched):
            self._check_writable(dst_ino, conn=conn)
            src = self._regular(conn, cred, src_ino)
            self._require(cred, src, R_OK)
            dst = self._regular(conn, cred, dst_ino, W_OK)
            count = length or max(src.size - src_off, 0)
            if src_off + count > src.size:
                raise errors.InvalidArgument(
                    f"clone of {count} bytes at {src_off}: source inode {src_ino} has "
                    f"{src.size} bytes"
                )
            end = dst_off + count
            self._charge_size(conn, dst_ino, max(end - dst.size, 0))
            data.clone_range(conn, src_ino, src_off, dst_ino, dst_off, count)
            now = time.time_ns()
            _sql(
                conn,
                "UPDATE inodes SET size = CASE WHEN size < ? THEN ? ELSE size END, "
                "mtime_ns = ?, ctime_ns = ?, change = change + 1 WHERE ino = ?",
                (end, end, now, now, dst.ino),
            )
            return self._load(conn, dst_ino)

        return self._write(work, (dst_ino,))

    def copy_range(
        self, cred: Cred, src_ino: int, src_off: int, dst_ino: int, dst_off: int, length: int
    ) -> int:
        """Copy inside the server: shared where the range is large enough to be worth a stripe
        (COPY_SHARE_MIN), read and written otherwise. Short at the source's end (like
        copy_file_range); returns the bytes copied."""
        self._check_range(src_off, length)
        self._check_range(dst_off, 0)
        size = self.getattr(src_ino).size
        count = max(min(length or size, size - src_off), 0)
        if count >= COPY_SHARE_MIN:
            self.clone_range(cred, src_ino, src_off, dst_ino, dst_off, count)
            return count
        if count:
            self._check_writable(dst_ino)
            attr = self.getattr(dst_ino)
            self._require(cred, attr, W_OK)
            self.write(dst_ino, dst_off, self.read(src_ino, src_off, count), stable=True)
        return count

    def _ranges(self, ino: int) -> tuple[Attr, list[tuple[int, int]]]:
        data = self._data()
        data.flush(ino)
        attr = self._file_in_use(ino)
        if attr.type != REG:
            raise errors.InvalidArgument(f"inode {ino} is not a regular file")
        return attr, self.catalog.read(lambda conn: data.data_ranges(conn, ino))

    def space_used(self, attr: Attr) -> int:
        """Bytes a file's data takes (NFS space_used, st_blocks): for a regular file its data
        ranges within its size, so holes (sparse writes, punched ranges, fallocate, which reserves
        nothing) take none; while it has bytes not yet flushed, its size. In 4 KiB units.
        Remembered per (inode, generation, change, size): one catalog read per version of a
        file."""
        data = self.data
        nothing_to_count = attr.type != REG or attr.size == 0
        if nothing_to_count or data is None or data.pending_size(attr.ino) is not None:
            return _blocks(attr.size)
        key = (attr.generation, attr.change, attr.size)
        remembered = self._space_used.get(attr.ino)
        if remembered is not None and remembered[0] == key:
            return remembered[1]
        ranges = self.catalog.read(lambda conn: data.data_ranges(conn, attr.ino))
        used = _used_within(attr.size, ranges)
        self._remember_space_used(attr, used)
        return used

    def _remember_space_used(self, attr: Attr, used: int) -> None:
        if len(self._space_used) >= SPACE_USED_CACHE:
            self._space_used.clear()
        self._space_used[attr.ino] = ((attr.generation, attr.change, attr.size), used)

    def _space_used_at_commit(self, conn, attrs) -> dict[int, int]:
        """Inside a data-path commit (AttrCache._fresh_attrs): the space used of the changed
        files with few extents, read in the commit's own transaction."""
        data = self.data
        used: dict[int, int] = {}
        if data is None:
            return used
        for a in attrs:
            if a.type == REG and 0 < a.size <= SPACE_USED_AT_COMMIT_BYTES:
                ranges = data.few_data_ranges(conn, a.ino, SPACE_USED_AT_COMMIT_EXTENTS)
                if ranges is not None:
                    used[a.ino] = _used_within(a.size, ranges)
        return used

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
        self._check_writable(ino)
        attr, ranges = self._ranges(ino)
        self._require(cred, attr, W_OK)
        end = offset + length
        covered = sum(max(0, min(b, end) - max(a, offset)) for a, b in ranges)
        _total, free = self._data().capacity()
        if length - covered > free:
            raise errors.NoSpace(f"allocate of {length - covered} bytes: {free} bytes are free")
        if end <= attr.size:
            return attr
        return self.setattr(cred, ino, size=end)

    def deallocate(self, cred: Cred, ino: int, offset: int, length: int) -> Attr:
        """Punch a hole (fallocate PUNCH_HOLE, NFS DEALLOCATE): the range reads as zeros, the size
        stays, and extents that no other file, clone or snapshot references are freed."""
        self._check_range(offset, length)
        data = self._data()
        data.flush(ino)

        def work(conn, touched):
            self._check_writable(ino, conn=conn)
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
            return self._load(conn, ino)

        return self._write(work, (ino,))
