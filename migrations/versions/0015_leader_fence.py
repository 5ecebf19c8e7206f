"""leader_fence: the fencing token of the maintenance leader (engine/catalog/fence.py)

One row, token 0 (no leader yet): a leader raises it when it takes office.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06 19:00:00
"""

import sqlalchemy as sa
from alembic import op

from migrations.changesignal import signal_changes

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    fence = op.create_table(
        "leader_fence",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("token", sa.BigInteger(), nullable=False),
        sa.Column("holder", sa.String(length=128), nullable=False),
        sa.Column("since_ns", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_leader_fence")),
    )
    op.bulk_insert(fence, [{"id": 1, "token": 0, "holder": "", "since_ns": 0}])
    signal_changes("leader_fence")  # every table signals its changes (0012)


def downgrade() -> None:
    op.drop_table("leader_fence")
