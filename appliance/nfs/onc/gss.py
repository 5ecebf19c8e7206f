"""RPCSEC_GSS (RFC 2203) with the Kerberos 5 mechanism, through the system's GSS-API (MIT krb5,
by the ``gssapi`` binding).

A client first creates a context with RPCSEC_GSS_INIT (and CONTINUE_INIT) calls to a
program's NULL procedure: each carries a GSS token, the answer carries the server's token and,
once the context is complete, a handle and the sequence window. Every later call (DATA) names
the handle, a sequence number and a service:

    krb5  (service none)       the verifier is a MIC over the RPC header
    krb5i (service integrity) and the arguments and results travel with a MIC of their own
    krb5p (service privacy)   and the arguments and results travel wrapped (encrypted)

A call whose header MIC fails, or naming an unknown handle, is refused with
RPCSEC_GSS_CREDPROBLEM, and one whose context has expired (its ticket did) or whose sequence
number reached MAXSEQ with RPCSEC_GSS_CTXPROBLEM, after which the client makes a new context;
a sequence number seen already, or older than the window, is dropped without an answer
(RFC 2203 5.3.3.1: the client's retransmits carry new numbers). RPCSEC_GSS_DESTROY ends a context.

The caller's identity comes from the context's initiator, mapped as knfsd maps it through
gssproxy: krb5.conf's ``auth_to_local`` rules give a local user name (by default
``user@REALM`` of the default realm is ``user``), the system's name service (pwd/grp) its uid
and groups. Any other principal (another realm, a machine principal like ``nfs/host@REALM``
unless a rule maps it, a user the name service does not know) is UNMAPPED: each export gives
it its anonymous identity. Exports then squash a mapped uid as any (appliance.nfs.exports),
so a machine principal mapped to root is still squashed on a root_squash export.

The connection (appliance.nfs.onc.connection) hands every RPCSEC_GSS call to
``GssService.accept`` and wraps the program's reply through the ``GssReply`` it got back."""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import pwd
import struct
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from appliance.nfs.onc.rpc import (
    AUTH_BADCRED,
    AUTH_NONE,
    GARBAGE_ARGS,
    MSG_ACCEPTED,
    REPLY,
    RPCSEC_GSS,
    SUCCESS,
    UNMAPPED,
    Credential,
    accepted,
    denied_auth,
)
from engine.base.ratelog import RateLimitedLog

log = logging.getLogger("shingle.nfs.gss")
_throttled = RateLimitedLog(log)

RPCSEC_GSS_VERS_1 = 1
PROC_DATA, PROC_INIT, PROC_CONTINUE_INIT, PROC_DESTROY = range(4)
SVC_NONE, SVC_INTEGRITY, SVC_PRIVACY = 1, 2, 3
RPCSEC_GSS_CREDPROBLEM, RPCSEC_GSS_CTXPROBLEM = 13, 14
MAXSEQ = 0x80000000
SEQ_WINDOW = 128
# the pseudo-flavours of the Kerberos 5 services (RFC 2623), as exports and SECINFO name them
KRB5, KRB5I, KRB5P = 390003, 390004, 390005
FLAVOR_OF_SERVICE = {SVC_NONE: KRB5, SVC_INTEGRITY: KRB5I, SVC_PRIVACY: KRB5P}
SERVICE_OF_FLAVOR = {v: k for k, v in FLAVOR_OF_SERVICE.items()}
# the Kerberos 5 mechanism's OID, DER contents without tag and length (as SECINFO carries it)
KRB5_OID = bytes.fromhex("2a864886f712010202")
GSS_S_COMPLETE, GSS_S_CONTINUE_NEEDED, GSS_S_FAILURE = 0, 1, 0xD0000
MAX_TOKEN = 64 * 1024  # a Kerberos AP-REQ with a PAC is a few KiB
MAX_CONTEXTS = 16384  # beyond that the least recently used one goes (its client makes another)
MAX_PENDING = 256  # contexts whose CONTINUE_INIT has not come yet

_U32 = struct.Struct(">I")
_CRED_HEAD = struct.Struct(">IIII")  # version, gss_proc, seq_num, service


