"""NFSv4.0 delegations through the callback address a client names in SETCLIENTID (RFC 7530
10.2.1), by raw requests against a callback service run here: the server probes it with
CB_NULL after SETCLIENTID_CONFIRM and grants read delegations only once it answered; a
conflicting request gets DELAY while CB_RECALL (a CB_COMPOUND of minor version 0 naming the
client's callback_ident) goes to that address; DELEGRETURN lets it through. A client whose
address does not answer gets no delegation; one whose path broke hears CB_PATH_DOWN from
RENEW; an ignored recall is revoked after a lease (BAD_STATEID to the 4.0 holder, as knfsd:
the Linux 4.0 client then forgets the delegation)."""

from __future__ import annotations

import os
import socket
import struct
import threading
import time

import pytest
from nfs4_rawclient import RawClient, open_args
from nfs4_support import add_export, start_server
from test_delegations import CallbackClient, make_file

from appliance.nfs.onc.xdr import UInt
from appliance.nfs.v4 import backchannel as cb
from appliance.nfs.v4 import const as c
from appliance.nfs.v4 import types as t

LEASE = 3
CB_PROGRAM = 0x40000456
CB_IDENT = 0x1234


class CallbackService:
    """A client's NFSv4.0 callback service on 127.0.0.1: records every call (proc, callback
    ident and operations of a CB_COMPOUND) and answers it unless ``answer`` is False."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.calls: list[tuple[int, int, list]] = []  # (proc, callback_ident, [(op, args)])
        self.flavors: list[int] = []
        self.answer = True
        self.attrs = (0, 0)  # CB_GETATTR's answer: (size, change) of its cached file
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def uaddr(self) -> str:
        return f"127.0.0.1.{self.port >> 8}.{self.port & 0xFF}"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            while True:
                head = _exact(conn, 4)
                record = _exact(conn, struct.unpack(">I", head)[0] & 0x7FFFFFFF)
                self._call(conn, record)
        except OSError:
            return

    def _call(self, conn: socket.socket, record: bytes) -> None:
        xid, _, _, prog, vers, proc = struct.unpack_from(">IIIIII", record, 0)
        assert (prog, vers) == (CB_PROGRAM, 1), (prog, vers)
        flavor, clen = struct.unpack_from(">II", record, 24)
        self.flavors.append(flavor)
        pos = 32 + clen + (-clen % 4)
        vlen = struct.unpack_from(">I", record, pos + 4)[0]
        pos += 8 + vlen + (-vlen % 4)
        ident, ops, results = 0, [], b""
        if proc == cb.CB_COMPOUND:
            head, pos = cb.CB_COMPOUND4args_head.unpack(record, pos)
            assert head.minorversion == 0, head
            ident = head.callback_ident
            count, pos = UInt.unpack(record, pos)
            for _ in range(count):
                op, pos = UInt.unpack(record, pos)
                assert op in (cb.OP_CB_RECALL, cb.OP_CB_GETATTR), op
                kind = cb.CB_RECALL4args if op == cb.OP_CB_RECALL else cb.CB_GETATTR4args
                args, pos = kind.unpack(record, pos)
                ops.append((op, args))
            results = struct.pack(">IIIII", 0, 0, 1, op, 0)
            if op == cb.OP_CB_GETATTR:
                size, change = self.attrs
                results += struct.pack(">II", 1, cb.GETATTR_WORDS[0])
                results += struct.pack(">IQQ", 16, change, size)
        self.calls.append((proc, ident, ops))
        if self.answer:
            reply = struct.pack(">IIIIII", xid, 1, 0, 0, 0, 0) + results
            conn.sendall(struct.pack(">I", 0x80000000 | len(reply)) + reply)

    def recalls(self) -> list:
        return [
            (ident, args)
            for proc, ident, ops in self.calls
            for op, args in ops
            if op == cb.OP_CB_RECALL
        ]

    def getattrs(self) -> int:
        return sum(op == cb.OP_CB_GETATTR for _, _, ops in self.calls for op, _ in ops)

    def wait(self, what, timeout: float = 10.0):
        deadline = time.monotonic() + timeout
        while not what() and time.monotonic() < deadline:
            time.sleep(0.05)
        return what()

    def close(self) -> None:
        if self.sock.fileno() == -1:
            return
        self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept(); later connects are refused
        self.sock.close()
        for conn in self.conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()


def _exact(conn: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            raise OSError("closed")
        buf += chunk
    return buf


class Client40:
    """A raw NFSv4.0 client whose SETCLIENTID names ``uaddr`` as its callback address."""

    def __init__(self, port: int, uaddr: str):
        self.raw = RawClient(port)
        args = t.ARGS[c.OP_SETCLIENTID](
            t.nfs_client_id4.cls(os.urandom(8), os.urandom(8)),
            t.cb_client4.cls(CB_PROGRAM, t.clientaddr4.cls("tcp", uaddr)),
            CB_IDENT,
        )
        st, res = self.raw.v40([(c.OP_SETCLIENTID, args)])
        assert st == 0, st
        ok = res[0][2]
        assert self.raw.confirm(ok.clientid, ok.setclientid_confirm) == 0
        self.raw.clientid = self.clientid = ok.clientid
        self.root = self.raw.root_fh40()
        self.seqids: dict[bytes, int] = {}

    def open_read(self, name: str, owner: bytes):
        """OPEN for read and OPEN_CONFIRM by a new open-owner: (OPEN4resok, handle, open
        stateid after the confirm)."""
        args = open_args(name, owner, self.clientid, c.OPEN4_SHARE_ACCESS_READ, False, seqid=1)
        st, res = self.raw.v40([(c.OP_PUTFH, self.root), (c.OP_OPEN, args), (c.OP_GETFH, None)])
        assert st == 0, (st, res)
        ok, fh = res[1][2], res[2][2]
        confirm = t.ARGS[c.OP_OPEN_CONFIRM](ok.stateid, 2)
        st, res = self.raw.v40([(c.OP_PUTFH, fh), (c.OP_OPEN_CONFIRM, confirm)])
        assert st == 0, st
        return ok, fh, res[-1][2]

    def close_open(self, fh: bytes, sid, seqid: int = 3) -> None:
        st, _ = self.raw.v40([(c.OP_PUTFH, fh), (c.OP_CLOSE, t.ARGS[c.OP_CLOSE](seqid, sid))])
        assert st == 0, st

    def renew(self) -> int:
        return self.raw.v40([(c.OP_RENEW, self.clientid)])[0]

    def read(self, fh: bytes, sid) -> int:
        return self.raw.v40([(c.OP_PUTFH, fh), (c.OP_READ, t.ARGS[c.OP_READ](sid, 0, 10))])[0]


@pytest.fixture
def deleg_server(stack):
    add_export(stack.catalog)
    srv = start_server(stack, lease_seconds=LEASE)
    service = CallbackService()
    yield srv, service
    service.close()
    srv.stop()


def _probed(service: CallbackService) -> bool:
    return any(proc == cb.CB_NULL for proc, _, _ in service.calls)


def _delegated(client: Client40, name: str, owner: bytes):
    """OPEN ``name`` for read (after the CB_NULL probe was answered) and CLOSE it: its
    handle and the read delegation's stateid."""
    ok, fh, sid = client.open_read(name, owner)
    kind, deleg = ok.delegation
    assert kind == c.OPEN_DELEGATE_READ, ok.delegation
    client.close_open(fh, sid)
    return fh, deleg.stateid


