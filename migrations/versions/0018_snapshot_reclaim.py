"""snapshots.pending_bytes: what a deleted snapshot's background reclaim will still free

A snapshot's delete takes its name away in one transaction; its rows are freed afterwards, a
chunk of inode numbers per transaction, paced (engine/snapshots/service.py ``reclaim``). Until
then the space is shown as pending. NULL: not counted yet (rows of every revision before this
one).

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-06 22:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("snapshots", sa.Column("pending_bytes", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    op.drop_column("snapshots", "pending_bytes")
