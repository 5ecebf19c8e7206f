"""ONC RPC (RFC 5531) messages: call decoding, AUTH_SYS / AUTH_NONE credentials,
accepted and denied replies, and what a program returns (``InWorker``, ``RpcReject``).

A ``Program`` object handles calls on the event loop: ``program.call(conn,
call, cred, record, pos)`` returns the reply body chunks (a list of
bytes-like), or ``InWorker(fn, *args)`` when the answer needs blocking work
(``fn`` then runs in a worker thread and returns the chunks), or raises
``RpcReject``. The connection (record marking, replies) is in
``appliance.nfs.onc.connection``."""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass

from appliance.nfs.onc.xdr import Array, Opaque, String, Struct, UInt, XdrError

log = logging.getLogger("shingle.nfs.rpc")

RPC_VERSION = 2
CALL, REPLY = 0, 1
MSG_ACCEPTED, MSG_DENIED = 0, 1
SUCCESS, PROG_UNAVAIL, PROG_MISMATCH, PROC_UNAVAIL, GARBAGE_ARGS, SYSTEM_ERR = range(6)
RPC_MISMATCH, AUTH_ERROR = 0, 1
AUTH_OK, AUTH_BADCRED, AUTH_REJECTEDCRED, AUTH_BADVERF, AUTH_REJECTEDVERF, AUTH_TOOWEAK = range(6)
AUTH_NONE, AUTH_SYS, RPCSEC_GSS = 0, 1, 6

opaque_auth = Struct("opaque_auth", ("flavor", UInt), ("body", Opaque(400)))
call_body = Struct(
    "call_body",
    ("xid", UInt),
    ("mtype", UInt),
    ("rpcvers", UInt),
    ("prog", UInt),
    ("vers", UInt),
    ("proc", UInt),
    ("cred", opaque_auth),
    ("verf", opaque_auth),
)
authsys_parms = Struct(
    "authsys_parms",
    ("stamp", UInt),
    ("machinename", String(255)),
    ("uid", UInt),
    ("gid", UInt),
    ("gids", Array(UInt, 16)),
)

# xid, REPLY, MSG_ACCEPTED, verf flavor, verf len, accept_stat
_REPLY_HEAD = struct.Struct(">IIIIII")


@dataclass(slots=True)
class Credential:
    flavor: int
    uid: int
    gid: int
    gids: tuple[int, ...]
    machine: str = ""
    principal: str = ""  # RPCSEC_GSS: the Kerberos principal the context speaks for
    # the flavour the export rules compare: AUTH_SYS, AUTH_NONE or a Kerberos pseudo-flavour
    sec: int = AUTH_NONE


ANONYMOUS = Credential(AUTH_NONE, 65534, 65534, ())
# the uid and gid of an RPCSEC_GSS principal the name service does not map: each export gives
# it its own anonymous identity (as knfsd does with gssproxy's -1)
UNMAPPED = -1


class AuthTooWeak(Exception):
    """The call's flavour is not one the export allows: an RPC-level AUTH_TOOWEAK denial
    (NFSv3; NFSv4 answers NFS4ERR_WRONGSEC instead)."""


class InWorker:
    """A program's answer that needs blocking work: ``fn(*args)`` runs in a worker thread and
    returns the reply body chunks (or raises RpcReject); ``finished`` runs after it, there."""

    __slots__ = ("fn", "args", "finished")

    def __init__(self, fn, *args):
        self.fn, self.args, self.finished = fn, args, None


class RpcReject(Exception):
    """A call answered with a non-SUCCESS accept_stat or a denial."""

    def __init__(self, body: bytes):
        super().__init__("rpc reject")
        self.body = body


def accepted(xid: int, stat: int, extra: bytes = b"") -> bytes:
    return _REPLY_HEAD.pack(xid, REPLY, MSG_ACCEPTED, AUTH_NONE, 0, stat) + extra


def prog_mismatch(xid: int, low: int, high: int) -> bytes:
    return accepted(xid, PROG_MISMATCH, struct.pack(">II", low, high))


def denied_auth(xid: int, why: int) -> bytes:
    return struct.pack(">IIIII", xid, REPLY, MSG_DENIED, AUTH_ERROR, why)


def denied_rpc_version(xid: int) -> bytes:
    return struct.pack(">IIIIII", xid, REPLY, MSG_DENIED, RPC_MISMATCH, RPC_VERSION, RPC_VERSION)


def success_head(xid: int) -> bytes:
    return _REPLY_HEAD.pack(xid, REPLY, MSG_ACCEPTED, AUTH_NONE, 0, SUCCESS)


def decode_credential(cred) -> Credential:
    if cred.flavor == AUTH_SYS:
        p = authsys_parms.decode(cred.body)
        return Credential(AUTH_SYS, p.uid, p.gid, tuple(p.gids), p.machinename, sec=AUTH_SYS)
    if cred.flavor == AUTH_NONE:
        return ANONYMOUS
    raise ValueError(cred.flavor)


def parse_call(record, gss=None):
    """(call header, credential, offset of the procedure arguments) or an
    RpcReject carrying the reply; XdrError when even the header is garbage. With ``gss`` (the
    server takes RPCSEC_GSS), an RPCSEC_GSS call's credential is None: the connection hands it
    to ``gss.accept``."""
    call, pos = call_body.unpack(record, 0)
    if call.mtype != CALL:
        raise XdrError(f"message type {call.mtype}: expected CALL (0)")
    if call.rpcvers != RPC_VERSION:
        raise RpcReject(denied_rpc_version(call.xid))
    if call.cred.flavor == RPCSEC_GSS and gss is not None:
        return call, None, pos
    try:
        cred = decode_credential(call.cred)
    except XdrError:
        raise RpcReject(denied_auth(call.xid, AUTH_BADCRED)) from None
    except ValueError:
        # unknown flavors, and RPCSEC_GSS when no keytab is configured
        why = AUTH_BADCRED if call.cred.flavor != RPCSEC_GSS else AUTH_TOOWEAK
        raise RpcReject(denied_auth(call.xid, why)) from None
    return call, cred, pos


def decode_args(argtype, call, record, pos):
    """The procedure's arguments, or GARBAGE_ARGS when they do not decode exactly."""
    try:
        args, end = argtype.unpack(record, pos)
    except XdrError as exc:
        log.debug("garbage arguments for prog %d proc %d: %s", call.prog, call.proc, exc)
        raise RpcReject(accepted(call.xid, GARBAGE_ARGS)) from None
    if end != len(record):
        log.debug(
            "prog %d proc %d: %d bytes after the arguments", call.prog, call.proc, len(record) - end
        )
        raise RpcReject(accepted(call.xid, GARBAGE_ARGS))
    return args
