"""NFSv4.0's own operations (RFC 7530) and its versions of shared ones, registered with
``@operation40`` (the NFSv4.0 executor, compound40, tries these first):

- client ids: SETCLIENTID, SETCLIENTID_CONFIRM, RENEW (appliance.nfs.state.v40);
- owners: OPEN (OPEN4_RESULT_CONFIRM for a new open-owner), OPEN_CONFIRM, CLOSE (its
  stateid remembered for a replay), LOCKT (the client is the lock-owner's),
  RELEASE_LOCKOWNER;
- NFSv4.0 differences: no NFSv4.1 attributes, no OPEN arms of NFSv4.1, SECINFO keeps the
  current file handle (RFC 8881 changed that)."""

from __future__ import annotations

from appliance.nfs.state import NfsError
from appliance.nfs.state import v40 as state40
from appliance.nfs.v4 import attrs as fattr
from appliance.nfs.v4 import const as c
from appliance.nfs.v4.ops import fs, io, locks, session
from appliance.nfs.v4.ops.common import resok
from appliance.nfs.v4.registry import operation40
from appliance.nfs.v4.types import stateid4


# -- client ids --------------------------------------------------------------------------------
def _principal(cx) -> tuple:
    return (cx.rpc_cred.flavor, cx.rpc_cred.uid)


@operation40(c.OP_SETCLIENTID)
def setclientid(cx, a):
    # the callback is recorded, never called: NFSv4.0 clients get no delegations
    cl = state40.setclientid(
        cx.state, bytes(a.client.id), a.client.verifier, _principal(cx), cx.address, a.callback
    )
    return resok(c.OP_SETCLIENTID).cls(cl.clientid, cl.confirm_verifier)


@operation40(c.OP_SETCLIENTID_CONFIRM)
def setclientid_confirm(cx, a):
    state40.setclientid_confirm(cx.state, a.clientid, a.setclientid_confirm, _principal(cx))


@operation40(c.OP_RENEW)
def renew(cx, clientid):
    state40.client40(cx.state, clientid)


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
