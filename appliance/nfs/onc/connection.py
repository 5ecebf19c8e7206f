"""One asyncio protocol per TCP connection: ONC RPC record marking (RFC 5531
section 11), calls handed to the server's programs, replies written scatter-gather.

A worker sends its reply itself, straight to the socket when nothing is queued
before it: handing it back to the event loop cost about 40 us per call (waking
the loop and passing the GIL), more than the rest of a cached GETATTR. Records
larger than ``max_record_size`` close the connection; any record that does not
decode as a call is answered GARBAGE_ARGS when its xid is readable, or dropped
otherwise (invariant 7: bad bytes never crash the server).

Receive buffers grow with the bytes that have arrived, never with what a record
mark announces (appliance.nfs.onc.limits): small records are parsed in a scan
buffer that starts at ``initial_buffer`` and doubles while recvs fill it; a
fragment too big for it gets its own buffer, sized by the bytes already here
and those waiting in the kernel's receive queue (FIONREAD), so a 1 MiB WRITE
that has arrived is received in one buffer with no extra copy, and one that
trickles in grows that buffer geometrically. The connection sweep
(``check_timeouts``) closes connections that sit idle or leave a record
unfinished for too long."""

from __future__ import annotations

import array
import asyncio
import fcntl
import logging
import mmap
import os
import socket
import struct
import termios
import threading
import time

from appliance.nfs.onc.limits import SCAN_BUFFER_MAX
from appliance.nfs.onc.outgoing import OutgoingCalls
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

LAST_FRAGMENT = 0x80000000
_HDR = struct.Struct(">I")
# one line a minute for events a hostile client can repeat per connection
_limits_log = RateLimitedLog(log)  # one line a minute per limit, whatever the clients do


