"""Byte-range locks and delegations: LOCK, LOCKT, LOCKU, DELEGRETURN."""

from __future__ import annotations

from appliance.nfs.state import NfsError, is_write, lock_range
from appliance.nfs.v4 import const as c
from appliance.nfs.v4.ops.io import (
    check_new_lock,
    need_io_rights,
    need_regular,
    open_state,
    released,
)
from appliance.nfs.v4.registry import operation


# -- byte-range locks ----------------------------------------------------------------------------
@operation(c.OP_LOCK)
def lock(cx, a):
    node = cx.need_file()
    cl = cx.need_client()
    state = cx.state
    start, end = lock_range(a.offset, a.length)
    if a.locktype not in (c.READ_LT, c.WRITE_LT, c.READW_LT, c.WRITEW_LT):
        raise NfsError(c.NFS4ERR_INVAL, f"lock type {a.locktype}")
    # a lock needs the caller's read permission, not only an open stateid (as knfsd)
    need_io_rights(cx, node, c.OPEN4_SHARE_ACCESS_READ)
    grace = state.grace.in_grace()
    if a.reclaim:
        if not grace:
            raise NfsError(c.NFS4ERR_NO_GRACE, "lock reclaim outside the grace period")
        if not cl.may_reclaim or (cl.reclaim_complete and not cl.reclaim_needed):
            raise NfsError(c.NFS4ERR_RECLAIM_BAD, "this client has nothing to reclaim")
    else:
        check_new_lock(state, cl)
    with state.lock:
        new, arg = a.locker
        if new:
            open_st = open_state(cx, arg.open_stateid, node)
            lk = state.locks.state_for(cl, open_st, bytes(arg.lock_owner.owner))
        else:
            lk = state.find(cx.stateid(arg.lock_stateid), cl)
            if lk.kind != "lock" or lk.ino != node.ino:
                raise NfsError(c.NFS4ERR_BAD_STATEID, "not a lock stateid of this file")
        if is_write(a.locktype) and not lk.open.access & c.OPEN4_SHARE_ACCESS_WRITE:
            raise NfsError(c.NFS4ERR_OPENMODE, "write lock on a file not open for writing")
        state.locks.add(lk, start, end, a.locktype, reclaim=a.reclaim)
        return cx.set_stateid(lk)


@operation(c.OP_LOCKT)
def lockt(cx, a):
    node = cx.need_file()
    need_regular(cx, cx.ns.getattr(node.ino), "LOCKT")
    cl = cx.need_client()
    start, end = lock_range(a.offset, a.length)
    if cx.state.grace.in_grace():
        raise NfsError(c.NFS4ERR_GRACE, "server in grace period")
    with cx.state.lock:
        hit = cx.state.locks.conflict_anywhere(
            cl, bytes(a.owner.owner), node.ino, start, end, a.locktype
        )
        if hit is not None:
            raise NfsError(c.NFS4ERR_DENIED, "lock conflict", cx.state.locks.denied(hit))


@operation(c.OP_LOCKU)
def locku(cx, a):
    node = cx.need_file()
    start, end = lock_range(a.offset, a.length)
    with cx.state.lock:
        lk = cx.state.find(cx.stateid(a.lock_stateid), cx.need_client())
        if lk.kind != "lock" or lk.ino != node.ino:
            raise NfsError(c.NFS4ERR_BAD_STATEID, "not a lock stateid of this file")
        cx.state.locks.unlock(lk, start, end)
        released(cx.state)
        return cx.set_stateid(lk)


@operation(c.OP_DELEGRETURN)
def delegreturn(cx, sid):
    node = cx.need_file()
    state = cx.state
    with state.lock:
        st = state.find(cx.stateid(sid), cx.need_client())
        if st.kind != "deleg" or st.ino != node.ino:
            raise NfsError(c.NFS4ERR_BAD_STATEID, "not a delegation of this file")
        state.delegations.give_back(st)
