"""Open references: a file unlinked while some caller of this Namespace holds it open keeps its
inode and data until the last reference goes (FileOps.close_ref frees it then; an inode left
with no name by a crash is freed at the next start, FileOps.reclaim_orphans)."""

from __future__ import annotations

from engine.base.ordered_lock import lock


class OpenRefs:
    """Part of Namespace: how many references each open inode has."""

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.lock = lock("namespace.open_refs")

    def open_ref(self, ino: int) -> None:
        with self.lock:
            self.counts[ino] = self.counts.get(ino, 0) + 1

    def is_open(self, ino: int) -> bool:
        """Whether some caller of this Namespace holds ``ino`` open (retention skips it)."""
        with self.lock:
            return self.counts.get(ino, 0) > 0

    def others_hold(self, ino: int) -> bool:
        """Whether a reference besides the caller's stays after one is released."""
        with self.lock:
            return self.counts.get(ino, 0) > 1

    def release(self, ino: int) -> bool:
        """Drop one reference; whether it was the last."""
        with self.lock:
            left = self.counts.get(ino, 0) - 1
            if left > 0:
                self.counts[ino] = left
                return False
            self.counts.pop(ino, None)
            return True
