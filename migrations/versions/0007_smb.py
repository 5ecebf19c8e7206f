"""SMB shares and users (engine/admin/smb.py); passwords stay in Samba's own passdb

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02 10:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "smb_shares",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=80), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("access", sa.String(length=2), nullable=False),
        sa.Column("clients", sa.Text(), nullable=False),
        sa.Column("guest", sa.Boolean(), nullable=False),
        sa.Column("users", sa.Text(), nullable=False),
        sa.Column("read_only_users", sa.Text(), nullable=False),
        sa.Column("case_insensitive", sa.Boolean(), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_smb_shares")),
        sa.UniqueConstraint("name", name=op.f("uq_smb_shares_name")),
    )
    op.create_table(
        "smb_users",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("uid", sa.BigInteger(), nullable=False),
        sa.Column("gid", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_smb_users")),
        sa.UniqueConstraint("name", name=op.f("uq_smb_users_name")),
    )


def downgrade() -> None:
    op.drop_table("smb_users")
    op.drop_table("smb_shares")
