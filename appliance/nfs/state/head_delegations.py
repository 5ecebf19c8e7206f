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
  - every head polls its own recall requests (``RECALL_POLL_S``) and recalls what they name
    (CB_RECALL through its backchannel), as if the change had come through it.

A head that dies keeps its rows until another head expires it (its clients' changes through
other heads wait meanwhile); the head that expires it takes its rows (appliance.nfs.state.
heads), and its clients reclaim them through it with CLAIM_PREVIOUS in the grace period."""

from __future__ import annotations

import json
import logging

from sqlalchemy import delete, select

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
from engine.catalog.models import Setting

log = logging.getLogger("shingle.nfs.state")

SETTINGS = Setting.__table__
# how often a head looks for recalls other heads asked of it: on SQLite a look costs a memory
# read while nothing was committed (the epoch), so often enough that the Linux client's first
# retry of NFS4ERR_DELAY (after 0.1 s) finds the delegation returned; on PostgreSQL a query
RECALL_POLL_S = {True: 0.04, False: 0.25}
CLEAR_KEEP = 4096  # files remembered as held by no other head, before starting over
FOREIGN_SCAN = 64  # delegation rows looked through for "no other head holds any"


def recall_key(head: str, ino: int) -> str:
    return f"{RECALL_PREFIX}{head}_{ino}"


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
        # commit of another process or an untracked one (``Catalog.only_tracked``), not per
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

    def _foreign(self, conn, ino: int, write: bool) -> set[str]:
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
            if self._foreign(conn, ino, write=write):
                return False
            asked = conn.execute(
                select(SETTINGS.c.key).where(SETTINGS.c.key == recall_key(registry.name, ino))
            ).first()
            if asked is not None and not reclaim:
                return False
            conn.execute(SETTINGS.insert().values(key=key, value=value))
            return True

        granted = self.catalog.run(work, tracked=True)
        if granted:
            DELEGATION_MOVES[0] += 1
        return granted

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
            if known is not None and known[1] == moves and catalog.only_tracked(known[0], epoch):
                self.none_foreign = (epoch, moves)
                return
            known = self.clear.get(ino)
            if known is not None and known[1] == moves and catalog.only_tracked(known[0], epoch):
                self.clear[ino] = (epoch, moves)
                return
        mark = None if epoch is None else (epoch, moves)
        may_block("reading the other heads' delegations")

        def look(conn) -> tuple[set[str], bool]:
            if self._none_foreign(conn):
                return set(), True
            return self._foreign(conn, ino, write), False

        holders, none = catalog.read(look)
        if none and mark is not None:
            self.none_foreign = mark
        if not holders:
            if mark is not None and write:  # (a read asked of write delegations only)
                if len(self.clear) >= CLEAR_KEEP:
                    self.clear.clear()
                self.clear[ino] = mark
            return
        request = json.dumps({"write": write, "by": self.registry.name})

        def work(conn):
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

        # untracked: a head polls for requests only after a commit it cannot account for
        # (``quiet``), which a head of this same process (the tests) must see too
        self.catalog.run(work)
        raise NfsError(
            c.NFS4ERR_DELAY,
            f"inode {ino}: a delegation through {', '.join(sorted(holders))} is being recalled",
        )

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
        )
        return asked
