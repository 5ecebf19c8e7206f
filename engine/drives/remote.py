"""A drive served by a drive agent on another host (appliance/agent/), shaped as a local drive.

The data path uses a ``RemoteDrive`` exactly like a ``ZoneFileDrive``: its drive writer appends
in order, its syncer waits, the reader reads fragments. Underneath, each call is a request of
the agent protocol (engine/drives/agentwire.py) over TCP:
- appends go down one connection without waiting (the agent answers each once it is durable),
  and ``sync`` waits for the answers of the zone's appends so far: a drive's writer keeps
  sending while the agent fsyncs, as a local writer keeps appending while its syncer runs;
- reads go over a few connections of their own, so they never queue behind appends;
- every request has a time limit; a connection that fails or times out is closed, every
  request on it fails with ENODEV, and the next call connects again (not within RECONNECT_S
  of a failed attempt's end: calls meanwhile fail at once). A drive whose agent cannot be
  reached is not ``present``: the data path takes it as missing (drivewatch.py) and reads
  decode from the other fragments."""

from __future__ import annotations

import errno
import json
import socket
import threading
import time

from engine.base.errors import ConfigError
from engine.base.ordered_lock import lock
from engine.drives import agentwire as wire
from engine.drives.zoned import DriveMissing, ZonedDrive, ZoneError, ZoneInfo

CONNECT_TIMEOUT_S = 2.0
REQUEST_TIMEOUT_S = 30.0  # an fsync of a busy disk may take seconds; a dead link is cut here
RECONNECT_S = 0.5
# an idle connection is probed after 5 s of silence, then every 2 s; 3 unanswered: it is lost
KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_PROBES = 5, 2, 3
KEEPALIVE_S = KEEPALIVE_IDLE_S + KEEPALIVE_INTERVAL_S * KEEPALIVE_PROBES
READ_CONNECTIONS = 4


