"""The NFSv4.0 callback path of one client (RFC 7530 3.3.1, 10.2.1, 16.33): the client names a
program and an address (``cb_client4``: netid "tcp" or "tcp6", a universal address) in
SETCLIENTID, and this server connects there as an RPC client. After SETCLIENTID_CONFIRM it
probes the path with CB_NULL; only a path that answered carries delegations, and a CB_RECALL
is a CB_COMPOUND of minor version 0 naming the client's ``callback_ident``.

Calls go over one TCP connection this server opens (``OutgoingCalls`` matches the replies by
xid, as on an NFSv4.1 backchannel); a connection the client closed is opened again for the
next call. Connecting and sending run in threads of their own: a recall is started under the
state lock and must not wait for a slow or unreachable client. Credentials are AUTH_SYS
(the Linux client takes CB_COMPOUND in no other flavour but RPCSEC_GSS, which this server
cannot send: a client that set its id up under Kerberos gets no callback path)."""

from __future__ import annotations

import ipaddress
import logging
import socket
import struct
import threading
import time
from concurrent.futures import Future

from appliance.nfs.onc.outgoing import CallFailed, OutgoingCalls
from appliance.nfs.onc.rpc import REPLY
from appliance.nfs.onc.xdr import Packer, UInt, XdrError
from appliance.nfs.v4 import const as c
from appliance.nfs.v4 import types as t
from appliance.nfs.v4.backchannel import (
    CB_COMPOUND,
    CB_NULL,
    NFS_CB_VERSION,
    CallbackFuture,
    CB_COMPOUND4args_head,
    getattr_answer,
    getattr_op,
    recall_op,
)

log = logging.getLogger("shingle.nfs.callback")

CONNECT_TIMEOUT = 5.0  # an address that does not answer (a client behind NAT) is down
PROBE_TIMEOUT = 10.0  # for CB_NULL's reply
CALL_TIMEOUT = 10.0  # for a CB_COMPOUND's: a client that answers none has no callback path
REPROBE_AFTER = 30.0  # a path found down is probed again when a later OPEN could use it
RECORD_MAX = 1 << 20
_U32 = struct.Struct(">I")


def parse_uaddr(netid: str, uaddr: str) -> tuple[str, int] | None:
    """(host, port) of a universal address (RFC 5665 5.2.3.3/4: "h1.h2.h3.h4.p1.p2", or an
    IPv6 address followed by ".p1.p2"); None when it is not a TCP address of that form."""
    if netid not in ("tcp", "tcp6"):
        return None
    host, _, rest = uaddr.rpartition(".")
    host, _, high = host.rpartition(".")
    try:
        ip = ipaddress.ip_address(host)
        port = int(high) * 256 + int(rest)
    except ValueError:
        return None
    if ip.version != (6 if netid == "tcp6" else 4) or not 0 < port < 65536:
        return None
    if not (0 <= int(high) < 256 and 0 <= int(rest) < 256):
        return None
    return str(ip), port


def _authsys() -> tuple[int, bytes]:
    p = Packer()
    t.authsys_parms.pack(p, t.authsys_parms.cls(int(time.time()) & 0xFFFFFFFF, "shingle", 0, 0, []))
    return (c.AUTH_SYS, p.getvalue())


