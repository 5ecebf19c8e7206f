"""NFSv4.0 state rules (RFC 7530) where a conformance run against NFS-Ganesha found shingle
different: special stateids where an open's or a lock's is needed, share reservations (the
same open-owner's OPENs, I/O with the anonymous stateid, OPEN_DOWNGRADE to modes opened),
the change attribute and mtime of buffered writes, merged byte-range locks, and the
duplicate request cache of NFSv4.0 COMPOUNDs."""

from __future__ import annotations

import socket
import struct
import time

from nfs4_rawclient import RawClient, open_args
from test_v40 import lock40, open40, open_confirmed

from appliance.nfs.onc.rpc import AUTH_SYS, Credential
from appliance.nfs.v4 import const as c
from appliance.nfs.v4 import types as t

BOTH, READ, WRITE = c.OPEN4_SHARE_ACCESS_BOTH, c.OPEN4_SHARE_ACCESS_READ, c.OPEN4_SHARE_ACCESS_WRITE
DENY_NONE, DENY_READ, DENY_WRITE = (
    c.OPEN4_SHARE_DENY_NONE,
    c.OPEN4_SHARE_DENY_READ,
    c.OPEN4_SHARE_DENY_WRITE,
)
ANONYMOUS = t.stateid4.cls(0, b"\0" * 12)
BYPASS = t.stateid4.cls(0xFFFFFFFF, b"\xff" * 12)


def v40_client(server) -> tuple[RawClient, bytes]:
    raw = RawClient(server.port).setup40()
    return raw, raw.root_fh40()


# -- special stateids -----------------------------------------------------------------------------
def test_special_stateids_where_an_open_or_lock_is_needed_are_bad(server):
    raw, root = v40_client(server)
    sid, fh = open_confirmed(raw, root, "special", b"owner")
    for special in (ANONYMOUS, BYPASS):
        # the open-owner's seqid stays at 2: BAD_STATEID does not advance it (RFC 7530 9.1.7)
        ops = {
            c.OP_OPEN_CONFIRM: t.ARGS[c.OP_OPEN_CONFIRM](special, 3),
            c.OP_OPEN_DOWNGRADE: t.ARGS[c.OP_OPEN_DOWNGRADE](special, 3, READ, DENY_NONE),
            c.OP_CLOSE: t.ARGS[c.OP_CLOSE](3, special),
            c.OP_LOCKU: t.ARGS[c.OP_LOCKU](c.WRITE_LT, 1, special, 0, 10),
        }
        for opnum, args in ops.items():
            st, res = raw.v40([(c.OP_PUTFH, fh), (opnum, args)])
            assert (st, res[-1][:2]) == (c.NFS4ERR_BAD_STATEID, (opnum, c.NFS4ERR_BAD_STATEID))
        # LOCK from an open (a new lock-owner) and with an existing lock-owner's stateid
        st, res = lock40(raw, fh, c.WRITE_LT, 0, 10, open_sid=special, open_seqid=3)
        assert (st, res[-1][:2]) == (c.NFS4ERR_BAD_STATEID, (c.OP_LOCK, c.NFS4ERR_BAD_STATEID))
        st, res = lock40(raw, fh, c.WRITE_LT, 0, 10, lock_sid=special, lock_seqid=1)
        assert (st, res[-1][:2]) == (c.NFS4ERR_BAD_STATEID, (c.OP_LOCK, c.NFS4ERR_BAD_STATEID))
    # the owner goes on at its next seqid: nothing above was sequenced
    st, res = raw.v40([(c.OP_PUTFH, fh), (c.OP_CLOSE, t.ARGS[c.OP_CLOSE](3, sid))])
    assert st == 0
    raw.close()


