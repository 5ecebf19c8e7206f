"""The NFS server: an asyncio TCP listener whose connections (appliance.nfs.onc)
dispatch to program 100003 (NFSv4.1 and NFSv3 on one port), 100005 (MOUNT v3), 100021
and 100024 (NLM v4 and NSM, locks of NFSv3 clients) and 100000 (the port mapper, also on
a port of its own or registered with a system rpcbind), worker threads for blocking work,
periodic lease, export and lock housekeeping, and a thread runner for tests and
``shingle serve``."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import resource
import socket
import threading
import time
from collections import deque
from concurrent.futures import Executor, Future
from typing import Any

from appliance.host.addresses import listening_socket
from appliance.nfs import portmap as pmap
from appliance.nfs.exports import ExportTable
from appliance.nfs.fh import HandleCodec
from appliance.nfs.handoff import HandedListener
from appliance.nfs.nlm import types as nlm_types
from appliance.nfs.nlm.manager import NlmManager
from appliance.nfs.nlm.nsm import NsmMonitor, NsmProgram
from appliance.nfs.nlm.program import NlmProgram
from appliance.nfs.onc.connection import RpcConnection
from appliance.nfs.onc.datagram import DatagramSockets, RpcDatagram
from appliance.nfs.onc.limits import NetLimits, ReceiveBuffers, RequestBudget
from appliance.nfs.onc.rpc import InWorker
from appliance.nfs.pnfs import Pnfs
from appliance.nfs.state import HeadRegistry, StateTable, clients, head_name
from appliance.nfs.stats import NfsStats
from appliance.nfs.v3.mount import MountProgram
from appliance.nfs.v3.program import Nfs3Program
from appliance.nfs.v3.types import MOUNT_PROGRAM, NFS_PROGRAM, NFS_V3
from appliance.nfs.v4.const import NFS_V4
from appliance.nfs.v4.offload import Offloads
from appliance.nfs.v4.program import Nfs4Program
from engine.base.blocking import may_block
from engine.base.ratelog import RateLimitedLog
from engine.catalog import CatalogUnavailable, CatalogUnreachable

log = logging.getLogger("shingle.nfs")

DEFAULT_MAX_RECORD = NetLimits.max_record_size
FD_RESERVE = 256  # descriptors kept for drives, the catalog and logs beside the connections
STATFS_TTL = 2.0
EXPORTS_TTL = 5.0
NLM_TICK = 1.0  # blocked NLM locks see an NFSv4 unlock within this
# several heads: how soon a head publishes the locks of a file another head wants
INTEREST_POLL_S = 0.25
PORTMAP_MODES = ("auto", "serve", "register", "off", "handed")


class _Call:
    """A call queued by ``NfsWorkers.call_soon``: no Future (nobody waits for the result: the
    call sends its own reply)."""

    __slots__ = ("fn", "args", "pending")

    def __init__(self, fn, args, pending: deque):
        self.fn, self.args, self.pending = fn, args, pending

    def run(self) -> None:
        try:
            self.fn(*self.args)
        except BaseException:  # noqa: BLE001 - an escaping error would end the worker thread
            log.exception("unexpected error in an NFS worker")
        finally:
            self.pending.pop()

    def cancel(self) -> None:  # shutdown(cancel_futures=True) drops what is still queued
        self.pending.pop()


class _Submitted:
    """A call queued by ``NfsWorkers.submit``, with its Future."""

    __slots__ = ("future", "fn", "args", "kwargs")

    def __init__(self, future: Future, fn, args, kwargs):
        self.future, self.fn, self.args, self.kwargs = future, fn, args, kwargs

    def run(self) -> None:
        if not self.future.set_running_or_notify_cancel():
            return
        try:
            result = self.fn(*self.args, **self.kwargs)
        except BaseException as exc:  # noqa: BLE001 - the Future carries it to the caller
            self.future.set_exception(exc)
        else:
            self.future.set_result(result)

    def cancel(self) -> None:
        self.future.cancel()


class _Worker:
    __slots__ = ("wake", "call")

    def __init__(self):
        self.wake = threading.Lock()
        self.wake.acquire()  # released to hand this worker a call
        self.call: Any = None


_STOP = object()


class NfsWorkers(Executor):
    """The NFS worker threads, started as calls need them, up to ``max_workers``.

    A call goes to the worker that went idle last (a stack, each worker waiting on a lock of its
    own), not to whichever of the waiters on one queue the OS wakes: waking a thread idle for
    long (its vCPU asleep) cost 11-14 us with the GIL held per hand-off, against about 2 us for
    one idle for a fraction of a millisecond, and the small operations of one client need just
    a few workers, which then stay warm. ``call_soon`` hands a call over without a Future (the
    call sends its own reply); ``submit`` and ``run_in_executor`` work as with any Executor."""

    def __init__(self, max_workers: int, thread_name_prefix: str = "nfs-worker"):
        if max_workers <= 0:
            raise ValueError(f"max_workers {max_workers}: expected > 0")
        self._max_workers = max_workers
        self._prefix = thread_name_prefix
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []  # the one idle last at the end
        self._queued: deque = deque()  # calls waiting for a worker while every one is busy
        self._threads: list[threading.Thread] = []
        self._shutdown = False
        self._pending: deque = deque()  # one entry per call_soon call not yet done

    def call_soon(self, fn, *args) -> None:
        """Run ``fn(*args)`` in a worker; RuntimeError once the pool is shut down."""
        self._pending.append(None)  # deque appends and pops are atomic: no lock
        try:
            self._hand_over(_Call(fn, args, self._pending))
        except RuntimeError:
            self._pending.pop()
            raise

    def submit(self, fn, /, *args, **kwargs) -> Future:
        future: Future = Future()
        self._hand_over(_Submitted(future, fn, args, kwargs))
        return future

    def idle(self) -> bool:
        """Whether no call handed over by ``call_soon`` is queued or running."""
        return not self._pending

    def _hand_over(self, call) -> None:
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new calls after shutdown")
            if self._idle:
                worker = self._idle.pop()
                worker.call = call
                worker.wake.release()
                return
            self._queued.append(call)
            if len(self._threads) < self._max_workers:
                thread = threading.Thread(
                    target=self._work,
                    args=(_Worker(),),
                    name=f"{self._prefix}_{len(self._threads)}",
                    daemon=True,
                )
                self._threads.append(thread)
                thread.start()

    def _work(self, worker: _Worker) -> None:
        call = None
        while True:
            if call is not None:
                if call is _STOP:
                    return
                call.run()
                call = None  # no reference kept while idle
            with self._lock:
                if self._queued:
                    call = self._queued.popleft()
                    continue
                if self._shutdown:
                    return
                self._idle.append(worker)
            worker.wake.acquire()
            call, worker.call = worker.call, None

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shutdown = True
            if cancel_futures:
                while self._queued:
                    self._queued.popleft().cancel()
            while self._idle:
                worker = self._idle.pop()
                worker.call = _STOP
                worker.wake.release()
            threads = list(self._threads)
        if wait:
            for thread in threads:
                if thread is not threading.current_thread():
                    thread.join()


class VersionDispatch:
    """One RPC program answering several versions, each by its own program object."""

    def __init__(self, by_version: dict):
        self.by_version = by_version
        self.versions = tuple(sorted(by_version))

    def call(self, conn, call, cred, record, pos):
        started = time.perf_counter()
        counted = conn.server.counters.call_done
        try:
            result = self.by_version[call.vers].call(conn, call, cred, record, pos)
        except BaseException:
            counted(time.perf_counter() - started)
            raise
        if isinstance(result, InWorker):
            # in the worker, once done
            result.finished = lambda: counted(time.perf_counter() - started)
        else:
            counted(time.perf_counter() - started)
        return result


def default_idmap_domain() -> str:
    """The host's DNS domain, else "localdomain": what nfsidmap assumes on both sides."""
    fqdn = socket.getfqdn()
    return fqdn.split(".", 1)[1] if "." in fqdn else "localdomain"


