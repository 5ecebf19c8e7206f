"""NFSv4.2 (RFC 7862, extended attributes RFC 8276) with raw minor version 2 COMPOUNDs: SEEK,
ALLOCATE, DEALLOCATE, READ_PLUS, CLONE, COPY, the xattr operations, what is NOTSUPP, the 4.2
attributes, and 4.2's operations refused in a minor version 1 COMPOUND."""

from __future__ import annotations

import os

import pytest
from nfs4_rawclient import RawClient, open_args
from nfs4_support import nfs4fs, nfsrs

from appliance.nfs.v4 import attrs as fattr
from appliance.nfs.v4 import const as c
from appliance.nfs.v4 import types as t
from engine.admin import fsck
from engine.catalog.database import sql_one
from engine.namespace import ROOT

A = t.ARGS
KiB = 1024


@pytest.fixture
def raw(server):
    client = RawClient(server.port, minor=2).setup()
    yield client
    client.close()


def _open(raw, name: str, data: bytes = b""):
    """(file handle, open stateid) of a new file holding ``data``."""
    st, res = raw.session(
        [
            (c.OP_PUTFH, raw.root_fh()),
            (c.OP_OPEN, open_args(name, name.encode(), raw.clientid)),
            (c.OP_GETFH, None),
        ]
    )
    assert st == 0, res
    fh, sid = res[-1][2], res[2][2].stateid
    if data:
        st, res = raw.session([(c.OP_PUTFH, fh), (c.OP_WRITE, A[c.OP_WRITE](sid, 0, 2, data))])
        assert st == 0, res
    return fh, sid


def _one(raw, fh, op, args=None, minor=None):
    st, res = raw.session([(c.OP_PUTFH, fh), (op, args)], minor=minor)
    return st, res[-1][2]


def _read(raw, fh, sid, size: int) -> bytes:
    """The file's bytes, in READs a cached reply can hold."""
    out = b""
    while len(out) < size:
        st, got = _one(raw, fh, c.OP_READ, A[c.OP_READ](sid, len(out), 128 * KiB))
        assert st == 0, st
        out += bytes(got.data)
        if got.eof:
            break
    return out


def _stripes(stack) -> int:
    return stack.catalog.read(lambda conn: sql_one(conn, "SELECT count(*) FROM stripes")[0])


def test_seek_finds_the_hole_deallocate_punched(server, raw):
    fh, sid = _open(raw, "sparse", os.urandom(256 * KiB))
    seek = A[c.OP_SEEK]
    assert _one(raw, fh, c.OP_SEEK, seek(sid, 0, c.NFS4_CONTENT_DATA))[1].offset == 0
    st, found = _one(raw, fh, c.OP_SEEK, seek(sid, 0, c.NFS4_CONTENT_HOLE))
    assert (st, found.eof, found.offset) == (0, True, 256 * KiB)  # the end counts as a hole
    st, _ = _one(raw, fh, c.OP_DEALLOCATE, A[c.OP_DEALLOCATE](sid, 64 * KiB, 64 * KiB))
    assert st == 0
    st, found = _one(raw, fh, c.OP_SEEK, seek(sid, 0, c.NFS4_CONTENT_HOLE))
    assert (st, found.eof, found.offset) == (0, False, 64 * KiB)
    st, found = _one(raw, fh, c.OP_SEEK, seek(sid, 64 * KiB, c.NFS4_CONTENT_DATA))
    assert (st, found.offset) == (0, 128 * KiB)
    # past the end: NXIO; in the trailing hole of a grown file, no data: eof
    assert _one(raw, fh, c.OP_SEEK, seek(sid, 256 * KiB, c.NFS4_CONTENT_DATA))[0] == c.NFS4ERR_NXIO
    assert _one(raw, fh, c.OP_ALLOCATE, A[c.OP_ALLOCATE](sid, 0, 300 * KiB))[0] == 0
    st, found = _one(raw, fh, c.OP_SEEK, seek(sid, 256 * KiB, c.NFS4_CONTENT_DATA))
    assert (st, found.eof, found.offset) == (0, True, 300 * KiB)
    assert _one(raw, fh, c.OP_SEEK, seek(sid, 0, 7))[0] == c.NFS4ERR_UNION_NOTSUPP


