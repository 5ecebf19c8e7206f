"""RFC 8881 rules checked with raw NFSv4.1 requests: the current stateid, SECINFO_NO_NAME of the
parent, OPEN's delegation wishes, leases, EXCHANGE_ID's cases, CREATE_SESSION's checks and
channel limits, and no new locks before RECLAIM_COMPLETE."""

from __future__ import annotations

import time

from nfs4_rawclient import RawClient, open_args
from nfs4_support import add_export, start_server

from appliance.nfs.v4 import attrs as fattr
from appliance.nfs.v4 import const as c
from appliance.nfs.v4 import types as t

CURRENT_STATEID = t.stateid4.cls(1, b"\0" * 12)


def test_changing_the_current_filehandle_clears_the_current_stateid(server):
    """RFC 8881 16.2.3.1.2."""
    raw = RawClient(server.port).setup()
    root = raw.root_fh()
    opened = [
        (c.OP_PUTFH, root),
        (c.OP_OPEN, open_args("f", b"owner", raw.clientid)),
        (c.OP_GETFH, None),
    ]
    st, res = raw.session(opened)
    assert st == 0
    fh = res[-1][2]
    read = (c.OP_READ, t.ARGS[c.OP_READ](CURRENT_STATEID, 0, 10))
    # right after OPEN the current stateid is the open's
    assert raw.session(opened + [read])[0] == 0
    # PUTFH (even of the same file) and LOOKUP change the current file handle: no current stateid
    for between in ([(c.OP_PUTFH, fh)], [(c.OP_PUTFH, root), (c.OP_LOOKUP, "f")]):
        st, res = raw.session(opened + between + [read])
        assert st == c.NFS4ERR_BAD_STATEID and res[-1][0] == c.OP_READ
    # SAVEFH/RESTOREFH carry the stateid with the handle
    st, _ = raw.session(
        opened + [(c.OP_SAVEFH, None), (c.OP_PUTFH, root), (c.OP_RESTOREFH, None), read]
    )
    assert st == 0
    raw.close()


def test_secinfo_no_name_parent_at_the_export_root(server):
    """RFC 8881 18.45.3: there is no parent to give the flavors of."""
    raw = RawClient(server.port).setup()
    root = raw.root_fh()
    st, res = raw.session([(c.OP_PUTFH, root), (c.OP_SECINFO_NO_NAME, c.SECINFO_STYLE4_PARENT)])
    assert st == c.NFS4ERR_NOENT
    st, _ = raw.session([(c.OP_PUTFH, root), (c.OP_SECINFO_NO_NAME, c.SECINFO_STYLE4_CURRENT_FH)])
    assert st == 0
    mkdir = (c.OP_CREATE, t.ARGS[c.OP_CREATE]((c.NF4DIR, None), "sub", t.fattr4.cls([], b"")))
    st, _ = raw.session(
        [(c.OP_PUTFH, root), mkdir, (c.OP_SECINFO_NO_NAME, c.SECINFO_STYLE4_PARENT)]
    )
    assert st == 0  # below the root there is a parent
    raw.close()


def test_open_want_no_deleg_is_answered_not_wanted(server):
    """RFC 8881 18.16.3: OPEN4_SHARE_ACCESS_WANT_NO_DELEG gets WND4_NOT_WANTED."""
    raw = RawClient(server.port).setup()
    root = raw.root_fh()
    args = open_args(
        "nodeleg",
        b"owner",
        raw.clientid,
        access=c.OPEN4_SHARE_ACCESS_READ | c.OPEN4_SHARE_ACCESS_WANT_NO_DELEG,
    )
    st, res = raw.session([(c.OP_PUTFH, root), (c.OP_OPEN, args)])
    assert st == 0
    assert res[-1][2].delegation == (c.OPEN_DELEGATE_NONE_EXT, (c.WND4_NOT_WANTED, None))
    # a wish for a delegation is declined for lack of them, not as unwanted
    args = open_args(
        "nodeleg", b"owner", raw.clientid, create=False, access=c.OPEN4_SHARE_ACCESS_READ | 0x0100
    )  # WANT_READ_DELEG
    st, res = raw.session([(c.OP_PUTFH, root), (c.OP_OPEN, args)])
    assert st == 0
    assert res[-1][2].delegation == (c.OPEN_DELEGATE_NONE_EXT, (c.WND4_RESOURCE, False))
    raw.close()


# -- leases (RFC 8881 8.3) --------------------------------------------------------------------
LEASE = 2  # seconds: short, so that expiry is seen in a few seconds


def _exchange_id(raw, owner, verifier, flags=0):
    st, res = raw.compound(
        [
            (
                c.OP_EXCHANGE_ID,
                t.ARGS[c.OP_EXCHANGE_ID](verifier, owner, flags, (c.SP4_NONE, None), []),
            )
        ]
    )
    return st, (res[0][2] if st == 0 else None)


