"""The catalog schema: SQLAlchemy 2 typed models.

Alembic (migrations/) owns the schema in databases; these models are what
it is compared against. Hot paths use the tables through SQLAlchemy Core
(``Model.__table__``) for speed; the ORM classes are for admin code.
Times are integers in nanoseconds since the epoch (UTC)."""

from __future__ import annotations

from typing import ClassVar

from sqlalchemy import (
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    false,
    true,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# SQLite only auto-increments an INTEGER PRIMARY KEY, PostgreSQL wants BIGINT.
BigId = BigInteger().with_variant(Integer(), "sqlite")

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    # every model is one plain table, used as such through Core (insert/update/delete)
    __table__: ClassVar[Table]  # narrows DeclarativeBase's FromClause


# File types use the NFSv4 ftype4 numbering, which is also a natural order.
REG, DIR, BLK, CHR, LNK, SOCK, FIFO = 1, 2, 3, 4, 5, 6, 7


class Inode(Base):
    __tablename__ = "inodes"
    ino: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    generation: Mapped[int] = mapped_column(BigInteger, default=1)
    type: Mapped[int] = mapped_column(Integer)
    mode: Mapped[int] = mapped_column(Integer)  # permission bits incl. suid/sgid/sticky
    uid: Mapped[int] = mapped_column(BigInteger, default=0)
    gid: Mapped[int] = mapped_column(BigInteger, default=0)
    size: Mapped[int] = mapped_column(BigInteger, default=0)
    nlink: Mapped[int] = mapped_column(Integer, default=1)
    rdev: Mapped[int] = mapped_column(BigInteger, default=0)
    atime_ns: Mapped[int] = mapped_column(BigInteger)
    mtime_ns: Mapped[int] = mapped_column(BigInteger)
    ctime_ns: Mapped[int] = mapped_column(BigInteger)
    btime_ns: Mapped[int] = mapped_column(BigInteger)
    change: Mapped[int] = mapped_column(BigInteger, default=1)
    # Band class this file's data is pinned to (None: placement decides).
    band_class: Mapped[str | None] = mapped_column(String(16), nullable=True)
    # AUTOINCREMENT: SQLite must never hand out a freed inode number again,
    # or an old file handle could name a new file.
    __table_args__ = {"sqlite_autoincrement": True}


class Dirent(Base):
    """A name in a directory. ``id`` doubles as the readdir cookie: ids only
    grow, so a cookie stays valid while the directory changes."""

    __tablename__ = "dirents"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    parent: Mapped[int] = mapped_column(ForeignKey("inodes.ino", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(255))
    child: Mapped[int] = mapped_column(ForeignKey("inodes.ino", ondelete="CASCADE"), index=True)
    __table_args__ = (
        UniqueConstraint("parent", "name"),
        Index("ix_dirents_parent_id", "parent", "id"),
        {"sqlite_autoincrement": True},
    )


class Symlink(Base):
    __tablename__ = "symlinks"
    ino: Mapped[int] = mapped_column(ForeignKey("inodes.ino", ondelete="CASCADE"), primary_key=True)
    target: Mapped[bytes] = mapped_column(LargeBinary)


class Xattr(Base):
    __tablename__ = "xattrs"
    ino: Mapped[int] = mapped_column(ForeignKey("inodes.ino", ondelete="CASCADE"), primary_key=True)
    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    value: Mapped[bytes] = mapped_column(LargeBinary)


class BandClass(Base):
    """hot / warm / cold: redundancy and geometry of the bands of a class."""

    __tablename__ = "band_classes"
    name: Mapped[str] = mapped_column(String(16), primary_key=True)
    redundancy: Mapped[str] = mapped_column(String(16))  # "replicate" | "ec"
    copies: Mapped[int] = mapped_column(Integer, default=3)
    ec_k: Mapped[int] = mapped_column(Integer, default=8)
    ec_m: Mapped[int] = mapped_column(Integer, default=2)
    ec_backend: Mapped[str] = mapped_column(String(64), default="isa_l_rs_vand")
    fragment_size: Mapped[int] = mapped_column(BigInteger, default=1 << 20)
    compression: Mapped[str | None] = mapped_column(String(16), nullable=True)


class Drive(Base):
    __tablename__ = "drives"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    uuid: Mapped[str] = mapped_column(String(36), unique=True)
    path: Mapped[str] = mapped_column(Text)
    backend: Mapped[str] = mapped_column(String(16))  # "zonefile" | "zoned-block" | "agent"
    # online | degraded | failed | draining | removed
    state: Mapped[str] = mapped_column(String(16), default="online")
    zone_size: Mapped[int] = mapped_column(BigInteger)
    zone_count: Mapped[int] = mapped_column(Integer)
    max_open_zones: Mapped[int] = mapped_column(Integer, default=0)
    serial: Mapped[str | None] = mapped_column(String(64), nullable=True)
    model: Mapped[str | None] = mapped_column(String(128), nullable=True)
    device: Mapped[str | None] = mapped_column(Text, nullable=True)  # block device for SMART
    added_ns: Mapped[int] = mapped_column(BigInteger)
    # the failure domain: the storage host whose agent serves it; None: the head's own host
    host: Mapped[str | None] = mapped_column(String(255), nullable=True)


class Zone(Base):
    """One band of a drive. ``write_pointer`` is the committed end: bytes
    beyond it on the medium are garbage from an interrupted flush."""

    __tablename__ = "zones"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    drive_id: Mapped[int] = mapped_column(ForeignKey("drives.id", ondelete="CASCADE"))
    idx: Mapped[int] = mapped_column(Integer)
    # empty | open | full | offline
    state: Mapped[str] = mapped_column(String(16), default="empty")
    band_class: Mapped[str | None] = mapped_column(String(16), nullable=True)
    write_pointer: Mapped[int] = mapped_column(BigInteger, default=0)
    live_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    garbage_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    opened_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    last_write_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    resets: Mapped[int] = mapped_column(Integer, default=0)
    __table_args__ = (
        UniqueConstraint("drive_id", "idx"),
        Index("ix_zones_state_class", "state", "band_class"),
    )


class Stripe(Base):
    """One unit of redundancy: k data + m parity fragments (EC), or n copies."""

    __tablename__ = "stripes"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    band_class: Mapped[str] = mapped_column(String(16))
    layout: Mapped[str] = mapped_column(String(16))  # "ec" | "replica" | "inline" (InlineData)
    k: Mapped[int] = mapped_column(Integer)
    m: Mapped[int] = mapped_column(Integer)
    backend: Mapped[str | None] = mapped_column(String(64), nullable=True)
    data_length: Mapped[int] = mapped_column(BigInteger)  # user bytes held
    fragment_length: Mapped[int] = mapped_column(BigInteger)  # bytes per fragment on disk
    # codec of a compressed stripe (engine/coding/compression.py), and the bytes its fragments
    # encode (the compressed frame); both NULL for a raw stripe
    compression: Mapped[str | None] = mapped_column(String(16), nullable=True)
    stored_length: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    live_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    created_ns: Mapped[int] = mapped_column(BigInteger)
    # AUTOINCREMENT: a dead stripe's id must never name a new stripe (caches are keyed by it)
    __table_args__ = {"sqlite_autoincrement": True}


class InlineData(Base):
    """The bytes of an inline stripe (layout "inline"): a small durable write kept in the catalog's
    own transaction instead of on drives, so it costs one fsync round, not two. Tiering folds them
    into erasure-coded stripes like any hot data; deleting the stripe deletes them."""

    __tablename__ = "inline_data"
    stripe_id: Mapped[int] = mapped_column(
        ForeignKey("stripes.id", ondelete="CASCADE"), primary_key=True
    )
    length: Mapped[int] = mapped_column(BigInteger)
    checksum: Mapped[int] = mapped_column(BigInteger)  # crc32c of data
    data: Mapped[bytes] = mapped_column(LargeBinary)


class Fragment(Base):
    __tablename__ = "fragments"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    stripe_id: Mapped[int] = mapped_column(ForeignKey("stripes.id", ondelete="CASCADE"))
    idx: Mapped[int] = mapped_column(Integer)
    drive_id: Mapped[int] = mapped_column(ForeignKey("drives.id"))
    zone_id: Mapped[int] = mapped_column(ForeignKey("zones.id"), index=True)
    zone_offset: Mapped[int] = mapped_column(BigInteger)
    length: Mapped[int] = mapped_column(BigInteger)
    checksum: Mapped[int] = mapped_column(BigInteger)  # crc32c of the bytes on disk
    __table_args__ = (UniqueConstraint("stripe_id", "idx"),)


class Extent(Base):
    """(inode, file offset, length) -> (stripe, offset in the stripe's data)."""

    __tablename__ = "extents"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    ino: Mapped[int] = mapped_column(ForeignKey("inodes.ino", ondelete="CASCADE"))
    file_offset: Mapped[int] = mapped_column(BigInteger)
    length: Mapped[int] = mapped_column(BigInteger)
    stripe_id: Mapped[int] = mapped_column(ForeignKey("stripes.id"), index=True)
    stripe_offset: Mapped[int] = mapped_column(BigInteger)
    __table_args__ = (Index("ix_extents_ino_offset", "ino", "file_offset"),)


class Export(Base):
    __tablename__ = "exports"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)  # path clients mount, e.g. /export
    path: Mapped[str] = mapped_column(Text, default="/")  # directory in the namespace
    clients: Mapped[str] = mapped_column(Text, default="0.0.0.0/0,::/0")  # comma-separated CIDRs
    access: Mapped[str] = mapped_column(String(2), default="rw")  # "rw" | "ro"
    squash: Mapped[str] = mapped_column(String(16), default="root_squash")
    # RPC security flavours in order of preference, e.g. "krb5p:krb5i:krb5:sys"
    sec: Mapped[str] = mapped_column(String(64), default="sys", server_default="sys")
    anon_uid: Mapped[int] = mapped_column(BigInteger, default=65534)
    anon_gid: Mapped[int] = mapped_column(BigInteger, default=65534)
    trash_days: Mapped[int] = mapped_column(Integer, default=7)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    # NFSv4.1+ read delegations of its files (appliance/nfs/state/delegations.py)
    delegations: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())


