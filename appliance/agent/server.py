"""The drive agent's server: the only writer of its host's drives, for any number of heads.

``shingle agent --listen ADDR --drives DIR...`` serves the zone-file drives in DIR... over the
agent protocol (engine/drives/agentwire.py). Each drive has the data path's own drive writer
(engine/datapath/writers.py: one writer thread, group fsync), so fragments from every head and
connection land in one sequential stream per zone and are durable before their reply. An
APPEND names the offset its head expects (refused if the zone's pointer is elsewhere) or
``ANY_OFFSET`` (the agent appends at the pointer and answers where).

One thread per connection reads requests in order; appends are answered from the drive
writer's completion (through the connection's sender thread, so a slow head never stalls a
drive writer); reads, zone operations and reports are answered at once. A frame that breaks the
protocol gets an EPROTO reply with the reason; when its header cannot be trusted (magic,
version, a length over the limit, a body that does not arrive) the connection is closed too.
Either way the agent goes on serving its other connections and new ones."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import queue
import select
import socket
import socketserver
import threading
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

from engine.base import errors
from engine.base.ordered_lock import lock
from engine.datapath.drivestate import DriveState
from engine.datapath.writers import DriveWriters, WriteTicket
from engine.drives import agentwire as wire
from engine.drives.remote import parse_address
from engine.drives.zoned import DriveMissing, ZoneError
from engine.drives.zonefile import LABEL, ZoneFileDrive

log = logging.getLogger("shingle.agent")

LOCK = "agent.lock"  # in each drive folder, flock'ed by the agent serving it
BODY_TIMEOUT_S = 10.0  # a header promised a body: it must arrive within this (else: lying length)


class AgentDrive:
    """One drive the agent serves: its backend, its writer, the next append offset per zone."""

    def __init__(self, number: int, folder: Path):
        try:
            label = json.loads((folder / LABEL).read_text())
        except (OSError, ValueError) as exc:
            raise errors.ConfigError(
                "agent --drives", str(folder), f"a drive folder ({exc})"
            ) from None
        row = SimpleNamespace(
            id=number,
            uuid=label["uuid"],
            path=str(folder.resolve()),
            backend="zonefile",
            device=None,
            state="online",
            zone_size=label["zone_size"],
            zone_count=label["zone_count"],
            max_open_zones=label.get("max_open_zones", 0),
        )
        zones = [
            SimpleNamespace(
                id=i, idx=i, state="empty", band_class=None, write_pointer=0, opened_ns=None
            )
            for i in range(row.zone_count)
        ]
        self.uuid = row.uuid
        self.key = wire.drive_key(row.uuid)
        self._lock_file = _lock_folder(folder)
        self.state = DriveState(row, zones)
        if self.state.backend is None:
            raise errors.ConfigError(
                "agent --drives", str(folder), self.state.open_error or "a drive folder"
            )
        assert isinstance(self.state.backend, ZoneFileDrive)  # open_drive of a "zonefile" row
        self.backend: ZoneFileDrive = self.state.backend
        self.lock = lock("agent.drive")  # claims of append offsets, in arrival order
        self.next_offset: dict[int, int] = {}

    def describe(self) -> dict:
        backend = self.backend
        return {
            "uuid": self.uuid,
            "folder": str(backend.folder),
            "zone_size": backend.zone_size,
            "zone_count": backend.zone_count,
            "max_open_zones": backend.max_open_zones,
            "write_granularity": backend.write_granularity,
        }


def _lock_folder(folder: Path) -> int:
    """Take the drive folder's agent lock (held while the process lives): two agents writing one
    drive would interleave appends in its zones."""
    fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise errors.ConfigError(
            "agent --drives", str(folder), "a drive no other agent serves (another one does)"
        ) from None
    return fd


class ReplyTicket(WriteTicket):
    """An append's ticket whose completion queues its reply."""

    __slots__ = ("reply",)
    reply: Callable[[ReplyTicket], None]

    def all_written(self) -> None:
        self.written.set()
        self.reply(self)


class Agent:
    def __init__(
        self, folders: list[Path], host: str | None = None, body_timeout: float = BODY_TIMEOUT_S
    ):
        if not folders:
            raise errors.ConfigError("agent --drives", folders, "at least one drive folder")
        self.host = host or socket.gethostname()
        self.body_timeout = body_timeout
        self.drives: dict[bytes, AgentDrive] = {}
        for number, folder in enumerate(folders, 1):
            drive = AgentDrive(number, Path(folder))
            if drive.key in self.drives:
                raise errors.ConfigError("agent --drives", str(folder), "each drive once")
            self.drives[drive.key] = drive
        self.stats: dict = {}
        states = {d.state.id: d.state for d in self.drives.values()}
        self.writers = DriveWriters(states, _Stats())
        self.writers.start()

    def hello(self) -> dict:
        return {
            "host": self.host,
            "version": wire.VERSION,
            "drives": [d.describe() for d in self.drives.values()],
        }

    def close(self) -> None:
        self.writers.stop()


