"""Client and session operations: EXCHANGE_ID, CREATE_SESSION, DESTROY_SESSION,
BIND_CONN_TO_SESSION, DESTROY_CLIENTID, RECLAIM_COMPLETE, BACKCHANNEL_CTL,
TEST_STATEID, FREE_STATEID, SECINFO, SECINFO_NO_NAME."""

from __future__ import annotations

import logging

from appliance.nfs.onc.gss import KRB5, KRB5_OID, KRB5I, KRB5P, SERVICE_OF_FLAVOR
from appliance.nfs.state import NfsError, clients
from appliance.nfs.v4 import const as c
from appliance.nfs.v4.backchannel import Backchannel, callback_auth, restored_backchannel
from appliance.nfs.v4.compound import CACHE_LIMIT
from appliance.nfs.v4.ops.common import need_dir, resok
from appliance.nfs.v4.ops.fs import lookup
from appliance.nfs.v4.registry import operation
from appliance.nfs.v4.types import channel_attrs4, nfs_impl_id4, nfstime4
from engine.base.blocking import WouldBlock, blocking_forbidden

log = logging.getLogger("shingle.nfs")
MAX_CACHED = CACHE_LIMIT  # the ca_maxresponsesize_cached offered: what a slot keeps
MAX_SLOTS = 64
CREATE_SESSION_FLAGS = (
    c.CREATE_SESSION4_FLAG_PERSIST
    | c.CREATE_SESSION4_FLAG_CONN_BACK_CHAN
    | c.CREATE_SESSION4_FLAG_CONN_RDMA
)
# The least a channel must carry (RFC 8881 18.36.3, sizes with the RPC headers): a COMPOUND of
# SEQUENCE and one operation, its request and reply with AUTH_NONE headers (88 and 80 bytes);
# on the back channel a CB_COMPOUND of CB_SEQUENCE (96 and 76 bytes) and one operation
FORE_MIN = (88, 80, 2)
BACK_MIN = (96, 76, 2)


def _principal(cx) -> tuple:
    return clients.principal_of(cx.rpc_cred)


def _principal_names(cx, cl) -> tuple[str, ...]:
    """Whose RPCSEC_GSS contexts a client may name for its callbacks: the caller's, the one
    that made its record (the Linux client makes both with its machine credential)."""
    return tuple(name for name in (cx.rpc_cred.principal, cl.principal_name) if name)


def _check_channel(attrs, least, name: str) -> None:
    min_request, min_response, min_ops = least
    if (
        attrs.maxrequestsize < min_request
        or attrs.maxresponsesize < min_response
        or attrs.maxoperations < min_ops
    ):
        raise NfsError(
            c.NFS4ERR_TOOSMALL,
            f"{name} channel {attrs} below requests of "
            f"{min_request}, replies of {min_response} bytes, "
            f"{min_ops} operations",
        )


@operation(c.OP_EXCHANGE_ID)
def exchange_id(cx, a):
    if a.state_protect[0] != c.SP4_NONE:
        raise NfsError(c.NFS4ERR_NOTSUPP, "only SP4_NONE state protection is offered")
    if a.flags & ~c.EXCHGID4_FLAG_MASK_A:
        raise NfsError(c.NFS4ERR_INVAL, f"EXCHANGE_ID flags {a.flags:#x} outside the defined mask")
    update = bool(a.flags & c.EXCHGID4_FLAG_UPD_CONFIRMED_REC_A)
    cl = clients.exchange_id(
        cx.state, bytes(a.ownerid), a.verifier, _principal(cx), cx.address, update
    )
    if not cl.confirmed:  # a confirmed record keeps the name it was made by
        cl.principal_name = cx.rpc_cred.principal
    server = cx.server
    flags = server.pnfs.exchange_flags() | (c.EXCHGID4_FLAG_CONFIRMED_R if cl.confirmed else 0)
    impl = nfs_impl_id4.cls("shingle", "shingle NFSv4.1 server", nfstime4.cls(0, 0))
    return resok(c.OP_EXCHANGE_ID).cls(
        cl.clientid,
        cl.cs_sequence,
        flags,
        (c.SP4_NONE, None),
        0,
        server.owner_major,
        server.server_scope,
        [impl],
    )


@operation(c.OP_CREATE_SESSION)
def create_session(cx, a):
    state = cx.state
    with state.lock:
        cl = clients.unconfirmed_client(state, a.clientid, _principal(cx))
        if a.sequence == (cl.cs_sequence - 1) & 0xFFFFFFFF and cl.cs_reply is not None:
            return cl.cs_reply  # a retransmitted CREATE_SESSION
        if a.sequence != cl.cs_sequence:
            raise NfsError(
                c.NFS4ERR_SEQ_MISORDERED,
                f"CREATE_SESSION sequence {a.sequence}, expected {cl.cs_sequence}",
            )
        if a.flags & ~CREATE_SESSION_FLAGS:
            raise NfsError(c.NFS4ERR_INVAL, f"CREATE_SESSION flags {a.flags:#x}")
        limit = cx.server.max_record_size
        log.debug("CREATE_SESSION fore %r back %r", a.fore_chan_attrs, a.back_chan_attrs)
        f, b = a.fore_chan_attrs, a.back_chan_attrs
        _check_channel(f, FORE_MIN, "fore")
        _check_channel(b, BACK_MIN, "back")
        max_response = min(f.maxresponsesize, limit)
        asked = max(1, min(f.maxrequests, MAX_SLOTS))
        cached = min(f.maxresponsesize_cached, MAX_CACHED, max_response)
        back = channel_attrs4.cls(
            0,
            b.maxrequestsize,
            b.maxresponsesize,
            b.maxresponsesize_cached,
            b.maxoperations,
            max(1, min(b.maxrequests, 16)),
            [],
        )
        auth = callback_auth(a.sec_parms, cx.server.gss, _principal_names(cx, cl))
        # the slots and cached size the reply-cache budget allows (appliance.nfs.state.replies)
        slots, cached, reserved = state.slot_replies.grant(asked, cached)
        fore = channel_attrs4.cls(
            0,
            min(f.maxrequestsize, limit),
            max_response,
            cached,
            min(f.maxoperations, cx.server.limits.max_compound_ops),
            slots,
            [],
        )
        sess = state.add_session(
            cl, fore, back, callback=(a.cb_program, a.sec_parms), reserved=reserved
        )
        clients.confirm(state, cl)
        cl.cs_sequence = (cl.cs_sequence + 1) & 0xFFFFFFFF
        sess.backchannel = Backchannel(sess.id, a.cb_program, auth, back.maxrequests, cx.minor)
        # no persistent reply cache and no RDMA; this connection carries the callbacks when
        # the client asks (appliance.nfs.v4.backchannel)
        flags = a.flags & c.CREATE_SESSION4_FLAG_CONN_BACK_CHAN
        if flags:
            sess.backchannel.bind(cx.conn_state["outgoing"])
        res = resok(c.OP_CREATE_SESSION).cls(sess.id, a.sequence, flags, fore, back)
        cl.cs_reply = res
        cx.conn_state.setdefault("sessions", set()).add(sess.id)
        return res


