"""drives.host: the storage host a drive is on (its failure domain)

Placement spreads a stripe's fragments over hosts (engine/datapath/space.py). Drives recorded
before this revision are the head's own (NULL).

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06 19:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("drives", sa.Column("host", sa.String(255), nullable=True))


def downgrade() -> None:
    # ALTER TABLE ... DROP COLUMN: SQLite 3.35 and later, PostgreSQL; no table copy
    op.drop_column("drives", "host")
