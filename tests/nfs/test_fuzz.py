"""10,000 malformed or mutated RPC records while a well-behaved client works:
the server stays up and the good client sees no error (invariant 7)."""

from __future__ import annotations

import os
import random
import socket
import struct
import threading

from nfs4_rawclient import RawClient, open_args
from nfs4_support import add_export, nfsrs, start_server

from appliance.nfs.v4 import attrs as fattr
from appliance.nfs.v4 import const as c
from appliance.nfs.v4 import types as t
from engine.namespace import ROOT

RECORDS = 10_000


def _templates(raw: RawClient, root: bytes) -> list:
    """Makers of valid COMPOUND bodies; ``seq`` is the SEQUENCE op to lead with."""
    return [
        lambda seq: [
            seq,
            (c.OP_PUTROOTFH, None),
            (c.OP_LOOKUP, "fuzz"),
            (c.OP_GETATTR, [0xFFFFFFFF, 0xFFFFFFFF & ~fattr.WRITE_ONLY_BITMAP[1]]),
        ],
        lambda seq: [
            seq,
            (c.OP_PUTFH, root),
            (
                c.OP_READDIR,
                t.ARGS[c.OP_READDIR](0, b"\0" * 8, 8192, 32768, [0x0010011A, 0x00B0A23A]),
            ),
        ],
        lambda seq: [
            seq,
            (c.OP_PUTFH, root),
            (c.OP_OPEN, open_args("f", b"fuzzer", raw.clientid)),
            (c.OP_GETFH, None),
            (c.OP_WRITE, t.ARGS[c.OP_WRITE](t.stateid4.cls(1, b"\0" * 12), 0, 2, b"x" * 300)),
            (
                c.OP_LOCK,
                t.ARGS[c.OP_LOCK](
                    c.WRITE_LT,
                    False,
                    0,
                    10,
                    (
                        True,
                        t.open_to_lock_owner4.cls(
                            0,
                            t.stateid4.cls(1, b"\0" * 12),
                            0,
                            t.state_owner4.cls(raw.clientid, b"lk"),
                        ),
                    ),
                ),
            ),
            (c.OP_CLOSE, t.ARGS[c.OP_CLOSE](0, t.stateid4.cls(1, b"\0" * 12))),
        ],
        lambda seq: [
            seq,
            (c.OP_PUTFH, root),
            (
                c.OP_CREATE,
                t.ARGS[c.OP_CREATE](
                    (c.NF4LNK, b"target"), "link", t.fattr4.cls([0, 2], struct.pack(">I", 0o777))
                ),
            ),
            (c.OP_SAVEFH, None),
            (c.OP_LOOKUPP, None),
            (c.OP_RENAME, t.ARGS[c.OP_RENAME]("link", "l2")),
            (c.OP_REMOVE, "l2"),
            (
                c.OP_SETATTR,
                t.ARGS[c.OP_SETATTR](
                    t.stateid4.cls(0, b"\0" * 12), t.fattr4.cls([0, 2], struct.pack(">I", 0o755))
                ),
            ),
        ],
        lambda seq: [
            (
                c.OP_EXCHANGE_ID,
                t.ARGS[c.OP_EXCHANGE_ID](b"v" * 8, b"fuzz-owner", 0, (c.SP4_NONE, None), []),
            )
        ],
    ]


def _record(raw: RawClient, ops: list) -> tuple[bytes, int]:
    """An RPC call record and the offset after its SEQUENCE (mutations start there)."""
    head = struct.pack(">IIIIII", 7, 0, 2, c.NFS4_PROGRAM, 4, 1)
    head += (
        struct.pack(">II", 1, len(raw.cred)) + raw.cred + b"\0" * (-len(raw.cred) % 4) + b"\0" * 8
    )
    body = raw.compound_bytes(ops)
    protect = len(head) + 12 + (4 + 16 + 16 if ops[0][0] == c.OP_SEQUENCE else 0)
    return head + body, protect