class Quota(Base):
    """Limits on a directory tree (engine/namespace/quotas.py): bytes (regular files' logical sizes)
    and files (inodes below the root), hard (refused with EDQUOT) and soft (an alert). ``used_*``
    are counters kept in the same transactions that change sizes and names; a NULL limit is none."""

    __tablename__ = "quotas"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    root_ino: Mapped[int] = mapped_column(ForeignKey("inodes.ino", ondelete="CASCADE"), unique=True)
    path: Mapped[str] = mapped_column(Text)  # as the admin gave it (namespace or export path)
    bytes_limit: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    files_limit: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    soft_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    soft_files: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    used_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    used_files: Mapped[int] = mapped_column(BigInteger, default=0)
    created_ns: Mapped[int] = mapped_column(BigInteger)


class SmbShare(Base):
    """An SMB share (engine/admin/smb.py): a namespace directory that Samba serves over the
    mount."""

    __tablename__ = "smb_shares"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(80), unique=True)  # clients connect to //server/NAME
    path: Mapped[str] = mapped_column(Text, default="/")  # directory in the namespace
    access: Mapped[str] = mapped_column(String(2), default="rw")  # "rw" | "ro"
    clients: Mapped[str] = mapped_column(Text, default="0.0.0.0/0,::/0")  # comma-separated CIDRs
    guest: Mapped[bool] = mapped_column(Boolean, default=False)  # connect without a password
    users: Mapped[str] = mapped_column(Text, default="")  # who may connect; "" = every SMB user
    read_only_users: Mapped[str] = mapped_column(Text, default="")  # may connect, not write
    case_insensitive: Mapped[bool] = mapped_column(Boolean, default=False)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)


