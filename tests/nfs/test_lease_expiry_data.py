"""A lease expiry is not a reboot: data a client wrote UNSTABLE and has not committed yet
survives the expiry of its lease, and its later COMMIT (as a new client id, after recovery)
answers the verifier its WRITEs got (RFC 8881 18.32.3, RFC 7530 16.36.5: a server may lose
uncommitted data only with a new write verifier, which makes the client send it again). A
client whose renewals come late (the Linux client under slow emulation) recovers exactly so:
BADSESSION or EXPIRED, a new client id, a new open, a COMMIT; it resends nothing while the
verifier stays the same, so any byte lost at the expiry would be lost silently."""

from __future__ import annotations

import os
import struct
import time

from nfs4_rawclient import RawClient, open_args
from nfs4_support import add_export, start_server
from test_v40 import open_confirmed

from appliance.nfs.v4 import const as c
from appliance.nfs.v4 import types as t

LEASE = 2
# less than one stripe of the test stack's warm class (8 x 64 KiB): the bytes stay in the file's
# write buffer until a COMMIT
PAYLOAD = 300 * 1024
COMMIT = (c.OP_COMMIT, t.ARGS[c.OP_COMMIT](0, 0))


def _fileid(raw: RawClient, fh: bytes, minor: int) -> int:
    ops = [(c.OP_PUTFH, fh), (c.OP_GETATTR, [1 << c.FATTR4_FILEID])]
    st, res = raw.v40(ops) if minor == 0 else raw.session(ops)
    assert st == 0, st
    return struct.unpack(">Q", res[-1][2].attr_vals)[0]


def _wait_until_reaped(srv, clientid: int) -> None:
    """The housekeeping reaps a client that renews no more (1.5 leases, checked each second)."""
    deadline = time.monotonic() + 10 * LEASE
    while clientid in srv.server.state.clients:
        assert time.monotonic() < deadline, "the housekeeping never expired the client"
        time.sleep(0.2)


def _exchange_and_session(
    raw: RawClient, owner: bytes, verifier: bytes, *, reclaim_complete: bool = True
) -> None:
    """What the Linux client does after BADSESSION and STALE_CLIENTID: EXCHANGE_ID with its
    unchanged owner and boot verifier, CREATE_SESSION (and RECLAIM_COMPLETE)."""
    st, res = raw.compound(
        [(c.OP_EXCHANGE_ID, t.ARGS[c.OP_EXCHANGE_ID](verifier, owner, 0, (c.SP4_NONE, None), []))]
    )
    assert st == 0, st
    eid = res[0][2]
    chan = t.channel_attrs4.cls(0, 1 << 21, 1 << 21, 1 << 20, 16, 8, [])
    args = t.ARGS[c.OP_CREATE_SESSION](
        eid.clientid, eid.sequenceid, 0, chan, chan, 0x40000000, [(0, None)]
    )
    st, res = raw.compound([(c.OP_CREATE_SESSION, args)])
    assert st == 0, st
    raw.clientid, raw.sessionid = eid.clientid, res[0][2].sessionid
    raw.seq = {i: 0 for i in range(8)}
    if reclaim_complete:
        assert raw.session([(c.OP_RECLAIM_COMPLETE, False)])[0] == 0


def _read_all(raw: RawClient, fh: bytes, sid, minor: int) -> bytes:
    out = b""
    while True:
        ops = [(c.OP_PUTFH, fh), (c.OP_READ, t.ARGS[c.OP_READ](sid, len(out), 64 * 1024))]
        st, res = raw.v40(ops) if minor == 0 else raw.session(ops)
        assert st == 0, st
        eof, data = res[-1][2]
        out += data
        if eof or not data:
            return out


def _open_existing41(raw: RawClient, root: bytes, name: str, owner: bytes):
    args = open_args(name, owner, raw.clientid, create=False)
    st, res = raw.session([(c.OP_PUTFH, root), (c.OP_OPEN, args), (c.OP_GETFH, None)])
    assert st == 0, st
    return res[2][2].stateid, res[3][2]


