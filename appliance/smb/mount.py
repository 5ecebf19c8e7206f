"""The local POSIX mount of the namespace: a FUSE file system served by the daemon (pyfuse3).

Samba shares this mount; it is also the appliance's own local view (rsync, backup tools, an
admin's shell). Every handler calls the same ``Namespace`` as the NFS server, with the caller's
uid, gid and supplementary groups as its ``Cred``, so permissions are the namespace's POSIX
checks, as for NFS (no ``default_permissions``: the kernel does not check on its own); reads and
writes go through the daemon's data path, which stays the only owner of the drives.

pyfuse3 runs on trio; the daemon's NFS server is asyncio, so the FUSE loop runs in its own
thread (``FuseMount``) and each namespace call in a worker thread of that loop
(``trio.to_thread``), so a catalog transaction or a stripe flush never stalls other requests.
An exception other than FUSEError in a pyfuse3 handler would end the mount: ``_handler`` maps
every engine error to its errno and anything else to EIO (logged).

Coherence with NFS (and anything else in the daemon that changes files): the namespace calls its
change listeners with the inodes and names each of its commits changed (``_changed``) and the
files a buffered write grew; the mount queues them and a thread of its own tells the kernel to
drop its cached attributes, pages and names (notify_inval_inode / notify_inval_entry). Changes
the mount made itself are skipped (the kernel already knows them). Other processes' commits
(the web UI) carry no inode list: for those the kernel's caches expire after
``CACHE_TIMEOUT_S``, and file data is re-read at every open (no keep_cache)."""

from __future__ import annotations

import errno
import logging
import os
import queue
import stat
import subprocess
import threading
import time
from pathlib import Path

import pyfuse3
import trio

from engine.admin import exports as export_service
from engine.base import errors
from engine.base.blocking import WouldBlock, no_blocking
from engine.catalog import CatalogUnreachable
from engine.catalog.models import BLK, CHR, DIR, FIFO, LNK, REG, SOCK
from engine.namespace import ROOT, SET_TO_NOW, Attr, Cred, Namespace

log = logging.getLogger("shingle.fuse")

CACHE_TIMEOUT_S = 1.0  # kernel attribute and name caches: bounds staleness of untracked changes
WORKER_THREADS = 8
READAHEAD_KIB = 4096  # the mount's read-ahead window (sysfs bdi read_ahead_kb)
READDIR_PAGE = 512
GROUPS_CACHE_MAX = 1024  # callers (pid, uid, gid) whose supplementary groups are kept
GUEST_UID = 65534  # smbd's guest account, nobody (appliance/smb/samba.py), the NFS exports' anon
EXPORT_FOLDERS_TTL_S = 5.0  # how soon a new export folder is disowned for the guest
_TYPE_BITS = {
    REG: stat.S_IFREG,
    DIR: stat.S_IFDIR,
    LNK: stat.S_IFLNK,
    BLK: stat.S_IFBLK,
    CHR: stat.S_IFCHR,
    FIFO: stat.S_IFIFO,
    SOCK: stat.S_IFSOCK,
}
_FILE_TYPES = {bits: ftype for ftype, bits in _TYPE_BITS.items()}
_origin = threading.local()  # set in the mount's worker threads: their changes need no notice


def _handler(method):
    """Run a handler; every failure becomes a FUSEError (else pyfuse3 ends the mount)."""

    async def wrapped(self, *args):
        try:
            return await method(self, *args)
        except pyfuse3.FUSEError:
            raise
        except OSError as exc:  # engine.base.errors.FsError is an OSError carrying its errno
            if not isinstance(exc, errors.FsError) or exc.errno == errno.EIO:
                log.warning("%s%r: %s", method.__name__, args[:2], exc)
            raise pyfuse3.FUSEError(exc.errno or errno.EIO) from None
        except CatalogUnreachable:  # counted by the catalog's outage log
            raise pyfuse3.FUSEError(errno.EIO) from None
        except Exception:  # noqa: BLE001 - see the docstring
            log.exception("%s%r", method.__name__, args[:2])
            raise pyfuse3.FUSEError(errno.EIO) from None

    wrapped.__name__ = method.__name__
    return wrapped


def _name(raw: bytes) -> str:
    return os.fsdecode(raw)  # surrogateescape, as the namespace encodes names


