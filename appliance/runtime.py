"""Wiring: from a validated config to an open catalog, data path and namespace (Appliance), and
the daemon's parts started and stopped in their order (Daemon, what `shingle serve` runs)."""

from __future__ import annotations

import ctypes
import ctypes.util
import grp
import logging
import os
import pwd
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from appliance.config import Config
from appliance.host.addresses import client_addresses, url_host, wildcard_note
from engine.base.errors import ConfigError
from engine.catalog import Catalog
from engine.catalog.migrate import current_revision, head_revision
from engine.namespace import Namespace

if TYPE_CHECKING:  # the daemon's parts, imported when it starts them
    from appliance.host.sdnotify import Watchdog
    from appliance.maintenance import Maintenance
    from appliance.mds_address import MdsAddress
    from appliance.nfs.server import NfsServerThread
    from appliance.smb import SmbService

log = logging.getLogger("shingle.runtime")
daemon_log = logging.getLogger("shingle.daemon")  # the daemon starting and stopping its parts

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
    from appliance.host import unitexec

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
    from appliance.host import install, unitexec

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
                zone_share=(config.get("heads.index"), config.get("heads.count")),
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
            # deleted snapshots' rows are not freed here: a start must not wait for them (a
            # delete returns at once, so some are pending at most starts); the maintenance's
            # first round queues their paced reclaim (appliance/maintenance.py)

    def close(self) -> None:
        if self.datapath is not None:
            self.datapath.close()
        self.catalog.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class DaemonBusy(Exception):
    """Another daemon holds the data folder's lock."""


