"""NFSv4 state: clients, sessions and their slot tables (the reply cache),
open and lock stateids, share reservations, byte-range locks, leases and the
grace period after a restart. NFSv4.0 and NFSv4.1 clients share this one table, so their
share reservations and locks conflict; what only NFSv4.0 has (client records confirmed by
SETCLIENTID_CONFIRM, open- and lock-owner sequence ids) is in appliance.nfs.v4.state40.

All of it lives behind one lock (``StateTable.lock``): state operations are
short, and one lock keeps conflicts across clients simple to reason about.
Client records are also kept in the catalog (nfs_clients) so that a
restarted server knows who may reclaim during its grace period: a record's held_state says
that its client held opens or locks (set before the first one is granted, cleared by the
housekeeping and at a clean stop once it holds none), and only such clients hold the grace
period, which ends once each has finished reclaiming (RECLAIM_COMPLETE; for NFSv4.0 its
first new OPEN or LOCK after a reclaim) or at grace_seconds."""

from __future__ import annotations

import json
import logging
import os
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import delete, select, update

from appliance.nfs.onc.drc import DuplicateRequestCache
from appliance.nfs.v4 import const as c
from appliance.nfs.v4.types import LOCK4denied, channel_attrs4, state_owner4
from engine.blocking import may_block
from engine.catalog.models import NfsClient, Setting

log = logging.getLogger("shingle.nfs.state")

CLIENTS = NfsClient.__table__
SETTINGS = Setting.__table__
# Sessions survive a restart (so a client "carries on"): one settings row each
SESSION_PREFIX = "nfs_session_"
INF = 1 << 64  # end of a lock "to end of file"
SLOTS_MAX = 64
# a stateid's "other": server instance, the low half of its client's id, a counter (NFSv4.0
# tells a stateid of an expired client from a bad one by the client id)
_OTHER = struct.Struct(">III")
# the "other" of the special stateids (anonymous, READ bypass): never an open's or a lock's
SPECIAL_OTHERS = frozenset({b"\0" * 12, b"\xff" * 12})


class NfsError(Exception):
    """An operation failed with ``status``; ``payload`` is the error arm (LOCK4denied)."""

    def __init__(self, status: int, message: str = "", payload=None):
        super().__init__(message or f"status {status}")
        self.status = status
        self.payload = payload


@dataclass
class Slot:
    seqid: int | None = 0  # None: restored after a restart, the next seqid is accepted
    reply: list | None = None  # cached reply chunks (None: not cached)
    fingerprint: tuple | None = None
    busy: bool = False


@dataclass
class Session:
    id: bytes
    client: Client
    slots: list
    fore: Any  # channel_attrs4
    back: Any
    max_ops: int
    max_cached: int
    max_request: int
    max_response: int


@dataclass
class Client:
    clientid: int
    owner: bytes
    verifier: bytes
    principal: tuple
    address: str
    confirmed: bool = False
    cs_sequence: int = 1  # next expected CREATE_SESSION sequence
    cs_reply: object = None
    sessions: dict = field(default_factory=dict)
    last_renew: float = field(default_factory=time.monotonic)
    may_reclaim: bool = False
    reclaim_complete: bool = False
    # a session restored after a restart: its opens and locks died with the previous
    # instance; SEQUENCE asks the client to reclaim them until its next RECLAIM_COMPLETE
    reclaim_needed: bool = False
    states: set = field(default_factory=set)  # stateid "other" values
    minor: int = 1
    # NFSv4.0 only: SETCLIENTID's confirm verifier and callback (recorded, never called: no
    # delegations are granted), and the open/lock-owners by (kind, owner) (state40.Owner)
    confirm_verifier: bytes = b""
    callback: Any = None  # cb_client4
    owners: dict = field(default_factory=dict)
    # an NFSv3 lock host (NLM) holds no lease: NSM tells when it restarted
    leased: bool = True
    # its catalog record says it holds opens or locks (a restart then holds grace for it)
    held_state_recorded: bool = False


