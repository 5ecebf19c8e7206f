"""Fixtures for NFSv3 tests: the NFS tests' real stack (SQLite catalog, data
path on emulated zone-file drives, server thread), libnfs-utils commands,
nfs-rs in NFSv3 mode, and a minimal raw RPC peer for what clients hide."""
from __future__ import annotations

import importlib.util
import pathlib
import shutil
import socket
import struct
import subprocess

import pytest

from appliance.nfs import types3 as t
from appliance.nfs.rpc import authsys_parms

# the NFSv4 tests' fixtures, loaded under their own name (both files are "conftest")
_spec = importlib.util.spec_from_file_location(
    "nfs4_fixtures", pathlib.Path(__file__).resolve().parent.parent / "nfs" / "conftest.py")
nfs4_fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(nfs4_fixtures)

MiB = nfs4_fixtures.MiB
add_export = nfs4_fixtures.add_export
start_server = nfs4_fixtures.start_server
nfsrs4 = nfs4_fixtures.nfsrs
stack = nfs4_fixtures.stack
server = nfs4_fixtures.server

GARBAGE_ARGS = 4


def nfs_url(port: int, path: str = "/export") -> str:
    """A libnfs URL naming our port for both MOUNT and NFS (there is no portmapper)."""
    return f"nfs://127.0.0.1{path}?nfsport={port}&mountport={port}"


def libnfs(tool: str, *args, check: bool = True) -> subprocess.CompletedProcess:
    exe = shutil.which(tool)
    assert exe is not None, f"{tool} not installed: apt-get install -y libnfs-utils"
    proc = subprocess.run([exe, *args], capture_output=True, timeout=60)
    if check:
        assert proc.returncode == 0, f"{tool} {args}: rc {proc.returncode}: {proc.stderr.decode(errors='replace')}"
    return proc


def nfsrs3(port: int, uid: int = 0, gid: int = 0, export: str = "export", **kwargs):
    import nfs_rs
    return nfs_rs.Client.connect(f"nfs://127.0.0.1:{port}/{export}?version=3&nfsport={port}&mountport={port}",
                                 noresvport=True, uid=uid, gid=gid, connect_timeout=20, operation_timeout=60,
                                 **kwargs)


class Rpc3:
    """One TCP connection speaking ONC RPC with AUTH_SYS, encoding arguments
    and decoding results with the declared types of types3."""

    def __init__(self, port: int, source: str | None = None, uid: int = 0, gid: int = 0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=20,
                                             source_address=(source, 0) if source else None)
        self.xid = 100
        self.cred = authsys_parms.encode((0, "raw", uid, gid, []))

    def close(self):
        self.sock.close()

    def call_bytes(self, prog: int, vers: int, proc: int, body: bytes) -> tuple[int, bytes]:
        """(accept_stat, result bytes) of one call."""
        self.xid += 1
        record = struct.pack(">IIIIIIII", self.xid, 0, 2, prog, vers, proc, 1, len(self.cred)) + self.cred
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
        return struct.unpack_from(">I", reply, pos)[0], reply[pos + 4:]

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
        stat, body = self.call_bytes(t.MOUNT_PROGRAM, t.MOUNT_V3, proc, t.MOUNT_ARGS[proc].encode(args))
        assert stat == 0, f"accept_stat {stat}"
        return t.MOUNT_RESULTS[proc].decode(body)


@pytest.fixture
def rpc(server):
    peers = []

    def connect(**kwargs) -> Rpc3:
        peers.append(Rpc3(server.port, **kwargs))
        return peers[-1]
    yield connect
    for peer in peers:
        peer.close()
