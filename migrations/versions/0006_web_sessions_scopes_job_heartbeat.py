"""server-side web sessions, login throttle, API token scopes and expiry, job heartbeats

Sessions were signed cookies alone, valid 12 h whatever happened; they are now
rows (admin_sessions) that logout, a password change and removing the admin
delete. The account lock that refused even the right password gives way to a
back-off per address, per account and per account from one address
(login_throttle). API tokens get a scope and an expiry: the tokens made before
this revision keep the full admin scope they had. Jobs get a heartbeat, so a
daemon that died mid-job can be told from one that is busy.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02 10:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "admin_sessions",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("user_id", BigId, nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("address", sa.String(length=64), nullable=True),
        sa.Column("created_ns", sa.BigInteger(), nullable=False),
        sa.Column("last_seen_ns", sa.BigInteger(), nullable=False),
        sa.Column("expires_ns", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["user_id"],
            ["admin_users.id"],
            name=op.f("fk_admin_sessions_user_id_admin_users"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_admin_sessions")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_admin_sessions_token_hash")),
    )
    with op.batch_alter_table("admin_sessions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_admin_sessions_user_id"), ["user_id"], unique=False)
    op.create_table(
        "login_throttle",
        sa.Column("key", sa.String(length=160), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("last_failure_ns", sa.BigInteger(), nullable=False),
        sa.Column("blocked_until_ns", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_login_throttle")),
    )
    with op.batch_alter_table("login_throttle", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_login_throttle_last_failure_ns"), ["last_failure_ns"], unique=False
        )
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        # Tokens made before scopes existed keep the full admin scope they had.
        batch_op.add_column(
            sa.Column("scope", sa.String(length=16), nullable=False, server_default="admin")
        )
        batch_op.add_column(sa.Column("expires_ns", sa.BigInteger(), nullable=True))
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.alter_column("scope", server_default=None)
    with op.batch_alter_table("admin_users", schema=None) as batch_op:
        batch_op.drop_column("locked_until_ns")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("heartbeat_ns", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"))
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.alter_column("attempts", server_default=None)


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("attempts")
        batch_op.drop_column("heartbeat_ns")
    with op.batch_alter_table("admin_users", schema=None) as batch_op:
        batch_op.add_column(sa.Column("locked_until_ns", sa.BigInteger(), nullable=True))
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.drop_column("expires_ns")
        batch_op.drop_column("scope")
    with op.batch_alter_table("login_throttle", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_login_throttle_last_failure_ns"))
    op.drop_table("login_throttle")
    with op.batch_alter_table("admin_sessions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_admin_sessions_user_id"))
    op.drop_table("admin_sessions")
