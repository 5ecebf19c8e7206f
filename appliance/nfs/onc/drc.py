"""A duplicate request cache (DRC) for RPC calls that must not run twice.

A client that lost its connection sends its calls again, with the same xid, once it has
reconnected: a CREATE, REMOVE or RENAME that ran the first time would then fail (EXIST, NOENT)
or a WRITE land again over newer data. Like knfsd's and NFS-Ganesha's, this cache keeps the
replies of such calls by (client address and port, xid) with a checksum of the call's
arguments: the same key and checksum again gets the cached reply; the same key with other
arguments is a new call (an xid reused after wrapping, or a client that restarted). A call
still running when its retransmit comes is waited for.

NFSv4.1 and later need none of it: the session's slot table is their reply cache. NFSv4.0
(appliance.nfs.v4.compound40) uses it for COMPOUNDs that change something.

Bounded like knfsd's: at most ``max_entries`` replies and ``max_bytes`` of them, none older
than ``max_age`` seconds (a client retransmits within a minute or two), none larger than
``max_reply`` (a reply that big is not kept: its call would run again)."""

from __future__ import annotations

import threading
import time
import zlib
from collections import OrderedDict

MAX_ENTRIES = 4096
MAX_BYTES = 16 << 20
MAX_AGE_S = 120.0
MAX_REPLY = 64 << 10
CHECKSUM_BYTES = 4096
# how long a retransmit waits for the call it repeats, still running, before a retry is asked
WAIT_RUNNING_S = 30.0


def checksum(record, start: int, cred) -> tuple:
    """What tells a retransmit from another call with the same xid: the caller's identity, the
    length of the arguments from ``start`` (after the RPC header, whose verifier may differ
    between retransmits) and a CRC of their first CHECKSUM_BYTES (as knfsd: a WRITE's file
    handle, stateid and offset are in them; a full CRC of every 1 MiB WRITE would cost more
    than it tells). The identity is the whole credential (groups and principal too): a caller
    never gets the reply of another who maps to the same uid."""
    body = memoryview(record)[start:]
    who = (cred.flavor, cred.sec, cred.uid, cred.gid, cred.gids, cred.principal)
    return (who, len(body), zlib.crc32(body[:CHECKSUM_BYTES]))


class Entry:
    __slots__ = ("key", "checksum", "reply", "size", "finished", "done", "born")

    def __init__(self, key, check):
        self.key, self.checksum = key, check
        self.reply: list | None = None
        self.size = 0
        self.finished = False
        # made only for a retransmit that waits (an Event per call would cost more than the rest)
        self.done: threading.Event | None = None
        self.born = time.monotonic()


class DuplicateRequestCache:
    def __init__(
        self,
        *,
        max_entries: int = MAX_ENTRIES,
        max_bytes: int = MAX_BYTES,
        max_age: float = MAX_AGE_S,
        max_reply: int = MAX_REPLY,
    ):
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self.max_age, self.max_reply = max_age, max_reply
        self._lock = threading.Lock()
        self._entries: OrderedDict = OrderedDict()  # key -> Entry, oldest first
        self._bytes = 0
        self.hits = 0

    def __len__(self) -> int:
        return len(self._entries)

    def begin(self, key, check, wait: float = WAIT_RUNNING_S):
        """(entry, None) for a new call, which the caller runs and then ``finish``es; or
        (None, reply chunks) for a retransmit of a call answered before; or (None, None) when
        the call it repeats is still running after ``wait`` seconds."""
        with self._lock:
            self._expire(time.monotonic())
            entry = self._entries.get(key)
            if entry is None or entry.checksum != check:
                if entry is not None:
                    self._drop(entry)
                entry = Entry(key, check)
                self._entries[key] = entry
                return entry, None
            if entry.reply is not None:
                self.hits += 1
                return None, entry.reply
            if entry.done is None:
                entry.done = threading.Event()
            done = entry.done
        # the first call is still running: its reply, once there, answers this one too
        if not done.wait(wait):
            return None, None
        with self._lock:
            if entry.reply is not None:
                self.hits += 1
                return None, entry.reply
        # it changed nothing (not kept): run this one as a new call
        return self.begin(key, check, wait)

    def finish(self, entry: Entry, reply: list | None) -> None:
        """The call of ``entry`` is answered: keep ``reply`` (None: a call that need not be
        kept, or one that failed)."""
        with self._lock:
            size = sum(len(chunk) for chunk in reply) if reply is not None else 0
            if reply is None or size > self.max_reply:
                if self._entries.get(entry.key) is entry:
                    self._drop(entry)
            elif self._entries.get(entry.key) is entry:
                # one copy: a chunk may be a view of a buffer its maker reuses
                entry.reply, entry.size = [b"".join(reply)], size
                entry.born = time.monotonic()
                self._entries.move_to_end(entry.key)
                self._bytes += size
                while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
                    self._drop(next(iter(self._entries.values())))
            entry.finished = True
            done = entry.done
        if done is not None:
            done.set()

    def _drop(self, entry: Entry) -> None:
        del self._entries[entry.key]
        self._bytes -= entry.size

    def _expire(self, now: float) -> None:
        """Drop the replies older than max_age: the oldest first, so this looks at few entries
        (a kept reply moves to the end; one still running stays where it began)."""
        old = []
        for entry in self._entries.values():
            if now - entry.born <= self.max_age:
                break
            if entry.finished:
                old.append(entry)  # one still running: its finish drops or keeps it
        for entry in old:
            self._drop(entry)
