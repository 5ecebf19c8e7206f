"""Opened files and their I/O: OPEN, OPEN_DOWNGRADE, CLOSE, READ, WRITE, COMMIT."""

from __future__ import annotations

from appliance.nfs.state import NfsError
from appliance.nfs.state import v40 as state40
from appliance.nfs.v4 import attrs as fattr
from appliance.nfs.v4 import const as c
from appliance.nfs.v4.attrs import MAX_IO, NS
from appliance.nfs.v4.context import BYPASS_OTHER, Node
from appliance.nfs.v4.ops.common import apply_attrs, check_component, cinfo, need_dir
from appliance.nfs.v4.registry import operation
from appliance.nfs.v4.types import RESULTS, stateid4
from engine.base import errors
from engine.base.blocking import WouldBlock, blocking_forbidden, holding
from engine.catalog.models import DIR, LNK, REG
from engine.namespace import R_OK, W_OK, X_OK, may

_OPEN_OK = RESULTS[c.OP_OPEN].arms[c.NFS4_OK]
_READ_OK = RESULTS[c.OP_READ].arms[c.NFS4_OK]
_WRITE_OK = RESULTS[c.OP_WRITE].arms[c.NFS4_OK]
EXCL_TIME_BITS = [c.FATTR4_TIME_ACCESS_SET, c.FATTR4_TIME_MODIFY_SET]


def _verifier_times(verf: bytes) -> tuple[int, int]:
    # the exclusive-create verifier is kept in atime/mtime (as knfsd does)
    return int.from_bytes(verf[:4], "big") * NS, int.from_bytes(verf[4:], "big") * NS


def need_regular(
    cx, attr, what: str, *, other40: int = c.NFS4ERR_INVAL, symlink40: int | None = None
) -> None:
    """Refuse a file that is not a regular one to an operation on file data (``what``: OPEN,
    READ, WRITE, LOCKT, COMMIT; LOCK names an open, which proves a regular file).

    A directory is ISDIR in every minor version. NFSv4.1 answers SYMLINK for a symbolic link
    and WRONG_TYPE for the rest (RFC 8881 15.1.2.9); NFSv4.0 has no WRONG_TYPE: its answer
    is ``other40`` (``symlink40`` for a symbolic link, when given), per operation (RFC 7530
    16.16.6, 16.23.4, 16.36.4 and Table 9)."""
    if attr.type == REG:
        return
    if attr.type == DIR:
        raise NfsError(c.NFS4ERR_ISDIR, f"{what} of a directory")
    if cx.minor == c.MINOR_VERSION_40:
        status = symlink40 if symlink40 is not None and attr.type == LNK else other40
    else:
        status = c.NFS4ERR_SYMLINK if attr.type == LNK else c.NFS4ERR_WRONG_TYPE
    raise NfsError(status, f"{what} of file type {attr.type}")


def _check_open_type(cx, attr) -> None:
    # RFC 7530 16.16.6: NFSv4.0 answers SYMLINK for every other type the client could not
    # know of ("NFS4ERR_INVAL would be inappropriate")
    need_regular(cx, attr, "OPEN", other40=c.NFS4ERR_SYMLINK)


