"""The NFSv4.0 COMPOUND (RFC 7530), beside NFSv4.1's (compound.py) on the same port and state.

Minor version 0 has no SEQUENCE and no sessions: operations past RELEASE_LOCKOWNER are
NFS4ERR_OP_ILLEGAL. The operations that carry an open- or lock-owner sequence id (OPEN,
OPEN_CONFIRM, OPEN_DOWNGRADE, CLOSE, LOCK, LOCKU) are checked against the owner's last one
(appliance.nfs.state.v40): the next one runs, the same one again gets the owner's cached
reply, any other NFS4ERR_BAD_SEQID. That per-owner cache answers a retransmit of those; the
duplicate request cache (appliance.nfs.onc.drc, by client address, port and xid) answers one of
any COMPOUND that changed something (a CREATE, REMOVE, WRITE ...) with its first reply.

Limits (NFSv4.0 negotiates none): the operation past nfs.max_compound_ops, and the one whose
result would take the reply past nfs.max_record_size (what bounds an NFSv4.1 session's
ca_maxresponsesize), answer NFS4ERR_RESOURCE, the results before them kept.

Operations are declared in appliance.nfs.v4.registry: which ones NFSv4.0 runs, which change
something (``mutating``: their COMPOUND's reply is kept), and their handlers, NFSv4.1's unless
NFSv4.0 has its own (``handler40``, appliance.nfs.v4.ops.v40). A COMPOUND of minor version 0
always runs in a worker thread: the event loop's from-cache path is NFSv4.1's alone."""

from __future__ import annotations

import logging
import struct
import time

from appliance.nfs.onc import drc as onc_drc
from appliance.nfs.onc.xdr import Packer, UInt, XdrError
from appliance.nfs.state import NfsError
from appliance.nfs.state import v40 as state40
from appliance.nfs.v4 import compound
from appliance.nfs.v4 import const as c
from appliance.nfs.v4.context import Compound
from appliance.nfs.v4.registry import TABLE
from appliance.nfs.v4.types import ARGS

log = logging.getLogger("shingle.nfs")

_XID = struct.Struct(">I")


class Compound40(Compound):
    """The context of an NFSv4.0 COMPOUND: no session; the client is the one an operation
    names (a client id in its arguments, or its stateid's client)."""

    minor = c.MINOR_VERSION_40

    def __init__(self, server, conn_state: dict, rpc_cred, address: str):
        super().__init__(server, conn_state, rpc_cred, address)
        self.sequenced: state40.Owner | None = None  # the owner of the running seqid operation
        # the client this connection carries, until an operation names one (a GETATTR, REMOVE
        # or RENAME of a delegation's holder is then its own, not another client's)
        self.client = state40.connection_client(conn_state, server.state)

    def need_client(self):
        return self.client  # None: the stateid an operation names identifies its client

    def note_client(self) -> None:
        if self.client is not None:
            state40.note_connection_client(self.conn_state, self.state, self.client)

    def stateid(self, sid):
        # NFSv4.0 has no "current stateid"; checking here gives every operation the 4.0
        # errors (STALE_STATEID, EXPIRED, OLD_STATEID, unconfirmed opens) and renews the lease
        if not self.is_special(sid):
            state40.lookup(self.state, sid)
        return sid


def execute(server, conn_state: dict, rpc_cred, address: str, tag: bytes, record, pos: int) -> list:
    """Run an NFSv4.0 COMPOUND whose header was read up to ``pos`` (after minorversion); a
    retransmit of one that changed something gets its first reply (the duplicate request
    cache, appliance.nfs.onc.drc)."""
    drc = server.state.reply_cache40
    # by client address and port, as knfsd: a reconnecting client keeps its source port
    peer = conn_state.get("peer", (address, 0))
    key = (peer[0], peer[1], _XID.unpack_from(record, 0)[0])
    entry, replay = drc.begin(key, onc_drc.checksum(record, pos, rpc_cred))
    if entry is None:
        if replay is None:  # the first one is still running: the client retries later
            return [bytes(compound.reply_head(c.NFS4ERR_DELAY, tag, 0))]
        log.debug("COMPOUND from %s:%d xid %#x: a retransmit, replayed", *key)
        return replay
    chunks = None
    changes: list[bool] = [False]
    try:
        chunks = _execute(server, conn_state, rpc_cred, address, tag, record, pos, changes)
    finally:
        drc.finish(entry, chunks if changes[0] else None)
    return chunks