class ShingleFs(pyfuse3.Operations):
    """pyfuse3 operations over a Namespace (FUSE inode 1 is the namespace root)."""

    supports_dot_lookup = True
    enable_writeback_cache = False
    enable_acl = False

    def __init__(self, namespace: Namespace):
        super().__init__()
        self.ns = namespace
        self.root = namespace.root_ino
        self._limiter: trio.CapacityLimiter | None = None
        self._dir_handles: dict[int, tuple[int, Cred]] = {}
        self._groups: dict[tuple[int, int, int], tuple[tuple[int, ...], float]] = {}  # _cred
        self._next_dir_handle = 0
        self._export_folders = frozenset({namespace.root_ino})
        self._export_folders_at = 0.0

    # -- plumbing -------------------------------------------------------------------------------
    def _ino(self, fuse_ino: int) -> int:
        return self.root if fuse_ino == pyfuse3.ROOT_INODE else fuse_ino

    def fuse_ino(self, ino: int) -> int:
        if ino == self.root:
            return pyfuse3.ROOT_INODE
        if ino == pyfuse3.ROOT_INODE:  # only if the root is not inode 1: never seen in practice
            raise errors.IOFailure(f"inode {ino} collides with the FUSE root")
        return ino

    async def _call(self, fn, *args, **kwargs):
        """``fn(*args, **kwargs)`` in a worker thread, so the loop never waits on the catalog."""
        if self._limiter is None:
            self._limiter = trio.CapacityLimiter(WORKER_THREADS)

        def run():
            _origin.fuse = True
            self._refresh_export_folders()
            return fn(*args, **kwargs)

        return await trio.to_thread.run_sync(run, limiter=self._limiter)

    async def _try_cached(self, fn, *args, **kwargs):
        """``fn`` on the loop itself when the namespace's caches answer it (``no_blocking``),
        else in a worker: handing a call to a thread and back costs more than a cache hit, and
        Samba makes a dozen such calls (stats, DOS-attribute and ACL xattrs) per SMB create."""
        if time.monotonic() - self._export_folders_at >= EXPORT_FOLDERS_TTL_S:
            return await self._call(fn, *args, **kwargs)  # the worker reloads them first
        _origin.fuse = True  # the loop's thread too: the kernel knows of this change
        try:
            with no_blocking():
                return fn(*args, **kwargs)
        except WouldBlock:  # raised before the call changed anything
            return await self._call(fn, *args, **kwargs)

    async def _recall_first(
        self, ino: int | None, name_in: tuple | None = None, *, writes_only: bool = False
    ) -> None:
        """Before a change of a file (``ino``, or the entry ``(cred, dir, name)``): NFS clients'
        delegations of it are recalled and returned (or revoked) first
        (Namespace.change_guard); nothing to do, and no thread hop, while none stands."""
        guard = self.ns.change_guard
        if guard is None or not guard.held():
            return
        if name_in is not None:
            try:
                ino = (await self._try_cached(self.ns.lookup, *name_in)).ino
            except errors.NotFound:
                return  # the change itself says so
        if ino is not None and guard.held(ino, writes_only=writes_only):
            await self._call(guard.wait_returned, ino, writes_only=writes_only)

    async def _as_holder_sees(self, attr):
        """A file under an NFS client's write delegation as its holder sees it (CB_GETATTR,
        RFC 8881 10.4.3: its cached writes count); nothing to do, and no thread hop, while no
        write delegation of it stands (Namespace.change_guard)."""
        guard = self.ns.change_guard
        if guard is None or not guard.held(attr.ino, writes_only=True):
            return attr
        seen = await self._call(guard.attr_seen_by_holder, attr)
        return seen if seen is not None else await self._try_cached(self.ns.getattr, attr.ino)

    def _refresh_export_folders(self) -> None:
        """In a worker thread: the catalog read must not stall the FUSE loop."""
        if time.monotonic() - self._export_folders_at < EXPORT_FOLDERS_TTL_S:
            return
        self._export_folders_at = time.monotonic()
        try:
            self._export_folders = export_service.export_folders(self.ns.catalog, self.ns)
        except CatalogUnreachable:
            pass  # counted by the catalog's outage log; retried later
        except Exception as exc:  # noqa: BLE001 - the call itself still runs; retried later
            log.warning("export folders not reloaded: %s", exc)

    def _cred(self, ctx: pyfuse3.RequestContext) -> Cred:
        """The caller's identity. Supplementary groups come from /proc/PID/status, read at most
        once per CACHE_TIMEOUT_S for one process as one uid and gid (smbd asks a dozen times per
        SMB create, as the same user): a process that drops a group keeping its uid and gid
        keeps it here up to that long."""
        if ctx.uid == 0:
            return ROOT
        key = (ctx.pid, ctx.uid, ctx.gid)
        now = time.monotonic()
        hit = self._groups.get(key)
        if hit is not None and hit[1] > now:
            groups = hit[0]
        else:
            try:
                groups = tuple(pyfuse3.get_sup_groups(ctx.pid))
            except OSError:  # the caller has exited
                groups = ()
            if len(self._groups) >= GROUPS_CACHE_MAX:
                self._groups.clear()  # many short-lived callers: start again
            self._groups[key] = (groups, now + CACHE_TIMEOUT_S)
        if ctx.uid == GUEST_UID:
            # SMB guests are nobody, the uid NFS squashes to: no owner rights over the export
            # folders given to it (invariant 12, engine.admin.exports.prepare_new_root)
            return Cred(ctx.uid, ctx.gid, groups, self._export_folders)
        return Cred(ctx.uid, ctx.gid, groups)

    def _entry(self, attr: Attr) -> pyfuse3.EntryAttributes:
        entry = pyfuse3.EntryAttributes()
        entry.st_ino = self.fuse_ino(attr.ino)
        entry.generation = attr.generation
        entry.entry_timeout = entry.attr_timeout = CACHE_TIMEOUT_S
        entry.st_mode = _TYPE_BITS.get(attr.type, stat.S_IFREG) | attr.mode
        entry.st_nlink = attr.nlink
        entry.st_uid, entry.st_gid = attr.uid, attr.gid
        entry.st_rdev = attr.rdev
        entry.st_size = attr.size
        entry.st_blksize = 1 << 20
        entry.st_blocks = (attr.size + 511) // 512
        entry.st_atime_ns, entry.st_mtime_ns = attr.atime_ns, attr.mtime_ns
        entry.st_ctime_ns = attr.ctime_ns
        return entry

    # -- names ----------------------------------------------------------------------------------
    @_handler
    async def lookup(self, parent_inode, name, ctx):
        try:
            attr = await self._try_cached(
                self.ns.lookup, self._cred(ctx), self._ino(parent_inode), _name(name)
            )
        except errors.NotFound:
            # a negative entry the kernel keeps as long as a positive one: SMB clients probe
            # names that are not there (desktop.ini, a name before creating it) again and again.
            # Changes made outside the mount drop it like any entry (Invalidator), other
            # processes' within the timeout.
            missing = pyfuse3.EntryAttributes()
            missing.st_ino = 0
            missing.entry_timeout = CACHE_TIMEOUT_S
            return missing
        return self._entry(await self._as_holder_sees(attr))

    @_handler
    async def getattr(self, inode, ctx):
        attr = await self._try_cached(self.ns.getattr, self._ino(inode))
        return self._entry(await self._as_holder_sees(attr))

    @_handler
    async def setattr(self, inode, attr, fields, fh, ctx):
        changes = {}
        if fields.update_mode:
            changes["mode"] = stat.S_IMODE(attr.st_mode)
        if fields.update_uid:
            changes["uid"] = attr.st_uid
        if fields.update_gid:
            changes["gid"] = attr.st_gid
        if fields.update_size:
            changes["size"] = attr.st_size
        if fields.update_atime:
            changes["atime_ns"] = attr.st_atime_ns
        if fields.update_mtime:
            changes["mtime_ns"] = attr.st_mtime_ns
        cred = self._cred(ctx)
        ino = self._ino(inode)
        if not changes:
            return self._entry(await self._try_cached(self.ns.getattr, ino))
        await self._recall_first(ino)
        try:
            new = await self._try_cached(self.ns.setattr, cred, ino, **changes)
        except errors.NotPermitted:
            # utimes(NULL) by a writer who is not the owner: the kernel sends the time it read
            # from its clock, which POSIX allows to anyone who may write
            times = {k for k in changes if k.endswith("time_ns")}
            if not times or set(changes) != times:
                raise
            new = await self._call(self.ns.setattr, cred, ino, **{k: SET_TO_NOW for k in times})
        return self._entry(new)

    @_handler
    async def readlink(self, inode, ctx):
        return await self._call(self.ns.readlink, self._ino(inode))

    @_handler
    async def mknod(self, parent_inode, name, mode, rdev, ctx):
        ftype = _FILE_TYPES.get(stat.S_IFMT(mode))
        cred = self._cred(ctx)
        parent = self._ino(parent_inode)
        if ftype == REG:
            attr = await self._call(self.ns.create, cred, parent, _name(name), stat.S_IMODE(mode))
        elif ftype in (BLK, CHR, SOCK, FIFO):
            attr = await self._call(
                self.ns.mknod, cred, parent, _name(name), ftype, stat.S_IMODE(mode), rdev
            )
        else:
            raise pyfuse3.FUSEError(errno.EINVAL)
        return self._entry(attr)

    @_handler
    async def mkdir(self, parent_inode, name, mode, ctx):
        attr = await self._call(
            self.ns.mkdir, self._cred(ctx), self._ino(parent_inode), _name(name), stat.S_IMODE(mode)
        )
        return self._entry(attr)

    @_handler
    async def symlink(self, parent_inode, name, target, ctx):
        attr = await self._call(
            self.ns.symlink, self._cred(ctx), self._ino(parent_inode), _name(name), bytes(target)
        )
        return self._entry(attr)

    @_handler
    async def link(self, inode, new_parent_inode, new_name, ctx):
        await self._recall_first(self._ino(inode))
        attr = await self._call(
            self.ns.link,
            self._cred(ctx),
            self._ino(inode),
            self._ino(new_parent_inode),
            _name(new_name),
        )
        return self._entry(attr)

    @_handler
    async def unlink(self, parent_inode, name, ctx):
        cred, parent = self._cred(ctx), self._ino(parent_inode)
        await self._recall_first(None, (cred, parent, _name(name)))
        await self._call(self.ns.unlink, cred, parent, _name(name))

    @_handler
    async def rmdir(self, parent_inode, name, ctx):
        await self._call(self.ns.rmdir, self._cred(ctx), self._ino(parent_inode), _name(name))

    @_handler
    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx):
        cred = self._cred(ctx)
        src, dst = self._ino(parent_inode_old), self._ino(parent_inode_new)
        if flags & pyfuse3.RENAME_EXCHANGE:
            raise pyfuse3.FUSEError(errno.EINVAL)
        if flags & pyfuse3.RENAME_NOREPLACE:
            try:
                await self._try_cached(self.ns.lookup, cred, dst, _name(name_new))
                raise pyfuse3.FUSEError(errno.EEXIST)
            except errors.NotFound:
                pass
        await self._recall_first(None, (cred, src, _name(name_old)))
        await self._recall_first(None, (cred, dst, _name(name_new)))
        await self._call(self.ns.rename, cred, src, _name(name_old), dst, _name(name_new))

    # -- directories ------------------------------------------------------------------------------
    @_handler
    async def opendir(self, inode, ctx):
        ino = self._ino(inode)
        attr = await self._try_cached(self.ns.getattr, ino)
        if attr.type != DIR:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        # permission is checked as each page is read, with the opener's credentials
        self._next_dir_handle += 1
        self._dir_handles[self._next_dir_handle] = (ino, self._cred(ctx))
        return self._next_dir_handle

    @_handler
    async def readdir(self, fh, start_id, token):
        ino, cred = self._dir_handles[fh]
        cookie = start_id
        while True:
            entries, eof = await self._call(self.ns.readdir, cred, ino, cookie, READDIR_PAGE)
            guard = self.ns.change_guard
            held = guard is not None and guard.held()  # cheap: any delegation at all
            for entry in entries:
                attr = await self._as_holder_sees(entry.attr) if held else entry.attr
                if not pyfuse3.readdir_reply(
                    token, os.fsencode(entry.name), self._entry(attr), entry.cookie
                ):
                    return  # the kernel's buffer is full: it asks again from the last cookie
                cookie = entry.cookie
            if eof or not entries:
                return

    async def releasedir(self, fh):
        self._dir_handles.pop(fh, None)

    @_handler
    async def statfs(self, ctx):
        fs = await self._call(self.ns.statfs)
        out = pyfuse3.StatvfsData()
        out.f_bsize = out.f_frsize = 4096
        out.f_blocks = fs.total_bytes // 4096
        out.f_bfree = fs.free_bytes // 4096
        out.f_bavail = fs.avail_bytes // 4096
        out.f_files = fs.total_files
        out.f_ffree = out.f_favail = fs.free_files
        out.f_namemax = fs.name_max
        return out

    # -- files ------------------------------------------------------------------------------------
    @staticmethod
    def _wanted(flags: int) -> int:
        access = flags & os.O_ACCMODE
        want = {os.O_RDONLY: 4, os.O_WRONLY: 2, os.O_RDWR: 6}.get(access, 6)
        if flags & os.O_TRUNC:
            want |= 2
        return want

    def _opened(self, ino: int) -> pyfuse3.FileInfo:
        self.ns.open_ref(ino)  # an unlinked open file keeps its data until release
        return pyfuse3.FileInfo(fh=ino, keep_cache=False, direct_io=False)

    @_handler
    async def open(self, inode, flags, ctx):
        ino = self._ino(inode)
        cred = self._cred(ctx)
        want = self._wanted(flags)
        attr = await self._try_cached(self.ns.getattr, ino)
        if attr.type == DIR:
            raise pyfuse3.FUSEError(errno.EISDIR)
        granted = await self._try_cached(self.ns.access, cred, ino, want)
        if granted != want:
            raise pyfuse3.FUSEError(errno.EACCES)
        if want & 2:  # opened for writing (or truncated): NFS clients' cached copies go first
            await self._recall_first(ino)
        else:  # for reading: what an NFS client holding a write delegation wrote comes first
            await self._recall_first(ino, writes_only=True)
        return self._opened(ino)

    @_handler
    async def create(self, parent_inode, name, mode, flags, ctx):
        attr = await self._call(
            self.ns.create,
            self._cred(ctx),
            self._ino(parent_inode),
            _name(name),
            stat.S_IMODE(mode),
            exclusive=bool(flags & os.O_EXCL),
        )
        return self._opened(attr.ino), self._entry(attr)

    @_handler
    async def read(self, fh, off, size):
        return bytes(await self._try_cached(self.ns.read, fh, off, size))

    @_handler
    async def write(self, fh, off, buf):
        await self._recall_first(fh)  # a delegation granted while the file was open
        return await self._try_cached(self.ns.write, fh, off, bytes(buf))

    @_handler
    async def flush(self, fh):
        # close(): durable, as NFS clients COMMIT at close (close-to-open)
        await self._try_cached(self.ns.commit, fh)

    @_handler
    async def fsync(self, fh, datasync):
        await self._try_cached(self.ns.commit, fh)

    @_handler
    async def release(self, fh):
        if self.ns.close_ref_is_cheap(fh):  # no file to free: no catalog
            self.ns.close_ref(fh)
        else:
            await self._call(self.ns.close_ref, fh)

    # -- extended attributes ----------------------------------------------------------------------
    @_handler
    async def getxattr(self, inode, name, ctx):
        try:
            return await self._try_cached(
                self.ns.getxattr, self._cred(ctx), self._ino(inode), _name(name)
            )
        except errors.NoData:
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR) from None

    @_handler
    async def listxattr(self, inode, ctx):
        names = await self._try_cached(self.ns.listxattr, self._cred(ctx), self._ino(inode))
        return [os.fsencode(n) for n in names]

    @_handler
    async def setxattr(self, inode, name, value, ctx):
        await self._call(
            self.ns.setxattr, self._cred(ctx), self._ino(inode), _name(name), bytes(value)
        )

    @_handler
    async def removexattr(self, inode, name, ctx):
        try:
            await self._call(self.ns.removexattr, self._cred(ctx), self._ino(inode), _name(name))
        except errors.NoData:
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR) from None


