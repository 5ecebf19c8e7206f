"""PostgreSQL's change signal: LISTEN/NOTIFY, so that in-process caches stay valid across
processes and hosts sharing one catalog.

Every table has a statement trigger (migration 0010) that runs ``pg_notify`` on the channel
``shingle_catalog`` with the writer's token (the ``shingle.writer`` setting each Catalog gives
its connections; '' for any other writer, psql or a migration). A notification is
transactional: it is delivered only if its transaction commits, in commit order, and the same
payload is sent once per transaction however many statements fired it. So nothing a writer
does can skip the signal, and it costs writers no round trip.

``ChangeWatch`` keeps one connection of its own LISTENing, in a thread. Each notification
from another writer moves ``epoch``; this process's own commits it ignores (Catalog.run moves
the epoch itself for the untracked ones). Notifications arrive asynchronously, so the watch
also proves, every ``SYNC_INTERVAL_S``, that it has caught up: it NOTIFYs a ping of its own, and
when the ping comes back every commit that finished before the ping was sent has been
delivered (the queue is read in order). ``epoch`` is None (callers must not cache) while the
last ping echoed was sent more than ``STALE_AFTER_S`` ago or the connection is lost; a lost
connection moves the epoch too, since notifications sent meanwhile are gone for good.

The guarantee: a change another process committed is seen by every request this process
starts after its notification arrived (well under a millisecond on one host), and by every
request starting ``STALE_AFTER_S`` after the commit at the latest; ``catch_up()`` makes it
immediate for one caller, at the cost of a round trip.

``subscribe`` lets a caller have notifications of its own on the same channel and connection
(a payload that starts with its prefix, sent with ``pg_notify`` inside a transaction, so it is
delivered at the commit): NFS heads push recall requests and grant fences this way
(appliance/nfs/state/head_delegations.py). Such payloads do not move the epoch (the rows the
transaction wrote fired the table's own notification anyway).

Change records (engine/catalog/changelog.py): a write run with ``Catalog.run(published=True)``
sends, last in its transaction, its writer's token (a duplicate of the table trigger's, which
PostgreSQL drops; it stands in when only a table without the trigger was written) and then
``chg:<token>:<record>``. A transaction's notifications are contiguous in the queue (commits
that notify are serialized), so a record belongs to the latest epoch step of its writer: that
step then says what changed, and other processes' caches evict just that
(``records(old, new)``). A step without a record (an untracked write, a lost connection) is unknown:
caches empty themselves. So is a step until its record comes, when a ping or a subscriber's
payload (which may count on the epoch having moved) or the end of a packet came between them:
the record is attached to the published step then."""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable

from engine.base.ratelog import OutageLog
from engine.catalog.changelog import Change

CHANNEL = "shingle_catalog"
WRITER_SETTING = "shingle.writer"  # the GUC the trigger reads: which Catalog wrote
PING = "ping:"  # payloads of pings; any other payload is a writer's token
RECORD = "chg:"  # + writer token + ":" + JSON [inodes, [[dir, name], ...], topics]: a record
RECORDS_KEEP = 4096  # epoch steps whose records are kept; a reader further behind empties
WATCH_APPLICATION = "shingle-change-watch"  # application_name of the LISTEN connection
SYNC_INTERVAL_S = 0.1
STALE_AFTER_S = 1.0
DEAD_AFTER_S = 5.0  # a ping not back by then: the connection is taken for dead
RECONNECT_MAX_S = 1.0
# a silently cut connection (a host or network gone) is noticed by TCP within about this
KEEPALIVE = {"keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2,
             "keepalives_count": 3, "tcp_user_timeout": 10_000}  # fmt: skip

log = logging.getLogger("shingle.catalog")


