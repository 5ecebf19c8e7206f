"""Read delegations (RFC 8881 10.2, 10.4; RFC 7530 10.2): a client that opens a file for
reading, when no one has it open for writing and it has a usable callback path (an NFSv4.1
session's backchannel, or the NFSv4.0 callback address that answered CB_NULL), may cache the
file (data and attributes) and open it again without asking, until the server recalls it.

Rules:
  - granted on an OPEN for read (no delegation while any open of the file writes
    or denies reading, while another client's delegation of it is being recalled, or for one
    lease after a conflict recalled one: the file is contended);
  - a conflicting request (``conflict``: another client's OPEN for write, SETATTR, REMOVE,
    RENAME, LINK, WRITE with a special stateid; any NFSv3 change; the local mount and SMB) is
    answered DELAY (v3: JUKEBOX) and the holder gets CB_RECALL; the request goes through once
    the holder returned it (DELEGRETURN);
  - a holder that has not returned it one lease after the recall is revoked: its stateid then
    gets NFS4ERR_DELEG_REVOKED and SEQUENCE says RECALLABLE_STATE_REVOKED until the client
    frees it (FREE_STATEID); an NFSv4.0 holder gets NFS4ERR_BAD_STATEID (no FREE_STATEID
    there; the Linux client then forgets the delegation, as against knfsd); a holder whose
    lease ran out goes with all its state at once.

Where they live: in this table (the process that serves the client answers its requests), and
one settings row per delegation in the catalog (``nfs_delegation_<ino>_<stateid other>``: its
client, type and grant time), written before the grant is answered and dropped when it is
returned or revoked, so that a head that changes a file can see who holds it
(``held_in_catalog``). With several heads, the rows name the head that granted them and the
other heads recall through it (appliance.nfs.state.head_delegations). A restart keeps the
previous instance's rows through the grace period for reclaim (CLAIM_PREVIOUS)."""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import Future
from dataclasses import replace

from sqlalchemy import delete, select

from appliance.nfs.state.core import StateCore
from appliance.nfs.state.grace import Grace
from appliance.nfs.state.head_delegations import HeadDelegations, rows_with_prefix
from appliance.nfs.state.leases import Leases
from appliance.nfs.state.model import Client, DelegState, NfsError
from appliance.nfs.v4 import const as c
from appliance.nfs.v4.types import stateid4
from engine.admin.nfs_clients import DELEG_PREFIX
from engine.base.blocking import holding, may_block
from engine.catalog.models import Setting

log = logging.getLogger("shingle.nfs.state")

SETTINGS = Setting.__table__
CB_GETATTR_WAIT = 5.0  # a holder's answer to CB_GETATTR; after that it is recalled


def _key(ino: int, other: bytes) -> str:
    return f"{DELEG_PREFIX}{ino}_{other.hex()}"


def held_in_catalog(catalog, ino: int) -> list[dict]:
    """The delegations of inode ``ino`` the catalog records (what another head consults)."""
    prefix = f"{DELEG_PREFIX}{ino}_"
    rows = catalog.read(lambda conn: rows_with_prefix(conn, prefix))
    return [json.loads(row.value) for row in rows]