class Invalidator(threading.Thread):
    """Tells the kernel about changes made outside the mount (NFS, the daemon's jobs).

    Listener calls only queue (they run inside namespace commits and NFS workers); this thread
    makes the blocking notify calls, which must not run inside a FUSE handler."""

    def __init__(self, fs: ShingleFs):
        super().__init__(name="fuse-invalidate", daemon=True)
        self.fs = fs
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.sent = 0

    def changed(self, inos, names) -> None:
        """A namespace change listener: ``inos`` and (dir, name) pairs another caller changed."""
        if getattr(_origin, "fuse", False):
            return
        if inos or names:
            self.queue.put((tuple(inos), tuple(names)))

    def run(self) -> None:
        while True:
            item = self.queue.get()
            inos: set = set()
            names: set = set()
            while item is not None:  # coalesce: a stream of NFS WRITEs names one file many times
                inos.update(item[0])
                names.update(item[1])
                try:
                    item = self.queue.get_nowait()
                except queue.Empty:
                    break
            if item is None:
                return
            for ino in inos:
                self._notify(pyfuse3.invalidate_inode, self.fs.fuse_ino(ino))
            for parent, name in names:
                self._notify(pyfuse3.invalidate_entry, self.fs.fuse_ino(parent), os.fsencode(name))

    def _notify(self, fn, *args) -> None:
        try:
            fn(*args)
            self.sent += 1
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENOTDIR):  # not in the kernel's caches
                log.debug("%s%r: %s", fn.__name__, args, exc)
        except Exception:  # noqa: BLE001 - a notice is advice; the thread must go on
            log.exception("%s%r", fn.__name__, args)

    def stop(self) -> None:
        self.queue.put(None)