def _writer_open(writer: CallbackClient, name: str) -> int:
    return writer.open_file(name, c.OPEN4_SHARE_ACCESS_WRITE)[0]


def test_recall_over_the_callback_address(deleg_server):
    srv, service = deleg_server
    make_file(srv.port, "f40")
    holder = Client40(srv.port, service.uaddr)
    assert service.wait(lambda: _probed(service))
    time.sleep(0.2)  # the probe's reply is being read
    fh, dsid = _delegated(holder, "f40", b"reader")
    # the delegation's stateid reads (RFC 7530 9.1.4: it stands for the open it replaces)
    assert holder.read(fh, dsid) == 0
    writer = CallbackClient(srv.port, back_channel=False).setup()
    assert _writer_open(writer, "f40") == c.NFS4ERR_DELAY
    recalled = service.wait(service.recalls)
    assert [(ident, r.stateid.other, bytes(r.fh)) for ident, r in recalled] == [
        (CB_IDENT, dsid.other, fh)
    ]
    assert set(service.flavors) == {c.AUTH_SYS}  # the Linux client takes CB_COMPOUND in no other
    assert _writer_open(writer, "f40") == c.NFS4ERR_DELAY  # not returned yet
    st, _ = holder.raw.v40([(c.OP_PUTFH, fh), (c.OP_DELEGRETURN, dsid)])
    assert st == 0, st
    assert _writer_open(writer, "f40") == 0
    assert holder.renew() == 0
    counts = srv.server.state.delegations.counts
    assert (counts["granted"], counts["recalled"], counts["returned"]) == (1, 1, 1)
    _write_delegation40(srv, service, holder, writer)
    writer.close()
    holder.raw.close()


