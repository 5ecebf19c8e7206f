"""The NFSv4.1 COMPOUND procedure: decodes operations one by one from their
declared XDR types, runs their handlers (appliance.nfs.v4.registry) against the
current/saved file handles, enforces SEQUENCE (slot table, reply cache) and encodes
the results.

A COMPOUND runs in a worker thread (blocking catalog and data work), except
that the event loop first tries small ones from the caches (``from_cache``):
the operations the registry marks ``from_cache`` (read-only ones, an UNSTABLE WRITE into
the file's buffer, a COMMIT that finds nothing to flush), inside engine.base.blocking's
no_blocking(). At the first operation that would need more, it stops and returns
a Handoff; the worker carries the COMPOUND on from that operation, with the slot
its SEQUENCE took and the results so far. A stat costs one thread hand-off less
(in process, nfs-rs: 0.356 -> 0.277 ms for LOOKUP+GETATTR and GETATTR).

NFSv4.2 (RFC 7862) is NFSv4.1 plus operations and attributes: this executor runs minor versions
1 and 2 under the same session rules, and a minor 1 COMPOUND gets NFS4ERR_OP_ILLEGAL for an
operation only 4.2 defines. A COMPOUND of another minor version goes to the executor registered
for it in ``MINOR_EXECUTORS`` (NFSv4.0: appliance.nfs.v4.compound40), always in a worker."""

from __future__ import annotations

import functools
import logging
import struct
import time
import zlib

from appliance.nfs.access import log_failure, status_of
from appliance.nfs.onc.xdr import Opaque, Packer, String, UInt, XdrError
from appliance.nfs.state import NfsError
from appliance.nfs.v4 import const as c
from appliance.nfs.v4.backchannel import restored_backchannel
from appliance.nfs.v4.context import CODES, Compound
from appliance.nfs.v4.registry import TABLE, Op
from appliance.nfs.v4.types import ARGS, RESULTS, STATUS_ONLY
from engine.base.blocking import WouldBlock, holding, no_blocking

log = logging.getLogger("shingle.nfs")

_U32 = struct.Struct(">I")
_tag = String(None)
_tag_opaque = Opaque(1024, "utf8str_cs tag")
_SEQUENCE_OK = RESULTS[c.OP_SEQUENCE].arms[c.NFS4_OK]
# the most a slot keeps of a reply (ca_maxresponsesize_cached): each slot reserves it in the
# budget, so it stays small (knfsd: about 2 KiB; nfs-rs asks 4 KiB, a COMPOUND that changes
# something answers in less than 1 KiB)
CACHE_LIMIT = 4096
MINOR_VERSIONS = (c.MINOR_VERSION, c.MINOR_VERSION_42)


# minor version -> executor(server, conn_state, rpc_cred, address, tag, record, pos) -> chunks,
# pos just after the minor version; registered by the module that implements it
MINOR_EXECUTORS: dict = {}


class Replay(Exception):
    def __init__(self, chunks):
        super().__init__("replay")
        self.chunks = chunks


def _fingerprint(cred, record, pos) -> tuple:
    """(who, what) of a COMPOUND, which a retry on its slot must match (RFC 8881 2.10.6.1.3.1).
    Who: the whole RPC credential, so that two principals mapped to one uid (two unmapped
    Kerberos names, two AUTH_SYS callers of one uid with other groups) are told apart. What: the
    operations' length and CRC (of the first 4 KiB past 64 KiB: a WRITE's data is not hashed)."""
    who = (cred.flavor, cred.sec, cred.uid, cred.gid, cred.gids, cred.principal)
    n = len(record) - pos
    if n <= 65536:
        return who, (n, zlib.crc32(memoryview(record)[pos:]))
    return who, (n, zlib.crc32(memoryview(record)[pos : pos + 4096]))


def reply_head(status: int, tag: bytes, count: int) -> bytearray:
    """The COMPOUND4res head: status, tag, the number of results that follow."""
    p = Packer()
    p.buf += _U32.pack(status)
    _tag.pack(p, tag)
    p.buf += _U32.pack(count)
    return p.buf


def execute(
    server, conn_state: dict, rpc_cred, address: str, record, pos: int, *, from_cache: bool = False
):
    """Run one COMPOUND; returns the reply body chunks (after the RPC header).

    ``from_cache``: the event loop's attempt (see the module docstring); returns a Handoff
    instead of blocking, for ``resume``."""
    run = _start(server, conn_state, rpc_cred, address, record, pos)
    if not isinstance(run, _Run):
        if callable(run):  # another minor version's COMPOUND: in a worker
            return Handoff(run) if from_cache else run()
        return run  # an error in the COMPOUND's header: the reply
    if not from_cache:
        return _run(run, record, False)
    try:
        with no_blocking():
            return _run(run, record, True)
    except _Stop:
        return Handoff(run)


