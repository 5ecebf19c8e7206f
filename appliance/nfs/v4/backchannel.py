"""The NFSv4.1 backchannel of a session (RFC 8881 2.10.3.1, 18.33, 18.36, 20): the callback
program a client named in CREATE_SESSION (or BACKCHANNEL_CTL), the connections it offered for
callbacks (CREATE_SESSION4_FLAG_CONN_BACK_CHAN, BIND_CONN_TO_SESSION), and the slots of the
back channel. A callback is a CB_COMPOUND of CB_SEQUENCE and one operation (CB_RECALL of a
delegation, CB_OFFLOAD of an asynchronous COPY's result), sent as
an RPC call on one of those connections (appliance.nfs.onc.outgoing) and answered there.

A session's backchannel is usable while one of its connections is open, it has a credential
to call with and no callback on it has failed since the last connection was bound: SEQUENCE
says CB_PATH_DOWN otherwise, and no delegation is granted. The credential is the first of the
client's ``callback_sec_parms4`` (CREATE_SESSION, BACKCHANNEL_CTL): AUTH_NONE, AUTH_SYS, or
RPCSEC_GSS under a context the client made with this server (RFC 8881 2.10.8.3); a handle
this server does not know gets NFS4ERR_NOENT. While that context is about to end SEQUENCE
says CB_GSS_CONTEXTS_EXPIRING, once it is gone (ended, destroyed, or lost in a restart)
CB_GSS_CONTEXTS_EXPIRED, and the client names a new one with BACKCHANNEL_CTL."""

from __future__ import annotations

import logging
import struct
import threading
from collections import deque
from concurrent.futures import Future

from appliance.nfs.onc.gss import FLAVOR_OF_SERVICE, GssCallback
from appliance.nfs.onc.outgoing import CallFailed, OutgoingCalls
from appliance.nfs.onc.xdr import Array, Bool, Packer, Struct, UHyper, UInt, Union, XdrError
from appliance.nfs.state import NfsError
from appliance.nfs.v4 import const as c
from appliance.nfs.v4 import types as t

log = logging.getLogger("shingle.nfs.callback")

NFS_CB_VERSION = 1  # program NFS4_CALLBACK { version NFS_CB { ... } = 1; }
CB_NULL, CB_COMPOUND = 0, 1
OP_CB_GETATTR, OP_CB_RECALL, OP_CB_SEQUENCE, OP_CB_OFFLOAD = 3, 4, 11, 15
BACK_SLOTS_MAX = 16
GSS_EXPIRING_S = 300.0  # SEQUENCE warns this long before the callback context ends
WAITING_MAX = 1024  # callbacks queued for a slot; past it they fail (the holder is revoked)

referring_call4 = Struct("referring_call4", ("sequenceid", UInt), ("slotid", UInt))
referring_call_list4 = Struct(
    "referring_call_list4", ("sessionid", t.sessionid4), ("calls", Array(referring_call4))
)
CB_COMPOUND4args_head = Struct(
    "CB_COMPOUND4args", ("tag", t.utf8str), ("minorversion", UInt), ("callback_ident", UInt)
)
CB_SEQUENCE4args = Struct(
    "CB_SEQUENCE4args",
    ("sessionid", t.sessionid4),
    ("sequenceid", UInt),
    ("slotid", UInt),
    ("highest_slotid", UInt),
    ("cachethis", Bool),
    ("referring_call_lists", Array(referring_call_list4)),
)
CB_RECALL4args = Struct(
    "CB_RECALL4args", ("stateid", t.stateid4), ("truncate", Bool), ("fh", t.nfs_fh4)
)
# RFC 7862 16.1: an asynchronous COPY's outcome, its write_response4 or the bytes it copied
offload_info4 = Union("offload_info4", UInt, {c.NFS4_OK: t.write_response4}, UHyper)
CB_OFFLOAD4args = Struct(
    "CB_OFFLOAD4args", ("fh", t.nfs_fh4), ("stateid", t.stateid4), ("info", offload_info4)
)
CB_GETATTR4args = Struct("CB_GETATTR4args", ("fh", t.nfs_fh4), ("attr_request", t.bitmap4))
GETATTR_WORDS = [1 << c.FATTR4_CHANGE | 1 << c.FATTR4_SIZE]
_U32 = struct.Struct(">I")
_U32X2 = struct.Struct(">II")
_U64X2 = struct.Struct(">QQ")