class _Link:
    """What ``OutgoingCalls`` needs of a connection, over a TCP socket this server opened;
    a thread reads its replies."""

    server = type("NoLoop", (), {"loop": None})  # calls are never sent from the event loop

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.closed = False
        self.send_lock = threading.Lock()
        self.outgoing = OutgoingCalls(self)
        threading.Thread(target=self._read, name="nfs-callback40", daemon=True).start()

    def send(self, chunks, on_loop: bool = False) -> None:
        data = b"".join(bytes(chunk) for chunk in chunks)
        try:
            with self.send_lock:
                self.sock.sendall(_U32.pack(0x80000000 | len(data)) + data)
        except OSError as exc:
            self.close(f"send: {exc}")

    def close(self, why: str = "closed") -> None:
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.outgoing.fail_all(why)

    def _read(self) -> None:
        why = "the client closed the callback connection"
        try:
            while not self.closed:
                record = self._record()
                if len(record) >= 8 and _U32.unpack_from(record, 4)[0] == REPLY:
                    self.outgoing.reply(record)
        except (OSError, ValueError) as exc:
            why = str(exc) or why
        finally:
            self.close(why)
            self.sock.close()

    def _record(self) -> bytes:
        out = b""
        while True:
            (mark,) = _U32.unpack(self._exact(4))
            if len(out) + (mark & 0x7FFFFFFF) > RECORD_MAX:
                raise ValueError(f"a callback reply over {RECORD_MAX} bytes")
            out += self._exact(mark & 0x7FFFFFFF)
            if mark & 0x80000000:
                return out

    def _exact(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise OSError("the client closed the callback connection")
            buf += chunk
        return buf


class Callback40:
    """One NFSv4.0 client's callback path. ``usable()`` is cheap (the probe's outcome); it
    starts a new probe of a path found down once ``REPROBE_AFTER`` has passed."""

    def __init__(self, callback, ident: int, clientid: int):
        self.program = callback.cb_program
        self.location = (callback.cb_location.netid, callback.cb_location.addr)
        self.address = parse_uaddr(*self.location)
        self.ident = ident
        self.clientid = clientid
        self.lock = threading.Lock()  # the flags; never held over a connect
        self.connect_lock = threading.Lock()
        self.link: _Link | None = None
        self.up = False
        self.probing = False
        self.probed_at = -1e9
        self.stopped = False

    def same(self, callback, ident: int) -> bool:
        loc = (callback.cb_location.netid, callback.cb_location.addr)
        return (callback.cb_program, loc, ident) == (self.program, self.location, self.ident)

    def usable(self) -> bool:
        if self.up:
            return True
        if not self.probing and time.monotonic() - self.probed_at > REPROBE_AFTER:
            self.probe()
        return False

    def probe(self) -> None:
        """CB_NULL in a thread of its own; the path is up once it is answered."""
        with self.lock:
            if self.probing or self.stopped:
                return
            self.probing = True
            self.probed_at = time.monotonic()
        threading.Thread(target=self._probe, name="nfs-callback40-probe", daemon=True).start()

    def _probe(self) -> None:
        try:
            self._call(CB_NULL, b"").result(PROBE_TIMEOUT)
            self.up = not self.stopped
            log.info("client %x: callback path %s %s is up", self.clientid, *self.location)
        except Exception as exc:  # noqa: BLE001 - any failure means no delegations, said once
            self.up = False
            log.info(
                "client %x: callback path %s %s not usable (%s): no delegations",
                self.clientid,
                *self.location,
                exc,
            )
        finally:
            self.probing = False

    def recall(self, stateid, fh: bytes) -> Future:
        """CB_RECALL of a delegation; the future's result is the CB_COMPOUND status."""
        return self._compound(recall_op(stateid, fh))

    def getattr(self, fh: bytes) -> Future:
        """CB_GETATTR of a write-delegated file's size and change attribute; the future's
        result is (size, change)."""
        return getattr_answer(self._compound(getattr_op(fh)))

    def _compound(self, op: bytes) -> CallbackFuture:
        """A CB_COMPOUND of one operation, sent from a thread of its own."""
        p = Packer()
        CB_COMPOUND4args_head.pack(p, (b"", c.MINOR_VERSION_40, self.ident))
        UInt.pack(p, 1)
        body = p.getvalue() + op
        fut = CallbackFuture()

        def send() -> None:
            try:
                reply = self._call(CB_COMPOUND, body)
                reply.exception(CALL_TIMEOUT)  # (raises TimeoutError when none came)
            except CallFailed as exc:
                self._failed(fut, exc)
                return
            except TimeoutError:
                self._failed(fut, CallFailed(f"no reply in {CALL_TIMEOUT:.0f} s"))
                self._drop_link()  # its next call connects again
                return
            self._replied(fut, reply)

        threading.Thread(target=send, name="nfs-callback40-recall", daemon=True).start()
        return fut

    def _replied(self, fut: CallbackFuture, done: Future) -> None:
        try:
            fut.results = done.result()
            fut.set_result(UInt.unpack(fut.results, 0)[0])
        except (CallFailed, XdrError) as exc:
            self._failed(fut, exc)

    def _drop_link(self) -> None:
        link, self.link = self.link, None
        if link is not None:
            link.close("a callback went unanswered")

    def _failed(self, fut: Future, exc: Exception) -> None:
        log.info("client %x: a callback failed (%s): the path is down", self.clientid, exc)
        self.up = False  # RENEW says CB_PATH_DOWN; a later OPEN probes again
        self.probed_at = time.monotonic()
        fut.set_exception(exc if isinstance(exc, CallFailed) else CallFailed(str(exc)))

    def _call(self, proc: int, body: bytes) -> Future:
        """Send one call (connecting first when no connection is open); blocks on connect."""
        if self.address is None:
            raise CallFailed(f"callback address {self.location[0]} {self.location[1]!r} unusable")
        with self.connect_lock:
            link = self.link
            if link is None or link.closed:
                if self.stopped:
                    raise CallFailed("the client is gone")
                try:
                    sock = socket.create_connection(self.address, timeout=CONNECT_TIMEOUT)
                except OSError as exc:
                    raise CallFailed(f"connect to {self.address}: {exc}") from exc
                sock.settimeout(None)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                link = self.link = _Link(sock)
                if self.stopped:  # close() ran meanwhile
                    link.close("the client went")
        return link.outgoing.call(self.program, NFS_CB_VERSION, proc, _authsys(), body)

    def close(self) -> None:
        """The client went: its connection too."""
        with self.lock:
            self.stopped, self.up = True, False
            link, self.link = self.link, None
        if link is not None:
            link.close("the client went")
