"""The event loop answers read-only COMPOUNDs from the caches, and never waits:
when the caches do not suffice, or a lock it needs is held, the COMPOUND goes
to a worker thread like every other one, keeping the slot its SEQUENCE took."""

from __future__ import annotations

import os
import socket
import threading

import pytest
from nfs4_rawclient import RawClient, open_args, stateid
from nfs4_support import every_worker_busy
from page_cache import evict_zone_files

from appliance.nfs.v4 import const as c
from appliance.nfs.v4 import types as t
from appliance.nfs.v4.program import FROM_CACHE_MAX_BYTES
from engine.base import errors

GETATTR = (c.OP_GETATTR, [1 << c.FATTR4_TYPE | 1 << c.FATTR4_SIZE])
SPACE = (c.OP_GETATTR, [0, 1 << (c.FATTR4_SPACE_AVAIL - 32)])


def _send(raw: RawClient, ops) -> None:
    """A COMPOUND on slot 0, sent without waiting for the reply."""
    raw.send_call(1, raw.compound_bytes([raw.sequence_op()] + list(ops)))


def _reply(raw: RawClient, timeout: float):
    raw.sock.settimeout(timeout)
    try:
        return raw.parse(raw.recv_record())
    finally:
        raw.sock.settimeout(20)


def _mkdir(raw: RawClient, root: bytes, name: str) -> bytes:
    st, res = raw.session(
        [
            (c.OP_PUTFH, root),
            (c.OP_CREATE, t.ARGS[c.OP_CREATE]((c.NF4DIR, None), name, t.fattr4.cls([], b""))),
            (c.OP_GETFH, None),
        ]
    )
    assert st == 0
    return res[-1][2]


def test_cached_compounds_are_answered_while_every_worker_is_busy(server):
    raw = RawClient(server.port).setup()
    root = raw.root_fh()
    d = _mkdir(raw, root, "d")
    assert raw.session([(c.OP_PUTFH, root), (c.OP_LOOKUP, "d"), GETATTR])[0] == 0  # cached now
    with every_worker_busy(server):
        _send(raw, [(c.OP_PUTFH, root), (c.OP_LOOKUP, "d"), (c.OP_GETFH, None), GETATTR])
        st, res = _reply(raw, 5)
        assert st == 0 and res[-2][2] == d
        _send(raw, [(c.OP_PUTFH, d), (c.OP_ACCESS, c.ACCESS4_READ | c.ACCESS4_LOOKUP)])
        assert _reply(raw, 5)[0] == 0
        # a name the caches do not hold needs the catalog: that waits for a worker
        _send(raw, [(c.OP_PUTFH, root), (c.OP_LOOKUP, "nothing-here")])
        with pytest.raises(socket.timeout):
            _reply(raw, 0.5)
    assert raw.parse(raw.recv_record())[0] == c.NFS4ERR_NOENT
    # the slot the event loop's attempt took went to the worker, which freed it
    assert raw.session([(c.OP_PUTFH, d), GETATTR])[0] == 0
    raw.close()


def test_handed_off_compound_keeps_the_reply_cache(server):
    raw = RawClient(server.port).setup()
    root = raw.root_fh()
    # SEQUENCE and PUTFH run on the event loop, OPEN (a create) and WRITE in a worker
    st, res = raw.session(
        [
            (c.OP_PUTFH, root),
            (c.OP_OPEN, open_args("f", b"owner-1", raw.clientid)),
            (c.OP_GETFH, None),
        ],
        slot=2,
    )
    assert st == 0
    fh, sid = res[-1][2], res[2][2].stateid
    write = [
        (c.OP_PUTFH, fh),
        (c.OP_WRITE, t.ARGS[c.OP_WRITE](stateid(sid.seqid, sid.other), 0, c.FILE_SYNC4, b"abc")),
        GETATTR,
    ]
    first = raw.session(write, slot=2, raw_reply=True)
    assert raw.parse(first)[0] == 0
    # a retransmit is answered from the reply cache, the WRITE does not run twice
    again = raw.session(write, slot=2, bump=False, raw_reply=True)
    assert again[4:] == first[4:]
    assert server.server.counters.snapshot()["nfs_ops_write"] == 1
    raw.close()


