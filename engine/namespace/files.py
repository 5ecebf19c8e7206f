"""setattr (chmod, chown, truncate, utimes), file data (read, write, commit), the last close."""

from __future__ import annotations

import logging
import threading
import time

from sqlalchemy import and_, select

from engine.base import errors
from engine.base.blocking import WouldBlock, blocking_forbidden, may_block
from engine.catalog.database import sql as _sql
from engine.namespace import quotas
from engine.namespace.common import (
    DIR,
    INODES,
    REG,
    S_ISGID,
    S_ISUID,
    SET_TO_NOW,
    W_OK,
    Attr,
    ChangeListeners,
    Cred,
    FileData,
    load,
    may,
)
from engine.namespace.openrefs import OpenRefs
from engine.namespace.quotas import QuotaTracker
from engine.namespace.readonly import ReadOnlyViews
from engine.namespace.reads import Reads
from engine.namespace.transactions import Transactions

log = logging.getLogger("shingle.namespace")


class FileOps:
    """Part of Namespace: attribute changes, data through the data path, the last close."""

    def __init__(
        self,
        reads: Reads,
        readonly: ReadOnlyViews,
        writes: Transactions,
        quotas: QuotaTracker,
        open_refs: OpenRefs,
        listeners: ChangeListeners,
    ):
        self.catalog = writes.catalog
        self.data = writes.data
        self.cache = writes.cache
        self.reads = reads
        self.readonly = readonly
        self.writes = writes
        self.quotas = quotas
        self.open_refs = open_refs
        self.listeners = listeners
        self.root_ino = reads.root_ino

    def setattr(
        self,
        cred: Cred,
        ino: int,
        *,
        mode: int | None = None,
        uid: int | None = None,
        gid: int | None = None,
        size: int | None = None,
        atime_ns=None,
        mtime_ns=None,
    ) -> Attr:
        """chmod/chown/truncate/utimes. Times are ns, or SET_TO_NOW.

        A call that would change nothing (the same mode, owner or size, no times) is checked and
        answered from the cache without a write: like ext4's truncate to the same size, it then
        leaves ctime alone. Clients send such calls on every create (mode right after OPEN,
        size 0 on a new file), and each write transaction costs more than the rest of the call."""
        if size is not None and size < 0:
            raise errors.InvalidArgument(f"size {size}: expected >= 0")
        if mode is not None and not 0 <= mode <= 0o7777:
            raise errors.InvalidArgument(f"mode {mode:o}: expected 0-7777 (octal)")
        # the NFS event loop's attempt (no_blocking) answers only a call that changes nothing,
        # and never flushes: a file with buffered writes waits for a worker
        on_loop = blocking_forbidden()
        if self.data is not None and size is not None:
            if not on_loop:
                self.data.flush(ino)  # buffered writes land before the cut
            elif self.data.pending_size(ino) is not None:
                may_block("buffered writes before a truncate")
        wanted = dict(mode=mode, uid=uid, gid=gid, size=size, atime_ns=atime_ns, mtime_ns=mtime_ns)
        cache = self.cache
        if atime_ns is None and mtime_ns is None and cache.valid():
            cached = cache.cached(cache.attrs, ino)
            if cached is not None and not self._setattr_values(cred, cached, now=0, **wanted):
                self.readonly.check_writable(ino)
                return self.reads.with_pending(cached)
        if on_loop:
            may_block("a setattr that changes the inode")

        def work(conn, touched):
            self.readonly.check_writable(ino, conn=conn)
            attr = load(conn, ino)
            now = time.time_ns()
            values = self._setattr_values(cred, attr, now=now, **wanted)
            if "size" in values:
                self.charge_size(conn, ino, values["size"] - attr.size)
            if "size" in values and self.data is not None:
                self.data.truncate(conn, ino, attr.size, values["size"])
            if "mtime_ns" in values and self.data is not None:
                self.data.times_set(ino)  # buffered writes' commit keeps this mtime
            values["ctime_ns"] = now
            columns = ", ".join(f"{key} = ?" for key in values)
            _sql(
                conn,
                f"UPDATE inodes SET {columns}, change = change + 1 WHERE ino = ?",
                (*values.values(), ino),
            )
            touched.xattrs_kept.add(ino)
            return load(conn, ino)

        try:
            # with the size buffered writes have reached (a file's times are set while it is
            # still being written: smbd does at every close), else a FUSE or NFS client takes the
            # committed size for the file's and cuts off what it wrote
            return self.reads.with_pending(self.writes.write(work, (ino,)))
        finally:
            if size is not None:
                self.quotas.drop(ino)  # flushed above: nothing buffered is admitted any more

    def charge_size(self, conn, ino: int, delta: int) -> None:
        """A regular file's committed size moves by ``delta`` in this transaction: its quota
        trees' counters move with it (EDQUOT when growing would pass a hard limit)."""
        if not delta:
            return
        roots = self.quotas.roots(conn, ino, include_self=False)
        if roots:
            quotas.check(roots, delta, 0, self.quotas.reserved(exclude=ino))
            self.quotas.charge(conn, roots, delta, 0)

    @staticmethod
    def _setattr_values(
        cred: Cred, attr: Attr, *, now: int, mode, uid, gid, size, atime_ns, mtime_ns
    ) -> dict:
        """The columns a setattr changes (ctime aside), after its permission checks."""
        values = _ownership_values(cred, attr, mode=mode, uid=uid, gid=gid)
        values.update(_time_values(cred, attr, now=now, atime_ns=atime_ns, mtime_ns=mtime_ns))
        if size is not None:
            ino = attr.ino
            if attr.type == DIR:
                raise errors.IsADirectory(f"inode {ino} is a directory")
            if attr.type != REG:
                raise errors.InvalidArgument(f"inode {ino} is not a regular file")
            if not may(cred, attr, W_OK) and not cred.owns(attr):
                raise errors.AccessDenied(f"uid {cred.uid} may not write inode {ino}")
            if size != attr.size:
                values["size"] = size
                values.setdefault("mtime_ns", now)
        return values

    # -- file data -------------------------------------------------------------------
    def data_path(self) -> FileData:
        if self.data is None:
            raise errors.IOFailure("no data path attached to this namespace")
        return self.data

    def file_in_use(self, ino: int) -> Attr:
        """getattr for reads and writes: a file with no name and no opener is being freed (a chunk
        of extents per transaction), so its handle is stale, as once it is gone; a read must never
        see the holes its freed extents leave."""
        attr = self.reads.getattr(ino)
        if attr.nlink == 0 and attr.type == REG and not self.open_refs.is_open(ino):
            raise errors.StaleHandle(f"inode {ino} has been removed")
        return attr

    def read(self, ino: int, offset: int, length: int) -> bytes | bytearray:
        """Up to ``length`` bytes at ``offset``; short at end of file."""
        if offset < 0 or length < 0:
            raise errors.InvalidArgument(f"read at {offset} of {length} bytes")
        attr = self.file_in_use(ino)
        if attr.type == DIR:
            raise errors.IsADirectory(f"inode {ino} is a directory")
        if attr.type != REG:
            raise errors.InvalidArgument(f"inode {ino} is not a regular file")
        if offset >= attr.size or length == 0:
            return b""
        return self.data_path().read(ino, offset, min(length, attr.size - offset), attr.size)

    def write(self, ino: int, offset: int, data: bytes | bytearray, *, stable: bool = False) -> int:
        """Write ``data`` at ``offset``; with ``stable`` it is durable on return. Inside
        ``no_blocking()`` an unstable write that fits in the file's buffer runs; anything that
        would wait raises WouldBlock before it changed anything."""
        if offset < 0:
            raise errors.InvalidArgument(f"write at offset {offset}")
        if stable:
            may_block("a stable write")
        self.readonly.check_writable(ino)
        attr = self.file_in_use(ino)
        if attr.type == DIR:
            raise errors.IsADirectory(f"inode {ino} is a directory")
        if attr.type != REG:
            raise errors.InvalidArgument(f"inode {ino} is not a regular file")
        store = self.data_path()
        end = offset + len(data)
        if end > attr.size and data and self.quotas.active():
            self.quotas.admit(ino, end)  # EDQUOT before any byte is buffered
        store.write(ino, offset, data, seen_change=attr.change)
        if stable:
            store.flush(ino)
        self.listeners.notify((ino,))  # the size and data other views cache
        return len(data)

    def commit(self, ino: int) -> None:
        """Make every write to ``ino`` so far durable (NFS COMMIT, fsync)."""
        if self.data is not None:
            self.data.flush(ino)

    # -- the last close of a file unlinked while open frees it (openrefs.py) ------------------
    def close_ref_is_cheap(self, ino: int) -> bool:
        """Whether ``close_ref(ino)`` would need no catalog now: another reference stays, or the
        file is still named by what the cache holds (the NFS event loop closes only such)."""
        if self.open_refs.others_hold(ino):
            return True
        cache = self.cache
        if not cache.valid():
            return False
        attr = cache.cached(cache.attrs, ino)
        return attr is not None and attr.nlink > 0

    def close_ref(self, ino: int) -> None:
        if not self.open_refs.release(ino):
            return
        try:
            try:
                if self.reads.getattr(ino).nlink > 0:
                    return  # still named: nothing to free (the common close, no write transaction)
            except WouldBlock:
                # the event loop checked close_ref_is_cheap, and an unlink committed since:
                # the reference is gone already, so the check and the freeing go to a thread
                threading.Thread(target=self._free_later, args=(ino,), daemon=True).start()
                return
        except errors.StaleHandle:
            return
        self._free_if_unlinked(ino)

    def _free_later(self, ino: int) -> None:
        try:
            self._free_if_unlinked(ino)
        except Exception as exc:  # noqa: BLE001 - reclaim_orphans frees it at the next start
            log.warning("freeing closed inode %s: %s; it is freed at the next start", ino, exc)

    def _free_if_unlinked(self, ino: int) -> None:
        """Free ``ino`` if its last name is gone (its last open reference just went)."""

        def work(conn, touched):
            row = conn.execute(select(INODES.c.nlink).where(INODES.c.ino == ino)).first()
            if row is not None and row.nlink == 0:
                self.writes.free(conn, ino, touched)

        self.writes.write(work, (ino,))

    def reclaim_orphans(self) -> int:
        """Free inodes left with no name by a crash while they were open."""
        orphans = self.catalog.read(
            lambda conn: list(
                conn.execute(
                    select(INODES.c.ino).where(
                        and_(INODES.c.nlink == 0, INODES.c.ino != self.root_ino)
                    )
                ).scalars()
            )
        )
        # each is checked again (and skipped if open) in its transaction
        self.writes.free_orphans(orphans)
        self.cache.invalidate()
        return len(orphans)


