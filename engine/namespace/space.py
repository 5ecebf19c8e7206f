"""Space used: the bytes a file's data takes (NFS space_used, st_blocks), counted from its data
ranges and remembered per version of the file."""

from __future__ import annotations

from engine.catalog.database import Catalog
from engine.namespace.common import REG, Attr, FileData

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


class SpaceUsed:
    """Part of Namespace: ``space_used`` and what it remembers."""

    def __init__(self, catalog: Catalog, data: FileData | None):
        self.catalog = catalog
        self.data = data
        # ino -> ((generation, change, size), bytes used); replaced whole or cleared, no lock
        self._remembered: dict[int, tuple[tuple[int, int, int], int]] = {}

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
        remembered = self._remembered.get(attr.ino)
        if remembered is not None and remembered[0] == key:
            return remembered[1]
        ranges = self.catalog.read(lambda conn: data.data_ranges(conn, attr.ino))
        used = _used_within(attr.size, ranges)
        self.remember(attr, used)
        return used

    def remember(self, attr: Attr, used: int) -> None:
        if len(self._remembered) >= SPACE_USED_CACHE:
            self._remembered.clear()
        self._remembered[attr.ino] = ((attr.generation, attr.change, attr.size), used)

    def at_commit(self, conn, attrs) -> dict[int, int]:
        """Inside a data-path commit (Namespace._fresh_attrs): the space used of the changed
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