def resume(handoff: Handoff, record) -> list:
    """In a worker: carry a handed-off COMPOUND on from the operation where the attempt stopped."""
    if not isinstance(handoff.run, _Run):
        return handoff.run()
    return _run(handoff.run, record, False)


class Handoff:
    """What a from-cache attempt returns when a worker must finish the COMPOUND: the run so far
    (its SEQUENCE holds the slot, the operations before the one that stopped are answered), or
    the call that runs a COMPOUND of another minor version."""

    __slots__ = ("run",)

    def __init__(self, run):
        self.run = run


class _Stop(Exception):
    """A from-cache attempt gives up at the current operation."""


class _Run:
    """A COMPOUND under way: where decoding stands and what is answered so far."""

    __slots__ = (
        "cx",
        "tag",
        "count",
        "index",
        "pos",
        "body_start",
        "p",
        "done",
        "mutated",
        "uncached",
        "counted",
    )

    def __init__(self, cx, tag, count, pos):
        self.cx, self.tag, self.count, self.index = cx, tag, count, 0
        self.pos = self.body_start = pos
        self.p = Packer()
        self.done = 0
        self.mutated = False  # an operation that changes something was run
        self.uncached = False  # a retry of a request whose reply was not kept
        self.counted = []  # (op metric, seconds, file handle), added once the COMPOUND is answered


def _start(server, conn_state, rpc_cred, address, record, pos):
    """The COMPOUND's header: a _Run, or the reply chunks of a header error."""
    try:
        (tag, minor), pos = _head(record, pos)
    except XdrError:
        return [bytes(reply_head(c.NFS4ERR_BADXDR, b"", 0))]
    tag = bytes(tag)
    if minor not in MINOR_VERSIONS:
        other = MINOR_EXECUTORS.get(minor)
        if other is None:
            return [bytes(reply_head(c.NFS4ERR_MINOR_VERS_MISMATCH, tag, 0))]
        return functools.partial(other, server, conn_state, rpc_cred, address, tag, record, pos)
    try:
        count, pos = UInt.unpack(record, pos)
    except XdrError:
        return [bytes(reply_head(c.NFS4ERR_BADXDR, tag, 0))]
    if count > (len(record) - pos) // 4:
        return [bytes(reply_head(c.NFS4ERR_BADXDR, tag, 0))]
    cx = Compound(server, conn_state, rpc_cred, address)
    cx.minor = minor
    return _Run(cx, tag, count, pos)


def _run(run: _Run, record, from_cache: bool) -> list:
    """Decode and run the operations from ``run.index`` on. From the cache, an operation that
    would wait raises _Stop before it changed anything: ``run`` then starts again with it."""
    cx, p = run.cx, run.p
    status = c.NFS4_OK  # a from-cache attempt stops only while every answer so far is OK
    handed_off = False
    try:
        while status == c.NFS4_OK and run.index < run.count:
            status = _step(run, record, from_cache)
    except Replay as replay:
        return replay.chunks
    except _Stop:
        handed_off = True
        raise
    finally:
        if not handed_off:  # a handed-off COMPOUND keeps its slot busy for the worker
            if log.isEnabledFor(logging.DEBUG):
                log.debug("COMPOUND of %d ops, %d done, status %d", run.count, run.done, status)
            cx.server.counters.ops_done(run.counted)
            chunks = [bytes(reply_head(status, run.tag, run.done)), *p.result()]
            if cx.slot is not None:
                _settle(run, chunks)
    return chunks


def _settle(run: _Run, chunks: list) -> None:
    """The COMPOUND holding the slot is answered: keep what a retry of it gets (RFC 8881
    2.10.6.1.3). One that changed nothing keeps nothing: its retry runs again, as the original
    could have run then (a READ's data is never kept). One that changed something keeps its
    reply, asked to (sa_cachethis) or not, when it fits the session's cached-reply size and
    the server's budget (appliance.nfs.state.replies); else its retry gets
    NFS4ERR_RETRY_UNCACHED_REP."""
    cx = run.cx
    slot = cx.slot
    keep = run.mutated and run.p.size <= cx.cache_room
    cx.state.slot_replies.keep(slot, chunks if keep else None)
    slot.rerun = not run.mutated
    slot.busy = False  # last: a retry finds the slot busy or its outcome settled


