"""The grace period after a restart (RFC 8881 8.4.2, RFC 7530 9.6.2): clients of the previous
instance that held opens or locks (``core.reclaimable``, from their catalog records) may
reclaim them, and new ones wait. It ends once each of them has finished reclaiming
(RECLAIM_COMPLETE; for NFSv4.0 its first new OPEN or LOCK after a reclaim) or at
grace_seconds; then the records of clients that never came back go."""

from __future__ import annotations

import logging
import time

from appliance.nfs.state.core import StateCore
from appliance.nfs.state.heads import HeadRegistry
from appliance.nfs.state.model import Client, NfsError
from appliance.nfs.state.records import ClientRecords
from appliance.nfs.state.sessions import SessionRecords
from appliance.nfs.v4 import const as c

log = logging.getLogger("shingle.nfs.state")


class Grace:
    def __init__(self, core: StateCore, records: ClientRecords, sessions: SessionRecords):
        self.core, self.records, self.sessions = core, records, sessions
        self.end = 0.0  # monotonic time this head's grace period ends at; 0: none
        # several heads: their registry, whose cluster-wide grace period binds this head too
        # (appliance.nfs.state.heads)
        self.cluster: HeadRegistry | None = None
        # NLM hosts reclaim too (several heads): they send no RECLAIM_COMPLETE, so the grace
        # period runs its whole time
        self.full_period = False

    def start(self, seconds: int) -> None:
        """At start, once the previous clients are known: a grace period when some of them
        held state."""
        core = self.core
        holders = core.reclaimable or self.full_period  # (full_period: NLM hosts, several heads)
        self.end = time.monotonic() + seconds if holders and seconds > 0 else 0.0
        if self.end:
            log.info("grace period of %d s for %d previous clients", seconds, len(core.reclaimable))
            self._maybe_end_early()
        elif self.cluster is not None and self.cluster.need:
            self.cluster.lift()

    def in_grace(self) -> bool:
        if self.end and time.monotonic() >= self.end:
            self._end()
        return bool(self.end) or (self.cluster is not None and self.cluster.cluster_grace)

    def adopt(self, adopted: list[tuple[bytes, str | None]], seconds: int, nlm: bool) -> None:
        """Several heads: the clients of a dead head that held state (``adopted``: owner and
        recorded principal) may reclaim through this one for ``seconds``; ``nlm``: its NLM
        hosts too (the period then runs its whole time)."""
        core = self.core
        with core.lock:
            for owner, principal in adopted:
                core.reclaimable.add(owner)
                self.records.note_principal(owner, principal)
            self.end = max(self.end, time.monotonic() + seconds)
            self.full_period = self.full_period or nlm
        log.info(
            "grace period of %d s for %d clients%s of a dead head",
            seconds,
            len(adopted),
            " and NLM hosts" if nlm else "",
        )

    def _end(self) -> None:
        core = self.core
        self.end = 0.0
        self.full_period = False
        stale = core.reclaimable
        core.reclaimable = set()
        core.reclaim_principals.clear()
        if stale:
            current = {cl.owner for cl in core.clients.values()}
            gone = [o for o in stale if o not in current]
            if gone:
                self.records.forget(gone)
        log.info("grace period over")
        if self.cluster is not None and self.cluster.need:
            self.cluster.lift()  # (retried by the heartbeat when the catalog fails here)

    def _maybe_end_early(self) -> None:
        # every previous client that held state has reclaimed: no reason to hold new ones back
        done = {
            cl.owner
            for cl in self.core.clients.values()
            if cl.reclaim_complete and not cl.reclaim_needed
        }
        if self.end and not self.full_period and self.core.reclaimable <= done:
            self._end()

    def reclaim_complete(self, cl: Client) -> None:
        """RECLAIM_COMPLETE (NFSv4.1): ``cl`` has reclaimed what it held."""
        with self.core.lock:
            if cl.reclaim_complete and not cl.reclaim_needed:
                raise NfsError(c.NFS4ERR_COMPLETE_ALREADY, "RECLAIM_COMPLETE already done")
            cl.reclaim_complete, cl.reclaim_needed = True, False
            for sess in cl.sessions.values():
                self.sessions.save(sess)
            self._maybe_end_early()

    def reclaimed40(self, cl: Client) -> None:
        """An NFSv4.0 client asks for a new open or lock: once it holds state again (in the
        grace period only reclaims give any), its reclaim is over. RFC 7530 has no
        RECLAIM_COMPLETE; the Linux client reclaims everything before new opens go out."""
        if cl.reclaim_complete or not cl.states:
            return
        with self.core.lock:
            cl.reclaim_complete = True
            self._maybe_end_early()

    def release_idle_records(self) -> None:
        """Housekeeping and a clean stop: the records of clients that hold no opens or locks
        any more stop holding a future grace period. Not during one: a client that has not
        reclaimed yet holds nothing and must keep its record's mark."""
        core = self.core
        with core.lock:
            if self.in_grace():
                return
            idle = [
                cl
                for cl in core.clients.values()
                if cl.held_state_recorded and not cl.states and cl.leased
            ]
            if idle:
                self.records.release(idle)