def _open_create(cx, dnode: Node, name: str, how, also=None):
    """Create (or find) ``name`` per the createhow4 mode: (attr, created, attrset bits);
    ``also``: run in the transaction that makes the file (Namespace.create)."""
    ns = cx.ns
    cred = cx.cred(dnode)
    mode_kind, harg = how
    if mode_kind in (c.UNCHECKED4, c.GUARDED4):
        values = fattr.decode_settable(harg)
        mode = values.get(c.FATTR4_MODE, 0o644) & 0o7777
        try:
            attr = ns.create(cred, dnode.ino, name, mode, exclusive=True, also=also)
        except errors.Exists:
            if mode_kind == c.GUARDED4:
                raise
            attr = ns.lookup(cred, dnode.ino, name)
            _check_open_type(cx, attr)
            # an existing file: only a size (truncate) applies, with write permission
            if values.get(c.FATTR4_SIZE) == 0 and attr.size != 0:
                if not ns.access(cred, attr.ino, W_OK):
                    raise NfsError(c.NFS4ERR_ACCESS, "truncate needs write permission") from None
                cx.state.delegations.conflict(attr.ino, cx.client)
                attr = ns.setattr(cred, attr.ino, size=0)
                return attr, False, [c.FATTR4_SIZE]
            return attr, False, []
        node = Node(dnode.export, attr.ino, attr.generation)
        done = set(apply_attrs(cx, node, values, skip=(c.FATTR4_MODE,)))
        if c.FATTR4_MODE in values:
            done.add(c.FATTR4_MODE)
        return ns.getattr(attr.ino), True, sorted(done)
    if mode_kind in (c.EXCLUSIVE4, c.EXCLUSIVE4_1):
        if mode_kind == c.EXCLUSIVE4:
            verf, values = harg, {}
        else:
            verf, values = harg.cva_verf, fattr.decode_settable(harg.cva_attrs)
        if c.FATTR4_TIME_ACCESS_SET in values or c.FATTR4_TIME_MODIFY_SET in values:
            raise NfsError(c.NFS4ERR_INVAL, "times cannot be set by an exclusive create")
        atime, mtime = _verifier_times(verf)
        mode = values.get(c.FATTR4_MODE, 0o644) & 0o7777
        try:
            attr = ns.create(cred, dnode.ino, name, mode, exclusive=True, also=also)
        except errors.Exists:
            attr = ns.lookup(cred, dnode.ino, name)
            if attr.type == REG and attr.atime_ns == atime and attr.mtime_ns == mtime:
                return attr, False, EXCL_TIME_BITS  # a retransmitted exclusive create
            raise
        node = Node(dnode.export, attr.ino, attr.generation)
        done = set(apply_attrs(cx, node, values, skip=(c.FATTR4_MODE,)))
        attr = ns.setattr(cred, attr.ino, atime_ns=atime, mtime_ns=mtime)
        return attr, True, sorted(done | set(EXCL_TIME_BITS) | ({c.FATTR4_MODE} & set(values)))
    raise NfsError(c.NFS4ERR_INVAL, f"create mode {mode_kind}")


def check_new_lock(state, cl) -> None:
    """A non-reclaim OPEN or LOCK waits for the grace period to end and, from an NFSv4.1
    client, for its own RECLAIM_COMPLETE (RFC 8881 8.4.2.1 and 18.51.3); from an NFSv4.0
    client it ends that client's reclaim (Grace.reclaimed40)."""
    if cl.minor == c.MINOR_VERSION_40:
        state.grace.reclaimed40(cl)
    if state.grace.in_grace():
        raise NfsError(c.NFS4ERR_GRACE, "server in grace period")
    if cl.minor != c.MINOR_VERSION_40 and not cl.reclaim_complete:
        raise NfsError(c.NFS4ERR_GRACE, "no RECLAIM_COMPLETE from this client yet")


