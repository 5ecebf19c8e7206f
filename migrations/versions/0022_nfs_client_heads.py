"""nfs_clients.head and .principal: whose client a record is among several heads, and who made it

A head that expires a dead one takes the dead head's client records, and their clients
reclaim through it (appliance/nfs/state/cluster_grace.py). Records made before this revision
are a single head's ("").

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-07 01:40:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "nfs_clients", sa.Column("head", sa.String(64), nullable=False, server_default="")
    )
    op.add_column("nfs_clients", sa.Column("principal", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("nfs_clients", "principal")
    op.drop_column("nfs_clients", "head")
