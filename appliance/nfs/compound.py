"""The NFSv4.1 COMPOUND procedure: decodes operations one by one from their
declared XDR types, runs their handlers against the current/saved file
handles, enforces SEQUENCE (slot table, reply cache) and encodes the results.

Handlers are registered with ``@operation(OP_X)`` in ops_session, ops_fs and
ops_state; a handler returns the operation's resok value or raises NfsError.

A COMPOUND runs in a worker thread (blocking catalog and data work), except
that the event loop first tries small ones from the caches (``from_cache``):
read-only operations only (FROM_CACHE_OPS), inside engine.blocking's
no_blocking(). At the first operation that would need more, it stops and
returns a Handoff; the worker carries the COMPOUND on from that operation,
with the slot its SEQUENCE took and the results so far. A stat costs one thread hand-off less
(in process, nfs-rs: 0.356 -> 0.277 ms for LOOKUP+GETATTR and GETATTR)."""
from __future__ import annotations

import logging
import struct
import time
import zlib

from appliance.nfs import const as c
from appliance.nfs.attrs import AttrError, AttrSubject
from appliance.nfs.exports import ExportRule, PseudoDir, pseudo_ino
from appliance.nfs.fh import KIND_FILE, KIND_PSEUDO
from appliance.nfs.state import NfsError
from appliance.nfs.types4 import ARGS, RESULTS, STATUS_ONLY, stateid4
from appliance.nfs.xdr import Packer, String, UInt, XdrError
from engine import errors
from engine.blocking import WouldBlock, holding, no_blocking
from engine.catalog.database import CatalogUnavailable
from engine.catalog.models import DIR
from engine.namespace import Cred

log = logging.getLogger("shingle.nfs")

HANDLERS: dict = {}
_U32 = struct.Struct(">I")
_tag = String(None)
MAX_OPS = 128
CACHE_LIMIT = 256 * 1024
SESSIONLESS = frozenset({c.OP_EXCHANGE_ID, c.OP_CREATE_SESSION, c.OP_DESTROY_SESSION,
                         c.OP_BIND_CONN_TO_SESSION, c.OP_DESTROY_CLIENTID})
# Operations of NFSv4.0 only, or of features this server does not offer (pNFS, SSV, ...)
NOT_SUPPORTED = frozenset({c.OP_OPEN_CONFIRM, c.OP_RENEW, c.OP_SETCLIENTID, c.OP_SETCLIENTID_CONFIRM,
                           c.OP_RELEASE_LOCKOWNER, c.OP_OPENATTR, c.OP_DELEGPURGE, c.OP_GET_DIR_DELEGATION,
                           c.OP_GETDEVICEINFO, c.OP_GETDEVICELIST, c.OP_LAYOUTCOMMIT, c.OP_LAYOUTGET,
                           c.OP_LAYOUTRETURN, c.OP_SET_SSV, c.OP_WANT_DELEGATION})
# What the event loop may run from the caches (READ from fragments already read): nothing here
# changes state but the SEQUENCE slot
FROM_CACHE_OPS = frozenset({c.OP_SEQUENCE, c.OP_PUTFH, c.OP_PUTROOTFH, c.OP_PUTPUBFH, c.OP_GETFH, c.OP_SAVEFH,
                            c.OP_RESTOREFH, c.OP_LOOKUP, c.OP_LOOKUPP, c.OP_GETATTR, c.OP_ACCESS, c.OP_READ})
# (not VERIFY/NVERIFY: decoding an owner name may read /etc/passwd)
ANONYMOUS_OTHER = b"\0" * 12
PSEUDO_CRED = Cred(65534, 65534)
BYPASS_OTHER = b"\xff" * 12


def operation(opnum: int):
    def register(fn):
        HANDLERS[opnum] = fn
        return fn
    return register


class Node:
    """A current or saved file handle: a pseudo-root directory or a file of an export."""

    __slots__ = ("export", "ino", "generation", "pseudo", "_fh")

    def __init__(self, export: ExportRule | None, ino: int, generation: int = 1,
                 pseudo: PseudoDir | None = None, fh: bytes | None = None):
        self.export, self.ino, self.generation, self.pseudo, self._fh = export, ino, generation, pseudo, fh