def _mutate(rng: random.Random, record: bytes, protect: int) -> bytes:
    data = bytearray(record)
    if rng.random() < 0.3 or protect >= len(data) - 8:
        protect = 0  # sometimes the RPC header and SEQUENCE are fair game too
    kind = rng.randrange(7)
    if kind == 0:  # change bytes
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(protect, len(data))] = rng.randrange(256)
    elif kind == 1:  # truncate
        data = data[: rng.randrange(protect, len(data))]
    elif kind == 2:  # a huge or odd length/count somewhere
        at = rng.randrange(protect, len(data) - 4) & ~3
        struct.pack_into(">I", data, at, rng.choice([0xFFFFFFFF, 0x7FFFFFFF, 1 << 20, 3, 0]))
    elif kind == 3:  # random garbage
        data = bytearray(os.urandom(rng.randint(0, 600)))
    elif kind == 4:  # insert bytes
        at = rng.randrange(protect, len(data))
        data[at:at] = os.urandom(rng.randint(1, 16))
    elif kind == 5:  # an operation number or count changed
        at = rng.randrange(max(protect, 40), len(data) - 4) & ~3
        struct.pack_into(">I", data, at, rng.randint(0, 70))
    # kind 6: the valid record itself
    return bytes(data)


def null_answered(port: int) -> bool:
    """Whether a NULL call on a new connection from 127.0.0.2 gets its reply within 20 s."""
    call = struct.pack(">IIIIII", 0xFEED, 0, 2, c.NFS4_PROGRAM, 4, 0) + b"\0" * 16
    with socket.create_connection(
        ("127.0.0.1", port), source_address=("127.0.0.2", 0), timeout=20
    ) as sock:
        sock.sendall(struct.pack(">I", 0x80000000 | len(call)) + call)
        reply = b""
        while len(reply) < 8:
            data = sock.recv(64)
            if not data:
                return False
            reply += data
    return struct.unpack_from(">I", reply, 4)[0] == 0xFEED


class Fuzzer:
    def __init__(self, port: int):
        self.port = port
        self.sock = None
        self.closed_by_server = 0
        self.sent = 0
        self.synced = 0
        self.seen = bytearray()
        self.cv = threading.Condition()
        self.slot_seqid: dict[int, int] = {}  # last seqid the server accepted, per slot

    def connect(self):
        self.sock = socket.create_connection(
            ("127.0.0.1", self.port), source_address=("127.0.0.2", 0)
        )
        threading.Thread(target=self._drain, args=(self.sock,), daemon=True).start()

    def _drain(self, sock):
        pending = bytearray()
        try:
            while True:
                data = sock.recv(1 << 16)
                if not data:
                    break
                pending += data
                while len(pending) >= 4:
                    n = struct.unpack_from(">I", pending)[0] & 0x7FFFFFFF
                    if len(pending) < 4 + n:
                        break
                    self._note_sequence(bytes(pending[4 : 4 + n]))
                    del pending[: 4 + n]
                with self.cv:
                    self.seen += data
                    del self.seen[:-65536]
                    self.cv.notify_all()
        except OSError:
            pass
        with self.cv:
            self.closed_by_server += 1
            self.cv.notify_all()

    def _note_sequence(self, reply: bytes) -> None:
        # xid, REPLY, accepted, verf(0,0), SUCCESS, status, tag(0), count, op,
        # status, sessionid, seqid, slot
        if len(reply) < 84 or struct.unpack_from(">IIIIII", reply, 4) != (1, 0, 0, 0, 0, 0):
            return
        op, status = struct.unpack_from(">II", reply, 36)
        if op == c.OP_SEQUENCE and status == 0:
            seqid, slot = struct.unpack_from(">II", reply, 60)
            self.slot_seqid[slot] = seqid

    def sync(self, n: int) -> None:
        """A NULL call after the fuzz: its reply means the server read what came before."""
        xid = 0xF00D0000 + n
        call = struct.pack(">IIIIII", xid, 0, 2, c.NFS4_PROGRAM, 4, 0) + b"\0" * 16
        closed = self.closed_by_server
        try:
            self.sock.sendall(struct.pack(">I", 0x80000000 | len(call)) + call)
        except OSError:
            closed = -1
        with self.cv:
            ok = self.cv.wait_for(
                lambda: struct.pack(">I", xid) in self.seen or self.closed_by_server != closed,
                timeout=20,
            )
            if ok and struct.pack(">I", xid) in self.seen:
                self.synced += 1
                return
        if not ok:
            # A lying record mark (not the last fragment, or longer than the record) leaves the
            # server rightly waiting for more bytes, and our NULL call became part of that record.
            # The server must still answer anyone else.
            assert null_answered(self.port), (
                "the server neither answered nor closed the connection, "
                "and a new connection got no answer either"
            )
        self.sock.close()
        self.connect()  # the fuzz got the connection closed or stuck (a lying record mark): fine

    def send(self, record: bytes, rng: random.Random):
        mark = len(record) | 0x80000000
        if rng.random() < 0.03:  # lying record marks: too long, not last, oversized
            mark = rng.choice([len(record) + 17, len(record), 0xFFFFFFFF, (64 << 20) | 0x80000000])
        for _attempt in range(3):
            try:
                self.sock.sendall(struct.pack(">I", mark) + record)
                self.sent += 1
                return
            except OSError:
                self.sock.close()
                self.connect()


