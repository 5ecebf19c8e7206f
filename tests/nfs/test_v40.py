"""NFSv4.0 (RFC 7530) beside NFSv4.1 on one port: nfs-rs with version=4.0, and raw requests for
client ids (SETCLIENTID/CONFIRM, RENEW, leases), OPEN_CONFIRM, owner sequence ids and their
replay, RELEASE_LOCKOWNER, restarts (STALE_CLIENTID, STALE_STATEID, reclaim in the grace
period), and opens and locks conflicting across the two minor versions."""

from __future__ import annotations

import hashlib
import os
import time

from nfs4_rawclient import RawClient, open_args
from nfs4_support import MiB, add_export, nfsrs, start_server

from appliance.nfs.v4 import const as c
from appliance.nfs.v4 import types as t

BOTH, READ, WRITE = c.OPEN4_SHARE_ACCESS_BOTH, c.OPEN4_SHARE_ACCESS_READ, c.OPEN4_SHARE_ACCESS_WRITE


def open40(raw, dir_fh, name, owner, seqid, *, access=BOTH, deny=0, create=True):
    """OPEN by an NFSv4.0 open-owner: (status, OPEN4resok, file handle)."""
    args = open_args(name, owner, raw.clientid, access, create, seqid=seqid, deny=deny)
    st, res = raw.v40([(c.OP_PUTFH, dir_fh), (c.OP_OPEN, args), (c.OP_GETFH, None)])
    return st, res[1][2] if len(res) > 1 else None, res[2][2] if st == 0 else None


def open_confirmed(raw, dir_fh, name, owner, *, access=BOTH, deny=0):
    """A new open-owner's OPEN and OPEN_CONFIRM (seqids 1 and 2): (stateid, file handle)."""
    st, ok, fh = open40(raw, dir_fh, name, owner, 1, access=access, deny=deny)
    assert st == 0, st
    assert ok.rflags & c.OPEN4_RESULT_CONFIRM
    st, res = raw.v40(
        [(c.OP_PUTFH, fh), (c.OP_OPEN_CONFIRM, t.ARGS[c.OP_OPEN_CONFIRM](ok.stateid, 2))]
    )
    assert st == 0, st
    sid = res[-1][2]
    assert (sid.seqid, sid.other) == (ok.stateid.seqid + 1, ok.stateid.other)
    return sid, fh


def read(raw, fh, sid, minor=0):
    ops = [(c.OP_PUTFH, fh), (c.OP_READ, t.ARGS[c.OP_READ](sid, 0, 10))]
    return raw.v40(ops)[0] if minor == 0 else raw.session(ops)[0]


def lock40(
    raw,
    fh,
    locktype,
    offset,
    length,
    *,
    open_sid=None,
    open_seqid=0,
    lock_sid=None,
    lock_seqid=0,
    owner=b"lock-owner",
    raw_reply=False,
):
    if lock_sid is None:
        locker = (
            True,
            t.open_to_lock_owner4.cls(
                open_seqid, open_sid, lock_seqid, t.state_owner4.cls(raw.clientid, owner)
            ),
        )
    else:
        locker = (False, t.exist_lock_owner4.cls(lock_sid, lock_seqid))
    ops = [
        (c.OP_PUTFH, fh),
        (c.OP_LOCK, t.ARGS[c.OP_LOCK](locktype, False, offset, length, locker)),
    ]
    return raw.v40(ops, raw_reply=raw_reply)


def nfsrs40(port: int):
    import nfs_rs

    return nfs_rs.Client.connect(
        f"nfs://127.0.0.1:{port}/export?version=4.0",
        nfs_port=port,
        noresvport=True,
        uid=0,
        gid=0,
        connect_timeout=20,
        operation_timeout=60,
    )