def unmount_stale(mountpoint: Path) -> None:
    """A FUSE mount left by a daemon that died answers ENOTCONN: lazily unmount it."""
    try:
        os.stat(mountpoint)
    except OSError as exc:
        if exc.errno == errno.ENOTCONN:
            subprocess.run(
                ["fusermount3", "-u", "-z", str(mountpoint)], check=False, capture_output=True
            )


class FuseMount:
    """The mount, served by a thread running pyfuse3's trio loop (one per process: pyfuse3
    keeps its session in module state)."""

    def __init__(
        self,
        namespace: Namespace,
        mountpoint: Path | str,
        *,
        allow_other: bool = True,
        device_fd: int | None = None,
    ):
        self.namespace = namespace
        self.mountpoint = Path(mountpoint)
        # a /dev/fuse descriptor whose mount another process made (shingle-smbd.service, as
        # root): libfuse serves it when named /dev/fd/N and mounts nothing itself
        self.device_fd = device_fd
        self.fs = ShingleFs(namespace)
        self.invalidator = Invalidator(self.fs)
        self.allow_other = allow_other
        self._thread: threading.Thread | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    def start(self, timeout: float = 30.0) -> None:
        options = {"fsname=shingle", "subtype=shingle", "noatime"}
        if self.allow_other:
            options.add("allow_other")  # smbd serves users other than the daemon's
        if self.device_fd is not None:
            pyfuse3.init(self.fs, f"/dev/fd/{self.device_fd}", options)
        else:
            self.mountpoint.mkdir(parents=True, exist_ok=True)
            unmount_stale(self.mountpoint)
            if os.path.ismount(self.mountpoint):
                raise errors.Exists(f"{self.mountpoint} is already a mount point")
            pyfuse3.init(self.fs, str(self.mountpoint), options)
        self.invalidator.start()
        self.namespace.add_change_listener(self.invalidator.changed)
        self._thread = threading.Thread(target=self._serve, name="fuse", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise errors.IOFailure(f"FUSE loop did not start in {timeout:.0f} s")
        if self._error is not None:
            raise errors.IOFailure(f"FUSE loop failed: {self._error}")
        self._widen_readahead()
        log.info("namespace mounted at %s", self.mountpoint)

    def _widen_readahead(self) -> None:
        """The kernel reads ahead 128 KiB on a FUSE mount, so a sequential reader costs a FUSE
        round trip (and a namespace read) per 128 KiB; READAHEAD_KIB lets it ask for up to 1 MiB
        (libfuse's max_pages) at a time. Only root may set it: for others it stays as it was."""
        dev = os.stat(self.mountpoint).st_dev
        knob = Path(f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb")
        try:
            knob.write_text(f"{READAHEAD_KIB}\n")
        except OSError as exc:
            log.info("FUSE read-ahead left at the kernel's default (%s: %s)", knob, exc)

    def _serve(self) -> None:
        async def main():
            self._token = trio.lowlevel.current_trio_token()
            self._ready.set()
            await pyfuse3.main(min_tasks=4, max_tasks=64)

        try:
            trio.run(main)
        except BaseException as exc:  # noqa: BLE001 - reported by start()/logged
            self._error = exc
            log.exception("FUSE loop")
        finally:
            self._ready.set()
            try:
                pyfuse3.close(unmount=True)
            except Exception:  # noqa: BLE001 - already unmounted
                log.debug("pyfuse3.close", exc_info=True)

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 30.0) -> None:
        self.namespace.remove_change_listener(self.invalidator.changed)
        self.invalidator.stop()
        if self._thread is not None and self._thread.is_alive() and self._token is not None:
            try:
                trio.from_thread.run_sync(pyfuse3.terminate, trio_token=self._token)
            except (trio.RunFinishedError, RuntimeError):
                pass
            self._thread.join(timeout)
        self._thread = None
        # busy (an open file): detach it now, gone later
        if self.device_fd is None and os.path.ismount(self.mountpoint):
            subprocess.run(
                ["fusermount3", "-u", "-z", str(self.mountpoint)], check=False, capture_output=True
            )