class SmbUser(Base):
    """An SMB user: the name and the uid/gid its files get; the password is in Samba's passdb."""

    __tablename__ = "smb_users"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    uid: Mapped[int] = mapped_column(BigInteger)
    gid: Mapped[int] = mapped_column(BigInteger)


class RetentionPolicy(Base):
    __tablename__ = "retention_policies"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    pattern: Mapped[str] = mapped_column(Text)
    keep: Mapped[int] = mapped_column(Integer)
    order_by: Mapped[str] = mapped_column(String(8), default="mtime")  # "mtime" | "name"
    action: Mapped[str] = mapped_column(String(8), default="delete")  # delete | cold | trash
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    created_ns: Mapped[int] = mapped_column(BigInteger)
    last_run_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class Snapshot(Base):
    """A read-only frozen copy of a directory tree (a dataset), seen at DIR/.snapshots/NAME.

    Its inodes are numbered [ino_lo, ino_hi] (the tree's inodes in order, densely: the copy is a
    few INSERT ... SELECT statements; rows from before that was so hold ``old number + a delta``
    and a range wider than their inodes) and their extents share the live files' stripes."""

    __tablename__ = "snapshots"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(255))
    source_ino: Mapped[int] = mapped_column(ForeignKey("inodes.ino", ondelete="CASCADE"))
    root_ino: Mapped[int] = mapped_column(ForeignKey("inodes.ino"))  # frozen copy of the tree
    ino_lo: Mapped[int] = mapped_column(BigInteger)
    ino_hi: Mapped[int] = mapped_column(BigInteger)
    created_ns: Mapped[int] = mapped_column(BigInteger)
    # being deleted a chunk of inodes per transaction: hidden, named "NAME/ID", root_ino then
    # points at the dataset (its own root may already be gone)
    deleting: Mapped[bool] = mapped_column(Boolean, default=False)
    # a deleting snapshot's rows are freed in the background (Snapshots.reclaim), which moves
    # ino_lo past each chunk it freed; pending_bytes: what the rest will still free (its unique
    # bytes, counted by the reclaim's first step; NULL until then)
    pending_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # its space as last counted (engine/snapshots/service.py ``recount_space``; create counts
    # it too): listings read these instead of grouping every extent of the snapshot; NULL
    # before the first count, space_counted_ns 0 when a reclaim made them stale
    files: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    referenced_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    unique_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    shared_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    space_counted_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # a snapshot whose rows are copied when the live tree changes: the largest inode number
    # when it was taken (none numbered after is in it); NULL: copied whole at create
    top_ino: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    __table_args__ = (UniqueConstraint("source_ino", "name"),)