def _create_session(raw, eid, flags=0, fore=None, back=None):
    chan = t.channel_attrs4.cls(0, 1 << 20, 1 << 20, 1 << 16, 16, 8, [])
    st, res = raw.compound(
        [
            (
                c.OP_CREATE_SESSION,
                t.ARGS[c.OP_CREATE_SESSION](
                    eid.clientid,
                    eid.sequenceid,
                    flags,
                    fore or chan,
                    back or chan,
                    0x40000000,
                    [(0, None)],
                ),
            )
        ]
    )
    return st, (res[0][2] if st == 0 else None)


def _deny_both(name, owner, clientid):
    args = open_args(name, owner, clientid)
    args.share_deny = c.OPEN4_SHARE_DENY_BOTH
    return args


def test_a_conflict_with_an_expired_client_wins(stack):
    """A client that stopped renewing keeps its share reservations and locks for one lease;
    after it, another client's conflicting OPEN or LOCK goes and the expired client is gone.
    An expired client nobody conflicts with carries on (a courteous server)."""
    add_export(stack.catalog)
    srv = start_server(stack, lease_seconds=LEASE)
    try:
        a, b, idle = (RawClient(srv.port).setup() for _ in range(3))
        root = a.root_fh()
        st, res = a.session(
            [
                (c.OP_PUTFH, root),
                (c.OP_OPEN, _deny_both("held", b"oa", a.clientid)),
                (c.OP_GETFH, None),
            ]
        )
        assert st == 0
        sid, fh = res[2][2].stateid, res[-1][2]
        locker = (True, t.open_to_lock_owner4.cls(0, sid, 0, t.state_owner4.cls(a.clientid, b"la")))
        assert (
            a.session(
                [
                    (c.OP_PUTFH, fh),
                    (c.OP_LOCK, t.ARGS[c.OP_LOCK](c.WRITE_LT, False, 0, 100, locker)),
                ]
            )[0]
            == 0
        )
        renewed = time.monotonic()
        # within the lease: refused
        st, _ = b.session([(c.OP_PUTFH, root), (c.OP_OPEN, open_args("held", b"ob", b.clientid))])
        assert st == c.NFS4ERR_SHARE_DENIED
        lockt = (
            c.OP_LOCKT,
            t.ARGS[c.OP_LOCKT](c.WRITE_LT, 0, 10, t.state_owner4.cls(b.clientid, b"lb")),
        )
        assert b.session([(c.OP_PUTFH, fh), lockt])[0] == c.NFS4ERR_DENIED
        # "idle" has an open nobody conflicts with, and renews no more either
        st, _ = idle.session(
            [(c.OP_PUTFH, root), (c.OP_OPEN, open_args("own", b"oi", idle.clientid))]
        )
        assert st == 0
        # past one lease (and before the reaper's 1.5): the conflicting requests win
        time.sleep(max(0.0, renewed + LEASE + 0.3 - time.monotonic()))
        assert b.session([(c.OP_PUTFH, fh), lockt])[0] == 0
        st, _ = b.session([(c.OP_PUTFH, root), (c.OP_OPEN, _deny_both("held", b"ob", b.clientid))])
        assert st == 0
        assert a.session([(c.OP_PUTROOTFH, None)])[0] == c.NFS4ERR_BADSESSION
        # the expired client without a conflict renews and carries on
        st, _ = idle.session([(c.OP_PUTFH, root), (c.OP_LOOKUP, "own")])
        assert st == 0
        for raw in (a, b, idle):
            raw.close()
    finally:
        srv.stop()


def test_an_expired_nfsv40_client_loses_to_a_conflict(stack):
    """NFSv4.0 clients share the table and the rule: the 4.0 client's lock goes, and its
    client id is then expired."""
    from test_v40 import lock40, open_confirmed

    add_export(stack.catalog)
    srv = start_server(stack, lease_seconds=LEASE)
    try:
        old = RawClient(srv.port).setup40()
        root = old.root_fh40()
        sid, fh = open_confirmed(old, root, "held40", b"owner")
        st, _ = lock40(old, fh, c.WRITE_LT, 0, 10, open_sid=sid, open_seqid=3, lock_seqid=0)
        assert st == 0
        renewed = time.monotonic()
        v41 = RawClient(srv.port).setup()
        lockt = (
            c.OP_LOCKT,
            t.ARGS[c.OP_LOCKT](c.WRITE_LT, 0, 10, t.state_owner4.cls(v41.clientid, b"l")),
        )
        assert v41.session([(c.OP_PUTFH, fh), lockt])[0] == c.NFS4ERR_DENIED
        time.sleep(max(0.0, renewed + LEASE + 0.3 - time.monotonic()))
        assert v41.session([(c.OP_PUTFH, fh), lockt])[0] == 0
        assert old.v40([(c.OP_RENEW, old.clientid)])[0] == c.NFS4ERR_EXPIRED
        old.close()
        v41.close()
    finally:
        srv.stop()