@operation(c.OP_DESTROY_SESSION)
def destroy_session(cx, sessionid):
    cx.state.destroy_session(sessionid)


@operation(c.OP_BIND_CONN_TO_SESSION)
def bind_conn_to_session(cx, a):
    sess = cx.state.session(a.sessid)
    cx.conn_state.setdefault("sessions", set()).add(a.sessid)
    direction = {c.CDFC4_FORE: c.CDFS4_FORE, c.CDFC4_BACK: c.CDFS4_BACK}.get(a.dir, c.CDFS4_BOTH)
    back = sess.backchannel or restored_backchannel(sess, cx.minor)
    if direction != c.CDFS4_FORE and back is not None:
        back.bind(cx.conn_state["outgoing"])
    return resok(c.OP_BIND_CONN_TO_SESSION).cls(a.sessid, direction, False)


@operation(c.OP_DESTROY_CLIENTID)
def destroy_clientid(cx, clientid):
    cx.state.destroy_client(clientid)


@operation(c.OP_RECLAIM_COMPLETE)
def reclaim_complete(cx, one_fs):
    cl = cx.need_client()
    if one_fs:
        return None  # per-filesystem reclaim: nothing migrates here
    cx.state.grace.reclaim_complete(cl)


@operation(c.OP_BACKCHANNEL_CTL)
def backchannel_ctl(cx, a):
    cl = cx.need_client()
    auth = callback_auth(a.sec_parms, cx.server.gss, _principal_names(cx, cl))
    sess = cx.session
    if sess is not None:
        if blocking_forbidden():
            raise WouldBlock("BACKCHANNEL_CTL writes the session's record")
        back = sess.backchannel or restored_backchannel(sess, cx.minor)
        if back is not None:
            back.set_program(a.cb_program, auth)
        # a restart restores the session with these (appliance.nfs.state.sessions)
        sess.callback = (a.cb_program, a.sec_parms)
        cx.state.session_records.save(sess)


@operation(c.OP_TEST_STATEID)
def test_stateid(cx, stateids):
    cl = cx.need_client()
    return [cx.state.test_stateid(sid, cl) for sid in stateids]


@operation(c.OP_FREE_STATEID)
def free_stateid(cx, sid):
    cx.state.free_stateid(cx.stateid(sid), cx.need_client())


def _secinfo(cx):
    node = cx.need_fh()
    cx.cur = None  # SECINFO consumes the current file handle (RFC 8881 2.6.3.1.1.8)
    return secinfo_flavors(cx.server, node.export)


def secinfo_flavors(server, export) -> list:
    """secinfo4 entries of an export in its order of preference; for the pseudo-root, every
    flavour the server takes (AUTH_SYS first: a client that did not ask for Kerberos stays on it
    until an export answers WRONGSEC)."""
    if export is None:
        flavors = [c.AUTH_SYS] + ([KRB5P, KRB5I, KRB5] if server.gss is not None else [])
    else:
        flavors = list(export.flavors)
    out: list[tuple[int, tuple | None]] = []
    for flavor in flavors:
        if flavor == c.AUTH_SYS:
            out += [(c.AUTH_SYS, None), (c.AUTH_NONE, None)]
        else:
            out.append((c.RPCSEC_GSS, (KRB5_OID, 0, SERVICE_OF_FLAVOR[flavor])))
    return out


@operation(c.OP_SECINFO)
def secinfo(cx, name):
    lookup(cx, name)
    return _secinfo(cx)


@operation(c.OP_SECINFO_NO_NAME)
def secinfo_no_name(cx, style):
    if style not in (c.SECINFO_STYLE4_CURRENT_FH, c.SECINFO_STYLE4_PARENT):
        raise NfsError(c.NFS4ERR_INVAL, f"secinfo style {style}: expected 0 or 1")
    if style == c.SECINFO_STYLE4_PARENT:
        node = need_dir(cx)
        if node.pseudo is not None:
            at_root = node.pseudo.parent is None
        else:
            assert node.export is not None  # a node outside the pseudo-root is in an export
            at_root = node.ino == node.export.root_ino
        if at_root:  # RFC 8881 18.45.3: nothing above where the client entered
            raise NfsError(c.NFS4ERR_NOENT, "SECINFO_STYLE4_PARENT at the root of the export")
    return _secinfo(cx)
