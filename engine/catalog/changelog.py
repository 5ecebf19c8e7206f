"""Change records: what each commit changed of what the namespace's cache holds, so that the
caches of other processes on the same catalog (the heads of `serve --heads N`, docs/heads.md)
evict those entries instead of emptying themselves at every commit they did not make.

A record is a ``Change``: the inodes whose attributes, extended attributes or extents the
commit changed, the (directory, name) entries it changed, and ``topics``: which other cached
tables it wrote (quota rows, snapshot views, delegations), for the caches that keep those
(quotas.py, readonly.py, head_delegations.py). Only a write run with
``Catalog.run(published=True)`` has one (the namespace's writes, the data path's commits, and
commits of tables the namespace does not cache at all, which publish an empty one); any other
commit is unknown, and a cache that finds one between its epoch and now empties itself.

SQLite: a ring of slots in a file beside the catalog (``<catalog>-changes-shm``), mapped by
every process, one slot per commit number (the WAL index's change counter, CommitEpoch). The
writer fills slot N while it holds the write lock, before its COMMIT: once any process sees
the counter at N, record N is there. So a record is never late: what the epoch makes exact
(docs/heads.md) the record keeps exact. A slot that names another number, or another -shm
file, or that a writer is filling, or whose commit failed, reads as unknown; so does a commit
by a connection that is not a Catalog's (the sqlite3 shell), which fills no slot.

PostgreSQL: the record travels as a notification of its own transaction (engine/catalog/
changes.py pairs it with the writer's table notification)."""

from __future__ import annotations

import logging
import mmap
import os
import struct
from typing import NamedTuple

log = logging.getLogger("shingle.catalog")

RING_SUFFIX = "-changes-shm"  # the -shm suffix: tools that skip SQLite's files skip it too
RING_MAGIC = b"SHGCHG02"  # 02: records carry topics
RING_SLOTS = 2048  # a reader more commits behind than this empties its cache
SLOT_BYTES = 512
RING_HEADER = 64
RING_BYTES = RING_HEADER + RING_SLOTS * SLOT_BYTES
# seq (odd while a writer fills the slot), commit number, -shm inode (low 32 bits), kind, length
SLOT = struct.Struct("=IIIHH")
KIND_UNKNOWN = 0
KIND_RECORD = 1
PAYLOAD_MAX = SLOT_BYTES - SLOT.size
COUNTS = struct.Struct("=HHI")  # inodes, names, topics
INO = struct.Struct("=Q")
NAME = struct.Struct("=QH")
LAST = struct.Struct("=I")
READ_TRIES = 3


# topics: tables a published write changed that caches other than the namespace's keep; a
# writer that changes one says so (``Catalog.changes(conn, topics=...)``)
QUOTAS = 1  # a quotas row (counters, limits): QuotaTracker's rows and "any quota exists"
SNAPSHOTS = 2  # snapshot blocks, .snapshots dirs, clones' pending dirs: ReadOnlyViews
DELEGATIONS = 4  # a delegation granted (a settings row of one): HeadDelegations' clear marks


class Change(NamedTuple):
    """What one commit changed of what caches hold: attributes (and extended attributes, and
    extents) of ``inos``, the entries ``names`` ((directory inode, name) pairs), and the
    ``topics`` bits above."""

    inos: tuple[int, ...] = ()
    names: tuple[tuple[int, str], ...] = ()
    topics: int = 0


NOTHING = Change()


def encode(change: Change) -> bytes | None:
    """A slot's payload, or None when it does not fit (the slot then says unknown)."""
    parts = [COUNTS.pack(len(change.inos), len(change.names), change.topics)]
    parts += [INO.pack(ino) for ino in change.inos]
    for parent, name in change.names:
        raw = name.encode("utf-8", "surrogateescape")
        parts.append(NAME.pack(parent, len(raw)))
        parts.append(raw)
    payload = b"".join(parts)
    return payload if len(payload) <= PAYLOAD_MAX else None


def decode(payload: bytes) -> Change:
    n_inos, n_names, topics = COUNTS.unpack_from(payload, 0)
    at = COUNTS.size
    inos = tuple(INO.unpack_from(payload, at + i * INO.size)[0] for i in range(n_inos))
    at += n_inos * INO.size
    names = []
    for _ in range(n_names):
        parent, length = NAME.unpack_from(payload, at)
        at += NAME.size
        names.append((parent, payload[at : at + length].decode("utf-8", "surrogateescape")))
        at += length
    return Change(inos, tuple(names), topics)