def parse_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[V6]:PORT`` for IPv6) as a socket address; ConfigError otherwise."""
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError("agent address", address, "HOST:PORT with a port 1-65535")
    return host, int(port)


class Pending:
    """A request sent, its reply not yet read."""

    __slots__ = ("done", "frame", "error", "connection")

    def __init__(self, connection: AgentConnection):
        self.done = threading.Event()
        self.frame: wire.Frame | None = None
        self.error: OSError | None = None
        self.connection = connection

    def wait(self, timeout: float) -> wire.Frame:
        if not self.done.wait(timeout):
            self.connection.fail(f"no reply within {timeout:g} s")  # fails this one too
        if self.error is not None:
            raise self.error
        assert self.frame is not None
        return self.frame


class AgentConnection:
    """One TCP connection to an agent: requests go out with ids, a thread reads the replies."""

    def __init__(self, address: tuple[str, int], label: str):
        self.label = label
        try:
            self.sock = socket.create_connection(address, timeout=CONNECT_TIMEOUT_S)
        except OSError as exc:
            raise OSError(errno.ENODEV, f"agent {label} unreachable: {exc}") from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # a host that vanishes while idle (power, link) sends no RST and nothing is asked of it:
        # keepalive probes fail the reader within KEEPALIVE_S, and the drive is not present
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_IDLE_S)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE_INTERVAL_S)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEPALIVE_PROBES)
        self.sock.settimeout(None)  # the reader waits for replies; requests have their own limit
        self._lock = lock("drives.remote_connection")
        self._send_lock = lock("drives.remote_send")
        self._pending: dict[int, Pending] = {}
        self._next_id = 0
        self.error: OSError | None = None
        self._reader = threading.Thread(
            target=self._read_replies, daemon=True, name=f"shingle-agent-{label}"
        )
        self._reader.start()

    @property
    def alive(self) -> bool:
        return self.error is None

    def request(self, op: int, *parts) -> Pending:
        pending = Pending(self)
        with self._lock:
            if self.error is not None:
                raise self.error
            self._next_id = (self._next_id + 1) & 0xFFFFFFFF
            request_id = self._next_id
            self._pending[request_id] = pending
        try:
            with self._send_lock:
                wire.send_frame(self.sock, op, request_id, *parts)
        except OSError as exc:
            raise self.fail(f"send failed: {exc}") from None
        return pending

    def call(self, op: int, *parts, timeout: float = REQUEST_TIMEOUT_S) -> wire.Frame:
        return self.request(op, *parts).wait(timeout)

    def _read_replies(self) -> None:
        try:
            while True:
                frame = wire.read_frame(self.sock)
                if not frame.op & wire.REPLY:
                    raise wire.ProtocolError(f"a request (operation {frame.op}) where a reply goes")
                with self._lock:
                    pending = self._pending.pop(frame.request_id, None)
                if pending is None:
                    continue  # a reply to a request already failed by its time limit
                pending.frame = frame
                pending.done.set()
        except OSError as exc:  # ConnectionError, ProtocolError, a closed socket
            self.fail(f"connection lost: {exc}")

    def fail(self, why: str) -> OSError:
        """Close the connection; its requests, and any later, fail with ENODEV (returned)."""
        with self._lock:
            if self.error is None:
                self.error = OSError(errno.ENODEV, f"agent {self.label}: {why}")
            error, pending = self.error, list(self._pending.values())
            self._pending.clear()
        for item in pending:
            item.error = error
            item.done.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        return error

    def close(self) -> None:
        self.fail("closed")


def hello(address: str) -> dict:
    """What the agent at ``address`` serves: {"host", "version", "drives": [{uuid, ...}]}."""
    conn = AgentConnection(parse_address(address), address)
    try:
        frame = conn.call(wire.HELLO, timeout=CONNECT_TIMEOUT_S * 5)
        check_reply(frame, address)
        return json.loads(bytes(frame.body))
    finally:
        conn.close()


def check_reply(frame: wire.Frame, label: str) -> None:
    """Raise what an error reply says (a zone error, a missing drive, another errno)."""
    if frame.status == 0:
        return
    kind, message = wire.parse_error(frame.status, frame.body)
    message = f"agent {label}: {message}"
    if kind == "zone":
        raise ZoneError(message, frame.status)
    if kind == "missing":
        raise DriveMissing(message)
    if kind == "protocol":
        raise wire.ProtocolError(message)
    raise OSError(frame.status, message)


class RemoteDrive(ZonedDrive):
    def __init__(
        self,
        address: str,
        uuid: str,
        zone_size: int,
        zone_count: int,
        *,
        max_open_zones: int = 0,
        timeout: float | None = None,
    ):
        self.address = address
        self._sockaddr = parse_address(address)
        self.uuid = uuid
        self._key = wire.drive_key(uuid)
        self.zone_size = zone_size
        self.zone_count = zone_count
        self.max_open_zones = max_open_zones
        self.timeout = REQUEST_TIMEOUT_S if timeout is None else timeout
        self.label = f"{address} drive {uuid}"
        self._lock = lock("drives.remote")
        self._writes: AgentConnection | None = None
        self._reads: list[AgentConnection] = []
        self._next_read = 0
        self._tried_at = 0.0
        self._last_error: OSError | None = None
        self._reconnecting = False
        self._unsynced: dict[int, list[Pending]] = {}
        self._report: list[ZoneInfo] | None = None
        self._closed = False
        try:
            self._connect_writes()  # says now whether the agent serves this drive
        except DriveMissing:
            raise
        except OSError:
            pass  # not reachable now: the drive is not present until it is

    # -- connections ------------------------------------------------------------------------
    def _connect_writes(self) -> AgentConnection:
        """The append connection, connected (and the drive checked) again when it was lost."""
        with self._lock:
            conn = self._writes
            if conn is not None and conn.alive:
                return conn
            if self._closed:
                raise OSError(errno.ENODEV, f"agent {self.label}: the drive was closed")
            now = time.monotonic()
            if now - self._tried_at < RECONNECT_S and self._last_error is not None:
                raise self._last_error  # a dead agent is not asked again on every call
            self._tried_at = now
            try:
                conn = AgentConnection(self._sockaddr, self.address)
            except OSError as exc:
                # the pause runs from the failure: a host whose link is down answers no SYN,
                # and each connect waits CONNECT_TIMEOUT_S, longer than the pause; counted from
                # the attempt's start, every fragment queued for the drive paid a connect
                self._tried_at, self._last_error = time.monotonic(), exc
                raise
            try:
                frame = conn.call(wire.HEALTH, self._key, timeout=self.timeout)
                check_reply(frame, self.address)
                health = json.loads(bytes(frame.body))
            except BaseException as exc:
                conn.close()
                self._tried_at = time.monotonic()
                self._last_error = exc if isinstance(exc, OSError) else None
                raise
            if health.get("zone_size") != self.zone_size or (
                health.get("zone_count") != self.zone_count
            ):
                conn.close()
                raise DriveMissing(
                    f"agent {self.label} serves zones of {health.get('zone_size')} bytes x "
                    f"{health.get('zone_count')}, expected {self.zone_size} x {self.zone_count}"
                )
            self.write_granularity = int(health.get("write_granularity", 1)) or 1
            self._writes, self._last_error = conn, None
            return conn

    def _read_connection(self) -> AgentConnection:
        with self._lock:
            self._reads = [c for c in self._reads if c.alive]
            if len(self._reads) >= READ_CONNECTIONS:
                self._next_read += 1
                return self._reads[self._next_read % len(self._reads)]
        self._connect_writes()  # checks the agent serves the drive (and rate-limits retries)
        conn = AgentConnection(self._sockaddr, self.address)
        with self._lock:
            self._reads.append(conn)
        return conn

    def _call(self, op: int, *parts) -> wire.Frame:
        frame = self._connect_writes().call(op, *parts, timeout=self.timeout)
        check_reply(frame, self.address)
        return frame

    def present(self) -> bool:
        """Whether the agent answers now. Never waits for a connect (callers hold the space
        lock, or run on the NFS event loop): a lost connection is tried again in a thread of
        its own, and a later look sees the result."""
        conn = self._writes
        if conn is not None and conn.alive:
            return True
        # a connect under way holds the lock (a hung agent: up to the time limit): not present
        if self._reconnecting or not self._lock.acquire(blocking=False):
            return False
        try:
            if self._closed or time.monotonic() - self._tried_at < RECONNECT_S:
                return False
            self._reconnecting = True
        finally:
            self._lock.release()
        threading.Thread(
            target=self._reconnect, daemon=True, name=f"shingle-agent-connect-{self.address}"
        ).start()
        return False

    def _reconnect(self) -> None:
        try:
            self._connect_writes()
        except OSError:
            pass  # still away: the next look tries again
        finally:
            self._reconnecting = False

    # -- I/O ------------------------------------------------------------------------------------
    def append(self, idx: int, offset: int, data, durable: bool = False) -> None:
        """Send the append; it is durable once its reply came (``durable``: wait for that now,
        else ``sync`` waits)."""
        self.check_idx(idx)
        self._report = None
        fixed = wire.APPEND_FIXED.pack(self._key, idx, offset)
        try:
            pending = self._connect_writes().request(wire.APPEND, fixed, data)
        except OSError:
            self.write_errors += 1
            raise
        self.bytes_written += len(data)
        if durable:
            self._finish_append(pending, idx, offset)
        else:
            with self._lock:
                self._unsynced.setdefault(idx, []).append(pending)

    def _finish_append(self, pending: Pending, idx: int, offset: int) -> None:
        try:
            frame = pending.wait(self.timeout)
            check_reply(frame, self.address)
            if len(frame.body) != wire.APPEND_REPLY.size:
                raise wire.ProtocolError(f"append reply of {len(frame.body)} bytes")
            at, _length = wire.APPEND_REPLY.unpack(frame.body)
            if offset != wire.ANY_OFFSET and at != offset:
                raise ZoneError(
                    f"agent {self.label} appended zone {idx} at {at}, asked for {offset}"
                )
        except OSError as exc:
            self.write_errors += 1
            if exc.errno == errno.ENODEV:
                self._lose_agent()
            raise

    def _lose_agent(self) -> None:
        """One connection failed or timed out: take the agent as lost (every connection closed,
        the drive not present) rather than let each later request wait out its own limit."""
        # no lock: a connect under way holds it, and the connections' own locks suffice
        for conn in [self._writes, *list(self._reads)]:
            if conn is not None:
                conn.fail("another connection to the agent failed")

    def sync(self, idx: int) -> None:
        """Wait for the replies of the zone's appends sent so far (each is durable when
        answered)."""
        with self._lock:
            waiting = self._unsynced.pop(idx, [])
        error: OSError | None = None
        for pending in waiting:
            try:
                self._finish_append(pending, idx, wire.ANY_OFFSET)
            except OSError as exc:
                error = error or exc
        if error is not None:
            raise error

    def read_into(self, idx: int, offset: int, buffers: list) -> int:
        self.check_idx(idx)
        want = sum(len(b) for b in buffers)
        try:
            conn = self._read_connection()
            frame = conn.call(
                wire.READ, wire.READ_FIXED.pack(self._key, idx, offset, want), timeout=self.timeout
            )
            check_reply(frame, self.address)
        except OSError as exc:
            self.read_errors += 1
            if exc.errno == errno.ENODEV:
                self._lose_agent()
            raise
        body = memoryview(frame.body)
        got = 0
        for buf in buffers:
            part = body[got : got + len(buf)]
            memoryview(buf)[: len(part)] = part
            got += len(part)
        self.bytes_read += got
        return got

    def report(self) -> list[ZoneInfo]:
        report = self._report
        if report is not None:
            return report
        frame = self._call(wire.REPORT, self._key)
        body = frame.body
        size = wire.REPORT_ENTRY.size
        if len(body) != size * self.zone_count:
            raise wire.ProtocolError(
                f"agent {self.label}: zone report of {len(body)} bytes for {self.zone_count} zones"
            )
        zones = []
        for i in range(self.zone_count):
            wp, cond = wire.REPORT_ENTRY.unpack_from(body, i * size)
            condition = wire.CONDITIONS[cond] if cond < len(wire.CONDITIONS) else "offline"
            zones.append(ZoneInfo(i, i * self.zone_size, self.zone_size, wp, condition))
        self._report = zones
        return zones

    def write_pointer(self, idx: int) -> int:
        """From one zone report for all zones (recovery asks zone after zone); any change made
        through this drive drops it."""
        self.check_idx(idx)
        return self.report()[idx].write_pointer

    def reset(self, idx: int) -> None:
        self._report = None
        self._call(wire.RESET, wire.DRIVE_ZONE.pack(self._key, idx))

    def open_zone(self, idx: int) -> None:
        self._report = None
        self._call(wire.OPEN, wire.DRIVE_ZONE.pack(self._key, idx))

    def close_zone(self, idx: int) -> None:
        self._report = None
        self._call(wire.CLOSE, wire.DRIVE_ZONE.pack(self._key, idx))

    def finish_zone(self, idx: int) -> None:
        self._report = None
        self._call(wire.FINISH, wire.DRIVE_ZONE.pack(self._key, idx))

    def health(self) -> dict:
        """The agent's view of the drive: present, its I/O counters, its geometry."""
        return json.loads(bytes(self._call(wire.HEALTH, self._key).body))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns = [c for c in [self._writes, *self._reads] if c is not None]
            self._writes, self._reads = None, []
        for conn in conns:
            conn.close()
