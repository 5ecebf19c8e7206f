"""No SERVERFAULT from what a client sends (NFSv4.1): names that are not UTF-8 get
NFS4ERR_INVAL (RFC 8881 14.3), a size past the largest file NFS4ERR_FBIG, and a flood of
them leaves a few log lines with a count, not a traceback per request."""

from __future__ import annotations

import logging
import struct

from nfs4_rawclient import RawClient, open_args, stateid

from appliance.nfs.v4 import const as c
from appliance.nfs.v4 import types as t

BAD = b"\xff\xfebad-\xc3(name"
NOT_UTF8 = BAD.decode("utf-8", "surrogateescape")  # what the XDR decoder makes of those bytes
FLOOD = 300


def _size_attr(size: int):
    return t.fattr4.cls([1 << c.FATTR4_SIZE], struct.pack(">Q", size))


def test_names_that_are_not_utf8_get_inval_and_no_traceback(server, caplog):
    raw = RawClient(server.port).setup()
    root = raw.root_fh()
    assert (
        raw.session(
            [
                (c.OP_PUTFH, root),
                (c.OP_CREATE, t.ARGS[c.OP_CREATE]((c.NF4DIR, None), "ok", t.fattr4.cls([], b""))),
            ]
        )[0]
        == 0
    )
    mkdir = t.ARGS[c.OP_CREATE]((c.NF4DIR, None), NOT_UTF8, t.fattr4.cls([], b""))
    cases = {
        "LOOKUP": [(c.OP_PUTFH, root), (c.OP_LOOKUP, NOT_UTF8)],
        "CREATE": [(c.OP_PUTFH, root), (c.OP_CREATE, mkdir)],
        "RENAME from": [
            (c.OP_PUTFH, root),
            (c.OP_SAVEFH, None),
            (c.OP_RENAME, t.ARGS[c.OP_RENAME](NOT_UTF8, "x")),
        ],
        "RENAME to": [
            (c.OP_PUTFH, root),
            (c.OP_SAVEFH, None),
            (c.OP_RENAME, t.ARGS[c.OP_RENAME]("ok", NOT_UTF8)),
        ],
        "REMOVE": [(c.OP_PUTFH, root), (c.OP_REMOVE, NOT_UTF8)],
        "OPEN": [(c.OP_PUTFH, root), (c.OP_OPEN, open_args(NOT_UTF8, b"o", raw.clientid))],
    }
    caplog.set_level(logging.INFO)
    for name, ops in cases.items():
        st, res = raw.session(ops)
        assert st == c.NFS4ERR_INVAL, (name, st, res)
    for _ in range(FLOOD):
        assert raw.session(cases["LOOKUP"])[0] == c.NFS4ERR_INVAL
    nfs_lines = [r for r in caplog.records if r.name.startswith("shingle.nfs")]
    assert not [r for r in nfs_lines if r.exc_info], "a traceback was logged"
    assert len(nfs_lines) <= len(cases)  # at most a line per operation and interval
    assert raw.session([(c.OP_PUTFH, root), (c.OP_LOOKUP, "ok")])[0] == 0
    raw.close()


def test_sizes_past_the_largest_file_get_fbig(server):
    raw = RawClient(server.port).setup()
    root = raw.root_fh()
    st, res = raw.session(
        [(c.OP_PUTFH, root), (c.OP_OPEN, open_args("f", b"o", raw.clientid)), (c.OP_GETFH, None)]
    )
    assert st == 0
    fh, sid = res[-1][2], res[2][2].stateid
    open_sid = stateid(sid.seqid, sid.other)
    for size in ((1 << 64) - 1, 1 << 63):
        st, _ = raw.session(
            [(c.OP_PUTFH, fh), (c.OP_SETATTR, t.ARGS[c.OP_SETATTR](open_sid, _size_attr(size)))]
        )
        assert st == c.NFS4ERR_FBIG, (size, st)
    write = t.ARGS[c.OP_WRITE](open_sid, (1 << 64) - 2, c.FILE_SYNC4, b"xy")
    assert raw.session([(c.OP_PUTFH, fh), (c.OP_WRITE, write)])[0] == c.NFS4ERR_FBIG
    read = t.ARGS[c.OP_READ](open_sid, (1 << 64) - 1, 1 << 31)
    st, res = raw.session([(c.OP_PUTFH, fh), (c.OP_READ, read)])
    assert st == 0 and res[-1][2].eof and res[-1][2].data == b""
    # a time past what 64-bit nanoseconds hold
    far = t.fattr4.cls(
        [0, 1 << (c.FATTR4_TIME_MODIFY_SET - 32)],
        struct.pack(">Iqi", c.SET_TO_CLIENT_TIME4, (1 << 62), 0),
    )
    st, _ = raw.session([(c.OP_PUTFH, fh), (c.OP_SETATTR, t.ARGS[c.OP_SETATTR](open_sid, far))])
    assert st == c.NFS4ERR_INVAL
    st, _ = raw.session(
        [(c.OP_PUTFH, fh), (c.OP_SETATTR, t.ARGS[c.OP_SETATTR](open_sid, _size_attr(5)))]
    )
    assert st == 0
    raw.close()