def _step(run: _Run, record, from_cache: bool) -> int:
    """Decode and run the operation at ``run.index``, its result into ``run.p``; its status
    (the COMPOUND goes on only after NFS4_OK). Raises _Stop when a worker must run it, Replay
    when the COMPOUND's SEQUENCE finds a retransmit."""
    pos = run.pos
    if pos + 4 > len(record):
        return _answer(run, c.OP_ILLEGAL, c.NFS4ERR_BADXDR)
    opnum = _U32.unpack_from(record, pos)[0]
    pos += 4
    if log.isEnabledFor(logging.DEBUG):
        log.debug("op %s", c.OP_NAMES.get(opnum, opnum))
    found = _OPS_BY_MINOR[run.cx.minor].get(opnum)
    if found is None:  # unknown, or of a later minor version than the COMPOUND's
        return _answer(run, c.OP_ILLEGAL, c.NFS4ERR_OP_ILLEGAL)
    op, argtype = found
    if argtype is None:  # defined in this minor version, not run in it
        return _answer(run, opnum, c.NFS4ERR_NOTSUPP)
    if run.uncached:  # the operation after SEQUENCE, never run (RFC 8881 2.10.6.1.3)
        return _answer(run, opnum, c.NFS4ERR_RETRY_UNCACHED_REP)
    if from_cache and not op.from_cache:
        raise _Stop()
    try:
        args, pos = argtype.unpack(record, pos)
    except XdrError as exc:
        log.debug("BADXDR in %s: %s", op.name, exc)
        return _answer(run, opnum, c.NFS4ERR_BADXDR)
    if run.index == 0 or opnum == c.OP_SEQUENCE:
        if run.index == 0 and opnum == c.OP_SEQUENCE:
            status = _first_sequence(run, args, record)
        else:
            refused = _session_rule(run, op)
            status = _answer(run, opnum, refused) if refused else _call(run, op, args)
    else:  # past the first operation, anything but SEQUENCE stands where it may
        status = _call(run, op, args)
    if status == c.NFS4_OK:
        run.index, run.pos = run.index + 1, pos
    return status


def _ops_of(minor: int) -> dict:
    """opnum -> (Op, its argument type, or None where the minor version defines the operation
    and this server does not run it) for the operations a COMPOUND of ``minor`` may name: what
    _step would otherwise work out from TABLE for every operation of every COMPOUND."""
    return {
        opnum: (op, ARGS[opnum] if minor in op.minors else None)
        for opnum, op in TABLE.items()
        if op.since <= minor
    }


_OPS_BY_MINOR: dict = {}  # filled below, once the operations are registered


def _answer(run: _Run, opnum: int, status: int, value=None) -> int:
    emit_result(run.p, opnum, status, value)
    run.done += 1
    return status


def _session_rule(run: _Run, op: Op) -> int:
    """The error an operation gets where it stands in the COMPOUND, or 0 (RFC 8881 2.10.6 and
    18.46): SEQUENCE comes first, else the COMPOUND is one session-less operation alone."""
    if run.index == 0:
        if not op.sessionless:
            return c.NFS4ERR_OP_NOT_IN_SESSION
        if run.count > 1:
            return c.NFS4ERR_NOT_ONLY_OP
    elif op.opnum == c.OP_SEQUENCE:
        return c.NFS4ERR_SEQUENCE_POS
    return c.NFS4_OK


def _first_sequence(run: _Run, args, record) -> int:
    cx = run.cx
    try:
        fingerprint = _fingerprint(cx.rpc_cred, record, run.body_start)
        value, run.uncached = _sequence(cx, args, run.count, fingerprint, len(record), len(run.tag))
    except WouldBlock:
        raise _Stop() from None
    except NfsError as exc:
        log.debug("SEQUENCE: status %d: %s", exc.status, exc)
        return _answer(run, c.OP_SEQUENCE, exc.status)
    return _answer(run, c.OP_SEQUENCE, c.NFS4_OK, value)


def _call(run: _Run, op: Op, args) -> int:
    """Run the operation's handler; a result that takes the reply past what the session
    allows is taken back for the session's error."""
    cx, p = run.cx, run.p
    cur = cx.cur
    mark = (len(p.chunks), len(p.buf), p.size)  # to take a reply too big back
    started = time.perf_counter()
    if op.mutating:  # (set before it runs: one that fails may have changed something)
        run.mutated = True
    try:
        status, value = run_handler(cx, op, op.handler, args)
    except WouldBlock:  # raised before the operation changed anything: nothing to undo
        raise _Stop() from None
    if status == c.NFS4_OK and cx.cur is not cur and not op.keeps_stateid:
        cx.cur_stateid = None
    run.counted.append((OP_METRIC[op.opnum], time.perf_counter() - started, cx.cur))
    _answer(run, op.opnum, status, value)
    if status == c.NFS4_OK and len(p) > cx.reply_limit:  # ca_maxresponsesize(_cached)
        take_back(p, mark)
        status = cx.reply_too_big
        emit_result(p, op.opnum, status, None)
    return status


