"""Quotas (engine/namespace/quotas.py): byte and file limits of directory trees, with usage counters

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02 01:40:00
"""

import sqlalchemy as sa
from alembic import op

from migrations.changesignal import signal_changes

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "quotas",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("root_ino", _ID, nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("bytes_limit", sa.BigInteger(), nullable=True),
        sa.Column("files_limit", sa.BigInteger(), nullable=True),
        sa.Column("soft_bytes", sa.BigInteger(), nullable=True),
        sa.Column("soft_files", sa.BigInteger(), nullable=True),
        sa.Column("used_bytes", sa.BigInteger(), nullable=False),
        sa.Column("used_files", sa.BigInteger(), nullable=False),
        sa.Column("created_ns", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["root_ino"],
            ["inodes.ino"],
            name=op.f("fk_quotas_root_ino_inodes"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_quotas")),
        sa.UniqueConstraint("root_ino", name=op.f("uq_quotas_root_ino")),
    )
    signal_changes("quotas")  # every table signals its changes (0012)


def downgrade() -> None:
    op.drop_table("quotas")
