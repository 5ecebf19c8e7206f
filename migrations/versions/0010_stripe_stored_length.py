"""stripes.stored_length: the bytes a compressed stripe stores (its zstd frame)

Tiering compresses each stripe it writes into a band class with compression (cold: zstd)
before erasure coding it; ``compression`` names the codec and ``stored_length`` the frame's
length, which the fragments hold in place of the user bytes (``data_length`` stays the user
bytes). NULL for raw stripes: every stripe written before this revision.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02 01:40:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("stripes", sa.Column("stored_length", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    # ALTER TABLE ... DROP COLUMN: SQLite 3.35 and later, PostgreSQL; no table copy
    op.drop_column("stripes", "stored_length")
