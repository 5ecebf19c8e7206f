"""RFC 8881 rules checked with raw NFSv4.1 requests: the current stateid, SECINFO_NO_NAME of the
parent, and OPEN's delegation wishes."""
from __future__ import annotations

from nfs4_rawclient import RawClient, open_args

from appliance.nfs.v4 import const as c
from appliance.nfs.v4 import types as t

CURRENT_STATEID = t.stateid4.cls(1, b"\0" * 12)


def test_changing_the_current_filehandle_clears_the_current_stateid(server):
    """RFC 8881 16.2.3.1.2."""
    raw = RawClient(server.port).setup()
    root = raw.root_fh()
    opened = [(c.OP_PUTFH, root), (c.OP_OPEN, open_args("f", b"owner", raw.clientid)),
              (c.OP_GETFH, None)]
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
    st, _ = raw.session(opened + [(c.OP_SAVEFH, None), (c.OP_PUTFH, root),
                                  (c.OP_RESTOREFH, None), read])
    assert st == 0
    raw.close()


def test_secinfo_no_name_parent_at_the_export_root(server):
    """RFC 8881 18.45.3: there is no parent to give the flavors of."""
    raw = RawClient(server.port).setup()
    root = raw.root_fh()
    st, res = raw.session([(c.OP_PUTFH, root), (c.OP_SECINFO_NO_NAME, c.SECINFO_STYLE4_PARENT)])
    assert st == c.NFS4ERR_NOENT
    st, _ = raw.session([(c.OP_PUTFH, root), (c.OP_SECINFO_NO_NAME,
                                              c.SECINFO_STYLE4_CURRENT_FH)])
    assert st == 0
    mkdir = (c.OP_CREATE, t.ARGS[c.OP_CREATE]((c.NF4DIR, None), "sub", t.fattr4.cls([], b"")))
    st, _ = raw.session([(c.OP_PUTFH, root), mkdir,
                         (c.OP_SECINFO_NO_NAME, c.SECINFO_STYLE4_PARENT)])
    assert st == 0  # below the root there is a parent
    raw.close()


def test_open_want_no_deleg_is_answered_not_wanted(server):
    """RFC 8881 18.16.3: OPEN4_SHARE_ACCESS_WANT_NO_DELEG gets WND4_NOT_WANTED."""
    raw = RawClient(server.port).setup()
    root = raw.root_fh()
    args = open_args("nodeleg", b"owner", raw.clientid,
                     access=c.OPEN4_SHARE_ACCESS_READ | c.OPEN4_SHARE_ACCESS_WANT_NO_DELEG)
    st, res = raw.session([(c.OP_PUTFH, root), (c.OP_OPEN, args)])
    assert st == 0
    assert res[-1][2].delegation == (c.OPEN_DELEGATE_NONE_EXT, (c.WND4_NOT_WANTED, None))
    # a wish for a delegation is declined for lack of them, not as unwanted
    args = open_args("nodeleg", b"owner", raw.clientid, create=False,
                     access=c.OPEN4_SHARE_ACCESS_READ | 0x0100)  # WANT_READ_DELEG
    st, res = raw.session([(c.OP_PUTFH, root), (c.OP_OPEN, args)])
    assert st == 0
    assert res[-1][2].delegation == (c.OPEN_DELEGATE_NONE_EXT, (c.WND4_RESOURCE, False))
    raw.close()
