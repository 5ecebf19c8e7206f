"""Asynchronous COPY inside the server (RFC 7862 4.4, 15.2, 15.8, 15.9, 16.1).

A COPY with ca_synchronous = false over at least ``ASYNC_MIN`` bytes, from a client whose
session has a usable backchannel, is answered at once with a copy stateid; the copy then runs
here in the background, through the namespace's ``copy_range`` (stripes shared where the range
is large enough, bytes read and written otherwise, as a synchronous COPY), one ``PIECE`` per
catalog transaction. Between pieces the copier rests as long as the piece took (at most half
of one thread's time, so client requests keep the catalog and the drives) and, with
``rate_bytes_s`` (nfs.copy_offload_mib_s), keeps its average below that. Copies run one at a
time, in the order they came. When one ends, the client is sent CB_OFFLOAD with the result
(bytes copied, FILE_SYNC4 and the write verifier) or the error.

OFFLOAD_STATUS says how far it got (and its status once done); OFFLOAD_CANCEL stops it at the
next piece and forgets it (no CB_OFFLOAD then). What the copier already wrote stays: a client
that cancels or loses the copy re-drives it.

Copy state lives in this process only, on purpose: a restart ends every copy before its
CB_OFFLOAD, so no partly copied file is ever reported complete; the client's OFFLOAD_STATUS
then gets NFS4ERR_BAD_STATEID (and the Linux client, which also learns of the restart from its
reclaim, copies again). Each client holds at most ``MAX_PER_CLIENT`` copies (running, queued, or
finished and kept one lease for a late OFFLOAD_STATUS); past it, and without a backchannel, a
COPY is done synchronously. A client that goes (lease expiry, DESTROY_CLIENTID) has its copies
cancelled and dropped at the next housekeeping round (``reap``)."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from appliance.nfs import access
from appliance.nfs.state import Client, NfsError
from appliance.nfs.v4 import const as c
from appliance.nfs.v4.context import CODES
from appliance.nfs.v4.types import stateid4, write_response4
from engine.lifecycle.pacing import RateLimiter

log = logging.getLogger("shingle.nfs.offload")

ASYNC_MIN = 4 << 20  # smaller copies answer faster than a callback round trip would
PIECE = 64 << 20  # bytes per catalog transaction of a background copy
MAX_PER_CLIENT = 16
RATED_PIECE_MIN = 1 << 20  # pieces under a rate cap: still large enough to share stripes


@dataclass(eq=False)
class CopyState:
    other: bytes
    client: Client
    fh: bytes  # the destination's handle, which CB_OFFLOAD names
    cred: object
    export_id: int
    src_ino: int
    src_off: int
    dst_ino: int
    dst_off: int
    count: int  # resolved at COPY time: short at the source's end then
    done: int = 0
    status: int | None = None  # None while queued or running
    finished_at: float = 0.0
    stop: threading.Event = field(default_factory=threading.Event)  # cancel or server stop

    @property
    def stateid(self):
        return stateid4.cls(1, self.other)


class Offloads:
    def __init__(self, server):
        self.server = server
        self.lock = threading.Lock()
        self.copies: dict[bytes, CopyState] = {}  # by stateid "other"
        self.piece = PIECE
        self.rate_bytes_s = 0.0  # 0: paced by the rests between pieces only
        self.rest_ratio = 1.0  # rest after each piece, in multiples of the time it took
        self.stopping = False
        self._pool: ThreadPoolExecutor | None = None
        self.counts = dict.fromkeys(
            (
                "started",
                "completed",
                "failed",
                "cancelled",
                "synchronous",  # asked for asynchronous, done synchronously
                "callbacks_answered",
                "callbacks_failed",
            ),
            0,
        )

    # -- COPY ------------------------------------------------------------------------------------
    def admit(self, cl: Client) -> bool:
        """Whether ``cl`` may start one more asynchronous copy (else it gets a synchronous one):
        it has a usable backchannel and fewer than MAX_PER_CLIENT copies held."""
        if self.stopping or backchannel(cl) is None:
            return False
        with self.lock:
            held = [st for st in self.copies.values() if st.client is cl]
            if len(held) >= MAX_PER_CLIENT:  # finished ones make room first
                for st in sorted(
                    (st for st in held if st.status is not None), key=lambda s: s.finished_at
                )[: len(held) - MAX_PER_CLIENT + 1]:
                    self.copies.pop(st.other, None)
                    held.remove(st)
            return len(held) < MAX_PER_CLIENT

    def start(self, st: CopyState) -> None:
        with self.lock:
            self.copies[st.other] = st
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="nfs-copy")
            pool = self._pool
            self.counts["started"] += 1
        pool.submit(self._run, st)

    # -- OFFLOAD_STATUS, OFFLOAD_CANCEL ---------------------------------------------------------
    def find(self, stateid, cl: Client, dst_ino: int) -> CopyState:
        st = self.copies.get(stateid.other)
        if st is None or st.client is not cl:
            raise NfsError(c.NFS4ERR_BAD_STATEID, "no copy of this client has that stateid")
        if st.dst_ino != dst_ino:
            raise NfsError(c.NFS4ERR_BAD_STATEID, "the copy writes another file")
        return st

    def cancel(self, stateid, cl: Client, dst_ino: int) -> None:
        with self.lock:
            st = self.find(stateid, cl, dst_ino)
            if st.status is not None:
                raise NfsError(c.NFS4ERR_COMPLETE_ALREADY, "the copy has ended")
            del self.copies[st.other]
            st.stop.set()
            self.counts["cancelled"] += 1

    # -- housekeeping ---------------------------------------------------------------------------
    def reap(self) -> int:
        """Drop finished copies kept one lease, and every copy of a client that is gone;
        returns how many went."""
        state = self.server.state
        now = time.monotonic()
        lease = self.server.lease_seconds
        with self.lock:
            gone = [
                st
                for st in self.copies.values()
                if state is None
                or state.clients.get(st.client.clientid) is not st.client
                or (st.status is not None and now - st.finished_at > lease)
            ]
            for st in gone:
                st.stop.set()
                del self.copies[st.other]
        return len(gone)

    def stop(self) -> None:
        """The server stops: running copies end at their next piece, without CB_OFFLOAD."""
        with self.lock:
            self.stopping = True
            for st in self.copies.values():
                st.stop.set()
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    # -- the copier -----------------------------------------------------------------------------
    def _run(self, st: CopyState) -> None:
        status = c.NFS4_OK
        rate = self.rate_bytes_s
        # with a rate cap, about a second's bytes per piece, so the copy moves evenly; the
        # limiter's sleeps end early at a cancel or the server's stop
        piece = min(self.piece, max(int(rate), RATED_PIECE_MIN)) if rate else self.piece

        def rest(seconds: float) -> None:
            st.stop.wait(seconds)

        pace = RateLimiter(bytes_per_s=rate, sleep=rest)
        ns = self.server.namespace
        try:
            while st.done < st.count and not st.stop.is_set():
                want = min(piece, st.count - st.done)
                began = time.monotonic()
                got = ns.copy_range(
                    st.cred,
                    st.src_ino,
                    st.src_off + st.done,
                    st.dst_ino,
                    st.dst_off + st.done,
                    want,
                )
                st.done += got
                if got < want:  # the source shrank meanwhile: short, as copy_file_range
                    break
                # rest as long as the piece took: client requests get the catalog between
                st.stop.wait((time.monotonic() - began) * self.rest_ratio)
                pace.spend(got)
        except Exception as exc:  # noqa: BLE001 - the client hears the status in CB_OFFLOAD
            status = access.status_of(exc, CODES)
            access.log_failure(CODES, status, "asynchronous COPY", st.client.address, exc)
        if st.stop.is_set():  # cancelled, the client gone, or the server stopping
            return
        self._finish(st, status)

    def _finish(self, st: CopyState, status: int) -> None:
        self.server.counters.write(st.done, st.export_id)
        with self.lock:
            st.status, st.finished_at = status, time.monotonic()
            self.counts["completed" if status == c.NFS4_OK else "failed"] += 1
            if self.copies.get(st.other) is not st:  # reaped meanwhile
                return
        bc = backchannel(st.client)
        if bc is None:  # the client asks OFFLOAD_STATUS when no CB_OFFLOAD comes
            log.info("no backchannel for the CB_OFFLOAD of client %x", st.client.clientid)
            return
        if status == c.NFS4_OK:
            result = write_response4.cls([], st.done, c.FILE_SYNC4, self.server.write_verifier)
        else:
            result = st.done
        sent = bc.offload(st.fh, st.stateid, status, result)
        sent.add_done_callback(self._answered)

    def _answered(self, done) -> None:
        ok = done.exception() is None and done.result() == c.NFS4_OK
        with self.lock:
            self.counts["callbacks_answered" if ok else "callbacks_failed"] += 1
        if not ok:
            log.info("CB_OFFLOAD: %s", done.exception() or f"status {done.result()}")


def backchannel(cl: Client):
    """A usable backchannel of one of ``cl``'s sessions, or None."""
    for sess in list(cl.sessions.values()):
        bc = sess.backchannel
        if bc is not None and bc.usable():
            return bc
    return None