def test_an_unconfirmed_record_lives_one_lease(stack):
    add_export(stack.catalog)
    srv = start_server(stack, lease_seconds=LEASE)
    try:
        raw = RawClient(srv.port)
        st, eid = _exchange_id(raw, b"slow-owner", b"verif-01")
        assert st == 0
        time.sleep(LEASE + 0.3)
        assert _create_session(raw, eid)[0] == c.NFS4ERR_STALE_CLIENTID
        raw.close()
    finally:
        srv.stop()


# -- EXCHANGE_ID (RFC 8881 18.35.5) -------------------------------------------------------------
UPDATE = c.EXCHGID4_FLAG_UPD_CONFIRMED_REC_A


def test_exchange_id_cases(server):
    raw = RawClient(server.port)
    other_uid = RawClient(server.port, uid=1000)
    # case 7: an update of nothing, and of an unconfirmed record
    assert _exchange_id(raw, b"owner-x", b"verif-01", UPDATE)[0] == c.NFS4ERR_NOENT
    st, first = _exchange_id(raw, b"owner-x", b"verif-01")
    assert st == 0 and not first.flags & c.EXCHGID4_FLAG_CONFIRMED_R
    assert _exchange_id(raw, b"owner-x", b"verif-01", UPDATE)[0] == c.NFS4ERR_NOENT
    # case 4: an unconfirmed record of the same owner is replaced, with a new client id
    st, second = _exchange_id(raw, b"owner-x", b"verif-01")
    assert st == 0 and second.clientid != first.clientid
    assert _create_session(raw, first)[0] == c.NFS4ERR_STALE_CLIENTID
    st, sess = _create_session(raw, second)
    assert st == 0
    # case 2 and 6: the confirmed record, with or without the update flag
    for flags in (0, UPDATE):
        st, again = _exchange_id(raw, b"owner-x", b"verif-01", flags)
        assert st == 0 and again.clientid == second.clientid
        assert again.flags & c.EXCHGID4_FLAG_CONFIRMED_R
    # case 8 and 9: an update with another verifier, or from another principal
    assert _exchange_id(raw, b"owner-x", b"verif-02", UPDATE)[0] == c.NFS4ERR_NOT_SAME
    assert _exchange_id(other_uid, b"owner-x", b"verif-01", UPDATE)[0] == c.NFS4ERR_PERM
    raw.close()
    other_uid.close()


def test_a_restarted_client_keeps_its_old_session_until_it_confirms(server):
    """Case 5: a new verifier gets a new client id; the old client's session and state stay
    until CREATE_SESSION confirms the new one."""
    old = RawClient(server.port).setup(owner=b"rebooting-host")
    root = old.root_fh()
    st, _ = old.session([(c.OP_PUTFH, root), (c.OP_OPEN, _deny_both("mine", b"o", old.clientid))])
    assert st == 0
    new = RawClient(server.port)
    st, eid = _exchange_id(new, b"rebooting-host", b"new-boot")
    assert st == 0 and eid.clientid != old.clientid
    assert old.session([(c.OP_PUTFH, root), (c.OP_LOOKUP, "mine")])[0] == 0
    assert _create_session(new, eid)[0] == 0
    assert old.session([(c.OP_PUTROOTFH, None)])[0] == c.NFS4ERR_BADSESSION
    old.close()
    new.close()


def test_a_changed_principal_gets_clid_inuse_while_the_record_holds_state(server):
    """Case 3 with state: another principal with the same owner gets NFS4ERR_CLID_INUSE, and
    the record's own client carries on."""
    raw = RawClient(server.port).setup(owner=b"shared-owner")
    intruder = RawClient(server.port, uid=1000)
    root = raw.root_fh()
    opened = [(c.OP_PUTFH, root), (c.OP_OPEN, open_args("s", b"o", raw.clientid))]
    assert raw.session(opened)[0] == 0
    assert _exchange_id(intruder, b"shared-owner", b"whatever")[0] == c.NFS4ERR_CLID_INUSE
    assert raw.session([(c.OP_PUTROOTFH, None)])[0] == 0
    raw.close()
    intruder.close()


