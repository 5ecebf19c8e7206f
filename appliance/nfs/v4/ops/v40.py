"""NFSv4.0's own operations (RFC 7530) and its versions of shared ones, registered with
``@operation40`` (the NFSv4.0 executor, compound40, tries these first):

- client ids: SETCLIENTID, SETCLIENTID_CONFIRM, RENEW (appliance.nfs.state.v40);
- owners: OPEN (OPEN4_RESULT_CONFIRM for a new open-owner), OPEN_CONFIRM, CLOSE (its
  stateid remembered for a replay), LOCKT (the client is the lock-owner's),
  RELEASE_LOCKOWNER;
- NFSv4.0 differences: no NFSv4.1 attributes, no OPEN arms of NFSv4.1, SECINFO keeps the
  current file handle (RFC 8881 changed that)."""

from __future__ import annotations

from appliance.nfs.state import NfsError, clients
from appliance.nfs.state import v40 as state40
from appliance.nfs.v4 import attrs as fattr
from appliance.nfs.v4 import const as c
from appliance.nfs.v4.callback40 import Callback40, parse_uaddr
from appliance.nfs.v4.ops import fs, io, locks, session
from appliance.nfs.v4.ops.common import resok
from appliance.nfs.v4.registry import operation40
from appliance.nfs.v4.types import stateid4


# -- client ids --------------------------------------------------------------------------------
def _principal(cx) -> tuple:
    return clients.principal_of(cx.rpc_cred)


@operation40(c.OP_SETCLIENTID)
def setclientid(cx, a):
    # the callback is probed once the client id is confirmed (SETCLIENTID_CONFIRM)
    cl = state40.setclientid(
        cx.state,
        bytes(a.client.id),
        a.client.verifier,
        _principal(cx),
        cx.address,
        a.callback,
        a.callback_ident,
    )
    cl.principal_name = cx.rpc_cred.principal
    return resok(c.OP_SETCLIENTID).cls(cl.clientid, cl.confirm_verifier)


@operation40(c.OP_SETCLIENTID_CONFIRM)
def setclientid_confirm(cx, a):
    cl = cx.client = state40.setclientid_confirm(
        cx.state, a.clientid, a.setclientid_confirm, _principal(cx)
    )
    _callback_path(cx, cl)


def _callback_path(cx, cl) -> None:
    """The confirmed client's callback path: probed (CB_NULL, in the background) when new or
    changed; delegations go to it once it answered. Not for a client that set its id up under
    RPCSEC_GSS: its callbacks would have to be GSS too, which this server cannot send."""
    old = cl.callback_path
    if old is not None and cl.callback is not None and old.same(cl.callback, cl.callback_ident):
        return
    if old is not None:
        old.close()
    cl.callback_path = None
    if cl.callback is None or cx.rpc_cred.flavor not in (c.AUTH_NONE, c.AUTH_SYS):
        return
    location = cl.callback.cb_location
    if parse_uaddr(location.netid, location.addr) is None:  # none given (nfs-rs sends "")
        return
    cl.callback_path = Callback40(cl.callback, cl.callback_ident, cl.clientid)
    cl.callback_path.probe()


@operation40(c.OP_RENEW)
def renew(cx, clientid):
    cl = cx.client = state40.client40(cx.state, clientid)
    # RFC 7530 16.30.4: a client holding delegations learns that they cannot be recalled
    path = cl.callback_path
    if (path is None or not path.usable()) and cx.state.delegations.holds_any(cl):
        raise NfsError(c.NFS4ERR_CB_PATH_DOWN, "the callback path does not answer")


# -- owners ------------------------------------------------------------------------------------
@operation40(c.OP_OPEN)
def open40(cx, a):
    if a.share_access & ~c.OPEN4_SHARE_ACCESS_BOTH:
        raise NfsError(
            c.NFS4ERR_INVAL, f"share access {a.share_access:#x}: NFSv4.0 has no delegation wishes"
        )
    claim = a.claim[0]
    if claim > c.CLAIM_DELEGATE_PREV or (
        a.openhow[0] == c.OPEN4_CREATE and a.openhow[1][0] == c.EXCLUSIVE4_1
    ):
        raise NfsError(c.NFS4ERR_BADXDR, "an OPEN arm of NFSv4.1")
    res = io.open_(cx, a)
    owner = cx.sequenced
    if claim == c.CLAIM_PREVIOUS:
        owner.confirmed = True  # a reclaim needs no OPEN_CONFIRM
    if not owner.confirmed:
        res.rflags |= c.OPEN4_RESULT_CONFIRM
    return res


@operation40(c.OP_OPEN_CONFIRM)
def open_confirm(cx, a):
    node = cx.need_file()
    state = cx.state
    with state.lock:
        st = state40.lookup(state, a.open_stateid, confirmed=False)
        if st.kind != "open" or st.ino != node.ino:
            raise NfsError(c.NFS4ERR_BAD_STATEID, "not an open stateid of this file")
        owner = cx.sequenced
        if owner.confirmed:
            raise NfsError(c.NFS4ERR_BAD_STATEID, "open-owner already confirmed")
        owner.confirmed = True
        st.seqid += 1
        return stateid4.cls(st.seqid, st.other)


@operation40(c.OP_CLOSE)
def close40(cx, a):
    sid = io.close(cx, a)
    cx.sequenced.closed = a.open_stateid.other
    return sid


@operation40(c.OP_LOCKT)
def lockt40(cx, a):
    cx.client = state40.client40(cx.state, a.owner.clientid)
    return locks.lockt(cx, a)


@operation40(c.OP_RELEASE_LOCKOWNER)
def release_lockowner(cx, a):
    cl = state40.client40(cx.state, a.clientid)
    state40.release_lockowner(cx.state, cl, bytes(a.owner))


# -- what RFC 7530 says otherwise ------------------------------------------------------------------
@operation40(c.OP_GETATTR)
def getattr40(cx, words):
    return fs.getattr_(cx, fattr.only_40(words))


@operation40(c.OP_READDIR)
def readdir40(cx, a):
    a.attr_request = fattr.only_40(a.attr_request)
    return fs.readdir(cx, a)


@operation40(c.OP_SECINFO)
def secinfo40(cx, name):
    directory = cx.need_fh()
    flavors = session.secinfo(cx, name)
    cx.cur = directory  # NFSv4.0's SECINFO leaves the current file handle as it was
    return flavors