# -- a real client ---------------------------------------------------------------------------------
def test_nfsrs_v40_round_trip(server):
    with nfsrs40(server.port) as cl:
        assert str(cl.version.value) == "4.0"
        cl.mkdir("runs/a", parents=True, exist_ok=True)
        payload = os.urandom(3 * MiB + 17)
        with cl.open("runs/a/data.bin", "wb") as f:
            f.write(payload)
        with cl.open("runs/a/data.bin", "rb") as f:
            assert hashlib.sha256(f.read()).digest() == hashlib.sha256(payload).digest()
        assert cl.stat("runs/a/data.bin").size == len(payload)
        with cl.open("runs/a/small", "wb") as f:
            f.write(b"small")
        assert sorted(cl.listdir("runs/a")) == ["data.bin", "small"]
        cl.rename("runs/a/data.bin", "runs/a/moved.bin")
        assert sorted(cl.listdir("runs/a")) == ["moved.bin", "small"]
        cl.unlink("runs/a/moved.bin")
        cl.unlink("runs/a/small")
        cl.rmdir("runs/a")
        assert cl.listdir("runs") == []
        # what a 4.0 client wrote, a 4.1 client of the same server reads
        with cl.open("shared.txt", "wb") as f:
            f.write(b"written over NFSv4.0")
    with nfsrs(server.port) as cl41:
        with cl41.open("shared.txt", "rb") as f:
            assert f.read() == b"written over NFSv4.0"


# -- raw requests ----------------------------------------------------------------------------------
def test_minor_version_rules(server):
    raw = RawClient(server.port).setup40()
    root = raw.root_fh40()
    # NFSv4.1's operations are illegal in minor version 0 (RFC 7530 has no such numbers) ...
    for op, args in (
        (c.OP_SEQUENCE, t.ARGS[c.OP_SEQUENCE](b"\0" * 16, 1, 0, 0, False)),
        (c.OP_RECLAIM_COMPLETE, False),
    ):
        st, res = raw.v40([(c.OP_PUTFH, root), (op, args)])
        assert st == c.NFS4ERR_OP_ILLEGAL and res[-1][:2] == (c.OP_ILLEGAL, c.NFS4ERR_OP_ILLEGAL)
    # ... and NFSv4.0's own are NOTSUPP in minor version 1 (RFC 8881 section 18)
    v41 = RawClient(server.port).setup()
    for op, args in (
        (c.OP_RENEW, v41.clientid),
        (c.OP_SETCLIENTID, raw_setclientid_args()),
        (c.OP_RELEASE_LOCKOWNER, t.state_owner4.cls(v41.clientid, b"x")),
    ):
        st, res = v41.session([(op, args)])
        assert st == c.NFS4ERR_NOTSUPP and res[-1][:2] == (op, c.NFS4ERR_NOTSUPP)
    # the attributes of NFSv4.1 (suppattr_exclcreat, fs_layout_types) do not exist in 4.0
    words = [1 << c.FATTR4_SUPPORTED_ATTRS, 0, 1 << (c.FATTR4_SUPPATTR_EXCLCREAT - 64)]
    st, res = raw.v40([(c.OP_PUTFH, root), (c.OP_GETATTR, words)])
    assert st == 0
    mask, vals = res[-1][2].attrmask, res[-1][2].attr_vals
    assert mask == [1]  # only supported_attrs came back
    supported, _ = t.bitmap4.unpack(vals, 0)
    assert len(supported) == 2 and supported[1] >> (c.LAST_FATTR4_40 - 32 + 1) == 0
    st, res = v41.session([(c.OP_PUTFH, root), (c.OP_GETATTR, words)])
    assert res[-1][2].attrmask == words  # 4.1 has both
    # NFSv4.0's SECINFO leaves the current file handle (4.1's consumes it)
    st, res = raw.v40([(c.OP_PUTFH, root), (c.OP_SECINFO, "."), (c.OP_GETFH, None)])
    assert st == 0 and res[-1][2] == root
    raw.close()
    v41.close()


def raw_setclientid_args():
    from nfs4_rawclient import setclientid_args

    return setclientid_args(b"id", b"verifier")