def test_a_changed_principal_replaces_a_record_without_state_at_once(server):
    """Case 3 without state: the confirmed record of another principal goes at once (not at
    the new record's CREATE_SESSION, as for a restarted client in case 5)."""
    raw = RawClient(server.port).setup(owner=b"shared-owner")
    intruder = RawClient(server.port, uid=1000)
    st, eid = _exchange_id(intruder, b"shared-owner", b"any-verf")
    assert st == 0 and eid.clientid != raw.clientid
    assert not eid.flags & c.EXCHGID4_FLAG_CONFIRMED_R
    # the old record, its session and its client id are gone before any CREATE_SESSION
    assert raw.session([(c.OP_PUTROOTFH, None)])[0] == c.NFS4ERR_BADSESSION
    destroy = [(c.OP_DESTROY_CLIENTID, raw.clientid)]
    assert raw.compound(destroy)[0] == c.NFS4ERR_STALE_CLIENTID
    st, sess = _create_session(intruder, eid)
    assert st == 0
    raw.close()
    intruder.close()


# -- CREATE_SESSION (RFC 8881 18.36) -------------------------------------------------------------
def test_create_session_checks(server):
    raw = RawClient(server.port)
    st, eid = _exchange_id(raw, b"cs-owner", b"verif-01")
    # the principal of the EXCHANGE_ID only
    other = RawClient(server.port, uid=1000)
    assert _create_session(other, eid)[0] == c.NFS4ERR_CLID_INUSE
    other.close()
    # flags outside PERSIST | CONN_BACK_CHAN | CONN_RDMA
    assert _create_session(raw, eid, flags=0x8)[0] == c.NFS4ERR_INVAL
    # both channels must hold a SEQUENCE (CB_SEQUENCE) COMPOUND; no floor above that
    tiny = t.channel_attrs4.cls(0, 60, 60, 0, 2, 1, [])
    assert _create_session(raw, eid, fore=tiny)[0] == c.NFS4ERR_TOOSMALL
    assert _create_session(raw, eid, back=tiny)[0] == c.NFS4ERR_TOOSMALL
    small = t.channel_attrs4.cls(0, 600, 600, 300, 32, 1, [])
    st, sess = _create_session(raw, eid, fore=small)
    assert st == 0 and sess.fore_chan_attrs.maxrequestsize == 600
    raw.sessionid, raw.seq = sess.sessionid, {0: 0}
    # the negotiated sizes hold: a request past 600 bytes, a reply past 600, or past 300 when
    # the reply is to be cached
    assert raw.session([(c.OP_RECLAIM_COMPLETE, False)])[0] == 0
    st, res = raw.session([(c.OP_PUTROOTFH, None), (c.OP_LOOKUP, "x" * 600)])
    assert st == c.NFS4ERR_REQ_TOO_BIG and res[0][0] == c.OP_SEQUENCE
    raw.seq[0] -= 1  # refused before the slot was taken
    attrs = [(1 << c.FATTR4_SUPPORTED_ATTRS) | (1 << c.FATTR4_TYPE), 0, 0]
    getattr_ = [(c.OP_PUTROOTFH, None), (c.OP_LOOKUP, "export"), (c.OP_GETATTR, attrs)]
    st, _ = raw.compound([raw.sequence_op(cachethis=False)] + getattr_)
    assert st == 0
    st, res = raw.compound([raw.sequence_op(cachethis=True)] + getattr_ * 4)
    assert st == c.NFS4ERR_REP_TOO_BIG_TO_CACHE and res[-1][0] == c.OP_GETATTR
    everything = [
        (c.OP_PUTROOTFH, None),
        (c.OP_LOOKUP, "export"),
        # every readable attribute of words 0 and 1 (a write-only one is INVAL)
        (c.OP_GETATTR, [0xFFFFFFFF, 0xFFFFFFFF & ~fattr.WRITE_ONLY_BITMAP[1], 0]),
    ]
    st, res = raw.compound([raw.sequence_op(cachethis=False)] + everything * 3)
    assert st == c.NFS4ERR_REP_TOO_BIG and res[-1][0] == c.OP_GETATTR
    # the same COMPOUND in a session that allows the reply
    roomy = RawClient(server.port).setup()
    st, res = roomy.session(everything * 3)
    assert st == 0, res
    raw.close()
    roomy.close()


# -- reclaim (RFC 8881 8.4.2.1, 18.51.3) ---------------------------------------------------------
def test_no_new_locks_before_reclaim_complete(server):
    raw = RawClient(server.port).setup(reclaim_complete=False)
    root = raw.root_fh()
    opened = [(c.OP_PUTFH, root), (c.OP_OPEN, open_args("r", b"o", raw.clientid))]
    assert raw.session(opened)[0] == c.NFS4ERR_GRACE
    assert raw.session([(c.OP_RECLAIM_COMPLETE, False)])[0] == 0
    st, res = raw.session(opened + [(c.OP_GETFH, None)])
    assert st == 0
    raw.close()
