"""The port mapper, MOUNT, NLM and NSM over UDP (appliance/nfs/onc/datagram.py), with the real
tools that still speak UDP to a NAS: rpcinfo -u, and sm-notify, whose SM_NOTIFY after a client's
reboot is what frees that client's locks (showmount, which asks over TCP, still lists the
export). And what UDP asks: a retransmitted NLM
LOCK gets its first reply from the duplicate request cache (it does not take the lock again
after an UNLOCK), malformed datagrams are dropped or answered GARBAGE_ARGS without a traceback,
no reply is much larger than its call (a DUMP is not answered over UDP), and NFS itself is not
served over UDP."""

from __future__ import annotations

import logging
import os
import random
import shutil
import socket
import struct
import subprocess

import pytest
from nfs3_helpers import add_export, start_server
from test_nlm import Nlm, v3_file

from appliance.nfs import portmap as pm
from appliance.nfs.nlm import types as n
from appliance.nfs.onc import datagram
from appliance.nfs.onc.rpc import authsys_parms

RPCINFO, SHOWMOUNT, SM_NOTIFY = (
    shutil.which(tool) for tool in ("rpcinfo", "showmount", "sm-notify")
)


class Udp:
    """Raw calls in datagrams, AUTH_SYS; keeps the size of every call and reply."""

    def __init__(self, port: int, host: str = "127.0.0.1"):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.settimeout(2.0)
        self.addr = (host, port)
        self.xid = random.randrange(1 << 30)
        self.cred = authsys_parms.encode((0, "udp-raw", 0, 0, []))
        self.sizes: list[tuple[int, int]] = []  # (call, reply) bytes

    def close(self):
        self.sock.close()

    def datagram(self, prog: int, vers: int, proc: int, body: bytes, xid: int | None = None):
        if xid is None:
            self.xid += 1
            xid = self.xid
        head = struct.pack(">IIIIIIII", xid, 0, 2, prog, vers, proc, 1, len(self.cred))
        return head + self.cred + struct.pack(">II", 0, 0) + body

    def send(self, data: bytes) -> bytes | None:
        """The reply to ``data``, or None when none came within the timeout."""
        self.sock.sendto(data, self.addr)
        try:
            reply = self.sock.recv(70000)
        except TimeoutError:
            return None
        self.sizes.append((len(data), len(reply)))
        return reply

    @staticmethod
    def result(reply: bytes) -> tuple[int, bytes]:
        """(accept_stat, results) of an accepted reply."""
        vlen = struct.unpack_from(">I", reply, 16)[0]
        pos = 20 + vlen + (-vlen % 4)
        return struct.unpack_from(">I", reply, pos)[0], reply[pos + 4 :]


def _rpcinfo(host: str, prog: int, vers: int):
    # (rpcinfo asks the port mapper on port 111 even with -n: the test serves it there)
    return subprocess.run(
        [RPCINFO, "-u", host, str(prog), str(vers)], capture_output=True, text=True, timeout=60
    )


