"""snapshot_blocks, snapshot_inodes, snapshot_names, snapshots.top_ino: numbers at copy time

A snapshot's frozen inodes were one range [ino_lo, ino_hi] reserved at create, which needs the
tree's inode count at create (an O(files) walk). A snapshot whose rows are copied when the live
tree changes (issue 35, docs/snapshots.md "Snapshot create in constant time") gets its numbers
at copy time instead, a block at a time: ``snapshot_blocks`` holds every snapshot's blocks
(disjoint; nothing else is ever numbered inside one), which the read-only check bisects, and
``snapshot_inodes`` maps a live inode to its number in such a view (one number per live inode
per view, so a file with two names stays one inode and handles stay stable); ``snapshot_names``
holds a live directory's names as such a view holds them, copied before they changed (children
by live number, not copied themselves: no foreign key; ``names_copied`` marks the directory).
``top_ino`` is the largest inode number when such a snapshot was taken (an inode numbered after
it is never in it); NULL for a snapshot copied whole at create. Every existing snapshot is
copied whole: its range becomes its one block and nothing maps.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-07 16:00:00
"""

import sqlalchemy as sa
from alembic import op

from migrations.changesignal import signal_changes

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("snapshots", sa.Column("top_ino", sa.BigInteger(), nullable=True))
    op.create_table(
        "snapshot_blocks",
        sa.Column("ino_lo", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("ino_hi", sa.BigInteger(), nullable=False),
        sa.Column("snapshot_id", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["snapshot_id"],
            ["snapshots.id"],
            name=op.f("fk_snapshot_blocks_snapshot_id_snapshots"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("ino_lo", name=op.f("pk_snapshot_blocks")),
    )
    op.create_index(
        op.f("ix_snapshot_blocks_snapshot_id"), "snapshot_blocks", ["snapshot_id"], unique=False
    )
    signal_changes("snapshot_blocks")
    op.create_table(
        "snapshot_inodes",
        sa.Column("snapshot_id", sa.BigInteger(), nullable=False),
        sa.Column("live_ino", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("view_ino", sa.BigInteger(), nullable=False),
        sa.Column("names_copied", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.ForeignKeyConstraint(
            ["snapshot_id"],
            ["snapshots.id"],
            name=op.f("fk_snapshot_inodes_snapshot_id_snapshots"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("snapshot_id", "live_ino", name=op.f("pk_snapshot_inodes")),
    )
    op.create_index(
        op.f("ix_snapshot_inodes_view_ino"), "snapshot_inodes", ["view_ino"], unique=True
    )
    signal_changes("snapshot_inodes")
    op.create_table(
        "snapshot_names",
        sa.Column("snapshot_id", sa.BigInteger(), nullable=False),
        sa.Column("parent", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("child", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["snapshot_id"],
            ["snapshots.id"],
            name=op.f("fk_snapshot_names_snapshot_id_snapshots"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("snapshot_id", "parent", "name", name=op.f("pk_snapshot_names")),
    )
    op.create_index(op.f("ix_snapshot_names_child"), "snapshot_names", ["child"], unique=False)
    signal_changes("snapshot_names")
    # every snapshot so far was copied whole: its range (what a deleted one has left of it) is
    # its one block
    op.execute(
        "INSERT INTO snapshot_blocks (ino_lo, ino_hi, snapshot_id) "
        "SELECT ino_lo, ino_hi, id FROM snapshots WHERE ino_lo <= ino_hi"
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_snapshot_names_child"), table_name="snapshot_names")
    op.drop_table("snapshot_names")
    op.drop_index(op.f("ix_snapshot_inodes_view_ino"), table_name="snapshot_inodes")
    op.drop_table("snapshot_inodes")
    op.drop_index(op.f("ix_snapshot_blocks_snapshot_id"), table_name="snapshot_blocks")
    op.drop_table("snapshot_blocks")
    with op.batch_alter_table("snapshots") as batch:
        batch.drop_column("top_ino")