# -- share reservations --------------------------------------------------------------------------
def test_same_owner_open_conflicting_with_its_own_deny_is_refused(server):
    raw, root = v40_client(server)
    _, fh = open_confirmed(raw, root, "shared", b"owner", access=READ, deny=DENY_WRITE)
    # the open-owner denies writes: its own OPEN for writing conflicts with that
    st, _, _ = open40(raw, root, "shared", b"owner", 3, access=WRITE, create=False)
    assert st == c.NFS4ERR_SHARE_DENIED
    # ... as one denying reads conflicts with its own read access
    st, _, _ = open40(raw, root, "shared", b"owner", 4, access=READ, deny=DENY_READ, create=False)
    assert st == c.NFS4ERR_SHARE_DENIED
    st, ok, _ = open40(raw, root, "shared", b"owner", 5, access=READ, create=False)
    assert st == 0
    # another open-owner of the client, and another client, meet the same deny mode
    st, _, _ = open40(raw, root, "shared", b"other-owner", 1, access=WRITE, create=False)
    assert st == c.NFS4ERR_SHARE_DENIED
    other, _ = v40_client(server)
    st, _, _ = open40(other, root, "shared", b"owner", 1, access=BOTH, create=False)
    assert st == c.NFS4ERR_SHARE_DENIED
    v41 = RawClient(server.port).setup()
    st, _ = v41.session(
        [
            (c.OP_PUTFH, root),
            (c.OP_OPEN, open_args("shared", b"o41", v41.clientid, access=WRITE, create=False)),
        ]
    )
    assert st == c.NFS4ERR_SHARE_DENIED
    for cl in (raw, other, v41):
        cl.close()


def _io(raw, fh, sid, opnum, minor=0):
    if opnum == c.OP_READ:
        op = (c.OP_READ, t.ARGS[c.OP_READ](sid, 0, 10))
    else:
        op = (c.OP_WRITE, t.ARGS[c.OP_WRITE](sid, 0, c.FILE_SYNC4, b"anonymous"))
    ops = [(c.OP_PUTFH, fh), op]
    st, res = raw.v40(ops) if minor == 0 else raw.session(ops)
    assert res[-1][:2] == (opnum, st)
    return st


def test_special_stateid_io_against_a_deny_is_locked(server):
    raw, root = v40_client(server)
    sid, fh = open_confirmed(raw, root, "denied", b"owner", deny=c.OPEN4_SHARE_DENY_BOTH)
    v41 = RawClient(server.port).setup()
    for client, minor in ((raw, 0), (v41, 1)):
        assert _io(client, fh, ANONYMOUS, c.OP_READ, minor) == c.NFS4ERR_LOCKED
        assert _io(client, fh, ANONYMOUS, c.OP_WRITE, minor) == c.NFS4ERR_LOCKED
        # the READ bypass stateid passes deny modes; a WRITE with it is an anonymous one
        assert _io(client, fh, BYPASS, c.OP_READ, minor) == 0
        assert _io(client, fh, BYPASS, c.OP_WRITE, minor) == c.NFS4ERR_LOCKED
    # the holder's own stateid is not denied
    assert _io(raw, fh, sid, c.OP_WRITE) == 0
    st, _ = raw.v40([(c.OP_PUTFH, fh), (c.OP_CLOSE, t.ARGS[c.OP_CLOSE](3, sid))])
    assert st == 0
    # a deny of writes alone leaves anonymous reads alone
    sid, _ = open_confirmed(raw, root, "denied", b"owner2", access=READ, deny=DENY_WRITE)
    assert _io(v41, fh, ANONYMOUS, c.OP_READ, 1) == 0
    assert _io(v41, fh, ANONYMOUS, c.OP_WRITE, 1) == c.NFS4ERR_LOCKED
    st, _ = raw.v40([(c.OP_PUTFH, fh), (c.OP_CLOSE, t.ARGS[c.OP_CLOSE](3, sid))])
    assert st == 0
    assert _io(v41, fh, ANONYMOUS, c.OP_WRITE, 1) == 0
    raw.close()
    v41.close()