class ChangeRing:
    """The SQLite ring (module docstring). ``write`` only while holding the catalog's write
    lock; ``read`` any time."""

    def __init__(self, path: str, shm_inode: int, counter: int):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < RING_BYTES:
                os.ftruncate(fd, RING_BYTES)  # zeros: every slot unknown
            self.map = mmap.mmap(fd, RING_BYTES)
        finally:
            os.close(fd)  # the map keeps the file; no lock of SQLite's is on this one
        if self.map[: len(RING_MAGIC)] != RING_MAGIC:  # new, or another layout's: all unknown
            self.map[:] = bytes(RING_BYTES)
            self.map[: len(RING_MAGIC)] = RING_MAGIC
        self.shm = shm_inode & 0xFFFFFFFF
        # the last number written; a counter behind it is a WAL index built anew (every
        # connection had closed) counting from 0 again: the old records could name its commits
        last = LAST.unpack_from(self.map, len(RING_MAGIC))[0]
        if (counter - last) & 0xFFFFFFFF > 0x7FFFFFFF:
            self.map[RING_HEADER:] = bytes(RING_BYTES - RING_HEADER)
            LAST.pack_into(self.map, len(RING_MAGIC), counter)

    @staticmethod
    def open_beside(database: str, shm_inode: int, counter: int) -> ChangeRing | None:
        """The ring of the catalog ``database`` (made with the database file's mode), or None
        when it cannot be (then every other process's commit empties the caches, as before)."""
        path = database + RING_SUFFIX
        try:
            ring = ChangeRing(path, shm_inode, counter)
            mode = os.stat(database).st_mode & 0o666
            if os.stat(path).st_mode & 0o777 != mode:
                os.chmod(path, mode)  # it names files: no wider than the catalog itself
            return ring
        except (OSError, ValueError) as exc:
            log.debug("catalog: no change ring (%s); other processes' commits empty caches", exc)
            return None

    def write(self, number: int, change: Change | None) -> None:
        """Fill the slot of commit ``number`` with ``change`` (None: unknown)."""
        at = RING_HEADER + (number % RING_SLOTS) * SLOT_BYTES
        m = self.map
        seq = SLOT.unpack_from(m, at)[0]
        payload = encode(change) if change is not None else None
        # odd first (a reader that overlaps it retries), the fields, then even again
        SLOT.pack_into(m, at, (seq + 1) & 0xFFFFFFFF, 0, 0, KIND_UNKNOWN, 0)
        if payload is None:
            SLOT.pack_into(m, at, (seq + 2) & 0xFFFFFFFF, number, self.shm, KIND_UNKNOWN, 0)
            LAST.pack_into(m, len(RING_MAGIC), number)
            return
        m[at + SLOT.size : at + SLOT.size + len(payload)] = payload
        SLOT.pack_into(m, at, (seq + 1) & 0xFFFFFFFF, number, self.shm, KIND_RECORD, len(payload))
        struct.pack_into("=I", m, at, (seq + 2) & 0xFFFFFFFF)
        LAST.pack_into(m, len(RING_MAGIC), number)

    def forget(self, number: int) -> None:
        """Commit ``number`` did not happen after all (its COMMIT failed): its slot says unknown.
        Only the kind is written, so a record another process fills meanwhile is either whole
        or unknown."""
        at = RING_HEADER + (number % RING_SLOTS) * SLOT_BYTES
        if SLOT.unpack_from(self.map, at)[1] == number:
            struct.pack_into("=H", self.map, at + 12, KIND_UNKNOWN)

    def read(self, number: int) -> Change | None:
        """The record of commit ``number``, or None when it is unknown."""
        at = RING_HEADER + (number % RING_SLOTS) * SLOT_BYTES
        m = self.map
        for _ in range(READ_TRIES):
            seq, found, shm, kind, length = SLOT.unpack_from(m, at)
            if seq & 1:
                continue  # a writer is filling it (a commit that is not visible yet)
            if found != number or shm != self.shm or kind != KIND_RECORD:
                return None
            payload = m[at + SLOT.size : at + SLOT.size + length]
            again = SLOT.unpack_from(m, at)
            if again[0] != seq or again[4] != length or again[3] != kind:
                continue
            return decode(payload)
        return None

    def close(self) -> None:
        self.map.close()
