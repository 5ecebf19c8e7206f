"""NFSv4.1 client records and leases (RFC 8881 sections 8.3 and 18.35-36): EXCHANGE_ID's
table of cases, the confirmation of a record by CREATE_SESSION, and lease expiry.

A client owner has at most one confirmed record (``StateTable.by_owner``) and one
unconfirmed record (``StateTable.unconfirmed41``), both in ``StateTable.clients`` by client
id. An EXCHANGE_ID with a new verifier (the client restarted) makes an unconfirmed record and
leaves the confirmed one, its sessions and its state working until CREATE_SESSION confirms the
new client id (18.35.5 case 5); one from another principal replaces a confirmed record that
holds no state at once (case 3), and gets NFS4ERR_CLID_INUSE while it holds some.

Leases: a client that has not renewed for one lease is expired. This server is courteous
(8.3): an expired client keeps its state until another client's request conflicts with it
(Leases.evict_if_expired drops the expired client then, and the request goes on) or the
housekeeping reaps it after COURTESY_LEASES leases. Unconfirmed records go after one lease.
NFSv4.0 clients (appliance.nfs.state.v40) share the table and these rules."""

from __future__ import annotations

import logging
import time

from appliance.nfs.state.model import Client, NfsError
from appliance.nfs.state.table import StateTable
from appliance.nfs.v4 import const as c

log = logging.getLogger("shingle.nfs.state")

# an expired client nobody conflicted with is reaped after this many leases without renewal
COURTESY_LEASES = 1.5


def principal_of(cred) -> tuple:
    """Who made a client record, as state operations compare it: (flavour, uid) for AUTH_SYS
    and AUTH_NONE; (flavour, uid, Kerberos name) for RPCSEC_GSS, as knfsd compares the names,
    so that two principals mapped to one uid (machine principals of two hosts, users without
    a local account: all unmapped) are never the same client."""
    if cred.flavor == c.RPCSEC_GSS:
        return (cred.flavor, cred.uid, cred.principal)
    return (cred.flavor, cred.uid)


def exchange_id(
    state: StateTable, owner: bytes, verifier: bytes, principal: tuple, address: str, update: bool
) -> Client:
    """The record EXCHANGE_ID answers with, by the cases of RFC 8881 18.35.5 (``update``:
    EXCHGID4_FLAG_UPD_CONFIRMED_REC_A)."""
    with state.lock:
        conf = state.by_owner.get(owner)
        if update:
            if conf is None:  # case 7: nothing confirmed to update
                raise NfsError(c.NFS4ERR_NOENT, "no confirmed record of this client owner")
            if conf.principal != principal:  # case 9
                raise NfsError(c.NFS4ERR_PERM, "the record belongs to another principal")
            if conf.verifier != verifier:  # case 8
                raise NfsError(c.NFS4ERR_NOT_SAME, "the record has another verifier")
            conf.last_renew = time.monotonic()
            return conf  # case 6: nothing to update with SP4_NONE and no callbacks
        if conf is not None:
            if conf.principal != principal:  # case 3: a collision of two clients
                if conf.states and not state.leases.evict_if_expired(conf):
                    raise NfsError(c.NFS4ERR_CLID_INUSE, "client owner in use by another principal")
                # a record without state goes at once (18.35.5 case 3), unlike a restarted
                # client's (case 5), which must keep working until CREATE_SESSION
                if conf.clientid in state.clients:
                    state.expire_client(conf)
            elif conf.verifier == verifier:  # case 2: the same client again
                conf.last_renew = time.monotonic()
                return conf
        # case 1 (new owner), 3 (the record without state is gone), 4 (an unconfirmed record is
        # replaced) and 5 (the client restarted: the confirmed record stays until CREATE_SESSION)
        old = state.unconfirmed41.pop(owner, None)
        if old is not None:
            state.clients.pop(old.clientid, None)
        cl = Client(state.new_clientid(), owner, verifier, principal, address)
        cl.may_reclaim = state.may_reclaim(owner, principal)
        state.clients[cl.clientid] = cl
        state.unconfirmed41[owner] = cl
        return cl


def confirm(state: StateTable, cl: Client) -> None:
    """CREATE_SESSION confirms ``cl``: a confirmed record it replaces goes with its state."""
    if cl.confirmed:
        return
    if state.unconfirmed41.get(cl.owner) is cl:
        del state.unconfirmed41[cl.owner]
    old = state.by_owner.get(cl.owner)
    if old is not None and old is not cl:
        state.expire_client(old)
    state.by_owner[cl.owner] = cl
    state.confirm(cl)


def unconfirmed_client(state: StateTable, clientid: int, principal: tuple) -> Client:
    """The record CREATE_SESSION names (RFC 8881 18.36.4): an unconfirmed record must come
    from the principal that made it, and lives one lease."""
    cl = state.client(clientid)
    if cl.confirmed:
        return cl
    if time.monotonic() - cl.last_renew > state.lease_seconds:
        drop_unconfirmed(state, cl)
        raise NfsError(
            c.NFS4ERR_STALE_CLIENTID, f"client id {clientid:x} was not confirmed within a lease"
        )
    if cl.principal != principal:
        raise NfsError(
            c.NFS4ERR_CLID_INUSE, "CREATE_SESSION by another principal than EXCHANGE_ID's"
        )
    return cl


def drop_unconfirmed(state: StateTable, cl: Client) -> None:
    state.clients.pop(cl.clientid, None)
    if state.unconfirmed41.get(cl.owner) is cl:
        del state.unconfirmed41[cl.owner]


def expire_idle(state: StateTable) -> int:
    """Housekeeping: reap courtesy clients and unconfirmed records; returns how many
    confirmed clients went."""
    now = time.monotonic()
    lease = state.lease_seconds
    busy = state.leases.busy
    with state.lock:
        idle = [
            cl
            for cl in state.clients.values()
            if cl.confirmed and now - cl.last_renew > lease * COURTESY_LEASES and not busy(cl)
        ]
        for cl in idle:
            log.info("lease of client %x expired", cl.clientid)
            state.expire_client(cl)
        for cl in list(state.unconfirmed41.values()):
            if now - cl.last_renew > lease:
                drop_unconfirmed(state, cl)
        for clientid, cl in list(state.unconfirmed40.items()):
            if now - cl.last_renew > lease:
                del state.unconfirmed40[clientid]
        state.delegations.expire_recalls()
        state.grace.release_idle_records()  # (ends the grace period when its time is up)
        return len(idle)