def _downgrade(raw, fh, sid, seqid, access, deny):
    args = t.ARGS[c.OP_OPEN_DOWNGRADE](sid, seqid, access, deny)
    st, res = raw.v40([(c.OP_PUTFH, fh), (c.OP_OPEN_DOWNGRADE, args)])
    return st, res[-1][2] if st == 0 else None


def test_open_downgrade_only_to_modes_opened(server):
    raw, root = v40_client(server)
    sid, fh = open_confirmed(raw, root, "modes", b"owner", access=BOTH)
    # opened for reading and writing at once: reading alone was never asked for
    assert _downgrade(raw, fh, sid, 3, READ, DENY_NONE)[0] == c.NFS4ERR_INVAL
    st, ok, _ = open40(raw, root, "modes", b"owner", 4, access=READ, create=False)
    assert st == 0
    sid = ok.stateid
    # now it was: the downgrade keeps the read-only OPEN and forgets the other
    st, sid = _downgrade(raw, fh, sid, 5, READ, DENY_NONE)
    assert st == 0
    assert _downgrade(raw, fh, sid, 6, WRITE, DENY_NONE)[0] == c.NFS4ERR_INVAL
    assert _downgrade(raw, fh, sid, 7, BOTH, DENY_NONE)[0] == c.NFS4ERR_INVAL
    # deny modes count the same way: (read, deny write) and (read, deny none) were opened
    sid2, fh2 = open_confirmed(raw, root, "denies", b"owner2", access=READ, deny=DENY_WRITE)
    st, ok, _ = open40(raw, root, "denies", b"owner2", 3, access=READ, create=False)
    assert st == 0
    assert _downgrade(raw, fh2, ok.stateid, 4, READ, DENY_READ)[0] == c.NFS4ERR_INVAL
    st, sid2 = _downgrade(raw, fh2, ok.stateid, 5, READ, DENY_NONE)
    assert st == 0
    # the deny of writes went with the OPEN that asked for it
    st, _, _ = open40(raw, root, "denies", b"writer", 1, access=WRITE, create=False)
    assert st == 0
    raw.close()


# -- byte-range locks ----------------------------------------------------------------------------
def _lockt(raw, fh, locktype, offset, length, owner=b"tester"):
    args = t.ARGS[c.OP_LOCKT](locktype, offset, length, t.state_owner4.cls(raw.clientid, owner))
    st, res = raw.v40([(c.OP_PUTFH, fh), (c.OP_LOCKT, args)])
    if st == c.NFS4ERR_DENIED:
        denied = res[-1][2]
        return st, (denied.offset, denied.length, denied.locktype)
    return st, None