# served over UDP too: the port mapper, MOUNT, NLM and NSM, not NFS (appliance/nfs/onc/datagram.py)
UDP_PROGRAMS = (pmap.PMAP_PROGRAM, MOUNT_PROGRAM, nlm_types.NLM_PROGRAM, nlm_types.NSM_PROGRAM)
# (program, procedure) that may run twice over UDP: the rest go through the duplicate request
# cache (MNT/UMNT, NLM LOCK/CANCEL/UNLOCK/SHARE/... and their _MSG forms, NSM MON/UNMON/NOTIFY)
UDP_IDEMPOTENT = frozenset(
    [(pmap.PMAP_PROGRAM, proc) for proc in range(16)]
    + [(MOUNT_PROGRAM, proc) for proc in (0, 2, 5)]  # NULL, DUMP, EXPORT
    + [(nlm_types.NLM_PROGRAM, proc) for proc in (0, 1)]  # NULL, TEST
    + [(nlm_types.NSM_PROGRAM, proc) for proc in (0, 1)]  # NULL, STAT
)


class NfsServer:
    def __init__(
        self,
        namespace,
        catalog,
        *,
        host: str = "127.0.0.1",
        port: int = 2049,
        max_record_size: int = DEFAULT_MAX_RECORD,
        lease_seconds: int = 90,
        grace_seconds: int | None = None,
        workers: int = 32,
        limits: NetLimits | None = None,
        portmap: str = "off",
        portmap_port: int = 111,
        nsm_name: str = "",
        client_rpcbind_port: int = 111,
        pnfs: Pnfs | None = None,
        head_index: int | None = None,
        krb5_keytab: str = "",
        krb5_principal: str = "",
        idmap_domain: str = "",
        copy_offload_mib_s: float = 0.0,
        handoff: socket.socket | None = None,
        on_listener_gone=None,
        udp: bool = True,
    ):
        """``portmap``: "serve" answers PMAP on ``portmap_port`` (0: any free port),
        "register" registers NFS, MOUNT, NLM and NSM with the rpcbind there, "auto" does the
        one that fits (register when an rpcbind answers), "off" only answers PMAP on ``port``.
        ``nsm_name``: this server's name in SM_NOTIFY (default: ``host``, or the host name
        when listening on all addresses); "handed": the listener of ``shingle serve --heads``
        serves ``portmap_port`` and hands its connections over like the NFS port's.
        ``handoff``: connections come over this channel from that listener (appliance/nfs/
        handoff.py) instead of from a socket of this server's; ``on_listener_gone`` runs when
        the listener closes it. ``client_rpcbind_port``: where clients' port mappers
        are asked for their NLM and NSM services (callbacks). ``pnfs``: this head's pNFS role
        (appliance/nfs/pnfs.py; default: none). ``head_index``: this head's number among several
        over one catalog ([heads] index when count > 1): its server owner then differs from the
        others' while the server scope stays theirs (one namespace, each head its own state).
        ``copy_offload_mib_s``: the average rate cap of asynchronous COPYs (0: none).
        ``udp``: also answer the port mapper, MOUNT, NLM and NSM over UDP on ``port`` (and the
        port mapper on ``portmap_port`` when served), not with ``handoff`` (appliance/nfs/onc/
        datagram.py)."""
        if portmap not in PORTMAP_MODES:
            raise ValueError(f"portmap mode {portmap!r}: expected one of {PORTMAP_MODES}")
        if limits is None:
            limits = NetLimits(
                max_record_size=max_record_size,
                connection_budget=max(NetLimits.connection_budget, max_record_size + (1 << 20)),
            )
        self.limits = limits
        self.budget = RequestBudget(limits.total_budget)
        self.receive_buffers = ReceiveBuffers()
        self.namespace = namespace
        self.catalog = catalog
        self.host = host
        self.port = port
        self.max_record_size = limits.max_record_size  # also the ceiling CREATE_SESSION offers
        self.lease_seconds = lease_seconds
        self.grace_seconds = grace_seconds
        self.workers = workers
        self.portmap_mode = portmap
        self.portmap_port = portmap_port
        self.nsm_name = nsm_name or (
            socket.gethostname() if host in ("0.0.0.0", "::", "") else host
        )
        self.client_rpcbind_port = client_rpcbind_port
        self.pnfs = pnfs if pnfs is not None else Pnfs()
        self.handoff = handoff
        self.on_listener_gone = on_listener_gone or (lambda: None)
        # NFSv4 owners by name are user@idmap_domain (the host's DNS domain, as idmapd's default)
        self.idmap_domain = idmap_domain or default_idmap_domain()
        # RPCSEC_GSS: only with a keytab (gssapi is imported then, not before)
        self.gss = None
        if krb5_keytab:
            from appliance.nfs.onc.gss import GssService

            self.gss = GssService(krb5_keytab, krb5_principal)
        self.registered: dict = {}  # what a system rpcbind holds for us
        self.handles = HandleCodec(catalog)
        # the scope: file handles and names mean the same on every head of this catalog; the
        # owner: whose state (clients, sessions, stateids) a client talks to (RFC 8881 2.10.4)
        self.server_scope = f"shingle-{self.handles.fsid:016x}".encode()
        self.owner_major = self.server_scope
        self.head_index = head_index
        if head_index is not None:
            self.owner_major += f"-head{head_index}".encode()
        # changes every start: clients must re-send UNSTABLE writes after a restart
        self._boot_verifier = int.from_bytes(os.urandom(8), "big")
        self.boot_ns = time.time_ns()
        self.exports_generation = 1
        self.exports: ExportTable | None = None
        self.state: StateTable | None = None
        self.nlm: NlmManager | None = None
        self.programs: dict[int, Any] = {
            NFS_PROGRAM: VersionDispatch({NFS_V3: Nfs3Program(self), NFS_V4: Nfs4Program(self)}),
            MOUNT_PROGRAM: MountProgram(self),
            nlm_types.NLM_PROGRAM: NlmProgram(self),
            nlm_types.NSM_PROGRAM: NsmProgram(self),
            pmap.PMAP_PROGRAM: pmap.PortmapProgram(self.portmap_table),
        }
        self.datagrams = DatagramSockets(udp and handoff is None)
        self.connections: set = set()
        self.counters = NfsStats()
        self.offloads = Offloads(self)  # asynchronous COPYs (appliance/nfs/v4/offload.py)
        self.offloads.rate_bytes_s = copy_offload_mib_s * (1 << 20)
        # set by start()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.pool: NfsWorkers | None = None
        self._server: asyncio.Server | HandedListener | None = None
        self._housekeeper: asyncio.Future[None] | None = None
        self._nlm_ticker: asyncio.Future[None] | None = None
        self._head_beats: asyncio.Future[None] | None = None
        self._interest_polls: asyncio.Future[None] | None = None
        self._portmap_server: asyncio.Server | None = None
        self._sweeper: asyncio.Future[None] | None = None
        self._housekeeping_failures = RateLimitedLog(log)
        self._statfs = None
        self._statfs_at = 0.0
        self._statfs_lock = threading.Lock()

    # -- helpers used by operations --------------------------------------------------------

    @property
    def write_verifier(self) -> bytes:
        """The verifier of UNSTABLE writes and COMMIT: new at every start, and again whenever
        the data path let buffered writes go (their catalog commit met an outage), so clients
        send again what they have not seen committed. A WRITE reads it before writing."""
        data = self.namespace.data
        lost = data.writes_lost if data is not None else 0
        return ((self._boot_verifier + lost) % (1 << 64)).to_bytes(8, "big")

    def stats(self) -> dict[str, float]:
        """Cumulative counters (engine/admin/metrics.py names) that the daemon samples for the web
        UI."""
        out = self.counters.snapshot()
        if self.state is not None:  # granted, recalled, revoked, returned
            counts = dict(self.state.delegations.counts)
            out.update({f"nfs_delegations_{event}": n for event, n in counts.items()})
            replies = self.state.slot_replies
            out.update({f"nfs_slot_retries_{event}": n for event, n in replies.retries.items()})
            out["nfs_slot_replies_bytes"] = replies.used
            out.update({f"nfs_udp_{event}": n for event, n in self.datagrams.counts().items()})
            out["nfs_slot_replies_reserved_bytes"] = replies.reserved
            out.update({f"nfs_sessions_{event}": n for event, n in replies.sessions.items()})
        out.update({f"nfs_offload_{event}": n for event, n in self.offloads.counts.items()})
        if self.gss is not None:
            for key, value in self.gss.stats().items():
                out[f"nfs_gss_{key}"] = value
        return out

    def statfs(self):
        now = time.monotonic()
        if self._statfs is None or now - self._statfs_at > STATFS_TTL:
            may_block("statfs")  # the lock is held across catalog reads
            with self._statfs_lock:
                if self._statfs is None or now - self._statfs_at > STATFS_TTL:
                    self._statfs = self.namespace.statfs()
                    self._statfs_at = now
        return self._statfs

    def portmap_table(self) -> dict[tuple[int, int, int], int]:
        """(program, version, protocol) -> port of what this server answers, for PMAP."""
        tcp = pmap.IPPROTO_TCP
        table = {
            (prog, vers, tcp): self.port
            for prog, program in self.programs.items()
            if prog != pmap.PMAP_PROGRAM
            for vers in program.versions
        }
        pmap_port = self.portmap_port if self.serves_portmap else self.port
        for vers in pmap.PortmapProgram.versions:
            table[(pmap.PMAP_PROGRAM, vers, tcp)] = pmap_port
        for port, programs in self.datagrams.ports():  # (the port mapper's own port last)
            for prog in programs:
                for vers in self.programs[prog].versions:
                    table[(prog, vers, pmap.IPPROTO_UDP)] = port
        return table

    @property
    def serves_portmap(self) -> bool:
        """The port mapper answers on portmap_port: ours, or the heads' listener's."""
        return self._portmap_server is not None or self.portmap_mode == "handed"

    def callback_reaches_self(self, address: str) -> bool:
        """True when a callback to ``address`` would ask this server's own port mapper (a
        client behind NAT on this host, such as a VM on user-mode networking): it would
        call this server back instead of the client."""
        local = address.startswith("127.") or address in ("::1", self.host)
        return local and self.serves_portmap and self.client_rpcbind_port == self.portmap_port

    def holds_state(self, conn) -> bool:
        """A connection holds state when an NFSv4.1 session that still exists is bound to it
        (CREATE_SESSION or BIND_CONN_TO_SESSION on it): it may idle up to
        ``session_idle_timeout``. Anything else (NFSv3, MOUNT, NFSv4 before or without a
        session) can reconnect at no cost and gets ``idle_timeout``."""
        sessions = conn.state.get("sessions")
        if not sessions or self.state is None:
            return False
        live = self.state.sessions
        return any(sid in live for sid in sessions)

    def _fit_fd_limit(self) -> None:
        """Raise the soft descriptor limit so that max_connections fit, or lower the limit to
        what the hard one allows (a full table would fail accept() for everyone)."""
        want = self.limits.max_connections + FD_RESERVE
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and soft < want:
            new_soft = want if hard == resource.RLIM_INFINITY else min(want, hard)
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (new_soft, hard))
                soft = new_soft
            except (ValueError, OSError):
                pass
        if soft != resource.RLIM_INFINITY and soft < want:
            fit = max(1, soft - FD_RESERVE)
            log.warning(
                "nfs.max_connections = %d does not fit the descriptor limit %d: "
                "serving at most %d connections",
                self.limits.max_connections,
                soft,
                fit,
            )
            self.limits = dataclasses.replace(self.limits, max_connections=fit)

    async def _sweep(self) -> None:
        """Idle and unfinished-record timeouts, checked for every connection a few times per
        timeout."""
        while True:
            await asyncio.sleep(self.limits.sweep_period)
            now = time.monotonic()
            for conn in list(self.connections):
                try:
                    conn.check_timeouts(now)
                except Exception:  # noqa: BLE001 - one connection must not stop the sweep
                    log.exception("connection sweep failed for %s", conn.peer[0])

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        loop = self.loop = asyncio.get_running_loop()
        self._fit_fd_limit()
        pool = self.pool = NfsWorkers(self.workers, thread_name_prefix="nfs-worker")
        run = loop.run_in_executor
        self.exports = await run(pool, ExportTable, self.catalog, self.namespace)
        monitor = await run(
            pool,
            lambda: NsmMonitor(
                self.catalog,
                my_name=self.nsm_name,
                client_rpcbind_port=self.client_rpcbind_port,
                unreachable=self.callback_reaches_self,
                head=self.head_index,
            ),
        )
        heads = None
        if self.head_index is not None:  # several heads: locks and opens meet across them
            heads = HeadRegistry(self.catalog, head_name(self.head_index), self.lease_seconds)
            heads.address = self.nsm_name
        self.state = await run(
            pool,
            lambda: StateTable(
                self.catalog,
                self.namespace,
                lease_seconds=self.lease_seconds,
                grace_seconds=self.grace_seconds,
                heads=heads,
                nlm_hosts=bool(monitor.previous),
            ),
        )
        self.state.slot_replies.max_bytes = self.limits.slot_replies_bytes
        if self.state.holdings is not None:
            self.state.holdings.submit = pool.submit
        if heads is not None and self.pnfs.is_ds:  # (again at each beat until it could)
            await run(pool, self.pnfs.announce, self.catalog, heads.name)
        # the local mount and SMB recall delegations before they change a file
        self.namespace.change_guard = self.state.delegations
        grace = self.lease_seconds if self.grace_seconds is None else self.grace_seconds
        self.nlm = NlmManager(
            self, monitor, grace_seconds=grace, client_rpcbind_port=self.client_rpcbind_port
        )
        # NLM shares and NFSv4 opens deny each other, through this head and across heads
        self.state.shares.nlm_modes = self.nlm.shared_modes
        if self.state.holdings is not None:
            self.state.holdings.nlm_shares = self.nlm.shared_modes
        if self.handoff is not None:  # one of the heads behind `shingle serve --heads`
            handed = self._server = HandedListener(
                self.handoff, lambda: RpcConnection(self), self.on_listener_gone
            )
            handed.start()
        else:
            server = self._server = await self._listen(self.port, backlog=256)
            self.port = server.sockets[0].getsockname()[1]
            if self.datagrams.enabled:
                await self._listen_udp(self.port, UDP_PROGRAMS)
        await run(pool, self.state.delegations.start, f"{self.nsm_name}:{self.port}")
        await self._start_portmap()
        self._housekeeper = asyncio.ensure_future(self._housekeeping())
        self._nlm_ticker = asyncio.ensure_future(self._nlm_ticks())
        if heads is not None:
            self._head_beats = asyncio.ensure_future(self._beat(heads.beat_period))
            self._interest_polls = asyncio.ensure_future(self._poll_interest())
        if monitor.previous:  # tell the previous instance's lock clients to reclaim
            pool.submit(monitor.notify_previous)
        self._sweeper = asyncio.ensure_future(self._sweep())
        log.info("NFSv4.1 server listening on %s:%d", self.host, self.port)

    async def _housekeeping(self) -> None:
        period = max(1.0, min(EXPORTS_TTL, self.lease_seconds / 4))
        loop, state, exports = self.loop, self.state, self.exports
        assert loop is not None and state is not None and exports is not None  # start() ran
        while True:
            await asyncio.sleep(period)
            try:
                await loop.run_in_executor(self.pool, clients.expire_idle, state)
                await loop.run_in_executor(self.pool, self.offloads.reap)
                await loop.run_in_executor(self.pool, exports.refresh)
            except CatalogUnreachable:
                pass  # the catalog's outage log counts it; housekeeping retries next period
            except Exception as exc:  # noqa: BLE001 - housekeeping retries next period
                # a busy catalog fails every period: one line per interval, and no traceback
                self._housekeeping_failures.log(
                    logging.ERROR,
                    type(exc),
                    "NFS housekeeping failed: %s",
                    exc,
                    exc_info=not isinstance(exc, CatalogUnavailable),
                )

    async def _beat(self, period: float) -> None:
        """Several heads: this head's heartbeat, the others' expiry, holdings written."""
        loop, state = self.loop, self.state
        assert loop is not None and state is not None  # start() ran
        while True:
            await asyncio.sleep(period)
            try:
                taken = await loop.run_in_executor(self.pool, state.head_tick)
                for takeover in taken:
                    if takeover.nlm_hosts and self.nlm is not None:
                        self.nlm.take_over(takeover.nlm_hosts, takeover.nsm_name)
                await loop.run_in_executor(self.pool, self._follow_data_servers)
            except CatalogUnreachable:
                pass  # the catalog's outage log counts it; the next beat retries
            except Exception as exc:  # noqa: BLE001 - the next beat retries
                self._housekeeping_failures.log(
                    logging.ERROR,
                    type(exc),
                    "NFS head heartbeat failed: %s",
                    exc,
                    exc_info=not isinstance(exc, CatalogUnavailable),
                )

    def _follow_data_servers(self) -> None:
        """pNFS with several heads: a data server says which head it is; the metadata server
        leaves the data servers of dead heads out of new layouts (appliance/nfs/pnfs.py)."""
        pnfs, heads = self.pnfs, self.state.heads if self.state else None
        if heads is None:
            return
        if pnfs.is_ds:
            pnfs.announce(self.catalog, heads.name)
        elif pnfs.is_mds:
            pnfs.follow(self.catalog)

    async def _poll_interest(self) -> None:
        """Several heads: files this head alone held locks on that another head now wants get
        their locks published (appliance/nfs/state/holdings.py), and delegations another head
        asked this one to recall are recalled (appliance/nfs/state/head_delegations.py)."""
        loop, state = self.loop, self.state
        holdings = state.holdings if state else None
        recalls = state.delegations.heads if state else None
        assert loop is not None and state is not None  # start() ran
        assert holdings is not None and recalls is not None  # with heads
        polled_interest = 0.0
        woken = asyncio.Event()

        # another head asked this one to recall: a notification (PostgreSQL, in the change
        # watch's thread) or a datagram (SQLite) wakes this loop at once; the poll stays as
        # the safety net (head_delegations.SAFETY_POLL_S)
        def wake() -> None:
            loop.call_soon_threadsafe(woken.set)

        sock = recalls.listen(wake)
        if sock is not None:
            loop.add_reader(sock.fileno(), _drained, sock, recalls.datagram, woken)
        try:
            recall_due = 0.0  # the next look for recall requests without a wake-up
            while True:
                # (ticks at least every INTEREST_POLL_S: a file may enter envelope mode now)
                wait = min(INTEREST_POLL_S, recall_due - time.monotonic())
                try:
                    await asyncio.wait_for(woken.wait(), max(wait, 0.005))
                except TimeoutError:
                    pass
                pushed = woken.is_set()
                woken.clear()
                due = time.monotonic() >= recall_due
                if pushed or due:
                    recall_due = time.monotonic() + recalls.period()
                try:
                    # a head holding no delegation has nothing to recall unless woken: another
                    # head asks only a head whose delegation row it found
                    if pushed or (due and state.delegations.any_held() and not recalls.quiet()):
                        await loop.run_in_executor(self.pool, state.delegations.poll_recalls)
                    now = time.monotonic()
                    if holdings.envelope and now - polled_interest >= INTEREST_POLL_S:
                        polled_interest = now
                        await loop.run_in_executor(self.pool, holdings.poll_interest)
                except CatalogUnreachable:
                    pass  # the catalog's outage log counts it; the next poll retries
                except Exception as exc:  # noqa: BLE001 - the next poll retries
                    self._housekeeping_failures.log(
                        logging.ERROR, type(exc), "NFS holdings poll failed: %s", exc
                    )
        finally:
            if sock is not None:
                loop.remove_reader(sock.fileno())
            recalls.close()

    async def _listen(self, port: int, backlog: int = 100) -> asyncio.Server:
        loop = self.loop
        assert loop is not None  # start() runs this
        if ":" in self.host:  # IPv6; "::" takes IPv4 clients too
            sock = listening_socket(self.host, port, backlog)
            return await loop.create_server(lambda: RpcConnection(self), sock=sock)
        return await loop.create_server(
            lambda: RpcConnection(self), self.host, port, reuse_address=True, backlog=backlog
        )

    async def _listen_udp(self, port: int, programs: tuple[int, ...]) -> None:
        """Answer ``programs`` over UDP on ``port`` too (appliance/nfs/onc/datagram.py); a port
        another process holds is left to it, with a warning (TCP still serves them)."""
        loop = self.loop
        assert loop is not None  # start() runs this
        served = {prog: self.programs[prog] for prog in programs}
        proto = RpcDatagram(self, served, UDP_IDEMPOTENT, self.datagrams.cache)
        try:
            transport, _ = await loop.create_datagram_endpoint(
                lambda: proto, local_addr=(self.host, port)
            )
        except OSError as exc:
            log.warning("UDP port %d not served (%s): clients use TCP", port, exc)
            return
        proto.port = transport.get_extra_info("sockname")[1]
        self.datagrams.sockets.append((transport, proto))

    async def _start_portmap(self) -> None:
        mode = self.portmap_mode
        if mode in ("off", "handed"):
            return
        loop = self.loop
        assert loop is not None  # start() runs this
        run = loop.run_in_executor
        if mode == "auto":
            answers = self.portmap_port and await run(
                self.pool, pmap.rpcbind_answers, "127.0.0.1", self.portmap_port
            )
            mode = "register" if answers else "serve"
        if mode == "register":
            entries = {k: v for k, v in self.portmap_table().items() if k[0] != pmap.PMAP_PROGRAM}
            done = await run(
                self.pool,
                lambda: pmap.register(
                    "127.0.0.1", self.portmap_port, entries, ipv6=":" in self.host
                ),
            )
            self.registered = entries
            log.info(
                "registered %d of %d programs with the rpcbind on port %d",
                done,
                len(entries),
                self.portmap_port,
            )
            return
        try:
            portmap_server = self._portmap_server = await self._listen(self.portmap_port)
        except OSError as exc:
            log.warning(
                "port mapper not served on port %d (%s): NFSv3 clients then need nolock",
                self.portmap_port,
                exc,
            )
            return
        self.portmap_port = portmap_server.sockets[0].getsockname()[1]
        if self.datagrams.enabled:  # sm-notify and rpcinfo -u ask the port mapper over UDP
            await self._listen_udp(self.portmap_port, (pmap.PMAP_PROGRAM,))
        log.info("port mapper listening on %s:%d", self.host, self.portmap_port)

    async def _nlm_ticks(self) -> None:
        loop, nlm = self.loop, self.nlm
        assert loop is not None and nlm is not None  # start() ran
        while True:
            await asyncio.sleep(NLM_TICK)
            try:
                await loop.run_in_executor(self.pool, nlm.tick)
            except CatalogUnreachable:
                pass  # the catalog's outage log counts it; retried next tick
            except Exception:  # noqa: BLE001 - retried next tick
                log.exception("NLM housekeeping failed")

    async def stop(self) -> None:
        """Stop accepting, let calls in progress finish, close connections."""
        if self._server is None:
            return
        self._server.close()
        if self.state is not None and self.namespace.change_guard is self.state.delegations:
            self.namespace.change_guard = None
        if self._portmap_server is not None:
            self._portmap_server.close()
        self.datagrams.close()
        for task in (
            self._housekeeper,
            self._nlm_ticker,
            self._sweeper,
            self._head_beats,
            self._interest_polls,
        ):  # (_interest_polls also takes up other heads' recall requests)
            if task is not None:
                task.cancel()
        if self.registered and self.loop is not None:
            await self.loop.run_in_executor(
                self.pool,
                lambda: pmap.register(
                    "127.0.0.1",
                    self.portmap_port,
                    self.registered,
                    unset=True,
                    ipv6=":" in self.host,
                ),
            )
            self.registered = {}
        await asyncio.to_thread(self.offloads.stop)  # no CB_OFFLOAD after this
        deadline = time.monotonic() + 10
        while any(conn.in_flight for conn in self.connections) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for conn in list(self.connections):
            conn.abort()
        await self._server.wait_closed()
        self._server = None
        if self.state is not None and self.loop is not None:
            try:  # a clean stop: clients without opens or locks hold no grace at the next start
                await self.loop.run_in_executor(self.pool, self.state.grace.release_idle_records)
            except Exception as exc:  # noqa: BLE001 - the marks only cost a grace period
                log.warning("client records not updated at stop: %s", exc)
            holdings = self.state.holdings
            if holdings is not None and holdings.dirty:
                # what its clients still hold stays published: the other heads expire this one
                # after a lease and take its clients (or its restart does), in a grace period
                await self.loop.run_in_executor(self.pool, holdings.flush_quietly)
        if self._portmap_server is not None:
            await self._portmap_server.wait_closed()
            self._portmap_server = None
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)

    def drop_connections_to(self, address: str) -> int:
        """In the loop: close (reset) every connection a client made to ``address`` of this
        host (the floating metadata server address this head just gave up); how many."""
        dropped = 0
        for conn in list(self.connections):
            transport = conn.transport
            local = transport.get_extra_info("sockname") if transport is not None else None
            if local and local[0] in (address, f"::ffff:{address}"):
                conn.abort()
                dropped += 1
        return dropped