def _opaque(data) -> bytes:
    n = len(data)
    return _U32.pack(n) + bytes(data) + b"\0" * (-n % 4)


def _opaque_chunks(data: bytes) -> list[bytes]:
    """An opaque as chunks for writev: no copy of a 1 MiB body."""
    pad = -len(data) % 4
    return [_U32.pack(len(data)), data, b"\0" * pad] if pad else [_U32.pack(len(data)), data]


def _read_opaque(buf, pos: int, limit: int) -> tuple[bytes, int]:
    if pos + 4 > len(buf):
        raise ValueError("opaque length past the end")
    (n,) = _U32.unpack_from(buf, pos)
    end = pos + 4 + n
    if n > limit or end > len(buf):
        raise ValueError(f"opaque of {n} bytes: at most {limit} and the bytes left")
    return bytes(buf[pos + 4 : end]), end + (-n % 4)


@dataclass(slots=True)
class GssCred:
    """The RPCSEC_GSS credential of one call (rpc_gss_cred_vers_1_t)."""

    proc: int
    seq: int
    service: int
    handle: bytes


def parse_cred(body) -> GssCred:
    """Raises ValueError for a credential that is not RPCSEC_GSS version 1."""
    if len(body) < _CRED_HEAD.size + 4:
        raise ValueError("RPCSEC_GSS credential too short")
    version, proc, seq, service = _CRED_HEAD.unpack_from(body, 0)
    if version != RPCSEC_GSS_VERS_1:
        raise ValueError(f"RPCSEC_GSS version {version}: expected 1")
    handle, _ = _read_opaque(body, _CRED_HEAD.size, 64)
    return GssCred(proc, seq, service, handle)


class SeqWindow:
    """Sequence numbers seen, within ``size`` of the highest (RFC 2203 5.3.3.1)."""

    __slots__ = ("size", "top", "seen")

    def __init__(self, size: int = SEQ_WINDOW):
        self.size = size
        self.top = -1
        self.seen = 0  # bit i: top - i was seen

    def accept(self, seq: int) -> bool:
        """True the first time ``seq`` comes within the window; False for a replay or one
        older than the window (dropped)."""
        if seq > self.top:
            shift = seq - self.top
            self.seen = (
                ((self.seen << shift) | 1) & ((1 << self.size) - 1) if shift < self.size else 1
            )
            self.top = seq
            return True
        age = self.top - seq
        if age >= self.size or self.seen >> age & 1:
            return False
        self.seen |= 1 << age
        return True


class GssContext:
    """One established context: the GSS-API context, who it speaks for, until when."""

    __slots__ = ("handle", "ctx", "principal", "cred", "expires", "window", "lock", "gone")

    def __init__(self, handle: bytes, ctx, principal: str, cred: Credential, expires: float):
        self.handle, self.ctx, self.principal, self.cred = handle, ctx, principal, cred
        self.expires = expires
        self.window = SeqWindow()
        self.gone = False  # destroyed, expired or evicted: no callback goes under it either
        # MIT's per-context state (sequence numbers of its own tokens) is not for two threads
        self.lock = threading.Lock()

    def mic(self, data) -> bytes:
        with self.lock:
            return self.ctx.get_signature(bytes(data))

    def verify(self, data, mic) -> bool:
        import gssapi.exceptions

        try:
            with self.lock:
                self.ctx.verify_signature(bytes(data), bytes(mic))
        except gssapi.exceptions.GSSError:
            return False
        return True

    def wrap(self, data) -> bytes:
        with self.lock:
            return self.ctx.wrap(bytes(data), True).message

    def unwrap(self, data) -> bytes | None:
        import gssapi.exceptions

        try:
            with self.lock:
                result = self.ctx.unwrap(bytes(data))
        except gssapi.exceptions.GSSError:
            return None
        return result.message if result.encrypted else None


