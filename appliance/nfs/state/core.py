"""What every part of the state table shares: its one lock, the ids it hands out, and the
indexes of clients, sessions and stateids (appliance.nfs.state.table composes the parts)."""

from __future__ import annotations

import os
import struct
import threading

from appliance.nfs.onc.drc import DuplicateRequestCache
from appliance.nfs.state.model import Client, DelegState, LockState, OpenState, Session
from appliance.nfs.state.replies import SlotReplies

# a stateid's "other": server instance, the low half of its client's id, a counter (NFSv4.0
# tells a stateid of an expired client from a bad one by the client id)
_OTHER = struct.Struct(">III")
# the "other" of the special stateids (anonymous, READ bypass): never an open's or a lock's
SPECIAL_OTHERS = frozenset({b"\0" * 12, b"\xff" * 12})


class StateCore:
    def __init__(self, catalog, namespace, lease_seconds: int):
        self.catalog = catalog
        self.namespace = namespace
        self.lease_seconds = lease_seconds
        # state operations are short: one lock keeps conflicts across clients simple
        self.lock = threading.RLock()
        # random, not the clock: two starts within a second must not share ids
        self.boot = int.from_bytes(os.urandom(4), "big")
        self.counter = 0
        self.clients: dict[int, Client] = {}
        self.by_owner: dict[bytes, Client] = {}  # confirmed records
        # NFSv4.1 EXCHANGE_ID records not yet confirmed by CREATE_SESSION, by owner (clients.py)
        self.unconfirmed41: dict[bytes, Client] = {}
        # NFSv4.0 SETCLIENTID records not yet confirmed, by client id (appliance.nfs.state.v40)
        self.unconfirmed40: dict[int, Client] = {}
        self.sessions: dict[bytes, Session] = {}
        self.states: dict[bytes, OpenState | LockState | DelegState] = {}
        # NFSv4.0's reply cache for retransmits (NFSv4.1's is the session slots, whose
        # replies are bounded all together here)
        self.reply_cache40 = DuplicateRequestCache()
        self.slot_replies = SlotReplies()
        # owners of the previous instance's clients that held opens or locks: they may
        # reclaim them during the grace period (appliance.nfs.state.grace)
        self.reclaimable: set[bytes] = set()
        # who made each of their records, where known: only the same principal reclaims
        self.reclaim_principals: dict[bytes, tuple] = {}
        # this head's name among several over the catalog ("" for a single head): its client
        # records are the ones of this name (appliance.nfs.state.records)
        self.head_name = ""

    def may_reclaim(self, owner: bytes, principal: tuple) -> bool:
        """Whether a client of ``owner`` presenting ``principal`` may reclaim state."""
        if owner not in self.reclaimable:
            return False
        recorded = self.reclaim_principals.get(owner)
        return recorded is None or recorded == tuple(principal)

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
