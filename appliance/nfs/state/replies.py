"""What the NFSv4.1 session slots keep of their replies, all sessions together (the slot table's
reply cache, RFC 8881 2.10.6.1.3), and the memory each session reserves for them.

A slot keeps the reply to the last request it ran only when that request changed something
(appliance.nfs.v4.compound decides which): a retry of a request that changed nothing runs
again, so a READ's data is never kept. What is kept is one copy of the reply (a chunk may be a
view of a buffer its maker reuses), at most the session's ca_maxresponsesize_cached.

The budget, like knfsd's DRC memory: CREATE_SESSION reserves, for each slot it grants, the
negotiated ca_maxresponsesize_cached plus SLOT_OVERHEAD (``grant``), and all sessions together
reserve at most ``max_bytes`` (``[nfs] slot_replies_mib``). A session takes at most 1/SHARE of
what is left, so later sessions still get slots: fewer than they asked when the share is short,
then one slot of a smaller cached size (at least FLOOR, or what was asked if less), and
NFS4ERR_NOSPC (RFC 8881 18.36.4) once not even that is left. A reply that fits its session's
cached size is therefore always kept (the reservation holds its room), and no client, however
many sessions and slots it makes, makes the server keep more than ``max_bytes``. A destroyed or
expired session gives its reservation back (``forget``)."""

from __future__ import annotations

import threading
from collections import Counter

from appliance.nfs.state.model import NfsError, Session, Slot
from appliance.nfs.v4 import const as c

MAX_BYTES = 64 << 20
SLOT_OVERHEAD = 256  # what a slot costs beside its reply (its objects), as knfsd counts its slot
FLOOR = 1024  # the least cached size granted to a session's one slot past its share
SHARE = 8  # a session reserves at most 1/SHARE of what is left (knfsd's scale factor)


class SlotReplies:
    def __init__(self, max_bytes: int = MAX_BYTES):
        self.max_bytes = max_bytes
        self.used = 0  # bytes of the replies kept
        self.reserved = 0  # bytes the sessions reserved (slots x (cached + SLOT_OVERHEAD))
        # sessions granted fewer slots or a smaller cached size than they asked, and refused
        self.sessions: Counter = Counter()
        # retries met (under the state lock): replayed from the slot, run again, answered
        # RETRY_UNCACHED_REP, or DELAY for a request still running (server.stats())
        self.retries: Counter = Counter()
        self._lock = threading.Lock()  # a leaf: taken under the state lock or under none

    def grant(self, slots: int, cached: int) -> tuple[int, int, int]:
        """(slots, cached size, bytes reserved) for a new session that asks ``slots`` slots
        keeping replies of ``cached`` bytes; NFS4ERR_NOSPC when not even one slot is left."""
        with self._lock:
            left = self.max_bytes - self.reserved
            share = left // SHARE
            granted, size = min(slots, share // (cached + SLOT_OVERHEAD)), cached
            if granted < 1:  # not one slot of that size in the share: one smaller slot
                granted, size = 1, min(cached, max(FLOOR, share - SLOT_OVERHEAD))
                if size + SLOT_OVERHEAD > left:
                    self.sessions["refused"] += 1
                    raise NfsError(c.NFS4ERR_NOSPC, f"{left} bytes of the slot budget left")
            if (granted, size) != (slots, cached):
                self.sessions["shrunk"] += 1
            cached = size
            size = granted * (cached + SLOT_OVERHEAD)
            self.reserved += size
            return granted, cached, size

    def reserve(self, sess: Session) -> None:
        """A session restored after a restart takes back what it was granted (even past the
        budget, if that was lowered: its client already has those slots)."""
        with self._lock:
            sess.reserved = len(sess.slots) * (sess.max_cached + SLOT_OVERHEAD)
            self.reserved += sess.reserved

    def release(self, size: int) -> None:
        """Give back a reservation whose session was not made."""
        with self._lock:
            self.reserved -= size

    def keep(self, slot: Slot, chunks: list | None) -> None:
        """``slot``'s reply is now ``chunks`` (None: none kept); the one it had goes. The
        caller checked that it fits the session's cached size: the reservation holds its room."""
        with self._lock:
            self.used -= slot.size
            slot.reply, slot.size = None, 0
            if chunks is None or slot.gone:
                return
            size = sum(len(chunk) for chunk in chunks)
            slot.reply, slot.size = [b"".join(chunks)], size
            self.used += size

    def forget(self, sess: Session) -> None:
        """``sess`` was destroyed or expired: its slots keep nothing, now or later (a request
        still running on one finishes into nothing), and its reservation is given back."""
        with self._lock:
            for slot in sess.slots:
                self.used -= slot.size
                slot.reply, slot.size, slot.gone = None, 0, True
            self.reserved -= sess.reserved
            sess.reserved = 0
