"""NFS exports: the one place that lists, checks and changes them.

An export is a namespace directory (``path``) that clients mount under a name
(``name``), for the clients in ``clients`` (CIDRs), read-write or read-only,
with an identity squash. The web UI and its REST API, ``shingle exports`` and
the NFS server's export table (appliance/nfs/exports.py) all go through this
module. Each change is one catalog transaction with an event naming who made
it; the running daemon reloads its table every few seconds (EXPORTS_TTL in
appliance/nfs/server.py), so a change from any process reaches NFS clients
without a restart.

A bad value raises ``ExportValueError`` (an ``errors.InvalidArgument`` and a
``ValueError``) naming the field, the value and what was expected."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import select

from engine.admin.crud import CrudService, describe, record_of  # noqa: F401 - describe is re-exported
from engine.admin.schema import Field, FieldError, Schema
from engine.base import errors
from engine.catalog.database import Catalog
from engine.catalog.models import DIR
from engine.catalog.models import Export as ExportRow

EXPORTS = ExportRow.__table__
DEFAULT_NAME = "/export"
ANY_CLIENT = "0.0.0.0/0,::/0"
SQUASH_MODES = ("root_squash", "all_squash", "no_root_squash")
# RPC security flavours an export may allow: AUTH_SYS, and Kerberos 5 with authentication only,
# with integrity, with privacy (RPCSEC_GSS, appliance/nfs/onc/gss.py)
SEC_FLAVORS = ("sys", "krb5", "krb5i", "krb5p")
ACCESS_MODES = ("rw", "ro")
MAX_CLIENTS = 64
NAME_MAX = 255
PATH_MAX = 4096
ID_MAX = 2**32 - 1
TRASH_DAYS_MAX = 3650
NAME_PATTERN = r"/[A-Za-z0-9._/-]*"


class ExportValueError(FieldError):
    """A field of an export has a value it cannot take."""


@dataclass(frozen=True)
class Export:
    id: int
    name: str
    path: str
    clients: str
    access: str
    squash: str
    anon_uid: int
    anon_gid: int
    trash_days: int
    enabled: bool
    delegations: bool = True
    sec: str = "sys"

    @property
    def read_only(self) -> bool:
        return self.access == "ro"

    def to_dict(self) -> dict:
        return asdict(self)


# -- checks of one field ----------------------------------------------------------------------
def clean_name(text: str) -> str:
    """'/data//sets/' -> '/data/sets', the form the NFS server compares."""
    if not isinstance(text, str) or not 1 <= len(text) <= NAME_MAX:
        raise ExportValueError("name", text, f"a path of 1-{NAME_MAX} characters, e.g. /export")
    if not re.fullmatch(NAME_PATTERN, text):
        raise ExportValueError(
            "name",
            text,
            "the path clients mount, e.g. /export (a slash, then letters, digits, . _ - /)",
        )
    parts = [p for p in text.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise ExportValueError("name", text, "no '.' or '..' components")
    return "/" + "/".join(parts)


def clean_clients(text: object) -> str:
    """'10.0.0.0/8, 192.168.1.5' -> '10.0.0.0/8,192.168.1.5/32' (each checked)."""
    if not isinstance(text, str) or len(text) > PATH_MAX:
        raise ExportValueError("clients", text, f"a string of at most {PATH_MAX} characters")
    parts = [p.strip() for p in re.split(r"[,\s]+", text) if p.strip()]
    if not parts:
        raise ExportValueError(
            "clients", text, "at least one client address or CIDR, e.g. 10.0.0.0/8"
        )
    if len(parts) > MAX_CLIENTS:
        raise ExportValueError("clients", f"{len(parts)} entries", f"at most {MAX_CLIENTS} entries")
    clean = []
    for part in parts:
        try:
            clean.append(str(ipaddress.ip_network(part, strict=False)))
        except ValueError:
            raise ExportValueError(
                "clients", part, "an IP address or CIDR such as 10.0.0.0/8 or fd00::/8"
            ) from None
    return ",".join(clean)


def clean_sec(text: object) -> str:
    """'krb5p, krb5' -> 'krb5p:krb5': known flavours, each once, in the order given."""
    if not isinstance(text, str):
        raise ExportValueError("sec", text, "flavours like krb5p:krb5i:krb5:sys")
    parts = [p for p in re.split(r"[:,\s]+", text.strip().lower()) if p]
    if not parts or any(p not in SEC_FLAVORS for p in parts) or len(set(parts)) != len(parts):
        raise ExportValueError(
            "sec",
            text,
            f"one or more of {', '.join(SEC_FLAVORS)}, each once, separated by ':' "
            "(in order of preference, e.g. krb5p:krb5i:krb5:sys)",
        )
    return ":".join(parts)


def clean_path(namespace, text: str) -> str:
    """An absolute namespace path in canonical form; with a namespace, it must be a directory."""
    from engine.namespace.paths import join_path, split_path

    if not isinstance(text, str) or not 1 <= len(text) <= PATH_MAX:
        raise ExportValueError("path", text, f"an absolute path of 1-{PATH_MAX} characters")
    try:
        path = join_path(split_path(text, "export path"))
    except errors.InvalidArgument:
        raise ExportValueError(
            "path",
            text,
            "an absolute path ('/' first) without '.', '..' "
            "or NUL, each component at most 255 bytes",
        ) from None
    if namespace is None:
        return path
    try:
        attr = namespace.resolve(path)
    except errors.FsError:
        raise ExportValueError("path", path, "an existing directory in the namespace") from None
    if attr.type != DIR:
        raise ExportValueError("path", path, "a directory to export (it is not a directory)")
    return path


def path_field(what: str) -> Field:
    """The namespace folder an export or share shows (that it is a directory, the service
    checks: the schema holds no namespace)."""
    return Field(
        "path",
        "string",
        f"The namespace directory this {what} shows",
        min_length=1,
        max_length=PATH_MAX,
        default="/",
        check=lambda text: clean_path(None, text),
    )


def clients_field(verb: str) -> Field:
    return Field(
        "clients",
        "string",
        f"Clients allowed to {verb}: comma-separated IP addresses or CIDRs",
        min_length=1,
        max_length=PATH_MAX,
        default=ANY_CLIENT,
        check=clean_clients,
    )


ACCESS_FIELD = Field(
    "access", "string", "rw (read-write) or ro (read-only)", enum=ACCESS_MODES, default="rw"
)

SCHEMA = Schema(
    "Export",
    "One NFS export.",
    (
        Field(
            "name",
            "string",
            "The path clients mount, e.g. /export (a slash, then letters, digits, . _ - /)",
            min_length=1,
            max_length=NAME_MAX,
            pattern=NAME_PATTERN,
            example="/export",
            check=clean_name,
        ),
        path_field("export"),
        clients_field("mount"),
        ACCESS_FIELD,
        Field(
            "squash",
            "string",
            "Identity mapping: root_squash (root becomes anon), all_squash "
            "(everyone becomes anon) or no_root_squash",
            enum=SQUASH_MODES,
            default="root_squash",
        ),
        Field(
            "sec",
            "string",
            "Security flavours clients may use, in order of preference, ':' between them: sys "
            "(AUTH_SYS), krb5, krb5i (integrity), krb5p (privacy); Kerberos needs "
            "nfs.krb5_keytab",
            min_length=1,
            max_length=64,
            default="sys",
            example="krb5p:krb5i:krb5",
            check=clean_sec,
        ),
        Field(
            "anon_uid",
            "integer",
            "uid that squashed users get",
            minimum=0,
            maximum=ID_MAX,
            default=65534,
        ),
        Field(
            "anon_gid",
            "integer",
            "gid that squashed users get",
            minimum=0,
            maximum=ID_MAX,
            default=65534,
        ),
        Field(
            "trash_days",
            "integer",
            "Days deleted entries stay in the export's trash (0: no trash)",
            minimum=0,
            maximum=TRASH_DAYS_MAX,
            default=7,
        ),
        Field("enabled", "boolean", "Whether clients may mount it", required=False, default=True),
        Field(
            "delegations",
            "boolean",
            "Whether NFSv4.1/4.2 clients may get read delegations of its files (they then open "
            "and re-read unchanged files without asking; any change recalls them first)",
            required=False,
            default=True,
        ),
    ),
)
# what a new export gets for each field not given (the name has no default)
DEFAULTS: dict[str, Any] = SCHEMA.defaults()
FIELDS = SCHEMA.names()


def validate(values: Mapping[str, Any], namespace=None, *, partial: bool = False) -> dict:
    """The clean values of an export (``partial``: only those given, as for an update; else the
    defaults fill what is missing). ``namespace`` checks that ``path`` is a directory."""
    return SCHEMA.check(
        values,
        error=ExportValueError,
        what="an export",
        partial=partial,
        checks={"path": lambda text: clean_path(namespace, text)},
    )


class _Exports(CrudService[Export]):
    delete_severity = "warning"

    def name_taken(self, values: Mapping[str, Any], own_id: int | None) -> errors.Exists:
        hint = "choose another name" if own_id is not None else "choose another name or edit it"
        return errors.Exists(f"export {values['name']!r} exists: {hint}")


SERVICE = _Exports(
    EXPORTS, record_of(Export), noun="export", event_prefix="export", id_key="export_id"
)


# -- reading ----------------------------------------------------------------------------------
def list_exports(
    catalog: Catalog, *, enabled_only: bool = False, order_by: str = "name"
) -> list[Export]:
    """Every export (or the enabled ones), by name or by id. Rows are returned as stored, not
    checked: the NFS server skips (and logs) one it cannot use."""
    return SERVICE.list(
        catalog, order_by, where=EXPORTS.c.enabled.is_(True) if enabled_only else None
    )


def get(catalog: Catalog, export_id: int) -> Export:
    return SERVICE.get(catalog, export_id)


# -- changes --------------------------------------------------------------------------------------
def create(catalog: Catalog, values: Mapping[str, Any], *, actor: str, namespace=None) -> Export:
    """A new export from ``values`` (defaults for what is missing); Exists if the name is taken."""
    return SERVICE.create(catalog, validate(values, namespace), actor=actor)


def update(
    catalog: Catalog, export_id: int, values: Mapping[str, Any], *, actor: str, namespace=None
) -> Export:
    """Change the given fields of one export; returns it as it is now."""
    return SERVICE.update(
        catalog, export_id, validate(values, namespace, partial=True), actor=actor
    )


def delete(catalog: Catalog, export_id: int, *, actor: str) -> None:
    """Remove one export (clients can no longer mount it; the files stay)."""
    SERVICE.delete(catalog, export_id, actor=actor)


def prepare_new_root(namespace) -> None:
    """A new catalog's namespace root (``shingle init``, the installer): like /tmp (1777), so
    every client user may make its own folders, and owned by the default export's anonymous
    user, as whom a squashed root client writes. The owner matters: Linux's fs.protected_regular
    (on by default) refuses open(O_CREAT) of a file in a sticky world-writable folder that
    neither the opener nor the folder's owner owns, so under a root-owned root a root client's
    open(O_CREAT) failed with EACCES right after the server had made the file (owned by the
    anonymous user). That ownership is nominal: the NFS server gives no client identity of
    the anonymous uid owner rights over an export folder (appliance/nfs/exports.py
    ``ExportRule.cred``), or every squashed client could chmod it or remove others' files."""
    from engine.namespace import ROOT  # the namespace package is heavier than this module

    namespace.setattr(
        ROOT,
        namespace.root_ino,
        mode=0o1777,
        uid=DEFAULTS["anon_uid"],
        gid=DEFAULTS["anon_gid"],
    )