def _execute(
    server, conn_state: dict, rpc_cred, address: str, tag: bytes, record, pos: int, changes: list
) -> list:
    """The COMPOUND's operations; ``changes[0]`` set when one of them is not idempotent."""
    try:
        count, pos = UInt.unpack(record, pos)
    except XdrError:
        count = -1
    if count < 0 or count > (len(record) - pos) // 4:
        return [bytes(compound.reply_head(c.NFS4ERR_BADXDR, tag, 0))]
    cx = Compound40(server, conn_state, rpc_cred, address)
    p = Packer()
    status = c.NFS4_OK
    done = 0
    counters = server.counters
    op_limit = server.limits.max_compound_ops
    room = compound.reply_room(server.max_record_size, len(tag))
    for _ in range(count):
        done += 1
        try:
            opnum, pos = UInt.unpack(record, pos)
        except XdrError:
            status = c.NFS4ERR_BADXDR
            compound.emit_result(p, c.OP_ILLEGAL, status, None)
            break
        op = TABLE.get(opnum)
        if op is None or op.since != c.MINOR_VERSION_40:
            status = c.NFS4ERR_OP_ILLEGAL
            compound.emit_result(p, c.OP_ILLEGAL, status, None)
            break
        if done > op_limit:
            status = too_many_ops(p, opnum, op_limit)
            break
        if c.MINOR_VERSION_40 not in op.minors:
            status = c.NFS4ERR_NOTSUPP
            compound.emit_result(p, opnum, status, None)
            break
        try:
            args, pos = ARGS[opnum].unpack(record, pos)
        except XdrError as exc:
            log.debug("BADXDR in %s: %s", c.OP_NAMES.get(opnum), exc)
            status = c.NFS4ERR_BADXDR
            compound.emit_result(p, opnum, status, None)
            break
        if op.mutating:  # a retransmit gets the first reply (run twice, it fails or undoes)
            changes[0] = True
        started = time.perf_counter()
        mark = (len(p.chunks), len(p.buf), p.size)  # to take a reply too big back
        status = _operation(cx, opnum, args, p)
        cx.note_client()
        export = cx.cur.export if cx.cur is not None else None
        counters.op_done(
            compound.OP_METRIC[opnum], time.perf_counter() - started, export and export.id
        )
        if len(p) > room:
            status = reply_too_big(p, mark, opnum, room)
        if status != c.NFS4_OK:
            break
    return [bytes(compound.reply_head(status, tag, done)), *p.result()]


# -- limits: NFSv4.0 negotiates none (no CREATE_SESSION), so the server's own apply -------------
def too_many_ops(p: Packer, opnum: int, limit: int) -> int:
    """The first operation past nfs.max_compound_ops answers NFS4ERR_RESOURCE, unrun, after
    the ones before it ran (so a client sees where to split the COMPOUND, as Linux nfsd
    does): without a limit a client is answered as many operations as a record holds."""
    log.debug("%s: past %d operations in one COMPOUND", c.OP_NAMES.get(opnum), limit)
    compound.emit_result(p, opnum, c.NFS4ERR_RESOURCE, None)
    return c.NFS4ERR_RESOURCE


def reply_too_big(p: Packer, mark: tuple, opnum: int, room: int) -> int:
    """The operation whose result took the reply past ``room`` (what a reply of
    nfs.max_record_size leaves for results, as an NFSv4.1 session's ca_maxresponsesize):
    its result is taken back and it answers NFS4ERR_RESOURCE; the results before it stay."""
    compound.take_back(p, mark)
    log.debug("%s: reply past %d bytes", c.OP_NAMES.get(opnum), room)
    compound.emit_result(p, opnum, c.NFS4ERR_RESOURCE, None)
    return c.NFS4ERR_RESOURCE


def _operation(cx: Compound40, opnum: int, args, p: Packer) -> int:
    """One operation into ``p``, its sequence id checked first when it carries one."""
    sequencer = SEQUENCERS.get(opnum)
    if sequencer is None:
        return _call(cx, opnum, args, p)
    try:
        owner, seqid, also = sequencer(cx, args)
    except NfsError as exc:
        compound.emit_result(p, opnum, exc.status, None)
        return exc.status
    cx.note_client()  # before the OPEN: whether its client may get a write delegation
    with owner.lock:  # one request of an owner at a time: a retransmit waits, then replays
        try:
            if state40.is_replay(owner, seqid):
                log.debug("%s: replay of seqid %d", c.OP_NAMES.get(opnum), seqid)
                p.buf += owner.reply
                if owner.reply_fh is not None:
                    cx.cur = owner.reply_fh
                return owner.reply_status
            if also is not None:
                state40.check_next(*also)
        except NfsError as exc:
            compound.emit_result(p, opnum, exc.status, None)
            return exc.status
        cx.sequenced = owner
        q = Packer()
        status = _call(cx, opnum, args, q)
        reply = q.getvalue()
        p.buf += reply
        if status not in state40.NOT_SEQUENCED:
            for who, number in ((owner, seqid), also or (None, 0)):
                if who is not None:
                    who.seqid, who.reply, who.reply_status = number, reply, status
                    who.reply_fh = cx.cur if opnum == c.OP_OPEN else None
        return status


