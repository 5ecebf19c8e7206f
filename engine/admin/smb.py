"""SMB shares and SMB users: the one place that lists, checks and changes them.

A share is a namespace directory (``path``, the root or a subtree) that Samba serves under a name
(``name``) for the clients in ``clients`` (CIDRs, Samba's ``hosts allow``), read-write or
read-only, to guests (no password, files owned by nobody) and/or named SMB users (``users``:
who may connect, empty for every SMB user; ``read_only_users``: who may connect but not write).
An SMB user is a name with the uid/gid its files get in the namespace (the same numbers NFS
clients send, so both protocols share one permission model); the password is not kept here but
handed to Samba's own passdb through a ``Passdb`` (appliance/smb/samba.py implements it).

The web UI and its REST API, ``shingle smb`` and the daemon's Samba supervisor
(appliance/smb/samba.py, which renders smb.conf from these rows every few seconds) all go
through this module. Each change is one catalog transaction with an event naming who made it.
A bad value raises ``SmbValueError`` (an ``errors.InvalidArgument`` and a ``ValueError``) naming
the field, the value and what was expected."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from engine.admin.crud import CrudService, record_of
from engine.admin.events import record_in
from engine.admin.exports import ACCESS_FIELD, ID_MAX, clean_path, clients_field, path_field
from engine.admin.schema import Field, FieldError, Schema
from engine.base import errors
from engine.catalog.database import Catalog
from engine.catalog.models import SmbShare as ShareRow
from engine.catalog.models import SmbUser as UserRow

SHARES = ShareRow.__table__
USERS = UserRow.__table__
DEFAULT_SHARE = "export"
ACCESS_MODES = ("rw", "ro")
# Samba share names: no []\/:;|=,+*?<>" and at most 80 characters; keep to a portable subset
SHARE_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,79}"
USER_PATTERN = r"[a-z_][a-z0-9_.-]{0,31}"  # a POSIX user name, as Samba needs one
RESERVED_SHARES = ("global", "homes", "printers", "ipc$")
RESERVED_USERS = ("root", "nobody")
FIRST_UID = 20000  # SMB users get uids from here unless one is given
PASSWORD_MAX = 256
USER_LIST_MAX = 4096


class SmbValueError(FieldError):
    """A field of a share or user has a value it cannot take."""


class Passdb(Protocol):
    """Where SMB passwords live (Samba's passdb); changes happen inside the catalog transaction,
    so that a failure there leaves no user without a password."""

    def set_password(self, user: SmbUser, password: str) -> None: ...
    def remove(self, name: str) -> None: ...


@dataclass(frozen=True)
class Share:
    id: int
    name: str
    path: str
    access: str
    clients: str
    guest: bool
    users: str
    read_only_users: str
    case_insensitive: bool
    enabled: bool

    @property
    def read_only(self) -> bool:
        return self.access == "ro"

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class SmbUser:
    id: int
    name: str
    uid: int
    gid: int

    def to_dict(self) -> dict:
        return asdict(self)


_user = record_of(SmbUser)


# -- checks of one field ----------------------------------------------------------------------
def clean_share_name(text: object) -> str:
    if not isinstance(text, str) or not re.fullmatch(SHARE_PATTERN, text):
        raise SmbValueError(
            "name", text, "1-80 letters, digits, . _ - (a letter or digit first), e.g. export"
        )
    if text.lower() in RESERVED_SHARES:
        raise SmbValueError("name", text, f"a name other than {', '.join(RESERVED_SHARES)}")
    return text


def clean_user_name(text: object) -> str:
    if not isinstance(text, str) or not re.fullmatch(USER_PATTERN, text):
        raise SmbValueError(
            "name",
            text,
            "a user name of 1-32 lower-case letters, digits, _ . - (a letter or _ first)",
        )
    if text in RESERVED_USERS:
        raise SmbValueError("name", text, f"a name other than {', '.join(RESERVED_USERS)}")
    return text


def clean_user_list(field: str, text: object) -> str:
    """'alice, bob' -> 'alice,bob' (each a valid user name; empty stays empty)."""
    if not isinstance(text, str) or len(text) > USER_LIST_MAX:
        raise SmbValueError(field, text, "comma-separated user names")
    names = [n.strip() for n in re.split(r"[,\s]+", text) if n.strip()]
    for name in names:
        try:
            clean_user_name(name)
        except SmbValueError:
            raise SmbValueError(field, name, "comma-separated SMB user names") from None
    return ",".join(dict.fromkeys(names))


def clean_password(password: object) -> str:
    if (
        not isinstance(password, str)
        or not 1 <= len(password) <= PASSWORD_MAX
        or "\n" in password
        or "\0" in password
    ):
        raise SmbValueError("password", "(hidden)", f"1-{PASSWORD_MAX} characters, no newline")
    return password


def _user_list_field(name: str, description: str) -> Field:
    return Field(
        name,
        "string",
        description,
        required=False,
        max_length=USER_LIST_MAX,
        default="",
        check=lambda text: clean_user_list(name, text),
    )


SHARE_SCHEMA = Schema(
    "SmbShareInput",
    "One SMB share.",
    (
        Field(
            "name",
            "string",
            "The share's name, //server/NAME (1-80 letters, digits, . _ -, a "
            "letter or digit first)",
            min_length=1,
            max_length=80,
            pattern=SHARE_PATTERN,
            example="export",
            check=clean_share_name,
        ),
        path_field("share"),
        ACCESS_FIELD,
        clients_field("connect"),
        Field(
            "guest",
            "boolean",
            "Guests may connect without a password (their files are nobody's)",
            required=False,
            default=False,
        ),
        _user_list_field(
            "users", "SMB users who may connect, comma-separated (empty: every SMB user)"
        ),
        _user_list_field(
            "read_only_users", "SMB users who may connect but not write, comma-separated"
        ),
        Field(
            "case_insensitive",
            "boolean",
            "Names compared without case, as Windows does (a name "
            "not found then makes Samba scan the folder)",
            required=False,
            default=False,
        ),
        Field("enabled", "boolean", "Whether smbd serves it", required=False, default=True),
    ),
)
SHARE_DEFAULTS: dict[str, Any] = SHARE_SCHEMA.defaults()
SHARE_FIELDS = SHARE_SCHEMA.names()

PASSWORD_FIELD = Field(
    "password",
    "string",
    "The SMB password (kept only in Samba's passdb)",
    min_length=1,
    max_length=PASSWORD_MAX,
    check=clean_password,
)
USER_SCHEMA = Schema(
    "SmbUserInput",
    "A new SMB user.",
    (
        Field(
            "name",
            "string",
            "A user name of 1-32 lower-case letters, digits, _ . - (a letter or _ first)",
            min_length=1,
            max_length=32,
            pattern=USER_PATTERN,
            example="alice",
            check=clean_user_name,
        ),
        PASSWORD_FIELD,
        Field(
            "uid",
            "integer",
            f"uid its files get (empty: the next from {FIRST_UID})",
            required=False,
            minimum=1,
            maximum=ID_MAX,
        ),
        Field(
            "gid",
            "integer",
            "gid its files get (empty: the uid)",
            required=False,
            minimum=1,
            maximum=ID_MAX,
        ),
    ),
)
PASSWORD_SCHEMA = Schema(
    "SmbPasswordInput",
    "An SMB user's new password.",
    (
        Field(
            "password",
            "string",
            "The new SMB password",
            min_length=1,
            max_length=PASSWORD_MAX,
            check=clean_password,
        ),
    ),
)


def validate_share(values: Mapping[str, Any], namespace=None, *, partial: bool = False) -> dict:
    """The clean values of a share (``partial``: only those given, as for an update)."""
    return SHARE_SCHEMA.check(
        values,
        error=SmbValueError,
        what="a share",
        partial=partial,
        checks={"path": lambda text: clean_path(namespace, text)},
    )


# -- shares -------------------------------------------------------------------------------------
class _Shares(CrudService[Share]):
    fold_case = True  # Samba compares share names without case
    delete_severity = "warning"

    def row_id(self, conn: Connection, ref: int | str) -> int:
        """A share by id or by name."""
        column = SHARES.c.id if isinstance(ref, int) else SHARES.c.name
        found = conn.execute(select(SHARES.c.id).where(column == ref)).scalar()
        if found is None:
            raise self.not_found(ref)
        return int(found)

    def not_found(self, ref: Any) -> errors.NotFound:
        return errors.NotFound(f"no SMB share {ref!r}")

    def name_taken(self, values: Mapping[str, Any], own_id: int | None) -> errors.Exists:
        return errors.Exists(f"SMB share {values['name']!r} exists: choose another name")


SHARE_SERVICE = _Shares(
    SHARES, record_of(Share), noun="SMB share", event_prefix="smb.share", id_key="share_id"
)


def list_shares(catalog: Catalog, *, enabled_only: bool = False) -> list[Share]:
    return SHARE_SERVICE.list(
        catalog, "name", where=SHARES.c.enabled.is_(True) if enabled_only else None
    )


def get_share(catalog: Catalog, ref: int | str) -> Share:
    return SHARE_SERVICE.get(catalog, ref)


def create_share(
    catalog: Catalog, values: Mapping[str, Any], *, actor: str, namespace=None
) -> Share:
    return SHARE_SERVICE.create(catalog, validate_share(values, namespace), actor=actor)


def update_share(
    catalog: Catalog, ref: int | str, values: Mapping[str, Any], *, actor: str, namespace=None
) -> Share:
    values = validate_share(values, namespace, partial=True)
    return SHARE_SERVICE.update(catalog, ref, values, actor=actor)


def delete_share(catalog: Catalog, ref: int | str, *, actor: str) -> None:
    SHARE_SERVICE.delete(catalog, ref, actor=actor)


def ensure_default_share(catalog: Catalog, path: str = "/") -> None:
    """The share ``export`` (the default export's directory, read-write, every SMB user, any
    client) when there is no share at all, as ``shingle init`` makes the default NFS export."""

    def work(conn):
        if conn.execute(select(SHARES.c.id).limit(1)).first() is None:
            conn.execute(
                SHARES.insert().values(name=DEFAULT_SHARE, **{**SHARE_DEFAULTS, "path": path})
            )

    catalog.run(work)


# -- users ----------------------------------------------------------------------------------------
def list_users(catalog: Catalog) -> list[SmbUser]:
    query = select(USERS).order_by(USERS.c.name)
    return [_user(row) for row in catalog.read(lambda conn: conn.execute(query).all())]


def get_user(catalog: Catalog, name: str) -> SmbUser:
    row = catalog.read(lambda conn: conn.execute(select(USERS).where(USERS.c.name == name)).first())
    if row is None:
        raise errors.NotFound(f"no SMB user {name!r}")
    return _user(row)


def create_user(
    catalog: Catalog,
    name: str,
    password: str,
    *,
    passdb: Passdb,
    actor: str,
    uid: int | None = None,
    gid: int | None = None,
) -> SmbUser:
    """A new SMB user with its password in ``passdb``; uid from FIRST_UID up unless given, gid
    the uid unless given. Exists if the name is taken."""
    given = {"name": name, "password": password, "uid": uid, "gid": gid}
    clean = USER_SCHEMA.check(
        {k: v for k, v in given.items() if v is not None}, error=SmbValueError, what="an SMB user"
    )
    name, password = clean["name"], clean["password"]

    def work(conn):
        if conn.execute(select(USERS.c.id).where(USERS.c.name == name)).first():
            raise errors.Exists(f"SMB user {name!r} exists: remove it first or set its password")
        new_uid = uid
        if new_uid is None:
            top = conn.execute(select(func.max(USERS.c.uid))).scalar()
            new_uid = max(FIRST_UID, (top or 0) + 1)
        new_gid = gid if gid is not None else new_uid
        user_id = conn.execute(
            USERS.insert().values(name=name, uid=new_uid, gid=new_gid)
        ).inserted_primary_key[0]
        user = SmbUser(int(user_id), name, new_uid, new_gid)
        passdb.set_password(user, password)  # a failure rolls the row back
        record_in(
            conn,
            "smb.user.create",
            f"SMB user {name} created (uid {new_uid}, gid {new_gid})",
            actor=actor,
            details=user.to_dict(),
        )
        return user

    return catalog.run(work)


def set_password(catalog: Catalog, name: str, password: str, *, passdb: Passdb, actor: str) -> None:
    password = clean_password(password)

    def work(conn):
        row = conn.execute(select(USERS).where(USERS.c.name == name)).first()
        if row is None:
            raise errors.NotFound(f"no SMB user {name!r}")
        passdb.set_password(_user(row), password)
        record_in(
            conn,
            "smb.user.password",
            f"SMB user {name}: password changed",
            actor=actor,
            details={"name": name},
        )

    catalog.run(work)


def delete_user(catalog: Catalog, name: str, *, passdb: Passdb, actor: str) -> None:
    """Remove an SMB user (its files keep their uid); shares that name it keep the name until
    edited (Samba then refuses it: no such user)."""

    def work(conn):
        removed = conn.execute(USERS.delete().where(USERS.c.name == name))
        if not removed.rowcount:
            raise errors.NotFound(f"no SMB user {name!r}")
        passdb.remove(name)
        record_in(
            conn,
            "smb.user.delete",
            f"SMB user {name} deleted",
            actor=actor,
            severity="warning",
            details={"name": name},
        )

    catalog.run(work)