def _null_answered(port: int) -> bool:
    other = RawClient(port)
    other.sock.settimeout(2)
    try:
        other.call_raw(0, b"")
        return True
    except TimeoutError:
        return False
    finally:
        other.close()


@pytest.mark.parametrize("held", ["state lock", "statfs lock"])
def test_event_loop_never_waits_for_a_held_lock(server, held):
    """A worker holding the state lock (or the statfs lock) across catalog work must not stall
    the event loop: the COMPOUND that needs the lock goes to a worker, and calls on other
    connections are answered meanwhile."""
    nfs = server.server
    raw = RawClient(server.port).setup()
    root = raw.root_fh()
    assert raw.session([(c.OP_PUTFH, root), GETATTR, SPACE])[0] == 0
    lock = nfs.state.lock if held == "state lock" else nfs._statfs_lock
    ops = [(c.OP_PUTFH, root), GETATTR] if held == "state lock" else [(c.OP_PUTFH, root), SPACE]
    holding, let_go = threading.Event(), threading.Event()

    def holder():  # stands for a worker in the middle of a catalog transaction
        with lock:
            holding.set()
            let_go.wait(30)

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert holding.wait(10)
        nfs._statfs = None  # stale: the space attribute must be computed again
        _send(raw, ops)
        assert _null_answered(server.port), f"the event loop waited for the {held}"
        with pytest.raises(socket.timeout):
            _reply(raw, 0.3)  # and the COMPOUND itself waits for the lock, in a worker
    finally:
        let_go.set()
        thread.join(10)
    assert raw.parse(raw.recv_record())[0] == 0
    raw.close()


def test_a_handed_off_compound_carries_on_where_the_event_loop_stopped(server):
    raw = RawClient(server.port).setup()
    root = raw.root_fh()
    d = _mkdir(raw, root, "d")
    assert raw.session([(c.OP_PUTFH, root), (c.OP_LOOKUP, "d"), GETATTR])[0] == 0  # cached now
    before = server.server.counters.snapshot()
    # the loop answers PUTFH, LOOKUP d and GETFH from the caches, then a name they lack stops it
    st, res = raw.session(
        [
            (c.OP_PUTFH, root),
            (c.OP_LOOKUP, "d"),
            (c.OP_GETFH, None),
            (c.OP_LOOKUP, "absent"),
            GETATTR,
        ]
    )
    after = server.server.counters.snapshot()
    assert st == c.NFS4ERR_NOENT
    assert [(op, status) for op, status, _ in res] == [
        (c.OP_SEQUENCE, 0),
        (c.OP_PUTFH, 0),
        (c.OP_LOOKUP, 0),
        (c.OP_GETFH, 0),
        (c.OP_LOOKUP, c.NFS4ERR_NOENT),
    ]
    assert res[3][2] == d
    counted = {
        op: after.get(f"nfs_ops_{op}", 0) - before.get(f"nfs_ops_{op}", 0)
        for op in ("putfh", "lookup", "getfh", "getattr")
    }
    assert counted == {"putfh": 1, "lookup": 2, "getfh": 1, "getattr": 0}, (
        "an operation ran twice or not at all"
    )
    assert after["nfs_compounds_handed_off"] == before["nfs_compounds_handed_off"] + 1
    raw.close()


def _open_and_write(raw: RawClient, name: str, payload: bytes):
    fh, sid = raw.open_new(name, b"reader")
    write = (
        c.OP_WRITE,
        t.ARGS[c.OP_WRITE](stateid(sid.seqid, sid.other), 0, c.FILE_SYNC4, payload),
    )
    assert raw.session([(c.OP_PUTFH, fh), write])[0] == 0

    def read(offset, count):
        return (c.OP_READ, t.ARGS[c.OP_READ](stateid(sid.seqid, sid.other), offset, count))

    return fh, read


