"""File handles to exported files, and the export access checks, in one place for NFSv3,
NFSv4 and MOUNT.

Every file handle a client sends goes through ``resolve``:

    handle bytes -> FileHandle  the signature and the filesystem (BADHANDLE, STALE)
    -> export                   still exported (STALE)
    -> access                   the export admits the client's address (ACCESS)
    -> inode, generation        not freed, not reused (STALE)

and every entry into an export at its root (MNT, PUTROOTFH, LOOKUP from the pseudo-root)
goes through ``enter_export``. ``need_inside`` refuses an object outside the export's
subtree (ACCESS): ``resolve`` calls it for every handle, and the walks upwards (NFSv4
LOOKUPP, LOOKUP "..", NFSv3 LOOKUP "..") for the parent they reach.

Each protocol passes its ``Codes``: its status numbers and its error class, so that the
checks raise the protocol's own error and the success path pays nothing for being shared.
``status_of`` maps what the engine raises to a protocol's status; ``granted_access`` maps
permission bits to the ACCESS bits, which NFSv3 and NFSv4 number alike (RFC 1813 3.3.4,
RFC 8881 18.1)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from appliance.nfs.exports import ExportRule, PseudoDir
from appliance.nfs.fh import KIND_FILE, BadHandle, FileHandle, StaleHandle
from engine.base.errors import WritesNotRecorded
from engine.base.ratelog import RateLimitedLog
from engine.catalog.database import CatalogUnavailable, CatalogUnreachable
from engine.catalog.models import DIR
from engine.namespace import R_OK, W_OK, X_OK, Attr

log = logging.getLogger("shingle.nfs")

ACCESS_READ, ACCESS_LOOKUP, ACCESS_MODIFY = 0x01, 0x02, 0x04
ACCESS_EXTEND, ACCESS_DELETE, ACCESS_EXECUTE = 0x08, 0x10, 0x20


@dataclass(frozen=True, slots=True)
class Codes:
    """One protocol's status numbers for the shared checks, and the error it raises."""

    error: Callable[[int, str], Exception]  # (status, message) -> the protocol's exception
    badhandle: int
    stale: int
    access: int
    rofs: int
    io: int
    delay: int  # the catalog is busy or unreachable: the client should retry later
    serverfault: int
    inval: int  # a name that is not UTF-8, a number the catalog cannot hold
    fbig: int
    errno_map: Mapping[int, int]  # errno of an engine FsError (or OSError) -> status
    carries_status: tuple[type, ...] = ()  # exceptions that name their status (``.status``)
    pseudo_handles: bool = False  # NFSv4's pseudo-root directories have handles


def resolve(
    server, data, address: str, codes: Codes
) -> tuple[FileHandle, ExportRule | None, Attr | PseudoDir]:
    """(handle, export, attributes) of a file handle; (handle, None, directory) for a
    pseudo-root directory when ``codes.pseudo_handles``. Raises ``codes.error``."""
    try:
        fh = server.handles.unpack(data)
    except BadHandle as exc:
        raise codes.error(codes.badhandle, str(exc)) from None
    except StaleHandle as exc:
        raise codes.error(codes.stale, str(exc)) from None
    if fh.kind != KIND_FILE:
        if not codes.pseudo_handles:
            raise codes.error(
                codes.badhandle, "an NFSv4 pseudo-root handle has no meaning in NFSv3"
            )
        node = server.exports.pseudo_by_ino.get(fh.ino)
        if node is None:
            raise codes.error(codes.stale, "pseudo directory no longer exported")
        return fh, None, node
    rule = server.exports.by_id.get(fh.export_id)
    if rule is None:
        raise codes.error(codes.stale, f"export {fh.export_id} no longer exists")
    if not rule.allows(address):
        raise codes.error(codes.access, f"export {rule.name} does not admit client {address}")
    attr = server.namespace.getattr(fh.ino)  # a freed inode: errors.StaleHandle -> stale
    if attr.generation != fh.generation:
        raise codes.error(
            codes.stale, f"inode {fh.ino} generation {attr.generation}, handle {fh.generation}"
        )
    need_inside(server, rule, attr, codes)
    return fh, rule, attr


