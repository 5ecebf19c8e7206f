"""The state table: one per server, shared by NFSv4.0, 4.1 and 4.2 clients and NLM hosts, so
their share reservations and locks conflict. It is the core (appliance.nfs.state.core: the
lock, ids and indexes) with its parts, each owning its own data:

  records           client records in the catalog (who may reclaim after a restart)
  session_records   sessions saved in the catalog, restored at start
  grace             the grace period after a restart, RECLAIM_COMPLETE
  leases            lease expiry, courtesy eviction of an expired client in a conflict
  shares            opens and share reservations
  locks             byte-range locks
  nlm               NLM hosts and their locks
  delegations       read delegations, their recalls and revocations
  holdings          with several heads over one catalog: what the other heads hold

What it does itself touches several parts: clients and their sessions made and dropped,
stateids looked up and freed."""

from __future__ import annotations

import logging
import os

from appliance.nfs.state.core import SPECIAL_OTHERS, StateCore
from appliance.nfs.state.delegations import CB_GETATTR_WAIT, Delegations
from appliance.nfs.state.grace import Grace
from appliance.nfs.state.head_delegations import HeadDelegations
from appliance.nfs.state.heads import HeadRegistry, Takeover
from appliance.nfs.state.holdings import Holdings
from appliance.nfs.state.leases import Leases
from appliance.nfs.state.locks import Locks
from appliance.nfs.state.model import Client, DelegState, NfsError, OpenState, Session
from appliance.nfs.state.nlm import NlmLocks
from appliance.nfs.state.records import ClientRecords
from appliance.nfs.state.sessions import SessionRecords, new_session
from appliance.nfs.state.shares import Shares
from appliance.nfs.v4 import const as c

log = logging.getLogger("shingle.nfs.state")

SLOTS_MAX = 64