class ChangeWatch:
    """One LISTEN connection and its thread; see the module docstring."""

    def __init__(
        self,
        conninfo: str,
        token: str,
        send_ping: Callable[[str], None],
        *,
        outage: OutageLog | None = None,
    ):
        self.token = token
        # the catalog's: a connect that fails is one more failure of its outage, not a line here
        self._outage = outage
        self._conninfo = conninfo
        self._send_ping = send_ping  # NOTIFY through the catalog's pool (for catch_up)
        self._epoch = 0
        self._synced_at = -math.inf  # send time of the latest ping that came back
        self._connected = False
        self._pending: dict[int, float] = {}  # ping number -> monotonic send time
        self._seq = 0
        self.backend_pid: int | None = None  # of the LISTEN connection (tests kill it)
        # (prefix, callback): see subscribe()
        self._subscribers: list[tuple[str, Callable[[str | None], str | None]]] = []
        # epoch step -> what its commit changed (None: unknown), and each writer's latest step
        self._records: dict[int, Change | None] = {}
        self._record_order: deque[int] = deque()
        self._last_step: dict[str, int] = {}
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="catalog-change-watch", daemon=True)
        self._thread.start()

    # -- what callers use ------------------------------------------------------------------------
    def epoch(self) -> int | None:
        """The change counter, or None while the watch cannot vouch for it (a memory read)."""
        if time.monotonic() - self._synced_at > STALE_AFTER_S:
            return None
        return self._epoch

    def records(self, old: int, new: int) -> list[Change] | None:
        """The records of the epoch steps after ``old`` up to ``new`` that changed anything, or
        None when one of them is unknown."""
        if new <= old:
            return []
        if new - old > RECORDS_KEEP:
            return None
        found = []
        with self._cond:
            records = self._records
            for step in range(old + 1, new + 1):
                change = records.get(step)
                if change is None:
                    return None
                if change.inos or change.names or change.topics:
                    found.append(change)
        return found

    def moved(self) -> None:
        """This process committed a change its caches do not account for."""
        with self._cond:
            self._epoch += 1

    def catch_up(self, timeout: float = DEAD_AFTER_S) -> bool:
        """Return once every commit that finished before this call has moved the epoch (True),
        or False if the watch is down or did not catch up within ``timeout``."""
        if not self._connected:
            return False
        number, sent = self._new_ping()
        try:
            self._send_ping(f"{PING}{self.token}:{number}")
        except Exception as exc:  # noqa: BLE001 - the catalog is unreachable: no guarantee
            log.debug("catalog: catch-up ping failed: %s", exc)
            return False
        with self._cond:
            return (
                self._cond.wait_for(lambda: self._synced_at >= sent or not self._connected, timeout)
                and self._synced_at >= sent
            )

    def wait_ready(self, timeout: float) -> bool:
        """Wait until ``epoch`` is not None (tests, start-up)."""
        with self._cond:
            return self._cond.wait_for(lambda: self.epoch() is not None, timeout)

    def subscribe(self, prefix: str, callback: Callable[[str | None], str | None]) -> None:
        """Call ``callback(payload)`` in the watch's thread for each notification whose payload
        starts with ``prefix`` (any process's, this one's too), and ``callback(None)`` each time
        LISTEN is set up again after a lost connection (what was sent meanwhile is gone: look
        for it another way). A payload it returns is NOTIFYed on the watch's connection. It
        must not block: it runs between the watch's reads."""
        with self._cond:
            self._subscribers.append((prefix, callback))

    def unsubscribe(self, callback: Callable[[str | None], str | None]) -> None:
        with self._cond:
            self._subscribers = [(p, cb) for p, cb in self._subscribers if cb != callback]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=DEAD_AFTER_S)

    # -- the thread ------------------------------------------------------------------------------
    def _new_ping(self) -> tuple[int, float]:
        with self._cond:
            self._seq += 1
            sent = time.monotonic()
            self._pending[self._seq] = sent
            return self._seq, sent

    def _loop(self) -> None:
        import psycopg

        delay = 0.05
        lost = False  # notifications were lost and are not back yet (one line each way)
        reconnected = False
        while not self._stop.is_set():
            try:
                conn = psycopg.connect(
                    self._conninfo,
                    autocommit=True,
                    application_name=WATCH_APPLICATION,
                    connect_timeout=5,
                    **KEEPALIVE,  # type: ignore[arg-type]
                )
            except psycopg.Error as exc:
                log.debug("catalog: change watch cannot connect: %s", exc)
                if self._outage is not None and not self._stop.is_set():
                    self._outage.failed(_first_line(exc))
                self._stop.wait(delay)
                delay = min(delay * 2, RECONNECT_MAX_S)
                continue
            delay = 0.05
            self.backend_pid = conn.info.backend_pid
            try:
                conn.execute(f"LISTEN {CHANNEL}")
                if lost:
                    log.info("catalog: change notifications are back; caching resumes")
                    lost = False
                if self._outage is not None:
                    self._outage.recovered()
                self._connected = True
                if reconnected:
                    self._dispatch(None)  # notifications sent while it was down are lost
                reconnected = True
                self._listen(conn)
            except psycopg.Error as exc:
                if not self._stop.is_set():
                    lost = True
                    log.warning(
                        "catalog: change notifications lost (%s); nothing is cached until "
                        "they are back",
                        _first_line(exc),
                    )
            finally:
                self._lost()
                conn.close()

    def _listen(self, conn) -> None:
        last_ping = -math.inf
        while not self._stop.is_set():
            now = time.monotonic()
            if now - last_ping >= SYNC_INTERVAL_S:
                number, _sent = self._new_ping()
                conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, f"{PING}{self.token}:{number}"))
                last_ping = now
            # stop_after=1: back here after each packet of notifications, to send the
            # subscribers' replies (the connection is busy while notifies() runs); a packet is
            # taken whole, so a record is published with the step it belongs to
            replies = self._received_all(
                [
                    notice.payload
                    for notice in conn.notifies(
                        timeout=max(last_ping + SYNC_INTERVAL_S - now, 0.001), stop_after=1
                    )
                ]
            )
            for reply in replies:
                conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, reply))
            with self._cond:
                oldest = min(self._pending.values(), default=math.inf)
            if time.monotonic() - oldest > DEAD_AFTER_S:
                raise psycopg_error(f"no ping came back within {DEAD_AFTER_S:.0f} s")

    def _dispatch(self, payload: str | None) -> list[str]:
        replies = []
        for prefix, callback in list(self._subscribers):
            if payload is None or payload.startswith(prefix):
                try:
                    reply = callback(payload)
                except Exception:  # noqa: BLE001 - a subscriber's bug must not stop the watch
                    log.exception("catalog: a change notification subscriber failed")
                    continue
                if reply is not None:
                    replies.append(reply)
        return replies

    def _received_all(self, payloads: list[str]) -> list[str]:
        """One packet of notifications, in order; the subscribers' replies to send. Epoch steps
        are published together, each with its record when the packet holds it, and always
        before a ping or a subscriber's payload that follows them is handled."""
        replies: list[str] = []
        steps: list[list] = []  # [writer, record]
        for payload in payloads:
            if payload.startswith(RECORD):
                self._record(payload, steps)
            elif payload.startswith(PING) or (
                self._subscribers and any(payload.startswith(p) for p, _ in self._subscribers)
            ):
                if steps:  # a subscriber may count on the epoch having moved (a recall push)
                    self._publish(steps)
                    steps = []
                replies += self._received(payload)
            elif payload != self.token:
                steps.append([payload, None])
        if steps:
            self._publish(steps)
        return replies

    def _record(self, payload: str, steps: list[list]) -> None:
        """A change record: it belongs to its writer's latest step (module docstring)."""
        writer, _, body = payload[len(RECORD) :].partition(":")
        if writer == self.token:
            return
        try:
            inos, names, topics = json.loads(body)
            change = Change(tuple(inos), tuple((int(d), str(n)) for d, n in names), int(topics))
        except (ValueError, TypeError) as exc:
            log.debug("catalog: a change record that does not parse: %s", exc)
            return
        for step in reversed(steps):
            if step[0] == writer:
                if step[1] is None:
                    step[1] = change
                return
        with self._cond:  # its step came in an earlier packet: unknown until now
            step_no = self._last_step.get(writer)
            if step_no is not None and step_no in self._records and self._records[step_no] is None:
                self._records[step_no] = change

    def _publish(self, steps: list[list]) -> None:
        with self._cond:
            records, order = self._records, self._record_order
            for writer, change in steps:
                self._epoch += 1
                records[self._epoch] = change
                self._last_step[writer] = self._epoch
                order.append(self._epoch)
            while len(order) > RECORDS_KEEP:
                gone = order.popleft()
                records.pop(gone, None)
            if len(self._last_step) > RECORDS_KEEP:  # writers that come and go (admin commands)
                self._last_step = {w: s for w, s in self._last_step.items() if s in records}

    def _received(self, payload: str) -> list[str]:
        """What ``payload`` means (the epoch moved, a ping came back, a subscriber's), and the
        subscribers' replies to send."""
        if self._subscribers and any(payload.startswith(p) for p, _ in self._subscribers):
            return self._dispatch(payload)
        if payload.startswith(PING):
            token, _, number = payload[len(PING) :].rpartition(":")
            if token != self.token:
                return []  # another process's ping: no change
            with self._cond:
                sent = self._pending.get(int(number))
                if sent is None:
                    return []  # already covered by a later ping
                for key in [key for key, at in self._pending.items() if at <= sent]:
                    del self._pending[key]  # sent before it: caught up as far
                if sent > self._synced_at:
                    self._synced_at = sent
                self._cond.notify_all()
        elif payload != self.token:
            with self._cond:
                self._epoch += 1
        return []

    def _lost(self) -> None:
        with self._cond:
            self._connected = False
            self._synced_at = -math.inf
            self._epoch += 1  # what was committed until LISTEN is back will never be delivered
            self._pending.clear()
            self._cond.notify_all()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def psycopg_error(message: str) -> Exception:
    import psycopg

    return psycopg.OperationalError(message)