def test_allocate_grows_the_file_and_keeps_its_bytes(server, raw):
    data = os.urandom(10_000)
    fh, sid = _open(raw, "grow", data)
    assert _one(raw, fh, c.OP_ALLOCATE, A[c.OP_ALLOCATE](sid, 5_000, 100_000))[0] == 0
    st, got = _one(raw, fh, c.OP_GETATTR, [1 << c.FATTR4_SIZE])
    assert st == 0 and got.attr_vals == (105_000).to_bytes(8, "big")
    st, back = _one(raw, fh, c.OP_READ, A[c.OP_READ](sid, 0, 200_000))
    assert bytes(back.data) == data + bytes(95_000)
    # inside the file: nothing changes
    assert _one(raw, fh, c.OP_ALLOCATE, A[c.OP_ALLOCATE](sid, 0, 10))[0] == 0
    assert _one(raw, fh, c.OP_GETATTR, [1 << c.FATTR4_SIZE])[1].attr_vals == (105_000).to_bytes(
        8, "big"
    )
    assert _one(raw, fh, c.OP_ALLOCATE, A[c.OP_ALLOCATE](sid, 1 << 63, 1))[0] == c.NFS4ERR_FBIG


def _space_used(raw, fh) -> int:
    st, got = _one(raw, fh, c.OP_GETATTR, [0, 1 << (c.FATTR4_SPACE_USED - 32)])
    assert st == 0, st
    return int.from_bytes(got.attr_vals, "big")


def test_space_used_counts_data_not_holes(server, raw):
    """st_blocks (space_used) drops when a hole is punched; a range ALLOCATE added or a sparse
    write skipped takes none (a log-structured layout reserves nothing)."""
    fh, sid = _open(raw, "blocks", os.urandom(256 * KiB))
    assert _space_used(raw, fh) == 256 * KiB
    assert _one(raw, fh, c.OP_DEALLOCATE, A[c.OP_DEALLOCATE](sid, 64 * KiB, 128 * KiB))[0] == 0
    assert _space_used(raw, fh) == 128 * KiB
    assert _one(raw, fh, c.OP_ALLOCATE, A[c.OP_ALLOCATE](sid, 0, 1024 * KiB))[0] == 0
    assert _space_used(raw, fh) == 128 * KiB
    write = A[c.OP_WRITE](sid, 2048 * KiB, 2, b"x" * 10)
    assert raw.session([(c.OP_PUTFH, fh), (c.OP_WRITE, write), (c.OP_COMMIT, (0, 0))])[0] == 0
    assert _space_used(raw, fh) == 128 * KiB + 4 * KiB  # whole 4 KiB units


def test_read_plus_returns_hole_and_data_segments(server, raw):
    data = os.urandom(192 * KiB)
    fh, sid = _open(raw, "plus", data)
    assert _one(raw, fh, c.OP_DEALLOCATE, A[c.OP_DEALLOCATE](sid, 64 * KiB, 64 * KiB))[0] == 0
    st, got = _one(raw, fh, c.OP_READ_PLUS, A[c.OP_READ_PLUS](sid, 0, 1 << 20))
    assert st == 0 and got.eof
    kinds = [(kind, seg.offset) for kind, seg in got.contents]
    assert kinds == [
        (c.NFS4_CONTENT_DATA, 0),
        (c.NFS4_CONTENT_HOLE, 64 * KiB),
        (c.NFS4_CONTENT_DATA, 128 * KiB),
    ]
    assert got.contents[1][1].length == 64 * KiB
    assert bytes(got.contents[0][1].data) == data[: 64 * KiB]
    assert bytes(got.contents[2][1].data) == data[128 * KiB :]
    # a window starting inside the hole, ending before the file's end
    st, got = _one(raw, fh, c.OP_READ_PLUS, A[c.OP_READ_PLUS](sid, 100 * KiB, 50 * KiB))
    assert st == 0 and not got.eof
    assert [(k, s.offset) for k, s in got.contents] == [
        (c.NFS4_CONTENT_HOLE, 100 * KiB),
        (c.NFS4_CONTENT_DATA, 128 * KiB),
    ]
    assert bytes(got.contents[1][1].data) == data[128 * KiB : 150 * KiB]
    st, got = _one(raw, fh, c.OP_READ_PLUS, A[c.OP_READ_PLUS](sid, 1 << 30, 10))
    assert st == 0 and got.eof and got.contents == []