class GssReply:
    """How the reply to one DATA call goes out: a verifier over its sequence number, and the
    results under the call's service."""

    __slots__ = ("context", "seq", "service")

    def __init__(self, context: GssContext, seq: int, service: int):
        self.context, self.seq, self.service = context, seq, service

    def verifier(self) -> bytes:
        return _U32.pack(RPCSEC_GSS) + _opaque(self.context.mic(_U32.pack(self.seq)))

    def success(self, xid: int, chunks) -> list:
        head = struct.pack(">III", xid, REPLY, MSG_ACCEPTED) + self.verifier() + _U32.pack(SUCCESS)
        if self.service == SVC_NONE:
            return [head, *chunks]
        body = b"".join([_U32.pack(self.seq), *chunks])
        if self.service == SVC_INTEGRITY:
            return [head, *_opaque_chunks(body), _opaque(self.context.mic(body))]
        return [head, *_opaque_chunks(self.context.wrap(body))]

    def rejected(self, body) -> bytes:
        """An accepted reply a program made with an AUTH_NONE verifier (GARBAGE_ARGS, ...),
        with this call's verifier instead; denials carry no verifier."""
        body = bytes(body)
        if len(body) >= 20 and _U32.unpack_from(body, 8)[0] == MSG_ACCEPTED:
            return body[:12] + self.verifier() + body[20:]
        return body


class GssCallback:
    """Calls this server makes under a context its client made: the NFSv4.1 backchannel
    (RFC 8881 2.10.8.3). The client named the context by the handle this server gave it
    (``gcbp_handle_from_server``) and the handle the server's calls must carry
    (``gcbp_handle_from_client``); the server is the GSS acceptor of that context, whose
    tokens work both ways. Its calls get sequence numbers of their own, a verifier that is a
    MIC of the call's header, arguments under the service the client chose; the client's reply
    carries a MIC of the sequence number and results under the same service."""

    __slots__ = ("context", "handle", "service", "seq", "lock")

    def __init__(self, context: GssContext, handle: bytes, service: int):
        self.context, self.handle, self.service = context, bytes(handle), service
        self.seq = 0
        self.lock = threading.Lock()

    def alive(self) -> bool:
        return not self.context.gone and time.monotonic() < self.context.expires

    def seconds_left(self) -> float:
        return self.context.expires - time.monotonic()

    def prepare(self, args: bytes, header) -> tuple[bytes, bytes, GssOutgoingCall]:
        """The credential, the verifier over ``header(credential)`` (the call's header up to
        the credential) and the arguments of one call, and the check of its reply; ValueError
        when the GSS-API refuses (the context ended within MIT)."""
        import gssapi.exceptions

        with self.lock:
            self.seq = seq = self.seq + 1
        cred = _CRED_HEAD.pack(RPCSEC_GSS_VERS_1, PROC_DATA, seq, self.service)
        cred += _opaque(self.handle)
        head = header(cred)
        try:
            verifier = _U32.pack(RPCSEC_GSS) + _opaque(self.context.mic(head))
            if self.service == SVC_INTEGRITY:
                body = _U32.pack(seq) + args
                args = _opaque(body) + _opaque(self.context.mic(body))
            elif self.service == SVC_PRIVACY:
                args = _opaque(self.context.wrap(_U32.pack(seq) + args))
        except gssapi.exceptions.GSSError as exc:
            raise ValueError(f"RPCSEC_GSS: {exc.gen_message()}") from None
        return head + verifier, args, GssOutgoingCall(self, seq)


class GssOutgoingCall:
    """The check of one GssCallback call's reply."""

    __slots__ = ("caller", "seq")

    def __init__(self, caller: GssCallback, seq: int):
        self.caller, self.seq = caller, seq

    def results(self, verf_flavor: int, verf: bytes, results: bytes) -> bytes:
        """The procedure's results of an accepted reply; ValueError when its verifier or its
        protected results do not verify, or name another sequence number."""
        context = self.caller.context
        if verf_flavor != RPCSEC_GSS or not context.verify(_U32.pack(self.seq), verf):
            raise ValueError("the reply's verifier does not verify")
        service = self.caller.service
        if service == SVC_NONE:
            return results
        body, end = _read_opaque(results, 0, len(results))
        if service == SVC_INTEGRITY:
            mic, end = _read_opaque(results, end, 1024)
            if not context.verify(body, mic):
                raise ValueError("the reply's results do not match their MIC")
        else:
            unwrapped = context.unwrap(body)
            if unwrapped is None:
                raise ValueError("the reply's results do not unwrap")
            body = unwrapped
        if len(body) < 4 or _U32.unpack_from(body, 0)[0] != self.seq:
            raise ValueError("the reply's results name another sequence number")
        return body[4:]


