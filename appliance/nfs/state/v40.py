"""What only NFSv4.0 (RFC 7530) keeps in the state table: client records made by SETCLIENTID
and confirmed by SETCLIENTID_CONFIRM (sections 16.33-34), leases renewed by the operations that
name a client id or a stateid (section 9), and the open- and lock-owners with their
sequence ids and last replies (section 9.1), which do the job NFSv4.1's session reply
cache does.

The records live in the one StateTable (appliance.nfs.state), so opens and locks of
NFSv4.0 and NFSv4.1 clients conflict with each other."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

from appliance.nfs.state.core import SPECIAL_OTHERS
from appliance.nfs.state.model import Client, LockState, NfsError, OpenState
from appliance.nfs.state.table import StateTable
from appliance.nfs.v4 import const as c
from appliance.nfs.v4.types import clientaddr4, stateid4

# An NFSv4.0 client id string and an NFSv4.1 client owner are separate name spaces (a Linux
# client uses both for the same host): NFSv4.0 records carry this prefix in Client.owner
OWNER_PREFIX = b"nfs4.0:"
SEQID_MASK = 0xFFFFFFFF
# Errors after which the owner's sequence id does not advance (RFC 7530 section 9.1)
NOT_SEQUENCED = frozenset(
    {
        c.NFS4ERR_STALE_CLIENTID,
        c.NFS4ERR_STALE_STATEID,
        c.NFS4ERR_BAD_STATEID,
        c.NFS4ERR_BAD_SEQID,
        c.NFS4ERR_BADXDR,
        c.NFS4ERR_RESOURCE,
        c.NFS4ERR_NOFILEHANDLE,
        c.NFS4ERR_MOVED,
    }
)
OPEN_OWNER, LOCK_OWNER = "open", "lock"


@dataclass
class Owner:
    """An NFSv4.0 open- or lock-owner: the last sequence id it used and that request's reply
    (an encoded nfs_resop4), replayed when the same sequence id comes again."""

    kind: str
    owner: bytes
    seqid: int | None = None  # None: no request yet, the first one sets it
    confirmed: bool = False  # open-owners: OPEN_CONFIRM done (lock-owners need none)
    reply: bytes | None = None
    reply_status: int = c.NFS4_OK
    reply_fh: object = None  # the current file handle after the reply (OPEN sets one)
    closed: bytes | None = None  # "other" of the stateid its last CLOSE ended
    lock: threading.Lock = field(default_factory=threading.Lock)


# -- client records ----------------------------------------------------------------------------
def setclientid(
    state: StateTable,
    ident: bytes,
    verifier: bytes,
    principal: tuple,
    address: str,
    callback,
    callback_ident: int = 0,
) -> Client:
    """An unconfirmed record for SETCLIENTID (RFC 7530 16.33.5): the same client id when a
    confirmed client only updates its callback, a new one otherwise."""
    owner = OWNER_PREFIX + ident
    with state.lock:
        conf = state.by_owner.get(owner)
        if conf is not None and conf.principal != principal and conf.states:
            cb = conf.callback.cb_location if conf.callback is not None else None
            raise NfsError(
                c.NFS4ERR_CLID_INUSE,
                "client id in use by another principal",
                cb or clientaddr4.cls("", ""),
            )
        for clientid, old in list(state.unconfirmed40.items()):
            if old.owner == owner:
                del state.unconfirmed40[clientid]
        same = conf is not None and conf.verifier == verifier and conf.principal == principal
        clientid = conf.clientid if same and conf is not None else state.new_clientid()
        cl = Client(
            clientid,
            owner,
            verifier,
            principal,
            address,
            minor=c.MINOR_VERSION_40,
            confirm_verifier=os.urandom(8),
            callback=callback,
            callback_ident=callback_ident,
        )
        cl.may_reclaim = state.may_reclaim(owner, principal)
        state.unconfirmed40[clientid] = cl
        return cl


def setclientid_confirm(
    state: StateTable, clientid: int, verifier: bytes, principal: tuple
) -> Client:
    with state.lock:
        new = state.unconfirmed40.get(clientid)
        if new is not None and new.confirm_verifier == verifier:
            if new.principal != principal:
                raise NfsError(c.NFS4ERR_CLID_INUSE, "confirmed by another principal")
            del state.unconfirmed40[clientid]
            conf = state.by_owner.get(new.owner)
            if conf is not None and conf.clientid == clientid:  # a callback update
                conf.callback, conf.confirm_verifier = new.callback, new.confirm_verifier
                conf.callback_ident = new.callback_ident
                conf.last_renew = time.monotonic()
                return conf
            if conf is not None:  # the client restarted (new verifier): its old state goes
                state.expire_client(conf)
            state.clients[clientid] = new
            state.by_owner[new.owner] = new
            new.last_renew = time.monotonic()
            state.confirm(new)
            return new
        conf = state.clients.get(clientid)
        if (
            conf is not None
            and conf.minor == c.MINOR_VERSION_40
            and conf.confirm_verifier == verifier
        ):
            conf.last_renew = time.monotonic()
            return conf  # a retransmitted SETCLIENTID_CONFIRM
        raise NfsError(
            c.NFS4ERR_STALE_CLIENTID, f"no SETCLIENTID of client id {clientid:x} with this verifier"
        )


def client40(state: StateTable, clientid: int) -> Client:
    """The confirmed NFSv4.0 client an operation names; renews its lease."""
    cl = state.clients.get(clientid)
    if cl is None or cl.minor != c.MINOR_VERSION_40:
        if clientid >> 32 != state.boot or clientid in state.unconfirmed40 or cl is not None:
            raise NfsError(c.NFS4ERR_STALE_CLIENTID, f"client id {clientid:x} unknown here")
        raise NfsError(c.NFS4ERR_EXPIRED, f"lease of client {clientid:x} expired")
    cl.last_renew = time.monotonic()
    return cl


# -- which client a connection carries ------------------------------------------------------------
CONNECTION_CLIENT = "client40"  # conn_state key: the client, or False once two were seen


def connection_client(conn_state: dict, state: StateTable) -> Client | None:
    """The NFSv4.0 client this connection carries: the one its operations named (a client
    id, an open's or a lock's stateid) while no other live client's did. A 4.0 COMPOUND of
    GETATTR, REMOVE, RENAME or LINK names no client; the Linux client sends all of a mount's
    calls over one connection, so this tells a delegation's holder from another client."""
    cl = conn_state.get(CONNECTION_CLIENT)
    if not cl or state.clients.get(cl.clientid) is not cl:
        return None
    return cl