def test_clone_shares_extents(server, raw, stack):
    data = os.urandom(512 * KiB)
    src, src_sid = _open(raw, "original", data)
    dst, dst_sid = _open(raw, "clone")
    assert _one(raw, src, c.OP_COMMIT, A[c.OP_COMMIT](0, 0))[0] == 0
    before = _stripes(stack)
    st, res = raw.session(
        [
            (c.OP_PUTFH, src),
            (c.OP_SAVEFH, None),
            (c.OP_PUTFH, dst),
            (c.OP_CLONE, A[c.OP_CLONE](src_sid, dst_sid, 0, 0, 0)),
        ]
    )
    assert st == 0, res
    assert _stripes(stack) == before  # catalog rows only: no stripe written
    assert _read(raw, dst, dst_sid, 1 << 20) == data
    # an overwrite of the clone leaves the original alone
    assert _one(raw, dst, c.OP_WRITE, A[c.OP_WRITE](dst_sid, 0, 2, b"x" * 100))[0] == 0
    assert bytes(_one(raw, src, c.OP_READ, A[c.OP_READ](src_sid, 0, 100))[1].data) == data[:100]
    assert fsck.check(stack.catalog, stack.namespace.root_ino).clean
    # past the source's end: INVAL; no saved handle: NOFILEHANDLE
    st, _ = raw.session(
        [
            (c.OP_PUTFH, src),
            (c.OP_SAVEFH, None),
            (c.OP_PUTFH, dst),
            (c.OP_CLONE, A[c.OP_CLONE](src_sid, dst_sid, 1 << 20, 0, 10)),
        ]
    )
    assert st == c.NFS4ERR_INVAL
    st, _ = raw.session([(c.OP_PUTFH, dst), (c.OP_CLONE, A[c.OP_CLONE](src_sid, dst_sid, 0, 0, 0))])
    assert st == c.NFS4ERR_NOFILEHANDLE


def test_copy_inside_the_server_is_synchronous(server, raw):
    data = os.urandom(300 * KiB)
    src, src_sid = _open(raw, "from", data)
    dst, dst_sid = _open(raw, "to")
    for synchronous, (src_off, dst_off, count) in ((True, (0, 0, 0)), (False, (1000, 5, 10))):
        st, res = raw.session(
            [
                (c.OP_PUTFH, src),
                (c.OP_SAVEFH, None),
                (c.OP_PUTFH, dst),
                (
                    c.OP_COPY,
                    A[c.OP_COPY](src_sid, dst_sid, src_off, dst_off, count, False, synchronous, []),
                ),
            ]
        )
        assert st == 0, res
        ok = res[-1][2]
        assert ok.response.callback_id == [] and ok.response.committed == c.FILE_SYNC4
        assert (ok.requirements.consecutive, ok.requirements.synchronous) == (True, True)
        assert ok.response.count == (count or len(data))
    assert _read(raw, dst, dst_sid, 1 << 20) == data[:5] + data[1000:1010] + data[15:]
    # an inter-server copy is not offered
    st, _ = raw.session(
        [
            (c.OP_PUTFH, src),
            (c.OP_SAVEFH, None),
            (c.OP_PUTFH, dst),
            (
                c.OP_COPY,
                A[c.OP_COPY](src_sid, dst_sid, 0, 0, 0, True, True, [(c.NL4_NAME, "elsewhere")]),
            ),
        ]
    )
    assert st == c.NFS4ERR_NOTSUPP


def test_xattrs_round_trip(server, raw, stack):
    fh, _ = _open(raw, "tagged")
    setx = A[c.OP_SETXATTR]
    assert _one(raw, fh, c.OP_GETXATTR, "colour") == (c.NFS4ERR_NOXATTR, None)
    st, info = _one(raw, fh, c.OP_SETXATTR, setx(c.SETXATTR4_CREATE, "colour", b"blue"))
    assert st == 0 and info.after > info.before
    assert _one(raw, fh, c.OP_GETXATTR, "colour") == (0, b"blue")
    assert (
        _one(raw, fh, c.OP_SETXATTR, setx(c.SETXATTR4_CREATE, "colour", b"x"))[0] == c.NFS4ERR_EXIST
    )
    assert (
        _one(raw, fh, c.OP_SETXATTR, setx(c.SETXATTR4_REPLACE, "size", b"x"))[0]
        == c.NFS4ERR_NOXATTR
    )
    assert _one(raw, fh, c.OP_SETXATTR, setx(c.SETXATTR4_EITHER, "size", b"L"))[0] == 0
    assert _one(raw, fh, c.OP_SETXATTR, setx(0, "big", bytes(65 * KiB)))[0] == c.NFS4ERR_XATTR2BIG
    # stored in the user namespace; other namespaces are not listed
    ino = stack.namespace.resolve("/tagged").ino
    assert stack.namespace.getxattr(ROOT, ino, "user.colour") == b"blue"
    stack.namespace.setxattr(ROOT, ino, "security.hidden", b"1")
    listx = A[c.OP_LISTXATTRS]
    st, got = _one(raw, fh, c.OP_LISTXATTRS, listx(0, 4096))
    assert st == 0 and (got.names, got.eof) == (["colour", "size"], True)
    st, got = _one(raw, fh, c.OP_LISTXATTRS, listx(0, 16 + 12))  # room for "colour" only
    assert st == 0 and (got.names, got.eof, got.cookie) == (["colour"], False, 1)
    st, got = _one(raw, fh, c.OP_LISTXATTRS, listx(got.cookie, 16 + 12))
    assert st == 0 and (got.names, got.eof) == (["size"], True)
    assert _one(raw, fh, c.OP_LISTXATTRS, listx(0, 8))[0] == c.NFS4ERR_TOOSMALL
    assert _one(raw, fh, c.OP_LISTXATTRS, listx(9, 4096))[0] == c.NFS4ERR_BAD_COOKIE
    assert _one(raw, fh, c.OP_REMOVEXATTR, "colour")[0] == 0
    assert _one(raw, fh, c.OP_REMOVEXATTR, "colour")[0] == c.NFS4ERR_NOXATTR
    assert _one(raw, fh, c.OP_GETXATTR, "colour")[0] == c.NFS4ERR_NOXATTR
    # ACCESS grants the xattr bits with read and modify
    want = c.ACCESS4_READ | c.ACCESS4_XAREAD | c.ACCESS4_XAWRITE | c.ACCESS4_XALIST
    st, acc = _one(raw, fh, c.OP_ACCESS, want)
    assert st == 0 and acc.supported == want and acc.access == want