class StateTable(StateCore):
    def __init__(
        self,
        catalog,
        namespace,
        *,
        lease_seconds: int,
        grace_seconds: int | None,
        heads: HeadRegistry | None = None,
        nlm_hosts: bool = False,
    ):
        """``heads``: this head's row among several over the catalog (None: the only one).
        ``nlm_hosts``: the previous instance had NLM hosts that will reclaim (with several
        heads they hold the cluster-wide grace period too)."""
        super().__init__(catalog, namespace, lease_seconds)
        self.records = ClientRecords(self)
        self.session_records = SessionRecords(self)
        self.grace = Grace(self, self.records, self.session_records)
        self.leases = Leases(self, self.expire_client)
        self.locks = Locks(self, self.leases)
        self.shares = Shares(self, self.leases, self.locks, self.records)
        self.nlm = NlmLocks(self, self.locks)
        self.delegations = Delegations(self, self.leases, self.grace)
        self.grace_seconds = lease_seconds if grace_seconds is None else grace_seconds
        self.heads = heads
        self.holdings: Holdings | None = None
        if heads is not None:
            self.head_name = heads.name
        # restart: clients of the previous instance that held opens or locks may reclaim
        # them, and only they hold the grace period
        previous = self.records.load_previous()
        self.reclaimable = {owner for owner, held in previous.items() if held}
        if heads is not None:  # several heads: the grace period is the cluster's
            if nlm_hosts and self.grace_seconds > 0:
                self.grace.full_period = True  # NLM hosts end no grace period early
            heads.join(need_grace=bool(self.reclaimable or nlm_hosts) and self.grace_seconds > 0)
            holdings = self.holdings = Holdings(self, heads, self.shares, self.locks)
            self.shares.holdings = self.locks.holdings = holdings
            self.delegations.heads = holdings.delegations = HeadDelegations(catalog, heads)
            # another head's GETATTR of a file this head write-delegated: CB_GETATTR here
            holdings.delegations.holder_seen = self.delegations.seen_for_head
            holdings.delegations.holder_wait = CB_GETATTR_WAIT
            self.grace.cluster = heads
        self.session_records.restore()
        self.records.forget_stateless(previous)
        self.grace.start(self.grace_seconds)

    # -- clients ---------------------------------------------------------------------------------
    def client(self, clientid: int) -> Client:
        cl = self.clients.get(clientid)
        if cl is None:
            raise NfsError(c.NFS4ERR_STALE_CLIENTID, f"client id {clientid:x} unknown")
        return cl

    def confirm(self, cl: Client) -> None:
        if not cl.confirmed:
            cl.confirmed = True
            self.records.record(cl)

    def destroy_client(self, clientid: int) -> None:
        with self.lock:
            cl = self.client(clientid)
            if cl.sessions:
                raise NfsError(c.NFS4ERR_CLIENTID_BUSY, "client still has sessions")
            self.expire_client(cl)

    def expire_client(self, cl: Client) -> None:
        """Drop a client with its sessions and state (and its catalog record)."""
        for sid, sess in list(cl.sessions.items()):
            self.slot_replies.forget(sess)
            self.sessions.pop(sid, None)
            try:
                self.session_records.drop(sid)
            except Exception:  # noqa: BLE001 - a leftover record is dropped when it is next restored
                log.exception("could not drop session record")
        cl.sessions.clear()
        if cl.callback_path is not None:  # NFSv4.0: its callback connection
            cl.callback_path.close()
        for other in list(cl.states):
            st = self.states.get(other)
            if isinstance(st, OpenState):
                self.shares.drop(st)
            elif isinstance(st, DelegState):
                self.delegations.drop(st)
            elif st is not None:
                self.locks.drop(st)
        for other in list(cl.revoked):
            self.delegations.revoked.pop(other, None)
        self.clients.pop(cl.clientid, None)
        if self.unconfirmed41.get(cl.owner) is cl:
            del self.unconfirmed41[cl.owner]
        if self.by_owner.get(cl.owner) is cl:
            del self.by_owner[cl.owner]
            if cl.confirmed:
                try:
                    self.records.forget_one(cl.owner)
                except Exception:  # noqa: BLE001 - the catalog may be down; the record only costs a grace period
                    log.exception("could not forget client record")

    def drop_all_state(self) -> None:
        """This head was declared dead by the others (appliance.nfs.state.heads): what its
        clients held may have been granted through another head since, so all of it goes;
        NFSv4 clients learn it from their stateids, NLM hosts' locks are gone."""
        with self.lock:
            for cl in list(self.clients.values()):
                self.expire_client(cl)
            for name in list(self.nlm.hosts):
                self.nlm.free_host(name)
            if self.holdings is not None:
                self.holdings.dirty.clear()
                self.holdings.written.clear()  # its rows went with its expiry
                self.holdings.envelope.clear()

    def head_tick(self) -> list[Takeover]:
        """Every ``heads.beat_period``: beat, expire the heads that stopped, write the
        holdings that shrank. A head whose row is gone was declared dead: it drops its state
        and joins again as a new instance."""
        heads, holdings = self.heads, self.holdings
        if heads is None or holdings is None:
            return []
        if not heads.beat():
            log.error(
                "head %s was declared dead by another head (no beat for a lease): its NFS "
                "state is dropped, clients reclaim or start over",
                heads.name,
            )
            self.drop_all_state()
            heads.instance = os.urandom(8).hex()
            heads.join()
        # under the state lock: a dead head's delegation rows are this head's from the
        # commit that takes them, so a change that reads them waits until they are known
        # here as delegations to be reclaimed (Delegations.recall_here)
        with self.lock:
            taken = heads.expire_dead(adopt=self.grace_seconds > 0)
            for takeover in taken:
                if takeover.clients or takeover.nlm_hosts:
                    self.grace.adopt(takeover.clients, self.grace_seconds, bool(takeover.nlm_hosts))
                self.delegations.adopt(takeover.delegations)
        with self.lock:
            self.grace.in_grace()  # (a local grace period over lifts this head's NEED)
            if heads.need and not self.grace.end:
                heads.lift()  # (a lift that failed before)
        if holdings.dirty:
            holdings.flush()
        return taken

    # -- sessions ---------------------------------------------------------------------------------
    def add_session(self, cl: Client, fore, back, callback=None, reserved: int = 0) -> Session:
        """A new session of ``cl``; ``reserved``: what CREATE_SESSION reserved of the slot
        budget for it (given back with the session, or at once if it cannot be saved)."""
        nslots = max(1, min(fore.maxrequests, SLOTS_MAX))
        sess = new_session(os.urandom(16), cl, nslots, fore, back)
        sess.callback = callback
        sess.reserved = reserved
        try:
            self.session_records.save(sess)
        except BaseException:
            self.slot_replies.forget(sess)
            raise
        self.sessions[sess.id] = sess
        cl.sessions[sess.id] = sess
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
            self.slot_replies.forget(sess)
            self.session_records.drop(sid)

    # -- stateids ----------------------------------------------------------------------------------
    def find(self, stateid, cl: Client | None):
        st = self.states.get(stateid.other)
        if st is None:
            revoked = self.delegations.revoked.get(stateid.other)
            if revoked is not None and (cl is None or revoked.client is cl):
                raise NfsError(c.NFS4ERR_DELEG_REVOKED, "the delegation was revoked")
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
            if self.delegations.free_revoked(stateid.other, cl):
                return
            st = self.find(stateid, cl)
            if st.kind == "open":
                raise NfsError(c.NFS4ERR_LOCKS_HELD, "an open stateid is freed by CLOSE")
            if st.kind == "deleg":
                raise NfsError(c.NFS4ERR_LOCKS_HELD, "a delegation is freed by DELEGRETURN")
            if st.ranges:
                raise NfsError(c.NFS4ERR_LOCKS_HELD, "lock stateid still holds locks")
            self.locks.drop(st)