def _ownership_values(cred: Cred, attr: Attr, *, mode, uid, gid) -> dict:
    """uid, gid and mode a setattr changes: only root gives a file away, the owner sets the
    group to one of its own and the mode; set-id bits drop as POSIX has them drop."""
    ino = attr.ino
    values: dict = {}
    new_mode = attr.mode
    if uid is not None and uid != attr.uid:
        if cred.uid != 0:
            raise errors.NotPermitted(f"uid {cred.uid} may not give inode {ino} to uid {uid}")
        values["uid"] = uid
    if gid is not None and gid != attr.gid:
        if cred.uid != 0 and not (cred.owns(attr) and cred.in_group(gid)):
            raise errors.NotPermitted(f"uid {cred.uid} may not set group {gid} on inode {ino}")
        values["gid"] = gid
    if values and attr.type != DIR and cred.uid != 0:
        new_mode &= ~(S_ISUID | S_ISGID)  # chown by a user drops set-id bits
    if mode is not None:
        if not (cred.uid == 0 or cred.owns(attr)):
            raise errors.NotPermitted(f"uid {cred.uid} does not own inode {ino}")
        new_mode = mode
        if cred.uid != 0 and not cred.in_group(values.get("gid", attr.gid)):
            new_mode &= ~S_ISGID
    if new_mode != attr.mode:
        values["mode"] = new_mode
    return values


def _time_values(cred: Cred, attr: Attr, *, now: int, atime_ns, mtime_ns) -> dict:
    """atime and mtime a setattr changes: "now" needs write access or ownership, a given
    time needs ownership."""
    owner = cred.uid == 0 or cred.owns(attr)
    values: dict = {}
    for key, wanted in (("atime_ns", atime_ns), ("mtime_ns", mtime_ns)):
        if wanted is None:
            continue
        if wanted is SET_TO_NOW:
            if not owner and not may(cred, attr, W_OK):
                raise errors.AccessDenied(f"uid {cred.uid} may not touch inode {attr.ino}")
            values[key] = now
        else:
            if not owner:
                raise errors.NotPermitted(f"uid {cred.uid} may not set times of inode {attr.ino}")
            values[key] = int(wanted)
    return values
