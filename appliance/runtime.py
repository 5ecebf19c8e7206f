"""Wiring: from a validated config to an open catalog, data path and namespace."""

from __future__ import annotations

import ctypes
import ctypes.util
import grp
import logging
import os
import pwd
import sys
import time
from collections.abc import Callable
from pathlib import Path

from appliance.config import Config
from engine.catalog import Catalog
from engine.catalog.migrate import current_revision, head_revision
from engine.errors import ConfigError
from engine.namespace import Namespace

log = logging.getLogger("shingle.runtime")

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)
MALLOC_MMAP_THRESHOLD = (
    32 << 20
)  # glibc's upper limit on 64-bit; above a stripe (8 MiB) and a WRITE
MALLOC_TRIM_THRESHOLD = 256 << 20


def become_data_owner(config: Config) -> str | None:
    """Run on as the owner of ``config``'s data_dir when root acts on another user's data
    (`sudo shingle drives add ...` on an installed appliance, whose daemon runs as the
    service user): new drives, zone files and catalog files then belong to that user, not
    to root, and the daemon can write them. Returns the user's name, None when nothing
    changed (not root, or the data belongs to root).

    When that user cannot read this interpreter or this code (a pyenv Python under /root),
    the command runs again from the installed launcher (the units' ExecStart=) as the user."""
    from appliance import unitexec

    if os.geteuid() != 0:
        return None
    try:
        owner = os.stat(config.data_dir).st_uid
        entry = pwd.getpwuid(owner)
    except (OSError, KeyError):
        return None  # a folder not made yet, or a uid without a name: stay as we are
    if owner == 0:
        return None
    groups = set(os.getgrouplist(entry.pw_name, entry.pw_gid))
    try:
        groups.add(grp.getgrnam("disk").gr_gid)  # zoned block devices, as the unit grants
    except KeyError:
        pass
    identity = unitexec.Identity(entry.pw_name, entry.pw_uid, frozenset(groups))
    code = Path(__file__).resolve().parent
    unreadable = [
        d
        for d in (Path(os.path.realpath(os.path.dirname(os.__file__))), code)
        if not unitexec.may_read_folder(identity, d)
    ]
    relaunch = None
    if unreadable:
        relaunch = _installed_launcher()
        if relaunch is None or not unitexec.may_read_folder(identity, relaunch.parent):
            log.warning(
                "staying root: %s cannot read %s and no installed launcher runs as it",
                entry.pw_name,
                unreadable[0],
            )
            return None
    os.setgroups(sorted(groups))
    os.setgid(entry.pw_gid)
    os.setuid(entry.pw_uid)
    os.umask(0o027)  # the units' UMask=
    if relaunch is not None:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        os.execve(relaunch, [str(relaunch), *sys.argv[1:]], env)
    log.debug("running as %s, the owner of %s", entry.pw_name, config.data_dir)
    return entry.pw_name


def _installed_launcher() -> Path | None:
    """The `shingle` the installed shingle-nfsd.service runs."""
    from appliance import install, unitexec

    unit = install.UNIT_DIR / install.SERVICES[0]
    if not unit.is_file():
        return None
    argv = unitexec.read_service([unit.read_text()]).exec_start
    return Path(argv[0]) if argv and os.access(argv[0], os.X_OK) else None


def tune_malloc() -> bool:
    """Keep stripe-sized buffers in the heap instead of mapping each one afresh (the daemon only).

    glibc serves an allocation above its mmap threshold (dynamic, from 128 KiB) with a new
    mapping and unmaps it on free, so each 1 MiB WRITE record, each stripe buffer and each
    encoded fragment set paid page faults and zeroing, inside copies made with the GIL held,
    and an unmap. With the threshold fixed at 32 MiB and trimming at 256 MiB, freed buffers are
    reused (figures in docs/performance.md). The cost is that the heap keeps its peak (the
    in-flight stripes, max_inflight_stripes x stripe size) instead of returning it."""
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return False  # not glibc (musl has no mallopt): nothing to tune
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD)
    )


