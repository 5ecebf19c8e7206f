"""Alerts (engine/admin/alerts.py): typed conditions with states active, acknowledged, cleared

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 23:40:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "alerts",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("key", sa.String(length=128), nullable=False),
        sa.Column("severity", sa.String(length=8), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("details", sa.Text(), nullable=True),
        sa.Column("first_ns", sa.BigInteger(), nullable=False),
        sa.Column("last_ns", sa.BigInteger(), nullable=False),
        sa.Column("acknowledged_ns", sa.BigInteger(), nullable=True),
        sa.Column("acknowledged_by", sa.String(length=64), nullable=True),
        sa.Column("cleared_ns", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alerts")),
    )
    op.create_index("ix_alerts_state_kind_key", "alerts", ["state", "kind", "key"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_alerts_state_kind_key", table_name="alerts")
    op.drop_table("alerts")