@operation(c.OP_OPEN)
def open_(cx, a):
    cl = cx.need_client()
    state = cx.state
    access = a.share_access & 0xFF
    deny = a.share_deny
    if access not in (1, 2, 3) or deny > 3:
        raise NfsError(c.NFS4ERR_INVAL, f"share access {a.share_access:#x} deny {deny}")
    claim = a.claim[0]
    on_loop = blocking_forbidden()
    if on_loop and (
        claim != c.CLAIM_NULL or a.openhow[0] != c.OPEN4_NOCREATE or state.grace.end
    ):  # (the end of the grace period writes to the catalog)
        raise WouldBlock("an OPEN that creates or reclaims, or in the grace period")
    heads, holdings = state.delegations.heads, state.holdings
    creates = a.openhow[0] == c.OPEN4_CREATE
    # before the create: a file this OPEN makes can have no other head's delegation unless
    # another process committed since (HeadDelegations.created)
    mark = heads.mark() if heads is not None and creates else None
    # several heads: a file this OPEN makes gets this head's holdings row in the transaction
    # that makes it, not in one of its own (Holdings.created)
    also = holdings.created(access, deny) if holdings is not None and creates else None
    node, attr, created, attrset, change = _open_target(cx, a, cl, on_loop, also)
    if created and mark is not None:
        heads.created(node.ino, mark)
    try:
        _check_open_type(cx, attr)
        _check_open_rights(cx, node, attr, access, checked=created or claim == c.CLAIM_PREVIOUS)
        # another client's write delegation conflicts with any open, a read one with writing
        writes = bool(access & c.OPEN4_SHARE_ACCESS_WRITE or deny & c.OPEN4_SHARE_DENY_READ)
        state.delegations.conflict(node.ino, cl, write=writes)
        st = state.shares.open(
            cl, bytes(a.owner.owner), node.ino, access, deny, reclaim=claim == c.CLAIM_PREVIOUS
        )
    except BaseException:
        if created and holdings is not None:
            holdings.changed(node.ino)  # the row written with the file holds nothing now
        raise
    cx.cur = node
    sid = cx.set_stateid(st)
    if change is None:
        now = cx.ns.getattr(node.ino).change
        change = cinfo(now, now)
    return _OPEN_OK.cls(
        sid,
        change,
        c.OPEN4_RESULT_LOCKTYPE_POSIX,
        fattr.to_bitmap(attrset),
        _delegation(cx, cl, node, a.share_access, a.claim),
    )


def _open_target(cx, a, cl, on_loop: bool, also=None):
    """The file an OPEN names by its claim: (node, attr, created, attrset bits, the
    directory's change_info or None); ``also``: see _open_create."""
    claim, carg = a.claim
    grace = cx.state.grace.in_grace()  # (ends a grace period whose time is up)
    if claim == c.CLAIM_PREVIOUS:
        if not grace:
            raise NfsError(c.NFS4ERR_NO_GRACE, "reclaim outside the grace period")
        if not cl.may_reclaim or (cl.reclaim_complete and not cl.reclaim_needed):
            raise NfsError(c.NFS4ERR_RECLAIM_BAD, "this client has nothing to reclaim")
        node = cx.need_file()
        return node, cx.ns.getattr(node.ino), False, [], None
    if claim in (c.CLAIM_DELEGATE_CUR, c.CLAIM_DELEG_CUR_FH):
        return _open_delegated(cx, claim, carg, cl)
    if claim not in (c.CLAIM_NULL, c.CLAIM_FH):
        # CLAIM_DELEGATE_PREV / CLAIM_DELEG_PREV_FH: a client that restarted holding
        # delegations on stable storage (RFC 8881 10.2.1); the Linux client never keeps them
        raise NfsError(
            c.NFS4ERR_NOTSUPP,
            f"open claim {claim}: delegations are not kept over a client's restart",
        )
    check_new_lock(cx.state, cl)
    if claim == c.CLAIM_FH:
        node = cx.need_file()
        return node, cx.ns.getattr(node.ino), False, [], None
    dnode = need_dir(cx)
    if dnode.pseudo is not None:
        nocreate = a.openhow[0] == c.OPEN4_NOCREATE
        raise NfsError(c.NFS4ERR_ISDIR if nocreate else c.NFS4ERR_ROFS, "OPEN in the pseudo-root")
    name = check_component(carg)
    before = cx.ns.getattr(dnode.ino).change
    created, attrset = False, []
    if a.openhow[0] == c.OPEN4_CREATE:
        cx.need_writable(dnode)
        attr, created, attrset = _open_create(cx, dnode, name, a.openhow[1], also)
    else:
        # the event loop answers only a name the cache proves missing (NOENT): nfs-rs
        # opens each name so before it creates it
        attr = cx.ns.lookup(cx.cred(dnode), dnode.ino, name)
        if on_loop:
            raise WouldBlock("an OPEN of a file that exists")
    change = cinfo(before, cx.ns.getattr(dnode.ino).change)
    return Node(dnode.export, attr.ino, attr.generation), attr, created, attrset, change