SECINFO_OPS = (c.OP_SECINFO, c.OP_SECINFO_NO_NAME)


def run_handler(cx: Compound, op: Op, handler, args) -> tuple[int, object]:
    """(status, resok value or error payload) of one operation's handler: every failure
    becomes a status, never a dead connection. WouldBlock passes (the from-cache attempt)."""
    try:
        if op.needs_fh:
            cur = cx.cur
            if cur is None:
                raise NfsError(c.NFS4ERR_NOFILEHANDLE, "no current file handle")
            # RFC 8881 2.6.3.1: the handle's export decides the flavours; SECINFO says which
            if (
                cur.export is not None
                and not cur.export.admits(cx.rpc_cred.sec)
                and op.opnum not in SECINFO_OPS
            ):
                raise NfsError(
                    c.NFS4ERR_WRONGSEC,
                    f"export {cur.export.name} does not allow flavour {cx.rpc_cred.sec}",
                )
        if handler is None:
            raise NfsError(c.NFS4ERR_NOTSUPP, f"{op.name} not implemented")
        return c.NFS4_OK, handler(cx, args)
    except WouldBlock:
        raise
    except NfsError as exc:
        log.debug("%s: status %d: %s", op.name, exc.status, exc)
        return exc.status, exc.payload
    except Exception as exc:  # noqa: BLE001 - every failure becomes a status, never a dead connection
        status = status_of(exc, CODES)
        log_failure(CODES, status, op.name, cx.address, exc)
        return status, None


def take_back(p: Packer, mark: tuple) -> None:
    """Undo what was packed into ``p`` since ``mark`` (a READ's data went in as a chunk of its
    own, and the bytes before it were flushed into one)."""
    nchunks, nbuf, size = mark
    if len(p.chunks) > nchunks:
        p.buf = bytearray(p.chunks[nchunks][:nbuf])
        del p.chunks[nchunks:]
    else:
        del p.buf[nbuf:]
    p.size = size


OP_METRIC = {opnum: name.lower() for opnum, name in c.OP_NAMES.items()}


def _head(record, pos):
    tag, pos = _tag_opaque.unpack(record, pos)
    minor, pos = UInt.unpack(record, pos)
    return (tag, minor), pos


def emit_result(p: Packer, opnum: int, status: int, value) -> None:
    """One operation's result (nfs_resop4) into ``p``."""
    p.buf += _U32.pack(opnum)
    rtype = RESULTS.get(opnum, STATUS_ONLY)
    if opnum == c.OP_SETATTR:
        rtype.pack(p, (status, value if value is not None else []))
    elif status == c.NFS4_OK or value is not None:
        rtype.pack(p, (status, value))
    else:
        p.buf += _U32.pack(status)


# RPC reply header (AUTH_NONE verifier) and COMPOUND4res head without the tag, before the results
_REPLY_OVERHEAD = 24 + 12
_SEQUENCE_REPLY = 44


def reply_room(limit: int, tag_len: int) -> int:
    """What the results may take of a reply of at most ``limit`` bytes, RPC header included."""
    return limit - (_REPLY_OVERHEAD + tag_len + (-tag_len & 3))