def test_read_of_fragments_in_memory_is_answered_by_the_event_loop(server):
    raw = RawClient(server.port).setup()
    payload = os.urandom(200 << 10)  # several stripes of the test stack's 64 KiB fragments
    fh, read = _open_and_write(raw, "warm", payload)
    assert raw.session([(c.OP_PUTFH, fh), read(0, 10)])[0] == 0  # the extent map is cached now
    server.server.namespace.data.reader.drop_cache()  # the fragments are in the page cache only
    with every_worker_busy(server):
        # whole fragments and parts of them, across stripes: read and checked on the loop
        _send(raw, [(c.OP_PUTFH, fh), read(1000, 150 << 10)])
        st, res = _reply(raw, 5)
        assert st == 0 and bytes(res[-1][2].data) == payload[1000 : 1000 + (150 << 10)]
    raw.close()


def test_read_of_fetched_fragments_is_answered_by_the_event_loop(server):
    raw = RawClient(server.port).setup()
    payload = os.urandom(200 << 10)  # several stripes of the test stack's 64 KiB fragments
    fh, read = _open_and_write(raw, "data", payload)
    assert raw.session([(c.OP_PUTFH, fh), read(0, 10)])[0] == 0  # the extent map is cached now
    server.server.namespace.data.reader.drop_cache()  # but the next READ must go to the drives
    evict_zone_files(server.server.namespace.data.space.drives.values())  # from the medium
    with every_worker_busy(server):
        _send(raw, [(c.OP_PUTFH, fh), read(0, 64 << 10)])  # not fetched yet: needs a worker
        with pytest.raises(socket.timeout):
            _reply(raw, 0.5)
    st, res = raw.parse(raw.recv_record())
    assert st == 0 and bytes(res[-1][2].data) == payload[: 64 << 10]
    # now its fragments are in the reader's cache: with every worker busy again, the loop answers
    with every_worker_busy(server):
        _send(raw, [(c.OP_PUTFH, fh), read(1000, 30000)])
        st, res = _reply(raw, 5)
        assert st == 0 and bytes(res[-1][2].data) == payload[1000:31000]
    raw.close()


def test_space_used_after_a_commit_is_answered_from_the_cache(server):
    """The data-path commit counts a small file's space used in its own transaction: the
    GETATTR a client sends after COMMIT (st_blocks) needs no worker and no catalog read."""
    raw = RawClient(server.port).setup()
    root = raw.root_fh()
    st, res = raw.session(
        [
            (c.OP_PUTFH, root),
            (c.OP_OPEN, open_args("small", b"owner-1", raw.clientid)),
            (c.OP_GETFH, None),
        ]
    )
    assert st == 0
    fh, sid = res[-1][2], res[2][2].stateid
    data = b"s" * 5000  # two 4 KiB blocks
    st, _ = raw.session(
        [
            (c.OP_PUTFH, fh),
            (c.OP_WRITE, t.ARGS[c.OP_WRITE](stateid(sid.seqid, sid.other), 0, c.UNSTABLE4, data)),
            (c.OP_COMMIT, t.ARGS[c.OP_COMMIT](0, 0)),
        ]
    )
    assert st == 0
    space_used = (c.OP_GETATTR, [0, 1 << (c.FATTR4_SPACE_USED - 32)])
    with every_worker_busy(server):
        _send(raw, [(c.OP_PUTFH, fh), space_used])
        st, res = _reply(raw, 5)
    assert st == 0
    assert int.from_bytes(res[-1][2].attr_vals, "big") == 8192
    raw.close()


def _unstable_write(sid, offset: int, data: bytes, how: int = c.UNSTABLE4):
    return (c.OP_WRITE, t.ARGS[c.OP_WRITE](stateid(sid.seqid, sid.other), offset, how, data))


