"""metric samples: counters the daemon records for the web UI's charts

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 06:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "metric_samples",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("time_ns", sa.BigInteger(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_metric_samples")),
    )
    op.create_index(
        "ix_metric_samples_name_time", "metric_samples", ["name", "time_ns"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_metric_samples_name_time", table_name="metric_samples")
    op.drop_table("metric_samples")