def note_connection_client(conn_state: dict, state: StateTable, cl: Client) -> None:
    """An operation on this connection named ``cl``: it carries ``cl`` unless another live
    client was seen on it first (then none, for good)."""
    seen = conn_state.get(CONNECTION_CLIENT)
    if seen is cl or seen is False or cl.minor != c.MINOR_VERSION_40:
        return
    if seen is None or state.clients.get(seen.clientid) is not seen:
        conn_state[CONNECTION_CLIENT] = cl  # the first, or one whose record went
    else:
        conn_state[CONNECTION_CLIENT] = False


# -- stateids ------------------------------------------------------------------------------------
def missing(state: StateTable, other: bytes) -> NfsError:
    """The error for a stateid the table does not hold (RFC 7530 9.1.4). A special stateid
    where an open's or a lock's is needed (OPEN_CONFIRM, CLOSE, LOCK ...) is a bad one: its
    "other" holds no server instance to be stale of."""
    if other in SPECIAL_OTHERS:
        return NfsError(c.NFS4ERR_BAD_STATEID, "a special stateid names no open or lock")
    boot, clientid = state.other_parts(other)
    if boot != state.boot:
        return NfsError(c.NFS4ERR_STALE_STATEID, "stateid from an earlier server instance")
    if clientid not in state.clients:
        return NfsError(c.NFS4ERR_EXPIRED, "stateid of a client whose lease expired")
    return NfsError(c.NFS4ERR_BAD_STATEID, "stateid unknown")


def open_owner_of(st) -> Owner | None:
    if st.kind == "deleg":  # a delegation has no open-owner to confirm
        return None
    key = (OPEN_OWNER, st.owner if st.kind == "open" else st.open.owner)
    return st.client.owners.get(key)