class NfsServerThread:
    """Runs an NfsServer in its own thread and event loop."""

    def __init__(self, namespace, catalog, **kwargs):
        self.server = NfsServer(namespace, catalog, **kwargs)
        self._thread = None
        self._loop = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def port(self) -> int:
        return self.server.port

    def start(self) -> NfsServerThread:
        self._thread = threading.Thread(target=self._run, name="nfs-server", daemon=True)
        self._thread.start()
        self._ready.wait(60)
        if self._error is not None:
            raise self._error
        if not self._ready.is_set():
            raise RuntimeError("NFS server did not start within 60 s")
        return self

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self.server.start())
        except BaseException as exc:  # noqa: BLE001 - reported to start()'s caller
            self._error = exc
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        loop.run_forever()
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()

    def stats(self) -> dict[str, float]:
        return self.server.stats()

    def drop_connections_to(self, address: str) -> int:
        """``NfsServer.drop_connections_to`` from another thread; 0 when not running."""
        if self._loop is None or self._thread is None:
            return 0

        async def drop() -> int:
            return self.server.drop_connections_to(address)

        return asyncio.run_coroutine_threadsafe(drop(), self._loop).result(10)

    def is_alive(self) -> bool:
        """True while the server's event-loop thread runs (the sd_notify watchdog pings only
        then)."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        if self._loop is None or self._thread is None:
            return
        fut = asyncio.run_coroutine_threadsafe(self.server.stop(), self._loop)
        try:
            fut.result(30)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(30)
            self._thread = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def _drained(sock, datagram, woken: asyncio.Event) -> None:
    """The recall socket is readable: each datagram to ``datagram`` (a recall request wakes
    the poll; write grant fences are answered there)."""
    try:
        while True:
            if datagram(*sock.recvfrom(256)):
                woken.set()
    except (BlockingIOError, InterruptedError):
        pass
    except OSError as exc:
        log.debug("recall socket: %s", exc)