def _call(cx: Compound40, opnum: int, args, p: Packer) -> int:
    op = TABLE[opnum]
    status, value = compound.run_handler(cx, op, op.handler40 or op.handler, args)
    compound.emit_result(p, opnum, status, value)
    return status


# -- which owner an operation's sequence id belongs to -------------------------------------------
def _open_owner_by_stateid(cx: Compound40, sid, seqid: int):
    """(open-owner, open state or None) of a stateid; None for the stateid a CLOSE ended, when
    this is that CLOSE again."""
    state = cx.state
    with state.lock:
        st = state.states.get(sid.other)
        if st is None:
            owner = state40.closed_owner(state, sid.other)
            if owner is None or owner.seqid != seqid:
                raise state40.missing(state, sid.other)
            return owner, None
        if st.kind != "open" or st.client.minor != c.MINOR_VERSION_40:
            raise NfsError(c.NFS4ERR_BAD_STATEID, "not an open stateid of an NFSv4.0 client")
        st.client.last_renew = time.monotonic()
        return state40.owner_for(st.client, state40.OPEN_OWNER, st.owner), st


def _seq_open(cx: Compound40, a):
    state = cx.state
    cl = cx.client = state40.client40(state, a.owner.clientid)
    name = bytes(a.owner.owner)
    with state.lock:
        owner = state40.owner_for(cl, state40.OPEN_OWNER, name)
    assert owner is not None  # owner_for creates it
    if (
        not owner.confirmed
        and owner.seqid is not None
        and not (a.seqid == owner.seqid and owner.reply is not None)
    ):
        state40.drop_unconfirmed_owner(state, cl, owner)
        with state.lock:
            owner = state40.owner_for(cl, state40.OPEN_OWNER, name)
    return owner, a.seqid, None


def _seq_by_open_stateid(cx: Compound40, a):
    owner, st = _open_owner_by_stateid(cx, a.open_stateid, a.seqid)
    if st is not None:
        cx.client = st.client
    return owner, a.seqid, None


def _seq_lock(cx: Compound40, a):
    new, arg = a.locker
    state = cx.state
    if new:
        owner, st = _open_owner_by_stateid(cx, arg.open_stateid, arg.open_seqid)
        if st is None:
            return owner, arg.open_seqid, None  # a replay: the reply is cached
        if arg.lock_owner.clientid != st.client.clientid:
            raise NfsError(c.NFS4ERR_BAD_STATEID, "lock-owner of another client than the open")
        cx.client = st.client
        with state.lock:
            lock_owner = state40.owner_for(
                st.client, state40.LOCK_OWNER, bytes(arg.lock_owner.owner)
            )
        return owner, arg.open_seqid, (lock_owner, arg.lock_seqid)
    with state.lock:
        lk = state.states.get(arg.lock_stateid.other)
        if lk is None:
            raise state40.missing(state, arg.lock_stateid.other)
        if lk.kind != "lock" or lk.client.minor != c.MINOR_VERSION_40:
            raise NfsError(c.NFS4ERR_BAD_STATEID, "not a lock stateid of an NFSv4.0 client")
        cx.client = lk.client
        return state40.owner_for(lk.client, state40.LOCK_OWNER, lk.owner), arg.lock_seqid, None


def _seq_locku(cx: Compound40, a):
    state = cx.state
    with state.lock:
        lk = state.states.get(a.lock_stateid.other)
        if lk is None:
            raise state40.missing(state, a.lock_stateid.other)
        if lk.kind != "lock" or lk.client.minor != c.MINOR_VERSION_40:
            raise NfsError(c.NFS4ERR_BAD_STATEID, "not a lock stateid of an NFSv4.0 client")
        return state40.owner_for(lk.client, state40.LOCK_OWNER, lk.owner), a.seqid, None


# opnum -> sequencer(cx, args) -> (owner, seqid, (second owner, its seqid) or None)
SEQUENCERS = {
    c.OP_OPEN: _seq_open,
    c.OP_OPEN_CONFIRM: _seq_by_open_stateid,
    c.OP_OPEN_DOWNGRADE: _seq_by_open_stateid,
    c.OP_CLOSE: _seq_by_open_stateid,
    c.OP_LOCK: _seq_lock,
    c.OP_LOCKU: _seq_locku,
}

compound.MINOR_EXECUTORS[c.MINOR_VERSION_40] = execute