@pytest.mark.parametrize(
    "op",
    [
        c.OP_GETDEVICELIST,
        c.OP_LAYOUTERROR,
        c.OP_LAYOUTSTATS,
        c.OP_IO_ADVISE,
        c.OP_WRITE_SAME,
        c.OP_COPY_NOTIFY,
    ],
)
def test_layout_and_offload_operations_are_not_supported(raw, op):
    body = raw.compound_bytes([raw.sequence_op(), (c.OP_PUTROOTFH, None)])
    # a third operation with arguments that are never decoded; the count follows tag and minor
    body = body[:8] + (3).to_bytes(4, "big") + body[12:] + op.to_bytes(4, "big") + bytes(64)
    status, results = raw.parse(raw.call_raw(1, body))
    assert status == c.NFS4ERR_NOTSUPP and results[-1][:2] == (op, c.NFS4ERR_NOTSUPP)


def test_v42_operations_are_illegal_in_minor_version_1(server, raw):
    fh, sid = _open(raw, "v41")
    for op, args in (
        (c.OP_SEEK, A[c.OP_SEEK](sid, 0, c.NFS4_CONTENT_DATA)),
        (c.OP_GETXATTR, "x"),
        (c.OP_ALLOCATE, A[c.OP_ALLOCATE](sid, 0, 1)),
    ):
        st, res = raw.session([(c.OP_PUTFH, fh), (op, args)], minor=1)
        assert st == c.NFS4ERR_OP_ILLEGAL and res[-1][0] == c.OP_ILLEGAL
    assert _one(raw, fh, c.OP_GETXATTR, "x", minor=2)[0] == c.NFS4ERR_NOXATTR


def test_v42_attributes_only_in_minor_version_2(server, raw):
    fh, _ = _open(raw, "attrs", b"abc")
    asked = fattr.to_bitmap(
        [
            c.FATTR4_SUPPORTED_ATTRS,
            c.FATTR4_CLONE_BLKSIZE,
            c.FATTR4_CHANGE_ATTR_TYPE,
            c.FATTR4_XATTR_SUPPORT,
        ]
    )
    for minor in (1, 2):
        st, got = _one(raw, fh, c.OP_GETATTR, asked, minor=minor)
        assert st == 0
        supported, pos = t.bitmap4.unpack(got.attr_vals, 0)
        bits = set(fattr.from_bitmap(supported))
        v42 = {
            c.FATTR4_CLONE_BLKSIZE,
            c.FATTR4_SPACE_FREED,
            c.FATTR4_CHANGE_ATTR_TYPE,
            c.FATTR4_XATTR_SUPPORT,
        }
        if minor == 1:
            assert not bits & v42 and fattr.from_bitmap(got.attrmask) == [0]
        else:
            assert v42 <= bits and c.FATTR4_SEC_LABEL not in bits
            assert fattr.from_bitmap(got.attrmask) == fattr.from_bitmap(asked)
            rest = got.attr_vals[pos:]
            assert rest == (1).to_bytes(4, "big") + (0).to_bytes(4, "big") + (1).to_bytes(
                4, "big"
            )  # clone_blksize 1, MONOTONIC_INCR, xattr_support


def test_v41_clients_still_work(server):
    payload = os.urandom(200_000)
    with nfsrs(server.port) as cl:
        with cl.open("rs", "wb") as out:
            out.write(payload)
        with cl.open("rs", "rb") as back:
            assert back.read() == payload
    fs = nfs4fs(server.port)
    assert fs.cat_file("/rs") == payload