def local_name(principal: str) -> str | None:
    """The local user name of ``principal`` by the host's krb5.conf ``auth_to_local`` rules
    (MIT's krb5_aname_to_localname: what gssproxy's gss_localname gives knfsd), or None. By
    default only a one-part name of the default realm maps (``alice@REALM`` is ``alice``); an
    admin's rule may map others, such as a client's machine principal to root."""
    lib = _libkrb5()
    if lib is None:  # python-gssapi links MIT's libkrb5: absent only on a broken install
        return None
    ctx, princ = ctypes.c_void_p(), ctypes.c_void_p()
    if lib.krb5_init_context(ctypes.byref(ctx)) != 0:
        return None
    try:
        if lib.krb5_parse_name(ctx, principal.encode(), ctypes.byref(princ)) != 0:
            return None
        out = ctypes.create_string_buffer(256)
        found = lib.krb5_aname_to_localname(ctx, princ, len(out), out) == 0
        lib.krb5_free_principal(ctx, princ)
        return out.value.decode(errors="replace") if found and out.value else None
    finally:
        lib.krb5_free_context(ctx)


@functools.cache
def _libkrb5():
    try:
        lib = ctypes.CDLL("libkrb5.so.3")
    except OSError:
        return None
    lib.krb5_init_context.argtypes = [ctypes.c_void_p]
    lib.krb5_free_context.argtypes = [ctypes.c_void_p]
    lib.krb5_parse_name.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    lib.krb5_free_principal.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.krb5_aname_to_localname.argtypes = [
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_char_p,
    ]
    return lib


def principal_identity(principal: str, anonymous: Credential) -> Credential:
    """The uid and groups of the principal's local user (``local_name``) in the system's name
    service (pwd/grp); ``anonymous`` (the export's own anonymous identity, UNMAPPED) for a
    principal no rule maps or a user the name service does not know, such as a client's
    machine principal ``nfs/host@REALM`` by default."""
    name = local_name(principal)
    if name is None:
        return anonymous
    try:
        entry = pwd.getpwnam(name)
        groups = os.getgrouplist(name, entry.pw_gid)
    except (KeyError, OSError):
        return anonymous
    gids = tuple(g for g in groups if g != entry.pw_gid)[:16]
    return Credential(RPCSEC_GSS, entry.pw_uid, entry.pw_gid, gids, principal=principal)