def _open_delegated(cx, claim: int, carg, cl):
    """CLAIM_DELEGATE_CUR / CLAIM_DELEG_CUR_FH: a client turns the opens it made under its
    delegation into opens of the server's before it returns the delegation (RFC 8881 10.4.3):
    no grace check, and the delegation proves the file."""
    if claim == c.CLAIM_DELEG_CUR_FH:
        node, sid = cx.need_file(), carg
    else:
        dnode = need_dir(cx)
        attr = cx.ns.lookup(cx.cred(dnode), dnode.ino, check_component(carg.file))
        node, sid = Node(dnode.export, attr.ino, attr.generation), carg.delegate_stateid
    with cx.state.lock:
        st = cx.state.find(sid, cl)
        if st.kind != "deleg" or st.ino != node.ino:
            raise NfsError(c.NFS4ERR_BAD_STATEID, "not a delegation of this file")
    return node, cx.ns.getattr(node.ino), False, [], None


def _delegation(cx, cl, node: Node, share_access: int, open_claim):
    """open_delegation4 as (type, arm): a read delegation for an OPEN for reading, a write
    one for an OPEN for writing (the checkpoint writer: no other client has the file open or
    locked) when the rules allow one (appliance.nfs.state.delegations), else none with the
    reason the client asked for. Never a write delegation to an NFSv4.0 client: a 4.0 GETATTR
    names no client, so the holder's own (the Linux client sends one before DELEGRETURN)
    would look like another client's and ask the holder (CB_GETATTR) in the middle of its
    return."""
    claim = open_claim[0]
    if claim == c.CLAIM_PREVIOUS:
        return _reclaimed_delegation(cx, cl, node, open_claim[1])
    want = share_access & c.OPEN4_SHARE_ACCESS_WANT_DELEG_MASK
    write = bool(share_access & c.OPEN4_SHARE_ACCESS_WRITE)
    state = cx.state
    if (
        want not in (c.OPEN4_SHARE_ACCESS_WANT_NO_DELEG, c.OPEN4_SHARE_ACCESS_WANT_READ_DELEG)
        or not write
    ) and (
        want != c.OPEN4_SHARE_ACCESS_WANT_NO_DELEG
        and claim in (c.CLAIM_NULL, c.CLAIM_FH)
        and node.export is not None
        and node.export.delegations
        and not (write and (_unattributed40(cx, cl) or _locked_by_others(state, cl, node.ino)))
    ):
        deleg = state.delegations.grant(
            cl,
            node.ino,
            cx.fh_of(node),
            state.shares.by_file.get(node.ino, ()),
            write=write,
            attr=cx.ns.getattr(node.ino) if write else None,
        )
        if deleg is not None:
            sid = stateid4.cls(deleg.seqid, deleg.other)
            # an ACE allowing nothing: the client asks ACCESS before it opens for another user
            nobody = (0, 0, 0, "")
            if write:
                limit = (c.NFS_LIMIT_SIZE, c.NFS4_UINT64_MAX)
                return (c.OPEN_DELEGATE_WRITE, (sid, False, limit, nobody))
            return (c.OPEN_DELEGATE_READ, (sid, False, nobody))
    return _no_delegation(share_access)