class RpcConnection(asyncio.BufferedProtocol):
    """One TCP connection: reassembles records, runs calls concurrently,
    writes replies scatter-gather (header + chunks with writelines).

    Request bytes held (``held_buffers`` on the loop: the scan buffer, a fragment's
    buffer, earlier fragments; ``held_in_flight``: records whose calls run) count
    against the connection's budget and the server's (``server.budget``).

    One class of about 500 lines on purpose: asyncio calls it per read (``get_buffer``,
    ``buffer_updated``) and the reassembly, the flow control that pauses reading and the call
    accounting all change the same few fields on every record; a part object between them would
    add an attribute hop per record on the server's hottest path and spread one budget's
    bookkeeping over several classes."""

    SCAN_BUFFER_MAX = SCAN_BUFFER_MAX
    MAX_IN_FLIGHT = 64

    def __init__(self, server):
        self.server = server
        self.limits = server.limits
        self.budget = server.budget
        self.max_record = self.limits.max_record_size
        self.transport = None
        self.peer = ("?", 0)
        self.rbuf = bytearray(self.limits.initial_buffer)
        self.rstart = 0
        self.rend = 0
        self.scan_full = False  # the last recv filled the scan buffer: let it grow
        self.frags: list = []  # earlier fragments of the record being assembled
        self.frags_len = 0
        # [buffer, filled, fragment length, last] while a big fragment streams in
        self.direct: list | None = None
        self.held_buffers = 0
        self.held_in_flight = 0  # under _flow_lock (workers give it back)
        self.starved = False  # waiting for budget to grow a buffer
        self.accepted = False
        # calls read and not yet answered (workers decrement it: under _flow_lock)
        self.in_flight = 0
        self.reading_paused = False
        self.writing_paused = False
        self.closed = False
        self.fd = -1
        self.last_active = time.monotonic()
        self.record_since: float | None = None  # when the unfinished record began
        self.writing_paused_since = 0.0  # replies past the high-water mark since then
        # Replies go straight to the socket from whichever thread made them, unless bytes are
        # already waiting in the transport (or on their way to it): then behind those, in order.
        self._send_lock = threading.Lock()
        self._flow_lock = threading.Lock()
        self._to_loop = 0  # replies handed to the loop, not yet in the transport
        self.state: dict = {}  # per-connection facts for the program (sessions bound, ...)
        # calls to the client over this connection (the NFSv4.1 backchannel)
        self.outgoing = self.state["outgoing"] = OutgoingCalls(self)

    # -- asyncio callbacks --------------------------------------------------------
    def connection_made(self, transport):
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = (_unmapped(peer[0]), peer[1]) if peer else ("?", 0)
        self.state["peer"] = self.peer  # the duplicate request cache's key (onc/drc.py)
        limit = self.limits.max_connections
        if len(self.server.connections) >= limit:
            _limits_log.warning(
                "max_connections",
                "connection limit reached (nfs.max_connections = %d): "
                "closing new connections, the latest from %s",
                limit,
                self.peer[0],
            )
            self.closed = True
            transport.abort()
            return
        self.accepted = True
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:  # room for a whole 1 MiB READ reply, so most sends finish in one call
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
            self.fd = sock.fileno()
        transport.set_write_buffer_limits(high=16 << 20)
        self.held_buffers = len(self.rbuf)
        self.budget.take(self.held_buffers)
        self.server.connections.add(self)

    def connection_lost(self, exc):
        with self._send_lock:  # the socket closes after this returns: no worker may be writing then
            self.closed = True
        self.outgoing.fail_all("the connection closed")
        if not self.accepted:
            return
        log.debug("connection from %s:%d closed", *self.peer)
        self.server.connections.discard(self)
        self.budget.waiting.discard(self)
        self._release(self.held_buffers)  # records in flight are given back as they finish
        self.held_buffers = 0
        self.rbuf = bytearray()
        self.direct, self.frags = None, []

    def pause_writing(self):
        self.writing_paused = True
        self.writing_paused_since = time.monotonic()
        self._update_reading()

    def resume_writing(self):
        self.writing_paused = False
        self._update_reading()

    def get_buffer(self, sizehint):
        direct = self.direct
        if direct is not None:
            buf, filled, length = direct[0], direct[1], direct[2]
            if filled == len(buf):  # reading resumed before the budget did: take a little
                self._grow_direct(min(length - filled, 64 * 1024))
                buf = direct[0]
            # a pooled buffer is longer than the fragment: never read the next record into it
            return memoryview(buf)[filled:length]
        if self.scan_full:
            self.scan_full = False
            self._grow_scan()
        if self.rend == len(self.rbuf):
            self._compact()
        return memoryview(self.rbuf)[self.rend :]

    def buffer_updated(self, nbytes):
        self.last_active = time.monotonic()
        direct = self.direct
        if direct is not None:
            direct[1] += nbytes
            buf, filled, length, last = direct
            if filled == length:
                self.direct = None
                whole = type(buf) is bytearray and len(buf) == length
                self._fragment_done(buf if whole else memoryview(buf)[:length], last)
            elif filled == len(buf):
                self._grow_direct()
        else:
            self.rend += nbytes
            full = self.rend == len(self.rbuf)
            self._scan()
            # filled by small records (not by the start of a big fragment): let it grow
            self.scan_full = full and self.direct is None
        if self.record_since is None and self._partial():
            self.record_since = self.last_active

    # -- record marking -------------------------------------------------------------
    def _partial(self) -> bool:
        """Bytes of a record that has not arrived whole are held."""
        return self.direct is not None or bool(self.frags) or self.rend > self.rstart

    def _compact(self):
        left = self.rend - self.rstart
        if self.rstart:
            self.rbuf[:left] = self.rbuf[self.rstart : self.rend]
        self.rstart, self.rend = 0, left

    def _grow_scan(self) -> None:
        """Double the scan buffer (up to SCAN_BUFFER_MAX): the client sends faster than one
        recv of it takes."""
        old = self.rbuf
        size = min(2 * len(old), self.SCAN_BUFFER_MAX)
        if size <= len(old) or not self.budget.try_take(size - len(old)):
            return
        left = self.rend - self.rstart
        self.rbuf = bytearray(size)
        self.rbuf[:left] = memoryview(old)[self.rstart : self.rend]
        self.rstart, self.rend = 0, left
        self.held_buffers += size - len(old)

    def shrink_scan(self) -> None:
        """Back to the initial scan buffer while nothing is buffered (the sweep, on a quiet
        connection)."""
        size = self.limits.initial_buffer
        if len(self.rbuf) > size and self.rend == self.rstart and not self.closed:
            self._release(len(self.rbuf) - size)
            self.held_buffers -= len(self.rbuf) - size
            self.rbuf = bytearray(size)
            self.rstart = self.rend = 0

    def _queued(self) -> int:
        """Bytes waiting in the kernel's receive queue of this socket."""
        count = array.array("i", [0])
        try:
            fcntl.ioctl(self.fd, termios.FIONREAD, count, True)
        except OSError:
            return 0
        return count[0]

    def _allow(self, n: int) -> bool:
        """Take n more request bytes from both budgets, or mark the connection starved (it
        stops reading until calls are answered or other connections give bytes back)."""
        if (
            self.held_buffers + self.held_in_flight + n <= self.limits.connection_budget
            and self.budget.try_take(n)
        ):
            return True
        if not self.starved:
            self.starved = True
            self.budget.waiting.add(self)
            self._update_reading()
        return False

    def _scan(self):
        rbuf = self.rbuf
        while not self.closed and self.rend - self.rstart >= 4:
            header = _HDR.unpack_from(rbuf, self.rstart)[0]
            last = bool(header & LAST_FRAGMENT)
            length = header & 0x7FFFFFFF
            if self.frags_len + length > self.max_record:
                _limits_log.warning(
                    "max_record_size",
                    "record of %d+ bytes from %s exceeds nfs.max_record_size "
                    "(%d): closing the connection",
                    self.frags_len + length,
                    self.peer[0],
                    self.max_record,
                )
                self.abort()
                return
            start = self.rstart + 4
            have = self.rend - start
            if have >= length:
                self.rstart = start + length
                self.held_buffers += length
                self.budget.take(length)
                self._fragment_done(bytes(rbuf[start : start + length]), last)
                continue
            if 4 + length <= len(rbuf):
                break  # it fits in the scan buffer: wait for the rest there
            queued = self._queued()
            if queued < len(rbuf) - (self.rend - self.rstart):
                break  # what has arrived still fits the scan buffer: a mark earns no buffer
            # a big fragment (a WRITE): a free buffer of the pool (counted as the whole fragment:
            # it needs no growing), else its own, as big as what has arrived
            pooled = self.server.receive_buffers.take(length)
            size = length if pooled is not None else min(length, max(have + queued, 2 * have))
            if not self._allow(size):
                return
            buf = pooled if pooled is not None else self._fragment_buffer(size, length)
            buf[:have] = memoryview(rbuf)[start : self.rend]
            self.held_buffers += size
            self.rstart = self.rend = 0
            self.direct = [buf, have, length, last]
            return
        if self.rstart == self.rend:
            self.rstart = self.rend = 0
        elif self.rstart and len(rbuf) - self.rend < len(rbuf) // 2:
            self._compact()

    def _grow_direct(self, at_least: int = 0) -> None:
        """The fragment's buffer is full and more is announced: grow it to what has arrived,
        at least doubling it (a copy of what it holds)."""
        assert self.direct is not None  # only called while a fragment is read in place
        buf, filled, length, last = self.direct
        if at_least:  # reading resumed while starved: a little, whatever the budgets say
            size = filled + at_least
            self.budget.take(size - len(buf))
        else:
            size = min(length, max(2 * len(buf), filled + self._queued()))
            if not self._allow(size - len(buf)):
                return
        grown = self._fragment_buffer(size, length)
        grown[:filled] = memoryview(buf)[:filled]
        self.held_buffers += size - len(buf)
        self.direct = [grown, filled, length, last]

    def _fragment_buffer(self, size: int, length: int) -> bytearray | mmap.mmap:
        """A fragment's own buffer. One longer than the pool's buffers (a WRITE larger than
        1 MiB, or a record a client announces and never finishes) is anonymous memory of its
        own, unmapped as soon as nothing refers to it: in the heap, where tune_malloc keeps
        freed memory for reuse, 40 connections that each held 4 MiB of an unfinished record
        left 120 MB resident after they closed. Shorter ones, the usual WRITEs when every pooled
        buffer is taken, stay in the heap (reused, no page faults)."""
        if length > self.server.receive_buffers.capacity:
            return mmap.mmap(-1, size)
        return bytearray(size)

    def retry_starved(self) -> None:
        """On the loop, once bytes were given back: retry the buffer this connection waits
        for."""
        if not self.starved or self.closed:
            return
        self.starved = False
        self.budget.waiting.discard(self)
        if self.direct is not None:
            self._grow_direct()
        else:
            self._scan()
        self._update_reading()

    def _fragment_done(self, data, last):
        if not last:
            self.frags.append(data)
            self.frags_len += len(data)
            return
        if self.frags:
            self.frags.append(data)
            data = b"".join(self.frags)
            self.frags, self.frags_len = [], 0
        self.record_since = None
        self._record(data)

    def _record(self, record):
        """One whole record: answered here on the loop, or handed to a worker. A call answered
        here keeps its bytes in ``held_buffers`` until its reply is out and takes no part in
        the in-flight count the workers share (no lock, no flow check: nothing else is read
        meanwhile); one handed over moves them to ``held_in_flight`` first."""
        size = len(record)
        try:
            outcome = self._dispatch(record)
        except Exception:  # noqa: BLE001 - a bug in one call must not take the connection's loop down
            log.exception("unexpected error handling a call from %s", self.peer[0])
            outcome = None
        del record  # the call holds it while it needs it; the count is given back at the end
        if isinstance(outcome, tuple):  # (xid, InWorker, GssReply or None)
            self.held_buffers -= size
            with self._flow_lock:
                self.in_flight += 1
                self.held_in_flight += size
            self._update_reading()
            try:
                self.server.pool.call_soon(self._run, *outcome, size)
                return
            except RuntimeError:  # the pool shut down: the server is stopping, no answer
                self._call_done(size)
                return
        if outcome is not None:
            self.send(outcome, on_loop=True)
        self.held_buffers -= size
        self._release(size)
        if self.reading_paused or self.starved:  # the bytes given back may let it read again
            self._on_loop(self._wake)

    def _run(self, xid: int, work: InWorker, gss_reply, size: int) -> None:
        """In a worker thread: the blocking part of a call, then its reply."""
        try:
            try:
                body = work.fn(*work.args)
                chunks = (
                    [success_head(xid), *body]
                    if gss_reply is None
                    else gss_reply.success(xid, body)
                )
            except RpcReject as rej:
                chunks = [rej.body if gss_reply is None else gss_reply.rejected(rej.body)]
            except AuthTooWeak as exc:
                log.debug("call from %s refused: %s", self.peer[0], exc)
                chunks = [denied_auth(xid, AUTH_TOOWEAK)]
            finally:
                if work.finished is not None:
                    work.finished()
            self.send(chunks, on_loop=False)
        except Exception:  # noqa: BLE001 - the client retransmits; the connection lives on
            log.exception("unexpected error handling a call from %s", self.peer[0])
        finally:
            work.args = ()  # the record goes now, not when the pool reuses the thread
            self._call_done(size)

    def _call_done(self, size: int) -> None:
        with self._flow_lock:
            self.in_flight -= 1
            self.held_in_flight -= size
            wake = (self.reading_paused or self.starved) and self.in_flight < self.MAX_IN_FLIGHT
        self.last_active = time.monotonic()
        self._release(size)
        if wake:
            self._on_loop(self._wake)

    def _release(self, n: int) -> None:
        """Give n bytes back to the server's budget; wake the connections waiting for it."""
        if self.budget.give(n):
            self._on_loop(wake_starved, self.budget)

    def _wake(self) -> None:
        if self.starved:
            self.retry_starved()
        else:
            self._update_reading()

    def _on_loop(self, fn, *args) -> None:
        loop = self.server.loop
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:
            pass  # the loop is closed: the server stopped

    def _update_reading(self):
        if self.transport is None or self.closed:
            return
        with self._flow_lock:
            want_pause = (
                self.writing_paused
                or self.starved
                or self.in_flight >= self.MAX_IN_FLIGHT
                or self.held_buffers + self.held_in_flight > self.limits.connection_budget
            )
        if want_pause and not self.reading_paused:
            self.reading_paused = True
            self.transport.pause_reading()
        elif not want_pause and self.reading_paused:
            self.reading_paused = False
            if self.record_since is not None:  # the server held the record up, not the client
                self.record_since = time.monotonic()
            self.transport.resume_reading()

    # -- timeouts (the server's sweep calls this on the loop) ----------------------------
    def check_timeouts(self, now: float) -> None:
        """Close the connection when a record has been arriving for longer than
        ``record_timeout``, or when it has been idle longer than its idle timeout."""
        if self.closed:
            return
        limits = self.limits
        if self.writing_paused and now - self.writing_paused_since > limits.record_timeout:
            _limits_log.warning(
                "record_timeout",
                "%s has not read its replies for %g s (nfs.record_timeout_seconds): closing the "
                "connection",
                self.peer[0],
                limits.record_timeout,
            )
            self.abort()
            return
        if self.record_since is not None:
            held_by_server = self.reading_paused and not (self.writing_paused or self.starved)
            if not held_by_server and now - self.record_since > limits.record_timeout:
                _limits_log.warning(
                    "record_incomplete",
                    "a record from %s was not complete after %g s (nfs.record_timeout_seconds): "
                    "closing the connection",
                    self.peer[0],
                    limits.record_timeout,
                )
                self.abort()
            return
        transport = self.transport
        if (
            transport is None
            or self.in_flight
            or transport.get_write_buffer_size()
            or self._to_loop
        ):
            return
        quiet = now - self.last_active
        if quiet > 1.0:
            self.shrink_scan()
        timeout = (
            limits.session_idle_timeout if self.server.holds_state(self) else limits.idle_timeout
        )
        if quiet > timeout:
            log.debug("connection from %s:%d idle for %.0f s: closing", *self.peer, quiet)
            self.abort()

    # -- calls ------------------------------------------------------------------------------
    def _dispatch(self, record):
        """The reply chunks, None (no reply), or (xid, InWorker) for a worker thread."""
        if len(record) >= 8 and _HDR.unpack_from(record, 4)[0] == REPLY:
            self.outgoing.reply(record)  # a reply to a call of ours, or a stray one: no answer
            return None
        gss = self.server.gss
        try:
            call, cred, pos = parse_call(record, gss)
        except RpcReject as rej:
            return [rej.body]
        except XdrError as exc:
            if len(record) >= 4:
                xid = _HDR.unpack_from(record, 0)[0]
                log.debug("garbage call from %s: %s", self.peer[0], exc)
                return [accepted(xid, GARBAGE_ARGS)]
            return None
        log.debug(
            "call prog %d vers %d proc %d from %s", call.prog, call.vers, call.proc, self.peer[0]
        )
        gss_reply = None
        if cred is None:  # RPCSEC_GSS (appliance/nfs/onc/gss.py)
            verdict = gss.accept(call, record, pos)
            if not isinstance(verdict, tuple):
                return verdict  # a context procedure's answer, a refusal, or None (a replay)
            cred, record, pos, gss_reply = verdict
        program = self.server.programs.get(call.prog)
        if program is None:
            return [accepted(call.xid, PROG_UNAVAIL)]
        if call.vers not in program.versions:
            return [prog_mismatch(call.xid, min(program.versions), max(program.versions))]
        try:
            body = program.call(self, call, cred, record, pos)
        except RpcReject as rej:
            return [rej.body if gss_reply is None else gss_reply.rejected(rej.body)]
        except AuthTooWeak as exc:
            log.debug("call from %s refused: %s", self.peer[0], exc)
            return [denied_auth(call.xid, AUTH_TOOWEAK)]
        if isinstance(body, InWorker):
            return call.xid, body, gss_reply
        if gss_reply is not None:
            return gss_reply.success(call.xid, body)
        return [success_head(call.xid), *body]

    def send(self, chunks, *, on_loop: bool) -> None:
        """Send one record (a reply, or a call of ``outgoing``), from the event loop or from a
        worker thread."""
        total = sum(len(ch) for ch in chunks)
        data = [_HDR.pack(LAST_FRAGMENT | total), *chunks]
        total += 4
        with self._send_lock:
            if self.closed or self.transport is None or self.transport.is_closing():
                return
            sent = 0
            if not self._to_loop and not self.transport.get_write_buffer_size():
                try:
                    sent = os.writev(self.fd, data)
                except (BlockingIOError, InterruptedError):
                    sent = 0
                except OSError:
                    sent = 0  # the transport meets the same error and closes the connection
                if sent == total:
                    return
            rest = _after(data, sent)
            if on_loop:
                self._to_transport(rest)
                return
            self._to_loop += 1
        self._on_loop(self._handed_over, rest)

    def _handed_over(self, rest) -> None:
        with self._send_lock:
            self._to_loop -= 1
            if not self.closed and self.transport is not None and not self.transport.is_closing():
                self._to_transport(rest)

    def _to_transport(self, chunks) -> None:
        """On the loop, under the send lock: the transport sends what it can and buffers the
        rest."""
        transport = self.transport
        assert transport is not None, "callers check the transport is open"
        if sum(len(ch) for ch in chunks) < 64 * 1024:
            transport.write(b"".join(chunks))
            return
        for chunk in chunks:  # Python 3.11 writelines() joins (a copy): write each chunk
            transport.write(chunk)

    def abort(self):
        self.closed = True
        if self.transport is not None:
            self.transport.close()


def _after(chunks: list, sent: int) -> list:
    """What is left of ``chunks`` once their first ``sent`` bytes are out."""
    rest = []
    for chunk in chunks:
        n = len(chunk)
        if sent >= n:
            sent -= n
            continue
        rest.append(memoryview(chunk)[sent:] if sent else chunk)
        sent = 0
    return rest


def wake_starved(budget) -> None:
    """On the loop: connections waiting for request bytes retry, while the budget lasts."""
    for conn in list(budget.waiting):
        if budget.held >= budget.limit:
            return
        conn.retry_starved()


def _unmapped(host: str) -> str:
    """An IPv4 client of a listener on ``::`` as its IPv4 address (::ffff:10.0.0.5 ->
    10.0.0.5): exports, heads, NLM callbacks and logs then see one form of each client."""
    return host[7:] if host.startswith("::ffff:") and "." in host else host
