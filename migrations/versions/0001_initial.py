"""initial catalog schema

Revision ID: 0001
Revises:
Create Date: 2026-11-30 05:50:40.125932
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "admin_users",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("username", sa.String(length=64), nullable=False),
        sa.Column("password_hash", sa.Text(), nullable=False),
        sa.Column("created_ns", sa.BigInteger(), nullable=False),
        sa.Column("last_login_ns", sa.BigInteger(), nullable=True),
        sa.Column("failed_logins", sa.Integer(), nullable=False),
        sa.Column("locked_until_ns", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_admin_users")),
        sa.UniqueConstraint("username", name=op.f("uq_admin_users_username")),
    )
    op.create_table(
        "band_classes",
        sa.Column("name", sa.String(length=16), nullable=False),
        sa.Column("redundancy", sa.String(length=16), nullable=False),
        sa.Column("copies", sa.Integer(), nullable=False),
        sa.Column("ec_k", sa.Integer(), nullable=False),
        sa.Column("ec_m", sa.Integer(), nullable=False),
        sa.Column("ec_backend", sa.String(length=64), nullable=False),
        sa.Column("fragment_size", sa.BigInteger(), nullable=False),
        sa.Column("compression", sa.String(length=16), nullable=True),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_band_classes")),
    )
    op.create_table(
        "drives",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("uuid", sa.String(length=36), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("backend", sa.String(length=16), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("zone_size", sa.BigInteger(), nullable=False),
        sa.Column("zone_count", sa.Integer(), nullable=False),
        sa.Column("max_open_zones", sa.Integer(), nullable=False),
        sa.Column("serial", sa.String(length=64), nullable=True),
        sa.Column("model", sa.String(length=128), nullable=True),
        sa.Column("device", sa.Text(), nullable=True),
        sa.Column("added_ns", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_drives")),
        sa.UniqueConstraint("uuid", name=op.f("uq_drives_uuid")),
    )
    op.create_table(
        "events",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("time_ns", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(length=64), nullable=False),
        sa.Column("severity", sa.String(length=8), nullable=False),
        sa.Column("actor", sa.String(length=64), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("details", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_events")),
    )
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_events_time_ns"), ["time_ns"], unique=False)

    op.create_table(
        "exports",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("clients", sa.Text(), nullable=False),
        sa.Column("access", sa.String(length=2), nullable=False),
        sa.Column("squash", sa.String(length=16), nullable=False),
        sa.Column("anon_uid", sa.BigInteger(), nullable=False),
        sa.Column("anon_gid", sa.BigInteger(), nullable=False),
        sa.Column("trash_days", sa.Integer(), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_exports")),
        sa.UniqueConstraint("name", name=op.f("uq_exports_name")),
    )
    op.create_table(
        "inodes",
        sa.Column(
            "ino",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("generation", sa.BigInteger(), nullable=False),
        sa.Column("type", sa.Integer(), nullable=False),
        sa.Column("mode", sa.Integer(), nullable=False),
        sa.Column("uid", sa.BigInteger(), nullable=False),
        sa.Column("gid", sa.BigInteger(), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("nlink", sa.Integer(), nullable=False),
        sa.Column("rdev", sa.BigInteger(), nullable=False),
        sa.Column("atime_ns", sa.BigInteger(), nullable=False),
        sa.Column("mtime_ns", sa.BigInteger(), nullable=False),
        sa.Column("ctime_ns", sa.BigInteger(), nullable=False),
        sa.Column("btime_ns", sa.BigInteger(), nullable=False),
        sa.Column("change", sa.BigInteger(), nullable=False),
        sa.Column("band_class", sa.String(length=16), nullable=True),
        sa.PrimaryKeyConstraint("ino", name=op.f("pk_inodes")),
        sqlite_autoincrement=True,
    )
    op.create_table(
        "nfs_clients",
        sa.Column("clientid", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("owner", sa.LargeBinary(), nullable=False),
        sa.Column("verifier", sa.LargeBinary(), nullable=False),
        sa.Column("address", sa.String(length=64), nullable=True),
        sa.Column("minor_version", sa.Integer(), nullable=False),
        sa.Column("confirmed", sa.Boolean(), nullable=False),
        sa.Column("reclaim_complete", sa.Boolean(), nullable=False),
        sa.Column("created_ns", sa.BigInteger(), nullable=False),
        sa.Column("last_seen_ns", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("clientid", name=op.f("pk_nfs_clients")),
    )
    op.create_table(
        "retention_policies",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("pattern", sa.Text(), nullable=False),
        sa.Column("keep", sa.Integer(), nullable=False),
        sa.Column("order_by", sa.String(length=8), nullable=False),
        sa.Column("action", sa.String(length=8), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("created_ns", sa.BigInteger(), nullable=False),
        sa.Column("last_run_ns", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_retention_policies")),
    )
    op.create_table(
        "settings",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_settings")),
    )
    op.create_table(
        "stripes",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("band_class", sa.String(length=16), nullable=False),
        sa.Column("layout", sa.String(length=16), nullable=False),
        sa.Column("k", sa.Integer(), nullable=False),
        sa.Column("m", sa.Integer(), nullable=False),
        sa.Column("backend", sa.String(length=64), nullable=True),
        sa.Column("data_length", sa.BigInteger(), nullable=False),
        sa.Column("fragment_length", sa.BigInteger(), nullable=False),
        sa.Column("compression", sa.String(length=16), nullable=True),
        sa.Column("live_bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_ns", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_stripes")),
    )
    op.create_table(
        "api_tokens",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("user_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("token_hash", sa.String(length=128), nullable=False),
        sa.Column("created_ns", sa.BigInteger(), nullable=False),
        sa.Column("last_used_ns", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(
            ["user_id"],
            ["admin_users.id"],
            name=op.f("fk_api_tokens_user_id_admin_users"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_tokens")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_api_tokens_token_hash")),
    )
    op.create_table(
        "dirents",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("parent", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("child", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.ForeignKeyConstraint(
            ["child"], ["inodes.ino"], name=op.f("fk_dirents_child_inodes"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["parent"], ["inodes.ino"], name=op.f("fk_dirents_parent_inodes"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_dirents")),
        sa.UniqueConstraint("parent", "name", name=op.f("uq_dirents_parent_name")),
        sqlite_autoincrement=True,
    )
    with op.batch_alter_table("dirents", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_dirents_child"), ["child"], unique=False)
        batch_op.create_index("ix_dirents_parent_id", ["parent", "id"], unique=False)

    op.create_table(
        "extents",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("ino", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("file_offset", sa.BigInteger(), nullable=False),
        sa.Column("length", sa.BigInteger(), nullable=False),
        sa.Column(
            "stripe_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False
        ),
        sa.Column("stripe_offset", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["ino"], ["inodes.ino"], name=op.f("fk_extents_ino_inodes"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["stripe_id"], ["stripes.id"], name=op.f("fk_extents_stripe_id_stripes")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_extents")),
    )
    with op.batch_alter_table("extents", schema=None) as batch_op:
        batch_op.create_index("ix_extents_ino_offset", ["ino", "file_offset"], unique=False)
        batch_op.create_index(batch_op.f("ix_extents_stripe_id"), ["stripe_id"], unique=False)

    op.create_table(
        "snapshots",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column(
            "source_ino", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False
        ),
        sa.Column("root_ino", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
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
    op.create_table(
        "symlinks",
        sa.Column("ino", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("target", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["ino"], ["inodes.ino"], name=op.f("fk_symlinks_ino_inodes"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("ino", name=op.f("pk_symlinks")),
    )
    op.create_table(
        "xattrs",
        sa.Column("ino", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("value", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["ino"], ["inodes.ino"], name=op.f("fk_xattrs_ino_inodes"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("ino", "name", name=op.f("pk_xattrs")),
    )
    op.create_table(
        "zones",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("drive_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("idx", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("band_class", sa.String(length=16), nullable=True),
        sa.Column("write_pointer", sa.BigInteger(), nullable=False),
        sa.Column("live_bytes", sa.BigInteger(), nullable=False),
        sa.Column("garbage_bytes", sa.BigInteger(), nullable=False),
        sa.Column("opened_ns", sa.BigInteger(), nullable=True),
        sa.Column("last_write_ns", sa.BigInteger(), nullable=True),
        sa.Column("resets", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["drive_id"], ["drives.id"], name=op.f("fk_zones_drive_id_drives"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_zones")),
        sa.UniqueConstraint("drive_id", "idx", name=op.f("uq_zones_drive_id_idx")),
    )
    with op.batch_alter_table("zones", schema=None) as batch_op:
        batch_op.create_index("ix_zones_state_class", ["state", "band_class"], unique=False)

    op.create_table(
        "fragments",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column(
            "stripe_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False
        ),
        sa.Column("idx", sa.Integer(), nullable=False),
        sa.Column("drive_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("zone_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("zone_offset", sa.BigInteger(), nullable=False),
        sa.Column("length", sa.BigInteger(), nullable=False),
        sa.Column("checksum", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["drive_id"], ["drives.id"], name=op.f("fk_fragments_drive_id_drives")
        ),
        sa.ForeignKeyConstraint(
            ["stripe_id"],
            ["stripes.id"],
            name=op.f("fk_fragments_stripe_id_stripes"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(["zone_id"], ["zones.id"], name=op.f("fk_fragments_zone_id_zones")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_fragments")),
        sa.UniqueConstraint("stripe_id", "idx", name=op.f("uq_fragments_stripe_id_idx")),
    )
    with op.batch_alter_table("fragments", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_fragments_zone_id"), ["zone_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("fragments", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_fragments_zone_id"))

    op.drop_table("fragments")
    with op.batch_alter_table("zones", schema=None) as batch_op:
        batch_op.drop_index("ix_zones_state_class")

    op.drop_table("zones")
    op.drop_table("xattrs")
    op.drop_table("symlinks")
    op.drop_table("snapshots")
    with op.batch_alter_table("extents", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_extents_stripe_id"))
        batch_op.drop_index("ix_extents_ino_offset")

    op.drop_table("extents")
    with op.batch_alter_table("dirents", schema=None) as batch_op:
        batch_op.drop_index("ix_dirents_parent_id")
        batch_op.drop_index(batch_op.f("ix_dirents_child"))

    op.drop_table("dirents")
    op.drop_table("api_tokens")
    op.drop_table("stripes")
    op.drop_table("settings")
    op.drop_table("retention_policies")
    op.drop_table("nfs_clients")
    op.drop_table("inodes")
    op.drop_table("exports")
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_events_time_ns"))

    op.drop_table("events")
    op.drop_table("drives")
    op.drop_table("band_classes")
    op.drop_table("admin_users")