class SnapshotBlock(Base):
    """A block of inode numbers of a snapshot: its frozen inodes lie in its blocks, which no
    other inode is ever numbered in, so "is this inode frozen" is a bisect over the blocks
    (engine/namespace/readonly.py). A snapshot copied whole has one, its range."""

    __tablename__ = "snapshot_blocks"
    ino_lo: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    ino_hi: Mapped[int] = mapped_column(BigInteger)
    snapshot_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("snapshots.id", ondelete="CASCADE"), index=True
    )


class SnapshotInode(Base):
    """A live inode's number in a snapshot whose rows are copied when they change (one per
    live inode and snapshot: a file of two names stays one inode, its handle stable)."""

    __tablename__ = "snapshot_inodes"
    snapshot_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("snapshots.id", ondelete="CASCADE"), primary_key=True
    )
    # no foreign key: the live inode may be freed while the view keeps its copy
    live_ino: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    view_ino: Mapped[int] = mapped_column(BigInteger, unique=True, index=True)
    # a directory: its names as the snapshot holds them are in ``snapshot_names``
    names_copied: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class SnapshotName(Base):
    """A name of a live directory as a snapshot holds it, copied before the directory's names
    changed (the child by its live number, maybe not copied itself: no foreign key)."""

    __tablename__ = "snapshot_names"
    snapshot_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("snapshots.id", ondelete="CASCADE"), primary_key=True
    )
    parent: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    child: Mapped[int] = mapped_column(BigInteger, index=True)


class ClonePending(Base):
    """A directory of a writable dataset clone whose names and children are not copied from
    its snapshot yet (engine/namespace/lazyclones.py): its source is ``dir_ino - delta``."""

    __tablename__ = "clone_pending"
    dir_ino: Mapped[int] = mapped_column(
        BigInteger,
        ForeignKey("inodes.ino", ondelete="CASCADE"),
        primary_key=True,
        autoincrement=False,
    )
    delta: Mapped[int] = mapped_column(BigInteger)
    snapshot_id: Mapped[int] = mapped_column(BigInteger, index=True)