def _write_delegation40(srv, service: CallbackService, holder: Client40, other: CallbackClient):
    """A write delegation over NFSv4.0: the holder's connection carries it alone, so its own
    GETATTRs (the Linux client sends one in its DELEGRETURN COMPOUND) are its own and another
    client's ask it first (CB_GETATTR); a connection that carried two clients gets none."""
    make_file(srv.port, "w40")  # no other client has it open
    both = c.OPEN4_SHARE_ACCESS_BOTH
    args = open_args("w40", b"writer", holder.clientid, both, False, seqid=1)
    st, res = holder.raw.v40([(c.OP_PUTFH, holder.root), (c.OP_OPEN, args), (c.OP_GETFH, None)])
    assert st == 0 and res[1][2].delegation[0] == c.OPEN_DELEGATE_WRITE, (st, res)
    fh, dsid = res[2][2], res[1][2].delegation[1].stateid
    change_size = (c.OP_GETATTR, [1 << c.FATTR4_CHANGE | 1 << c.FATTR4_SIZE])
    st, _ = holder.raw.v40([(c.OP_PUTFH, fh), change_size])
    assert st == 0 and service.getattrs() == 0  # its own: no CB_GETATTR
    service.attrs = (4096, 1 << 40)  # 4 KiB in its cache
    st, res = other.session([(c.OP_PUTFH, fh), change_size])
    assert st == 0 and struct.unpack(">QQ", bytes(res[2][2].attr_vals))[1] == 4096, (st, res)
    assert service.getattrs() == 1
    st, _ = holder.raw.v40([(c.OP_PUTFH, fh), change_size, (c.OP_DELEGRETURN, dsid)])
    assert st == 0 and service.getattrs() == 1 and not service.recalls()[1:], st
    # another client id set up over the same connection: it carries two clients now
    ident, verifier = os.urandom(8), os.urandom(8)
    st, ok = holder.raw.setclientid(ident, verifier)
    assert st == 0 and holder.raw.confirm(ok.clientid, ok.setclientid_confirm) == 0
    make_file(srv.port, "w40b")
    args = open_args("w40b", b"writer2", holder.clientid, both, False, seqid=1)
    st, res = holder.raw.v40([(c.OP_PUTFH, holder.root), (c.OP_OPEN, args)])
    assert st == 0 and res[1][2].delegation == (c.OPEN_DELEGATE_NONE, None), (st, res)


def test_unreachable_callback_means_no_delegation(deleg_server):
    srv, service = deleg_server
    make_file(srv.port, "g40")
    dead = socket.create_server(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    dead.close()  # nothing listens there now
    client = Client40(srv.port, f"127.0.0.1.{port >> 8}.{port & 0xFF}")
    time.sleep(0.5)  # the probe is refused at once
    ok, fh, sid = client.open_read("g40", b"reader")
    assert ok.delegation == (c.OPEN_DELEGATE_NONE, None)
    # a callback address that is no TCP address at all: none either
    odd = Client40(srv.port, "not-an-address")
    ok, _, _ = odd.open_read("g40", b"reader2")
    assert ok.delegation == (c.OPEN_DELEGATE_NONE, None)
    assert odd.renew() == 0  # no delegation held: no CB_PATH_DOWN
    client.raw.close()
    odd.raw.close()


def test_broken_path_and_ignored_recall(deleg_server):
    srv, service = deleg_server
    make_file(srv.port, "h40")
    holder = Client40(srv.port, service.uaddr)
    assert service.wait(lambda: _probed(service))
    time.sleep(0.2)
    fh, dsid = _delegated(holder, "h40", b"reader")
    service.answer = False  # it hears the recall and does nothing
    writer = CallbackClient(srv.port, back_channel=False).setup()
    assert _writer_open(writer, "h40") == c.NFS4ERR_DELAY
    assert service.wait(service.recalls)
    # then its callback service goes away: the server finds the path down at the next call
    service.close()
    deadline = time.monotonic() + 4 * LEASE
    st, renewed = c.NFS4ERR_DELAY, set()
    while st == c.NFS4ERR_DELAY and time.monotonic() < deadline:
        time.sleep(0.5)
        renewed.add(holder.renew())  # the holder stays alive: only the recall runs out
        st = _writer_open(writer, "h40")
    assert st == 0, st
    # its unanswered CB_RECALL failed with the connection: RENEW said the path is down
    # (RFC 7530 16.30.4) while it held the delegation
    assert c.NFS4ERR_CB_PATH_DOWN in renewed, renewed
    # revoked: the 4.0 holder's stateid is bad now (no DELEG_REVOKED in NFSv4.0)
    assert holder.read(fh, dsid) == c.NFS4ERR_BAD_STATEID
    assert srv.server.state.delegations.counts["revoked"] == 1
    writer.close()
    holder.raw.close()
