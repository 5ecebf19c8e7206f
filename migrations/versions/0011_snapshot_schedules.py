"""Snapshot schedules: periodic snapshots of a dataset kept by keep-last-N and keep-for

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02 01:30:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "snapshot_schedules",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("frequency", sa.String(length=16), nullable=False),
        sa.Column("interval_s", sa.BigInteger(), nullable=False),
        sa.Column("offset_s", sa.BigInteger(), nullable=False),
        sa.Column("prefix", sa.String(length=64), nullable=False),
        sa.Column("keep_last", sa.Integer(), nullable=True),
        sa.Column("keep_for_s", sa.BigInteger(), nullable=True),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("created_ns", sa.BigInteger(), nullable=False),
        sa.Column("last_slot_s", sa.BigInteger(), nullable=False),
        sa.Column("last_run_ns", sa.BigInteger(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_snapshot_schedules")),
        sa.UniqueConstraint("path", "prefix", name=op.f("uq_snapshot_schedules_path_prefix")),
    )


def downgrade() -> None:
    op.drop_table("snapshot_schedules")
