"""PostgreSQL stopped under load (a real server, cut with a fast shutdown as ``pg_ctl stop``
does): NFSv4.1 clients get NFS4ERR_DELAY and NFSv3 clients NFS3ERR_JUKEBOX, never SERVERFAULT,
the log holds a few lines (the catalog's: the outage began, it ended) and no traceback per
request, and once PostgreSQL is back the
same requests succeed without a restart of the NFS server."""

from __future__ import annotations

import logging
import os
import struct
import threading
import time

import pytest
from nfs4_rawclient import RawClient
from nfs4_support import MiB, add_export, start_server

from appliance.nfs import access
from appliance.nfs.v3 import types as t3
from appliance.nfs.v4 import const as c
from appliance.nfs.v4 import types as t
from appliance.nfs.v4.context import CODES
from engine.catalog import Catalog, upgrade
from engine.coding.erasure import policy_from_dict
from engine.datapath import DataPath
from engine.drives import format_emulated
from engine.namespace import Namespace

OUTAGE_S = 4.0
WORKERS = 4


class PgStack:
    """The NFS tests' stack (tests/nfs4_support.Stack) on a PostgreSQL catalog of its own."""

    def __init__(self, url: str, tmp_path):
        upgrade(url)
        self.catalog = Catalog(url)
        format_emulated(self.catalog, tmp_path / "drives", 10, 24 * MiB, 2 * MiB)
        policies = {"warm": policy_from_dict("warm", {"fragment_size": 64 * 1024})}
        self.data = DataPath(self.catalog, policies, reserve_zones=2)
        self.namespace = Namespace(self.catalog, self.data)

    def close(self):
        self.data.close()
        self.catalog.close()


def _v3_call(raw: RawClient, prog: int, proc: int, args_type, args) -> bytes:
    """The result bytes of a MOUNT v3 or NFSv3 call (accepted: SUCCESS asserted)."""
    reply = raw.call_raw(proc, args_type.encode(args), prog=prog, vers=3)
    verf_len = struct.unpack_from(">I", reply, 16)[0]
    pos = 20 + verf_len + (-verf_len % 4)
    assert struct.unpack_from(">I", reply, pos)[0] == 0
    return reply[pos + 4 :]


def _v3_mount(raw: RawClient) -> bytes:
    body = _v3_call(
        raw, t3.MOUNT_PROGRAM, t3.MOUNTPROC3_MNT, t3.MOUNT_ARGS[t3.MOUNTPROC3_MNT], "/export"
    )
    status, ok = t3.MOUNT_RESULTS[t3.MOUNTPROC3_MNT].decode(body)
    assert status == t3.MNT3_OK
    return ok.fhandle


def _v3_getattr(raw: RawClient, fh: bytes) -> int:
    body = _v3_call(raw, t3.NFS_PROGRAM, t3.NFSPROC3_GETATTR, t3.ARGS3[t3.NFSPROC3_GETATTR], fh)
    return t3.RESULTS3[t3.NFSPROC3_GETATTR][0].decode(body)[0]


def _mkdir_op(name: str):
    return (c.OP_CREATE, t.ARGS[c.OP_CREATE]((c.NF4DIR, None), name, t.fattr4.cls([], b"")))


def test_postgresql_outage_gives_delay_and_clients_carry_on(pg, tmp_path, caplog):
    stack = PgStack(pg.create_database(), tmp_path)
    add_export(stack.catalog)
    srv = start_server(stack)
    caplog.set_level(logging.INFO)
    seen: dict[int, int] = {}
    done, failures, stop = [0], [], threading.Event()
    lock = threading.Lock()

    try:
        clients = [RawClient(srv.port).setup() for _ in range(WORKERS)]
        roots = [raw.root_fh() for raw in clients]
        v3 = RawClient(srv.port)
        v3_root = _v3_mount(v3)

        def worker(k: int):
            raw, root = clients[k], roots[k]
            n = 0
            try:
                while not stop.is_set():
                    n += 1
                    ops = [
                        (c.OP_PUTFH, root),
                        _mkdir_op(f"w{k}-{n}"),
                        (c.OP_GETATTR, [1 << c.FATTR4_TYPE]),
                    ]
                    while True:
                        status, _ = raw.session(ops)
                        with lock:
                            seen[status] = seen.get(status, 0) + 1
                        if status != c.NFS4ERR_DELAY:
                            break
                        time.sleep(0.05)
                    if status == c.NFS4ERR_EXIST:
                        continue  # the retried CREATE had committed before the connection was cut
                    if status != c.NFS4_OK:
                        failures.append((k, n, status))
                        return
                    with lock:
                        done[0] += 1
            except Exception as exc:  # noqa: BLE001 - reported by the test
                failures.append((k, n, repr(exc)))

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(WORKERS)]
        for thread in threads:
            thread.start()
        time.sleep(1.0)
        before = done[0]
        assert before > 0 and not failures, failures
        pg.halt()
        time.sleep(OUTAGE_S)
        during = dict(seen)
        assert _v3_getattr(v3, v3_root) == t3.NFS3ERR_JUKEBOX  # NFSv3 meanwhile
        pg.resume()
        time.sleep(3.0)
        stop.set()
        for thread in threads:
            thread.join(60)
        assert not failures, failures
        assert during.get(c.NFS4ERR_DELAY, 0) > 0, during
        assert c.NFS4ERR_SERVERFAULT not in seen, seen
        assert done[0] > before + WORKERS  # every client got on after PostgreSQL came back
        assert _v3_getattr(v3, v3_root) == t3.NFS3_OK
        deadline = time.monotonic() + 10
        while stack.catalog.outage.down:  # told once successes held for its settle time
            assert time.monotonic() < deadline, "the catalog never said it was back"
            assert _v3_getattr(v3, v3_root) == t3.NFS3_OK
            time.sleep(0.2)
        v3.close()
        nfs_lines = [r for r in caplog.records if r.name.startswith("shingle.nfs")]
        assert not [r for r in nfs_lines if r.exc_info], "a traceback was logged"
        assert len(nfs_lines) <= 10, [r.getMessage() for r in nfs_lines]
        # the outage itself: told by the catalog's outage log, a start and an end (4 s is
        # shorter than its interval), whatever the four workers and the housekeeping met
        ours = [r for r in caplog.records if r.name.startswith("shingle")]
        assert not [r for r in ours if r.exc_info], "a traceback was logged"
        told = [r.getMessage() for r in ours if r.name == "shingle.catalog"]
        assert sum(m.startswith("catalog unreachable: ") for m in told) == 1, told
        assert sum(m.startswith("catalog reachable again") for m in told) == 1, told
        assert len(told) <= 6, told
        for raw in clients:
            raw.close()
    finally:
        stop.set()
        srv.stop()
        stack.close()


