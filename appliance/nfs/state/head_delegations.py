"""Delegations across heads (docs/delegations.md, docs/nfs-state.md): with several heads over
one catalog, a delegation granted through one head must be recalled before a change through
another. The catalog rows of delegations (``nfs_delegation_<ino>_<other>``, appliance.nfs.
state.delegations) name the head that granted them; what this module adds:

  - a head grants a delegation in ONE catalog transaction that checks the other heads first:
    no grace period in force, no other head's open of the file writes or denies reading
    (their nfs_holdings rows), no recall of the file asked of this head; then writes the row;
  - a head about to change a file (or open it for writing) reads that file's rows of the other
    live heads; for each holder head it writes a recall request (``nfs_recall_<head>_<ino>``)
    and answers NFS4ERR_DELAY (NFSv3 JUKEBOX, NLM DENIED_GRACE_PERIOD), as a head does for its
    own holders; the request goes through once the holder's row is gone (returned, revoked a
    lease after the recall, or its head expired);
  - the asking head wakes the holder's head at once: on PostgreSQL a notification on the
    change channel (``nfs-recall:<head>:``, sent in the request's transaction, so delivered at
    its commit), on SQLite a datagram to the holder head's Unix socket (abstract namespace,
    named by the catalog file and the head: the heads of one catalog share a host); the holder
    takes its requests from the catalog and recalls what they name (CB_RECALL through its
    backchannel), as if the change had come through it. A slow poll (``SAFETY_POLL_S``) finds
    what a lost wake-up missed; without a wake-up path it polls as before (``RECALL_POLL_S``);
  - on PostgreSQL a grant is fenced: its transaction also sends ``nfs-fence:<head>:<n>:``, and
    the OPEN is answered with the delegation only once every other live head's change watch
    answered it (``nfs-fenced:...``), that is, once each has seen the grant's row change its
    epoch: a change through another head checked after the client learned of its delegation
    cannot skip the catalog read on a stale epoch. A head that does not answer within
    ``FENCE_WAIT_S`` means no delegation (the row is dropped again);
  - a GETATTR through a head of a file another head write-delegated asks that head over the
    same path (``remote_attr``: a datagram, or a notification), which sends CB_GETATTR to its
    client and answers what it holds (size, change, mtime), as a head answers its own
    GETATTRs; no answer means a recall, as for a change.

A head that dies keeps its rows until another head expires it (its clients' changes through
other heads wait meanwhile); the head that expires it takes its rows (appliance.nfs.state.
heads), and its clients reclaim them through it with CLAIM_PREVIOUS in the grace period."""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

from sqlalchemy import delete, make_url, select

from appliance.nfs.state.heads import (
    DELEGATION_MOVES,
    HEADS,
    RECALL_PREFIX,
    HeadRegistry,
    recovery_epoch,
)
from appliance.nfs.state.model import NfsError
from appliance.nfs.v4 import const as c
from engine.admin.nfs_clients import DELEG_PREFIX
from engine.base.blocking import may_block
from engine.catalog.changelog import DELEGATIONS
from engine.catalog.database import Catalog
from engine.catalog.epoch import commits_between
from engine.catalog.models import Setting

log = logging.getLogger("shingle.nfs.state")