class CloneInode(Base):
    """An inode of a clone of a lazy snapshot view (engine/namespace/lazyviews.py), numbered
    when copied: the live inode the view read it from (a file of two names stays one inode; a
    pending folder reads its source through the view's lookup)."""

    __tablename__ = "clone_inodes"
    __table_args__ = (
        Index("ix_clone_inodes_clone_root_source_ino", "clone_root", "source_ino", unique=True),
    )
    clone_ino: Mapped[int] = mapped_column(
        BigInteger,
        ForeignKey("inodes.ino", ondelete="CASCADE"),
        primary_key=True,
        autoincrement=False,
    )
    clone_root: Mapped[int] = mapped_column(BigInteger)
    source_ino: Mapped[int] = mapped_column(BigInteger)


class SnapshotDir(Base):
    """The ``.snapshots`` directory of a dataset (hidden from its listing, reached by name)."""

    __tablename__ = "snapshot_dirs"
    dataset_ino: Mapped[int] = mapped_column(
        ForeignKey("inodes.ino", ondelete="CASCADE"), primary_key=True
    )
    dir_ino: Mapped[int] = mapped_column(ForeignKey("inodes.ino"), unique=True)


class SnapshotSchedule(Base):
    """Periodic snapshots of a dataset named PREFIX-YYYY-MM-DDTHHMMZ
    (engine/snapshots/schedules.py), pruned by keep-last-N and keep-for-a-duration."""

    __tablename__ = "snapshot_schedules"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    path: Mapped[str] = mapped_column(Text)  # the dataset, a namespace path
    frequency: Mapped[str] = mapped_column(String(16))  # hourly | daily | weekly | interval
    interval_s: Mapped[int] = mapped_column(BigInteger)
    offset_s: Mapped[int] = mapped_column(BigInteger)  # the slot's place within its period
    prefix: Mapped[str] = mapped_column(String(64))
    keep_last: Mapped[int | None] = mapped_column(Integer, nullable=True)
    keep_for_s: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    created_ns: Mapped[int] = mapped_column(BigInteger)
    # the newest slot taken (or the slot current when the schedule was made), seconds
    last_slot_s: Mapped[int] = mapped_column(BigInteger)
    last_run_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    __table_args__ = (UniqueConstraint("path", "prefix"),)


class NfsClient(Base):
    """NFSv4 client records, kept so that a restarted server can grant a grace period."""

    __tablename__ = "nfs_clients"
    clientid: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    owner: Mapped[bytes] = mapped_column(LargeBinary)
    verifier: Mapped[bytes] = mapped_column(LargeBinary)
    address: Mapped[str | None] = mapped_column(String(64), nullable=True)
    minor_version: Mapped[int] = mapped_column(Integer, default=1)
    confirmed: Mapped[bool] = mapped_column(Boolean, default=False)
    reclaim_complete: Mapped[bool] = mapped_column(Boolean, default=False)
    # the client holds (held, at a crash) opens or locks: after a restart only such clients
    # hold the grace period (appliance.nfs.v4.state)
    held_state: Mapped[bool] = mapped_column(Boolean, default=False)
    created_ns: Mapped[int] = mapped_column(BigInteger)
    last_seen_ns: Mapped[int] = mapped_column(BigInteger)
    # the head whose client it is ("" for a single head; "head<index>" of several): a head
    # that expires a dead one takes its records, and their clients reclaim through it
    head: Mapped[str] = mapped_column(String(64), default="", server_default="")
    # who made the record (JSON of the RPC credential): only the same may reclaim on another
    # head
    principal: Mapped[str | None] = mapped_column(Text, nullable=True)


class AdminUser(Base):
    __tablename__ = "admin_users"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    username: Mapped[str] = mapped_column(String(64), unique=True)
    password_hash: Mapped[str] = mapped_column(Text)
    created_ns: Mapped[int] = mapped_column(BigInteger)
    last_login_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    failed_logins: Mapped[int] = mapped_column(Integer, default=0)


