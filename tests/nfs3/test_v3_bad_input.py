"""No SERVERFAULT from what a client sends (NFSv3): names that are not UTF-8 get
NFS3ERR_INVAL, a size past the largest file NFS3ERR_FBIG, and a flood of them leaves a few
log lines, not a traceback per request."""

from __future__ import annotations

import logging

from appliance.nfs.v3 import types as t

NOT_UTF8 = b"\xff\xfebad-\xc3(name".decode("utf-8", "surrogateescape")
FLOOD = 300


def _root(peer) -> bytes:
    status, ok = peer.mount(t.MOUNTPROC3_MNT, "/export")
    assert status == t.MNT3_OK
    return ok.fhandle


def _sattr(size=None):
    return t.sattr3.cls(None, None, None, size, (t.DONT_CHANGE, None), (t.DONT_CHANGE, None))


def test_names_that_are_not_utf8_get_inval_and_no_traceback(rpc, caplog):
    peer = rpc()
    root = _root(peer)
    create = t.CREATE3args.cls(t.diropargs3.cls(root, "ok"), (t.UNCHECKED, _sattr()))
    assert peer.nfs(t.NFSPROC3_CREATE, create)[0] == t.NFS3_OK
    where = t.diropargs3.cls(root, NOT_UTF8)
    cases = {
        t.NFSPROC3_LOOKUP: where,
        t.NFSPROC3_CREATE: t.CREATE3args.cls(where, (t.UNCHECKED, _sattr())),
        t.NFSPROC3_MKDIR: t.MKDIR3args.cls(where, _sattr()),
        t.NFSPROC3_REMOVE: where,
        t.NFSPROC3_RMDIR: where,
        t.NFSPROC3_RENAME: t.RENAME3args.cls(t.diropargs3.cls(root, "ok"), where),
        t.NFSPROC3_LINK: t.LINK3args.cls(root, where),
    }
    caplog.set_level(logging.INFO)
    for proc, args in cases.items():
        assert peer.nfs(proc, args)[0] == t.NFS3ERR_INVAL, t.PROC3_NAMES[proc]
    rename_from = t.RENAME3args.cls(where, t.diropargs3.cls(root, "x"))
    assert peer.nfs(t.NFSPROC3_RENAME, rename_from)[0] == t.NFS3ERR_INVAL
    for _ in range(FLOOD):
        assert peer.nfs(t.NFSPROC3_LOOKUP, where)[0] == t.NFS3ERR_INVAL
    assert peer.mount(t.MOUNTPROC3_MNT, "/export/" + NOT_UTF8)[0] == t.MNT3ERR_INVAL
    nfs_lines = [r for r in caplog.records if r.name.startswith("shingle.nfs")]
    assert not [r for r in nfs_lines if r.exc_info], "a traceback was logged"
    assert len(nfs_lines) <= len(cases) + 1
    assert peer.nfs(t.NFSPROC3_LOOKUP, t.diropargs3.cls(root, "ok"))[0] == t.NFS3_OK


def test_sizes_past_the_largest_file_get_fbig(rpc):
    peer = rpc()
    root = _root(peer)
    status, made = peer.nfs(
        t.NFSPROC3_CREATE, t.CREATE3args.cls(t.diropargs3.cls(root, "f"), (t.UNCHECKED, _sattr()))
    )
    assert status == t.NFS3_OK
    for size in ((1 << 64) - 1, 1 << 63):
        setattr_ = t.SETATTR3args.cls(made.obj, _sattr(size), None)
        assert peer.nfs(t.NFSPROC3_SETATTR, setattr_)[0] == t.NFS3ERR_FBIG, size
        again = t.CREATE3args.cls(t.diropargs3.cls(root, "f"), (t.UNCHECKED, _sattr(size)))
        assert peer.nfs(t.NFSPROC3_CREATE, again)[0] == t.NFS3ERR_FBIG, size
    write = t.WRITE3args.cls(made.obj, (1 << 64) - 2, 2, t.FILE_SYNC, b"xy")
    assert peer.nfs(t.NFSPROC3_WRITE, write)[0] == t.NFS3ERR_FBIG
    status, ok = peer.nfs(t.NFSPROC3_READ, t.READ3args.cls(made.obj, (1 << 64) - 1, 1 << 20))
    assert status == t.NFS3_OK and ok.eof and ok.data == b""
    assert peer.nfs(t.NFSPROC3_SETATTR, t.SETATTR3args.cls(made.obj, _sattr(5), None))[0] == 0