SETTINGS = Setting.__table__
# how often a head looks for recalls other heads asked of it: on SQLite a look costs a memory
# read while nothing was committed (the epoch), so often enough that the Linux client's first
# retry of NFS4ERR_DELAY (after 0.1 s) finds the delegation returned; on PostgreSQL a query
RECALL_POLL_S = {True: 0.04, False: 0.25}
# with a wake-up path (a notification or a datagram at each request) the poll is a safety net
SAFETY_POLL_S = 1.0
# PostgreSQL: how long a grant waits for every other head to have seen it (a round trip of two
# notifications: 1-3 ms on one host, more on a loaded one); grants past it go without a
# delegation, and hold the state lock that long (a head that stays silent: once per SILENT_HOLD_S)
FENCE_WAIT_S = 0.5
SILENT_HOLD_S = 5.0  # no fenced grant while a head that did not answer lately is still listed
RECALL_PUSH = "nfs-recall:"  # + head + ":"
FENCE = "nfs-fence:"  # + granting head + ":" + number + ":" + inode + ":" + "w" or "r" + ":"
FENCED = "nfs-fenced:"  # + granting head + ":" + number + ":" + answering head + ":"
# CB_GETATTR across heads (PostgreSQL; SQLite: datagrams "g asking number inode change" and
# "v number answer"): a GETATTR of another head's write-delegated file asks that head, which
# asks its client and answers ATTR_NONE (no answer: recall instead) or "size,change,mtime_ns"
# ("size,change,-" when the holder has changed nothing)
ATTR_ASK = (
    "nfs-attr:"  # + holder head + ":" + asking head + ":" + number + ":" + ino + ":" + change + ":"
)
ATTR_TOLD = "nfs-attr-told:"  # + asking head + ":" + number + ":" + answer + ":"
ATTR_NONE = "-"
# how long the asking head waits for the holder head's answer beyond the holder's own wait for
# its client (delegations.CB_GETATTR_WAIT): a datagram or two notifications, then a recall
ATTR_MARGIN_S = 1.0
CLEAR_KEEP = 4096  # files remembered as held by no other head, before starting over
FOREIGN_SCAN = 64  # delegation rows looked through for "no other head holds any"


def recall_key(head: str, ino: int) -> str:
    return f"{RECALL_PREFIX}{head}_{ino}"


def wake_address(catalog, head: str) -> bytes:
    """SQLite: the abstract Unix socket address a head of ``catalog`` is woken at."""
    path = os.path.realpath(make_url(catalog.url).database or "")
    digest = hashlib.sha256(path.encode()).hexdigest()[:24]
    return f"\0shingle-recall-{digest}-{head}".encode()


def rows_with_prefix(conn, prefix: str):
    """In a transaction: the settings rows whose key starts with ``prefix`` (LIKE's ``_``
    matches any character, so the rows are checked again)."""
    rows = conn.execute(
        select(SETTINGS.c.key, SETTINGS.c.value).where(SETTINGS.c.key.like(prefix + "%"))
    ).all()
    return [row for row in rows if row.key.startswith(prefix)]


def delegation_rows(conn, ino: int) -> list[tuple[str, dict]]:
    """In a transaction: (key, record) of every delegation of ``ino`` the catalog has."""
    out = []
    for row in rows_with_prefix(conn, f"{DELEG_PREFIX}{ino}_"):
        try:
            rec = json.loads(row.value)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append((row.key, rec))
    return out


