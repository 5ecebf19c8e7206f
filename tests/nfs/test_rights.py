"""No client gains a right it lacks (invariant 12): a squashed root owns neither the export root
nor other users' files, over NFSv4.1, NFSv4.0 and NFSv3 (nfs-rs with uid/gid); and a stateid of
another user's OPEN lends that user's rights to nobody (raw requests, NFSv4.1 and NFSv4.0)."""

from __future__ import annotations

import struct

import pytest
from nfs4_rawclient import RawClient, auth_sys
from nfs4_support import add_export, nfsrs, start_server
from test_v40 import lock40, open_confirmed

from appliance.nfs.v4 import const as c
from appliance.nfs.v4 import types as t
from engine.admin import exports as export_service
from engine.namespace import ROOT

ALICE, BOB, NOBODY = 1001, 1002, 65534
READ_ONLY = t.stateid4.cls(0, b"\0" * 12)  # the anonymous special stateid


def connect(port: int, version: str, uid: int, gid: int):
    """nfs-rs at ``version`` (4.1, 4.0 or 3) as uid:gid."""
    return nfsrs(port, uid=uid, gid=gid, version=version)


@pytest.fixture
def squashed(stack):
    """The default export over a root made as `shingle init` makes it: 1777, owned by the
    anonymous user, and root squashed to that user."""
    export_service.prepare_new_root(stack.namespace)
    add_export(stack.catalog, clients="127.0.0.1/32", squash="root_squash")
    srv = start_server(stack)
    yield srv
    srv.stop()


def write(client, path: str, data: bytes) -> None:
    with client.open(path, "wb") as f:
        f.write(data)


def read(client, path: str) -> bytes:
    with client.open(path, "rb") as f:
        return f.read()


@pytest.mark.parametrize("version", ["4.1", "4.0", "3"])
def test_a_squashed_root_owns_its_files_but_not_the_export_root(stack, squashed, version):
    ns = stack.namespace
    alice = connect(squashed.port, version, ALICE, ALICE)
    root = connect(squashed.port, version, 0, 0)
    nobody = connect(squashed.port, version, NOBODY, NOBODY)  # a client's own nobody
    try:
        write(alice, "alice.txt", b"alice's")
        alice.chmod("alice.txt", 0o644)
        # a root client makes, rewrites and renames its own files in the export root
        write(root, "mine", b"first")
        write(root, "mine", b"second")
        root.rename("mine", "mine.done")
        assert read(root, "mine.done") == b"second"
        root.chmod("mine.done", 0o600)
        mine = ns.resolve("/mine.done")
        assert (mine.uid, mine.mode & 0o7777) == (NOBODY, 0o600)
        # ... and gains nothing over another user's file or the export root
        for client in (root, nobody):
            with pytest.raises(PermissionError):
                client.remove("alice.txt")
            with pytest.raises(PermissionError):
                client.rename("alice.txt", "taken.txt")
            with pytest.raises(PermissionError):
                client.chmod("/", 0o777)
            with pytest.raises(PermissionError):
                write(client, "alice.txt", b"overwritten")
        assert read(alice, "alice.txt") == b"alice's"
        top = ns.getattr(ns.root_ino)
        assert (top.uid, top.mode & 0o7777) == (NOBODY, 0o1777)
        # the owner of a file in the sticky root still removes it
        alice.remove("alice.txt")
        root.remove("mine.done")
    finally:
        for client in (alice, root, nobody):
            client.close()


# -- a stateid names an open, not a right -----------------------------------------------------
def _secret(stack, raw, name: bytes = b"root") -> tuple[bytes, object]:
    """Root's OPEN (read and write) of a new file it then makes 0600: (handle, open stateid)."""
    fh, sid = raw.open_new("secret", owner=name)
    st, _ = raw.session(
        [(c.OP_PUTFH, fh), (c.OP_WRITE, t.ARGS[c.OP_WRITE](sid, 0, c.FILE_SYNC4, b"root's"))]
    )
    assert st == 0, st
    stack.namespace.setattr(ROOT, stack.namespace.resolve("/secret").ino, mode=0o600)
    return fh, sid


def _size_zero(sid):
    size = t.fattr4.cls([1 << c.FATTR4_SIZE], struct.pack(">Q", 0))
    return (c.OP_SETATTR, t.ARGS[c.OP_SETATTR](sid, size))