def test_locks_of_one_owner_merge_and_split(server):
    raw, root = v40_client(server)
    sid, fh = open_confirmed(raw, root, "ranges", b"owner")
    st, res = lock40(raw, fh, c.WRITE_LT, 0, 10, open_sid=sid, open_seqid=3, lock_seqid=0)
    assert st == 0
    lock_sid, seqid = res[-1][2], 1
    for locktype, offset, length in (
        (c.WRITE_LT, 10, 10),  # touches [0, 10): one lock [0, 20)
        (c.WRITE_LT, 30, 10),
        (c.WRITE_LT, 35, 15),  # overlaps [30, 40): one lock [30, 50)
        (c.READ_LT, 50, 10),  # touches [30, 50) but of another type: stays apart
    ):
        st, res = lock40(raw, fh, locktype, offset, length, lock_sid=lock_sid, lock_seqid=seqid)
        assert st == 0
        lock_sid, seqid = res[-1][2], seqid + 1
    # another lock-owner's test sees whole merged locks
    assert _lockt(raw, fh, c.WRITE_LT, 5, 1) == (c.NFS4ERR_DENIED, (0, 20, c.WRITE_LT))
    assert _lockt(raw, fh, c.READ_LT, 31, 1) == (c.NFS4ERR_DENIED, (30, 20, c.WRITE_LT))
    assert _lockt(raw, fh, c.WRITE_LT, 55, 1) == (c.NFS4ERR_DENIED, (50, 10, c.READ_LT))
    # as does a LOCK that is denied
    other_sid, _ = open_confirmed(raw, root, "ranges", b"owner-b")
    st, res = lock40(
        raw, fh, c.WRITE_LT, 12, 1, open_sid=other_sid, open_seqid=3, owner=b"lock-owner-b"
    )
    assert st == c.NFS4ERR_DENIED
    assert (res[-1][2].offset, res[-1][2].length) == (0, 20)
    # LOCKU of the middle splits the merged lock in two
    locku = t.ARGS[c.OP_LOCKU](c.WRITE_LT, seqid, lock_sid, 5, 10)
    st, res = raw.v40([(c.OP_PUTFH, fh), (c.OP_LOCKU, locku)])
    assert st == 0
    assert _lockt(raw, fh, c.WRITE_LT, 5, 10) == (0, None)
    assert _lockt(raw, fh, c.WRITE_LT, 0, 1) == (c.NFS4ERR_DENIED, (0, 5, c.WRITE_LT))
    assert _lockt(raw, fh, c.WRITE_LT, 19, 1) == (c.NFS4ERR_DENIED, (15, 5, c.WRITE_LT))
    raw.close()


# -- duplicate request cache --------------------------------------------------------------------
def _call_with_xid(raw: RawClient, xid: int, ops):
    raw.xid = xid - 1  # send_call takes the next one
    return raw.call_raw(1, raw.compound_bytes(ops, minor=0))


def _reconnect(raw: RawClient, port: int, same_source_port: bool = True) -> None:
    """Drop the connection (a reset, as a client that gives up on it) and connect again, from
    the same source port as the Linux client does."""
    source = raw.sock.getsockname()
    raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    raw.sock.close()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.settimeout(20)
    sock.bind(source if same_source_port else ("127.0.0.1", 0))
    sock.connect(("127.0.0.1", port))
    raw.sock = sock


def test_retransmits_after_a_reconnect_get_the_first_reply(server):
    raw, root = v40_client(server)
    mkdir = [
        (c.OP_PUTFH, root),
        (c.OP_CREATE, t.ARGS[c.OP_CREATE]((c.NF4DIR, None), "d", t.fattr4.cls([], b""))),
    ]
    first = _call_with_xid(raw, 0x5000, mkdir)
    assert RawClient.parse(first)[0] == 0
    _reconnect(raw, server.port)
    # the same xid and arguments: the first reply again, not EXIST
    assert _call_with_xid(raw, 0x5000, mkdir) == first
    # the same for a REMOVE (not NOENT), and a READ-only COMPOUND between them is not kept
    remove = [(c.OP_PUTFH, root), (c.OP_REMOVE, "d")]
    first = _call_with_xid(raw, 0x5001, remove)
    assert RawClient.parse(first)[0] == 0
    _reconnect(raw, server.port)
    assert _call_with_xid(raw, 0x5001, remove) == first
    lookup = [(c.OP_PUTFH, root), (c.OP_LOOKUP, "d")]
    assert RawClient.parse(_call_with_xid(raw, 0x5002, lookup))[0] == c.NFS4ERR_NOENT
    # the same xid with other arguments is another call, and runs
    assert RawClient.parse(_call_with_xid(raw, 0x5001, mkdir))[0] == 0
    # from another port, another client: the xid means nothing to it
    _reconnect(raw, server.port, same_source_port=False)
    assert RawClient.parse(_call_with_xid(raw, 0x5000, mkdir))[0] == c.NFS4ERR_EXIST
    assert server.server.state.reply_cache40.hits == 2
    raw.close()