class Daemon:
    """The daemon (`shingle serve`): the appliance with its data path, the NFS server, the
    maintenance thread, SMB (the local mount and Samba), the web UI child, systemd's notify
    and watchdog. ``run`` starts them in that order, watches them until ``stop`` is set or one
    fails, and stops them in the reverse order, whatever was started of them.

    ``announce`` receives the lines that tell a user where to connect (stdout by default)."""

    def __init__(
        self,
        config: Config,
        *,
        nfs_port: int | None = None,
        web_port: int | None = None,
        web: bool = True,
        smb_port: int | None = None,
        smb_host: str | None = None,
        mount: str | None = None,
        announce: Callable[[str], None] = lambda line: print(line, flush=True),
        handoff: socket.socket | None = None,
        lock_dir: Path | None = None,
    ):
        from appliance.daemonlock import DaemonLock

        self.config = config
        self.nfs_port = nfs_port if nfs_port is not None else config.get("nfs.port")
        self.web_port = web_port
        self.with_web = web
        self.smb_port = smb_port if smb_port is not None else (config.get("smb.port") or None)
        self.smb_host = smb_host or config.get("smb.host")
        self.mountpoint = mount
        self.announce = announce
        # one head of `shingle serve --heads` (appliance/heads.py): its connections come over
        # ``handoff``, its lock is its own (the listener holds the data folder's)
        self.handoff = handoff
        self.listener_gone = False
        self.lock = DaemonLock(lock_dir if lock_dir is not None else config.data_dir)
        self.appliance: Appliance | None = None
        self.server: NfsServerThread | None = None
        self.maintenance: Maintenance | None = None
        self.mds_address: MdsAddress | None = None
        self.smb: SmbService | None = None
        self.watchdog: Watchdog | None = None
        self.web: subprocess.Popen | None = None

    def run(self, stop: threading.Event) -> int:
        """Serve until ``stop`` is set (0) or a part stops on its own (1)."""
        if tune_malloc():
            daemon_log.debug(
                "malloc: buffers up to %d MiB are reused from the heap",
                MALLOC_MMAP_THRESHOLD >> 20,
            )
        else:
            daemon_log.debug("malloc: left as it is (no glibc mallopt)")
        if not self.lock.acquire():
            if self.handoff is not None:
                raise DaemonBusy(
                    f"head {self.config.get('heads.index')} of {self.config.data_dir} still runs "
                    f"(pid {self.lock.holder()}, {self.lock.path}): its listener stopped "
                    "without it; it stops when it sees that"
                )
            raise DaemonBusy(
                f"another shingle daemon (pid {self.lock.holder()}) serves {self.config.data_dir}"
            )
        try:
            self.start()
            if self.handoff is not None:
                from appliance.nfs.handoff import READY

                self.handoff.send(READY)
            return self.watch(stop)
        finally:
            self.stop()

    def start(self) -> None:
        from appliance.host.sdnotify import notify
        from appliance.maintenance import Maintenance, maintenance_leader

        appliance = self.appliance = Appliance(self.config)
        self.start_nfs(appliance)
        self.maintenance = Maintenance(
            appliance,
            counters=self.counters,
            sample_every_s=self.config.get("maintenance.metrics_interval_s"),
            leader=maintenance_leader(self.config, appliance.catalog),
            runs_jobs=self.config.get("heads.index") == 0,
        )
        self.maintenance.start()
        self.mds_address = self.start_mds_address()
        self.smb = self.start_smb(appliance)
        if self.with_web:
            self.web = self.start_webui()
        notify("READY=1\nSTATUS=serving")  # systemd's Type=notify; no-op without NOTIFY_SOCKET
        self.watchdog = self.start_watchdog()

    def watch(self, stop: threading.Event) -> int:
        heap = HeapTrim(self.activity)
        while not stop.wait(1.0):
            heap.tick()
            if self.listener_gone:
                daemon_log.error("the heads' listener is gone; stopping")
                return 1
            if self.web is not None and self.web.poll() is not None:
                daemon_log.error("web UI exited with status %s; stopping", self.web.returncode)
                return 1
            if self.smb is not None and not self.smb.healthy():
                daemon_log.error("the local mount or the SMB supervisor stopped; stopping")
                return 1
        return 0

    def stop(self) -> None:
        """Stop what was started, the last started first; the lock goes last."""
        if self.mds_address is not None:  # the address goes before the server stops
            self.mds_address.stop()
        if self.maintenance is not None:
            self.maintenance.stop()
            self.maintenance.join(60)
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.web is not None and self.web.poll() is None:
            self.web.terminate()
            self.web.wait(30)
        if self.smb is not None:
            self.smb.stop()
        if self.server is not None:
            self.server.stop()
        if self.appliance is not None:
            self.appliance.close()
        self.lock.release()
        daemon_log.info("stopped")

    def start_nfs(self, appliance: Appliance) -> None:
        from appliance.nfs.onc.limits import NetLimits
        from appliance.nfs.server import NfsServerThread

        config = self.config
        host = config.get("nfs.host")
        server = self.server = NfsServerThread(
            appliance.namespace,
            appliance.catalog,
            host=host,
            port=self.nfs_port,
            limits=NetLimits.from_config(config),
            lease_seconds=config.get("nfs.lease_seconds"),
            grace_seconds=config.get("nfs.grace_seconds"),
            portmap=config.get("nfs.portmap"),
            portmap_port=config.get("nfs.portmap_port"),
            udp=config.get("nfs.udp"),
            nsm_name=config.get("nfs.nsm_name"),
            client_rpcbind_port=config.get("nfs.client_rpcbind_port"),
            pnfs=self.pnfs_role(appliance),
            head_index=config.get("heads.index") if config.get("heads.count") > 1 else None,
            krb5_keytab=config.get("nfs.krb5_keytab"),
            krb5_principal=config.get("nfs.krb5_principal"),
            idmap_domain=config.get("nfs.idmap_domain"),
            copy_offload_mib_s=config.get("nfs.copy_offload_mib_s"),
            handoff=self.handoff,
            on_listener_gone=self.on_listener_gone,
        )
        server.start()
        daemon_log.info("NFS server listening on %s:%d", host, server.port)
        addresses = client_addresses(host)
        shown = url_host(addresses[0])
        self.announce(
            f"NFS:    nfs://{shown}:{server.port}/export?version=4.1"
            + wildcard_note(host, addresses)
        )
        self.announce(
            "        mount -t nfs -o "
            f"vers=4.1,port={server.port},nconnect=4,rsize=1048576,wsize=1048576 "
            f"{shown}:/export /mnt/shingle"
        )
        self.announce(
            "        mount -t nfs -o "
            f"vers=3,port={server.port},mountport={server.port},mountproto=tcp {shown}:/export "
            f"/mnt/shingle   (locks: NLM via the port mapper on port {server.server.portmap_port})"
        )

    def start_mds_address(self) -> MdsAddress | None:
        """The floating metadata server address ([cluster] mds_address): campaigned for once
        the NFS server listens; only its holder expires dead heads (their clients follow the
        address)."""
        from appliance.config import etcd_client
        from appliance.mds_address import FloatingAddress, MdsAddress, parse_address

        config, server = self.config, self.server
        assert server is not None  # started before
        if not config.get("cluster.mds_address"):
            return None
        state = server.server.state
        if config.get("pnfs.role") == "ds":
            # a data server cannot answer as the metadata server, so it never takes the
            # address; it leaves dead heads to the holder, where their clients go to reclaim
            if state is not None and state.heads is not None:
                state.heads.takes_over = lambda: False
            daemon_log.info(
                "pNFS data server: not campaigning for %s; dead heads are the holder's to expire",
                config.get("cluster.mds_address"),
            )  # fmt: skip
            return None
        ttl_s = config.get("cluster.mds_lease_ttl_s")
        role = MdsAddress(
            # a request must leave the lease time to be renewed through another endpoint
            etcd_client(config, timeout_s=ttl_s / 4),
            FloatingAddress(
                parse_address(config.get("cluster.mds_address")),
                config.get("cluster.mds_interface"),
            ),
            config.get("cluster.name") or None,
            ttl_s=ttl_s,
            on_released=server.drop_connections_to,
        )
        if state is not None and state.heads is not None:
            state.heads.takes_over = lambda: role.holding
        try:
            role.address.check_interface()
        except OSError as exc:
            raise ConfigError(
                "cluster.mds_interface", role.address.interface, f"an interface here ({exc})"
            ) from None
        return role.start()

    def on_listener_gone(self) -> None:
        self.listener_gone = True

    def pnfs_role(self, appliance: Appliance):
        """This head's pNFS role ([pnfs], docs/pnfs.md); a metadata server publishes its data
        servers in the catalog before it serves."""
        from appliance.config import data_server_addresses
        from appliance.nfs.pnfs import Pnfs

        config = self.config
        role = config.get("pnfs.role")
        address = data_server_addresses(config.get("pnfs.address"), "pnfs.address")
        datapath = appliance.datapath
        assert datapath is not None  # a serving daemon's appliance has its data path
        pnfs = Pnfs(
            role,
            data_server_addresses(config.get("pnfs.data_servers")),
            # a stripe unit of one full stripe of the default class: a data server's share
            # of a file is whole stripes, encoded by the head that received them
            stripe_unit=datapath.policies[datapath.default_class].stripe_size,
            address=address[0] if address else (config.get("nfs.host"), self.nfs_port),
            stable_writes=config.get("pnfs.data_server_writes") == "file_sync",
        )
        if pnfs.is_mds:
            pnfs.publish(appliance.catalog)
        if role != "off":
            daemon_log.info("pNFS %s", "metadata server" if pnfs.is_mds else "data server")
        return pnfs

    def start_smb(self, appliance: Appliance) -> SmbService | None:
        """The local mount (--mount) and Samba sharing it (--smb-port, else smb.port):
        appliance/smb/."""
        if self.smb_port is None and self.mountpoint is None:
            return None
        from appliance.smb import SmbService

        smb = SmbService(
            appliance, port=self.smb_port, host=self.smb_host, mountpoint=self.mountpoint
        )
        smb.start()
        if smb.handover is None:
            self.announce(f"mount:  {smb.mountpoint}")
        if self.smb_port is not None:
            smb_at = client_addresses(self.smb_host)
            self.announce(
                f"SMB:    //{url_host(smb_at[0])}:{self.smb_port}/export"
                + wildcard_note(self.smb_host, smb_at)
            )
        return smb

    def start_webui(self) -> subprocess.Popen:
        """The web UI runs as a gunicorn child process (see webui/gunicorn.conf.py); `shingle
        webui` prints the URL and where the first password is."""
        port = self.web_port if self.web_port is not None else self.config.get("webui.port")
        cmd = [sys.executable, "-m", "appliance.cli", "-c", str(self.config.path)]
        return subprocess.Popen([*cmd, "webui", "--port", str(port)])

    def start_watchdog(self) -> Watchdog | None:
        from appliance.host.sdnotify import Watchdog, watchdog_interval

        interval = watchdog_interval()
        if interval is None:
            return None
        server = self.server
        assert server is not None  # started before
        dog = Watchdog(interval, healthy=server.is_alive)
        dog.start()
        return dog

    def counters(self) -> dict:
        """Cumulative counters the web UI charts (names: engine/admin/metrics.py)."""
        assert self.server is not None and self.appliance is not None
        assert self.appliance.datapath is not None  # the daemon's appliance has its data path
        return {**self.server.stats(), **self.appliance.datapath.counters()}

    def activity(self) -> int:
        """A number that moves while the daemon works: request bytes the NFS server took in,
        bytes written to the drives (also by SMB and by jobs)."""
        assert self.server is not None and self.appliance is not None
        assert self.appliance.datapath is not None
        return (
            self.server.server.budget.taken + self.appliance.datapath.stats["media_bytes_written"]
        )
