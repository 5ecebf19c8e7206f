"""The port mapper (program 100000): PMAP v2 GETPORT/DUMP and rpcbind v3/v4 GETADDR,
answering where this server's programs (NFS, MOUNT, NLM, NSM) listen, plus a small
synchronous RPC client used to reach other hosts' port mappers and services (NLM_GRANTED
and SM_NOTIFY callbacks, registration with a system rpcbind).

Clients find NLM through the server host's port mapper on port 111 (the kernel's mount
option ``port=`` covers only NFS), so when no system rpcbind runs the server answers PMAP
itself on ``nfs.portmap_port``; when one runs, the server registers its programs there
(PMAPPROC_SET) instead. PMAP is also answered on the NFS port itself."""

from __future__ import annotations

import logging
import os
import socket
import struct
import time

from appliance.nfs.onc.rpc import PROC_UNAVAIL, RpcReject, accepted, decode_args
from appliance.nfs.onc.xdr import Bool, LinkedList, Packer, String, Struct, UInt, Void

log = logging.getLogger("shingle.nfs.portmap")

PMAP_PROGRAM = 100000
PMAP_V2, RPCB_V3, RPCB_V4 = 2, 3, 4
IPPROTO_TCP, IPPROTO_UDP = 6, 17
PMAPPROC_NULL, PMAPPROC_SET, PMAPPROC_UNSET, PMAPPROC_GETPORT, PMAPPROC_DUMP = range(5)
RPCBPROC_GETADDR, RPCBPROC_DUMP, RPCBPROC_GETTIME, RPCBPROC_GETVERSADDR = 3, 4, 6, 9
NETIDS = {IPPROTO_TCP: "tcp", IPPROTO_UDP: "udp"}
# rpcbind's netids (RFC 5665) -> (protocol, IPv6?): a client asks for the one of the
# transport it will use, and the Linux client asks for tcp6 over IPv6 (NLM)
NETID_PROTOS = {
    "tcp": (IPPROTO_TCP, False),
    "udp": (IPPROTO_UDP, False),
    "tcp6": (IPPROTO_TCP, True),
    "udp6": (IPPROTO_UDP, True),
}

mapping = Struct("mapping", ("prog", UInt), ("vers", UInt), ("prot", UInt), ("port", UInt))
rpcb = Struct(
    "rpcb",
    ("r_prog", UInt),
    ("r_vers", UInt),
    ("r_netid", String(64)),
    ("r_addr", String(128)),
    ("r_owner", String(255)),
)
PMAP_ARGS = {
    PMAPPROC_NULL: Void,
    PMAPPROC_SET: mapping,
    PMAPPROC_UNSET: mapping,
    PMAPPROC_GETPORT: mapping,
    PMAPPROC_DUMP: Void,
}
RPCB_ARGS = {
    PMAPPROC_NULL: Void,
    PMAPPROC_SET: rpcb,
    PMAPPROC_UNSET: rpcb,
    RPCBPROC_GETADDR: rpcb,
    RPCBPROC_DUMP: Void,
    RPCBPROC_GETTIME: Void,
    RPCBPROC_GETVERSADDR: rpcb,
}


def universal_address(host: str, port: int) -> str:
    """The universal address of a host and port (RFC 5665): h1.h2.h3.h4.p1.p2 for IPv4, the
    IPv6 address's text form (without a zone) followed by .p1.p2 for IPv6."""
    return f"{host.split('%', 1)[0]}.{port >> 8}.{port & 0xFF}"


def netid(proto: int, host: str) -> str:
    """The netid of ``proto`` to ``host``: tcp6 / udp6 for an IPv6 address."""
    return NETIDS[proto] + ("6" if ":" in host else "")


