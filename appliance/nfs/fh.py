"""Persistent, unforgeable NFS file handles.

A handle is (version, kind, export id, fsid, inode, generation) followed by a
truncated HMAC-SHA256 under a key kept in the catalog settings table, so the
same file has the same handle after a restart (no "stale file handle") and a
client cannot make up a handle for a file it was never given."""

from __future__ import annotations

import hmac
import secrets
import struct
from typing import NamedTuple

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from engine.catalog.models import Setting

FH_VERSION = 1
KIND_PSEUDO, KIND_FILE = 0, 1
KEY_SETTING = "nfs_fh_key"
FSID_SETTING = "nfs_fsid"
MAC_LEN = 16
_BODY = struct.Struct(">BBHIQQQ")  # version, kind, reserved, export id, fsid, ino, generation
HANDLE_LEN = _BODY.size + MAC_LEN


class BadHandle(ValueError):
    """Bytes that are not a handle this server issued (NFS4ERR_BADHANDLE)."""


class StaleHandle(ValueError):
    """A genuine handle of another filesystem instance (NFS4ERR_STALE)."""


class FileHandle(NamedTuple):
    kind: int
    export_id: int
    ino: int
    generation: int


def load_or_create_secret(catalog, key: str, nbytes: int) -> bytes:
    """The secret stored under ``key``, made now if there is none. Read and made in one
    transaction, and never overwritten: the heads of `serve --heads N` start at once over a
    new catalog, and a head that overwrote another's key made every handle that head had
    issued a BADHANDLE once it restarted (the kernel rig's kill -9 of a head: EBADHANDLE)."""
    table = Setting.__table__

    def work(conn) -> str:
        value = conn.execute(select(table.c.value).where(table.c.key == key)).scalar()
        if value is None:
            value = secrets.token_hex(nbytes)
            conn.execute(table.insert().values(key=key, value=value))
        return value

    try:
        value = catalog.run(work, tracked=True)  # settings are cached nowhere
    except IntegrityError:  # PostgreSQL: another process inserted it first; its value stands
        value = catalog.get_setting(key)
    return bytes.fromhex(value)


VERIFIED_CACHE = 65536


class HandleCodec:
    def __init__(self, catalog):
        self.key = load_or_create_secret(catalog, KEY_SETTING, 32)
        fsid = load_or_create_secret(catalog, FSID_SETTING, 8)
        self.fsid = int.from_bytes(fsid, "big") & ((1 << 63) - 1)
        # handles already verified or issued: a PUTFH need not recompute the HMAC
        self._known: dict[bytes, FileHandle] = {}
        self._issued: dict[FileHandle, bytes] = {}

    def _mac(self, body: bytes) -> bytes:
        return hmac.digest(self.key, body, "sha256")[:MAC_LEN]

    def pack(self, kind: int, export_id: int, ino: int, generation: int) -> bytes:
        fh = FileHandle(kind, export_id, ino, generation)
        handle = self._issued.get(fh)
        if handle is None:
            body = _BODY.pack(FH_VERSION, kind, 0, export_id, self.fsid, ino, generation)
            handle = body + self._mac(body)
            self._remember(handle, fh)
        return handle

    def _remember(self, handle: bytes, fh: FileHandle) -> None:
        if len(self._known) >= VERIFIED_CACHE:
            self._known.clear()  # crude but bounded; a miss only costs one HMAC
            self._issued.clear()
        self._known[handle] = fh
        self._issued[fh] = handle

    def unpack(self, data) -> FileHandle:
        data = bytes(data)
        known = self._known.get(data)
        if known is not None:
            return known
        if len(data) != HANDLE_LEN:
            raise BadHandle(f"file handle of {len(data)} bytes: expected {HANDLE_LEN}")
        body, mac = data[: _BODY.size], data[_BODY.size :]
        if not hmac.compare_digest(mac, self._mac(body)):
            raise BadHandle("file handle signature does not match: forged or corrupted")
        version, kind, _, export_id, fsid, ino, generation = _BODY.unpack(body)
        if version != FH_VERSION or kind not in (KIND_PSEUDO, KIND_FILE):
            raise BadHandle(
                f"file handle version {version} kind {kind}: expected {FH_VERSION} and 0/1"
            )
        if fsid != self.fsid:
            raise StaleHandle(f"file handle of filesystem {fsid:x}, this is {self.fsid:x}")
        fh = FileHandle(kind, export_id, ino, generation)
        self._remember(data, fh)
        return fh