class PseudoAttr:
    """Attributes of a pseudo-root directory (read-only, owned by root)."""

    __slots__ = ("ino", "type", "mode", "uid", "gid", "size", "nlink", "rdev",
                 "atime_ns", "mtime_ns", "ctime_ns", "btime_ns", "change")

    def __init__(self, node: PseudoDir, boot_ns: int, generation: int):
        self.ino, self.type, self.mode, self.uid, self.gid = node.ino, DIR, 0o555, 0, 0
        self.size, self.nlink, self.rdev = 4096, 2 + len(node.children), 0
        self.atime_ns = self.mtime_ns = self.ctime_ns = self.btime_ns = boot_ns
        self.change = generation


class Replay(Exception):
    def __init__(self, chunks):
        super().__init__("replay")
        self.chunks = chunks


class Compound:
    """Per-COMPOUND context handed to every operation handler."""

    def __init__(self, server, conn_state: dict, rpc_cred, address: str):
        self.server = server
        self.ns = server.namespace
        self.state = server.state
        self.conn_state = conn_state
        self.rpc_cred = rpc_cred
        self.address = address
        self.cur: Node | None = None
        self.saved: Node | None = None
        self.cur_stateid = None
        self.saved_stateid = None
        self.session = None
        self.slot = None
        self.client = None
        self._creds: dict = {}

    # -- identities ---------------------------------------------------------------
    def cred(self, node: Node):
        export = node.export
        if export is None:  # the pseudo-root is read-only: nobody needs more than "nobody"
            return PSEUDO_CRED
        key = export.id
        cred = self._creds.get(key)
        if cred is None:
            r = self.rpc_cred
            cred = export.cred(r.uid, r.gid, r.gids)
            self._creds[key] = cred
        return cred

    def need_client(self):
        if self.client is None:
            raise NfsError(c.NFS4ERR_OP_NOT_IN_SESSION, "no SEQUENCE in this COMPOUND")
        return self.client

    # -- file handles -----------------------------------------------------------------
    def need_fh(self) -> Node:
        if self.cur is None:
            raise NfsError(c.NFS4ERR_NOFILEHANDLE, "no current file handle")
        return self.cur

    def need_file(self) -> Node:
        node = self.need_fh()
        if node.pseudo is not None:
            raise NfsError(c.NFS4ERR_ISDIR, "the pseudo-root holds only directories")
        return node

    def need_writable(self, node: Node) -> None:
        if node.pseudo is not None or node.export.read_only:
            raise NfsError(c.NFS4ERR_ROFS, "read-only export")

    def fh_of(self, node: Node) -> bytes:
        if node._fh is None:
            codec = self.server.handles
            if node.pseudo is not None:
                node._fh = codec.pack(KIND_PSEUDO, 0, node.pseudo.ino, 0)
            else:
                node._fh = codec.pack(KIND_FILE, node.export.id, node.ino, node.generation)
        return node._fh

    def node_for_export(self, rule: ExportRule) -> Node:
        if not rule.allows(self.address):
            raise NfsError(c.NFS4ERR_ACCESS, f"export {rule.name} does not admit client {self.address}")
        attr = self.ns.getattr(rule.root_ino)
        return Node(rule, rule.root_ino, attr.generation)

    def root_node(self) -> Node:
        exports = self.server.exports
        if exports.root_export is not None:
            return self.node_for_export(exports.root_export)
        return Node(None, exports.root.ino, 0, pseudo=exports.root)

    def node_from_fh(self, data) -> Node:
        from appliance.nfs.fh import BadHandle, StaleHandle
        try:
            fh = self.server.handles.unpack(data)
        except BadHandle as exc:
            raise NfsError(c.NFS4ERR_BADHANDLE, str(exc)) from None
        except StaleHandle as exc:
            raise NfsError(c.NFS4ERR_STALE, str(exc)) from None
        exports = self.server.exports
        if fh.kind == KIND_PSEUDO:
            node = exports.pseudo_by_ino.get(fh.ino)
            if node is None:
                raise NfsError(c.NFS4ERR_STALE, "pseudo directory no longer exported")
            return Node(None, node.ino, 0, pseudo=node, fh=bytes(data))
        rule = exports.by_id.get(fh.export_id)
        if rule is None:
            raise NfsError(c.NFS4ERR_STALE, f"export {fh.export_id} no longer exists")
        if not rule.allows(self.address):
            raise NfsError(c.NFS4ERR_ACCESS, f"export {rule.name} does not admit client {self.address}")
        attr = self.ns.getattr(fh.ino)  # StaleHandle -> NFS4ERR_STALE
        if attr.generation != fh.generation:
            raise NfsError(c.NFS4ERR_STALE, f"inode {fh.ino} generation {attr.generation}, handle {fh.generation}")
        return Node(rule, fh.ino, fh.generation, fh=bytes(data))

    # -- attributes -----------------------------------------------------------------------
    def subject(self, node: Node, attr=None) -> AttrSubject:
        server = self.server
        if node.pseudo is not None:
            attr = PseudoAttr(node.pseudo, server.boot_ns, server.exports_generation)
            return AttrSubject(attr, self.fh_of(node), (server.handles.fsid, 0), attr.ino, server)
        if attr is None:
            attr = self.ns.getattr(node.ino)
        mounted_on = attr.ino
        if attr.ino == node.export.root_ino:
            mounted_on = pseudo_ino(node.export.parts)
        return AttrSubject(attr, self.fh_of(node), (server.handles.fsid, node.export.id), mounted_on, server)

    # -- stateids ----------------------------------------------------------------------------
    def stateid(self, sid):
        """The stateid an operation names, resolving the 4.1 "current stateid"."""
        if sid.other == ANONYMOUS_OTHER and sid.seqid == 1:
            if self.cur_stateid is None:
                raise NfsError(c.NFS4ERR_BAD_STATEID, "current stateid used but none is set")
            return self.cur_stateid
        return sid

    @staticmethod
    def is_special(sid) -> bool:
        return sid.other == ANONYMOUS_OTHER or sid.other == BYPASS_OTHER

    def set_stateid(self, st) -> object:
        sid = stateid4.cls(st.seqid, st.other)
        self.cur_stateid = sid
        return sid