class PortmapProgram:
    """Answers PMAP/rpcbind queries from ``table()``: (prog, vers, protocol) -> port.
    SET and UNSET from other programs are refused: this is not a general rpcbind."""

    versions = (PMAP_V2, RPCB_V3, RPCB_V4)

    def __init__(self, table):
        self.table = table  # callable returning {(prog, vers, proto): port}

    def call(self, conn, call, cred, record, pos):
        argtypes = PMAP_ARGS if call.vers == PMAP_V2 else RPCB_ARGS
        argtype = argtypes.get(call.proc)
        if argtype is None or (call.vers == RPCB_V3 and call.proc == RPCBPROC_GETVERSADDR):
            raise RpcReject(accepted(call.xid, PROC_UNAVAIL))
        args = decode_args(argtype, call, record, pos)
        proc = call.proc
        p = Packer()
        if proc == PMAPPROC_NULL:
            return []
        if proc in (PMAPPROC_SET, PMAPPROC_UNSET):
            Bool.pack(p, False)
        elif call.vers == PMAP_V2 and proc == PMAPPROC_GETPORT:
            UInt.pack(p, self.table().get((args.prog, args.vers, args.prot), 0))
        elif call.vers == PMAP_V2:  # DUMP
            LinkedList(mapping).pack(
                p,
                [
                    mapping.cls(prog, vers, proto, port)
                    for (prog, vers, proto), port in sorted(self.table().items())
                ],
            )
        elif proc == RPCBPROC_GETTIME:
            UInt.pack(p, int(time.time()) & 0xFFFFFFFF)
        elif proc == RPCBPROC_DUMP:
            host = _local_host(conn)
            LinkedList(rpcb).pack(
                p,
                [
                    rpcb.cls(
                        prog, vers, netid(proto, host), universal_address(host, port), "shingle"
                    )
                    for (prog, vers, proto), port in sorted(self.table().items())
                ],
            )
        else:  # GETADDR, GETVERSADDR: "" when not served
            String().pack(p, self._address(conn, args))
        return p.result()

    def _address(self, conn, args) -> str:
        """The universal address of a program at the address the client reached us at; ""
        for a netid of the other family (a client asks for its transport's)."""
        proto, ipv6 = NETID_PROTOS.get(args.r_netid, (None, False))
        host = _local_host(conn)
        if proto is None or ipv6 != (":" in host):
            return ""
        table = self.table()
        port = table.get((args.r_prog, args.r_vers, proto))
        if port is None and args.r_vers == 0:
            port = next(
                (
                    p
                    for (prog, _v, pr), p in sorted(table.items())
                    if prog == args.r_prog and pr == proto
                ),
                None,
            )
        return "" if port is None else universal_address(host, port)


def _local_host(conn) -> str:
    """The address the client reached this server at (what it must connect back to): IPv4,
    also for an IPv4 client of a dual-stack listener (a mapped address), or IPv6."""
    transport = getattr(conn, "transport", None)
    sockname = transport.get_extra_info("sockname") if transport is not None else None
    host = sockname[0] if sockname and isinstance(sockname[0], str) else "127.0.0.1"
    if host.startswith("::ffff:") and "." in host:
        host = host[7:]
    return host.split("%", 1)[0] if ":" in host or "." in host else "127.0.0.1"


# -- a synchronous RPC client (callbacks, registration) -------------------------------------------
class RpcCallError(Exception):
    """A call to another host's RPC service failed (no answer, refused, or not SUCCESS)."""


def rpc_call(
    host: str,
    port: int,
    prog: int,
    vers: int,
    proc: int,
    args: bytes = b"",
    *,
    timeout: float = 5.0,
    source_port: int | None = None,
) -> bytes:
    """One call over TCP with AUTH_NONE; the result bytes of an accepted SUCCESS reply."""
    xid = int.from_bytes(os.urandom(4), "big")
    record = struct.pack(">IIIIIIIIII", xid, 0, 2, prog, vers, proc, 0, 0, 0, 0) + args
    try:
        with socket.create_connection(
            (host, port), timeout=timeout, source_address=("", source_port) if source_port else None
        ) as sock:
            sock.sendall(struct.pack(">I", 0x80000000 | len(record)) + record)
            reply = _read_record(sock)
    except OSError as exc:
        raise RpcCallError(f"prog {prog} at {host}:{port}: {exc}") from exc
    if len(reply) < 24:
        raise RpcCallError(f"prog {prog} at {host}:{port}: short reply of {len(reply)} bytes")
    rxid, mtype, reply_stat = struct.unpack_from(">III", reply, 0)
    if rxid != xid or mtype != 1 or reply_stat != 0:
        raise RpcCallError(f"prog {prog} at {host}:{port}: call denied ({reply_stat})")
    vlen = struct.unpack_from(">I", reply, 16)[0]
    pos = 20 + vlen + (-vlen % 4)
    stat = struct.unpack_from(">I", reply, pos)[0]
    if stat != 0:
        raise RpcCallError(
            f"prog {prog} vers {vers} proc {proc} at {host}:{port}: accept_stat {stat}"
        )
    return reply[pos + 4 :]