def test_setclientid_and_confirm(server):
    raw = RawClient(server.port)
    ident = b"host-a NFSv4.0"
    st, ok = raw.setclientid(ident, b"verif-01")
    assert st == 0
    raw.clientid = ok.clientid
    root = raw.root_fh40()
    # not confirmed yet: the client id is not usable
    assert raw.v40([(c.OP_RENEW, ok.clientid)])[0] == c.NFS4ERR_STALE_CLIENTID
    assert open40(raw, root, "f", b"o", 1)[0] == c.NFS4ERR_STALE_CLIENTID
    # a wrong verifier or an unknown client id does not confirm
    assert raw.confirm(ok.clientid, b"wrongvrf") == c.NFS4ERR_STALE_CLIENTID
    assert raw.confirm(ok.clientid ^ 0xFFFF, ok.setclientid_confirm) == c.NFS4ERR_STALE_CLIENTID
    assert raw.confirm(ok.clientid, ok.setclientid_confirm) == 0
    assert raw.confirm(ok.clientid, ok.setclientid_confirm) == 0  # a retransmit
    assert raw.v40([(c.OP_RENEW, ok.clientid)])[0] == 0
    sid, fh = open_confirmed(raw, root, "f", b"o")
    # the same verifier again updates the callback: same client id, state kept
    st, again = raw.setclientid(ident, b"verif-01")
    assert st == 0 and again.clientid == ok.clientid
    assert again.setclientid_confirm != ok.setclientid_confirm
    assert raw.confirm(again.clientid, again.setclientid_confirm) == 0
    assert read(raw, fh, sid) == 0
    # another principal may not take over a client id that holds state
    other = RawClient(server.port, uid=1000, gid=1000)
    st, addr = other.setclientid(ident, b"verif-01")
    assert st == c.NFS4ERR_CLID_INUSE and addr.netid == "tcp"
    # a new verifier (the client restarted): a new client id; the old one works until the
    # new one is confirmed, then its state goes
    st, new = raw.setclientid(ident, b"verif-02")
    assert st == 0 and new.clientid != ok.clientid
    assert read(raw, fh, sid) == 0
    assert raw.confirm(new.clientid, new.setclientid_confirm) == 0
    assert read(raw, fh, sid) == c.NFS4ERR_EXPIRED
    assert raw.v40([(c.OP_RENEW, ok.clientid)])[0] == c.NFS4ERR_EXPIRED
    assert raw.v40([(c.OP_RENEW, new.clientid)])[0] == 0
    raw.close()
    other.close()


def test_open_confirm(server):
    raw = RawClient(server.port).setup40()
    root = raw.root_fh40()
    st, ok, fh = open40(raw, root, "new-owner", b"owner", 7)
    assert st == 0 and ok.rflags & c.OPEN4_RESULT_CONFIRM
    assert ok.delegation == (c.OPEN_DELEGATE_NONE, None)  # its callback address does not answer
    # the open is not usable before OPEN_CONFIRM
    assert read(raw, fh, ok.stateid) == c.NFS4ERR_BAD_STATEID
    confirm = t.ARGS[c.OP_OPEN_CONFIRM](ok.stateid, 8)
    st, res = raw.v40([(c.OP_PUTFH, fh), (c.OP_OPEN_CONFIRM, confirm)])
    assert st == 0
    sid = res[-1][2]
    assert sid.seqid == ok.stateid.seqid + 1
    # NFSv4.0 compares stateid seqids exactly: the pre-confirm one is old, 0 is no wildcard
    assert read(raw, fh, ok.stateid) == c.NFS4ERR_OLD_STATEID
    assert read(raw, fh, t.stateid4.cls(0, sid.other)) == c.NFS4ERR_OLD_STATEID
    assert read(raw, fh, t.stateid4.cls(sid.seqid + 1, sid.other)) == c.NFS4ERR_BAD_STATEID
    assert read(raw, fh, sid) == 0
    # a confirmed owner's next OPEN needs no confirmation
    st, ok2, _ = open40(raw, root, "second", b"owner", 9)
    assert st == 0 and not ok2.rflags & c.OPEN4_RESULT_CONFIRM
    # OPEN_CONFIRM of a confirmed owner is refused
    again = t.ARGS[c.OP_OPEN_CONFIRM](ok2.stateid, 10)
    assert raw.v40([(c.OP_PUTFH, fh), (c.OP_OPEN_CONFIRM, again)])[0] == c.NFS4ERR_BAD_STATEID
    # an owner that never confirmed starts over with its next OPEN (any seqid)
    st, ok3, _ = open40(raw, root, "third", b"lazy", 1)
    assert st == 0 and ok3.rflags & c.OPEN4_RESULT_CONFIRM
    st, ok4, _ = open40(raw, root, "third", b"lazy", 50)
    assert st == 0 and ok4.rflags & c.OPEN4_RESULT_CONFIRM
    assert ok4.stateid.other != ok3.stateid.other
    raw.close()


