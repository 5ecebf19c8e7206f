"""The MOUNT v3 protocol (RFC 1813 appendix I): export path -> root file
handle for NFSv3 clients, on the NFS server's own TCP port.

MNT refuses clients outside the export's networks with MNT3ERR_ACCES; a
path below an export name mounts that subdirectory. The mount list (DUMP)
is advisory, kept in memory as RFC 1813 allows."""

from __future__ import annotations

import errno
import logging
import threading
from typing import TYPE_CHECKING

from appliance.nfs import access
from appliance.nfs.fh import KIND_FILE
from appliance.nfs.onc.rpc import (
    PROC_UNAVAIL,
    InWorker,
    RpcReject,
    accepted,
    decode_args,
)
from appliance.nfs.onc.xdr import Packer
from appliance.nfs.v3 import types as t
from engine.base.ratelog import RateLimitedLog
from engine.catalog.models import DIR

if TYPE_CHECKING:
    from appliance.nfs.exports import ExportRule

log = logging.getLogger("shingle.nfs.mount")
_refusals = RateLimitedLog(log)

ERRNO_TO_MNT3 = {
    errno.ENOENT: t.MNT3ERR_NOENT,
    errno.EACCES: t.MNT3ERR_ACCES,
    errno.ENOTDIR: t.MNT3ERR_NOTDIR,
    errno.EINVAL: t.MNT3ERR_INVAL,
    errno.ENAMETOOLONG: t.MNT3ERR_NAMETOOLONG,
    errno.EPERM: t.MNT3ERR_PERM,
}


class MountError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


# MOUNT has no status for "try later" and none for a bad handle (it takes none)
CODES = access.Codes(
    MountError,
    badhandle=t.MNT3ERR_SERVERFAULT,
    stale=t.MNT3ERR_SERVERFAULT,
    access=t.MNT3ERR_ACCES,
    rofs=t.MNT3ERR_SERVERFAULT,
    io=t.MNT3ERR_IO,
    delay=t.MNT3ERR_SERVERFAULT,
    serverfault=t.MNT3ERR_SERVERFAULT,
    inval=t.MNT3ERR_INVAL,
    fbig=t.MNT3ERR_INVAL,
    errno_map=ERRNO_TO_MNT3,
    carries_status=(MountError,),
)


def split_path(path: str) -> tuple[str, ...]:
    return tuple(p for p in path.split("/") if p)


class MountProgram:
    versions = (t.MOUNT_V3,)

    def __init__(self, server):
        self.server = server
        self.mounts: set[tuple[str, str]] = set()  # (client address, directory)
        self._lock = threading.Lock()

    def call(self, conn, call, cred, record, pos):
        argtype = t.MOUNT_ARGS.get(call.proc)
        if argtype is None:
            raise RpcReject(accepted(call.xid, PROC_UNAVAIL))
        args = decode_args(argtype, call, record, pos)
        address = conn.peer[0]
        proc = call.proc
        if proc == t.MOUNTPROC3_NULL:
            return []
        if proc == t.MOUNTPROC3_MNT:  # walks the namespace: blocking
            return InWorker(lambda: self._packed(proc, self.mnt(cred, address, args)))
        if proc == t.MOUNTPROC3_DUMP:
            with self._lock:
                value = [t.mountbody.cls(host, path) for host, path in sorted(self.mounts)]
        elif proc == t.MOUNTPROC3_UMNT:
            with self._lock:
                self.mounts.discard((address, "/" + "/".join(split_path(args))))
            value = None
        elif proc == t.MOUNTPROC3_UMNTALL:
            with self._lock:
                self.mounts = {m for m in self.mounts if m[0] != address}
            value = None
        else:
            value = self.export_list(address)
        return self._packed(proc, value)

    @staticmethod
    def _packed(proc: int, value) -> list:
        p = Packer()
        t.MOUNT_RESULTS[proc].pack(p, value)
        return p.result()

    def export_list(self, address: str) -> list:
        """Exports with the networks they admit (like showmount -e)."""
        rules = sorted(self.server.exports.by_id.values(), key=lambda r: r.name)
        return [t.exportnode.cls(rule.name, [str(net) for net in rule.networks]) for rule in rules]

    def mnt(self, cred, address: str, path: str):
        try:
            fh, rule = self.root_handle(cred, address, path)
        except Exception as exc:  # noqa: BLE001 - a failed mount is a status, not a dead connection
            status = access.status_of(exc, CODES)
            if status == t.MNT3ERR_SERVERFAULT:
                access.log_failure(CODES, status, "MNT", address, exc)
            else:  # one line per interval and status: any client may ask as fast as it likes
                _refusals.log(
                    logging.INFO, status, "MNT %r from %s refused: %s", path, address, exc
                )
            return (status, None)
        with self._lock:
            self.mounts.add((address, "/" + "/".join(split_path(path))))
        # the export's flavours in its order (AUTH_NONE beside sys): the client picks one of
        # them for its NFS calls, which the export checks; MNT itself comes over AUTH_SYS
        flavors = [
            f
            for flavor in rule.flavors
            for f in ((flavor, t.AUTH_NONE) if flavor == t.AUTH_SYS else (flavor,))
        ]
        return (t.MNT3_OK, t.mountres3_ok.cls(fh, flavors))

    def root_handle(self, cred, address: str, path: str) -> tuple[bytes, ExportRule]:
        """The handle of ``path`` (an export name, or a directory below one), and its export."""
        parts = split_path(path)
        best = None
        for rule in self.server.exports.by_id.values():
            n = len(rule.parts)
            if parts[:n] == rule.parts and (best is None or n > len(best.parts)):
                best = rule
        if best is None:
            raise MountError(t.MNT3ERR_NOENT, f"{path!r} is not exported")
        attr = access.enter_export(self.server, best, address, CODES)
        ns = self.server.namespace
        ucred = best.cred(cred.uid, cred.gid, cred.gids)
        for part in parts[len(best.parts) :]:
            attr = ns.lookup(ucred, attr.ino, part)
        if attr.type != DIR:
            raise MountError(t.MNT3ERR_NOTDIR, f"{path!r} is not a directory")
        return self.server.handles.pack(KIND_FILE, best.id, attr.ino, attr.generation), best