def _read_record(sock: socket.socket, limit: int = 1 << 20) -> bytes:
    out = b""
    while True:
        head = _exact(sock, 4)
        n = struct.unpack(">I", head)[0]
        if len(out) + (n & 0x7FFFFFFF) > limit:
            raise OSError(f"reply record over {limit} bytes")
        out += _exact(sock, n & 0x7FFFFFFF)
        if n & 0x80000000:
            return out


def _exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise OSError("connection closed before the reply")
        buf += chunk
    return buf


def getport(host: str, prog: int, vers: int, *, pmap_port: int = 111, timeout: float = 5.0) -> int:
    """The TCP port of ``prog``/``vers`` at ``host`` from its port mapper: PMAP v2 GETPORT,
    or for an IPv6 host rpcbind v4 GETADDR of netid tcp6 (rpcbind answers PMAP v2 over IPv4
    only, and an IPv6 client's services are registered for tcp6)."""
    if ":" in host:
        body = rpc_call(
            host,
            pmap_port,
            PMAP_PROGRAM,
            RPCB_V4,
            RPCBPROC_GETADDR,
            rpcb.encode((prog, vers, "tcp6", "", "")),
            timeout=timeout,
        )
        where = String().decode(body)
        port = port_of(where)
    else:
        body = rpc_call(
            host,
            pmap_port,
            PMAP_PROGRAM,
            PMAP_V2,
            PMAPPROC_GETPORT,
            mapping.encode((prog, vers, IPPROTO_TCP, 0)),
            timeout=timeout,
        )
        port = UInt.decode(body)
    if not port:
        raise RpcCallError(f"prog {prog} vers {vers} is not registered at {host}:{pmap_port}")
    return port


def port_of(uaddr: str) -> int:
    """The port of a universal address (0 when it has none)."""
    parts = uaddr.rsplit(".", 2)
    try:
        port = (int(parts[-2]) << 8) | int(parts[-1]) if len(parts) == 3 else 0
    except ValueError:
        return 0
    return port if 0 < port < 65536 else 0


def rpcbind_answers(host: str, port: int, timeout: float = 1.0) -> bool:
    """True when a port mapper answers NULL at host:port."""
    try:
        rpc_call(host, port, PMAP_PROGRAM, PMAP_V2, PMAPPROC_NULL, timeout=timeout)
        return True
    except RpcCallError:
        return False


def register(
    host: str, pmap_port: int, entries: dict, *, unset: bool = False, ipv6: bool = False
) -> int:
    """PMAPPROC_SET (or only UNSET) of each (prog, vers, proto) -> port at a system rpcbind;
    returns how many it accepted. A registration left by an earlier run is unset first:
    rpcbind refuses SET over an existing one. ``ipv6``: the server listens on IPv6 too, so
    each is also registered for tcp6 / udp6 (rpcbind v4 SET of the wildcard ``::``), which
    is what an IPv6 client asks for."""
    done = 0
    cleared: set = set()
    for (prog, vers, proto), port in sorted(entries.items()):
        calls = []
        if (prog, vers) not in cleared:  # a v2 UNSET drops every protocol of (prog, vers):
            cleared.add((prog, vers))  # once, before the first SET (TCP's), not before UDP's
            calls.append((PMAP_V2, PMAPPROC_UNSET, mapping.encode((prog, vers, proto, 0))))
        if not unset:
            calls.append((PMAP_V2, PMAPPROC_SET, mapping.encode((prog, vers, proto, port))))
        if ipv6:
            name = netid(proto, "::")
            calls.append((RPCB_V4, PMAPPROC_UNSET, rpcb.encode((prog, vers, name, "", ""))))
            if not unset:
                where = universal_address("::", port)
                calls.append((RPCB_V4, PMAPPROC_SET, rpcb.encode((prog, vers, name, where, ""))))
        for vers_, proc, args in calls:
            try:
                body = rpc_call(host, pmap_port, PMAP_PROGRAM, vers_, proc, args)
            except RpcCallError as exc:
                log.warning(
                    "rpcbind %s of program %d v%d failed: %s",
                    "UNSET" if proc == PMAPPROC_UNSET else "SET",
                    prog,
                    vers,
                    exc,
                )
                break
            if vers_ == PMAP_V2 and (proc == PMAPPROC_SET or unset):
                done += bool(Bool.decode(body))
    return done