class Delegations:
    def __init__(self, core: StateCore, leases: Leases, grace: Grace):
        self.core, self.leases, self.grace = core, leases, grace
        self.catalog = core.catalog
        # this head's rows of its previous instance, kept through the grace period for
        # reclaim (CLAIM_PREVIOUS): (client owner hex, inode) -> (row key, type)
        self.previous: dict[tuple[str, int], tuple[str, str]] = {}
        self.previous_inos: set[int] = set()
        # who granted them, in the catalog rows: this head's name among several, else its
        # address (start())
        self.head = ""
        # several heads over one catalog: the other heads' delegations (None: a single head)
        self.heads: HeadDelegations | None = None
        self.by_file: dict[int, list[DelegState]] = {}
        self.revoked: dict[bytes, DelegState] = {}  # revoked, not yet freed, by "other"
        self.contended: dict[int, float] = {}  # inode -> when a conflict last met a delegation
        self.counts = dict.fromkeys(
            (
                "granted",
                "recalled",
                "revoked",
                "returned",
                "granted_write",
                "cb_getattr",
                # several heads: requests through this head that waited for another head's
                # delegation (each try), and recall requests of other heads taken up here
                "other_head_waits",
                "other_head_recalls",
                # GETATTRs through this head answered by another head's write delegation
                # holder (CB_GETATTR through that head) instead of a recall
                "other_head_cb_getattr",
            ),
            0,
        )

    def start(self, head: str) -> None:
        """Once the server listens as ``head`` (host:port): this head's rows of its previous
        instance (their stateids died with it) are kept for reclaim while the grace period
        lasts, dropped at once when there is none; other heads' rows stay. A head of several
        names its rows by its name (``head<i>``), which its restarts keep."""
        self.head = self.heads.registry.name if self.heads is not None else head
        keep = self.grace.in_grace()

        def work(conn):
            rows = conn.execute(
                select(SETTINGS.c.key, SETTINGS.c.value).where(
                    SETTINGS.c.key.like(DELEG_PREFIX + "%")
                )
            ).all()
            mine, previous = [], {}
            for row in rows:
                try:
                    rec = json.loads(row.value)
                    if rec.get("head", "") != self.head:
                        continue
                    ino = int(row.key[len(DELEG_PREFIX) :].split("_")[0])
                    previous[(str(rec["owner"]), ino)] = (row.key, str(rec["type"]))
                except (ValueError, AttributeError, KeyError, TypeError):
                    pass  # unreadable: nobody can use it
                mine.append(row.key)
            if keep:
                mine = [key for key in mine if key not in {k for k, _ in previous.values()}]
            if mine:
                conn.execute(delete(SETTINGS).where(SETTINGS.c.key.in_(mine)))
            return previous if keep else {}

        self.previous = self.catalog.run(work, tracked=True, published=True)
        self.previous_inos = {ino for _, ino in self.previous}
        if self.previous:
            log.info("%d delegations of the previous instance may be reclaimed", len(self.previous))

    def reclaim(
        self, cl: Client, ino: int, fh: bytes, dtype: int, opens, attr
    ) -> DelegState | None:
        """CLAIM_PREVIOUS of a delegation (``dtype``: OPEN_DELEGATE_READ or _WRITE) in the grace
        period: granted again when the previous instance's row says this client (by its
        owner, which outlives client ids) held one of that type; None otherwise."""
        want = {c.OPEN_DELEGATE_READ: "read", c.OPEN_DELEGATE_WRITE: "write"}.get(dtype)
        with self.core.lock:
            found = self.previous.get((cl.owner.hex(), ino))
            if want is None or found is None or found[1] != want:
                return None
            del self.previous[(cl.owner.hex(), ino)]
            if not any(i == ino for _, i in self.previous):
                self.previous_inos.discard(ino)
        self._drop_rows([found[0]])
        return self.grant(cl, ino, fh, opens, write=want == "write", attr=attr, reclaim=True)

    def _awaits_reclaim(self, ino: int, by: Client | None, write: bool) -> bool:
        """Whether another client may still reclaim a delegation of ``ino`` that the access
        (``write``, else a read) conflicts with."""
        mine = by.owner.hex() if by is not None else None
        with self.core.lock:
            found = [
                kind
                for (owner, i), (_, kind) in self.previous.items()
                if i == ino and owner != mine and (write or kind == "write")
            ]
        return bool(found) and self.grace.in_grace()

    def _forget_previous(self) -> None:
        """The grace period is over: rows of delegations nobody reclaimed go."""
        with self.core.lock:
            keys = [key for key, _ in self.previous.values()]
            self.previous, self.previous_inos = {}, set()
        if keys:
            log.info("%d delegations of the previous instance were not reclaimed", len(keys))
            self._drop_rows(keys)

    def _drop_rows(self, keys: list[str]) -> None:
        try:
            self.catalog.run(
                lambda conn: conn.execute(delete(SETTINGS).where(SETTINGS.c.key.in_(keys))),
                tracked=True,
                published=True,
            )
        except Exception:  # noqa: BLE001 - a leftover row is dropped at the next start
            log.exception("could not drop the records of previous delegations")

    @staticmethod
    def backchannel(cl: Client):
        """The client's callback path if it can take a CB_RECALL now: an NFSv4.0 client's
        to its SETCLIENTID address, else a session's backchannel; None otherwise."""
        if cl.minor == c.MINOR_VERSION_40:
            path = cl.callback_path
            return path if path is not None and path.usable() else None
        for sess in list(cl.sessions.values()):
            bc = sess.backchannel
            if bc is not None and bc.usable():
                return bc
        return None

    def holds_any(self, cl: Client) -> bool:
        """Whether ``cl`` holds a delegation (not one revoked)."""
        with self.core.lock:
            return any(
                getattr(self.core.states.get(other), "kind", "") == "deleg" for other in cl.states
            )

    # -- grant and return --------------------------------------------------------------------------
    def grant(
        self,
        cl: Client,
        ino: int,
        fh: bytes,
        opens,
        *,
        write: bool = False,
        attr=None,
        reclaim: bool = False,
    ) -> DelegState | None:
        """A delegation of ``ino`` for ``cl`` after its OPEN, or None when the rules refuse one
        (``opens``: the file's open states). ``write``: a write delegation, for an OPEN for
        writing while no other client has the file open or locked (the caller checks locks)
        and no delegation of it stands; ``attr`` is the file's then (its change attribute is
        what CB_GETATTR answers are compared with). ``reclaim``: one the client held before a
        restart (``reclaim``): only another delegation of the file refuses it."""
        core = self.core
        with core.lock:
            held = self.by_file.get(ino, ())
            if reclaim:
                refused = bool(held)
            elif write:
                refused = bool(held) or any(st.client is not cl for st in opens)
            else:
                refused = any(d.client is cl or d.recalled_at is not None for d in held) or any(
                    st.access & c.OPEN4_SHARE_ACCESS_WRITE or st.deny & c.OPEN4_SHARE_DENY_READ
                    for st in opens
                )
            if refused or (
                not reclaim
                and (
                    time.monotonic() - self.contended.get(ino, -1e9) < core.lease_seconds
                    or self.backchannel(cl) is None
                )
            ):
                return None
            may_block("recording a delegation")
            st = DelegState(core.new_other(cl), cl, ino, fh, write=write)
            if attr is not None:
                st.granted_change = st.reported_change = attr.change
                st.holder_change = attr.change
            record = {
                "head": self.head,
                "clientid": cl.clientid,
                "owner": cl.owner.hex(),
                "type": "write" if write else "read",
                "granted_ns": time.time_ns(),
            }
            try:
                if self.heads is None:
                    self.catalog.set_setting(_key(ino, st.other), json.dumps(record))
                elif not self.heads.grant(ino, _key(ino, st.other), record, write, reclaim):
                    return None  # another head's state of the file refuses it
            except Exception as exc:  # noqa: BLE001 - the OPEN goes on without a delegation
                log.warning("no delegation of inode %d: its record failed (%s)", ino, exc)
                return None
            core.states[st.other] = st
            cl.states.add(st.other)
            self.by_file.setdefault(ino, []).append(st)
            self.counts["granted"] += 1
            if write:
                self.counts["granted_write"] += 1
            return st

    def give_back(self, st: DelegState) -> None:
        """DELEGRETURN."""
        with self.core.lock:
            self._remove(st)
            self.counts["returned"] += 1

    def drop(self, st: DelegState) -> None:
        """The client goes (its lease expired, or DESTROY_CLIENTID)."""
        self._remove(st)
        self.revoked.pop(st.other, None)

    def free_revoked(self, other: bytes, cl: Client) -> bool:
        """FREE_STATEID of a revoked delegation: forgotten; False when it names none."""
        with self.core.lock:
            st = self.revoked.get(other)
            if st is None or st.client is not cl:
                return False
            del self.revoked[other]
            cl.revoked.discard(other)
            return True

    def _remove(self, st: DelegState) -> None:
        core = self.core
        if core.states.pop(st.other, None) is None:
            return
        st.client.states.discard(st.other)
        held = self.by_file.get(st.ino, [])
        if st in held:
            held.remove(st)
        if not held:
            self.by_file.pop(st.ino, None)
        try:
            self.catalog.run(
                lambda conn: conn.execute(
                    delete(SETTINGS).where(SETTINGS.c.key == _key(st.ino, st.other))
                ),
                tracked=True,
                published=True,  # settings are cached nowhere
            )
        except Exception:  # noqa: BLE001 - a leftover row only costs another head a recall
            log.exception("could not drop the record of a delegation")

    # -- conflicts ---------------------------------------------------------------------------------
    def conflict(self, ino: int, by: Client | None, *, write: bool = True) -> None:
        """A request of ``by`` (None: not an NFSv4 client) would change ``ino`` or open it for
        writing (``write``; else it reads it: only write delegations conflict):
        NFS4ERR_DELAY while another client's delegation stands, which is recalled first and
        revoked one lease after its recall. In the grace period after a restart, a delegation
        of the previous instance that may still be reclaimed counts too. With several heads,
        another head's delegation counts too (recalled through that head)."""
        heads = self.heads
        if heads is not None and (write or ino in heads.foreign_writes):
            try:
                heads.conflict(ino, write=write)
            except NfsError:
                self.counts["other_head_waits"] += 1
                raise
        self.recall_here(ino, by, write=write)

    def recall_here(self, ino: int, by: Client | None, *, write: bool = True) -> None:
        """``conflict`` for this head's own delegations only."""
        # (several heads: under the state lock, as a dead head's may be being taken)
        if (self.heads is not None or ino in self.previous_inos) and self._awaits_reclaim(
            ino, by, write
        ):
            raise NfsError(c.NFS4ERR_DELAY, f"inode {ino}: a delegation may still be reclaimed")
        if not self.by_file.get(ino):
            return
        core = self.core
        with holding(core.lock, "state lock held"):
            held = [
                d for d in self.by_file.get(ino, ()) if d.client is not by and (write or d.write)
            ]
            if not held:
                return
            may_block("a delegation conflict")
            now = time.monotonic()
            self.contended[ino] = now
            waiting = 0
            for d in held:
                if d.other not in core.states or self.leases.evict_if_expired(d.client):
                    continue
                if d.recalled_at is None:
                    self._recall(d, now)
                elif now - d.recalled_at > core.lease_seconds:
                    self._revoke(d)
                    continue
                waiting += 1
            if waiting:
                raise NfsError(
                    c.NFS4ERR_DELAY, f"inode {ino}: {waiting} delegation(s) recalled, not returned"
                )

    def poll_recalls(self) -> int:
        """Several heads: recall what the other heads asked this one to (their clients'
        changes wait with DELAY meanwhile); how many requests there were."""
        if self.heads is None:
            return 0
        asked = self.heads.take_requests()
        self.counts["other_head_recalls"] += len(asked)
        for ino, write in asked:
            with self.core.lock:
                self.contended[ino] = time.monotonic()  # no new delegation of it for a lease
            try:
                self.recall_here(ino, None, write=write)
            except NfsError:
                pass  # recalled (or awaiting its reclaim): the other head's client retries
        return len(asked)

    def adopt(self, rows: dict) -> None:
        """A dead head's delegation rows became this head's (appliance.nfs.state.heads): its
        clients may reclaim them here (CLAIM_PREVIOUS) while the grace period lasts."""
        if not rows:
            return
        with self.core.lock:
            self.previous.update(rows)
            self.previous_inos.update(ino for _, ino in rows)
        log.info("%d delegations of a dead head may be reclaimed through this head", len(rows))

    def any_held(self) -> bool:
        """Whether this head holds a delegation or one may be reclaimed through it (a memory
        read: the event loop may ask)."""
        return bool(self.by_file) or bool(self.previous_inos)

    # -- the local mount and SMB (Namespace.change_guard) ---------------------------------------
    def held(self, ino: int | None = None, *, writes_only: bool = False) -> bool:
        """Whether some delegation stands (of ``ino``, when given; only write delegations with
        ``writes_only``): cheap, on any thread."""
        if self.heads is not None and not writes_only:
            return True  # another head's may stand: conflict() reads the catalog
        if ino is None:
            return bool(self.by_file) or bool(self.previous_inos)
        if ino in self.previous_inos:  # may still be reclaimed (conflict() says)
            return True
        held = self.by_file.get(ino) or []
        return bool(held) and (not writes_only or any(d.write for d in list(held)))

    def wait_returned(self, ino: int, *, writes_only: bool = False) -> None:
        """A change from outside NFS (the local mount, SMB through it) waits until no client
        holds a delegation of ``ino`` (``writes_only``: a read there, which only a write
        delegation conflicts with): recalled first, revoked a lease after the recall."""
        deadline = time.monotonic() + 2 * self.core.lease_seconds
        while True:
            try:
                self.conflict(ino, None, write=not writes_only)
                return
            except NfsError:
                if time.monotonic() > deadline:  # conflict() revokes well before this
                    raise
                time.sleep(0.05)

    def attr_seen_by_holder(self, attr):
        """For the local mount's lookup and getattr (SMB through it): ``attr`` as a write
        delegation's holder sees the file (CB_GETATTR); a holder that does not answer is
        recalled and waited for, and None says to read the stored attributes again."""
        d = self.write_holder(attr.ino, None)
        if d is None:
            return attr
        try:
            return self.holder_attr(d, attr)
        except NfsError:
            self.wait_returned(attr.ino, writes_only=True)
            return None

    # -- write delegations: what another client's GETATTR sees (RFC 8881 10.4.3) ----------------
    def foreign_write(self, ino: int) -> bool:
        """Whether another head may hold a write delegation of ``ino`` (a memory lookup: its
        grant waited for this head to note it). A GETATTR through this head then asks the
        holder through that head (``foreign_holder_attr``)."""
        return self.heads is not None and ino in self.heads.foreign_writes

    def foreign_holder_attr(self, attr, by: Client | None):
        """``attr`` as the holder of another head's write delegation of the file sees it:
        CB_GETATTR through that head (head_delegations.remote_attr). When that head gives no
        answer (its client did not answer, the delegation is gone or recalled, the head is
        silent) the delegation is recalled as for a change: NFS4ERR_DELAY while it stands
        (``conflict``), the stored attributes once it is gone."""
        heads = self.heads
        seen = heads.remote_attr(attr.ino, attr.change) if heads is not None else None
        if seen is None:
            self.conflict(attr.ino, by, write=False)
            return attr
        with self.core.lock:
            self.counts["other_head_cb_getattr"] += 1
        size, change, modified_ns = seen
        return attr if modified_ns is None else self._as_seen(attr, size, change, modified_ns)

    def seen_for_head(self, ino: int, change: int) -> Future | None:
        """For another head's GETATTR (head_delegations): CB_GETATTR to this head's client
        holding a write delegation of ``ino``; a future of (size, change, mtime_ns or None)
        as ``holder_attr`` computes them from the stored ``change``, or of None when the
        holder did not answer. None at once when no such delegation stands here (or it is
        being recalled)."""
        d = self.write_holder(ino, None)
        path = None if d is None or d.recalled_at is not None else self.backchannel(d.client)
        if d is None or path is None:
            return None
        out: Future = Future()

        def done(asked: Future) -> None:
            try:
                size, holder_change = asked.result()
            except Exception as exc:  # noqa: BLE001 - no answer: the asking head recalls
                log.info("CB_GETATTR of inode %d to client %x: %s", ino, d.client.clientid, exc)
                out.set_result(None)
                return
            out.set_result(self._holder_said(d, size, holder_change, change))

        path.getattr(d.fh).add_done_callback(done)
        return out

    def _holder_said(self, d: DelegState, size: int, change: int, stored_change: int):
        """Note a CB_GETATTR answer of write delegation ``d``'s holder: (size, change,
        mtime_ns) to answer with, mtime_ns None while the holder has changed nothing. A
        holder whose change differs from the last it reported changed the file: the server's
        change attribute moves on (one past the last it answered, or the stored one if that
        is larger) and the mtime is now."""
        with self.core.lock:
            self.counts["cb_getattr"] += 1
            if change != d.holder_change:
                d.holder_change = change
                d.reported_change = max(d.reported_change, stored_change) + 1
                d.modified_ns = time.time_ns()
            return size, d.reported_change, d.modified_ns

    @staticmethod
    def _as_seen(attr, size: int, change: int, modified_ns: int):
        return replace(
            attr,
            size=size,
            change=max(change, attr.change),
            mtime_ns=max(modified_ns, attr.mtime_ns),
            ctime_ns=max(modified_ns, attr.ctime_ns),
        )

    def write_holder(self, ino: int, by: Client | None) -> DelegState | None:
        """Another client's write delegation of ``ino``, if one stands: cheap, on any thread."""
        held = self.by_file.get(ino)
        if not held:
            return None
        return next((d for d in list(held) if d.write and d.client is not by), None)

    def holder_attr(self, d: DelegState, attr):
        """``attr`` as the holder of write delegation ``d`` sees the file: CB_GETATTR asks it
        for its size and change attribute. A holder that changed the file (its change differs
        from the last it reported) makes the server's change attribute move on (one past the
        last it answered, or the stored one if that is larger) and the mtime now; its size
        counts. A holder that does not answer within CB_GETATTR_WAIT is recalled: NFS4ERR_DELAY
        (the caller asks again and gets the file once it is returned)."""
        path = self.backchannel(d.client)
        answer = None
        if path is not None and d.recalled_at is None:
            try:
                answer = path.getattr(d.fh).result(CB_GETATTR_WAIT)
            except Exception as exc:  # noqa: BLE001 - any failure: the delegation is recalled
                log.info("CB_GETATTR of inode %d to client %x: %s", d.ino, d.client.clientid, exc)
        if answer is None:
            self.conflict(d.ino, None, write=False)  # raises DELAY while it stands
            return attr
        size, change, modified_ns = self._holder_said(d, answer[0], answer[1], attr.change)
        return attr if modified_ns is None else self._as_seen(attr, size, change, modified_ns)

    def expire_recalls(self) -> None:
        """Housekeeping: revoke what was recalled more than a lease ago; after the grace
        period, forget the previous instance's delegations nobody reclaimed."""
        if self.previous and not self.grace.in_grace():
            self._forget_previous()
        core = self.core
        with core.lock:
            now = time.monotonic()
            late = [
                d
                for held in self.by_file.values()
                for d in held
                if d.recalled_at is not None and now - d.recalled_at > core.lease_seconds
            ]
            for d in late:
                self._revoke(d)
            for ino, when in list(self.contended.items()):
                if now - when > core.lease_seconds:
                    del self.contended[ino]

    def _recall(self, d: DelegState, now: float) -> None:
        d.recalled_at = now
        self.counts["recalled"] += 1
        self._mark_recalled(d)
        bc = self.backchannel(d.client)
        if bc is None:  # revoked after a lease unless the client returns it meanwhile
            log.info("client %x has no backchannel to recall inode %d", d.client.clientid, d.ino)
            return
        sent = bc.recall(stateid4.cls(d.seqid, d.other), d.fh)
        sent.add_done_callback(lambda done: _recall_answered(d, done))

    def _mark_recalled(self, d: DelegState) -> None:
        """The recall's time in the delegation's row, for the web UI and the API (which show
        who holds up a change); the row itself says nothing else new."""
        key = _key(d.ino, d.other)

        def work(conn):
            value = conn.execute(select(SETTINGS.c.value).where(SETTINGS.c.key == key)).scalar()
            if value is None:
                return
            record = {**json.loads(value), "recalled_ns": time.time_ns()}
            conn.execute(
                SETTINGS.update().where(SETTINGS.c.key == key).values(value=json.dumps(record))
            )

        try:
            self.catalog.run(work, tracked=True, published=True)
        except Exception:  # noqa: BLE001 - the recall goes on; only the display misses it
            log.exception("could not mark the delegation of inode %d recalled", d.ino)

    def _revoke(self, d: DelegState) -> None:
        log.info(
            "client %x did not return its delegation of inode %d within a lease: revoked",
            d.client.clientid,
            d.ino,
        )
        self._remove(d)
        if d.client.minor != c.MINOR_VERSION_40:  # NFSv4.0 has no FREE_STATEID: BAD_STATEID
            self.revoked[d.other] = d
            d.client.revoked.add(d.other)
        self.counts["revoked"] += 1


def _recall_answered(d: DelegState, done) -> None:
    exc = done.exception()
    if exc is not None:
        log.info("CB_RECALL of inode %d to client %x: %s", d.ino, d.client.clientid, exc)
    elif done.result() != c.NFS4_OK:
        log.info(
            "CB_RECALL of inode %d: client %x answered %d", d.ino, d.client.clientid, done.result()
        )