class Mallinfo2(ctypes.Structure):
    """glibc's struct mallinfo2 (malloc.h, glibc 2.33 on)."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


class HeapTrim:
    """Give the heap's free memory back to the system once the daemon is quiet after load.

    tune_malloc keeps freed buffers in the heap, so that the next WRITE reuses them instead of
    mapping and faulting in new ones; but after the load they stayed resident until the next
    peak, whatever it was (40 connections that each held a 4 MiB record they never finished
    left 120 MB of the 168 MB they raised RSS by, closed or not). ``tick()`` (once a second
    from the daemon's main loop) calls malloc_trim(0), which gives back every whole free page,
    inside the heap too and not only at its top, when ``activity()`` (a counter that moves with
    every request byte the NFS server takes in and every byte written to the drives) has not
    moved for ``quiet_s`` and the heap holds at least ``min_free`` free bytes: at most once per
    quiet spell, never during load (whose speed comes from the reused buffers)."""

    QUIET_S = 5.0
    MIN_FREE = 32 << 20

    def __init__(
        self,
        activity: Callable[[], int],
        *,
        quiet_s: float = QUIET_S,
        min_free: int = MIN_FREE,
    ):
        self.activity = activity
        self.quiet_s = quiet_s
        self.min_free = min_free
        self.trims = 0
        self._last = activity()
        self._moved_at = time.monotonic()
        self._done = False  # this quiet spell was looked at (trimmed, or too little was free)
        self._trim: Callable[[int], int] | None = None
        self._info: Callable[[], Mallinfo2] | None = None
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            trim, info = libc.malloc_trim, libc.mallinfo2
        except (OSError, AttributeError):  # not glibc, or older than 2.33: nothing to trim
            return
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
        info.argtypes, info.restype = [], Mallinfo2
        self._trim, self._info = trim, info

    def free_bytes(self) -> int:
        """Bytes free inside the heap's arenas (what a trim could give back, at most)."""
        return int(self._info().fordblks) if self._info is not None else 0

    def tick(self) -> int | None:
        """Trim if the quiet spell has come: the heap's free bytes then, or None."""
        now, activity = time.monotonic(), self.activity()
        if activity != self._last:
            self._last, self._moved_at, self._done = activity, now, False
            return None
        if self._done or self._trim is None or now - self._moved_at < self.quiet_s:
            return None
        self._done = True
        before = self.free_bytes()
        if before < self.min_free:
            return None
        self._trim(0)
        self.trims += 1
        # fordblks counts free chunks, given back or not: the drop is in RSS, measured elsewhere
        log.debug(
            "malloc_trim after %.0f s quiet: %d MiB were free", now - self._moved_at, before >> 20
        )
        return before


def open_catalog(config: Config) -> Catalog:
    """The catalog, after checking that its schema is at the head revision."""
    url = config.catalog_url
    try:
        revision = current_revision(url)
    except Exception as exc:  # driver errors vary by database; the message is what matters
        raise ConfigError(
            "catalog.url", url, f"a reachable database ({exc.__class__.__name__}: {exc})"
        ) from None
    head = head_revision()
    if revision != head:
        raise ConfigError(
            "catalog.url",
            url,
            f"a catalog at schema revision {head} (found {revision}); "
            "run `shingle init` or `shingle install` to migrate",
        )
    return Catalog(url, sqlite_synchronous=config.get("catalog.sqlite_synchronous"))


class Appliance:
    """Catalog + data path + namespace, opened together and closed together.

    Only the daemon (``shingle serve``) opens the data path: it owns the
    drives. Admin commands that only read or change metadata use
    ``with_data=False``."""

    def __init__(self, config: Config, *, with_data: bool = True):
        self.config = config
        self.catalog = open_catalog(config)
        self.datapath = self.reads = None
        if with_data:
            from engine.datapath import DataPath
            from engine.lifecycle.tiering import ReadTracker

            self.datapath = DataPath(
                self.catalog,
                config.policies(),
                reserve_zones=config.get("storage.reserve_zones"),
                inline_write_bytes=config.get("storage.inline_write_bytes"),
                inline_budget_bytes=config.get("storage.inline_budget_bytes"),
            )
            # the constructor ran recovery before any write: its report, not a second pass's
            log.debug("recovery: %s", self.datapath.recovery_report)
            # reads are counted per file (the data path's read hook) so tiering can promote
            # cold data that is read again
            self.reads = ReadTracker(self.datapath)
        self.namespace = Namespace(
            self.catalog,
            data=self.datapath,
            snapshots_visible=config.get("snapshots.visible"),
        )
        if with_data:
            freed = self.namespace.reclaim_orphans()
            if freed:
                log.info("freed %d orphaned inodes", freed)
            self.finish_snapshot_deletions()

    def finish_snapshot_deletions(self) -> int:
        """Finish snapshot deletions a crash cut short (the owner of the drives, at start), so
        their space comes back now rather than at the next snapshot call."""
        from engine.snapshots import Snapshots

        freed = Snapshots(self.namespace).finish_deletions()
        if freed:
            log.info("finished interrupted snapshot deletions: %d stripes freed", freed)
        return freed

    def close(self) -> None:
        if self.datapath is not None:
            self.datapath.close()
        self.catalog.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
