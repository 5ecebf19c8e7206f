"""nfs_clients.held_state: whether an NFSv4 client holds opens or locks

After a restart only clients whose record says they held state keep the grace period
(appliance.nfs.v4.state). Records made before this revision may have held state: they say
true, so the upgrade's restart keeps the grace period for them as before.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06 03:20:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "nfs_clients",
        sa.Column("held_state", sa.Boolean(), nullable=False, server_default=sa.false()),
    )
    clients = sa.table("nfs_clients", sa.column("held_state", sa.Boolean()))
    op.execute(clients.update().values(held_state=True))


def downgrade() -> None:
    # ALTER TABLE ... DROP COLUMN: SQLite 3.35 and later, PostgreSQL; no table copy
    op.drop_column("nfs_clients", "held_state")