def test_an_unstable_write_into_the_buffer_is_answered_by_the_event_loop(server):
    raw = RawClient(server.port).setup()
    fh, sid = raw.open_new("ckpt", b"writer")
    stripe = server.server.namespace.data.policies["warm"].stripe_size
    first, second = os.urandom(stripe // 4), os.urandom(stripe // 4)
    assert raw.session([(c.OP_PUTFH, fh), GETATTR])[0] == 0  # its attributes are cached now
    with every_worker_busy(server):
        _send(raw, [(c.OP_PUTFH, fh), _unstable_write(sid, 0, first)])
        st, res = _reply(raw, 5)
        assert st == 0 and res[-1][2].count == len(first)
        assert res[-1][2].committed == c.UNSTABLE4
        # what no buffer can take alone waits for a worker: a stable write (it flushes) ...
        _send(raw, [(c.OP_PUTFH, fh), _unstable_write(sid, len(first), second, c.FILE_SYNC4)])
        with pytest.raises(socket.timeout):
            _reply(raw, 0.5)
    st, res = raw.parse(raw.recv_record())
    assert st == 0 and res[-1][2].committed == c.FILE_SYNC4
    with every_worker_busy(server):
        # ... and one that fills a stripe (the dispatcher takes it and may hold the writer back)
        rest = os.urandom(stripe)
        _send(raw, [(c.OP_PUTFH, fh), _unstable_write(sid, 2 * len(first), rest)])
        with pytest.raises(socket.timeout):
            _reply(raw, 0.5)
    assert raw.parse(raw.recv_record())[0] == 0
    assert raw.session([(c.OP_PUTFH, fh), (c.OP_COMMIT, t.ARGS[c.OP_COMMIT](0, 0))])[0] == 0
    expect = first + second + rest
    ns = server.server.namespace
    assert bytes(ns.read(ns.resolve("/ckpt").ino, 0, len(expect) + 1)) == expect
    raw.close()


def test_a_small_write_is_answered_by_the_event_loop_while_workers_run_calls(server):
    """With calls queued for or running in workers (several writers at once), only a big WRITE
    goes to a worker to copy its data; a small one (nfs-rs's 4 KiB after each 1,044,480) is
    answered by the loop: a thread hand-off costs more than its copy."""
    raw = RawClient(server.port).setup()
    fh, sid = raw.open_new("small", b"writer")
    small = os.urandom(4096)
    big = os.urandom(FROM_CACHE_MAX_BYTES + 4096)
    assert len(big) < server.server.namespace.data.policies["warm"].stripe_size
    assert raw.session([(c.OP_PUTFH, fh), GETATTR])[0] == 0  # its attributes are cached now
    pool = server.server.pool
    with every_worker_busy(server):
        pool.call_soon(lambda: None)  # waits behind the busy workers: the pool is not idle
        assert not pool.idle()
        _send(raw, [(c.OP_PUTFH, fh), _unstable_write(sid, 0, small)])
        st, res = _reply(raw, 5)
        assert st == 0 and res[-1][2].count == len(small)
        assert res[-1][2].committed == c.UNSTABLE4
        _send(raw, [(c.OP_PUTFH, fh), _unstable_write(sid, len(small), big)])
        with pytest.raises(socket.timeout):
            _reply(raw, 0.5)
    st, res = raw.parse(raw.recv_record())
    assert st == 0 and res[-1][2].count == len(big)
    assert raw.session([(c.OP_PUTFH, fh), (c.OP_COMMIT, t.ARGS[c.OP_COMMIT](0, 0))])[0] == 0
    ns = server.server.namespace
    assert bytes(ns.read(ns.resolve("/small").ino, 0, 1 << 20)) == small + big
    raw.close()


def _setattr(sid, mask: list[int], values: bytes):
    return (
        c.OP_SETATTR,
        t.ARGS[c.OP_SETATTR](stateid(sid.seqid, sid.other), t.fattr4.cls(mask, values)),
    )


def _size(size: int) -> tuple[list[int], bytes]:
    return [1 << c.FATTR4_SIZE], size.to_bytes(8, "big")


def _mode(mode: int) -> tuple[list[int], bytes]:
    return [0, 1 << (c.FATTR4_MODE - 32)], mode.to_bytes(4, "big")


def _owner(name: bytes) -> tuple[list[int], bytes]:
    return [0, 1 << (c.FATTR4_OWNER - 32)], len(name).to_bytes(4, "big") + name.ljust(
        -(-len(name) // 4) * 4, b"\0"
    )


def test_a_setattr_that_changes_nothing_is_answered_by_the_event_loop(server):
    """nfs-rs sends SETATTR size 0 to every file it creates: the namespace answers it from the
    cache, and so does the loop. What changes the file, and owners (their names may read
    /etc/passwd), wait for a worker."""
    raw = RawClient(server.port).setup()
    fh, sid = raw.open_new("new", b"creator")
    attrs = (c.OP_GETATTR, [1 << c.FATTR4_SIZE, 1 << (c.FATTR4_MODE - 32)])
    st, res = raw.session([(c.OP_PUTFH, fh), attrs])  # its attributes are cached now
    assert st == 0
    mode = int.from_bytes(res[-1][2].attr_vals[8:12], "big")
    with every_worker_busy(server):
        for mask, values in (_size(0), _mode(mode)):
            _send(raw, [(c.OP_PUTFH, fh), _setattr(sid, mask, values), attrs])
            st, res = _reply(raw, 5)
            assert st == 0 and res[2][2] == mask, (mask, res)
    for mask, values in (_mode(0o600), _owner(b"0"), _size(5)):
        with every_worker_busy(server):
            _send(raw, [(c.OP_PUTFH, fh), _setattr(sid, mask, values)])
            with pytest.raises(socket.timeout):
                _reply(raw, 0.5)
        st, res = raw.parse(raw.recv_record())
        assert st == 0 and res[2][2] == mask
    attr = server.server.namespace.resolve("/new")
    assert (attr.mode & 0o7777, attr.size, attr.uid) == (0o600, 5, 0)
    raw.close()


def test_a_truncate_of_buffered_writes_waits_for_a_worker(server):
    """Size 0 on a file of committed size 0 is no change, unless writes wait in its buffer:
    those are flushed first, in a worker, and cut."""
    raw = RawClient(server.port).setup()
    fh, sid = raw.open_new("buffered", b"writer")
    assert raw.session([(c.OP_PUTFH, fh), GETATTR])[0] == 0  # its attributes are cached now
    assert raw.session([(c.OP_PUTFH, fh), _unstable_write(sid, 0, b"pending")])[0] == 0
    with every_worker_busy(server):
        _send(raw, [(c.OP_PUTFH, fh), _setattr(sid, *_size(0))])
        with pytest.raises(socket.timeout):
            _reply(raw, 0.5)
    assert raw.parse(raw.recv_record())[0] == 0
    ns = server.server.namespace
    ino = ns.resolve("/buffered").ino
    assert ns.getattr(ino).size == 0 and bytes(ns.read(ino, 0, 10)) == b""
    raw.close()


def test_close_is_answered_by_the_event_loop_unless_it_may_free_the_file(server):
    raw = RawClient(server.port).setup()
    root = raw.root_fh()
    fh, sid = raw.open_new("kept", b"closer")
    assert raw.session([(c.OP_PUTFH, fh), GETATTR])[0] == 0  # its attributes are cached now
    close = (c.OP_CLOSE, t.ARGS[c.OP_CLOSE](0, stateid(sid.seqid, sid.other)))
    with every_worker_busy(server):
        _send(raw, [(c.OP_PUTFH, fh), close])
        st, res = _reply(raw, 5)
    assert st == 0 and res[-1][2].seqid == sid.seqid + 1
    ns = server.server.namespace
    assert not ns.is_open(ns.resolve("/kept").ino)
    # the last close of a file removed while open frees it: that waits for a worker
    fh, sid = raw.open_new("removed", b"closer")
    ino = ns.resolve("/removed").ino
    assert raw.session([(c.OP_PUTFH, root), (c.OP_REMOVE, "removed")])[0] == 0
    close = (c.OP_CLOSE, t.ARGS[c.OP_CLOSE](0, stateid(sid.seqid, sid.other)))
    with every_worker_busy(server):
        _send(raw, [(c.OP_PUTFH, fh), close])
        with pytest.raises(socket.timeout):
            _reply(raw, 0.5)
    assert raw.parse(raw.recv_record())[0] == 0
    with pytest.raises(errors.StaleHandle):
        ns.getattr(ino)
    raw.close()


def test_an_open_of_a_name_not_there_yet_is_answered_by_the_event_loop(server):
    """nfs-rs opens each name without create before it creates it: once a lookup of a missing
    name read the directory whole, the loop answers the next such OPENs (NOENT); one of a name
    that exists, and every create, waits for a worker."""
    raw = RawClient(server.port).setup()
    root = raw.root_fh()
    d = _mkdir(raw, root, "d")

    def open_(name, create=False):
        return (c.OP_OPEN, open_args(name, b"opener", raw.clientid, create=create))

    assert raw.session([(c.OP_PUTFH, d), open_("first")])[0] == c.NFS4ERR_NOENT
    with every_worker_busy(server):
        _send(raw, [(c.OP_PUTFH, d), open_("second"), (c.OP_GETFH, None)])
        st, res = _reply(raw, 5)
        assert st == c.NFS4ERR_NOENT and len(res) == 3
        _send(raw, [(c.OP_PUTFH, d), open_("second", create=True)])
        with pytest.raises(socket.timeout):
            _reply(raw, 0.5)
    assert raw.parse(raw.recv_record())[0] == 0
    # the new name is known at once: its OPEN without create finds it, in a worker
    with every_worker_busy(server):
        _send(raw, [(c.OP_PUTFH, d), open_("second")])
        with pytest.raises(socket.timeout):
            _reply(raw, 0.5)
    assert raw.parse(raw.recv_record())[0] == 0


def test_a_commit_with_nothing_to_flush_is_answered_by_the_event_loop(server):
    raw = RawClient(server.port).setup()
    fh, sid = raw.open_new("synced", b"writer")
    data = os.urandom(4096)
    commit = (c.OP_COMMIT, t.ARGS[c.OP_COMMIT](0, 0))
    assert raw.session([(c.OP_PUTFH, fh), _unstable_write(sid, 0, data), commit])[0] == 0
    assert raw.session([(c.OP_PUTFH, fh), GETATTR])[0] == 0  # its attributes are cached now
    with every_worker_busy(server):
        # everything written is durable: no flush, no transaction, no worker
        _send(raw, [(c.OP_PUTFH, fh), commit])
        st, res = _reply(raw, 5)
        assert st == 0 and res[-1][2] == server.server.write_verifier
        # a write in the buffer is answered by the loop, but its COMMIT waits for a worker
        _send(raw, [(c.OP_PUTFH, fh), _unstable_write(sid, 4096, data)])
        assert _reply(raw, 5)[0] == 0
        _send(raw, [(c.OP_PUTFH, fh), commit])
        with pytest.raises(socket.timeout):
            _reply(raw, 0.5)
    st, res = raw.parse(raw.recv_record())
    assert st == 0 and res[-1][2] == server.server.write_verifier
    ns = server.server.namespace
    assert ns.data.pending_size(ns.resolve("/synced").ino) is None  # flushed by the worker
    assert bytes(ns.read(ns.resolve("/synced").ino, 0, 8193)) == data + data
    raw.close()