def test_seqid_replay_and_bad_seqid(server):
    raw = RawClient(server.port).setup40()
    root = raw.root_fh40()
    sid, fh = open_confirmed(raw, root, "base", b"owner")
    # a GUARDED create: run twice it would fail with EXIST; the same seqid again is a
    # retransmit and gets the first reply, with its file handle as the current one
    guarded = open_args("guarded", b"owner", raw.clientid, seqid=3)
    guarded.openhow = (c.OPEN4_CREATE, (c.GUARDED4, t.fattr4.cls([], b"")))
    ops = [(c.OP_PUTFH, root), (c.OP_OPEN, guarded), (c.OP_GETFH, None)]
    first = raw.v40(ops, raw_reply=True)
    st, res = raw.parse(first)
    assert st == 0
    again = raw.v40(ops, raw_reply=True)
    assert again[4:] == first[4:]
    # skipping or going back is BAD_SEQID
    for seqid in (5, 2):
        guarded.seqid = seqid
        assert raw.v40(ops)[0] == c.NFS4ERR_BAD_SEQID
    # an error that does not advance the seqid (NOFILEHANDLE) leaves 4 as the next one ...
    nofh = open_args("base", b"owner", raw.clientid, seqid=4, create=False)
    assert raw.v40([(c.OP_OPEN, nofh)])[0] == c.NFS4ERR_NOFILEHANDLE
    # ... one that does (NOENT) uses 4 up, and 4 again is its replay
    missing = open_args("missing", b"owner", raw.clientid, seqid=4, create=False)
    assert raw.v40([(c.OP_PUTFH, root), (c.OP_OPEN, missing)])[0] == c.NFS4ERR_NOENT
    base = open_args("base", b"owner", raw.clientid, seqid=4, create=False)
    assert raw.v40([(c.OP_PUTFH, root), (c.OP_OPEN, base)])[0] == c.NFS4ERR_NOENT  # replayed
    base.seqid = 5
    assert raw.v40([(c.OP_PUTFH, root), (c.OP_OPEN, base)])[0] == 0
    # CLOSE and its retransmit (the stateid is gone, the reply is not)
    st, res = raw.v40(
        [
            (c.OP_PUTFH, root),
            (c.OP_OPEN, open_args("base", b"owner", raw.clientid, seqid=6, create=False)),
        ]
    )
    assert st == 0
    current = res[-1][2].stateid
    close = (c.OP_CLOSE, t.ARGS[c.OP_CLOSE](7, current))
    first = raw.v40([(c.OP_PUTFH, fh), close], raw_reply=True)
    assert raw.parse(first)[0] == 0
    again = raw.v40([(c.OP_PUTFH, fh), close], raw_reply=True)
    assert again[4:] == first[4:]
    assert read(raw, fh, current) == c.NFS4ERR_BAD_STATEID
    raw.close()