def _fingerprint(cred, record, pos) -> tuple:
    n = len(record) - pos
    if n <= 65536:
        return (cred.uid, cred.gid, n, zlib.crc32(memoryview(record)[pos:]))
    return (cred.uid, cred.gid, n, zlib.crc32(memoryview(record)[pos:pos + 4096]))


def _fs_status(exc: Exception) -> int:
    if isinstance(exc, errors.FsError):
        return c.ERRNO_TO_NFS4.get(exc.errno, c.NFS4ERR_IO)
    if isinstance(exc, AttrError):
        return exc.status
    if isinstance(exc, CatalogUnavailable):
        return c.NFS4ERR_DELAY
    if isinstance(exc, OSError):
        return c.ERRNO_TO_NFS4.get(exc.errno, c.NFS4ERR_IO)
    return c.NFS4ERR_SERVERFAULT


def _reply_head(status: int, tag: bytes, count: int) -> bytearray:
    p = Packer()
    p.buf += _U32.pack(status)
    _tag.pack(p, tag)
    p.buf += _U32.pack(count)
    return p.buf


def execute(server, conn_state: dict, rpc_cred, address: str, record, pos: int, *, from_cache: bool = False):
    """Run one COMPOUND; returns the reply body chunks (after the RPC header).

    ``from_cache``: the event loop's attempt (see the module docstring); returns a Handoff
    instead of blocking, for ``resume``."""
    run = _start(server, conn_state, rpc_cred, address, record, pos)
    if not isinstance(run, _Run):
        return run  # an error in the COMPOUND's header: the reply
    if not from_cache:
        return _run(run, record, False)
    try:
        with no_blocking():
            return _run(run, record, True)
    except _Stop:
        return Handoff(run)


def resume(handoff: "Handoff", record) -> list:
    """In a worker: carry a handed-off COMPOUND on from the operation where the attempt stopped."""
    return _run(handoff.run, record, False)


class Handoff:
    """What a from-cache attempt returns when a worker must finish the COMPOUND: the run so far
    (its SEQUENCE holds the slot, the operations before the one that stopped are answered)."""

    __slots__ = ("run",)

    def __init__(self, run):
        self.run = run


class _Stop(Exception):
    """A from-cache attempt gives up at the current operation."""


class _Run:
    """A COMPOUND under way: where decoding stands and what is answered so far."""

    __slots__ = ("cx", "tag", "count", "index", "pos", "body_start", "p", "done", "cache", "counted")

    def __init__(self, cx, tag, count, pos):
        self.cx, self.tag, self.count, self.index, self.pos, self.body_start = cx, tag, count, 0, pos, pos
        self.p = Packer()
        self.done = 0
        self.cache = False
        self.counted = []  # op metrics, added once the COMPOUND is answered