def lookup(state: StateTable, sid, *, confirmed: bool = True):
    """The open or lock state of an NFSv4.0 stateid, its sequence id matching exactly (NFSv4.0
    has no "current" seqid 0); renews its client's lease. ``confirmed``: an open-owner still
    waiting for OPEN_CONFIRM has no usable stateid yet."""
    with state.lock:
        st = state.states.get(sid.other)
        if st is None:
            raise missing(state, sid.other)
        if st.client.minor != c.MINOR_VERSION_40:
            raise NfsError(c.NFS4ERR_BAD_STATEID, "stateid of an NFSv4.1 client")
        if sid.seqid != st.seqid:
            old = (st.seqid - sid.seqid) & SEQID_MASK < 1 << 31
            raise NfsError(
                c.NFS4ERR_OLD_STATEID if old else c.NFS4ERR_BAD_STATEID,
                f"stateid seqid {sid.seqid}, current {st.seqid}",
            )
        if confirmed:
            owner = open_owner_of(st)
            if owner is not None and not owner.confirmed:
                raise NfsError(c.NFS4ERR_BAD_STATEID, "open not confirmed (OPEN_CONFIRM)")
        st.client.last_renew = time.monotonic()
        return st


# -- owners ------------------------------------------------------------------------------------
def owner_for(cl: Client, kind: str, owner: bytes, *, create: bool = True) -> Owner | None:
    key = (kind, owner)
    found = cl.owners.get(key)
    if found is None and create:
        found = cl.owners[key] = Owner(kind, owner)
    return found


def closed_owner(state: StateTable, other: bytes) -> Owner | None:
    """The open-owner whose last CLOSE ended the stateid ``other`` (for replaying that CLOSE)."""
    cl = state.clients.get(state.other_parts(other)[1])
    if cl is None:
        return None
    for owner in cl.owners.values():
        if owner.closed == other:
            return owner
    return None


def is_replay(owner: Owner, seqid: int) -> bool:
    """Whether a request with ``seqid`` is the owner's last one again (its reply is replayed);
    raises BAD_SEQID unless it is that or the next one."""
    if owner.seqid is None:
        return False
    if seqid == owner.seqid and owner.reply is not None:
        return True
    if seqid != (owner.seqid + 1) & SEQID_MASK:
        raise NfsError(
            c.NFS4ERR_BAD_SEQID,
            f"{owner.kind}-owner seqid {seqid}, expected {(owner.seqid + 1) & SEQID_MASK}",
        )
    return False


def check_next(owner: Owner, seqid: int) -> None:
    """A second owner of one request (the lock-owner of a LOCK that starts it from an open)
    must be at its next sequence id."""
    if owner.seqid is not None and seqid != (owner.seqid + 1) & SEQID_MASK:
        raise NfsError(
            c.NFS4ERR_BAD_SEQID,
            f"{owner.kind}-owner seqid {seqid}, expected {(owner.seqid + 1) & SEQID_MASK}",
        )


def drop_unconfirmed_owner(state: StateTable, cl: Client, owner: Owner) -> None:
    """An OPEN of an open-owner that never confirmed starts it again (RFC 7530 16.16.5):
    the opens it made go."""
    with state.lock:
        for other in list(cl.states):
            st = state.states.get(other)
            if isinstance(st, OpenState) and st.owner == owner.owner:
                state.shares.close(st)
        cl.owners.pop((OPEN_OWNER, owner.owner), None)


def release_lockowner(state: StateTable, cl: Client, owner: bytes) -> None:
    """RELEASE_LOCKOWNER: the lock-owner's lock stateids and its sequence go, unless it still
    holds locks."""
    with state.lock:
        mine = [
            st
            for st in (state.states.get(o) for o in cl.states)
            if isinstance(st, LockState) and st.owner == owner
        ]
        if any(lk.ranges for lk in mine):
            raise NfsError(c.NFS4ERR_LOCKS_HELD, "the lock-owner still holds locks")
        for lk in mine:
            state.free_stateid(stateid4.cls(lk.seqid, lk.other), cl)
        cl.owners.pop((LOCK_OWNER, owner), None)
