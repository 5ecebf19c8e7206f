"""clone_pending: directories of a writable dataset clone whose names are not copied yet

A clone of a snapshot is made in constant time: its root is a copy of the snapshot's root row
and every directory's names and children are copied from the snapshot the first time they are
needed (engine/namespace/lazyclones.py). The snapshot's rows never change, so a pending
directory's source (``dir_ino - delta``) is exactly what the clone held when it was made.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-07 02:00:00
"""

import sqlalchemy as sa
from alembic import op

from migrations.changesignal import signal_changes

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "clone_pending",
        sa.Column("dir_ino", sa.BigInteger(), nullable=False),
        sa.Column("delta", sa.BigInteger(), nullable=False),
        sa.Column("snapshot_id", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["dir_ino"],
            ["inodes.ino"],
            name=op.f("fk_clone_pending_dir_ino_inodes"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("dir_ino", name=op.f("pk_clone_pending")),
    )
    op.create_index(
        op.f("ix_clone_pending_snapshot_id"), "clone_pending", ["snapshot_id"], unique=False
    )
    # every table signals its changes (0012): another head's copy of a pending folder must
    # reach this head's caches like any other namespace change
    signal_changes("clone_pending")


def downgrade() -> None:
    op.drop_index(op.f("ix_clone_pending_snapshot_id"), table_name="clone_pending")
    op.drop_table("clone_pending")