def export_folders(catalog: Catalog, namespace) -> frozenset[int]:
    """The inodes of the namespace root and of every export's folder: the folders the anonymous
    user owns only nominally (see prepare_new_root), for the local mount's guest account."""
    folders = {namespace.root_ino}
    for export in list_exports(catalog):
        folder = _folder(namespace, export)
        if folder is not None:
            folders.add(folder.ino)
    return frozenset(folders)


def _folder(namespace, export: Export):
    try:
        return namespace.resolve(export.path)
    except errors.FsError:
        return None  # a missing folder is reported where the export is served


def root_create_refused(namespace, export: Export) -> bool:
    """Whether a root client of ``export`` gets EACCES from open(O_CREAT) of a new file in the
    export's folder although the server made the file: root_squash makes the file the anonymous
    user's, and in a sticky world-writable folder owned by someone else Linux's
    fs.protected_regular refuses the open (see prepare_new_root). Catalogs made before
    ``shingle init`` gave the root to the anonymous user have such a root."""
    if export.squash != "root_squash":
        return False  # all_squash: opener and file are both the anonymous user's
    folder = _folder(namespace, export)
    return folder is not None and folder.mode & 0o1002 == 0o1002 and folder.uid != export.anon_uid


def sticky_bit_lost(namespace, export: Export) -> bool:
    """Whether ``export``'s folder is world-writable without the sticky bit, so that any client
    user may remove or rename every other user's files in it. A squashed root client could
    chmod an export folder owned by the anonymous user (0777) before it lost owner rights
    over export folders: that is how such a folder came to be, unless an admin chose it."""
    folder = _folder(namespace, export)
    return folder is not None and folder.mode & 0o1002 == 0o0002


def own_folder(namespace, export: Export) -> None:
    """Give ``export``'s folder to its anonymous user and group (the fix for
    ``root_create_refused``), and the sticky bit back to a world-writable one (the fix for
    ``sticky_bit_lost``); its mode stays otherwise."""
    from engine.namespace import ROOT, S_ISVTX

    folder = namespace.resolve(export.path)
    mode = folder.mode & 0o7777
    if mode & 0o002:
        mode |= S_ISVTX
    namespace.setattr(ROOT, folder.ino, uid=export.anon_uid, gid=export.anon_gid, mode=mode)


def ensure_default(catalog: Catalog, name: str = DEFAULT_NAME) -> None:
    """Insert the default export (namespace root, rw, any client, root_squash) when there is
    none at all (``shingle init``)."""

    def work(conn):
        if conn.execute(select(EXPORTS.c.id).limit(1)).first() is None:
            conn.execute(EXPORTS.insert().values(name=name, **DEFAULTS))

    catalog.run(work)