@dataclass
class OpenState:
    other: bytes
    client: Client
    ino: int
    owner: bytes
    seqid: int = 1
    access: int = 0
    deny: int = 0
    locks: set = field(default_factory=set)
    # the (access, deny) pair of each OPEN merged into this one: an OPEN_DOWNGRADE must name
    # what closing some of them would leave (RFC 7530 16.19.4)
    modes: set = field(default_factory=set)

    kind = "open"


@dataclass
class LockState:
    other: bytes
    client: Client
    ino: int
    owner: bytes
    open: OpenState
    seqid: int = 1
    ranges: list = field(default_factory=list)  # (start, end, type) with end exclusive

    kind = "lock"


def overlaps(a0, a1, b0, b1) -> bool:
    return a0 < b1 and b0 < a1


def lock_range(offset: int, length: int) -> tuple[int, int]:
    if length == 0:
        raise NfsError(c.NFS4ERR_INVAL, "lock length 0")
    if length == c.NFS4_UINT64_MAX:
        return offset, INF
    end = offset + length
    if end > INF:
        raise NfsError(c.NFS4ERR_INVAL, f"lock range {offset}+{length} passes 2^64")
    return offset, end


def is_write(locktype: int) -> bool:
    return locktype in (c.WRITE_LT, c.WRITEW_LT)