def test_reply_cache_is_bounded():
    from appliance.nfs.onc.drc import DuplicateRequestCache, checksum

    cred = Credential(AUTH_SYS, 0, 0, ())
    cache = DuplicateRequestCache(max_entries=3, max_bytes=100, max_age=0.2, max_reply=40)
    for xid in range(5):
        entry, replay = cache.begin(("h", 1, xid), checksum(b"call %d" % xid, 0, cred))
        assert replay is None
        cache.finish(entry, [b"x" * 30])
    assert len(cache) == 3  # the oldest went (max_entries)
    assert cache.begin(("h", 1, 4), checksum(b"call 4", 0, cred)) == (None, [b"x" * 30])
    entry, _ = cache.begin(("h", 1, 9), checksum(b"call 9", 0, cred))
    cache.finish(entry, [b"y" * 25, b"y" * 25])  # too big to keep: runs again when repeated
    assert cache.begin(("h", 1, 9), checksum(b"call 9", 0, cred))[1] is None
    time.sleep(0.3)
    entry, replay = cache.begin(("h", 1, 4), checksum(b"call 4", 0, cred))
    assert replay is None and len(cache) <= 2  # aged out (max_age)
    cache.finish(entry, None)


# -- the change attribute of buffered writes ------------------------------------------------------
def _nfsrs(port: int, version: str):
    import nfs_rs

    return nfs_rs.Client.connect(
        f"nfs://127.0.0.1:{port}/export?version={version}&nfsport={port}&mountport={port}",
        noresvport=True,
        uid=0,
        gid=0,
        connect_timeout=20,
        operation_timeout=60,
    )


def _change_and_mtime(raw: RawClient, fh: bytes, minor: int) -> tuple[int, int]:
    words = [1 << c.FATTR4_CHANGE, 1 << (c.FATTR4_TIME_MODIFY - 32)]
    ops = [(c.OP_PUTFH, fh), (c.OP_GETATTR, words)]
    st, res = raw.v40(ops) if minor == 0 else raw.session(ops)
    assert st == 0 and res[-1][2].attrmask == words
    change, seconds, nseconds = struct.unpack(">QqI", res[-1][2].attr_vals)
    return change, seconds * 10**9 + nseconds


def _write40(raw: RawClient, fh: bytes, sid, data: bytes, stable: int) -> None:
    st, res = raw.v40([(c.OP_PUTFH, fh), (c.OP_WRITE, t.ARGS[c.OP_WRITE](sid, 0, stable, data))])
    assert st == 0 and res[-1][2].committed == stable


def test_buffered_write_moves_change_and_mtime_for_other_clients(server):
    writer, root = v40_client(server)
    sid, fh = open_confirmed(writer, root, "rewrite", b"owner")
    _write40(writer, fh, sid, b"A" * 4096, c.FILE_SYNC4)
    reader40, _ = v40_client(server)
    reader41 = RawClient(server.port).setup()
    real = {version: _nfsrs(server.port, version) for version in ("3", "4.0", "4.1")}
    try:

        def seen() -> tuple[int, int, dict]:
            change40, mtime40 = _change_and_mtime(reader40, fh, 0)
            assert _change_and_mtime(reader41, fh, 1) == (change40, mtime40)
            stats = {v: cl.stat("rewrite") for v, cl in real.items()}
            assert {st.size for st in stats.values()} == {4096}
            return change40, mtime40, {v: st.mtime for v, st in stats.items()}

        change, mtime, mtimes = seen()
        # a same-size rewrite, UNSTABLE: buffered, nothing committed yet; every other client
        # (NFSv4.0 and 4.1 GETATTR, and NFSv3, 4.0 and 4.1 through nfs-rs) sees it moved
        for data in (b"B" * 4096, b"C" * 4096):
            _write40(writer, fh, sid, data, c.UNSTABLE4)
            new_change, new_mtime, new_mtimes = seen()
            assert new_change > change and new_mtime > mtime
            assert all(new_mtimes[v] > mtimes[v] for v in real), (mtimes, new_mtimes)
            change, mtime, mtimes = new_change, new_mtime, new_mtimes
        # the COMMIT never takes it back; what a client saw before it stays valid
        st, _ = writer.v40([(c.OP_PUTFH, fh), (c.OP_COMMIT, t.ARGS[c.OP_COMMIT](0, 0))])
        assert st == 0
        committed_change, committed_mtime = _change_and_mtime(reader40, fh, 0)
        assert committed_change == change and committed_mtime >= mtime
        with real["4.1"].open("rewrite", "rb") as f:
            assert f.read() == b"C" * 4096
    finally:
        for cl in real.values():
            cl.close()
        for raw in (writer, reader40, reader41):
            raw.close()


