"""Helpers for NFSv3 tests: the NFS tests' real stack (SQLite catalog, data
path on emulated zone-file drives, server thread), libnfs-utils commands,
nfs-rs in NFSv3 mode, and a minimal raw RPC peer for what clients hide.
(A module of its own name: "from conftest import" would find whichever
conftest.py pytest loaded last.)"""

from __future__ import annotations

import shutil
import socket
import struct
import subprocess

from migrated import migrate_sqlite

from appliance.nfs.onc.rpc import authsys_parms
from appliance.nfs.server import NfsServerThread
from appliance.nfs.v3 import types as t
from engine.catalog import Catalog
from engine.catalog.models import Export
from engine.coding.erasure import policy_from_dict
from engine.datapath import DataPath
from engine.drives import format_emulated
from engine.namespace import Namespace

MiB = 1 << 20


def add_export(
    catalog,
    name="/export",
    path="/",
    clients="127.0.0.1/32",
    access="rw",
    squash="no_root_squash",
    anon_uid=65534,
    anon_gid=65534,
):
    catalog.run(
        lambda conn: conn.execute(
            Export.__table__.insert().values(
                name=name,
                path=path,
                clients=clients,
                access=access,
                squash=squash,
                anon_uid=anon_uid,
                anon_gid=anon_gid,
                trash_days=7,
                enabled=True,
            )
        )
    )


class Stack:
    """Catalog (SQLite) + data path on 10 emulated zone-file drives + namespace
    (the setup of tests/nfs, copied: that directory's helpers are its own)."""

    def __init__(
        self,
        tmp_path,
        *,
        drive_size: int = 64 * MiB,
        zone_size: int = 4 * MiB,
        fragment_size: int = 64 * 1024,
    ):
        self.url = f"sqlite:///{tmp_path}/catalog.db"
        migrate_sqlite(self.url)
        self.catalog = Catalog(self.url)
        format_emulated(self.catalog, tmp_path / "drives", 10, drive_size, zone_size)
        policies = {"warm": policy_from_dict("warm", {"fragment_size": fragment_size})}
        self.data = DataPath(self.catalog, policies, reserve_zones=2)
        self.namespace = Namespace(self.catalog, self.data)

    def close(self):
        self.data.close()
        self.catalog.close()


def start_server(stack, **kwargs) -> NfsServerThread:
    kwargs.setdefault("port", 0)
    return NfsServerThread(stack.namespace, stack.catalog, **kwargs).start()


def nfsrs4(port: int, uid: int = 0, gid: int = 0, export: str = "export", **kwargs):
    import nfs_rs

    return nfs_rs.Client.connect(
        f"nfs://127.0.0.1:{port}/{export}?version=4.1",
        nfs_port=port,
        noresvport=True,
        uid=uid,
        gid=gid,
        connect_timeout=20,
        operation_timeout=60,
        **kwargs,
    )


GARBAGE_ARGS = 4


def nfs_url(port: int, path: str = "/export") -> str:
    """A libnfs URL naming our port for both MOUNT and NFS (there is no portmapper)."""
    return f"nfs://127.0.0.1{path}?nfsport={port}&mountport={port}"


def libnfs(tool: str, *args, check: bool = True) -> subprocess.CompletedProcess:
    exe = shutil.which(tool)
    assert exe is not None, f"{tool} not installed: apt-get install -y libnfs-utils"
    proc = subprocess.run([exe, *args], capture_output=True, timeout=60)
    if check:
        assert proc.returncode == 0, (
            f"{tool} {args}: rc {proc.returncode}: {proc.stderr.decode(errors='replace')}"
        )
    return proc


def nfsrs3(port: int, uid: int = 0, gid: int = 0, export: str = "export", **kwargs):
    import nfs_rs

    return nfs_rs.Client.connect(
        f"nfs://127.0.0.1:{port}/{export}?version=3&nfsport={port}&mountport={port}",
        noresvport=True,
        uid=uid,
        gid=gid,
        connect_timeout=20,
        operation_timeout=60,
        **kwargs,
    )


class Rpc3:
    """One TCP connection speaking ONC RPC with AUTH_SYS, encoding arguments
    and decoding results with the declared types of types3."""

    def __init__(
        self,
        port: int,
        source: str | None = None,
        uid: int = 0,
        gid: int = 0,
        host: str = "127.0.0.1",
    ):
        self.sock = socket.create_connection(
            (host, port), timeout=20, source_address=(source, 0) if source else None
        )
        self.xid = 100
        self.cred = authsys_parms.encode((0, "raw", uid, gid, []))

    def close(self):
        self.sock.close()

    def call_bytes(self, prog: int, vers: int, proc: int, body: bytes) -> tuple[int, bytes]:
        """(accept_stat, result bytes) of one call."""
        self.xid += 1
        record = (
            struct.pack(">IIIIIIII", self.xid, 0, 2, prog, vers, proc, 1, len(self.cred))
            + self.cred
        )
        record += struct.pack(">II", 0, 0) + body
        self.sock.sendall(struct.pack(">I", 0x80000000 | len(record)) + record)
        reply = b""
        while True:
            n = struct.unpack(">I", self._exact(4))[0]
            reply += self._exact(n & 0x7FFFFFFF)
            if n & 0x80000000:
                break
        xid, mtype, stat = struct.unpack_from(">III", reply, 0)
        assert (xid, mtype, stat) == (self.xid, 1, 0), f"reply {xid} type {mtype} stat {stat}"
        vlen = struct.unpack_from(">I", reply, 16)[0]
        pos = 20 + vlen + (-vlen % 4)
        return struct.unpack_from(">I", reply, pos)[0], reply[pos + 4 :]

    def _exact(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("server closed the connection")
            buf += chunk
        return buf

    def nfs(self, proc: int, args):
        """(status, resok or resfail value) of an NFSv3 procedure."""
        stat, body = self.call_bytes(t.NFS_PROGRAM, t.NFS_V3, proc, t.ARGS3[proc].encode(args))
        assert stat == 0, f"accept_stat {stat}"
        return t.RESULTS3[proc][0].decode(body)

    def mount(self, proc: int, args=None):
        stat, body = self.call_bytes(
            t.MOUNT_PROGRAM, t.MOUNT_V3, proc, t.MOUNT_ARGS[proc].encode(args)
        )
        assert stat == 0, f"accept_stat {stat}"
        return t.MOUNT_RESULTS[proc].decode(body)
