"""leader_fence: the fencing token of the maintenance leader (engine/catalog/fence.py)

One row, token 0 (no leader yet): a leader raises it when it takes office.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06 19:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    fence = op.create_table(
        "leader_fence",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("token", sa.BigInteger(), nullable=False),
        sa.Column("holder", sa.String(length=128), nullable=False),
        sa.Column("since_ns", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_leader_fence")),
    )
    op.bulk_insert(fence, [{"id": 1, "token": 0, "holder": "", "since_ns": 0}])
    if op.get_bind().dialect.name == "postgresql":
        # every table signals its changes (0012): a table made after it needs the trigger too
        op.execute(
            "CREATE TRIGGER shingle_catalog_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE "
            'ON "leader_fence" FOR EACH STATEMENT EXECUTE FUNCTION shingle_catalog_changed()'
        )


def downgrade() -> None:
    op.drop_table("leader_fence")
