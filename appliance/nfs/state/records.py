"""Client records in the catalog (nfs_clients): a restarted server knows from them who may
reclaim during its grace period. A record's held_state says that its client held opens or
locks: set before the first one is granted, cleared by the housekeeping and at a clean stop
once it holds none (appliance.nfs.state.grace); only such clients hold the grace period."""

from __future__ import annotations

import json
import time

from sqlalchemy import delete, select, update

from appliance.nfs.state.core import StateCore
from appliance.nfs.state.model import Client
from appliance.nfs.v4.const import RPCSEC_GSS
from engine.catalog.models import NfsClient

CLIENTS = NfsClient.__table__


class ClientRecords:
    def __init__(self, core: StateCore):
        self.core = core
        self.catalog = core.catalog

    def load_previous(self) -> dict[bytes, bool]:
        """Owner -> whether it held opens or locks, of the previous instance's clients (of this
        head's name, with several heads); their principals into ``core.reclaim_principals``."""
        head = self.core.head_name
        rows = self.catalog.read(
            lambda conn: conn.execute(
                select(CLIENTS.c.owner, CLIENTS.c.held_state, CLIENTS.c.principal).where(
                    CLIENTS.c.confirmed.is_(True), CLIENTS.c.head == head
                )
            ).all()
        )
        for r in rows:
            self.note_principal(bytes(r.owner), r.principal)
        return {bytes(r.owner): bool(r.held_state) for r in rows}

    def note_principal(self, owner: bytes, recorded: str | None) -> None:
        if recorded:
            try:
                # [flavour, uid, name]: compared as clients.principal_of makes it (the name
                # counts under RPCSEC_GSS only)
                flavour, uid, *rest = json.loads(recorded)
                name = (rest[0] if rest else "",) if flavour == RPCSEC_GSS else ()
                self.core.reclaim_principals[owner] = (flavour, uid, *name)
            except (ValueError, TypeError):
                pass  # unreadable: any principal may reclaim, as before principals were kept

    def forget_stateless(self, previous: dict[bytes, bool]) -> None:
        # nothing to reclaim and no session to carry on: a record made again if it comes back
        gone = [
            owner
            for owner, held in previous.items()
            if not held and owner not in self.core.by_owner
        ]
        if gone:
            self.forget(gone)

    def forget(self, owners: list[bytes]) -> None:
        head = self.core.head_name
        self.catalog.run(
            lambda conn: conn.execute(
                delete(CLIENTS).where(CLIENTS.c.owner.in_(owners), CLIENTS.c.head == head)
            )
        )

    def forget_one(self, owner: bytes) -> None:
        head = self.core.head_name
        self.catalog.run(
            lambda conn: conn.execute(
                delete(CLIENTS).where(CLIENTS.c.owner == owner, CLIENTS.c.head == head)
            )
        )

    def record_held_state(self, cl: Client) -> None:
        """Before ``cl``'s first open is granted (every lock needs one): its record says it
        holds state, durably, so that a restart keeps the grace period for it."""
        if cl.held_state_recorded or not cl.leased:
            return
        owner, head = cl.owner, self.core.head_name
        cl.held_state_recorded = True
        try:
            rows = self.catalog.run(
                lambda conn: (
                    conn.execute(
                        update(CLIENTS)
                        .where(CLIENTS.c.owner == owner, CLIENTS.c.head == head)
                        .values(held_state=True)
                    ).rowcount
                ),
                durable=True,
                tracked=True,
                published=True,  # nothing cached reads client records: the caches stay valid
            )
            if not rows:  # its record was lost (a catalog outage at confirm): made again
                self.record(cl)
        except BaseException:
            cl.held_state_recorded = False
            raise

    def release(self, idle: list[Client]) -> None:
        """The records of ``idle`` clients stop holding a future grace period."""
        owners, head = [cl.owner for cl in idle], self.core.head_name
        self.catalog.run(
            lambda conn: conn.execute(
                update(CLIENTS)
                .where(CLIENTS.c.owner.in_(owners), CLIENTS.c.head == head)
                .values(held_state=False)
            ),
            tracked=True,
            published=True,
        )
        for cl in idle:
            cl.held_state_recorded = False

    def record(self, cl: Client) -> None:
        now = time.time_ns()
        # a new record of an owner that has not reclaimed yet keeps its mark through another
        # restart
        held = cl.held_state_recorded = (
            cl.held_state_recorded or bool(cl.states) or cl.owner in self.core.reclaimable
        )

        head = self.core.head_name

        def work(conn):
            conn.execute(delete(CLIENTS).where(CLIENTS.c.owner == cl.owner, CLIENTS.c.head == head))
            conn.execute(
                CLIENTS.insert().values(
                    head=head,
                    principal=json.dumps([*cl.principal[:2], cl.principal_name]),
                    clientid=cl.clientid & ((1 << 63) - 1),
                    owner=cl.owner,
                    verifier=cl.verifier,
                    address=cl.address[:64],
                    minor_version=cl.minor,
                    confirmed=True,
                    reclaim_complete=cl.reclaim_complete,
                    held_state=held,
                    created_ns=now,
                    last_seen_ns=now,
                )
            )

        self.catalog.run(work)