def _reclaimed_delegation(cx, cl, node: Node, dtype: int):
    """A reclaim OPEN that names the delegation the client held before the restart
    (CLAIM_PREVIOUS with delegate_type READ or WRITE, RFC 8881 9.11 and 10.2.1): granted again
    from the previous instance's catalog row; none when no row says so (the client then
    forgets it and asks the server again at its next open)."""
    state = cx.state
    if dtype not in (c.OPEN_DELEGATE_READ, c.OPEN_DELEGATE_WRITE) or node.export is None:
        return (c.OPEN_DELEGATE_NONE, None)
    deleg = state.delegations.reclaim(
        cl,
        node.ino,
        cx.fh_of(node),
        dtype,
        state.shares.by_file.get(node.ino, ()),
        cx.ns.getattr(node.ino),
    )
    if deleg is None:
        return (c.OPEN_DELEGATE_NONE, None)
    sid = stateid4.cls(deleg.seqid, deleg.other)
    nobody = (0, 0, 0, "")
    if deleg.write:
        limit = (c.NFS_LIMIT_SIZE, c.NFS4_UINT64_MAX)
        return (c.OPEN_DELEGATE_WRITE, (sid, False, limit, nobody))
    return (c.OPEN_DELEGATE_READ, (sid, False, nobody))


def _unattributed40(cx, cl) -> bool:
    """An NFSv4.0 client whose connection carries another client too: its GETATTRs could not
    be told from theirs, so it gets no write delegation (a holder's own GETATTR would be sent
    to it as CB_GETATTR; its DELEGRETURN COMPOUND carries one)."""
    return (
        cl.minor == c.MINOR_VERSION_40
        and state40.connection_client(cx.conn_state, cx.state) is not cl
    )


def _locked_by_others(state, cl, ino: int) -> bool:
    """Whether a client other than ``cl`` (an NLM host too) holds byte-range locks of ``ino``:
    a write delegation would let ``cl`` lock locally past them."""
    with state.lock:
        return any(lk.client is not cl and lk.ranges for lk in state.locks.by_file.get(ino, ()))


def _check_open_rights(cx, node: Node, attr, access: int, *, checked: bool) -> None:
    """Whether the caller may open ``node`` for ``access``: a file it just made or reclaims
    (``checked``) needs no permission check, the file's owner none either."""
    if access & c.OPEN4_SHARE_ACCESS_WRITE:
        cx.need_writable(node)
        # a snapshot view: the open fails here (the Linux client's open(O_WRONLY) sends no WRITE)
        if cx.ns.is_read_only(node.ino):
            raise NfsError(c.NFS4ERR_ROFS, f"inode {node.ino} is in a snapshot: read-only")
    if checked:
        return
    want = (R_OK if access & c.OPEN4_SHARE_ACCESS_READ else 0) | (
        W_OK if access & c.OPEN4_SHARE_ACCESS_WRITE else 0
    )
    cred = cx.cred(node)
    if cx.ns.access(cred, node.ino, want) != want and cred.uid != attr.uid:
        raise NfsError(c.NFS4ERR_ACCESS, f"uid {cred.uid} may not open inode {node.ino} for {want}")


def _no_delegation(share_access: int) -> tuple[int, tuple[int, bool | None] | None]:
    """open_delegation4 as (type, arm) with none; OPEN_DELEGATE_NONE_EXT's arm is
    (why_no_delegation4, the bool WND4_CONTENTION and WND4_RESOURCE carry, else None)."""
    want = share_access & c.OPEN4_SHARE_ACCESS_WANT_DELEG_MASK
    if want == c.OPEN4_SHARE_ACCESS_WANT_NO_DELEG:
        return (c.OPEN_DELEGATE_NONE_EXT, (c.WND4_NOT_WANTED, None))
    if want:  # none now (WND4_RESOURCE), and the server will not signal one later
        return (c.OPEN_DELEGATE_NONE_EXT, (c.WND4_RESOURCE, False))
    return (c.OPEN_DELEGATE_NONE, None)


def open_state(cx, sid, node: Node | None = None):
    """The open state a stateid names (of ``node``'s file, when given); under the state lock."""
    st = cx.state.find(cx.stateid(sid), cx.need_client())
    if st.kind != "open":
        raise NfsError(c.NFS4ERR_BAD_STATEID, "not an open stateid")
    if node is not None and st.ino != node.ino:
        raise NfsError(c.NFS4ERR_BAD_STATEID, "stateid of another file")
    return st