def test_lock_seqids_locku_release_lockowner(server):
    raw = RawClient(server.port).setup40()
    root = raw.root_fh40()
    sid, fh = open_confirmed(raw, root, "locked", b"owner")
    # a new lock-owner from the open (open seqid 3, lock seqid 0); its retransmit is replayed
    first = lock40(
        raw, fh, c.WRITE_LT, 0, 100, open_sid=sid, open_seqid=3, lock_seqid=0, raw_reply=True
    )
    st, res = raw.parse(first)
    assert st == 0
    lock_sid = res[-1][2]
    again = lock40(
        raw, fh, c.WRITE_LT, 0, 100, open_sid=sid, open_seqid=3, lock_seqid=0, raw_reply=True
    )
    assert again[4:] == first[4:]
    # the lock-owner's own sequence goes on from 0
    st, res = lock40(raw, fh, c.WRITE_LT, 200, 10, lock_sid=lock_sid, lock_seqid=2)
    assert st == c.NFS4ERR_BAD_SEQID
    st, res = lock40(raw, fh, c.WRITE_LT, 200, 10, lock_sid=lock_sid, lock_seqid=1)
    assert st == 0
    lock_sid = res[-1][2]
    # RELEASE_LOCKOWNER refuses while the owner holds locks
    release = (c.OP_RELEASE_LOCKOWNER, t.state_owner4.cls(raw.clientid, b"lock-owner"))
    assert raw.v40([release])[0] == c.NFS4ERR_LOCKS_HELD
    for seqid, (offset, length) in ((2, (0, 100)), (3, (200, 10))):
        st, res = raw.v40(
            [
                (c.OP_PUTFH, fh),
                (c.OP_LOCKU, t.ARGS[c.OP_LOCKU](c.WRITE_LT, seqid, lock_sid, offset, length)),
            ]
        )
        assert st == 0
        lock_sid = res[-1][2]
    assert raw.v40([release])[0] == 0
    st, _ = lock40(raw, fh, c.WRITE_LT, 0, 1, lock_sid=lock_sid, lock_seqid=4)
    assert st == c.NFS4ERR_BAD_STATEID  # released with its owner
    stale = (c.OP_RELEASE_LOCKOWNER, t.state_owner4.cls(raw.clientid ^ (1 << 40), b"x"))
    assert raw.v40([stale])[0] == c.NFS4ERR_STALE_CLIENTID
    raw.close()


def test_renew_and_lease_expiry(stack):
    add_export(stack.catalog)
    srv = start_server(stack, lease_seconds=2)
    try:
        raw = RawClient(srv.port).setup40()
        root = raw.root_fh40()
        sid, fh = open_confirmed(raw, root, "leased", b"owner")
        # RENEW, or any operation with the client's stateid, keeps the lease (3 s = 1.5 leases)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            assert raw.v40([(c.OP_RENEW, raw.clientid)])[0] == 0
            time.sleep(0.7)
            assert read(raw, fh, sid) == 0
            time.sleep(0.7)
        assert raw.clientid in srv.server.state.clients
        deadline = time.monotonic() + 15
        while raw.clientid in srv.server.state.clients and time.monotonic() < deadline:
            time.sleep(0.3)
        assert raw.v40([(c.OP_RENEW, raw.clientid)])[0] == c.NFS4ERR_EXPIRED
        assert read(raw, fh, sid) == c.NFS4ERR_EXPIRED
        raw.close()
    finally:
        srv.stop()


def test_restart_stale_ids_and_reclaim(stack):
    add_export(stack.catalog)
    srv = start_server(stack, grace_seconds=30)
    port = srv.port
    raw = RawClient(port).setup40(ident=b"host-r", verifier=b"boot-one")
    root = raw.root_fh40()
    sid, fh = open_confirmed(raw, root, "held", b"owner")
    st, res = lock40(raw, fh, c.WRITE_LT, 0, 10, open_sid=sid, open_seqid=3, lock_seqid=0)
    assert st == 0
    raw.close()
    srv.stop()
    srv = start_server(stack, port=port, grace_seconds=3)
    try:
        old_clientid = raw.clientid
        raw = RawClient(port)
        raw.clientid = old_clientid
        # the ids of the previous server instance are stale
        assert raw.v40([(c.OP_RENEW, raw.clientid)])[0] == c.NFS4ERR_STALE_CLIENTID
        assert read(raw, fh, sid) == c.NFS4ERR_STALE_STATEID
        raw.setup40(ident=b"host-r", verifier=b"boot-one")
        # in the grace period: new opens wait, the previous client reclaims (no OPEN_CONFIRM)
        assert open40(raw, root, "other", b"owner2", 1)[0] == c.NFS4ERR_GRACE
        reclaim = open_args("held", b"owner", raw.clientid, create=False, seqid=1)
        reclaim.claim = (c.CLAIM_PREVIOUS, c.OPEN_DELEGATE_NONE)
        st, res = raw.v40([(c.OP_PUTFH, fh), (c.OP_OPEN, reclaim)])
        assert st == 0 and not res[-1][2].rflags & c.OPEN4_RESULT_CONFIRM
        new_sid = res[-1][2].stateid
        assert read(raw, fh, new_sid) == 0
        locker = (
            True,
            t.open_to_lock_owner4.cls(2, new_sid, 0, t.state_owner4.cls(raw.clientid, b"lk")),
        )
        st, _ = raw.v40(
            [(c.OP_PUTFH, fh), (c.OP_LOCK, t.ARGS[c.OP_LOCK](c.WRITE_LT, True, 0, 10, locker))]
        )
        assert st == 0
        time.sleep(3.2)
        # after the grace period: no more reclaims, new opens go
        reclaim.seqid = 3
        assert raw.v40([(c.OP_PUTFH, fh), (c.OP_OPEN, reclaim)])[0] == c.NFS4ERR_NO_GRACE
        assert open40(raw, root, "other", b"owner2", 2)[0] == 0
        raw.close()
    finally:
        srv.stop()