def test_udp_services(stack, caplog):
    """The port mapper names the UDP ports; NFS is not served over UDP; an NLM LOCK
    retransmitted after its UNLOCK is answered from the duplicate request cache; bad datagrams
    cost no traceback; no reply exceeds the bound."""
    add_export(stack.catalog)
    srv = start_server(stack, portmap="serve", portmap_port=0)
    server = srv.server
    udp = Udp(srv.port)
    try:
        caplog.set_level(logging.ERROR)
        reply = udp.send(udp.datagram(100003, 3, 0, b""))  # NFS NULL: TCP only
        assert reply is not None and udp.result(reply)[0] == 1  # PROG_UNAVAIL
        # the port mapper, asked over UDP, names the UDP ports
        getport = pm.mapping.encode((100005, 3, pm.IPPROTO_UDP, 0))
        reply = udp.send(udp.datagram(pm.PMAP_PROGRAM, 2, pm.PMAPPROC_GETPORT, getport))
        assert reply is not None and udp.result(reply) == (0, struct.pack(">I", srv.port))
        getport = pm.mapping.encode((100003, 3, pm.IPPROTO_UDP, 0))
        reply = udp.send(udp.datagram(pm.PMAP_PROGRAM, 2, pm.PMAPPROC_GETPORT, getport))
        assert reply is not None and udp.result(reply) == (0, b"\0\0\0\0")
        # a DUMP (the list of every mapping: the portmapper reflection attack) is not sent
        # over UDP, on either port; over TCP it is
        too_big = server.stats().get("nfs_udp_too_big", 0)
        assert udp.send(udp.datagram(pm.PMAP_PROGRAM, 2, pm.PMAPPROC_DUMP, b"")) is None
        assert server.stats()["nfs_udp_too_big"] == too_big + 1

        # NLM over UDP: LOCK, UNLOCK, then the LOCK's datagram again (a late retransmit): the
        # first reply, and the lock stays free (run again, it would be taken anew)
        fh = v3_file(srv.port, "locked")
        nlm = Nlm(srv.port, "udp-host")
        lock = n.nlm4_lockargs.cls(b"c1", False, True, nlm.alock(fh, 7, 0, 10), False, 3)
        first = udp.datagram(n.NLM_PROGRAM, 4, n.NLMPROC4_LOCK, n.NLM_ARGS[2].encode(lock))
        granted = udp.send(first)
        assert granted is not None and n.NLM_RESULTS[2].decode(udp.result(granted)[1]).stat == 0
        other = Nlm(srv.port, "other-host")
        assert other.test(fh, 9, 0, 10)[0] == n.NLM4_DENIED
        unlock = n.nlm4_unlockargs.cls(b"c2", nlm.alock(fh, 7, 0, 10))
        reply = udp.send(
            udp.datagram(n.NLM_PROGRAM, 4, n.NLMPROC4_UNLOCK, n.NLM_ARGS[4].encode(unlock))
        )
        assert reply is not None and n.NLM_RESULTS[4].decode(udp.result(reply)[1]).stat == 0
        replayed = server.stats().get("nfs_udp_replayed", 0)
        again = udp.send(first)
        assert again == granted and server.stats()["nfs_udp_replayed"] == replayed + 1
        assert other.test(fh, 9, 0, 10)[0] == n.NLM4_GRANTED  # not taken again
        other.close()
        nlm.close()

        # datagrams that are no call: dropped, or GARBAGE_ARGS when the header reads
        dropped = server.stats().get("nfs_udp_dropped", 0)
        assert udp.send(b"\x01\x02\x03") is None
        assert udp.send(struct.pack(">II", 5, 1) + os.urandom(40)) is None  # a REPLY
        assert server.stats()["nfs_udp_dropped"] == dropped + 2
        garbage = udp.datagram(100005, 3, 1, b"")[:30]  # cut inside the credential
        reply = udp.send(garbage)
        assert reply is not None and struct.unpack_from(">II", reply) == (udp.xid, 1)
        for size in (12, 40, 200, 1400):
            udp.send(os.urandom(size))  # whatever comes back, it is small
        assert udp.send(udp.datagram(100005, 3, 0, b"")) is not None  # still answering
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
        # no reply was more than the bound
        assert udp.sizes and all(
            reply <= max(datagram.AMPLIFY_MIN, datagram.AMPLIFY * call) for call, reply in udp.sizes
        )
    finally:
        udp.close()
        srv.stop()


def _free_loopback_111() -> str | None:
    """A loopback address whose UDP and TCP port 111 are free here (the real tools ask the port
    mapper there, with no way to name another port)."""
    for _ in range(20):
        host = (
            f"127.{random.randrange(1, 255)}.{random.randrange(1, 255)}.{random.randrange(2, 255)}"
        )
        try:
            for kind in (socket.SOCK_DGRAM, socket.SOCK_STREAM):
                with socket.socket(socket.AF_INET, kind) as sock:
                    sock.bind((host, 111))
        except OSError:
            continue
        return host
    return None