def callback_credential(sec_parms) -> tuple[int, bytes] | None:
    """The first AUTH_NONE or AUTH_SYS flavour of the client's callback_sec_parms4 list, as
    (flavour, credential body); None when it offers neither."""
    for flavor, arm in sec_parms:
        if flavor == c.AUTH_NONE:
            return (c.AUTH_NONE, b"")
        if flavor == c.AUTH_SYS:
            p = Packer()
            t.authsys_parms.pack(p, arm)
            return (c.AUTH_SYS, p.getvalue())
    return None


def callback_auth(sec_parms, gss, principals) -> tuple[int, bytes] | GssCallback | None:
    """What callbacks go under: the first entry of the client's callback_sec_parms4 list.
    An RPCSEC_GSS entry must name (``handle_from_server``) a live context of this server
    (``gss``: the GssService, None without a keytab) made by one of ``principals`` (the
    caller's, the client record's): NFS4ERR_NOENT otherwise (RFC 8881 18.33.3, 18.36.3),
    NFS4ERR_INVAL for a service that is not none, integrity or privacy."""
    for flavor, arm in sec_parms:
        if flavor != c.RPCSEC_GSS:
            return callback_credential([(flavor, arm)])
        if arm.service not in FLAVOR_OF_SERVICE:
            raise NfsError(c.NFS4ERR_INVAL, f"callback RPCSEC_GSS service {arm.service}")
        context = gss.live_context(bytes(arm.handle_from_server)) if gss is not None else None
        if context is None or context.principal not in principals:
            raise NfsError(
                c.NFS4ERR_NOENT,
                "the callback's RPCSEC_GSS handle names no live context of this client's",
            )
        return GssCallback(context, arm.handle_from_client, arm.service)
    return None