def test_share_reservations_and_locks_conflict_across_versions(server):
    v40 = RawClient(server.port).setup40()
    v41 = RawClient(server.port).setup()
    root = v40.root_fh40()
    # 4.1 opens denying writes: a 4.0 open for writing is refused, for reading it goes
    st, res = v41.session(
        [
            (c.OP_PUTFH, root),
            (c.OP_OPEN, open_args("shared", b"o41", v41.clientid, deny=c.OPEN4_SHARE_DENY_WRITE)),
            (c.OP_GETFH, None),
        ]
    )
    assert st == 0
    sid41, fh = res[2][2].stateid, res[3][2]
    st, _, _ = open40(v40, root, "shared", b"o40", 1, access=WRITE, create=False)
    assert st == c.NFS4ERR_SHARE_DENIED
    sid40, _ = open_confirmed(v40, root, "shared", b"o40r", access=READ)
    # ... and the other way round: 4.0 denies reads, a 4.1 open for reading is refused
    sid40w, _ = open_confirmed(v40, root, "exclusive", b"o40w", deny=c.OPEN4_SHARE_DENY_READ)
    st, _ = v41.session(
        [
            (c.OP_PUTFH, root),
            (c.OP_OPEN, open_args("exclusive", b"o41b", v41.clientid, access=READ, create=False)),
        ]
    )
    assert st == c.NFS4ERR_SHARE_DENIED
    # byte-range locks: 4.1 holds [0, 100) for writing (open for writing: BOTH)
    locker = (
        True,
        t.open_to_lock_owner4.cls(0, sid41, 0, t.state_owner4.cls(v41.clientid, b"l41")),
    )
    st, res = v41.session(
        [(c.OP_PUTFH, fh), (c.OP_LOCK, t.ARGS[c.OP_LOCK](c.WRITE_LT, False, 0, 100, locker))]
    )
    assert st == 0
    lock41 = res[-1][2]
    st, res = lock40(v40, fh, c.READ_LT, 50, 10, open_sid=sid40, open_seqid=3, owner=b"l40")
    assert st == c.NFS4ERR_DENIED and res[-1][2].owner.owner == b"l41"
    lockt = t.ARGS[c.OP_LOCKT](c.READ_LT, 99, 1, t.state_owner4.cls(v40.clientid, b"l40"))
    assert v40.v40([(c.OP_PUTFH, fh), (c.OP_LOCKT, lockt)])[0] == c.NFS4ERR_DENIED
    st, res = lock40(
        v40, fh, c.READ_LT, 100, 10, open_sid=sid40, open_seqid=4, lock_seqid=1, owner=b"l40"
    )
    assert st == 0
    # 4.0 holds a read lock on [100, 110): 4.1's write lock there is refused
    st, res = v41.session(
        [
            (c.OP_PUTFH, fh),
            (
                c.OP_LOCK,
                t.ARGS[c.OP_LOCK](
                    c.WRITE_LT, False, 105, 1, (False, t.exist_lock_owner4.cls(lock41, 0))
                ),
            ),
        ]
    )
    assert st == c.NFS4ERR_DENIED and res[-1][2].owner.clientid == v40.clientid
    # stateids do not cross minor versions
    assert read(v40, fh, sid41) == c.NFS4ERR_BAD_STATEID
    assert read(v41, fh, sid40, minor=1) == c.NFS4ERR_BAD_STATEID
    v40.close()
    v41.close()