def test_fuzz_while_good_client_works(stack):
    add_export(stack.catalog, name="/export", path="/", clients="127.0.0.1/32")
    ns = stack.namespace
    ns.mkdir(ROOT, ns.root_ino, "fuzzdir", 0o777)
    add_export(
        stack.catalog, name="/fuzz", path="/fuzzdir", clients="127.0.0.2/32", squash="all_squash"
    )
    srv = start_server(stack)
    try:
        raw = RawClient(srv.port, source="127.0.0.2", uid=65534, gid=65534).setup()
        st, res = raw.session([(c.OP_PUTROOTFH, None), (c.OP_LOOKUP, "fuzz"), (c.OP_GETFH, None)])
        assert st == 0, res
        templates = _templates(raw, res[-1][2])
        good_errors, good_rounds = [], [0]
        stop = threading.Event()

        def good_client():
            payload = os.urandom(200_000)
            try:
                with nfsrs(srv.port) as cl:
                    while not stop.is_set():
                        n = good_rounds[0]
                        with cl.open(f"good-{n % 5}", "wb") as f:
                            f.write(payload)
                        with cl.open(f"good-{n % 5}", "rb") as f:
                            if f.read() != payload:
                                good_errors.append(f"round {n}: bytes differ")
                        cl.listdir(".")
                        good_rounds[0] += 1
            except Exception as exc:  # noqa: BLE001 - any error of the good client fails the test
                good_errors.append(repr(exc))

        worker = threading.Thread(target=good_client)
        worker.start()
        rng = random.Random(4)
        fuzzers = [Fuzzer(srv.port) for _ in range(4)]
        for fz in fuzzers:
            fz.connect()
        for i in range(RECORDS):
            k = i % 4
            fz = fuzzers[k]
            slot = 2 * k + rng.randrange(
                2
            )  # a slot belongs to one connection: its records stay in order
            record, protect = _record(raw, rng.choice(templates)(raw.sequence_op(slot=slot)))
            fz.send(_mutate(rng, record, protect), rng)
            if i % 200 >= 196:
                fz.sync(i)
                # lost records leave gaps in a slot's seqids: continue from what the server accepted
                for s in (2 * k, 2 * k + 1):
                    raw.seq[s] = fz.slot_seqid.get(s, raw.seq[s])
        stop.set()
        worker.join(120)
        assert not good_errors, good_errors[:3]
        assert good_rounds[0] >= 1
        assert sum(f.sent for f in fuzzers) == RECORDS
        assert sum(f.synced for f in fuzzers) > 10  # most batches were read and answered
        # still serving: a NULL call and a fresh client work
        probe = RawClient(srv.port)
        reply = probe.call_raw(0, b"")
        assert struct.unpack_from(">I", reply, 20)[0] == 0
        with nfsrs(srv.port) as cl:
            assert "good-0" in cl.listdir(".")
        probe.close()
        raw.close()
    finally:
        srv.stop()
