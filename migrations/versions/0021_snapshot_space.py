"""snapshots: referenced, unique and shared bytes and file count, stored with when they were counted

Counting a snapshot's space is a grouped read of all its extents (0.4-1.3 s at 100,000 files),
so the datasets page and the API no longer count on every load: create stores the figures (its
copy already counted them), and a background recount (the daemon's ``snapshot-space`` job)
refreshes them when older than ``snapshots.space_recount_s``. NULL: never counted (rows of every
revision before this one, counted once by the next listing and stored by the next recount).

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-07 01:30:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

COLUMNS = ("files", "referenced_bytes", "unique_bytes", "shared_bytes", "space_counted_ns")


def upgrade() -> None:
    for column in COLUMNS:
        op.add_column("snapshots", sa.Column(column, sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("snapshots") as batch:
        for column in reversed(COLUMNS):
            batch.drop_column(column)