class Backchannel:
    def __init__(self, sessionid: bytes, program: int, auth, slots: int, minor: int):
        """``auth``: what callbacks go under (``callback_auth``)."""
        self.sessionid = sessionid
        self.minor = max(1, minor)
        self.lock = threading.Lock()
        self.conns: list[OutgoingCalls] = []
        self.program = program
        self.cred: tuple[int, bytes] | GssCallback | None = auth
        self.gss_lost = False  # its RPCSEC_GSS context went with a restart
        self.seqids = [0] * max(1, min(slots, BACK_SLOTS_MAX))
        self.busy = [False] * len(self.seqids)
        self.waiting: deque = deque()  # (operation bytes, future) for a free slot
        self.faulted = False  # a callback failed: path down until a connection is bound again
        self.lost = False  # made for a session restored after a restart: no connection yet

    def set_program(self, program: int, auth) -> None:
        """BACKCHANNEL_CTL: a new program number and credentials for later callbacks."""
        with self.lock:
            self.program = program
            self.cred, self.gss_lost = auth, False
            self.faulted = False  # a callback refused under the old context says nothing now

    def bind(self, outgoing: OutgoingCalls) -> None:
        with self.lock:
            self.conns = [conn for conn in self.conns if conn.usable()]
            if outgoing not in self.conns:
                self.conns.append(outgoing)
            self.faulted = self.lost = False

    def _cred_usable(self) -> bool:
        cred = self.cred
        return cred is not None and (not isinstance(cred, GssCallback) or cred.alive())

    def usable(self) -> bool:
        return (
            not self.faulted and self._cred_usable() and any(conn.usable() for conn in self.conns)
        )

    def sequence_flags(self) -> int:
        """SEQUENCE's status flags about this backchannel: CB_PATH_DOWN when it had a
        connection and cannot call now, CB_GSS_CONTEXTS_EXPIRING / EXPIRED for its context."""
        flags, cred = 0, self.cred
        if isinstance(cred, GssCallback):
            if not cred.alive():
                flags |= c.SEQ4_STATUS_CB_GSS_CONTEXTS_EXPIRED
            elif cred.seconds_left() < GSS_EXPIRING_S:
                flags |= c.SEQ4_STATUS_CB_GSS_CONTEXTS_EXPIRING
        elif self.gss_lost:
            flags |= c.SEQ4_STATUS_CB_GSS_CONTEXTS_EXPIRED
        if (self.conns or self.lost) and (
            self.faulted
            or not any(conn.usable() for conn in self.conns)
            or (cred is None and not self.gss_lost)
        ):
            flags |= c.SEQ4_STATUS_CB_PATH_DOWN  # it had one: bind a connection again
        return flags

    def recall(self, stateid, fh: bytes) -> Future:
        """CB_RECALL of a delegation; the future's result is the CB_COMPOUND status."""
        return self._compound(recall_op(stateid, fh))

    def getattr(self, fh: bytes) -> Future:
        """CB_GETATTR of a write-delegated file's size and change attribute; the future's
        result is (size, change)."""
        return getattr_answer(self._compound(getattr_op(fh)))

    def offload(self, fh: bytes, stateid, status: int, result) -> Future:
        """CB_OFFLOAD of an asynchronous COPY: ``result`` is its write_response4 when
        ``status`` is NFS4_OK, else the bytes it copied before failing."""
        p = Packer()
        UInt.pack(p, OP_CB_OFFLOAD)
        CB_OFFLOAD4args.pack(p, (fh, stateid, (status, result)))
        return self._compound(p.getvalue())

    def _compound(self, op: bytes) -> Future:
        fut = CallbackFuture()
        with self.lock:
            slot = next((i for i, busy in enumerate(self.busy) if not busy), None)
            if slot is None:
                if len(self.waiting) >= WAITING_MAX:  # a client that answers no callback
                    fut.set_exception(CallFailed(f"{WAITING_MAX} callbacks wait for a slot"))
                    return fut
                self.waiting.append((op, fut))
                return fut
            self.busy[slot] = True
        self._send(slot, op, fut)
        return fut

    def _send(self, slot: int, op: bytes, fut: Future) -> None:
        with self.lock:
            conn = next((conn for conn in self.conns if conn.usable()), None)
            self.seqids[slot] = seqid = (self.seqids[slot] + 1) & 0xFFFFFFFF
            cred, program, highest = self.cred, self.program, len(self.seqids) - 1
        if conn is None or cred is None or not self._cred_usable():
            self._done(slot, fut, CallFailed("no connection or credential for callbacks"))
            return
        p = Packer()
        CB_COMPOUND4args_head.pack(p, (b"", self.minor, 0))
        UInt.pack(p, 2)
        UInt.pack(p, OP_CB_SEQUENCE)
        CB_SEQUENCE4args.pack(p, (self.sessionid, seqid, slot, highest, False, []))
        call = conn.call(program, NFS_CB_VERSION, CB_COMPOUND, cred, p.getvalue() + op)
        call.add_done_callback(lambda done: self._replied(slot, fut, done))

    def _replied(self, slot: int, fut: Future, done: Future) -> None:
        try:
            if isinstance(fut, CallbackFuture):
                fut.results = done.result()
            outcome: int | Exception = _compound_status(done.result())
        except (CallFailed, XdrError) as exc:
            outcome = exc
        self._done(slot, fut, outcome)

    def _done(self, slot: int, fut: Future, outcome: int | Exception) -> None:
        with self.lock:
            if isinstance(outcome, Exception):
                self.faulted = True
            nxt = self.waiting.popleft() if self.waiting else None
            if nxt is None:
                self.busy[slot] = False
        if isinstance(outcome, Exception):
            log.info("callback on session %s failed: %s", self.sessionid.hex(), outcome)
            fut.set_exception(outcome)
        else:
            fut.set_result(outcome)
        if nxt is not None:
            self._send(slot, *nxt)


