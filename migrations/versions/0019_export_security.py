"""exports.sec: the RPC security flavours an export allows, in order of preference

``krb5p:krb5i:krb5:sys`` as knfsd and NFS-Ganesha write it (appliance/nfs/exports.py). Exports
recorded before this revision allow AUTH_SYS only, as they did.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-06 22:20:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("exports", sa.Column("sec", sa.String(64), nullable=False, server_default="sys"))


def downgrade() -> None:
    # ALTER TABLE ... DROP COLUMN: SQLite 3.35 and later, PostgreSQL; no table copy
    op.drop_column("exports", "sec")
