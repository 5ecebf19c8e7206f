"""Calls this server makes to a client over the client's own connection (the NFSv4.1
backchannel, RFC 8881 2.10.3.1): the call goes out as a record on the connection the client
opened, and the client's reply comes back on it among the client's own calls; the connection
hands every REPLY record here, matched to its call by xid.

``OutgoingCalls.call`` returns a ``concurrent.futures.Future`` whose result is the reply's
procedure results (the bytes after an accepted SUCCESS header) or a ``CallFailed``. Calls in
flight are bounded (``MAX_PENDING``); the connection's end fails every call still waiting.
A call goes under AUTH_NONE or AUTH_SYS, or under RPCSEC_GSS with a context the client made
(``GssCallback``: its verifier signs the header, its reply's verifier and results are checked)."""

from __future__ import annotations

import asyncio
import os
import struct
import threading
from concurrent.futures import Future

from appliance.nfs.onc.gss import GssCallback, GssOutgoingCall
from appliance.nfs.onc.rpc import CALL, MSG_ACCEPTED, REPLY, RPC_VERSION, RPCSEC_GSS, SUCCESS

MAX_PENDING = 64  # calls a client may leave unanswered on one connection
_CALL_HEAD = struct.Struct(">IIIIII")  # xid, CALL, rpcvers, prog, vers, proc
_U32 = struct.Struct(">I")


class CallFailed(Exception):
    """An outgoing call got no usable reply: the connection went, the client refused it, or
    too many were in flight."""


class OutgoingCalls:
    def __init__(self, conn):
        self.conn = conn  # RpcConnection: its send() writes the call record
        self.lock = threading.Lock()
        self.pending: dict[int, tuple[Future, GssOutgoingCall | None]] = {}
        self.next_xid = int.from_bytes(os.urandom(4), "big")
        self.closed = False

    def usable(self) -> bool:
        return not self.closed and not self.conn.closed

    def call(
        self, prog: int, vers: int, proc: int, cred: tuple[int, bytes] | GssCallback, body: bytes
    ) -> Future:
        """Send one call. ``cred``: flavour and credential body (the verifier is AUTH_NONE), or
        the client's GSS context to call under."""
        fut: Future = Future()
        with self.lock:
            if not self.usable():
                fut.set_exception(CallFailed("the connection is closed"))
                return fut
            if len(self.pending) >= MAX_PENDING:
                fut.set_exception(CallFailed(f"{MAX_PENDING} calls already wait for replies"))
                return fut
            self.next_xid = (self.next_xid + 1) & 0xFFFFFFFF
            xid = self.next_xid
            self.pending[xid] = (fut, None)
        call_head = _CALL_HEAD.pack(xid, CALL, RPC_VERSION, prog, vers, proc)
        if isinstance(cred, GssCallback):
            try:
                head, body, gss = cred.prepare(
                    body, lambda gss_cred: call_head + _auth(RPCSEC_GSS, gss_cred)
                )
            except ValueError as exc:
                with self.lock:
                    mine = self.pending.pop(xid, None) is not None
                if mine:  # else the connection's end failed it already
                    fut.set_exception(CallFailed(str(exc)))
                return fut
            with self.lock:
                if xid in self.pending:  # else the connection ended and failed it meanwhile
                    self.pending[xid] = (fut, gss)
        else:
            head = call_head + _auth(*cred) + b"\0" * 8  # an AUTH_NONE verifier
        self.conn.send([head, body], on_loop=_on_loop(self.conn.server.loop))
        return fut

    def reply(self, record) -> bool:
        """A REPLY record arrived: resolve its call. False when no call of ours has its xid."""
        xid = _U32.unpack_from(record, 0)[0]
        with self.lock:
            fut, gss = self.pending.pop(xid, (None, None))
        if fut is None:
            return False
        try:
            flavor, verf, results = _results(record)
            if gss is not None:
                try:
                    results = gss.results(flavor, verf, results)
                except ValueError as exc:
                    raise CallFailed(f"RPCSEC_GSS: {exc}") from None
            fut.set_result(results)
        except CallFailed as exc:
            fut.set_exception(exc)
        return True

    def fail_all(self, why: str) -> None:
        with self.lock:
            self.closed = True
            waiting, self.pending = [fut for fut, _ in self.pending.values()], {}
        for fut in waiting:
            fut.set_exception(CallFailed(why))


def _auth(flavor: int, body: bytes) -> bytes:
    """An opaque_auth: flavour, length, body, padding."""
    return struct.pack(">II", flavor, len(body)) + body + b"\0" * (-len(body) % 4)


def _on_loop(loop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def _results(record) -> tuple[int, bytes, bytes]:
    """The verifier (flavour, body) and the procedure results of an accepted SUCCESS reply
    (RFC 5531 9)."""
    try:
        mtype, stat = struct.unpack_from(">II", record, 4)
        if mtype != REPLY or stat != MSG_ACCEPTED:
            raise CallFailed(f"reply type {mtype}, reply_stat {stat}: the call was denied")
        vflavor, vlen = struct.unpack_from(">II", record, 12)
        pos = 20 + vlen + (-vlen % 4)
        accept = _U32.unpack_from(record, pos)[0]
    except struct.error:
        raise CallFailed("a reply too short for its header") from None
    if accept != SUCCESS:
        raise CallFailed(f"accept_stat {accept}")
    return vflavor, bytes(record[20 : 20 + vlen]), bytes(record[pos + 4 :])
