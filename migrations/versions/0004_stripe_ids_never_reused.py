"""stripe ids are never handed out twice (SQLite AUTOINCREMENT)

SQLite gives a new row the largest id + 1, so the id of a deleted stripe comes
back. The data path caches stripe descriptions and fragment payloads by stripe
id; a reader holding an extent map from before a stripe died could refill those
caches with the dead stripe's bytes under an id a new stripe now owns, and other
readers would get the old bytes. PostgreSQL sequences never reuse ids.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 06:45:00
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    with op.batch_alter_table(
        "stripes", recreate="always", table_kwargs={"sqlite_autoincrement": True}
    ):
        pass


def downgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    with op.batch_alter_table(
        "stripes", recreate="always", table_kwargs={"sqlite_autoincrement": False}
    ):
        pass