def _start(server, conn_state, rpc_cred, address, record, pos):
    """The COMPOUND's header: a _Run, or the reply chunks of a header error."""
    try:
        (tag, minor), pos = _head(record, pos)
    except XdrError:
        return [bytes(_reply_head(c.NFS4ERR_BADXDR, b"", 0))]
    tag = bytes(tag)
    if minor != c.MINOR_VERSION:
        return [bytes(_reply_head(c.NFS4ERR_MINOR_VERS_MISMATCH, tag, 0))]
    try:
        count, pos = UInt.unpack(record, pos)
    except XdrError:
        return [bytes(_reply_head(c.NFS4ERR_BADXDR, tag, 0))]
    if count > (len(record) - pos) // 4:
        return [bytes(_reply_head(c.NFS4ERR_BADXDR, tag, 0))]
    return _Run(Compound(server, conn_state, rpc_cred, address), tag, count, pos)


def _run(run: _Run, record, from_cache: bool) -> list:
    """Decode and run the operations from ``run.index`` on. From the cache, an operation that
    would wait raises _Stop before it changed anything: ``run`` then starts again with it."""
    cx, p = run.cx, run.p
    status = c.NFS4_OK  # a from-cache attempt stops only while every answer so far is OK
    handed_off = False
    try:
        while run.index < run.count:
            index, pos = run.index, run.pos
            try:
                opnum, pos = UInt.unpack(record, pos)
                if log.isEnabledFor(logging.DEBUG):
                    log.debug("op %s", c.OP_NAMES.get(opnum, opnum))
            except XdrError:
                opnum, status = c.OP_ILLEGAL, c.NFS4ERR_BADXDR
                _emit(p, c.OP_ILLEGAL, status, None)
                run.done += 1
                break
            if from_cache and opnum not in FROM_CACHE_OPS:
                raise _Stop()
            if opnum not in ARGS and opnum not in NOT_SUPPORTED:
                status = c.NFS4ERR_OP_ILLEGAL
                _emit(p, c.OP_ILLEGAL, status, None)
                run.done += 1
                break
            if opnum in NOT_SUPPORTED:
                status = c.NFS4ERR_NOTSUPP
            else:
                try:
                    args, pos = ARGS[opnum].unpack(record, pos)
                except XdrError as exc:
                    log.debug("BADXDR in %s: %s", c.OP_NAMES.get(opnum), exc)
                    status = c.NFS4ERR_BADXDR
                    args = None
            if status != c.NFS4_OK:
                _emit(p, opnum, status, None)
                run.done += 1
                break
            # session rules (RFC 8881 2.10.6 and 18.46)
            if index == 0:
                if opnum == c.OP_SEQUENCE:
                    try:
                        value = _sequence(cx, args, run.count, _fingerprint(cx.rpc_cred, record, run.body_start))
                    except Replay as replay:
                        return replay.chunks
                    except WouldBlock:
                        raise _Stop() from None
                    except NfsError as exc:
                        status = exc.status
                        log.debug("SEQUENCE: status %d: %s", status, exc)
                        _emit(p, opnum, status, None)
                        run.done += 1
                        break
                    run.cache = True
                    _emit(p, opnum, c.NFS4_OK, value)
                    run.done += 1
                    run.index, run.pos = index + 1, pos
                    continue
                if opnum not in SESSIONLESS:
                    status = c.NFS4ERR_OP_NOT_IN_SESSION
                elif run.count > 1:
                    status = c.NFS4ERR_NOT_ONLY_OP
            elif opnum == c.OP_SEQUENCE:
                status = c.NFS4ERR_SEQUENCE_POS
            if status != c.NFS4_OK:
                _emit(p, opnum, status, None)
                run.done += 1
                break
            handler = HANDLERS.get(opnum)
            try:
                if handler is None:
                    raise NfsError(c.NFS4ERR_NOTSUPP, f"{c.OP_NAMES.get(opnum)} not implemented")
                value = handler(cx, args)
            except WouldBlock:  # only read-only operations run from the cache: nothing to undo
                raise _Stop() from None
            except NfsError as exc:
                run.counted.append(_OP_METRIC[opnum])
                status = exc.status
                log.debug("%s: status %d: %s", c.OP_NAMES.get(opnum), status, exc)
                _emit(p, opnum, status, exc.payload)
                run.done += 1
                break
            except Exception as exc:  # noqa: BLE001 - every failure becomes a status, never a dead connection
                run.counted.append(_OP_METRIC[opnum])
                status = _fs_status(exc)
                if status == c.NFS4ERR_SERVERFAULT:
                    log.exception("%s failed", c.OP_NAMES.get(opnum))
                else:
                    log.debug("%s: %s", c.OP_NAMES.get(opnum), exc)
                _emit(p, opnum, status, None)
                run.done += 1
                break
            run.counted.append(_OP_METRIC[opnum])
            _emit(p, opnum, c.NFS4_OK, value)
            run.done += 1
            run.index, run.pos = index + 1, pos
    except _Stop:
        handed_off = True
        raise
    finally:
        if not handed_off:  # a handed-off COMPOUND keeps its slot busy for the worker
            if log.isEnabledFor(logging.DEBUG):
                log.debug("COMPOUND of %d ops, %d done, status %d", run.count, run.done, status)
            counters = cx.server.counters
            for metric in run.counted:
                counters.op(metric)
            chunks = [bytes(_reply_head(status, run.tag, run.done)), *p.result()]
            if cx.slot is not None:
                slot = cx.slot
                slot.reply = chunks if run.cache and p.size <= CACHE_LIMIT else None
                slot.busy = False
    return chunks


