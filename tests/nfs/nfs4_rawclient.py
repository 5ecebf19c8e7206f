"""A minimal NFSv4.1 and NFSv4.0 protocol client for tests of what the real clients do not
expose (byte-range locks, the reply cache, bad handles). It encodes with the
server's own XDR declarations but is an independent peer on a TCP socket."""

from __future__ import annotations

import os
import socket
import struct

from appliance.nfs.onc.xdr import Packer, UInt
from appliance.nfs.v4 import const as c
from appliance.nfs.v4 import types as t

AUTH_SYS = 1


def auth_sys(uid=0, gid=0, machine="raw", gids=()) -> bytes:
    p = Packer()
    t.authsys_parms.pack(p, (0, machine, uid, gid, list(gids)))
    return p.getvalue()


class RawClient:
    def __init__(
        self,
        port: int,
        host: str = "127.0.0.1",
        source: str | None = None,
        uid=0,
        gid=0,
        minor: int = 1,
    ):
        self.minor = minor  # of the COMPOUNDs that name none (2: NFSv4.2)
        self.sock = socket.create_connection(
            (host, port), timeout=20, source_address=(source, 0) if source else None
        )
        self.xid = 1
        self.cred = auth_sys(uid, gid)
        self.sessionid = None
        self.seq = {}
        self.clientid = None

    def close(self):
        self.sock.close()

    # -- RPC ---------------------------------------------------------------------------
    def call_raw(
        self, proc: int, body: bytes, prog=c.NFS4_PROGRAM, vers=4, flavor=AUTH_SYS, cred=None
    ) -> bytes:
        self.send_call(proc, body, prog, vers, flavor, cred)
        return self.recv_record()

    def send_call(
        self, proc: int, body: bytes, prog=c.NFS4_PROGRAM, vers=4, flavor=AUTH_SYS, cred=None
    ) -> None:
        """Send a call without waiting for its reply (recv_record gets it)."""
        self.xid += 1
        cred = self.cred if cred is None else cred
        head = struct.pack(">IIIIII", self.xid, 0, 2, prog, vers, proc)
        head += struct.pack(">II", flavor, len(cred)) + cred + b"\0" * (-len(cred) % 4)
        head += struct.pack(">II", 0, 0)
        self.send_record(head + body)

    def send_record(self, record: bytes):
        self.sock.sendall(struct.pack(">I", 0x80000000 | len(record)) + record)

    def recv_record(self) -> bytes:
        out = b""
        while True:
            hdr = self._exact(4)
            n = struct.unpack(">I", hdr)[0]
            out += self._exact(n & 0x7FFFFFFF)
            if n & 0x80000000:
                return out

    def _exact(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("server closed the connection")
            buf += chunk
        return buf

    # -- COMPOUND -------------------------------------------------------------------------
    def compound_bytes(self, ops, minor=None, tag=b"") -> bytes:
        minor = self.minor if minor is None else minor
        p = Packer()
        t.COMPOUND4args_head.pack(p, (tag, minor))
        UInt.pack(p, len(ops))
        for opnum, args in ops:
            UInt.pack(p, opnum)
            t.ARGS[opnum].pack(p, args)
        return p.getvalue()

    def compound(self, ops, minor=None, raw_reply=False):
        reply = self.call_raw(1, self.compound_bytes(ops, minor))
        if raw_reply:
            return reply
        return self.parse(reply)

    @staticmethod
    def parse(reply: bytes):
        """(status, [(op, status, value)]) of a COMPOUND reply."""
        xid, mtype, stat = struct.unpack_from(">III", reply, 0)
        assert mtype == 1 and stat == 0, (mtype, stat)
        vflavor, vlen = struct.unpack_from(">II", reply, 12)
        pos = 20 + vlen + (-vlen % 4)
        accept = struct.unpack_from(">I", reply, pos)[0]
        assert accept == 0, f"accept_stat {accept}"
        pos += 4
        status, pos = UInt.unpack(reply, pos)
        tag, pos = t.COMPOUND4args_head.fields[0][1].unpack(reply, pos)
        n, pos = UInt.unpack(reply, pos)
        results = []
        for _ in range(n):
            op, pos = UInt.unpack(reply, pos)
            rtype = t.RESULTS.get(op, t.STATUS_ONLY)
            value, pos = rtype.unpack(reply, pos)
            if op == c.OP_SETATTR:
                results.append((op, value.status, value.attrsset))
            else:
                results.append((op, value[0], value[1]))
        return status, results

    def setup(self, owner: bytes | None = None, reclaim_complete: bool = True, cached=1 << 20):
        """A client record and a session of 8 slots; ``cached``: ca_maxresponsesize_cached."""
        owner = owner or os.urandom(8)
        st, res = self.compound(
            [
                (
                    c.OP_EXCHANGE_ID,
                    t.ARGS[c.OP_EXCHANGE_ID](os.urandom(8), owner, 0, (c.SP4_NONE, None), []),
                )
            ]
        )
        assert st == 0, st
        eid = res[0][2]
        self.clientid = eid.clientid
        self.cs_sequence = eid.sequenceid + 1  # of the client's next CREATE_SESSION
        chan = t.channel_attrs4.cls(0, 1 << 21, 1 << 21, cached, 16, 8, [])
        st, res = self.compound(
            [
                (
                    c.OP_CREATE_SESSION,
                    t.ARGS[c.OP_CREATE_SESSION](
                        eid.clientid, eid.sequenceid, 0, chan, chan, 0x40000000, [(0, None)]
                    ),
                )
            ]
        )
        assert st == 0, st
        self.sessionid = res[0][2].sessionid
        self.seq = {i: 0 for i in range(8)}
        if reclaim_complete:
            st, res = self.session([(c.OP_RECLAIM_COMPLETE, False)])
        return self

    def sequence_op(self, slot=0, bump=True, cachethis=False):
        """SEQUENCE on ``slot``; without sa_cachethis by default, as nfs4fs (the server keeps a
        reply that changed something anyway, and one that asks must fit the 4 KiB a slot keeps)."""
        self.seq.setdefault(slot, 0)
        if bump:
            self.seq[slot] += 1
        return (
            c.OP_SEQUENCE,
            t.ARGS[c.OP_SEQUENCE](self.sessionid, self.seq[slot], slot, 7, cachethis),
        )

    def session(self, ops, slot=0, bump=True, raw_reply=False, minor=None):
        return self.compound(
            [self.sequence_op(slot, bump)] + list(ops), minor=minor, raw_reply=raw_reply
        )

    # -- NFSv4.0 (minor version 0: no session; client id by SETCLIENTID) --------------------
    def v40(self, ops, raw_reply=False):
        return self.compound(ops, minor=0, raw_reply=raw_reply)

    def setclientid(self, ident: bytes, verifier: bytes):
        """SETCLIENTID alone: (status, resok or the CLID_INUSE address)."""
        st, res = self.v40([(c.OP_SETCLIENTID, setclientid_args(ident, verifier))])
        return st, res[0][2]

    def confirm(self, clientid: int, verifier: bytes) -> int:
        return self.v40(
            [(c.OP_SETCLIENTID_CONFIRM, t.ARGS[c.OP_SETCLIENTID_CONFIRM](clientid, verifier))]
        )[0]

    def setup40(self, ident: bytes | None = None, verifier: bytes | None = None):
        self.ident = ident or os.urandom(8)
        st, ok = self.setclientid(self.ident, verifier or os.urandom(8))
        assert st == 0, st
        assert self.confirm(ok.clientid, ok.setclientid_confirm) == 0
        self.clientid = ok.clientid
        return self

    def root_fh40(self) -> bytes:
        st, res = self.v40([(c.OP_PUTROOTFH, None), (c.OP_LOOKUP, "export"), (c.OP_GETFH, None)])
        assert st == 0, (st, res)
        return res[-1][2]

    def open_new(self, name: str, owner: bytes = b"o"):
        """OPEN (create, read and write) ``name`` in the export root: (its handle, its open
        stateid)."""
        st, res = self.session(
            [
                (c.OP_PUTFH, self.root_fh()),
                (c.OP_OPEN, open_args(name, owner, self.clientid)),
                (c.OP_GETFH, None),
            ]
        )
        assert st == 0, st
        return res[-1][2], res[2][2].stateid

    def root_fh(self) -> bytes:
        st, res = self.session(
            [(c.OP_PUTROOTFH, None), (c.OP_LOOKUP, "export"), (c.OP_GETFH, None)]
        )
        assert st == 0, (st, res)
        return res[-1][2]


def stateid(seqid, other):
    return t.stateid4.cls(seqid, other)


def open_args(
    name: str,
    owner: bytes,
    clientid: int,
    access=c.OPEN4_SHARE_ACCESS_BOTH,
    create=True,
    seqid=0,
    deny=0,
):
    how = (
        (c.OPEN4_CREATE, (c.UNCHECKED4, t.fattr4.cls([], b"")))
        if create
        else (c.OPEN4_NOCREATE, None)
    )
    return t.ARGS[c.OP_OPEN](
        seqid, access, deny, t.state_owner4.cls(clientid, owner), how, (c.CLAIM_NULL, name)
    )


def setclientid_args(ident: bytes, verifier: bytes, netid="tcp", addr="127.0.0.1.3.4"):
    # a port of this host where nothing listens: the server's CB_NULL probe fails, so this
    # client gets no delegations (tests/nfs/test_delegations40.py gives a working one)
    callback = t.cb_client4.cls(0x40000000, t.clientaddr4.cls(netid, addr))
    return t.ARGS[c.OP_SETCLIENTID](t.nfs_client_id4.cls(verifier, ident), callback, 1)