class HeadDelegations:
    def __init__(self, catalog, registry: HeadRegistry):
        self.catalog, self.registry = catalog, registry
        # inode -> (epoch, DELEGATION_MOVES) when no other head held a delegation of it. A
        # file written through this head then costs a catalog read (SQLite 272 us wall and
        # 139 us CPU, PostgreSQL 2.2 ms and 358 us, on this 2-core machine) only after a
        # grant by another head, or a commit without a change record (``unchanged``), not per
        # request: a client creating, writing and removing files alone on its head reads
        # none. SQLite's epoch moves at every commit of any process; PostgreSQL's when the
        # change notification of another head's grant arrives (a moment later: about as long
        # as a change takes between its check and its write anyway), and never stays unproven
        # longer than 1 s (epoch() is None then: no caching)
        self.clear: dict[int, tuple[int, int]] = {}
        # (epoch, DELEGATION_MOVES) when no other live head held any delegation: every file is
        # clear until another process commits, so one read after another head's beat or
        # metrics sample serves every file, not one read per file
        self.none_foreign: tuple[int, int] | None = None
        self.polled_at: int | None = None  # SQLite: the epoch of the last poll that found none
        self.poll_period = RECALL_POLL_S[bool(catalog.epoch_is_exact)]
        # the server's: take the requests now (any thread); set with listen()
        self.wake: Callable[[], None] = lambda: None
        self.pushed = False  # a wake-up path stands: the poll is a safety net
        self.socket: socket.socket | None = None  # SQLite: where this head is woken
        self.fenced = not catalog.epoch_is_exact  # PostgreSQL: grants wait for the others
        self._fence_numbers = itertools.count(1)
        self._fence_cond = threading.Condition()
        self._fence_answers: dict[int, set[str]] = {}  # fence number -> heads that answered
        self.silent: dict[str, float] = {}  # head -> when it last left a fence unanswered
        # the holder side of CB_GETATTR across heads, set by Delegations: (inode, stored change)
        # -> a future of what its client holding a write delegation of it answered (None: none
        # here, or no answer), or None at once
        self.holder_seen: Callable[[int, int], Future | None] = lambda ino, change: None
        self.holder_wait = 5.0  # (Delegations sets its CB_GETATTR_WAIT)
        self._attr_told: dict[int, str] = {}  # PostgreSQL: number -> the holder head's answer
        self._attr_awaited: set[int] = set()  # PostgreSQL: numbers of questions still waited on
        # files other heads hold write delegations of, as far as this head knows (an inode ->
        # the number of its addition): every write grant waits for this head to have added it
        # (its fence), so a read or GETATTR here that finds a file missing needs no catalog
        # read; an entry whose delegation is gone is dropped at its next check
        self.foreign_writes: dict[int, int] = {}
        self._foreign_added = itertools.count(1)
        self._foreign_lock = threading.Lock()
        # (first, last) epochs: no commit after first up to last granted a delegation
        # (``unchanged``; None until the first look)
        self._quiet: tuple[int, int] | None = None
        self._quiet_lock = threading.Lock()
        self._load_foreign()

    # -- waking -------------------------------------------------------------------------------
    def listen(self, wake: Callable[[], None]) -> socket.socket | None:
        """Set up this head's wake-up path: ``wake`` is called when another head asked it to
        recall (PostgreSQL: in the change watch's thread). SQLite: returns the datagram
        socket the caller reads (each datagram: call ``wake``); None on PostgreSQL, or when
        the address is taken (the poll alone then, as fast as before)."""
        self.wake = wake
        me = self.registry.name
        catalog = self.catalog
        if not catalog.is_sqlite:
            catalog.subscribe(f"{RECALL_PUSH}{me}:", self._pushed)
            catalog.subscribe(FENCE, self._fence_seen)
            catalog.subscribe(f"{FENCED}{me}:", self._fence_answered)
            catalog.subscribe(f"{ATTR_ASK}{me}:", self._attr_asked)
            catalog.subscribe(f"{ATTR_TOLD}{me}:", self._attr_answered)
            self.pushed = True
            return None
        address = wake_address(catalog, me)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.bind(address)
        except OSError as exc:
            sock.close()
            log.warning("head %s: no recall wake-up socket (%s); polling every %.2f s",
                        me, exc, self.poll_period)  # fmt: skip
            return None
        sock.setblocking(False)
        self.socket, self.pushed = sock, True
        return sock

    def close(self) -> None:
        """The head stops: no more wake-ups, no more fence answers in its name."""
        self.wake = lambda: None
        if not self.catalog.is_sqlite:
            for callback in (
                self._pushed,
                self._fence_seen,
                self._fence_answered,
                self._attr_asked,
                self._attr_answered,
            ):
                self.catalog.unsubscribe(callback)
        if self.socket is not None:
            self.socket.close()
            self.socket = None

    def _pushed(self, _payload: str | None) -> None:
        try:
            self.wake()
        except RuntimeError:  # the head's event loop is closed: it stopped
            pass

    def period(self) -> float:
        """Seconds until the next look for requests without a wake-up."""
        if not self.pushed:
            return self.poll_period
        if not self.catalog.is_sqlite and self.catalog.epoch() is None:
            return self.poll_period  # the watch is down or behind: notifications may be lost
        return SAFETY_POLL_S

    def _poke(self, heads) -> None:
        """SQLite, after a request committed: wake the heads asked (best effort: the poll
        finds what a lost datagram did not bring)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.setblocking(False)
            for head in heads:
                address = wake_address(self.catalog, head)
                try:
                    sock.sendto(b"r", address)
                except OSError:
                    pass  # not listening (another host's, or restarting): it polls

    def _datagram_fence(self, number: int, ino: int, heads: set[str]) -> None:
        """SQLite: a write grant's fence to each other head's socket, from a socket of its own
        (autobound in the abstract namespace) that the answers come back to: the granting
        thread waits for them itself, not through its event loop, which may be waiting for
        the state lock this grant holds. A head whose socket does not take it cannot answer:
        no delegation."""
        me = self.registry.name
        deadline = time.monotonic() + FENCE_WAIT_S
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.bind("")  # autobind: an abstract address of its own
            for head in heads:
                try:
                    sock.sendto(f"f {me} {number} {ino}".encode(), wake_address(self.catalog, head))
                except OSError as exc:
                    log.debug("write delegation fence to %s: %s", head, exc)
            waiting = set(heads)
            while waiting and (left := deadline - time.monotonic()) > 0:
                sock.settimeout(left)
                try:
                    words = sock.recv(256).decode(errors="replace").split()
                except (TimeoutError, OSError):
                    break
                if len(words) == 3 and words[0] == "a" and words[1] == str(number):
                    waiting.discard(words[2])
                    self._answer(number, words[2])

    def datagram(self, data: bytes, sender) -> bool:
        """SQLite: a datagram on this head's socket (on its event loop): a recall request
        ("r": True, take them) or a write grant's fence ("f head number inode": note the
        file, answer "a number me" to the ``sender``'s address)."""
        words = data.decode(errors="replace").split()
        if not words or words[0] == "r":
            return True
        try:
            if words[0] == "g" and sender and self.socket is not None:
                sock = self.socket
                number, ino, change = words[2], int(words[3]), int(words[4])
                self._tell_attr(
                    ino, change, lambda told: sock.sendto(f"v {number} {told}".encode(), sender)
                )
            elif words[0] == "f" and sender:
                number, ino = words[2], int(words[3])
                self.note_foreign(ino)
                if self.socket is not None:
                    self.socket.sendto(f"a {number} {self.registry.name}".encode(), sender)
        except (IndexError, ValueError, OSError) as exc:
            log.debug("recall socket: %r: %s", data[:80], exc)
        return False

    def note_foreign(self, ino: int) -> None:
        with self._foreign_lock:
            self.foreign_writes[ino] = next(self._foreign_added)

    def _no_holders(self, ino: int, write: bool, mark, added: int | None) -> None:
        """``conflict`` found no other head's delegation of ``ino`` in the way."""
        if not write:  # (a read asked of write delegations only: no mark)
            self._forget_foreign(ino, added)
        elif mark is not None:
            if len(self.clear) >= CLEAR_KEEP:
                self.clear.clear()
            self.clear[ino] = mark

    def _forget_foreign(self, ino: int, added: int | None) -> None:
        """A write delegation of ``ino`` by another head was returned or revoked: forgotten,
        unless a new grant's fence came since ``added`` was read."""
        if added is None:
            return
        with self._foreign_lock:
            if self.foreign_writes.get(ino) == added:
                del self.foreign_writes[ino]

    def _load_foreign(self) -> None:
        """At start: the write delegations other heads hold now (later ones are fenced: this
        head notes them before they are granted)."""
        me = self.registry.name
        rows = self.catalog.read(lambda conn: rows_with_prefix(conn, DELEG_PREFIX))
        for row in rows:
            try:
                rec = json.loads(row.value)
                if rec.get("head") != me and rec.get("type") == "write":
                    self.note_foreign(int(row.key[len(DELEG_PREFIX) :].split("_")[0]))
            except (ValueError, AttributeError, TypeError):
                continue

    # -- CB_GETATTR across heads ---------------------------------------------------------------
    def remote_attr(self, ino: int, change: int) -> tuple[int, int, int | None] | None:
        """A GETATTR through this head of a file another head write-delegated: that head asks
        its client (CB_GETATTR) for the size and change it holds. (size, change, mtime_ns) as
        the holder's head computes them from the stored ``change`` (mtime_ns None: the holder
        changed nothing, the stored attributes stand), or None when no head answered so (no
        such delegation, the holder did not answer, the head is silent): the caller recalls."""
        may_block("CB_GETATTR through another head")
        holders = self.catalog.read(lambda conn: self.foreign(conn, ino, write=False))
        if len(holders) != 1:
            return None
        (head,) = holders
        number = next(self._fence_numbers)
        wait = self.holder_wait + ATTR_MARGIN_S
        if self.catalog.is_sqlite:
            told = self._ask_by_datagram(head, number, ino, change, wait)
        else:
            told = self._ask_by_notification(head, number, ino, change, wait)
        if told is None or told == ATTR_NONE:
            return None
        try:
            size, got, modified = told.split(",")
            return int(size), int(got), None if modified == ATTR_NONE else int(modified)
        except ValueError:
            log.debug("CB_GETATTR through head %s: answer %r", head, told)
            return None

    def _ask_by_datagram(self, head: str, number: int, ino: int, change: int, wait: float):
        me = self.registry.name
        deadline = time.monotonic() + wait
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.bind("")  # autobind: the answer comes back here
            try:
                sock.sendto(
                    f"g {me} {number} {ino} {change}".encode(), wake_address(self.catalog, head)
                )
            except OSError as exc:
                log.debug("CB_GETATTR through head %s: %s", head, exc)
                return None
            while (left := deadline - time.monotonic()) > 0:
                sock.settimeout(left)
                try:
                    words = sock.recv(256).decode(errors="replace").split()
                except (TimeoutError, OSError):
                    return None
                if len(words) == 3 and words[0] == "v" and words[1] == str(number):
                    return words[2]
        return None

    def _ask_by_notification(self, head: str, number: int, ino: int, change: int, wait: float):
        me, catalog = self.registry.name, self.catalog
        payload = f"{ATTR_ASK}{head}:{me}:{number}:{ino}:{change}:"
        with self._fence_cond:
            self._attr_awaited.add(number)
        try:
            catalog.run(lambda conn: catalog.notify(conn, payload), tracked=True)
            with self._fence_cond:
                self._fence_cond.wait_for(lambda: number in self._attr_told, wait)
                return self._attr_told.pop(number, None)
        finally:
            with self._fence_cond:
                self._attr_awaited.discard(number)
                self._attr_told.pop(number, None)  # (an answer later than the wait)

    def _attr_asked(self, payload: str | None) -> None:
        """PostgreSQL, in the change watch's thread: another head asks what this head's write
        delegation holder holds of a file."""
        if payload is None:
            return
        try:
            asking, number, ino, change = payload[len(ATTR_ASK) :].split(":")[1:5]
            told = f"{ATTR_TOLD}{asking}:{number}:"
            catalog = self.catalog
            self._tell_attr(
                int(ino),
                int(change),
                lambda answer: catalog.run(
                    lambda conn: catalog.notify(conn, f"{told}{answer}:"), tracked=True
                ),
            )
        except ValueError:
            log.debug("CB_GETATTR request %r", payload)

    def _attr_answered(self, payload: str | None) -> None:
        if payload is None:
            return
        parts = payload[len(ATTR_TOLD) :].split(":")
        try:
            number = int(parts[1])
        except (IndexError, ValueError):
            return
        with self._fence_cond:
            if number in self._attr_awaited:  # (not one that came after its wait)
                self._attr_told[number] = parts[2]
                self._fence_cond.notify_all()

    def _tell_attr(self, ino: int, change: int, send: Callable[[str], object]) -> None:
        """The holder side: ask this head's client (CB_GETATTR) in a thread of its own (the
        caller is the event loop or the change watch, which must not wait on a client), then
        ``send`` the answer."""

        def work() -> None:
            answer = ATTR_NONE
            try:
                pending = self.holder_seen(ino, change)
                seen = None if pending is None else pending.result(self.holder_wait)
                if seen is not None:
                    size, got, modified = seen
                    answer = f"{size},{got},{ATTR_NONE if modified is None else modified}"
            except Exception as exc:  # noqa: BLE001 - any failure: the asking head recalls
                log.info("CB_GETATTR of inode %d for another head: %s", ino, exc)
            try:
                send(answer)
            except Exception as exc:  # noqa: BLE001 - the asking head times out and recalls
                log.debug("CB_GETATTR answer to another head: %s", exc)

        threading.Thread(target=work, name="cb-getattr-for-head", daemon=True).start()

    # -- PostgreSQL grant fences -------------------------------------------------------------
    def _fence_seen(self, payload: str | None) -> str | None:
        """In the change watch's thread: another head granted; by the time its fence arrives,
        its row's notification moved this process's epoch (sent before it in the same
        transaction), so answering says "this head has seen it"."""
        if payload is None:
            return None
        head, number, ino, kind = payload[len(FENCE) :].split(":")[:4]
        me = self.registry.name
        if head == me:
            return None
        if kind == "w":
            self.note_foreign(int(ino))
        return f"{FENCED}{head}:{number}:{me}:"

    def _fence_answered(self, payload: str | None) -> None:
        if payload is None:
            return
        parts = payload.split(":")
        self._answer(int(parts[2]), parts[3])

    def _answer(self, number: int, head: str) -> None:
        with self._fence_cond:
            answers = self._fence_answers.get(number)
            if answers is not None:
                answers.add(head)
                self._fence_cond.notify_all()

    def foreign(self, conn, ino: int, write: bool) -> set[str]:
        """In a transaction: the live other heads holding a delegation of ``ino`` that an
        access (``write``, else a read: only write delegations) conflicts with."""
        me = self.registry.name
        found = {
            str(rec.get("head", ""))
            for _, rec in delegation_rows(conn, ino)
            if rec.get("head") != me and (write or rec.get("type") == "write")
        }
        if not found:
            return found
        live = set(conn.execute(select(HEADS.c.name)).scalars())
        return found & live

    def _none_foreign(self, conn) -> bool:
        """In a transaction: whether no other live head holds any delegation (False too when
        there are too many rows to look through: each file is then looked up alone)."""
        rows = conn.execute(
            select(SETTINGS.c.key, SETTINGS.c.value)
            .where(SETTINGS.c.key.like(DELEG_PREFIX + "%"))
            .limit(FOREIGN_SCAN + 1)
        ).all()
        if len(rows) > FOREIGN_SCAN:
            return False
        me, heads = self.registry.name, set()
        for row in rows:
            try:
                rec = json.loads(row.value)
            except ValueError:
                continue
            if row.key.startswith(DELEG_PREFIX) and isinstance(rec, dict):
                heads.add(str(rec.get("head", "")))
        heads.discard(me)
        return not heads or not heads & set(conn.execute(select(HEADS.c.name)).scalars())

    # -- a grant ----------------------------------------------------------------------------------
    def grant(self, ino: int, key: str, record: dict, write: bool, reclaim: bool) -> bool:
        """Write the row of a delegation of ``ino`` if the other heads allow it, in one
        transaction: False (nothing written) when the cluster is in its grace period (but for
        a ``reclaim``), another head's open of the file writes or denies reading (for a
        ``write`` delegation: any other head's open, lock or delegation of it), or another head
        asked this one to recall delegations of it and that request is not yet taken up."""
        may_block("checking the other heads before a delegation")
        registry = self.registry
        value = json.dumps(record)

        def work(conn):
            if not reclaim and recovery_epoch(conn):
                return False
            for row in registry.holdings_of_live(conn, ino):
                if write and (row.access or row.deny or json.loads(row.locks)):
                    return False
                if row.access & c.OPEN4_SHARE_ACCESS_WRITE or row.deny & c.OPEN4_SHARE_DENY_READ:
                    return False
            if self.foreign(conn, ino, write=write):
                return False
            asked = conn.execute(
                select(SETTINGS.c.key).where(SETTINGS.c.key == recall_key(registry.name, ino))
            ).first()
            if asked is not None and not reclaim:
                return False
            conn.execute(SETTINGS.insert().values(key=key, value=value))
            Catalog.changes(conn, topics=DELEGATIONS)  # the other heads' clear marks go
            return True

        granted = (
            self._grant_fenced(work, key, ino, write)
            if self.fenced or write
            else self.catalog.run(work, tracked=True, published=True)
        )
        if granted:
            DELEGATION_MOVES[0] += 1
        return granted

    def _grant_fenced(self, work, key: str, ino: int, write: bool) -> bool:
        """``work`` (the grant's checks and row) with a fence: on PostgreSQL a notification in
        its transaction, on SQLite (write delegations: the other heads note the file in their
        ``foreign_writes``) a datagram to each other head after the commit; then the wait
        for every other head's answer."""
        catalog, me = self.catalog, self.registry.name
        number = next(self._fence_numbers)
        with self._fence_cond:
            self._fence_answers[number] = set()

        def fenced(conn):
            if not work(conn):
                return None
            others = set(conn.execute(select(HEADS.c.name)).scalars()) - {me}
            now = time.monotonic()
            if any(now - self.silent.get(head, -1e9) < SILENT_HOLD_S for head in others):
                raise _Refused  # a head that did not answer lately is listed still
            if others:
                catalog.notify(conn, f"{FENCE}{me}:{number}:{ino}:{'w' if write else 'r'}:")
            return others

        try:
            try:
                others = catalog.run(fenced, tracked=True, published=True)
            except _Refused:
                return False
            if others and catalog.is_sqlite:
                self._datagram_fence(number, ino, others)
            wait = 0.0 if catalog.is_sqlite else FENCE_WAIT_S  # (waited for above)
            return others is not None and self._fenced(number, key, others, wait)
        finally:
            with self._fence_cond:
                self._fence_answers.pop(number, None)

    def _fenced(self, number: int, key: str, others: set[str], wait: float) -> bool:
        """After a fenced grant committed: True once every other head answered its fence
        (waiting up to ``wait``); otherwise the row goes again (no delegation) and the silent
        heads are noted."""
        deadline = time.monotonic() + wait
        with self._fence_cond:
            answered = self._fence_cond.wait_for(
                lambda: others <= self._fence_answers[number],
                max(0.0, deadline - time.monotonic()),
            )
            missing = others - self._fence_answers[number]
        if answered:
            return True
        now = time.monotonic()
        for head in missing:
            self.silent[head] = now
        log.info("no delegation: head(s) %s did not see its grant within %.2f s",
                 ", ".join(sorted(missing)), FENCE_WAIT_S)  # fmt: skip
        self.catalog.run(
            lambda conn: conn.execute(delete(SETTINGS).where(SETTINGS.c.key == key)), tracked=True
        )
        return False

    # -- a change through this head ----------------------------------------------------------------
    def conflict(self, ino: int, *, write: bool) -> None:
        """Before a change of ``ino`` (``write``; else a read) through this head: NFS4ERR_DELAY
        while another live head holds a delegation of it that conflicts, after asking that
        head to recall it."""
        catalog = self.catalog
        epoch = catalog.epoch()
        moves = DELEGATION_MOVES[0]
        if epoch is not None:
            # (a mark that holds moves to this epoch: only_tracked walks every commit since)
            known = self.none_foreign
            if known is not None and known[1] == moves and self.unchanged(known[0], epoch):
                self.none_foreign = (epoch, moves)
                return
            known = self.clear.get(ino)
            if known is not None and known[1] == moves and self.unchanged(known[0], epoch):
                self.clear[ino] = (epoch, moves)
                return
        mark = None if epoch is None else (epoch, moves)
        may_block("reading the other heads' delegations")
        added = self.foreign_writes.get(ino)

        def look(conn) -> tuple[set[str], bool]:
            if self._none_foreign(conn):
                return set(), True
            return self.foreign(conn, ino, write), False

        holders, none = catalog.read(look)
        if none and mark is not None:
            self.none_foreign = mark
        if not holders:
            self._no_holders(ino, write, mark, added)
            return
        request = json.dumps({"write": write, "by": self.registry.name})

        def work(conn):
            asked.clear()  # (a retried transaction)
            # (a head expired meanwhile has its requests deleted: none is left for it)
            live = set(conn.execute(select(HEADS.c.name)).scalars())
            for head in sorted(holders & live):
                key = recall_key(head, ino)
                there = conn.execute(select(SETTINGS.c.value).where(SETTINGS.c.key == key)).scalar()
                if there is None:
                    conn.execute(SETTINGS.insert().values(key=key, value=request))
                elif write and not json.loads(there).get("write"):
                    conn.execute(
                        SETTINGS.update().where(SETTINGS.c.key == key).values(value=request)
                    )
                else:
                    continue  # asked already (and woken then)
                asked.append(head)
                catalog.notify(conn, f"{RECALL_PUSH}{head}:")  # delivered at the commit

        # untracked: a head polls for requests only after a commit it cannot account for
        # (``quiet``), which a head of this same process (the tests) must see too
        asked: list[str] = []
        catalog.run(work)
        if asked and catalog.is_sqlite:
            self._poke(asked)
        raise NfsError(
            c.NFS4ERR_DELAY,
            f"inode {ino}: a delegation through {', '.join(sorted(holders))} is being recalled",
        )

    def unchanged(self, old: int, new: int) -> bool:
        """Whether no delegation can have been granted from epoch ``old`` to ``new``: every
        commit since has a change record (engine/catalog/changelog.py) without DELEGATIONS (a
        grant names it; a head joining or expired, a takeover, are commits without one).

        A file's mark may be a thousand commits old (set at its create): rather than walk
        them per file, ``_quiet`` says that every commit after its first number up to its
        second was looked at and granted nothing; a walk only extends it."""
        if old == new:
            return True
        with self._quiet_lock:  # held briefly: changes_since reads memory (its own lock on PG)
            quiet = self._quiet
            if quiet is not None and commits_between(quiet[0], old) >= 0:
                if commits_between(new, quiet[1]) >= 0:
                    return True  # inside the quiet run
                if commits_between(old, quiet[1]) >= 0:
                    old = quiet[1]  # only the commits past the run are looked at
            changes = self.catalog.changes_since(old, new)
            if changes is None or any(ch.topics & DELEGATIONS for ch in changes):
                self._quiet = (new, new)  # (one of them granted, or is not known)
                return False
            if quiet is None or commits_between(quiet[1], new) > 0:
                joined = quiet is not None and commits_between(quiet[1], old) >= 0
                self._quiet = (quiet[0] if joined and quiet else old, new)
            return True

    def mark(self) -> tuple[int | None, int]:
        """Where the catalog stands, for ``created``: read before a create."""
        return self.catalog.epoch(), DELEGATION_MOVES[0]

    def created(self, ino: int, mark: tuple[int | None, int]) -> None:
        """``ino`` was made by this head after ``mark``: no head held a delegation of it then,
        so ``conflict`` reads none until another process commits (or this one grants)."""
        if mark[0] is not None:
            if len(self.clear) >= CLEAR_KEEP:
                self.clear.clear()
            self.clear[ino] = (mark[0], mark[1])

    # -- recalls asked of this head ----------------------------------------------------------------
    def quiet(self) -> bool:
        """Whether no request can have come since the last poll found none: SQLite's epoch
        moved for this process's tracked commits alone, if at all (memory reads: the event
        loop may ask, and skip a worker's hop)."""
        catalog = self.catalog
        polled = self.polled_at
        if not catalog.epoch_is_exact or polled is None:
            return False
        epoch = catalog.epoch()
        if epoch is None or not catalog.only_tracked(polled, epoch):
            return False
        self.polled_at = epoch  # only_tracked walks every commit since
        return True

    def take_requests(self) -> list[tuple[int, bool]]:
        """The recalls other heads asked of this one, (inode, write), removed from the catalog
        (the asking head asks again at its client's next try while the delegation stands)."""
        prefix = f"{RECALL_PREFIX}{self.registry.name}_"
        catalog = self.catalog
        epoch = catalog.epoch() if catalog.epoch_is_exact else None
        if epoch is not None and self.polled_at is not None:
            if catalog.only_tracked(self.polled_at, epoch):
                self.polled_at = epoch
                return []  # nothing committed since but this process's own: no new request
        rows = catalog.read(lambda conn: rows_with_prefix(conn, prefix))
        if not rows:
            self.polled_at = epoch
            return []
        asked = []
        for row in rows:
            try:
                ino = int(row.key[len(prefix) :])
                write = bool(json.loads(row.value).get("write", True))
            except (ValueError, AttributeError):
                continue  # not one of ours: dropped below
            asked.append((ino, write))
        keys = [row.key for row in rows]
        self.catalog.run(
            lambda conn: conn.execute(delete(SETTINGS).where(SETTINGS.c.key.in_(keys))),
            tracked=True,
            published=True,
        )
        return asked


class _Refused(Exception):
    """A fenced grant gives up inside its transaction (nothing written)."""