def restored_backchannel(sess, minor: int) -> Backchannel | None:
    """The backchannel of a session restored after a restart, from the callback program and
    credentials saved with it (``Session.callback``): without a connection until the client
    binds one (SEQUENCE says CB_PATH_DOWN meanwhile)."""
    if sess.callback is None:
        return None
    program, sec_parms = sess.callback
    back = Backchannel(
        sess.id, program, callback_credential(sec_parms), sess.back.maxrequests, minor
    )
    # its RPCSEC_GSS context did not outlive the restart: the client names a new one
    back.gss_lost = back.cred is None and any(f == c.RPCSEC_GSS for f, _ in sec_parms)
    back.lost = True
    sess.backchannel = back
    return back


class CallbackFuture(Future):
    """A callback's outcome (the CB_COMPOUND status), with the whole CB_COMPOUND4res."""

    results: bytes = b""


def recall_op(stateid, fh: bytes) -> bytes:
    """One CB_RECALL operation (no truncate), for either callback path (4.1 or 4.0)."""
    p = Packer()
    UInt.pack(p, OP_CB_RECALL)
    CB_RECALL4args.pack(p, (stateid, False, fh))
    return p.getvalue()


def getattr_op(fh: bytes) -> bytes:
    """One CB_GETATTR operation asking size and change, for either callback path."""
    p = Packer()
    UInt.pack(p, OP_CB_GETATTR)
    CB_GETATTR4args.pack(p, (fh, GETATTR_WORDS))
    return p.getvalue()


def getattr_answer(sent: Future) -> Future:
    """The (size, change) of a CB_GETATTR's reply, once ``sent`` (a CallbackFuture) is done."""
    out: Future = Future()

    def done(call: Future) -> None:
        try:
            status = call.result()
            if status != c.NFS4_OK:
                raise CallFailed(f"CB_GETATTR answered {status}")
            out.set_result(parse_getattr(getattr(call, "results", b"")))
        except (CallFailed, XdrError, struct.error) as exc:
            out.set_exception(exc if isinstance(exc, CallFailed) else CallFailed(str(exc)))

    sent.add_done_callback(done)
    return out


def parse_getattr(results: bytes) -> tuple[int, int]:
    """(size, change) from a CB_COMPOUND4res whose last result is CB_GETATTR's."""
    pos = 4
    tag_len, pos = UInt.unpack(results, pos)
    pos += tag_len + (-tag_len % 4)
    count, pos = UInt.unpack(results, pos)
    for _ in range(count):
        (op, status), pos = _U32X2.unpack_from(results, pos), pos + 8
        if status != c.NFS4_OK:
            raise CallFailed(f"callback operation {op} answered {status}")
        if op == OP_CB_SEQUENCE:
            pos += 16 + 16  # sessionid, sequenceid, slotid, highest and target highest slot
        elif op == OP_CB_GETATTR:
            attrs, pos = t.fattr4.unpack(results, pos)
            return _size_change(attrs)
        else:
            raise CallFailed(f"callback operation {op} in a CB_GETATTR reply")
    raise CallFailed("no CB_GETATTR result")


def _size_change(attrs) -> tuple[int, int]:
    words = list(attrs.attrmask) + [0]
    if words[0] & GETATTR_WORDS[0] != GETATTR_WORDS[0]:
        raise CallFailed(f"CB_GETATTR answered attributes {words[0]:#x}, not change and size")
    vals = bytes(attrs.attr_vals)
    if len(vals) < 16:
        raise CallFailed("CB_GETATTR's change and size cut short")
    change, size = _U64X2.unpack_from(vals, 0)  # bit order: change (3), then size (4)
    return size, change


def _compound_status(results: bytes) -> int:
    """A CB_COMPOUND4res's status (its CB_SEQUENCE's when that failed)."""
    return UInt.unpack(results, 0)[0]