def test_unstable_writes_survive_a_lease_expiry_41(stack):
    """The Linux client's recovery, step by step: its WRITE in flight at the expiry gets
    BADSESSION, CREATE_SESSION STALE_CLIENTID; a new client id, a reclaim refused (NO_GRACE),
    RECLAIM_COMPLETE, the old stateid refused, an OPEN by file handle, the WRITE again, COMMIT."""
    add_export(stack.catalog)
    srv = start_server(stack, lease_seconds=LEASE)
    owner, boot_verifier = b"slow-guest", b"bootverf"
    data = os.urandom(PAYLOAD)
    half = PAYLOAD // 2
    writer = RawClient(srv.port)
    reader = RawClient(srv.port)
    try:
        _exchange_and_session(writer, owner, boot_verifier)
        root = writer.root_fh()
        fh, sid = writer.open_new("checkpoint.bin")
        write = t.ARGS[c.OP_WRITE](sid, 0, c.UNSTABLE4, data[:half])
        st, res = writer.session([(c.OP_PUTFH, fh), (c.OP_WRITE, write)])
        assert st == 0 and res[-1][2].committed == c.UNSTABLE4
        write_verifier = res[-1][2].writeverf
        ino = _fileid(writer, fh, 1)
        assert stack.data.pending_size(ino) == half  # buffered, not committed

        # the writer renews no more: the housekeeping reaps it with its open and session
        expired_client, old_session = writer.clientid, writer.sessionid
        _wait_until_reaped(srv, expired_client)
        second = t.ARGS[c.OP_WRITE](sid, half, c.UNSTABLE4, data[half:])
        st, _ = writer.session([(c.OP_PUTFH, fh), (c.OP_WRITE, second)])
        assert st == c.NFS4ERR_BADSESSION
        chan = t.channel_attrs4.cls(0, 1 << 21, 1 << 21, 1 << 20, 16, 8, [])
        args = t.ARGS[c.OP_CREATE_SESSION](expired_client, 1, 0, chan, chan, 0x40000000, [])
        assert writer.compound([(c.OP_CREATE_SESSION, args)])[0] == c.NFS4ERR_STALE_CLIENTID

        # another client reads the file meanwhile: every byte written so far is there
        reader.setup()
        rsid, rfh = _open_existing41(reader, root, "checkpoint.bin", b"reader")
        assert rfh == fh
        assert _read_all(reader, fh, rsid, 1) == data[:half]

        # the writer comes back as a new client id
        _exchange_and_session(writer, owner, boot_verifier, reclaim_complete=False)
        assert writer.clientid != expired_client and writer.sessionid != old_session
        reclaim = open_args("checkpoint.bin", b"writer", writer.clientid, create=False)
        reclaim.claim = (c.CLAIM_PREVIOUS, c.OPEN_DELEGATE_NONE)
        assert writer.session([(c.OP_PUTFH, fh), (c.OP_OPEN, reclaim)])[0] == c.NFS4ERR_NO_GRACE
        assert writer.session([(c.OP_RECLAIM_COMPLETE, False)])[0] == 0
        refused = writer.session([(c.OP_PUTFH, fh), (c.OP_WRITE, second)])[0]
        assert refused in (c.NFS4ERR_BAD_STATEID, c.NFS4ERR_EXPIRED)
        by_fh = open_args("", b"writer", writer.clientid, create=False)
        by_fh.claim = (c.CLAIM_FH, None)
        st, res = writer.session([(c.OP_PUTFH, fh), (c.OP_OPEN, by_fh)])
        assert st == 0, st
        sid2 = res[-1][2].stateid
        second = t.ARGS[c.OP_WRITE](sid2, half, c.UNSTABLE4, data[half:])
        st, res = writer.session([(c.OP_PUTFH, fh), (c.OP_WRITE, second)])
        assert st == 0 and res[-1][2].writeverf == write_verifier

        # COMMIT answers the verifier of both WRITEs (so it resends nothing): every byte is there
        st, res = writer.session([(c.OP_PUTFH, fh), COMMIT])
        assert st == 0, st
        assert res[-1][2] == write_verifier
        assert stack.data.pending_size(ino) is None  # the COMMIT made it durable
        assert _read_all(writer, fh, sid2, 1) == data
        assert _read_all(reader, fh, rsid, 1) == data
    finally:
        writer.close()
        reader.close()
        srv.stop()


