"""One asyncio protocol per TCP connection: ONC RPC record marking (RFC 5531
section 11), calls handed to the server's programs, replies written scatter-gather.

A worker sends its reply itself, straight to the socket when nothing is queued
before it: handing it back to the event loop cost about 40 us per call (waking
the loop and passing the GIL), more than the rest of a cached GETATTR. Records
larger than ``max_record_size`` close the connection; any record that does not
decode as a call is answered GARBAGE_ARGS when its xid is readable, or dropped
otherwise (invariant 7: bad bytes never crash the server)."""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import struct
import threading

from appliance.nfs.onc.rpc import (
    GARBAGE_ARGS,
    PROG_UNAVAIL,
    REPLY,
    InWorker,
    RpcReject,
    accepted,
    parse_call,
    prog_mismatch,
    success_head,
)
from appliance.nfs.onc.xdr import XdrError

log = logging.getLogger("shingle.nfs.rpc")

LAST_FRAGMENT = 0x80000000
_HDR = struct.Struct(">I")


class RpcConnection(asyncio.BufferedProtocol):
    """One TCP connection: reassembles records, runs calls concurrently,
    writes replies scatter-gather (header + chunks with writelines)."""

    SCAN_BUFFER = 256 * 1024
    MAX_IN_FLIGHT = 64

    def __init__(self, server):
        self.server = server
        self.max_record = server.max_record_size
        self.transport = None
        self.peer = ("?", 0)
        self.rbuf = bytearray(self.SCAN_BUFFER)
        self.rstart = 0
        self.rend = 0
        self.frags: list = []  # earlier fragments of the record being assembled
        self.frags_len = 0
        self.direct = None  # (bytearray, filled, last) while a big fragment streams in
        # calls read and not yet answered (workers decrement it: under _flow_lock)
        self.in_flight = 0
        self.reading_paused = False
        self.writing_paused = False
        self.closed = False
        self.fd = -1
        # Replies go straight to the socket from whichever thread made them, unless bytes are
        # already waiting in the transport (or on their way to it): then behind those, in order.
        self._send_lock = threading.Lock()
        self._flow_lock = threading.Lock()
        self._to_loop = 0  # replies handed to the loop, not yet in the transport
        self.state = {}  # per-connection facts for the program (sessions bound, ...)

    # -- asyncio callbacks --------------------------------------------------------
    def connection_made(self, transport):
        self.transport = transport
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
        peer = transport.get_extra_info("peername")
        self.peer = (peer[0], peer[1]) if peer else ("?", 0)
        self.server.connections.add(self)

    def connection_lost(self, exc):
        log.debug("connection from %s:%d closed", *self.peer)
        with self._send_lock:  # the socket closes after this returns: no worker may be writing then
            self.closed = True
        self.server.connections.discard(self)

    def pause_writing(self):
        self.writing_paused = True
        self._update_reading()

    def resume_writing(self):
        self.writing_paused = False
        self._update_reading()

    def get_buffer(self, sizehint):
        if self.direct is not None:
            buf, filled, _ = self.direct
            return memoryview(buf)[filled:]
        if self.rend == len(self.rbuf):
            self._compact()
        return memoryview(self.rbuf)[self.rend:]

    def buffer_updated(self, nbytes):
        if self.direct is not None:
            buf, filled, last = self.direct
            filled += nbytes
            if filled < len(buf):
                self.direct = (buf, filled, last)
                return
            self.direct = None
            self._fragment_done(buf, last)
            return
        self.rend += nbytes
        self._scan()

    # -- record marking -------------------------------------------------------------
    def _compact(self):
        left = self.rend - self.rstart
        if self.rstart:
            self.rbuf[:left] = self.rbuf[self.rstart:self.rend]
        self.rstart, self.rend = 0, left

    def _scan(self):
        rbuf = self.rbuf
        while not self.closed and self.rend - self.rstart >= 4:
            header = _HDR.unpack_from(rbuf, self.rstart)[0]
            last = bool(header & LAST_FRAGMENT)
            length = header & 0x7FFFFFFF
            if self.frags_len + length > self.max_record:
                log.warning("record of %d+ bytes from %s exceeds the limit %d: closing",
                            self.frags_len + length, self.peer[0], self.max_record)
                self.abort()
                return
            start = self.rstart + 4
            have = self.rend - start
            if have >= length:
                self.rstart = start + length
                self._fragment_done(bytes(rbuf[start:start + length]), last)
                continue
            if length > len(rbuf) // 2:
                # a big fragment (a WRITE): receive straight into its own buffer
                buf = bytearray(length)
                buf[:have] = rbuf[start:self.rend]
                self.rstart = self.rend = 0
                self.direct = (buf, have, last)
                return
            break
        if self.rstart == self.rend:
            self.rstart = self.rend = 0
        elif len(self.rbuf) - self.rend < 64 * 1024:
            self._compact()

    def _fragment_done(self, data, last):
        if not last:
            self.frags.append(data)
            self.frags_len += len(data)
            return
        if self.frags:
            self.frags.append(data)
            data = b"".join(self.frags)
            self.frags, self.frags_len = [], 0
        self._record(data)

    def _record(self, record):
        with self._flow_lock:
            self.in_flight += 1
        self._update_reading()
        try:
            outcome = self._dispatch(record)
        except Exception:  # noqa: BLE001 - a bug in one call must not take the connection's loop down
            log.exception("unexpected error handling a call from %s", self.peer[0])
            outcome = None
        if isinstance(outcome, tuple):  # (xid, InWorker)
            try:
                self.server.pool.submit(self._run, *outcome)
                return
            except RuntimeError:  # the pool shut down: the server is stopping, no answer
                outcome = None
        if outcome is not None:
            self.send(outcome, on_loop=True)
        self._call_done()

    def _run(self, xid: int, work: InWorker) -> None:
        """In a worker thread: the blocking part of a call, then its reply."""
        try:
            try:
                chunks = [success_head(xid), *work.fn(*work.args)]
            except RpcReject as rej:
                chunks = [rej.body]
            finally:
                if work.finished is not None:
                    work.finished()
            self.send(chunks, on_loop=False)
        except Exception:  # noqa: BLE001 - the client retransmits; the connection lives on
            log.exception("unexpected error handling a call from %s", self.peer[0])
        finally:
            self._call_done()

    def _call_done(self) -> None:
        with self._flow_lock:
            self.in_flight -= 1
            resume = self.reading_paused and self.in_flight < self.MAX_IN_FLIGHT
        if resume:
            self._on_loop(self._update_reading)

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
            want_pause = self.writing_paused or self.in_flight >= self.MAX_IN_FLIGHT
        if want_pause and not self.reading_paused:
            self.reading_paused = True
            self.transport.pause_reading()
        elif not want_pause and self.reading_paused:
            self.reading_paused = False
            self.transport.resume_reading()

    # -- calls ------------------------------------------------------------------------------
    def _dispatch(self, record):
        """The reply chunks, None (no reply), or (xid, InWorker) for a worker thread."""
        try:
            call, cred, pos = parse_call(record)
        except RpcReject as rej:
            return [rej.body]
        except XdrError as exc:
            if len(record) >= 4:
                xid = _HDR.unpack_from(record, 0)[0]
                if len(record) >= 8 and _HDR.unpack_from(record, 4)[0] == REPLY:
                    return None  # a stray reply: nothing to answer
                log.debug("garbage call from %s: %s", self.peer[0], exc)
                return [accepted(xid, GARBAGE_ARGS)]
            return None
        log.debug("call prog %d vers %d proc %d from %s", call.prog, call.vers, call.proc,
                  self.peer[0])
        program = self.server.programs.get(call.prog)
        if program is None:
            return [accepted(call.xid, PROG_UNAVAIL)]
        if call.vers not in program.versions:
            return [prog_mismatch(call.xid, min(program.versions), max(program.versions))]
        try:
            body = program.call(self, call, cred, record, pos)
        except RpcReject as rej:
            return [rej.body]
        if isinstance(body, InWorker):
            return call.xid, body
        return [success_head(call.xid), *body]

    def send(self, chunks, *, on_loop: bool) -> None:
        """Send one reply record, from the event loop or from a worker thread."""
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
        if sum(len(ch) for ch in chunks) < 64 * 1024:
            self.transport.write(b"".join(chunks))
            return
        for chunk in chunks:  # Python 3.11 writelines() joins (a copy): write each chunk
            self.transport.write(chunk)

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
