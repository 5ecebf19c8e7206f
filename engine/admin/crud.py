"""What every admin object (an export, an SMB share, a retention rule, a snapshot schedule, an
API token) does the same way: read one or all, and create, change or delete one in a single
catalog transaction that also records the event naming who did it.

A domain module declares its fields once (an engine.admin.schema ``Schema``), checks values with it,
and hands the clean values to its ``CrudService``; it subclasses the service only for what is
its own: how a taken name is found (SMB compares without case; a schedule's prefix is taken per
dataset), what its events say, and how its rows become records. The service holds no catalog:
each call takes one, as the module functions the CLI and the web UI call always have."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from sqlalchemy import Table, func, select
from sqlalchemy.engine import Connection, Row

from engine.admin.events import record_in
from engine.base import errors
from engine.catalog.database import Catalog

Record = TypeVar("Record")


def describe(values: Mapping[str, Any]) -> str:
    """An event's "key=value, ..." text of the fields a change set."""
    return ", ".join(f"{k}={v}" for k, v in values.items())


def record_of(cls: Any) -> Callable[[Row], Any]:
    """Row -> the dataclass ``cls``, each field from the column of its name (the column types
    already give ints, bools and None)."""
    names = [f.name for f in dataclasses.fields(cls)]
    return lambda row: cls(**{name: row._mapping[name] for name in names})


class CrudService(Generic[Record]):
    """Create, read, update and delete rows of ``table``, each change with its event.

    ``noun`` names one object in messages ("export", "SMB share"); events are
    ``{event_prefix}.{create_verb|update|delete}`` with details ``{id_key: id, **values}``;
    ``name_column``, if any, must be unique (without case when ``fold_case``)."""

    create_verb = "create"
    delete_verb = "delete"
    delete_severity = "info"
    name_column: str | None = "name"
    fold_case = False

    def __init__(
        self,
        table: Table,
        record: Callable[[Row], Record],
        *,
        noun: str,
        event_prefix: str,
        id_key: str,
    ):
        self.table = table
        self.record = record
        self.noun = noun
        self.event_prefix = event_prefix
        self.id_key = id_key

    # -- what a domain may say its own way ------------------------------------------------
    def not_found(self, ref: Any) -> errors.NotFound:
        return errors.NotFound(f"no {self.noun} with id {ref}")

    def name_taken(self, values: Mapping[str, Any], own_id: int | None) -> errors.Exists:
        return errors.Exists(f"{self.noun} {values[self.name_column or 'name']!r} exists")

    def created(self, new_id: int, made: Record, values: Mapping[str, Any]) -> str:
        name = values[self.name_column] if self.name_column else new_id
        return f"{self.noun} {name} created: {describe(values)}"

    def changed(self, row_id: int, made: Record, values: Mapping[str, Any]) -> str:
        return f"{self.noun} {row_id} changed: {describe(values)}"

    def deleted(self, row: Row) -> str:
        return f"{self.noun} {row.name} deleted"

    def check_free(self, conn: Connection, values: Mapping[str, Any], own_id: int | None) -> None:
        """Exists if ``values`` take the unique name of another row."""
        if self.name_column is None or self.name_column not in values:
            return
        column: Any = self.table.c[self.name_column]
        wanted = values[self.name_column]
        if self.fold_case:
            column, wanted = func.lower(column), wanted.lower()
        query = select(self.table.c.id).where(column == wanted)
        if own_id is not None:
            query = query.where(self.table.c.id != own_id)
        if conn.execute(query).first() is not None:
            raise self.name_taken(values, own_id)

    # -- reading --------------------------------------------------------------------------
    def row_id(self, conn: Connection, ref: Any) -> int:
        """The id of the row ``ref`` names (its id; a domain may also take its name)."""
        found = conn.execute(select(self.table.c.id).where(self.table.c.id == ref)).scalar()
        if found is None:
            raise self.not_found(ref)
        return int(found)

    def read_row(self, conn: Connection, ref: Any) -> Row:
        row_id = self.row_id(conn, ref)
        return conn.execute(select(self.table).where(self.table.c.id == row_id)).one()

    def get(self, catalog: Catalog, ref: Any) -> Record:
        return self.record(catalog.read(lambda conn: self.read_row(conn, ref)))

    def list(self, catalog: Catalog, *order_by: str, where: Any = None) -> list[Record]:
        query = select(self.table).order_by(*(self.table.c[name] for name in order_by or ("id",)))
        if where is not None:
            query = query.where(where)
        return [self.record(row) for row in catalog.read(lambda conn: conn.execute(query).all())]

    # -- changes (values are already checked) ----------------------------------------------
    def create(
        self,
        catalog: Catalog,
        values: Mapping[str, Any],
        *,
        actor: str,
        stored: Mapping[str, Any] | None = None,
    ) -> Record:
        """Insert ``values`` (and ``stored``, columns the event does not list) as a new row."""

        def work(conn: Connection) -> Record:
            self.check_free(conn, values, None)
            inserted = conn.execute(self.table.insert().values(**values, **(stored or {})))
            key = inserted.inserted_primary_key
            assert key is not None  # an INSERT's result always carries its key
            new_id = int(key[0])
            made = self.record(self.read_row(conn, new_id))
            record_in(
                conn,
                f"{self.event_prefix}.{self.create_verb}",
                self.created(new_id, made, values),
                actor=actor,
                details={self.id_key: new_id, **values},
            )
            return made

        return catalog.run(work)

    def update(
        self, catalog: Catalog, ref: Any, values: Mapping[str, Any], *, actor: str
    ) -> Record:
        """Set ``values`` on the row ``ref`` names; returns its record as it is now."""

        def work(conn: Connection) -> Record:
            row_id = self.row_id(conn, ref)
            self.check_free(conn, values, row_id)
            conn.execute(self.table.update().where(self.table.c.id == row_id).values(**values))
            made = self.record(self.read_row(conn, row_id))
            record_in(
                conn,
                f"{self.event_prefix}.update",
                self.changed(row_id, made, values),
                actor=actor,
                details={self.id_key: row_id, **values},
            )
            return made

        return catalog.run(work)

    def delete(self, catalog: Catalog, ref: Any, *, actor: str) -> None:
        def work(conn: Connection) -> None:
            row = self.read_row(conn, ref)
            conn.execute(self.table.delete().where(self.table.c.id == row.id))
            record_in(
                conn,
                f"{self.event_prefix}.{self.delete_verb}",
                self.deleted(row),
                actor=actor,
                severity=self.delete_severity,
                details={self.id_key: row.id},
            )

        catalog.run(work)