@operation(c.OP_OPEN_DOWNGRADE)
def open_downgrade(cx, a):
    node = cx.need_file()
    with cx.state.lock:
        st = open_state(cx, a.open_stateid, node)
        cx.state.shares.downgrade(st, a.share_access & 0xFF, a.share_deny)
        return cx.set_stateid(st)


def released(state) -> None:
    """After a LOCKU or CLOSE, with several heads: the smaller holdings are written before the
    reply, so another head's client that waited for them gets through at its next try."""
    if state.holdings is not None and state.holdings.dirty:
        state.holdings.flush_quietly()


@operation(c.OP_CLOSE)
def close(cx, a):
    node = cx.need_file()
    with holding(cx.state.lock, "state lock held"):  # CLOSE runs on the event loop too
        st = open_state(cx, a.open_stateid, node)
        if blocking_forbidden() and (
            st.locks or cx.state.holdings is not None or not cx.ns.close_ref_is_cheap(st.ino)
        ):
            raise WouldBlock("a CLOSE that drops locks, may free the file or writes holdings")
        cx.state.shares.close(st)
        released(cx.state)
        return cx.set_stateid(st)


def check_io_stateid(cx, node: Node, sid, want: int) -> bool:
    """Check the stateid of a READ or WRITE, and the caller's own right to the I/O. True for
    pNFS data-server I/O: on a data server, a stateid this head never issued comes from the
    metadata server's layout (RFC 8881 13.9.1: a loosely coupled data server cannot check it),
    so it is served once this head is still one of the listed data servers."""
    sid = cx.stateid(sid)
    foreign = False
    if not cx.is_special(sid):
        state = cx.state
        pnfs = cx.server.pnfs
        if pnfs.is_ds and cx.minor != c.MINOR_VERSION_40 and sid.other not in state.states:
            pnfs.check_member(cx.server.catalog)
            foreign = True
    if not cx.is_special(sid) and not foreign:
        state = cx.state
        with holding(state.lock, "state lock held"):  # READ runs on the event loop too
            st = state.find(sid, cx.need_client())
            if st.kind == "deleg":  # a delegation's stateid does I/O (RFC 8881 9.1.2)
                if st.ino != node.ino:
                    raise NfsError(c.NFS4ERR_BAD_STATEID, "stateid of another file")
                if want == c.OPEN4_SHARE_ACCESS_WRITE and not st.write:
                    raise NfsError(c.NFS4ERR_OPENMODE, "a read delegation does not write")
            else:
                open_st = st if st.kind == "open" else st.open
                if open_st.ino != node.ino:
                    raise NfsError(c.NFS4ERR_BAD_STATEID, "stateid of another file")
                if want == c.OPEN4_SHARE_ACCESS_WRITE and not open_st.access & want:
                    raise NfsError(c.NFS4ERR_OPENMODE, "file not open for writing")
    need_io_rights(cx, node, want)
    if cx.is_special(sid):
        _check_special_io_share(cx, node, sid, want)
        cx.state.delegations.conflict(node.ino, cx.client, write=want == c.OPEN4_SHARE_ACCESS_WRITE)
    return foreign


def need_io_rights(cx, node: Node, want: int) -> None:
    """The caller's own permission for I/O (``want``: OPEN4_SHARE_ACCESS_READ or _WRITE),
    whatever stateid it sent: a stateid names an open, and another user's OPEN lends its
    rights to nobody (knfsd's nfs4_check_file, NFS-Ganesha alike). As knfsd: the file's owner
    passes (it may write a file it opened for writing after a chmod 0444), and execute
    permission lets a client read (it pages in a binary of mode 0711 with READ)."""
    cred = cx.cred(node)
    attr = cx.ns.getattr(node.ino)
    if cred.owns(attr):
        return
    if want == c.OPEN4_SHARE_ACCESS_WRITE:
        allowed = may(cred, attr, W_OK)
    else:
        allowed = may(cred, attr, R_OK) or may(cred, attr, X_OK)
    if not allowed:
        verb = "write" if want == c.OPEN4_SHARE_ACCESS_WRITE else "read"
        raise NfsError(
            c.NFS4ERR_ACCESS,
            f"uid {cred.uid} may not {verb} inode {node.ino} (mode {attr.mode:o}, "
            f"owner {attr.uid})",
        )


