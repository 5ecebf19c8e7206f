"""What the NFSv4.1 session slots keep of their replies, all sessions together (the slot table's
reply cache, RFC 8881 2.10.6.1.3).

A slot keeps the reply to the last request it ran only when that request changed something
(appliance.nfs.v4.compound decides which): a retry of a request that changed nothing runs
again, so a READ's data is never kept. What is kept is one copy of the reply (a chunk may be a
view of a buffer its maker reuses), at most the session's ca_maxresponsesize_cached, and all
slots of all sessions together at most ``max_bytes`` (``[nfs] slot_replies_mib``): past that
a reply is not kept and its retry gets NFS4ERR_RETRY_UNCACHED_REP. So no client, however many
sessions and slots it makes and whatever it asks to cache, makes the server keep more than
``max_bytes``."""

from __future__ import annotations

import threading
from collections import Counter

from appliance.nfs.state.model import Session, Slot

MAX_BYTES = 64 << 20


class SlotReplies:
    def __init__(self, max_bytes: int = MAX_BYTES):
        self.max_bytes = max_bytes
        self.used = 0
        self.refused = 0  # replies not kept for the budget
        # retries met (under the state lock): replayed from the slot, run again, answered
        # RETRY_UNCACHED_REP, or DELAY for a request still running (server.stats())
        self.retries: Counter = Counter()
        self._lock = threading.Lock()  # a leaf: taken under the state lock or under none

    def keep(self, slot: Slot, chunks: list | None) -> None:
        """``slot``'s reply is now ``chunks`` (None: none kept); the one it had goes."""
        with self._lock:
            self.used -= slot.size
            slot.reply, slot.size = None, 0
            if chunks is None or slot.gone:
                return
            size = sum(len(chunk) for chunk in chunks)
            if self.used + size > self.max_bytes:
                self.refused += 1
                return
            slot.reply, slot.size = [b"".join(chunks)], size
            self.used += size

    def forget(self, sess: Session) -> None:
        """``sess`` was destroyed or expired: its slots keep nothing, now or later (a request
        still running on one finishes into nothing)."""
        with self._lock:
            for slot in sess.slots:
                self.used -= slot.size
                slot.reply, slot.size, slot.gone = None, 0, True