class AdminSession(Base):
    """A signed-in browser: the cookie carries a random id whose digest is kept here, so that
    signing out, a password change or removing the admin ends the session on the server."""

    __tablename__ = "admin_sessions"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    user_id: Mapped[int] = mapped_column(
        ForeignKey("admin_users.id", ondelete="CASCADE"), index=True
    )
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    address: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_ns: Mapped[int] = mapped_column(BigInteger)
    last_seen_ns: Mapped[int] = mapped_column(BigInteger)
    expires_ns: Mapped[int] = mapped_column(BigInteger)


class LoginThrottle(Base):
    """Failed sign-ins counted per source address, per account and per account from one
    address; shared by every web UI worker. A key past its allowance backs off until
    ``blocked_until_ns``; nothing is locked for good."""

    __tablename__ = "login_throttle"
    key: Mapped[str] = mapped_column(String(160), primary_key=True)
    failures: Mapped[int] = mapped_column(Integer, default=0)
    last_failure_ns: Mapped[int] = mapped_column(BigInteger, index=True)
    blocked_until_ns: Mapped[int] = mapped_column(BigInteger, default=0)


class ApiToken(Base):
    __tablename__ = "api_tokens"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("admin_users.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(64))
    token_hash: Mapped[str] = mapped_column(String(128), unique=True)
    created_ns: Mapped[int] = mapped_column(BigInteger)
    last_used_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # read-only | operator | admin (engine.admin.accounts.SCOPES)
    scope: Mapped[str] = mapped_column(String(16), default="read-only")
    expires_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)  # None: never


class Event(Base):
    __tablename__ = "events"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    time_ns: Mapped[int] = mapped_column(BigInteger, index=True)
    kind: Mapped[str] = mapped_column(String(64))
    severity: Mapped[str] = mapped_column(String(8), default="info")  # info | warning | error
    actor: Mapped[str] = mapped_column(String(64), default="system")
    message: Mapped[str] = mapped_column(Text)
    details: Mapped[str | None] = mapped_column(Text, nullable=True)  # JSON


class Setting(Base):
    """Small key/value facts of this catalog: filesystem id, root inode, ..."""

    __tablename__ = "settings"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class MetricSample(Base):
    """One reading of a counter (NFS operations and bytes, media bytes, ...) at a moment;
    the daemon records them (engine.admin.metrics.record_sample) and the web UI charts them."""

    __tablename__ = "metric_samples"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    time_ns: Mapped[int] = mapped_column(BigInteger)
    name: Mapped[str] = mapped_column(String(64))
    value: Mapped[float] = mapped_column(Float)
    __table_args__ = (Index("ix_metric_samples_name_time", "name", "time_ns"),)


class Job(Base):
    """A long operation (scrub, rebuild, retention run, ...) asked for by an admin.

    The CLI and the web UI queue jobs; the daemon, which owns the drives,
    runs them and reports progress here, so both can show it."""

    __tablename__ = "jobs"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(32))
    params: Mapped[str | None] = mapped_column(Text, nullable=True)  # JSON
    # queued | running | done | failed | interrupted (its daemon died and it cannot restart)
    state: Mapped[str] = mapped_column(String(16), default="queued")
    actor: Mapped[str] = mapped_column(String(64), default="system")
    done: Mapped[int] = mapped_column(BigInteger, default=0)
    total: Mapped[int] = mapped_column(BigInteger, default=0)
    message: Mapped[str | None] = mapped_column(Text, nullable=True)
    result: Mapped[str | None] = mapped_column(Text, nullable=True)  # JSON
    created_ns: Mapped[int] = mapped_column(BigInteger)
    started_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    finished_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # Written by the daemon every few seconds while the job runs: a stale one means it died.
    heartbeat_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)  # claims so far (re-queues count)
    __table_args__ = (Index("ix_jobs_state_id", "state", "id"),)


