"""exports.delegations: whether NFSv4.1+ clients may get read delegations of the export's files

An admin turns them off per export (engine/admin/exports.py); exports recorded before this
revision keep them on, the default.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06 22:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "exports",
        sa.Column("delegations", sa.Boolean(), nullable=False, server_default=sa.true()),
    )


def downgrade() -> None:
    op.drop_column("exports", "delegations")