@pytest.mark.skipif(
    None in (RPCINFO, SHOWMOUNT, SM_NOTIFY) or os.geteuid() != 0,
    reason="needs rpcbind's rpcinfo, nfs-common's showmount and sm-notify, root for port 111",
)
def test_real_tools_over_udp(stack, tmp_path):
    """rpcinfo -u finds the port mapper, MOUNT, NLM and NSM over UDP, not NFS. A client holding
    an NLM lock reboots: its sm-notify asks the server's port mapper over UDP for NSM and sends
    SM_NOTIFY over UDP, and the server frees the client's locks. showmount lists the export."""
    host = _free_loopback_111()
    if host is None:
        pytest.skip("no loopback address with port 111 free")
    add_export(stack.catalog)
    srv = start_server(stack, host=host, portmap="serve", portmap_port=111)
    try:
        assert srv.server.portmap_port == 111
        udp_before = srv.server.stats().get("nfs_udp_calls", 0)
        for prog, vers in (
            (pm.PMAP_PROGRAM, 2),
            (pm.PMAP_PROGRAM, 4),
            (100005, 3),
            (n.NLM_PROGRAM, 4),
            (n.NSM_PROGRAM, 1),
        ):
            done = _rpcinfo(host, prog, vers)
            assert "ready and waiting" in done.stdout, (prog, done.stdout, done.stderr)
        done = _rpcinfo(host, 100003, 3)  # NFS: TCP only
        assert "ready and waiting" not in done.stdout and done.returncode != 0
        assert srv.server.stats()["nfs_udp_calls"] >= udp_before + 10  # (GETADDR, NULL each)
        # the port mapper names its own UDP port for itself, the NFS port's for the others
        listed = subprocess.run([RPCINFO, "-p", host], capture_output=True, text=True, timeout=60)
        rows = {tuple(line.split()[:3]): line.split()[3] for line in listed.stdout.splitlines()[1:]}
        assert rows[("100000", "2", "udp")] == "111"
        assert rows[("100024", "1", "udp")] == rows[("100021", "4", "udp")] == str(srv.port)
        assert ("100003", "3", "udp") not in rows
        shown = subprocess.run([SHOWMOUNT, "-e", host], capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0 and "/export" in shown.stdout, (shown.stdout, shown.stderr)

        fh = v3_file(srv.port, "held", host=host)
        client = Nlm(srv.port, "rebooted-client", host=host)
        assert client.lock(fh, 3, 0, 100) == n.NLM4_GRANTED
        other = Nlm(srv.port, "other-client", host=host)
        assert other.test(fh, 4, 0, 100)[0] == n.NLM4_DENIED
        # the client's statd remembered the server (sm/ holds the monitored hosts; at boot
        # sm-notify moves them to sm.bak/ and notifies each): the line rpc.statd writes
        # (addr, prog, vers, proc, 16 bytes of priv, mon_name, my_name)
        for folder in ("sm", "sm.bak"):
            (tmp_path / folder).mkdir()
        priv = "00" * 16
        line = f"0100007f 000186b5 00000004 00000010 {priv} {host} rebooted-client\n"
        (tmp_path / "sm.bak" / host).write_text(line)
        (tmp_path / "state").write_bytes(struct.pack("<i", 1))
        notified = subprocess.run(
            [SM_NOTIFY, "-d", "-f", "-m", "1", "-P", str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=90,
        )
        assert notified.returncode == 0, (notified.stdout, notified.stderr)
        assert other.test(fh, 4, 0, 100)[0] == n.NLM4_GRANTED  # the rebooted client's lock went
        assert not (tmp_path / "sm.bak" / host).exists()  # notified: sm-notify forgets it
        client.close()
        other.close()
    finally:
        srv.stop()