_OP_METRIC = {opnum: name.lower() for opnum, name in c.OP_NAMES.items()}


def _head(record, pos):
    tag, pos = _tag_opaque.unpack(record, pos)
    minor, pos = UInt.unpack(record, pos)
    return (tag, minor), pos


from appliance.nfs.xdr import Opaque as _Opaque  # noqa: E402

_tag_opaque = _Opaque(1024, "utf8str_cs tag")


def _emit(p: Packer, opnum: int, status: int, value) -> None:
    p.buf += _U32.pack(opnum)
    rtype = RESULTS.get(opnum, STATUS_ONLY)
    if opnum == c.OP_SETATTR:
        rtype.pack(p, (status, value if value is not None else []))
    elif status == c.NFS4_OK or value is not None:
        rtype.pack(p, (status, value))
    else:
        p.buf += _U32.pack(status)


def _sequence(cx: Compound, a, count: int, fingerprint):
    state = cx.state
    # the event loop must not wait for a worker that holds the state lock across catalog work
    with holding(state.lock, "state lock held"):
        sess = state.session(a.sessionid)
        if count > sess.max_ops:
            raise NfsError(c.NFS4ERR_TOO_MANY_OPS, f"{count} operations, session allows {sess.max_ops}")
        if a.slotid >= len(sess.slots):
            raise NfsError(c.NFS4ERR_BADSLOT, f"slot {a.slotid} of {len(sess.slots)}")
        slot = sess.slots[a.slotid]
        if slot.seqid is None:
            slot.seqid = (a.sequenceid - 1) & 0xFFFFFFFF  # first request after a restart
        reuse = False
        if a.sequenceid == slot.seqid:
            if slot.busy:
                raise NfsError(c.NFS4ERR_DELAY, "retry of a request still running")
            if slot.fingerprint == fingerprint:
                if slot.reply is None:
                    raise NfsError(c.NFS4ERR_RETRY_UNCACHED_REP, "reply was not cached")
                raise Replay(slot.reply)  # a genuine retransmit: answered exactly once
            # Same slot and seqid, different request: not a retransmit. nfs-rs 0.8.7 does
            # this after dropping in-flight READs at EOF and fails on SEQ_FALSE_RETRY (which
            # RFC 8881 allows, not requires), so the request runs as a new one.
            reuse = True
        if not reuse and a.sequenceid != (slot.seqid + 1) & 0xFFFFFFFF:
            raise NfsError(c.NFS4ERR_SEQ_MISORDERED, f"slot {a.slotid} seqid {a.sequenceid}, expected "
                                                     f"{(slot.seqid + 1) & 0xFFFFFFFF}")
        slot.busy = True
        slot.seqid = a.sequenceid
        slot.reply = None
        slot.fingerprint = fingerprint
        cx.session, cx.slot, cx.client = sess, slot, sess.client
        sess.client.last_renew = time.monotonic()
        highest = len(sess.slots) - 1
        from appliance.nfs.types4 import RESULTS as R
        return R[c.OP_SEQUENCE].arms[c.NFS4_OK].cls(sess.id, a.sequenceid, a.slotid, highest, highest, 0)


# handlers register themselves on import
from appliance.nfs import ops_fs, ops_session, ops_state  # noqa: E402,F401
