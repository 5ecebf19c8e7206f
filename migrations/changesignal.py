"""PostgreSQL: every catalog table signals its changes. A statement that changes one NOTIFYs the
channel shingle_catalog (the function and the first triggers: migration 0012; the listeners:
engine/catalog/changes.py), so every head's caches hear of it. A migration that makes a table
calls ``signal_changes(name)`` right after ``op.create_table`` (only the tables of
models.UNSIGNALLED_TABLES go without); tests/catalog/test_change_signal.py fails for any table
of the upgraded catalog that lacks the trigger. Nothing on SQLite (its WAL index counts every
commit)."""

from __future__ import annotations

from alembic import op

TRIGGER = "shingle_catalog_changed"


def signal_changes(table: str) -> None:
    """The change trigger on ``table``, on PostgreSQL."""
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(
        f'CREATE TRIGGER {TRIGGER} AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON "{table}" '
        f"FOR EACH STATEMENT EXECUTE FUNCTION shingle_catalog_changed()"
    )