def _check_special_io_share(cx, node: Node, sid, want: int) -> None:
    """I/O without an open still meets the deny modes of the OPENs of the file."""
    state = cx.state
    with holding(state.lock, "state lock held"):
        if state.shares.special_io_denied(node.ino, want, sid.other == BYPASS_OTHER):
            kind = "READ" if want == c.OPEN4_SHARE_ACCESS_READ else "WRITE"
            raise NfsError(
                c.NFS4ERR_LOCKED, f"{kind} with a special stateid: an OPEN of the file denies it"
            )


@operation(c.OP_READ)
def read(cx, a):
    node = cx.need_file()
    ns = cx.ns
    attr = ns.getattr(node.ino)
    need_regular(cx, attr, "READ")
    check_io_stateid(cx, node, a.stateid, c.OPEN4_SHARE_ACCESS_READ)
    # up to what the session's replies can carry: nfs4fs asks 2 MiB while maxread says 1 MiB,
    # and a short read would cost it a second round trip
    limit = cx.session.max_response - 1024 if cx.session is not None else MAX_IO
    count = min(a.count, limit, 4 * MAX_IO)
    if a.offset >= attr.size or count == 0:
        return _READ_OK.cls(a.offset >= attr.size, b"")
    data = ns.read(node.ino, a.offset, count)
    cx.server.counters.read(len(data), node.export.id)
    return _READ_OK.cls(a.offset + len(data) >= attr.size, data)


@operation(c.OP_WRITE)
def write(cx, a):
    node = cx.need_file()
    if cx.is_special(a.stateid):  # an open's stateid proves a regular file (OPEN checked it)
        need_regular(cx, cx.ns.getattr(node.ino), "WRITE")
    cx.need_writable(node)
    data_server_io = check_io_stateid(cx, node, a.stateid, c.OPEN4_SHARE_ACCESS_WRITE)
    if a.stable > c.FILE_SYNC4:
        raise NfsError(c.NFS4ERR_INVAL, f"stable_how {a.stable}")
    if a.offset + len(a.data) > fattr.MAX_FILE_SIZE:
        raise NfsError(c.NFS4ERR_FBIG, f"write past {fattr.MAX_FILE_SIZE}")
    # a data server's writes are durable with their size and mtime in the catalog before the
    # reply (FILE_SYNC, unless [pnfs] data_server_writes is "unstable"): the client then sends
    # neither COMMIT nor LAYOUTCOMMIT, and the metadata server's GETATTR reads what they wrote
    stable = a.stable != c.UNSTABLE4 or (data_server_io and cx.server.pnfs.stable_writes)
    verifier = cx.server.write_verifier  # before: bytes let go after it change the verifier
    count = cx.ns.write(node.ino, a.offset, a.data, stable=stable) if len(a.data) else 0
    cx.server.counters.write(count, node.export.id)
    return _WRITE_OK.cls(count, c.FILE_SYNC4 if stable else c.UNSTABLE4, verifier)


@operation(c.OP_COMMIT)
def commit(cx, a):
    node = cx.need_file()
    # the flush first (nothing buffered for anything but a regular file): on the event loop, a
    # COMMIT with writes to flush stops there before it asked for the attributes it asks for
    # again in the worker
    cx.ns.commit(node.ino)
    need_regular(cx, cx.ns.getattr(node.ino), "COMMIT", symlink40=c.NFS4ERR_SYMLINK)
    return cx.server.write_verifier
