"""Connections handed from one listener to several head processes (`shingle serve --heads N`,
appliance/heads.py, docs/heads.md).

The listener accepts every TCP connection of the NFS port (and of the port mapper's) and passes
its descriptor (SCM_RIGHTS) over a SOCK_SEQPACKET pair to the head ``head_for`` picks from the
client's address: every connection of one client host reaches the same head, whose NFSv4 state
(client records, sessions, opens, locks) and NLM locks then live in one process, also after the
client reconnects or the head restarts under the same index. One message per descriptor; a
head says ``READY`` once it serves, and ``TAKEN`` for each descriptor it received, before it
reads from it: until then the listener keeps its own copy open, so a connection sent to a head
that dies before it took it (a SIGKILL races the send) goes to the head's next instance
instead of being reset.

``HandedListener`` is the head's side: it stands in for the asyncio.Server a head would
otherwise listen with."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Callable

log = logging.getLogger("shingle.nfs.handoff")

CONNECTION = b"C"  # listener -> head: one accepted connection's descriptor rides with it
READY = b"R"  # head -> listener: serving; hand connections over
TAKEN = b"T"  # head -> listener: the oldest connection not yet taken is this head's now
MAX_FDS = 16  # descriptors taken per receive (the listener sends one per message)


def head_for(address: str, count: int) -> int:
    """The head (0 to count - 1) that serves the client at ``address``: its number modulo
    ``count``, so consecutive addresses go round the heads and an admin can tell which one
    serves a host. An IPv4 address mapped into IPv6 counts as the IPv4 one."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return 0  # a Unix socket or an unparsable peer: head 0
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return int(ip) % count


def channel_pair() -> tuple[socket.socket, socket.socket]:
    """(the listener's end, the head's end): message boundaries kept, one descriptor each."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


def hand_over(channel: socket.socket, conn: socket.socket) -> None:
    """Pass ``conn`` to the head at the other end of ``channel``; the caller closes its copy.
    OSError (BlockingIOError when the head's queue is full, BrokenPipeError when it died)
    leaves ``conn`` with the caller."""
    socket.send_fds(channel, [CONNECTION], [conn.fileno()])


class HandedListener:
    """A head's listener: connections arrive over ``channel`` instead of from accept().
    ``on_gone`` runs (in the event loop) when the listener's end closes: its process is gone,
    and so is every way for clients to reach this head."""

    def __init__(
        self,
        channel: socket.socket,
        protocol_factory: Callable[[], asyncio.BaseProtocol],
        on_gone: Callable[[], None],
    ):
        self.channel = channel
        self.protocol_factory = protocol_factory
        self.on_gone = on_gone
        self.loop: asyncio.AbstractEventLoop | None = None
        self.pending: set[asyncio.Future] = set()
        self.closed = False

    def start(self) -> None:
        loop = self.loop = asyncio.get_running_loop()
        self.channel.setblocking(False)
        loop.add_reader(self.channel.fileno(), self._receive)

    def ready(self) -> None:
        """Tell the listener this head serves (it queues connections until then)."""
        self.channel.send(READY)

    def _receive(self) -> None:
        try:
            msg, fds, _flags, _addr = socket.recv_fds(self.channel, 16, MAX_FDS)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            log.error("connection hand-off channel failed: %s", exc)
            msg, fds = b"", []
        for fd in fds:
            sock = socket.socket(fileno=fd)
            if msg != CONNECTION or self.closed:
                sock.close()  # not taken: the listener gives it to the next instance
                continue
            try:
                self.channel.send(TAKEN)
            except OSError:
                sock.close()  # the listener is gone, and the client's other end with it
                continue
            self._accept(sock)
        if not msg:
            self.close()
            self.on_gone()

    def _accept(self, sock: socket.socket) -> None:
        assert self.loop is not None  # start() ran
        sock.setblocking(False)
        task = asyncio.ensure_future(self.loop.connect_accepted_socket(self.protocol_factory, sock))
        self.pending.add(task)
        task.add_done_callback(self._accepted)

    def _accepted(self, task: asyncio.Future) -> None:
        self.pending.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("a handed-over connection could not be served: %s", task.exception())

    def close(self) -> None:
        """Take no more connections (those already served go on until the server closes them)."""
        if self.closed:
            return
        self.closed = True
        if self.loop is not None:
            self.loop.remove_reader(self.channel.fileno())
        self.channel.close()

    async def wait_closed(self) -> None:
        if self.pending:
            await asyncio.gather(*self.pending, return_exceptions=True)