def _until_not_delay(raw: RawClient, ops) -> tuple[int, list]:
    deadline = time.monotonic() + 30
    while True:
        status, res = raw.session(ops)
        if status != c.NFS4ERR_DELAY or time.monotonic() > deadline:
            return status, res
        time.sleep(0.1)


def test_writes_let_go_in_an_outage_change_the_write_verifier(pg, tmp_path):
    """UNSTABLE writes whose stripe cannot be recorded (PostgreSQL down when the file is
    flushed) are let go: the flush raises WritesNotRecorded (EIO to a local caller, NFS4ERR_DELAY
    / NFS3ERR_JUKEBOX to an NFS one, never NFS4ERR_IO), and the write verifier changes, so the
    NFS client's next COMMIT tells it to send its writes again (RFC 8881 18.32.3); once it has,
    every byte is there. Before, such a COMMIT answered NFS4ERR_IO and the checkpoint failed."""
    from engine.base import errors

    stack = PgStack(pg.create_database(), tmp_path)
    add_export(stack.catalog)
    srv = start_server(stack)
    raw = RawClient(srv.port)
    try:
        raw.setup()
        warm, warm_sid = raw.open_new("warm.bin")  # opens zones: the lost flush reaches the commit
        write = t.ARGS[c.OP_WRITE](warm_sid, 0, c.FILE_SYNC4, os.urandom(600 * 1024))
        assert raw.session([(c.OP_PUTFH, warm), (c.OP_WRITE, write)])[0] == c.NFS4_OK
        fh, sid = raw.open_new("checkpoint.bin")
        data = os.urandom(300 * 1024)  # less than a stripe (8 x 64 KiB): buffered until flushed
        write = t.ARGS[c.OP_WRITE](sid, 0, c.UNSTABLE4, data)
        status, res = raw.session([(c.OP_PUTFH, fh), (c.OP_WRITE, write)])
        assert status == c.NFS4_OK and res[-1][2].committed == c.UNSTABLE4
        written_with = res[-1][2].writeverf
        ino = stack.namespace.resolve("/checkpoint.bin").ino
        assert stack.data.pending_size(ino) == len(data)

        pg.halt()
        with pytest.raises(errors.WritesNotRecorded):
            stack.namespace.commit(ino)  # a local fsync meanwhile: its stripe cannot be recorded
        assert stack.data.writes_lost >= 1
        assert access.status_of(errors.WritesNotRecorded("x"), CODES) == c.NFS4ERR_DELAY
        pg.resume()

        commit = [(c.OP_PUTFH, fh), (c.OP_COMMIT, t.ARGS[c.OP_COMMIT](0, 0))]
        status, res = _until_not_delay(raw, commit)
        assert status == c.NFS4_OK
        assert res[-1][2] != written_with, "bytes were let go under an unchanged verifier"
        status, res = _until_not_delay(raw, [(c.OP_PUTFH, fh), (c.OP_WRITE, write)])
        assert status == c.NFS4_OK
        resent_with = res[-1][2].writeverf
        status, res = _until_not_delay(raw, commit)
        assert status == c.NFS4_OK and res[-1][2] == resent_with
        read = t.ARGS[c.OP_READ](sid, 0, len(data))
        status, res = raw.compound(
            [raw.sequence_op(cachethis=False), (c.OP_PUTFH, fh), (c.OP_READ, read)]
        )
        assert status == c.NFS4_OK and res[-1][2].data == data
    finally:
        raw.close()
        srv.stop()
        stack.close()