class GssService:
    """The server side of RPCSEC_GSS: the acceptor credential from the keytab, the contexts."""

    def __init__(self, keytab: str, principal: str = ""):
        import gssapi

        self.keytab = keytab
        name = None
        if principal:  # "nfs@host" (a service on a host) or "nfs/host@REALM"
            kind = gssapi.NameType.hostbased_service if "/" not in principal else None
            name = gssapi.Name(principal, kind) if kind else gssapi.Name(principal)
        self.acceptor = gssapi.Credentials(name=name, usage="accept", store={"keytab": keytab})
        self.anonymous = Credential(RPCSEC_GSS, UNMAPPED, UNMAPPED, ())
        self.contexts: OrderedDict[bytes, GssContext] = OrderedDict()
        self.pending: OrderedDict[bytes, Any] = (
            OrderedDict()
        )  # contexts whose CONTINUE_INIT is to come
        self._lock = threading.Lock()
        # counters for /metrics: contexts made, refusals by reason, replays dropped
        self.counts = {"contexts": 0, "destroyed": 0, "replays": 0, "refused": 0, "failed_init": 0}

    # -- what the connection calls --------------------------------------------------------------
    def accept(self, call, record, pos: int):
        """The verdict on one RPCSEC_GSS call: the reply chunks (a control procedure's answer
        or a refusal), None (dropped: a replay), or (credential, arguments record, their offset,
        GssReply) for the program to run."""
        try:
            gcred = parse_cred(call.cred.body)
        except ValueError as exc:
            return self._refuse(call.xid, AUTH_BADCRED, str(exc))
        if gcred.proc in (PROC_INIT, PROC_CONTINUE_INIT):
            return self._init(call, gcred, record, pos)
        if gcred.proc not in (PROC_DATA, PROC_DESTROY):
            return self._refuse(call.xid, AUTH_BADCRED, f"RPCSEC_GSS procedure {gcred.proc}")
        context = self._context(gcred.handle)
        if context is None:
            return self._refuse(call.xid, RPCSEC_GSS_CREDPROBLEM, "unknown context handle")
        if time.monotonic() >= context.expires:
            self._forget(gcred.handle)
            return self._refuse(call.xid, RPCSEC_GSS_CTXPROBLEM, "context expired")
        verf = call.verf
        header_end = 32 + len(call.cred.body) + (-len(call.cred.body) % 4)
        if verf.flavor != RPCSEC_GSS or not context.verify(
            memoryview(record)[:header_end], verf.body
        ):
            # CREDPROBLEM, as knfsd, FreeBSD and libtirpc answer: the client makes a new context
            # (AUTH_BADVERF would only make the Linux client resend with the same one)
            return self._refuse(call.xid, RPCSEC_GSS_CREDPROBLEM, "header MIC does not verify")
        if gcred.seq >= MAXSEQ:
            # only after the MIC: the handle is on the wire in clear, and an unsigned call
            # naming it must not end another client's context
            self._forget(gcred.handle)
            return self._refuse(call.xid, RPCSEC_GSS_CTXPROBLEM, "sequence number past MAXSEQ")
        with context.lock:
            fresh = context.window.accept(gcred.seq)
        if not fresh:
            self.counts["replays"] += 1
            log.debug(
                "RPCSEC_GSS sequence %d from %s replayed: dropped", gcred.seq, context.principal
            )
            return None
        if gcred.service not in FLAVOR_OF_SERVICE:
            return self._refuse(call.xid, AUTH_BADCRED, f"RPCSEC_GSS service {gcred.service}")
        reply = GssReply(context, gcred.seq, gcred.service)
        if gcred.service != SVC_NONE:
            args = self._unwrap_args(context, gcred, record, pos)
            if args is None:
                self.counts["refused"] += 1
                return [reply.rejected(accepted(call.xid, GARBAGE_ARGS))]
            record, pos = args, 0
        if gcred.proc == PROC_DESTROY:
            self._forget(gcred.handle)
            self.counts["destroyed"] += 1
            return reply.success(call.xid, [])
        base = context.cred
        cred = Credential(
            RPCSEC_GSS,
            base.uid,
            base.gid,
            base.gids,
            principal=context.principal,
            sec=FLAVOR_OF_SERVICE[gcred.service],
        )
        return cred, record, pos, reply

    def stats(self) -> dict[str, int]:
        with self._lock:
            live = len(self.contexts)
        return {**self.counts, "live": live}

    # -- parts -------------------------------------------------------------------------------------
    def _refuse(self, xid: int, why: int, message: str) -> list:
        self.counts["refused"] += 1
        log.debug("RPCSEC_GSS call %#x refused (auth_stat %d): %s", xid, why, message)
        return [denied_auth(xid, why)]

    def _context(self, handle: bytes) -> GssContext | None:
        with self._lock:
            context = self.contexts.get(handle)
            if context is not None:
                self.contexts.move_to_end(handle)
            return context

    def _forget(self, handle: bytes) -> None:
        with self._lock:
            context = self.contexts.pop(handle, None)
        if context is not None:
            context.gone = True

    def live_context(self, handle: bytes) -> GssContext | None:
        """The established, unexpired context of ``handle`` (a client names it for its
        backchannel), or None."""
        context = self._context(handle)
        if context is None or context.gone or time.monotonic() >= context.expires:
            return None
        return context

    @staticmethod
    def _unwrap_args(context: GssContext, gcred: GssCred, record, pos: int):
        """The procedure's arguments out of rpc_gss_integ_data / rpc_gss_priv_data, or None when
        they do not verify or name another sequence number."""
        try:
            body, end = _read_opaque(record, pos, len(record))
            if gcred.service == SVC_INTEGRITY:
                mic, end = _read_opaque(record, end, 1024)
                if not context.verify(body, mic):
                    return None
            else:
                unwrapped = context.unwrap(body)
                if unwrapped is None:
                    return None
                body = unwrapped
        except ValueError:
            return None
        if end != len(record) or len(body) < 4 or _U32.unpack_from(body, 0)[0] != gcred.seq:
            return None
        return memoryview(body)[4:]

    def _init(self, call, gcred: GssCred, record, pos: int) -> list:
        """RPCSEC_GSS_INIT / CONTINUE_INIT: one step of the GSS context exchange."""
        import gssapi
        import gssapi.exceptions

        if call.proc != 0:
            return self._refuse(call.xid, AUTH_BADCRED, "context creation outside NULL")
        try:
            token, end = _read_opaque(record, pos, MAX_TOKEN)
        except ValueError:
            return [accepted(call.xid, GARBAGE_ARGS)]
        if end != len(record):
            return [accepted(call.xid, GARBAGE_ARGS)]
        with self._lock:
            ctx = self.pending.pop(gcred.handle, None) if gcred.proc == PROC_CONTINUE_INIT else None
        if gcred.proc == PROC_CONTINUE_INIT and ctx is None:
            return self._refuse(call.xid, RPCSEC_GSS_CREDPROBLEM, "CONTINUE_INIT of no context")
        if ctx is None:
            ctx = gssapi.SecurityContext(creds=self.acceptor, usage="accept")
        try:
            out = ctx.step(token) or b""
        except gssapi.exceptions.GSSError as exc:
            self.counts["failed_init"] += 1
            _throttled.warning(
                "init", "RPCSEC_GSS context from a client refused: %s", exc.gen_message()
            )
            res = _opaque(b"") + struct.pack(">III", exc.maj_code, exc.min_code & 0xFFFFFFFF, 0)
            return [self._init_head(call.xid, None), res + _opaque(b"")]
        handle = os.urandom(16)
        if not ctx.complete:
            with self._lock:
                self.pending[handle] = ctx
                while len(self.pending) > MAX_PENDING:
                    self.pending.popitem(last=False)
            res = _opaque(handle) + struct.pack(">III", GSS_S_CONTINUE_NEEDED, 0, SEQ_WINDOW)
            return [self._init_head(call.xid, None), res + _opaque(out)]
        context = self._established(handle, ctx)
        res = _opaque(handle) + struct.pack(">III", GSS_S_COMPLETE, 0, SEQ_WINDOW)
        return [self._init_head(call.xid, context), res + _opaque(out)]

    def _established(self, handle: bytes, ctx) -> GssContext:
        principal = str(ctx.initiator_name)
        cred = principal_identity(principal, self.anonymous)
        lifetime = ctx.lifetime if ctx.lifetime is not None else 3600
        context = GssContext(handle, ctx, principal, cred, time.monotonic() + lifetime)
        with self._lock:
            self.contexts[handle] = context
            while len(self.contexts) > MAX_CONTEXTS:
                self.contexts.popitem(last=False)[1].gone = True
        self.counts["contexts"] += 1
        log.info(
            "RPCSEC_GSS context for %s (%s), for %d s",
            principal,
            "no local user" if cred.uid == UNMAPPED else f"uid {cred.uid}, gid {cred.gid}",
            lifetime,
        )
        return context

    @staticmethod
    def _init_head(xid: int, context: GssContext | None) -> bytes:
        """The accepted-reply head of a context creation call: once complete, its verifier is a
        MIC over the sequence window (RFC 2203 5.2.3.1)."""
        if context is None:
            verf = struct.pack(">II", AUTH_NONE, 0)
        else:
            verf = _U32.pack(RPCSEC_GSS) + _opaque(context.mic(_U32.pack(SEQ_WINDOW)))
        return struct.pack(">III", xid, REPLY, MSG_ACCEPTED) + verf + _U32.pack(SUCCESS)
