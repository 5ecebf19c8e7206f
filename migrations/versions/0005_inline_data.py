"""inline stripes: small durable writes kept in the catalog (table inline_data)

A 4 KiB COMMIT or stable WRITE used to cost two fsync rounds in series: the
fragments on their drives, then the catalog transaction that names them. Its
bytes now ride in that one transaction, as the data of a stripe with layout
"inline"; tiering later folds them into erasure-coded stripes.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 09:10:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "inline_data",
        sa.Column(
            "stripe_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False
        ),
        sa.Column("length", sa.BigInteger(), nullable=False),
        sa.Column("checksum", sa.BigInteger(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["stripe_id"],
            ["stripes.id"],
            name=op.f("fk_inline_data_stripe_id_stripes"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("stripe_id", name=op.f("pk_inline_data")),
    )


def downgrade() -> None:
    op.drop_table("inline_data")
