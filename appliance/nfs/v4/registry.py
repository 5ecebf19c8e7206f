"""The NFSv4 operations, each declared once with what the COMPOUND executors need to know of it.

``TABLE`` holds one ``Op`` per operation number of NFSv4.0, 4.1 and 4.2 (RFC 7530, 8881, 7862):
the minor versions this server runs it in, its facts (below) and its handlers. The facts are
declared here; the handlers register themselves from the ops modules (appliance.nfs.v4.ops)
with ``@operation(OP_X)`` (NFSv4.1 and 4.2, and NFSv4.0 unless it has its own) and
``@operation40(OP_X)`` (NFSv4.0's version where RFC 7530 differs), so this module imports no
handler and the executors (compound, compound40) import nothing from the ops modules.

A handler gets the COMPOUND's context (appliance.nfs.v4.context.Compound) and the operation's
decoded arguments, and returns the operation's resok value or raises NfsError.

What the executors do with an operation number, in this order:
  - not in TABLE, or of a later minor version than the COMPOUND's: NFS4ERR_OP_ILLEGAL;
  - not run in the COMPOUND's minor version (``minors``; delegations, SSV, NFSv4.0's
    client ids in 4.1 ...): NFS4ERR_NOTSUPP, its arguments not decoded;
  - ``sessionless`` (NFSv4.1): may be a COMPOUND's only operation without SEQUENCE first;
    any other operation there gets NFS4ERR_OP_NOT_IN_SESSION (RFC 8881 2.10.6.1);
  - ``needs_fh``: NFS4ERR_NOFILEHANDLE without a current file handle, before the handler
    runs (as knfsd's dispatcher checks its ops' ALLOWED_WITHOUT_FH);
  - ``from_cache``: the event loop may try it from the caches (compound's module docstring);
    its handler raises WouldBlock before it changed anything when it needs more;
  - ``keeps_stateid``: changing the current file handle does not clear the current stateid
    (OPEN sets both, RESTOREFH restores both; RFC 8881 16.2.3.1.2);
  - ``mutating``: changes files, opens, locks or client records, so running it twice is not
    running it once: NFSv4.0's duplicate request cache (appliance.nfs.onc.drc) keeps the reply
    of a COMPOUND with one (NFSv4.1's sessions cache the replies their clients ask for)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from appliance.nfs.v4 import const as c


@dataclass(slots=True)
class Op:
    opnum: int
    minors: tuple[int, ...]  # the minor versions this server runs it in; () for none
    needs_fh: bool = False
    sessionless: bool = False
    from_cache: bool = False
    keeps_stateid: bool = False
    mutating: bool = False
    handler: Callable | None = None  # NFSv4.1 and 4.2's, and NFSv4.0's unless handler40
    handler40: Callable | None = None

    @property
    def name(self) -> str:
        return c.OP_NAMES[self.opnum]

    @property
    def since(self) -> int:
        """The minor version that defines the operation."""
        if self.opnum <= c.LAST_OP_40:
            return c.MINOR_VERSION_40
        return c.MINOR_VERSION if self.opnum <= c.LAST_OP_41 else c.MINOR_VERSION_42


ALL = (c.MINOR_VERSION_40, c.MINOR_VERSION, c.MINOR_VERSION_42)
V40 = (c.MINOR_VERSION_40,)  # replaced in NFSv4.1 by sessions and SEQUENCE
V41 = (c.MINOR_VERSION, c.MINOR_VERSION_42)
V42 = (c.MINOR_VERSION_42,)
NONE = ()

TABLE: dict[int, Op] = {
    op.opnum: op
    for op in (
        # NFSv4.0 (RFC 7530), and in NFSv4.1 and 4.2 unless V40
        Op(c.OP_ACCESS, ALL, needs_fh=True, from_cache=True),
        # from the cache: of an open without locks, when no inode is freed (ops/io.py)
        Op(c.OP_CLOSE, ALL, needs_fh=True, from_cache=True, mutating=True),
        # from the cache: with nothing buffered or in flight for the file
        Op(c.OP_COMMIT, ALL, needs_fh=True, from_cache=True),
        Op(c.OP_CREATE, ALL, needs_fh=True, mutating=True),
        Op(c.OP_DELEGPURGE, NONE),  # no reclaim of delegations (CLAIM_DELEGATE_PREV)
        Op(c.OP_DELEGRETURN, ALL, needs_fh=True, mutating=True),
        Op(c.OP_GETATTR, ALL, needs_fh=True, from_cache=True),
        Op(c.OP_GETFH, ALL, needs_fh=True, from_cache=True),
        Op(c.OP_LINK, ALL, needs_fh=True, mutating=True),
        Op(c.OP_LOCK, ALL, needs_fh=True, mutating=True),
        Op(c.OP_LOCKT, ALL, needs_fh=True),
        Op(c.OP_LOCKU, ALL, needs_fh=True, mutating=True),
        Op(c.OP_LOOKUP, ALL, needs_fh=True, from_cache=True),
        Op(c.OP_LOOKUPP, ALL, needs_fh=True, from_cache=True),
        # not from the cache: decoding an owner name may read /etc/passwd
        Op(c.OP_NVERIFY, ALL, needs_fh=True),
        # from the cache: without create, of a name the cache proves missing (NOENT; ops/io.py)
        Op(c.OP_OPEN, ALL, needs_fh=True, from_cache=True, keeps_stateid=True, mutating=True),
        Op(c.OP_OPENATTR, NONE),  # no named attributes
        Op(c.OP_OPEN_CONFIRM, V40, needs_fh=True, mutating=True),
        Op(c.OP_OPEN_DOWNGRADE, ALL, needs_fh=True, mutating=True),
        Op(c.OP_PUTFH, ALL, from_cache=True),
        Op(c.OP_PUTPUBFH, ALL, from_cache=True),
        Op(c.OP_PUTROOTFH, ALL, from_cache=True),
        Op(c.OP_READ, ALL, needs_fh=True, from_cache=True),  # from fragments already read
        Op(c.OP_READDIR, ALL, needs_fh=True),
        Op(c.OP_READLINK, ALL, needs_fh=True),
        Op(c.OP_REMOVE, ALL, needs_fh=True, mutating=True),
        Op(c.OP_RENAME, ALL, needs_fh=True, mutating=True),
        Op(c.OP_RENEW, V40),
        Op(c.OP_RESTOREFH, ALL, from_cache=True, keeps_stateid=True),  # needs the saved handle
        Op(c.OP_SAVEFH, ALL, needs_fh=True, from_cache=True),
        Op(c.OP_SECINFO, ALL, needs_fh=True),
        # from the cache: of mode and size only, when it changes nothing (ops/fs.py)
        Op(c.OP_SETATTR, ALL, needs_fh=True, from_cache=True, mutating=True),
        Op(c.OP_SETCLIENTID, V40, mutating=True),
        Op(c.OP_SETCLIENTID_CONFIRM, V40, mutating=True),
        Op(c.OP_VERIFY, ALL, needs_fh=True),
        # from the cache: UNSTABLE, into the file's buffer; anything more raises WouldBlock first
        Op(c.OP_WRITE, ALL, needs_fh=True, from_cache=True, mutating=True),
        Op(c.OP_RELEASE_LOCKOWNER, V40, mutating=True),
        # NFSv4.1 (RFC 8881); read delegations only (no WANT_DELEGATION, no directory ones), no SSV
        Op(c.OP_BACKCHANNEL_CTL, V41),
        Op(c.OP_BIND_CONN_TO_SESSION, V41, sessionless=True),
        Op(c.OP_EXCHANGE_ID, V41, sessionless=True, mutating=True),
        Op(c.OP_CREATE_SESSION, V41, sessionless=True, mutating=True),
        Op(c.OP_DESTROY_SESSION, V41, sessionless=True, mutating=True),
        Op(c.OP_FREE_STATEID, V41, mutating=True),
        Op(c.OP_GET_DIR_DELEGATION, NONE),
        # pNFS, FILES layout only (ops/pnfs.py); GETDEVICELIST is gone from the Linux client
        Op(c.OP_GETDEVICEINFO, V41),
        Op(c.OP_GETDEVICELIST, NONE),
        Op(c.OP_LAYOUTCOMMIT, V41, needs_fh=True, mutating=True),
        Op(c.OP_LAYOUTGET, V41, needs_fh=True, mutating=True),
        Op(c.OP_LAYOUTRETURN, V41, mutating=True),  # RETURN_ALL needs no file handle
        Op(c.OP_SECINFO_NO_NAME, V41, needs_fh=True),
        # run by the executor itself (the slot table and reply cache), first in a COMPOUND only
        Op(c.OP_SEQUENCE, V41, from_cache=True),
        Op(c.OP_SET_SSV, NONE),
        Op(c.OP_TEST_STATEID, V41),
        Op(c.OP_WANT_DELEGATION, NONE),
        Op(c.OP_DESTROY_CLIENTID, V41, sessionless=True, mutating=True),
        Op(c.OP_RECLAIM_COMPLETE, V41, mutating=True),
        # NFSv4.2 (RFC 7862, 8276); asynchronous COPY within the server (CB_OFFLOAD; ops/v42.py,
        # appliance/nfs/v4/offload.py), no inter-server COPY
        Op(c.OP_ALLOCATE, V42, needs_fh=True, mutating=True),
        Op(c.OP_COPY, V42, needs_fh=True, mutating=True),
        Op(c.OP_COPY_NOTIFY, NONE),
        Op(c.OP_DEALLOCATE, V42, needs_fh=True, mutating=True),
        Op(c.OP_IO_ADVISE, NONE),
        Op(c.OP_LAYOUTERROR, NONE),
        Op(c.OP_LAYOUTSTATS, NONE),
        Op(c.OP_OFFLOAD_CANCEL, V42, needs_fh=True, mutating=True),
        Op(c.OP_OFFLOAD_STATUS, V42, needs_fh=True),
        Op(c.OP_READ_PLUS, V42, needs_fh=True),
        Op(c.OP_SEEK, V42, needs_fh=True),
        Op(c.OP_WRITE_SAME, NONE),
        Op(c.OP_CLONE, V42, needs_fh=True, mutating=True),
        Op(c.OP_GETXATTR, V42, needs_fh=True),
        Op(c.OP_SETXATTR, V42, needs_fh=True, mutating=True),
        Op(c.OP_LISTXATTRS, V42, needs_fh=True),
        Op(c.OP_REMOVEXATTR, V42, needs_fh=True, mutating=True),
    )
}


def operation(opnum: int) -> Callable[[Callable], Callable]:
    """Register the decorated function as the handler of ``opnum`` (NFSv4.1 and 4.2)."""

    def register(fn: Callable) -> Callable:
        op = TABLE[opnum]
        if op.handler is not None:
            raise ValueError(f"operation {op.name} registered twice: {op.handler} and {fn}")
        op.handler = fn
        return fn

    return register


def operation40(opnum: int) -> Callable[[Callable], Callable]:
    """Register the decorated function as NFSv4.0's own handler of ``opnum``."""

    def register(fn: Callable) -> Callable:
        op = TABLE[opnum]
        if op.handler40 is not None:
            raise ValueError(f"NFSv4.0 operation {op.name} registered twice")
        op.handler40 = fn
        return fn

    return register