def test_unstable_writes_survive_a_lease_expiry_40(stack):
    """NFSv4.0: RENEW and the WRITE in flight answer EXPIRED, the client makes a new client id
    with SETCLIENTID, opens again, writes the rest and commits."""
    add_export(stack.catalog)
    srv = start_server(stack, lease_seconds=LEASE)
    ident, boot_verifier = b"slow-guest-40", b"bootverf"
    data = os.urandom(PAYLOAD)
    half = PAYLOAD // 2
    writer = RawClient(srv.port).setup40(ident=ident, verifier=boot_verifier)
    try:
        root = writer.root_fh40()
        sid, fh = open_confirmed(writer, root, "checkpoint40.bin", b"owner")
        write = t.ARGS[c.OP_WRITE](sid, 0, c.UNSTABLE4, data[:half])
        st, res = writer.v40([(c.OP_PUTFH, fh), (c.OP_WRITE, write)])
        assert st == 0 and res[-1][2].committed == c.UNSTABLE4
        write_verifier = res[-1][2].writeverf
        ino = _fileid(writer, fh, 0)
        assert stack.data.pending_size(ino) == half

        expired_client = writer.clientid
        _wait_until_reaped(srv, expired_client)
        assert writer.v40([(c.OP_RENEW, expired_client)])[0] == c.NFS4ERR_EXPIRED
        second = t.ARGS[c.OP_WRITE](sid, half, c.UNSTABLE4, data[half:])
        assert writer.v40([(c.OP_PUTFH, fh), (c.OP_WRITE, second)])[0] == c.NFS4ERR_EXPIRED

        writer.setup40(ident=ident, verifier=boot_verifier)
        assert writer.clientid != expired_client
        sid2, _ = open_confirmed(writer, root, "checkpoint40.bin", b"owner-again")
        second = t.ARGS[c.OP_WRITE](sid2, half, c.UNSTABLE4, data[half:])
        st, res = writer.v40([(c.OP_PUTFH, fh), (c.OP_WRITE, second)])
        assert st == 0 and res[-1][2].writeverf == write_verifier
        st, res = writer.v40([(c.OP_PUTFH, fh), COMMIT])
        assert st == 0, st
        assert res[-1][2] == write_verifier
        assert stack.data.pending_size(ino) is None
        assert _read_all(writer, fh, sid2, 0) == data
    finally:
        writer.close()
        srv.stop()


def test_commit_of_a_file_freed_at_the_expiry_is_stale_41(stack):
    """A file unlinked while open (no silly rename) is freed once the expiry drops its last
    open, and its buffered bytes with it: the COMMIT must then fail, never answer the WRITE's
    verifier as if the bytes were safe."""
    add_export(stack.catalog)
    srv = start_server(stack, lease_seconds=LEASE)
    owner, boot_verifier = b"unlinker", b"bootverf"
    writer = RawClient(srv.port)
    try:
        _exchange_and_session(writer, owner, boot_verifier)
        root = writer.root_fh()
        fh, sid = writer.open_new("scratch.bin")
        write = t.ARGS[c.OP_WRITE](sid, 0, c.UNSTABLE4, os.urandom(PAYLOAD))
        st, res = writer.session([(c.OP_PUTFH, fh), (c.OP_WRITE, write)])
        assert st == 0
        ino = _fileid(writer, fh, 1)
        assert writer.session([(c.OP_PUTFH, root), (c.OP_REMOVE, "scratch.bin")])[0] == 0
        # still open: the unlinked file keeps its bytes
        assert writer.session([(c.OP_PUTFH, fh), (c.OP_GETATTR, [1 << c.FATTR4_SIZE])])[0] == 0
        assert stack.data.pending_size(ino) == PAYLOAD

        _wait_until_reaped(srv, writer.clientid)
        _exchange_and_session(writer, owner, boot_verifier)
        st, res = writer.session([(c.OP_PUTFH, fh), COMMIT])
        assert st == c.NFS4ERR_STALE, (st, res)
        assert stack.data.pending_size(ino) is None  # its buffer went with it: nothing leaks
    finally:
        writer.close()
        srv.stop()