def test_reply_cache_retransmit_waits_for_the_running_call():
    import threading

    from appliance.nfs.onc.drc import DuplicateRequestCache, checksum

    cred = Credential(AUTH_SYS, 0, 0, ())
    cache = DuplicateRequestCache()
    key, check = ("h", 1, 7), checksum(b"a CREATE", 0, cred)
    entry, _ = cache.begin(key, check)
    got = []
    waiter = threading.Thread(target=lambda: got.append(cache.begin(key, check, wait=10)))
    waiter.start()
    time.sleep(0.2)
    assert not got  # still waiting for the first call's reply
    cache.finish(entry, [b"first ", b"reply"])
    waiter.join(10)
    assert got == [(None, [b"first reply"])]
    # a retransmit that waits in vain gets neither entry nor reply (the caller asks a retry)
    entry, _ = cache.begin(("h", 1, 8), check)
    assert cache.begin(("h", 1, 8), check, wait=0.1) == (None, None)
    cache.finish(entry, None)  # not kept: a later retransmit runs as a new call
    assert cache.begin(("h", 1, 8), check)[1] is None


def test_mtime_set_between_unstable_writes_and_commit_is_kept_41(server):
    """cp -p, rsync -t and tar x over NFSv4.1: UNSTABLE WRITEs, SETATTR time_modify_set, COMMIT at
    close. The COMMIT records the writes but keeps the mtime the client set."""
    raw = RawClient(server.port).setup()
    fh, sid = raw.open_new("copied")
    try:
        write = t.ARGS[c.OP_WRITE](sid, 0, c.UNSTABLE4, b"hello")
        assert raw.session([(c.OP_PUTFH, fh), (c.OP_WRITE, write)])[0] == 0
        seconds, nseconds = 946_684_800, 123_456_789  # 2000-01-01
        old = t.fattr4.cls(
            [0, 1 << (c.FATTR4_TIME_MODIFY_SET - 32)],
            struct.pack(">IqI", c.SET_TO_CLIENT_TIME4, seconds, nseconds),
        )
        st, _ = raw.session([(c.OP_PUTFH, fh), (c.OP_SETATTR, t.ARGS[c.OP_SETATTR](sid, old))])
        assert st == 0
        st, _ = raw.session([(c.OP_PUTFH, fh), (c.OP_COMMIT, t.ARGS[c.OP_COMMIT](0, 0))])
        assert st == 0
        assert _change_and_mtime(raw, fh, 1)[1] == seconds * 10**9 + nseconds
        # without a SETATTR, the mtime is the write's time, not the COMMIT's
        before = time.time_ns()
        write = t.ARGS[c.OP_WRITE](sid, 5, c.UNSTABLE4, b"!")
        assert raw.session([(c.OP_PUTFH, fh), (c.OP_WRITE, write)])[0] == 0
        written = _change_and_mtime(raw, fh, 1)[1]
        time.sleep(0.05)
        st, _ = raw.session([(c.OP_PUTFH, fh), (c.OP_COMMIT, t.ARGS[c.OP_COMMIT](0, 0))])
        assert st == 0
        committed = _change_and_mtime(raw, fh, 1)[1]
        assert committed == written and committed >= before
    finally:
        raw.close()
