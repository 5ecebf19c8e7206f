"""PostgreSQL: every table NOTIFYs the channel shingle_catalog when a statement changes it (the
change signal behind in-process caches: engine/catalog/changes.py); nothing on SQLite

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02 01:30:00
"""

import sqlalchemy as sa
from alembic import op

from migrations.changesignal import TRIGGER, signal_changes

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

# the payload is the writing Catalog's token (its connections' shingle.writer), '' for others
FUNCTION = """
CREATE OR REPLACE FUNCTION shingle_catalog_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('shingle_catalog', coalesce(current_setting('shingle.writer', true), ''));
    RETURN NULL;
END
$$
"""


def _tables() -> list[str]:
    names = sa.inspect(op.get_bind()).get_table_names()
    return sorted(name for name in names if name != "alembic_version")


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(FUNCTION)
    for table in _tables():
        signal_changes(table)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in _tables():
        op.execute(f'DROP TRIGGER IF EXISTS {TRIGGER} ON "{table}"')
    op.execute("DROP FUNCTION IF EXISTS shingle_catalog_changed()")
