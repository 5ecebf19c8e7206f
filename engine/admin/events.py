"""Events: the appliance's audit and activity log, kept in the catalog.

Every admin change (who did what), every retention action, drive state
change, scrub repair or rebuild is one row, shown on the web UI's events
page and available to scripts."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.engine import Connection

from engine.catalog.database import Catalog
from engine.catalog.models import Event

EVENTS = Event.__table__
SEVERITIES = ("info", "warning", "error")


@dataclass(frozen=True)
class EventRecord:
    id: int
    time_ns: int
    kind: str
    severity: str
    actor: str
    message: str
    details: dict | None


def record_in(
    conn: Connection,
    kind: str,
    message: str,
    *,
    severity: str = "info",
    actor: str = "system",
    details: dict | None = None,
) -> None:
    """Record an event inside the caller's transaction (it commits with the change)."""
    if severity not in SEVERITIES:
        raise ValueError(f"event severity {severity!r}: expected one of {SEVERITIES}")
    conn.execute(
        EVENTS.insert().values(
            time_ns=time.time_ns(),
            kind=kind,
            severity=severity,
            actor=actor,
            message=message,
            details=json.dumps(details, sort_keys=True) if details is not None else None,
        )
    )


def record(catalog: Catalog, kind: str, message: str, **kwargs) -> None:
    catalog.run(
        lambda conn: record_in(conn, kind, message, **kwargs), tracked=True, published=True
    )  # events are cached nowhere


def recent(
    catalog: Catalog,
    limit: int = 100,
    *,
    kind_prefix: str | None = None,
    before_id: int | None = None,
) -> list[EventRecord]:
    def work(conn):
        query = select(EVENTS).order_by(EVENTS.c.id.desc()).limit(limit)
        if kind_prefix:
            query = query.where(EVENTS.c.kind.startswith(kind_prefix))
        if before_id is not None:
            query = query.where(EVENTS.c.id < before_id)
        return [
            EventRecord(
                r.id,
                r.time_ns,
                r.kind,
                r.severity,
                r.actor,
                r.message,
                json.loads(r.details) if r.details else None,
            )
            for r in conn.execute(query)
        ]

    return catalog.read(work)