def need_inside(server, rule: ExportRule, attr: Attr, codes: Codes) -> None:
    """Refuse an object outside the export's subtree (a handle kept from before a rename moved
    it out, or a parent above the export's root). Cached per (root, inode) in the namespace:
    inside no_blocking() a miss raises WouldBlock, and a worker asks the catalog."""
    if not server.namespace.is_inside(rule.root_ino, attr):
        raise codes.error(codes.access, f"inode {attr.ino} lies outside export {rule.name}")


def enter_export(server, rule: ExportRule, address: str, codes: Codes) -> Attr:
    """The attributes of an export's root, for a client entering the export by name."""
    if not rule.allows(address):
        raise codes.error(codes.access, f"export {rule.name} does not admit client {address}")
    return server.namespace.getattr(rule.root_ino)


def need_writable(rule: ExportRule, codes: Codes) -> None:
    if rule.read_only:
        raise codes.error(codes.rofs, f"export {rule.name} is read-only")


def status_of(exc: Exception, codes: Codes) -> int:
    """The protocol status for an exception an operation raised: SERVERFAULT only for what no
    request should be able to cause (a bug)."""
    if isinstance(exc, WritesNotRecorded):  # the write verifier moved: the client sends again
        return codes.delay
    if isinstance(exc, OSError):  # engine.base.errors.FsError carries its errno
        return codes.errno_map.get(exc.errno, codes.io) if exc.errno is not None else codes.io
    if isinstance(exc, codes.carries_status):
        return exc.status  # type: ignore[attr-defined]  # what carries_status lists has .status
    if isinstance(exc, CatalogUnavailable):
        return codes.delay
    # a client's bytes reaching the catalog: a name that is not UTF-8 (kept as surrogates by
    # the XDR decoder), a number beyond SQLite's 64-bit integers
    if isinstance(exc, (UnicodeError, OverflowError)):
        return codes.inval
    orig = getattr(exc, "orig", exc)  # SQLAlchemy wraps DB-API errors; hot paths raise them raw
    if str(getattr(orig, "sqlstate", None) or "").startswith("22"):  # PostgreSQL: data exception
        return codes.inval
    return codes.serverfault


_throttled = RateLimitedLog(logging.getLogger("shingle.nfs"))


def log_failure(codes: Codes, status: int, what: str, address: str, exc: Exception) -> None:
    """The log line for an operation that failed with ``status``, at a bounded rate: any
    client can send failing requests as fast as it likes. A bug (SERVERFAULT) logs its
    traceback once per interval, an outage of the catalog nothing (the catalog's outage log
    counts it), a catalog busy past its deadline one warning per interval; the
    statuses of requests that are malformed or out of range one line per interval and
    operation; every other status (NOENT, ACCESS, ...) only at debug level."""
    if status == codes.serverfault:
        _throttled.log(
            logging.ERROR,
            (what, type(exc).__name__),
            "%s from %s failed: %s",
            what,
            address,
            exc,
            exc_info=True,
        )
    elif isinstance(exc, CatalogUnreachable):  # told by the catalog's outage log, counted
        log.debug("%s from %s: status %d: %s", what, address, status, exc)
    elif status == codes.delay and isinstance(exc, CatalogUnavailable):
        _throttled.log(
            logging.WARNING,
            CatalogUnavailable,
            "%s from %s answered with a retry-later status: %s",
            what,
            address,
            exc,
        )
    elif status in (codes.inval, codes.fbig, codes.badhandle):
        _throttled.log(
            logging.INFO,
            (what, status),
            "%s from %s refused (status %d): %s",
            what,
            address,
            status,
            exc,
        )
    else:
        log.debug("%s from %s: status %d: %s", what, address, status, exc)


def granted_access(namespace, cred, attr: Attr, rule: ExportRule) -> int:
    """The ACCESS bits ``cred`` holds on ``attr`` through ``rule`` (a read-only export grants
    no modify, extend or delete)."""
    bits = namespace.access(cred, attr.ino, R_OK | W_OK | X_OK)
    is_dir = attr.type == DIR
    granted = 0
    if bits & R_OK:
        granted |= ACCESS_READ
    if bits & X_OK:
        granted |= ACCESS_LOOKUP if is_dir else ACCESS_EXECUTE
    if bits & W_OK and not rule.read_only:
        granted |= ACCESS_MODIFY | ACCESS_EXTEND | (ACCESS_DELETE if is_dir else 0)
    return granted