class StateTable:
    def __init__(self, catalog, namespace, *, lease_seconds: int, grace_seconds: int | None):
        self.catalog = catalog
        self.namespace = namespace
        self.lease_seconds = lease_seconds
        self.lock = threading.RLock()
        # random, not the clock: two starts within a second must not share ids
        self.boot = int.from_bytes(os.urandom(4), "big")
        self.counter = 0
        self.clients: dict[int, Client] = {}
        self.by_owner: dict[bytes, Client] = {}  # confirmed records
        # NFSv4.1 EXCHANGE_ID records not yet confirmed by CREATE_SESSION, by owner (clients.py)
        self.unconfirmed41: dict[bytes, Client] = {}
        self.sessions: dict[bytes, Session] = {}
        self.states: dict[bytes, OpenState | LockState] = {}
        self.opens_by_file: dict[int, list[OpenState]] = {}
        self.locks_by_file: dict[int, list[LockState]] = {}
        self.open_by_owner_file: dict[tuple, OpenState] = {}
        self.lock_by_owner_file: dict[tuple, LockState] = {}
        self.nlm_hosts: dict[str, Client] = {}  # NFSv3 lock clients (see "NLM locks")
        # NFSv4.0's reply cache for retransmits (NFSv4.1's is the session slots)
        self.reply_cache40 = DuplicateRequestCache()
        # NFSv4.0 SETCLIENTID records not yet confirmed, by client id (appliance.nfs.v4.state40)
        self.unconfirmed40: dict[int, Client] = {}
        # restart: clients of the previous instance that held opens or locks may reclaim
        # them, and only they hold the grace period
        previous = self._load_previous_clients()
        self.reclaimable: set[bytes] = {owner for owner, held in previous.items() if held}
        self._restore_sessions()
        self._forget_stateless_records(previous)
        grace = lease_seconds if grace_seconds is None else grace_seconds
        self.grace_end = time.monotonic() + grace if self.reclaimable and grace > 0 else 0.0
        if self.grace_end:
            log.info("grace period of %d s for %d previous clients", grace, len(self.reclaimable))
            self._maybe_end_grace_early()

    # -- ids -------------------------------------------------------------------------
    def _next(self) -> int:
        self.counter += 1
        return self.counter

    def new_clientid(self) -> int:
        return (self.boot << 32) | self._next()

    def new_other(self, cl: Client) -> bytes:
        return _OTHER.pack(self.boot, cl.clientid & 0xFFFFFFFF, self._next() & 0xFFFFFFFF)

    def other_parts(self, other: bytes) -> tuple[int, int]:
        """(server instance, client id) a stateid's "other" was made for."""
        boot, client_low, _ = _OTHER.unpack(other)
        return boot, (boot << 32) | client_low

    # -- grace ---------------------------------------------------------------------------
    def in_grace(self) -> bool:
        if self.grace_end and time.monotonic() >= self.grace_end:
            self._end_grace()
        return bool(self.grace_end)

    def _end_grace(self) -> None:
        self.grace_end = 0.0
        stale = self.reclaimable
        self.reclaimable = set()
        if stale:
            current = {cl.owner for cl in self.clients.values()}
            gone = [o for o in stale if o not in current]
            if gone:
                self.catalog.run(
                    lambda conn: conn.execute(delete(CLIENTS).where(CLIENTS.c.owner.in_(gone)))
                )
        log.info("grace period over")

    def _maybe_end_grace_early(self) -> None:
        # every previous client that held state has reclaimed: no reason to hold new ones back
        done = {
            cl.owner
            for cl in self.clients.values()
            if cl.reclaim_complete and not cl.reclaim_needed
        }
        if self.grace_end and self.reclaimable <= done:
            self._end_grace()

    def reclaimed40(self, cl: Client) -> None:
        """An NFSv4.0 client asks for a new open or lock: once it holds state again (in the
        grace period only reclaims give any), its reclaim is over. RFC 7530 has no
        RECLAIM_COMPLETE; the Linux client reclaims everything before new opens go out."""
        if cl.reclaim_complete or not cl.states:
            return
        with self.lock:
            cl.reclaim_complete = True
            self._maybe_end_grace_early()

    # -- catalog records -------------------------------------------------------------------
    def _load_previous_clients(self) -> dict[bytes, bool]:
        """Owner -> whether it held opens or locks, of the previous instance's clients."""
        rows = self.catalog.read(
            lambda conn: conn.execute(
                select(CLIENTS.c.owner, CLIENTS.c.held_state).where(CLIENTS.c.confirmed.is_(True))
            ).all()
        )
        return {bytes(r.owner): bool(r.held_state) for r in rows}

    def _forget_stateless_records(self, previous: dict[bytes, bool]) -> None:
        # nothing to reclaim and no session to carry on: a record made again if it comes back
        gone = [
            owner for owner, held in previous.items() if not held and owner not in self.by_owner
        ]
        if gone:
            self.catalog.run(
                lambda conn: conn.execute(delete(CLIENTS).where(CLIENTS.c.owner.in_(gone)))
            )

    def record_held_state(self, cl: Client) -> None:
        """Before ``cl``'s first open is granted (every lock needs one): its record says it
        holds state, durably, so that a restart keeps the grace period for it."""
        if cl.held_state_recorded or not cl.leased:
            return
        owner = cl.owner
        cl.held_state_recorded = True
        try:
            rows = self.catalog.run(
                lambda conn: (
                    conn.execute(
                        update(CLIENTS).where(CLIENTS.c.owner == owner).values(held_state=True)
                    ).rowcount
                ),
                durable=True,
                tracked=True,  # nothing cached reads client records: the caches stay valid
            )
            if not rows:  # its record was lost (a catalog outage at confirm): made again
                self._record_client(cl)
        except BaseException:
            cl.held_state_recorded = False
            raise

    def release_idle_records(self) -> None:
        """Housekeeping and a clean stop: the records of clients that hold no opens or locks
        any more stop holding a future grace period. Not during one: a client that has not
        reclaimed yet holds nothing and must keep its record's mark."""
        with self.lock:
            if self.in_grace():
                return
            idle = [
                cl
                for cl in self.clients.values()
                if cl.held_state_recorded and not cl.states and cl.leased
            ]
            if not idle:
                return
            owners = [cl.owner for cl in idle]
            self.catalog.run(
                lambda conn: conn.execute(
                    update(CLIENTS).where(CLIENTS.c.owner.in_(owners)).values(held_state=False)
                ),
                tracked=True,
            )
            for cl in idle:
                cl.held_state_recorded = False

    def _record_client(self, cl: Client) -> None:
        now = time.time_ns()
        # a new record of an owner that has not reclaimed yet keeps its mark through another
        # restart
        held = cl.held_state_recorded = (
            cl.held_state_recorded or bool(cl.states) or cl.owner in self.reclaimable
        )

        def work(conn):
            conn.execute(delete(CLIENTS).where(CLIENTS.c.owner == cl.owner))
            conn.execute(
                CLIENTS.insert().values(
                    clientid=cl.clientid & ((1 << 63) - 1),
                    owner=cl.owner,
                    verifier=cl.verifier,
                    address=cl.address[:64],
                    minor_version=cl.minor,
                    confirmed=True,
                    reclaim_complete=cl.reclaim_complete,
                    held_state=held,
                    created_ns=now,
                    last_seen_ns=now,
                )
            )

        self.catalog.run(work)

    # -- persistent sessions -------------------------------------------------------------------
    def _session_record(self, sess: Session) -> str:
        cl = sess.client
        return json.dumps(
            {
                "clientid": cl.clientid,
                "owner": cl.owner.hex(),
                "verifier": cl.verifier.hex(),
                "principal": list(cl.principal),
                "address": cl.address,
                "cs_sequence": cl.cs_sequence,
                "reclaim_complete": cl.reclaim_complete,
                "slots": len(sess.slots),
                "fore": list(sess.fore)[:-1],
                "back": list(sess.back)[:-1],
            }
        )

    def _save_session(self, sess: Session) -> None:
        self.catalog.set_setting(SESSION_PREFIX + sess.id.hex(), self._session_record(sess))

    def _drop_session_record(self, sid: bytes) -> None:
        key = SESSION_PREFIX + sid.hex()
        self.catalog.run(lambda conn: conn.execute(delete(SETTINGS).where(SETTINGS.c.key == key)))

    def _restore_sessions(self) -> None:
        rows = self.catalog.read(
            lambda conn: conn.execute(
                select(SETTINGS.c.key, SETTINGS.c.value).where(
                    SETTINGS.c.key.like(SESSION_PREFIX + "%")
                )
            ).all()
        )
        for row in rows:
            try:
                rec = json.loads(row.value)
                sid = bytes.fromhex(row.key[len(SESSION_PREFIX) :])
                owner = bytes.fromhex(rec["owner"])
                cl = self.by_owner.get(owner)
                if cl is None:
                    cl = Client(
                        int(rec["clientid"]),
                        owner,
                        bytes.fromhex(rec["verifier"]),
                        tuple(rec["principal"]),
                        rec["address"],
                        confirmed=True,
                        cs_sequence=int(rec["cs_sequence"]),
                        reclaim_complete=bool(rec["reclaim_complete"]),
                    )
                    # only a client that held opens or locks has something to reclaim; one
                    # that ignores SEQUENCE's flag (nfs-rs) still opens once the grace period
                    # is over; the Linux client reclaims
                    held = owner in self.reclaimable
                    cl.may_reclaim = cl.reclaim_needed = cl.held_state_recorded = held
                    self.clients[cl.clientid] = cl
                    self.by_owner[owner] = cl
                fore = channel_attrs4.cls(*rec["fore"], [])
                back = channel_attrs4.cls(*rec["back"], [])
                slots = [Slot(seqid=None) for _ in range(int(rec["slots"]))]
                sess = Session(
                    sid,
                    cl,
                    slots,
                    fore,
                    back,
                    fore.maxoperations,
                    fore.maxresponsesize_cached,
                    fore.maxrequestsize,
                    fore.maxresponsesize,
                )
                self.sessions[sid] = sess
                cl.sessions[sid] = sess
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("session record %s unreadable (%s): dropped", row.key, exc)
                self.catalog.run(
                    lambda conn, k=row.key: conn.execute(
                        delete(SETTINGS).where(SETTINGS.c.key == k)
                    )
                )
        if rows:
            log.info("restored %d sessions of %d clients", len(self.sessions), len(self.clients))

    def _forget_client_record(self, owner: bytes) -> None:
        self.catalog.run(lambda conn: conn.execute(delete(CLIENTS).where(CLIENTS.c.owner == owner)))

    # -- clients ---------------------------------------------------------------------------------
    def client(self, clientid: int) -> Client:
        cl = self.clients.get(clientid)
        if cl is None:
            raise NfsError(c.NFS4ERR_STALE_CLIENTID, f"client id {clientid:x} unknown")
        return cl

    def confirm(self, cl: Client) -> None:
        if not cl.confirmed:
            cl.confirmed = True
            self._record_client(cl)

    def destroy_client(self, clientid: int) -> None:
        with self.lock:
            cl = self.client(clientid)
            if cl.sessions:
                raise NfsError(c.NFS4ERR_CLIENTID_BUSY, "client still has sessions")
            self.expire_client(cl)

    def reclaim_complete(self, cl: Client) -> None:
        with self.lock:
            if cl.reclaim_complete and not cl.reclaim_needed:
                raise NfsError(c.NFS4ERR_COMPLETE_ALREADY, "RECLAIM_COMPLETE already done")
            cl.reclaim_complete, cl.reclaim_needed = True, False
            for sess in cl.sessions.values():
                self._save_session(sess)
            self._maybe_end_grace_early()

    def expire_client(self, cl: Client) -> None:
        """Drop a client with its sessions and state (and its catalog record)."""
        for sid in list(cl.sessions):
            self.sessions.pop(sid, None)
            try:
                self._drop_session_record(sid)
            except Exception:  # noqa: BLE001 - a leftover record is dropped when it is next restored
                log.exception("could not drop session record")
        cl.sessions.clear()
        for other in list(cl.states):
            st = self.states.get(other)
            if isinstance(st, OpenState):
                self._drop_open(st)
            elif st is not None:
                self._drop_lock(st)
        self.clients.pop(cl.clientid, None)
        if self.unconfirmed41.get(cl.owner) is cl:
            del self.unconfirmed41[cl.owner]
        if self.by_owner.get(cl.owner) is cl:
            del self.by_owner[cl.owner]
            if cl.confirmed:
                try:
                    self._forget_client_record(cl.owner)
                except Exception:  # noqa: BLE001 - the catalog may be down; the record only costs a grace period
                    log.exception("could not forget client record")

    # -- leases (the rules are in appliance.nfs.v4.clients) -------------------------------------
    def busy(self, cl: Client) -> bool:
        """Whether a request of ``cl`` is running (a client waiting for its reply renews)."""
        return any(s.busy for sess in cl.sessions.values() for s in sess.slots)

    def lease_over(self, cl: Client) -> bool:
        """Whether ``cl``'s lease ran out (its state stays until something conflicts with it)."""
        return (
            cl.leased
            and time.monotonic() - cl.last_renew > self.lease_seconds
            and not self.busy(cl)
        )

    def evict_if_expired(self, cl: Client) -> bool:
        """A request conflicts with ``cl``'s state: if ``cl``'s lease ran out, the courtesy
        ends and the client goes with its state (RFC 8881 8.3); True when it went."""
        if not self.lease_over(cl):
            return False
        log.info(
            "lease of client %x expired: its state goes for a conflicting request", cl.clientid
        )
        self.expire_client(cl)
        return True

    # -- sessions ---------------------------------------------------------------------------------
    def add_session(self, cl: Client, fore, back) -> Session:
        nslots = max(1, min(fore.maxrequests, SLOTS_MAX))
        sid = os.urandom(16)
        sess = Session(
            sid,
            cl,
            [Slot() for _ in range(nslots)],
            fore,
            back,
            fore.maxoperations,
            fore.maxresponsesize_cached,
            fore.maxrequestsize,
            fore.maxresponsesize,
        )
        self.sessions[sid] = sess
        cl.sessions[sid] = sess
        self._save_session(sess)
        return sess

    def session(self, sid: bytes) -> Session:
        sess = self.sessions.get(sid)
        if sess is None:
            raise NfsError(c.NFS4ERR_BADSESSION, "session unknown")
        return sess

    def destroy_session(self, sid: bytes) -> None:
        with self.lock:
            sess = self.session(sid)
            del self.sessions[sid]
            sess.client.sessions.pop(sid, None)
            self._drop_session_record(sid)

    # -- stateids ----------------------------------------------------------------------------------
    def find(self, stateid, cl: Client | None):
        st = self.states.get(stateid.other)
        if st is None:
            if stateid.other in SPECIAL_OTHERS:  # RFC 8881 8.2.3: not a stale one
                raise NfsError(c.NFS4ERR_BAD_STATEID, "a special stateid names no open or lock")
            if self.other_parts(stateid.other)[0] != self.boot:
                raise NfsError(c.NFS4ERR_STALE_STATEID, "stateid from an earlier server instance")
            raise NfsError(c.NFS4ERR_BAD_STATEID, "stateid unknown")
        if cl is not None and st.client is not cl:
            raise NfsError(c.NFS4ERR_BAD_STATEID, "stateid of another client")
        if stateid.seqid and stateid.seqid != st.seqid:
            old = stateid.seqid < st.seqid
            raise NfsError(
                c.NFS4ERR_OLD_STATEID if old else c.NFS4ERR_BAD_STATEID,
                f"stateid seqid {stateid.seqid}, current {st.seqid}",
            )
        return st

    def test_stateid(self, stateid, cl: Client) -> int:
        with self.lock:
            try:
                self.find(stateid, cl)
                return c.NFS4_OK
            except NfsError as exc:
                return exc.status

    def free_stateid(self, stateid, cl: Client) -> None:
        with self.lock:
            st = self.find(stateid, cl)
            if st.kind == "open":
                raise NfsError(c.NFS4ERR_LOCKS_HELD, "an open stateid is freed by CLOSE")
            if st.ranges:
                raise NfsError(c.NFS4ERR_LOCKS_HELD, "lock stateid still holds locks")
            self._drop_lock(st)

    # -- opens -------------------------------------------------------------------------------------
    def open(self, cl: Client, owner: bytes, ino: int, access: int, deny: int) -> OpenState:
        with self.lock:
            key = (cl.clientid, owner, ino)
            # the open-owner's own earlier OPENs count too: an upgrade to what it denies itself
            # is refused, as knfsd and NFS-Ganesha do
            for other in list(self.opens_by_file.get(ino, ())):
                if ((access & other.deny) or (deny & other.access)) and (
                    other.other in self.states and not self.evict_if_expired(other.client)
                ):
                    raise NfsError(
                        c.NFS4ERR_SHARE_DENIED,
                        f"share reservation conflict on inode {ino}: access {access} deny "
                        f"{deny} against an open of access {other.access} deny {other.deny}",
                    )
            st = self.open_by_owner_file.get(key)
            if st is None:
                self.record_held_state(cl)
                st = OpenState(
                    self.new_other(cl), cl, ino, owner, seqid=1, access=access, deny=deny
                )
                self.states[st.other] = st
                self.opens_by_file.setdefault(ino, []).append(st)
                self.open_by_owner_file[key] = st
                cl.states.add(st.other)
                self.namespace.open_ref(ino)
            else:
                st.access |= access
                st.deny |= deny
                st.seqid += 1
            st.modes.add((access, deny))
            return st

    def downgrade(self, st: OpenState, access: int, deny: int) -> None:
        """OPEN_DOWNGRADE to (``access``, ``deny``): the union of some of the OPENs merged into
        ``st`` (those within the new modes; RFC 7530 16.19.4), which are all it keeps."""
        with self.lock:
            kept = {(a, d) for a, d in st.modes if not a & ~access and not d & ~deny}
            union_access = union_deny = 0
            for a, d in kept:
                union_access, union_deny = union_access | a, union_deny | d
            if not access or (union_access, union_deny) != (access, deny):
                opened = ", ".join(f"{a}/{d}" for a, d in sorted(st.modes))
                raise NfsError(
                    c.NFS4ERR_INVAL,
                    f"downgrade to access {access} deny {deny}: no set of the OPENs "
                    f"(access/deny {opened}) makes it",
                )
            st.access, st.deny, st.modes = access, deny, kept
            st.seqid += 1

    def special_io_denied(self, ino: int, want: int, bypass: bool) -> bool:
        """Whether READ (``want`` OPEN4_SHARE_ACCESS_READ) or WRITE with a special stateid
        meets an OPEN of ``ino`` that denies it (NFS4ERR_LOCKED, RFC 7530 9.1.4.3 and 9.9); the
        READ bypass stateid passes deny modes (RFC 7530 9.1.4.3)."""
        if bypass and want == c.OPEN4_SHARE_ACCESS_READ:
            return False
        for st in list(self.opens_by_file.get(ino, ())):
            if not st.deny & want or st.other not in self.states:
                continue
            if self.lease_over(st.client):
                may_block("expiring the client of a conflicting open")
                self.evict_if_expired(st.client)
                continue
            return True
        return False

    def close(self, st: OpenState) -> None:
        with self.lock:
            st.seqid += 1
            self._drop_open(st)

    def _drop_open(self, st: OpenState) -> None:
        if self.states.pop(st.other, None) is None:
            return
        for other in list(st.locks):
            lk = self.states.get(other)
            if isinstance(lk, LockState):  # what an open's locks name is a lock stateid
                self._drop_lock(lk)
        opens = self.opens_by_file.get(st.ino, [])
        if st in opens:
            opens.remove(st)
        if not opens:
            self.opens_by_file.pop(st.ino, None)
        self.open_by_owner_file.pop((st.client.clientid, st.owner, st.ino), None)
        st.client.states.discard(st.other)
        try:
            self.namespace.close_ref(st.ino)
        except Exception:  # noqa: BLE001 - freeing an unlinked file can fail later; never lose the state table
            log.exception("close_ref of inode %d failed", st.ino)

    # -- locks -------------------------------------------------------------------------------------
    def conflict(self, cl: Client, owner: bytes, ino: int, start: int, end: int, locktype: int):
        for lk in list(self.locks_by_file.get(ino, ())):
            if (lk.client is cl and lk.owner == owner) or lk.other not in self.states:
                continue
            for r0, r1, rtype in lk.ranges:
                if overlaps(start, end, r0, r1) and (is_write(locktype) or is_write(rtype)):
                    if self.evict_if_expired(lk.client):
                        break  # its locks went with it
                    return lk, r0, r1, rtype
        return None

    def denied(self, hit):
        lk, r0, r1, rtype = hit
        length = c.NFS4_UINT64_MAX if r1 == INF else r1 - r0
        return LOCK4denied.cls(
            r0,
            length,
            c.WRITE_LT if is_write(rtype) else c.READ_LT,
            state_owner4.cls(lk.client.clientid, lk.owner),
        )

    def lock_state_for(self, cl: Client, open_st: OpenState, owner: bytes) -> LockState:
        key = (cl.clientid, owner, open_st.ino)
        lk = self.lock_by_owner_file.get(key)
        if lk is None:
            lk = LockState(self.new_other(cl), cl, open_st.ino, owner, open_st, seqid=0)
            self.states[lk.other] = lk
            self.lock_by_owner_file[key] = lk
            self.locks_by_file.setdefault(open_st.ino, []).append(lk)
            open_st.locks.add(lk.other)
            cl.states.add(lk.other)
        return lk

    def add_lock(self, lk: LockState, start: int, end: int, locktype: int) -> None:
        hit = self.conflict(lk.client, lk.owner, lk.ino, start, end, locktype)
        if hit is not None:
            raise NfsError(c.NFS4ERR_DENIED, "lock conflict", self.denied(hit))
        kind = c.WRITE_LT if is_write(locktype) else c.READ_LT
        lk.ranges = _merged(_cut(lk.ranges, start, end) + [(start, end, kind)])
        lk.seqid += 1

    def unlock(self, lk: LockState, start: int, end: int) -> None:
        lk.ranges = _cut(lk.ranges, start, end)
        lk.seqid += 1

    def _drop_lock(self, lk: LockState) -> None:
        if self.states.pop(lk.other, None) is None:
            return
        locks = self.locks_by_file.get(lk.ino, [])
        if lk in locks:
            locks.remove(lk)
        if not locks:
            self.locks_by_file.pop(lk.ino, None)
        self.lock_by_owner_file.pop((lk.client.clientid, lk.owner, lk.ino), None)
        lk.open.locks.discard(lk.other)
        lk.client.states.discard(lk.other)

    # -- NLM locks (NFSv3 clients, appliance.nfs.nlm) ------------------------------------------
    # An NLM host (its caller_name) is a client of its own, kept out of ``clients``: it has no
    # lease and no v4 operation reaches it. Each NLM owner (svid + oh) is one of its lock
    # owners, so NLM and NFSv4 locks on a file meet in the same ``conflict`` check.
    def nlm_host(self, name: str, address: str) -> Client:
        with self.lock:
            host = self.nlm_hosts.get(name)
            if host is None:
                host = Client(
                    self.new_clientid(),
                    b"nlm:" + name.encode("utf-8", "replace"),
                    b"",
                    (),
                    address,
                    confirmed=True,
                    leased=False,
                )
                self.nlm_hosts[name] = host
            host.address = address
            return host

    def nlm_test(self, host: Client, owner: bytes, ino: int, start: int, end: int, exclusive: bool):
        """The conflicting lock (as ``conflict`` returns it) or None."""
        with self.lock:
            return self.conflict(
                host, owner, ino, start, end, c.WRITE_LT if exclusive else c.READ_LT
            )

    def nlm_lock(self, host: Client, owner: bytes, ino: int, start: int, end: int, exclusive: bool):
        """Take the range for ``owner``; the conflicting lock (nothing taken) or None."""
        locktype = c.WRITE_LT if exclusive else c.READ_LT
        with self.lock:
            hit = self.conflict(host, owner, ino, start, end, locktype)
            if hit is not None:
                return hit
            key = (host.clientid, owner, ino)
            lk = self.lock_by_owner_file.get(key)
            if lk is None:
                # an open of its own, registered nowhere: NLM has no opens (no share checks)
                pseudo_open = OpenState(b"", host, ino, b"nlm", access=c.OPEN4_SHARE_ACCESS_BOTH)
                lk = LockState(self.new_other(host), host, ino, owner, pseudo_open, seqid=0)
                self.states[lk.other] = lk
                self.lock_by_owner_file[key] = lk
                self.locks_by_file.setdefault(ino, []).append(lk)
                host.states.add(lk.other)
            self.add_lock(lk, start, end, locktype)
            return None

    def nlm_unlock(self, host: Client, owner: bytes, ino: int, start: int, end: int) -> None:
        with self.lock:
            lk = self.lock_by_owner_file.get((host.clientid, owner, ino))
            if lk is None:
                return
            self.unlock(lk, start, end)
            if not lk.ranges:
                self._drop_lock(lk)

    def nlm_free_host(self, name: str) -> int:
        """Drop every lock of the NLM host ``name`` (it rebooted); how many lock owners held
        some."""
        with self.lock:
            host = self.nlm_hosts.pop(name, None)
            if host is None:
                return 0
            dropped = 0
            for other in list(host.states):
                lk = self.states.get(other)
                if isinstance(lk, LockState):  # an NLM host holds lock stateids only
                    self._drop_lock(lk)
                    dropped += 1
            return dropped


def _cut(ranges: list, start: int, end: int) -> list:
    """``ranges`` minus [start, end): POSIX locks of one owner split and merge."""
    out = []
    for r0, r1, t in ranges:
        if not overlaps(start, end, r0, r1):
            out.append((r0, r1, t))
            continue
        if r0 < start:
            out.append((r0, start, t))
        if end < r1:
            out.append((end, r1, t))
    return out


def _merged(ranges: list) -> list:
    """``ranges`` (not overlapping) sorted, with touching ranges of one type joined: a lock-owner
    holds one lock where its locks meet (POSIX semantics, which RFC 7530's LOCK follows), and
    LOCKT, a DENIED LOCK or a later LOCKU sees that one range."""
    out: list = []
    for r0, r1, t in sorted(ranges):
        if out and out[-1][1] == r0 and out[-1][2] == t:
            out[-1] = (out[-1][0], r1, t)
        else:
            out.append((r0, r1, t))
    return out