def _retry_uncached(slot, a, fingerprint, retries) -> bool:
    """Whether the request on ``slot`` is the retry of one whose reply was not kept and that
    changed something. Raises Replay for a retry whose reply was kept, NfsError for a request
    the slot refuses; False: the request runs (a new one, or the retry of one that changed
    nothing, which runs again: RFC 8881 2.10.6.1.3). ``retries`` counts the retries met."""
    if slot.seqid is None:
        slot.seqid = (a.sequenceid - 1) & 0xFFFFFFFF  # first request after a restart
    if a.sequenceid == slot.seqid:
        if slot.busy:  # RFC 8881 2.10.6.2: the original's reply is still to come
            retries["delayed"] += 1
            raise NfsError(c.NFS4ERR_DELAY, "retry of a request still running")
        if slot.fingerprint is None:  # a slot that never ran a request (seqid 0)
            return False
        who, what = slot.fingerprint
        if who != fingerprint[0]:
            # Another principal's request: never its reply, nor a run in its place (RFC 8881
            # 2.10.6.1.3.1 names this case; knfsd checks it alone)
            retries["false"] += 1
            raise NfsError(c.NFS4ERR_SEQ_FALSE_RETRY, f"slot {a.slotid}: another principal")
        if what == fingerprint[1]:
            if slot.reply is not None:
                retries["replayed"] += 1
                raise Replay(slot.reply)  # a genuine retransmit: answered exactly once
            retries["rerun" if slot.rerun else "uncached"] += 1
            return not slot.rerun
        if not slot.rerun:  # other operations or arguments than a request that changed something
            retries["false"] += 1
            raise NfsError(c.NFS4ERR_SEQ_FALSE_RETRY, f"slot {a.slotid}: other arguments")
        # Same principal, other arguments than a request that changed nothing: nfs-rs 0.8.7
        # does this after dropping in-flight READs at EOF and fails on SEQ_FALSE_RETRY (which
        # RFC 8881 allows, not requires), so it runs as a new request: nothing was kept to
        # give away, and the one before left nothing a retry could repeat.
        retries["reused"] += 1
        return False
    if slot.busy:  # the client did not wait for the reply (knfsd answers the same)
        raise NfsError(c.NFS4ERR_SEQ_MISORDERED, f"slot {a.slotid} is in use")
    if a.sequenceid != (slot.seqid + 1) & 0xFFFFFFFF:
        raise NfsError(
            c.NFS4ERR_SEQ_MISORDERED,
            f"slot {a.slotid} seqid {a.sequenceid}, expected {(slot.seqid + 1) & 0xFFFFFFFF}",
        )
    return False


def _sequence(cx: Compound, a, count: int, fingerprint, size: int, tag_len: int):
    """SEQUENCE's result, and whether the COMPOUND is the retry of one whose reply was not kept
    (its next operation answers NFS4ERR_RETRY_UNCACHED_REP, and the slot is not taken)."""
    state = cx.state
    # the event loop must not wait for a worker that holds the state lock across catalog work
    with holding(state.lock, "state lock held"):
        sess = state.session(a.sessionid)
        if count > sess.max_ops:
            raise NfsError(
                c.NFS4ERR_TOO_MANY_OPS, f"{count} operations, session allows {sess.max_ops}"
            )
        if size > sess.max_request:
            raise NfsError(
                c.NFS4ERR_REQ_TOO_BIG, f"request of {size} bytes, session allows {sess.max_request}"
            )
        # what the results may take (RFC 8881 2.10.6.4): sa_cachethis asks for a cached reply
        if a.cachethis:
            limit, too_big = sess.max_cached, c.NFS4ERR_REP_TOO_BIG_TO_CACHE
        else:
            limit, too_big = sess.max_response, c.NFS4ERR_REP_TOO_BIG
        limit = reply_room(limit, tag_len)
        if limit < _SEQUENCE_REPLY:
            raise NfsError(too_big, f"a reply of at most {limit} bytes holds no SEQUENCE")
        if a.slotid >= len(sess.slots):
            raise NfsError(c.NFS4ERR_BADSLOT, f"slot {a.slotid} of {len(sess.slots)}")
        slot = sess.slots[a.slotid]
        uncached = _retry_uncached(slot, a, fingerprint, state.slot_replies.retries)
        if not uncached:
            slot.busy = True
            slot.seqid = a.sequenceid
            slot.fingerprint = fingerprint
            state.slot_replies.keep(slot, None)  # the previous reply goes
            cx.session, cx.slot, cx.client = sess, slot, sess.client
            cx.reply_limit, cx.reply_too_big = limit, too_big
            cx.cache_room = reply_room(sess.max_cached, tag_len)
        sess.client.last_renew = time.monotonic()
        highest = len(sess.slots) - 1
        cl = sess.client
        # a session that outlived a restart: the client must reclaim its opens and locks
        # (RFC 8881 section 18.46.3) until its RECLAIM_COMPLETE
        flags = c.SEQ4_STATUS_RESTART_RECLAIM_NEEDED if cl.reclaim_needed else 0
        if cl.revoked:  # until the client frees them (FREE_STATEID)
            flags |= c.SEQ4_STATUS_RECALLABLE_STATE_REVOKED
        back = sess.backchannel or restored_backchannel(sess, cx.minor)
        if back is not None:
            flags |= back.sequence_flags()
        ok = _SEQUENCE_OK.cls(sess.id, a.sequenceid, a.slotid, highest, highest, flags)
        return ok, uncached


_OPS_BY_MINOR.update((minor, _ops_of(minor)) for minor in MINOR_VERSIONS)
