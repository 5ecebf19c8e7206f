"""versioned datasets: snapshots record their inode range; each dataset's .snapshots directory

The snapshots table of 0001 was never used: it is created again with the range
[ino_lo, ino_hi] of the snapshot's frozen inodes (copied with new = old + delta),
and snapshot_dirs names each dataset's hidden .snapshots directory.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 23:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _old_snapshots(with_range: bool) -> None:
    columns = [
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("source_ino", BigId, nullable=False),
        sa.Column("root_ino", BigId, nullable=False),
    ]
    if with_range:
        columns += [
            sa.Column("ino_lo", sa.BigInteger(), nullable=False),
            sa.Column("ino_hi", sa.BigInteger(), nullable=False),
            sa.Column("deleting", sa.Boolean(), nullable=False),
        ]
    op.create_table(
        "snapshots",
        *columns,
        sa.Column("created_ns", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["root_ino"], ["inodes.ino"], name=op.f("fk_snapshots_root_ino_inodes")
        ),
        sa.ForeignKeyConstraint(
            ["source_ino"],
            ["inodes.ino"],
            name=op.f("fk_snapshots_source_ino_inodes"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_snapshots")),
        sa.UniqueConstraint("source_ino", "name", name=op.f("uq_snapshots_source_ino_name")),
    )


def upgrade() -> None:
    op.drop_table("snapshots")
    _old_snapshots(with_range=True)
    op.create_table(
        "snapshot_dirs",
        sa.Column("dataset_ino", BigId, nullable=False),
        sa.Column("dir_ino", BigId, nullable=False),
        sa.ForeignKeyConstraint(
            ["dataset_ino"],
            ["inodes.ino"],
            name=op.f("fk_snapshot_dirs_dataset_ino_inodes"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["dir_ino"], ["inodes.ino"], name=op.f("fk_snapshot_dirs_dir_ino_inodes")
        ),
        sa.PrimaryKeyConstraint("dataset_ino", name=op.f("pk_snapshot_dirs")),
        sa.UniqueConstraint("dir_ino", name=op.f("uq_snapshot_dirs_dir_ino")),
    )


def downgrade() -> None:
    op.drop_table("snapshot_dirs")
    op.drop_table("snapshots")
    _old_snapshots(with_range=False)
