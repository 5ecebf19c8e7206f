"""The NFS server: an asyncio TCP listener whose connections (appliance.nfs.onc)
dispatch to program 100003 (NFSv4.1 and NFSv3 on one port) and 100005 (MOUNT v3),
worker threads for blocking work, periodic lease and export housekeeping, and a
thread runner for tests and ``shingle serve``."""
from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from appliance.log import Throttled
from appliance.nfs.exports import ExportTable
from appliance.nfs.fh import HandleCodec
from appliance.nfs.onc.connection import RpcConnection
from appliance.nfs.onc.rpc import InWorker
from appliance.nfs.stats import NfsStats
from appliance.nfs.v3.mount import MountProgram
from appliance.nfs.v3.program import Nfs3Program
from appliance.nfs.v3.types import MOUNT_PROGRAM, NFS_PROGRAM, NFS_V3
from appliance.nfs.v4.const import NFS_V4
from appliance.nfs.v4.program import Nfs4Program
from appliance.nfs.v4.state import StateTable
from engine.blocking import may_block
from engine.catalog import CatalogUnavailable

log = logging.getLogger("shingle.nfs")

DEFAULT_MAX_RECORD = (4 << 20) + (64 << 10)
STATFS_TTL = 2.0
EXPORTS_TTL = 5.0


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


class NfsServer:
    def __init__(self, namespace, catalog, *, host: str = "127.0.0.1", port: int = 2049,
                 max_record_size: int = DEFAULT_MAX_RECORD, lease_seconds: int = 90,
                 grace_seconds: int | None = None, workers: int = 32):
        self.namespace = namespace
        self.catalog = catalog
        self.host = host
        self.port = port
        self.max_record_size = max_record_size
        self.lease_seconds = lease_seconds
        self.grace_seconds = grace_seconds
        self.workers = workers
        self.handles = HandleCodec(catalog)
        self.owner_major = f"shingle-{self.handles.fsid:016x}".encode()
        # changes every start: clients must re-send UNSTABLE writes after a restart
        self.write_verifier = os.urandom(8)
        self.boot_ns = time.time_ns()
        self.exports_generation = 1
        self.exports: ExportTable | None = None
        self.state: StateTable | None = None
        self.programs = {
            NFS_PROGRAM: VersionDispatch({NFS_V3: Nfs3Program(self), NFS_V4: Nfs4Program(self)}),
            MOUNT_PROGRAM: MountProgram(self)}
        self.connections: set = set()
        self.counters = NfsStats()
        self.loop = None
        self.pool = None
        self._server = None
        self._housekeeper = None
        self._housekeeping_failures = Throttled(log)
        self._statfs = None
        self._statfs_at = 0.0
        self._statfs_lock = threading.Lock()

    # -- helpers used by operations --------------------------------------------------------
    def stats(self) -> dict[str, float]:
        """Cumulative counters (engine/metrics.py names) that the daemon samples for the web UI."""
        return self.counters.snapshot()

    def statfs(self):
        now = time.monotonic()
        if self._statfs is None or now - self._statfs_at > STATFS_TTL:
            may_block("statfs")  # the lock is held across catalog reads
            with self._statfs_lock:
                if self._statfs is None or now - self._statfs_at > STATFS_TTL:
                    self._statfs = self.namespace.statfs()
                    self._statfs_at = now
        return self._statfs

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.pool = ThreadPoolExecutor(self.workers, thread_name_prefix="nfs-worker")
        run = self.loop.run_in_executor
        self.exports = await run(self.pool, ExportTable, self.catalog, self.namespace)
        self.state = await run(self.pool, lambda: StateTable(
            self.catalog, self.namespace, lease_seconds=self.lease_seconds,
            grace_seconds=self.grace_seconds))
        self._server = await self.loop.create_server(lambda: RpcConnection(self), self.host,
                                                     self.port, reuse_address=True, backlog=256)
        self.port = self._server.sockets[0].getsockname()[1]
        self._housekeeper = asyncio.ensure_future(self._housekeeping())
        log.info("NFSv4.1 server listening on %s:%d", self.host, self.port)

    async def _housekeeping(self) -> None:
        period = max(1.0, min(EXPORTS_TTL, self.lease_seconds / 4))
        while True:
            await asyncio.sleep(period)
            try:
                await self.loop.run_in_executor(self.pool, self.state.expire_idle)
                await self.loop.run_in_executor(self.pool, self.exports.refresh)
            except Exception as exc:  # noqa: BLE001 - housekeeping retries next period
                # a catalog outage fails every period: one line per interval, and no traceback
                self._housekeeping_failures.log(
                    logging.ERROR, type(exc), "NFS housekeeping failed: %s", exc,
                    exc_info=not isinstance(exc, CatalogUnavailable))

    async def stop(self) -> None:
        """Stop accepting, let calls in progress finish, close connections."""
        if self._server is None:
            return
        self._server.close()
        if self._housekeeper is not None:
            self._housekeeper.cancel()
        deadline = time.monotonic() + 10
        while any(conn.in_flight for conn in self.connections) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for conn in list(self.connections):
            conn.abort()
        await self._server.wait_closed()
        self._server = None
        self.pool.shutdown(wait=True, cancel_futures=True)


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