class _Stats(dict):
    """The writers' counters (fsync_s, fsyncs, ...): they start at zero."""

    def __missing__(self, key):
        return 0.0


class Connection:
    """One head's connection: requests read in order, replies sent by one sender thread."""

    def __init__(self, agent: Agent, sock: socket.socket, peer: str):
        self.agent = agent
        self.sock = sock
        self.peer = peer
        self.replies: queue.SimpleQueue = queue.SimpleQueue()
        self.sender = threading.Thread(
            target=self._send_replies, daemon=True, name=f"shingle-agent-send-{peer}"
        )

    def serve(self) -> None:
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # one timeout for the connection's life, set before the sender starts: settimeout also
        # switches the descriptor between blocking and not, under a sendall of the sender thread
        # (a reply cut short midway, the head then waiting out its limit on that connection)
        self.sock.settimeout(self.agent.body_timeout)
        self.sender.start()
        try:
            while self._one_request():
                pass
        finally:
            self.replies.put(None)
            self.sender.join()

    def _one_request(self) -> bool:
        """Read and handle one request; False when the connection is done."""
        try:
            # a head may stay idle as long as it likes between requests (the socket's timeout
            # then bounds the header and body of a request that began)
            select.select([self.sock], [], [])
            raw = wire.recv_exact(self.sock, wire.HEADER.size)
        except OSError:
            return False  # closed (a head going away is not an error)
        request_id = int.from_bytes(raw[8:12], "big")  # answerable even when the rest is bad
        try:
            op, _status, request_id, length = wire.parse_header(bytes(raw))
            if op & wire.REPLY:
                raise wire.ProtocolError(
                    f"a reply (operation {op & ~wire.REPLY}) sent to the agent"
                )
            limit = self.agent.body_timeout
            try:
                body = wire.recv_exact(self.sock, length) if length else b""
            except TimeoutError:
                raise wire.ProtocolError(
                    f"the frame's body of {length} bytes did not arrive within {limit:g} s"
                ) from None
        except wire.ProtocolError as exc:
            log.warning("agent: connection from %s: %s; closing it", self.peer, exc.strerror)
            self._error(0, request_id, "protocol", exc)
            return False
        except OSError:
            return False
        try:
            self._handle(op, request_id, body)
        except (OSError, errors.FsError) as exc:
            self._error(op, request_id, _kind(exc), exc)
        except Exception as exc:  # a bug: said once in the log, the connection goes on
            log.exception("agent: %s request from %s failed", wire.OP_NAMES[op], self.peer)
            self._error(op, request_id, "os", OSError(errno.EIO, f"agent internal error: {exc!r}"))
        return True

    def _handle(self, op: int, request_id: int, body) -> None:
        agent = self.agent
        if op == wire.HELLO:
            wire.split_request(op, body)
            self._reply(op, request_id, json.dumps(agent.hello()).encode())
            return
        fields, rest = wire.split_request(op, body)
        drive = agent.drives.get(bytes(fields[0]))
        if drive is None:
            raise DriveMissing(f"this agent serves no drive {wire.drive_name(fields[0])}")
        backend = drive.backend
        if op == wire.APPEND:
            self._append(op, request_id, drive, fields[1], fields[2], rest)
        elif op == wire.READ:
            _key, idx, offset, length = fields
            backend.check_idx(idx)
            if length > backend.zone_size:
                raise ZoneError(
                    f"read of {length} bytes from zone {idx}: zones hold {backend.zone_size}",
                    errno.EINVAL,
                )
            buf = bytearray(length)
            got = backend.read_into(idx, offset, [buf])
            self._reply(op, request_id, memoryview(buf)[:got])
        elif op == wire.REPORT:
            self._reply(op, request_id, _report(backend))
        elif op == wire.HEALTH:
            health = {**drive.describe(), "present": backend.present(), **backend.io_counters()}
            self._reply(op, request_id, json.dumps(health).encode())
        else:
            self._zone_op(op, request_id, drive, fields[1])

    def _zone_op(self, op: int, request_id: int, drive: AgentDrive, idx: int) -> None:
        backend = drive.backend
        backend.check_idx(idx)
        if op == wire.SYNC:
            backend.sync(idx)  # appends are durable before their reply; this covers the rest
        elif op == wire.RESET:
            with drive.lock:
                # through the writer's queue, behind the zone's appends
                self.agent.writers.reset_zones([(drive.state, idx)])
                drive.next_offset.pop(idx, None)
        elif op == wire.FINISH:
            with drive.lock:
                self.agent.writers.finish(drive.state, idx)
        elif op == wire.OPEN:
            backend.open_zone(idx)
        elif op == wire.CLOSE:
            backend.close_zone(idx)
        self._reply(op, request_id, b"")

    def _append(self, op: int, request_id: int, drive: AgentDrive, idx: int, offset: int, data):
        drive.backend.check_idx(idx)
        ticket = ReplyTicket(1)
        with drive.lock:
            expected = drive.next_offset.get(idx)
            if expected is None:
                expected = drive.backend.write_pointer(idx)
            if offset == wire.ANY_OFFSET:
                offset = expected
            elif offset != expected:
                raise ZoneError(
                    f"append to zone {idx} of drive {drive.uuid} at {offset}: its write pointer "
                    f"is {expected} (zones are append-only; another head may have written it)"
                )
            granularity = drive.backend.write_granularity
            length = -(-len(data) // granularity) * granularity
            drive.next_offset[idx] = offset + length

            def reply(done: ReplyTicket) -> None:
                if done.error is not None:
                    drive.next_offset.pop(idx, None)  # the file says where the zone ends now
                    self.replies.put((op, request_id, _kind(done.error), done.error))
                else:
                    self.replies.put((op, request_id, wire.APPEND_REPLY.pack(offset, length)))

            ticket.reply = reply
            self.agent.writers.append(drive.state, idx, offset, bytes(data), ticket)

    def _reply(self, op: int, request_id: int, body) -> None:
        self.replies.put((op, request_id, body))

    def _error(self, op: int, request_id: int, kind: str, exc: OSError) -> None:
        self.replies.put((op, request_id, kind, exc))

    def _send_replies(self) -> None:
        while True:
            item = self.replies.get()
            if item is None:
                return
            try:
                if len(item) == 3:
                    op, request_id, body = item
                    wire.send_frame(self.sock, op | wire.REPLY, request_id, body)
                else:
                    op, request_id, kind, exc = item
                    message = exc.strerror or str(exc)
                    code = exc.errno or errno.EIO
                    wire.send_frame(
                        self.sock,
                        (op or wire.HELLO) | wire.REPLY,
                        request_id,
                        wire.error_body(kind, message),
                        status=code,
                    )
            except OSError:
                # the head went away, or took no reply bytes for the body timeout: close the
                # connection so that its reader ends and the head fails what it waits for
                with contextlib.suppress(OSError):
                    self.sock.shutdown(socket.SHUT_RDWR)
                return


def _kind(exc: BaseException) -> str:
    if isinstance(exc, wire.ProtocolError):
        return "protocol"
    if isinstance(exc, DriveMissing):
        return "missing"
    if isinstance(exc, ZoneError):
        return "zone"
    return "os"


def _report(backend: ZoneFileDrive) -> bytes:
    out = bytearray()
    for zone in backend.report():
        code = wire.CONDITIONS.index(zone.condition) if zone.condition in wire.CONDITIONS else 6
        out += wire.REPORT_ENTRY.pack(zone.write_pointer, code)
    return bytes(out)


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        peer = f"{self.client_address[0]}:{self.client_address[1]}"
        Connection(self.server.agent, self.request, peer).serve()  # type: ignore[attr-defined]


class AgentServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # many heads connect at once (socketserver's default backlog is 5)

    agent: Agent  # set before serving

    def __init__(self, listen: str):
        host, port = parse_address(listen)
        super().__init__((host, port), _Handler)


def serve(
    listen: str, folders: list[Path], host: str | None = None, body_timeout: float = BODY_TIMEOUT_S
) -> None:
    """Run the agent in the foreground until SIGTERM or SIGINT."""
    import signal

    server = AgentServer(listen)  # the address first: a second agent started by mistake stops here
    try:
        agent = server.agent = Agent(folders, host, body_timeout)
    except BaseException:
        server.server_close()
        raise
    stop = threading.Event()

    def on_signal(signum, frame):
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    thread = threading.Thread(target=server.serve_forever, daemon=True, name="shingle-agent")
    thread.start()
    log.info(
        "agent %s serving %d drives on %s (pid %d)",
        agent.host,
        len(agent.drives),
        listen,
        os.getpid(),
    )
    print(f"shingle agent: serving {len(agent.drives)} drives on {listen}", flush=True)
    try:
        while not stop.wait(1.0):
            pass
    finally:
        server.shutdown()
        server.server_close()
        agent.close()