class Alert(Base):
    """A condition an admin must hear about (engine/admin/alerts.py): a drive failed, capacity at 90
    %, a job failed, ... One row per occurrence of (kind, key): active until acknowledged or until
    its condition is gone (cleared); a condition that comes back after clearing is a new row."""

    __tablename__ = "alerts"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(
        String(32)
    )  # engine.admin.alerts source kind, e.g. drive_failed
    key: Mapped[str] = mapped_column(String(128))  # which one, e.g. "drive:3" ("" for one per kind)
    severity: Mapped[str] = mapped_column(String(8))  # warning | critical
    state: Mapped[str] = mapped_column(String(16))  # active | acknowledged | cleared
    message: Mapped[str] = mapped_column(Text)
    details: Mapped[str | None] = mapped_column(Text, nullable=True)  # JSON
    first_ns: Mapped[int] = mapped_column(BigInteger)  # raised
    last_ns: Mapped[int] = mapped_column(BigInteger)  # last seen true
    acknowledged_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    acknowledged_by: Mapped[str | None] = mapped_column(String(64), nullable=True)
    cleared_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    __table_args__ = (Index("ix_alerts_state_kind_key", "state", "kind", "key"),)


class LeaderFence(Base):
    """One row (id 1): the fencing token of the maintenance leader that took office last
    (engine/catalog/fence.py). Every write of a leader's maintenance job checks in its own
    transaction that the token is still its own, so a leader deposed without knowing it
    (its lease gone while it was cut off from etcd) cannot commit."""

    __tablename__ = "leader_fence"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    token: Mapped[int] = mapped_column(BigInteger)  # the leader key's etcd create revision
    holder: Mapped[str] = mapped_column(String(128))  # [cluster] name of that leader
    since_ns: Mapped[int] = mapped_column(BigInteger)  # when it took office


class NfsHead(Base):
    """One row per live NFS head over this catalog (appliance/nfs/state/heads.py,
    docs/nfs-state.md): the instance that runs under the name now, a heartbeat counter other
    heads watch (a head whose beat stood still for a lease is dead: another head deletes this
    row and the head's holdings), and its part in the cluster-wide grace period."""

    __tablename__ = "nfs_heads"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)  # "head<index>"
    instance: Mapped[str] = mapped_column(String(32))  # random per start
    beat: Mapped[int] = mapped_column(BigInteger, default=0)
    address: Mapped[str] = mapped_column(String(128), default="")
    started_ns: Mapped[int] = mapped_column(BigInteger)
    # the head has clients of an earlier instance to let reclaim (NEED, as NFS-Ganesha's
    # rados_cluster) and refuses new locks and opens while the cluster is in grace (ENFORCING)
    need_grace: Mapped[bool] = mapped_column(Boolean, default=False)
    enforcing: Mapped[bool] = mapped_column(Boolean, default=False)


class NfsHolding(Base):
    """What one head's clients hold on one file: the union of its opens' share access and deny
    modes, and every byte-range lock (JSON: [start, end, type, clientid, nlm, owner hex]).
    Written in the transaction that checks another head's holdings before a lock or open is
    granted, so two heads never grant conflicting state."""

    __tablename__ = "nfs_holdings"
    head: Mapped[str] = mapped_column(String(64), primary_key=True)
    ino: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    instance: Mapped[str] = mapped_column(String(32))
    access: Mapped[int] = mapped_column(Integer, default=0)
    deny: Mapped[int] = mapped_column(Integer, default=0)
    locks: Mapped[str] = mapped_column(Text, default="[]")
    __table_args__ = (Index("ix_nfs_holdings_ino", "ino"),)


class NfsGrace(Base):
    """One row (id 1): the cluster's grace epochs (as NFS-Ganesha's rados_cluster): the current
    epoch, and the recovery epoch whose clients may reclaim (0: no cluster-wide grace)."""

    __tablename__ = "nfs_grace"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    current_epoch: Mapped[int] = mapped_column(BigInteger)
    recovery_epoch: Mapped[int] = mapped_column(BigInteger)


# tables nothing caches, written at every lock and open of several heads: no change signal
# (0012's trigger), so their writes do not empty the other heads' caches
UNSIGNALLED_TABLES = frozenset({"nfs_heads", "nfs_holdings", "nfs_grace"})
