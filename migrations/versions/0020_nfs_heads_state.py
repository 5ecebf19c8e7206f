"""nfs_heads, nfs_holdings, nfs_grace: NFS state shared by several heads over one catalog

Each live head's row (heartbeat, grace flags), what each head's clients hold per file (share
modes and byte-range locks) and the cluster's grace epochs (appliance/nfs/state/heads.py).
Nothing caches them, so they get no change trigger (models.UNSIGNALLED_TABLES).

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-07 01:30:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "nfs_heads",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("instance", sa.String(length=32), nullable=False),
        sa.Column("beat", sa.BigInteger(), nullable=False),
        sa.Column("address", sa.String(length=128), nullable=False),
        sa.Column("started_ns", sa.BigInteger(), nullable=False),
        sa.Column("need_grace", sa.Boolean(), nullable=False),
        sa.Column("enforcing", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_nfs_heads")),
    )
    op.create_table(
        "nfs_holdings",
        sa.Column("head", sa.String(length=64), nullable=False),
        sa.Column("ino", sa.BigInteger(), nullable=False),
        sa.Column("instance", sa.String(length=32), nullable=False),
        sa.Column("access", sa.Integer(), nullable=False),
        sa.Column("deny", sa.Integer(), nullable=False),
        sa.Column("locks", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("head", "ino", name=op.f("pk_nfs_holdings")),
    )
    op.create_index("ix_nfs_holdings_ino", "nfs_holdings", ["ino"])
    grace = op.create_table(
        "nfs_grace",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("current_epoch", sa.BigInteger(), nullable=False),
        sa.Column("recovery_epoch", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_nfs_grace")),
    )
    op.bulk_insert(grace, [{"id": 1, "current_epoch": 1, "recovery_epoch": 0}])


def downgrade() -> None:
    op.drop_table("nfs_grace")
    op.drop_index("ix_nfs_holdings_ino", table_name="nfs_holdings")
    op.drop_table("nfs_holdings")
    op.drop_table("nfs_heads")