def test_another_users_open_stateid_lends_no_rights_v41(stack, server):
    raw = RawClient(server.port).setup()  # no_root_squash: the file is root's
    fh, sid = _secret(stack, raw)
    raw.cred = auth_sys(ALICE, ALICE)  # the same client, another user (as the Linux client)
    write_op = (c.OP_WRITE, t.ARGS[c.OP_WRITE](sid, 0, c.FILE_SYNC4, b"alice's"))
    read_op = (c.OP_READ, t.ARGS[c.OP_READ](sid, 0, 100))
    lock_owner = t.open_to_lock_owner4.cls(0, sid, 0, t.state_owner4.cls(raw.clientid, b"lk"))
    lock_op = (c.OP_LOCK, t.ARGS[c.OP_LOCK](c.WRITE_LT, False, 0, 10, (True, lock_owner)))
    for op in (write_op, read_op, _size_zero(sid), lock_op):
        st, res = raw.session([(c.OP_PUTFH, fh), op])
        assert (st, res[-1][0]) == (c.NFS4ERR_ACCESS, op[0]), op[0]
    for op in (  # NFSv4.2's stateid-bearing operations take the same check
        (c.OP_READ_PLUS, t.ARGS[c.OP_READ_PLUS](sid, 0, 100)),
        (c.OP_DEALLOCATE, t.ARGS[c.OP_DEALLOCATE](sid, 0, 4)),
        (c.OP_SEEK, t.ARGS[c.OP_SEEK](sid, 0, c.NFS4_CONTENT_DATA)),
    ):
        st, res = raw.session([(c.OP_PUTFH, fh), op], minor=2)
        assert (st, res[-1][0]) == (c.NFS4ERR_ACCESS, op[0]), op[0]
    raw.cred = auth_sys(0, 0)
    st, res = raw.session([(c.OP_PUTFH, fh), read_op])
    assert st == 0 and res[-1][2].data == b"root's"
    raw.close()


def test_the_owner_override_is_the_openers_own(stack, squashed):
    """As knfsd: the file's owner writes through its open after a chmod 0444 and reads a file
    of mode 0200; execute permission lets another user read (a binary paged in); nothing
    else passes."""
    raw = RawClient(squashed.port, uid=ALICE, gid=ALICE).setup()
    fh, sid = raw.open_new("alice.bin", owner=b"alice")
    ino = stack.namespace.resolve("/alice.bin").ino
    stack.namespace.setattr(ROOT, ino, mode=0o444)

    def write_at(offset, who):
        raw.cred = auth_sys(who, who)
        data = b"x" * 4
        return raw.session(
            [(c.OP_PUTFH, fh), (c.OP_WRITE, t.ARGS[c.OP_WRITE](sid, offset, c.FILE_SYNC4, data))]
        )[0]

    def read_as(who, stateid):
        raw.cred = auth_sys(who, who)
        ops = [(c.OP_PUTFH, fh), (c.OP_READ, t.ARGS[c.OP_READ](stateid, 0, 10))]
        return raw.session(ops)[0]

    assert write_at(0, ALICE) == 0
    assert write_at(4, BOB) == c.NFS4ERR_ACCESS
    stack.namespace.setattr(ROOT, ino, mode=0o200)
    assert read_as(ALICE, sid) == 0
    assert read_as(BOB, sid) == c.NFS4ERR_ACCESS
    assert read_as(BOB, READ_ONLY) == c.NFS4ERR_ACCESS
    stack.namespace.setattr(ROOT, ino, mode=0o711)
    assert read_as(BOB, READ_ONLY) == 0
    assert read_as(BOB, sid) == 0
    assert write_at(8, BOB) == c.NFS4ERR_ACCESS
    assert stack.namespace.getattr(ino).size == 4
    raw.close()


def test_another_users_open_stateid_lends_no_rights_v40(stack, server):
    raw = RawClient(server.port).setup40()
    root_fh = raw.root_fh40()
    sid, fh = open_confirmed(raw, root_fh, "secret", b"root")
    st, _ = raw.v40(
        [(c.OP_PUTFH, fh), (c.OP_WRITE, t.ARGS[c.OP_WRITE](sid, 0, c.FILE_SYNC4, b"root's"))]
    )
    assert st == 0, st
    stack.namespace.setattr(ROOT, stack.namespace.resolve("/secret").ino, mode=0o600)
    raw.cred = auth_sys(ALICE, ALICE)
    for op in (
        (c.OP_WRITE, t.ARGS[c.OP_WRITE](sid, 0, c.FILE_SYNC4, b"alice's")),
        (c.OP_READ, t.ARGS[c.OP_READ](sid, 0, 100)),
        _size_zero(sid),
    ):
        st, res = raw.v40([(c.OP_PUTFH, fh), op])
        assert (st, res[-1][0]) == (c.NFS4ERR_ACCESS, op[0]), op[0]
    st, res = lock40(raw, fh, c.READ_LT, 0, 10, open_sid=sid, open_seqid=3)
    assert (st, res[-1][0]) == (c.NFS4ERR_ACCESS, c.OP_LOCK)
    raw.cred = auth_sys(0, 0)
    assert stack.namespace.read(stack.namespace.resolve("/secret").ino, 0, 100) == b"root's"
    raw.close()
