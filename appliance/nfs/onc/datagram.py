"""ONC RPC over UDP (RFC 5531: one call per datagram, no record marking), for the programs
clients still reach over UDP: the port mapper (``rpcinfo -u``, and every GETPORT of
sm-notify), MOUNT (``showmount``, older clients' mount), NSM (SM_NOTIFY from a client that
rebooted: without it the server never frees the locks of a client that went away) and NLM (the
lock manager of a client mounted over UDP). NFS itself is not served over UDP: NFSv4 forbids
it (RFC 7530 3.1), Linux kernels since 5.6 (Debian 12's 6.1 included) are built without NFS
over UDP, and a READ reply of 32 KiB to a call of 100 bytes would make the server an
amplifier for a forged source address.

What UDP asks that TCP does not:
- A reply fits one datagram, and is never much larger than its call: at most
  ``max(AMPLIFY_MIN, AMPLIFY x the call's size)`` bytes (a forged source address must not turn
  the server into an amplifier: the portmapper DUMP reflection attacks); a bigger reply (a
  PMAP or rpcbind DUMP, an export list of many exports) is not sent and is counted: those
  tools ask over TCP.
- Calls that must not run twice (MNT, UMNT, NSM MON/UNMON/NOTIFY, NLM LOCK/UNLOCK/CANCEL/
  SHARE/UNSHARE/FREE_ALL ...) go through a duplicate request cache (appliance.nfs.onc.drc)
  keyed by client address, port and xid with a checksum of the call: a retransmit gets the
  first reply, one of a call still running is dropped (the client retransmits again).
- A datagram that is no call, or a call that does not decode, is dropped or answered
  GARBAGE_ARGS, never a traceback; RPCSEC_GSS is not taken over UDP (AUTH_TOOWEAK).
- At most ``MAX_IN_FLIGHT`` calls wait for a worker; more are dropped (retransmitted)."""

from __future__ import annotations

import asyncio
import logging
import struct
from collections import Counter

from appliance.nfs.onc import drc as onc_drc
from appliance.nfs.onc.rpc import (
    AUTH_TOOWEAK,
    GARBAGE_ARGS,
    PROG_UNAVAIL,
    REPLY,
    AuthTooWeak,
    InWorker,
    RpcReject,
    accepted,
    denied_auth,
    parse_call,
    prog_mismatch,
    success_head,
)
from appliance.nfs.onc.xdr import XdrError
from engine.base.ratelog import RateLimitedLog

log = logging.getLogger("shingle.nfs.rpc")
_failures = RateLimitedLog(log)

_U32 = struct.Struct(">I")
MAX_DATAGRAM = 65507  # the most a UDP datagram over IPv4 carries
AMPLIFY = 2  # a reply is at most this many times its call ...
AMPLIFY_MIN = 256  # ... or this many bytes (a MNT reply's file handle, a GETADDR's address)
MAX_IN_FLIGHT = 64


