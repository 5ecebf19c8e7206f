"""clone_inodes: a clone of a lazy snapshot view numbers its inodes as it copies them

A clone of a snapshot copied whole is numbered ``snapshot ino + delta`` over the snapshot's
range (migration 0023). A lazy view (0024) has no range to shift: its folders are read through
its lookup order, and its children may have no number in the view yet. Its clone therefore
numbers each inode when it copies it, and ``clone_inodes`` keeps, per clone (its root's number),
the live inode the view read it from -> the clone's inode, so that a file with two names in the
view stays one inode in the clone, and a pending clone folder knows the live folder it reads
(its ``clone_pending`` row has delta -1). Nothing existing converts: no lazy view exists yet.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-07 22:45:00
"""

import sqlalchemy as sa
from alembic import op

from migrations.changesignal import signal_changes

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "clone_inodes",
        sa.Column("clone_ino", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("clone_root", sa.BigInteger(), nullable=False),
        sa.Column("source_ino", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["clone_ino"],
            ["inodes.ino"],
            name=op.f("fk_clone_inodes_clone_ino_inodes"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("clone_ino", name=op.f("pk_clone_inodes")),
    )
    op.create_index(
        op.f("ix_clone_inodes_clone_root_source_ino"),
        "clone_inodes",
        ["clone_root", "source_ino"],
        unique=True,
    )
    signal_changes("clone_inodes")


def downgrade() -> None:
    op.drop_index(op.f("ix_clone_inodes_clone_root_source_ino"), table_name="clone_inodes")
    op.drop_table("clone_inodes")