class DatagramSockets:
    """The UDP sockets a server answers on, with the duplicate request cache they share."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.sockets: list[tuple[asyncio.DatagramTransport, RpcDatagram]] = []
        self.cache = onc_drc.DuplicateRequestCache()

    def ports(self) -> list[tuple[int, tuple[int, ...]]]:
        """(port, program numbers) of each socket."""
        return [(proto.port, tuple(proto.programs)) for _t, proto in self.sockets]

    def counts(self) -> Counter:
        total: Counter = Counter()
        for _t, proto in self.sockets:
            total.update(proto.counts)
        return total

    def close(self) -> None:
        for transport, _proto in self.sockets:
            transport.close()
        self.sockets = []


class DatagramPeer:
    """What a program sees of the caller of a datagram (the ``conn`` of a TCP call)."""

    __slots__ = ("server", "peer", "state", "transport")

    def __init__(self, server, peer, transport):
        self.server, self.peer, self.transport = server, peer, transport
        self.state: dict = {"peer": peer}


class RpcDatagram(asyncio.DatagramProtocol):
    """One UDP socket's calls. ``programs``: program number -> the program object (only those
    served over UDP); ``idempotent``: (program, procedure) pairs that may run twice (the rest
    go through the duplicate request cache)."""

    def __init__(self, server, programs: dict, idempotent: frozenset, cache=None):
        self.server = server
        self.programs = programs
        self.idempotent = idempotent
        self.cache = cache if cache is not None else onc_drc.DuplicateRequestCache()
        self.transport: asyncio.DatagramTransport | None = None
        self.port = 0  # the socket's, once bound
        self.in_flight = 0
        # calls: datagrams that were calls; dropped: not calls, too short, over the in-flight
        # limit or retransmits of a call still running; too_big: replies past the
        # amplification bound or a datagram; replayed: retransmits answered from the cache
        self.counts: Counter = Counter()

    def connection_made(self, transport):
        self.transport = transport

    def error_received(self, exc):  # an ICMP error for an earlier reply: the client went away
        log.debug("UDP error: %s", exc)

    def datagram_received(self, data, addr):
        try:
            self._call(data, addr)
        except Exception:  # noqa: BLE001 - one datagram must not stop the socket
            self._failed(addr)

    def _failed(self, addr) -> None:
        """A bug met by a call: counted, its traceback logged once a minute."""
        self.counts["failed"] += 1
        _failures.log(logging.ERROR, "udp", "UDP call from %s failed", addr[0], exc_info=True)

    def _call(self, data: bytes, addr) -> None:
        """``addr``: where the datagram came from and the reply goes (as the socket gives it)."""
        if len(data) < 8 or _U32.unpack_from(data, 4)[0] == REPLY:
            self.counts["dropped"] += 1
            return
        size = len(data)
        self.counts["calls"] += 1
        try:
            call, cred, pos = parse_call(data, None)
        except RpcReject as rej:
            self._send([rej.body], size, addr)
            return
        except XdrError:
            self._send([accepted(_U32.unpack_from(data, 0)[0], GARBAGE_ARGS)], size, addr)
            return
        if cred is None:  # (parse_call takes no RPCSEC_GSS without a GSS service)
            self._send([denied_auth(call.xid, AUTH_TOOWEAK)], size, addr)
            return
        program = self.programs.get(call.prog)
        if program is None:
            self._send([accepted(call.xid, PROG_UNAVAIL)], size, addr)
            return
        if call.vers not in program.versions:
            low, high = min(program.versions), max(program.versions)
            self._send([prog_mismatch(call.xid, low, high)], size, addr)
            return
        peer = (_unmapped(addr[0]), addr[1])  # what programs and the cache see
        entry = None
        if (call.prog, call.proc) not in self.idempotent:
            key = (peer[0], peer[1], call.xid)
            entry, replay = self.cache.begin(key, onc_drc.checksum(data, pos, cred), wait=0)
            if entry is None:
                self.counts["replayed" if replay is not None else "dropped"] += 1
                if replay is not None:
                    self._send(replay, size, addr)
                return
        if isinstance(outcome := self._answer(program, call, cred, data, pos, peer), InWorker):
            if self.in_flight >= MAX_IN_FLIGHT:
                self.counts["dropped"] += 1
                if entry is not None:
                    self.cache.finish(entry, None)
                return
            self.in_flight += 1
            try:
                self.server.pool.call_soon(self._run, call.xid, outcome, entry, size, addr)
            except RuntimeError:  # the pool shut down: the server is stopping
                self.in_flight -= 1
            return
        self._finish(outcome, entry, size, addr)

    def _answer(self, program, call, cred, data, pos, peer):
        """The reply chunks, or an InWorker to run in a worker."""
        try:
            caller = DatagramPeer(self.server, peer, self.transport)
            body = program.call(caller, call, cred, data, pos)
        except RpcReject as rej:
            return [rej.body]
        except AuthTooWeak:
            return [denied_auth(call.xid, AUTH_TOOWEAK)]
        if isinstance(body, InWorker):
            return body
        return [success_head(call.xid), *body]

    def _run(self, xid: int, work: InWorker, entry, size: int, addr) -> None:
        """In a worker thread: the blocking part of a call; the reply goes back to the loop."""
        chunks = None
        try:
            try:
                chunks = [success_head(xid), *work.fn(*work.args)]
            except RpcReject as rej:
                chunks = [rej.body]
            except AuthTooWeak:
                chunks = [denied_auth(xid, AUTH_TOOWEAK)]
            finally:
                if work.finished is not None:
                    work.finished()
        except Exception:  # noqa: BLE001 - the client retransmits
            self._failed(addr)
        finally:
            work.args = ()
        try:
            self.server.loop.call_soon_threadsafe(self._done, chunks, entry, size, addr)
        except RuntimeError:  # the loop closed: the server stopped
            pass

    def _done(self, chunks, entry, size: int, addr) -> None:
        self.in_flight -= 1
        if chunks is None:
            if entry is not None:
                self.cache.finish(entry, None)
            return
        self._finish(chunks, entry, size, addr)

    def _finish(self, chunks: list, entry, size: int, addr) -> None:
        sent = self._send(chunks, size, addr)
        if entry is not None:  # a reply not sent is not kept: the retransmit runs again
            self.cache.finish(entry, chunks if sent else None)

    def _send(self, chunks: list, size: int, addr) -> bool:
        """Send a reply to a call of ``size`` bytes, unless it passes the amplification bound
        or a datagram."""
        reply = b"".join(chunks)
        if len(reply) > min(MAX_DATAGRAM, max(AMPLIFY_MIN, AMPLIFY * size)):
            self.counts["too_big"] += 1
            log.debug("UDP reply of %d bytes to %d from %s: not sent", len(reply), size, addr[0])
            return False
        transport = self.transport
        if transport is None or transport.is_closing():
            return False
        transport.sendto(reply, addr)
        return True


def _unmapped(host: str) -> str:
    return host[7:] if host.startswith("::ffff:") and "." in host else host
