"""RFC 7530 rules on attributes and file types, checked with raw NFSv4.0 requests: write-only
attributes, the type errors of OPEN, READ, WRITE, LOOKUP, LOCKT, COMMIT, LINK and CREATE,
READDIR's maxcount and empty owners. Where NFSv4.1 (RFC 8881) answers otherwise, its answer
is asserted beside, so the split by minor version stays pinned."""

from __future__ import annotations

import logging

import pytest
from nfs4_rawclient import RawClient, open_args

from appliance.nfs.onc.xdr import Packer, UInt
from appliance.nfs.v4 import const as c
from appliance.nfs.v4 import types as t

ANONYMOUS = t.stateid4.cls(0, b"\0" * 12)
NO_ATTRS = t.fattr4.cls([], b"")
# one object of each type the tests refuse, made in the export's root by CREATE
OBJECTS = {
    "dir": (c.NF4DIR, None),
    "link": (c.NF4LNK, b"dir"),
    "fifo": (c.NF4FIFO, None),
    "socket": (c.NF4SOCK, None),
    "chardev": (c.NF4CHR, t.specdata4.cls(1, 3)),
}


def words(*bits: int) -> list[int]:
    out = [0, 0]
    for bit in bits:
        out[bit // 32] |= 1 << (bit % 32)
    return out


class Minor:
    """One raw client of one minor version: 0 (no session) or 1."""

    def __init__(self, port: int, minor: int):
        self.minor = minor
        self.raw = RawClient(port, minor=minor)
        if minor == 0:
            self.raw.setup40()
            self.root = self.raw.root_fh40()
        else:
            self.raw.setup()
            self.root = self.raw.root_fh()

    def run(self, ops):
        """(status, results) of a COMPOUND."""
        if self.minor == 0:
            return self.raw.v40(ops)
        return self.raw.session(ops)

    def status(self, ops) -> int:
        return self.run(ops)[0]

    def fh(self, name: str) -> bytes:
        st, res = self.run([(c.OP_PUTFH, self.root), (c.OP_LOOKUP, name), (c.OP_GETFH, None)])
        assert st == 0, (name, st)
        return res[-1][2]

    def close(self):
        self.raw.close()


@pytest.fixture
def clients(server, caplog):
    """A 4.0 and a 4.1 client of one server whose export root holds OBJECTS; afterwards, no
    failure was logged as an error (no SERVERFAULT, no traceback)."""
    caplog.set_level(logging.WARNING, logger="shingle")
    v40, v41 = Minor(server.port, 0), Minor(server.port, 1)
    for name, objtype in OBJECTS.items():
        create = (c.OP_CREATE, t.ARGS[c.OP_CREATE](objtype, name, NO_ATTRS))
        assert v40.status([(c.OP_PUTFH, v40.root), create]) == 0, name
    yield v40, v41
    v40.close()
    v41.close()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, errors


def test_getattr_and_readdir_of_write_only_attributes_are_inval(clients):
    """RFC 7530 5.5 (and RFC 8881 5.5): getting a set-only attribute is INVAL."""
    for cl in clients:
        for bit in (c.FATTR4_TIME_ACCESS_SET, c.FATTR4_TIME_MODIFY_SET):
            getattr_ = (c.OP_GETATTR, words(c.FATTR4_SIZE, bit))
            st, res = cl.run([(c.OP_PUTFH, cl.root), getattr_])
            assert (st, res[-1][0]) == (c.NFS4ERR_INVAL, c.OP_GETATTR), (cl.minor, bit)
            readdir = (c.OP_READDIR, t.ARGS[c.OP_READDIR](0, b"\0" * 8, 0, 8192, words(bit)))
            st, res = cl.run([(c.OP_PUTFH, cl.root), readdir])
            assert (st, res[-1][0]) == (c.NFS4ERR_INVAL, c.OP_READDIR), (cl.minor, bit)
        # the readable times still come back
        st, res = cl.run([(c.OP_PUTFH, cl.root), (c.OP_GETATTR, words(c.FATTR4_TIME_MODIFY))])
        assert st == 0 and res[-1][2].attrmask == words(c.FATTR4_TIME_MODIFY)


def test_verify_and_nverify_of_write_only_attributes_are_inval(clients):
    """RFC 7530 16.15.5 and 16.35.5: a write-only attribute is INVAL, not ATTRNOTSUPP."""
    server_time = t.fattr4.cls(words(c.FATTR4_TIME_MODIFY_SET), b"\0\0\0\0")
    not_supported = t.fattr4.cls(words(c.FATTR4_ACL), b"\0\0\0\0")
    for cl in clients:
        for op in (c.OP_VERIFY, c.OP_NVERIFY):
            st, res = cl.run([(c.OP_PUTFH, cl.root), (op, server_time)])
            assert (st, res[-1][0]) == (c.NFS4ERR_INVAL, op), (cl.minor, op)
            assert cl.status([(c.OP_PUTFH, cl.root), (op, not_supported)]) == (
                c.NFS4ERR_ATTRNOTSUPP
            )


def test_open_of_a_file_that_is_not_regular(clients):
    """RFC 7530 16.16.6: ISDIR for a directory, SYMLINK for every other type; RFC 8881 has
    WRONG_TYPE for the types that are neither directories nor symbolic links."""
    for name in OBJECTS:
        for cl in clients:
            # a new open-owner per OPEN: a failed NFSv4.0 OPEN may still use up its seqid
            owner = f"owner-{name}".encode()
            args = open_args(name, owner, cl.raw.clientid, create=False, seqid=1)
            st, res = cl.run([(c.OP_PUTFH, cl.root), (c.OP_OPEN, args)])
            if name == "dir":
                want = c.NFS4ERR_ISDIR
            elif name == "link" or cl.minor == 0:
                want = c.NFS4ERR_SYMLINK
            else:
                want = c.NFS4ERR_WRONG_TYPE
            assert (st, res[-1][0]) == (want, c.OP_OPEN), (cl.minor, name, st)


def _read(fh):
    return [(c.OP_PUTFH, fh), (c.OP_READ, t.ARGS[c.OP_READ](ANONYMOUS, 0, 10))]


def _write(fh):
    return [(c.OP_PUTFH, fh), (c.OP_WRITE, t.ARGS[c.OP_WRITE](ANONYMOUS, 0, c.FILE_SYNC4, b"x"))]


def test_read_and_write_of_a_file_that_is_not_regular(clients):
    """RFC 7530 16.23.4 and 16.36.4: ISDIR for a directory, INVAL otherwise; RFC 8881 18.22.3
    and 18.32.3: SYMLINK for a symbolic link, WRONG_TYPE for the other types."""
    v40, v41 = clients
    for name in OBJECTS:
        for ops in (_read, _write):
            st40 = v40.status(ops(v40.fh(name)))
            st41 = v41.status(ops(v41.fh(name)))
            if name == "dir":
                assert st40 == st41 == c.NFS4ERR_ISDIR, (ops, name)
            else:
                assert st40 == c.NFS4ERR_INVAL, (ops, name, st40)
                assert st41 == (c.NFS4ERR_SYMLINK if name == "link" else c.NFS4ERR_WRONG_TYPE)


def test_lookup_from_a_symbolic_link_is_symlink(clients):
    """RFC 7530 16.13.5 (as RFC 8881 18.15.3): SYMLINK from a symbolic link, NOTDIR from the
    other types that are not directories."""
    for cl in clients:
        for name in OBJECTS:
            if name == "dir":
                continue
            st, res = cl.run([(c.OP_PUTFH, cl.fh(name)), (c.OP_LOOKUP, "x")])
            want = c.NFS4ERR_SYMLINK if name == "link" else c.NFS4ERR_NOTDIR
            assert (st, res[-1][0]) == (want, c.OP_LOOKUP), (cl.minor, name)


def test_lookup_of_dot_and_dot_dot(clients):
    """RFC 7530 16.13.5 gives "." and ".." no special meaning. "." keeps working in both minor
    versions (nfs-rs looks it up for an export's root); ".." is BADNAME in NFSv4.0, where no
    client sends it, and stays a confined walk upwards in NFSv4.1 (tests/nfs/test_confinement)."""
    v40, v41 = clients
    for cl in clients:
        dir_fh = cl.fh("dir")
        st, res = cl.run([(c.OP_PUTFH, dir_fh), (c.OP_LOOKUP, "."), (c.OP_GETFH, None)])
        assert st == 0 and res[-1][2] == dir_fh
    up = [(c.OP_PUTFH, v40.fh("dir")), (c.OP_LOOKUP, ".."), (c.OP_GETFH, None)]
    st, res = v40.run(up)
    assert (st, res[-1][0]) == (c.NFS4ERR_BADNAME, c.OP_LOOKUP)
    st, res = v41.run([(c.OP_PUTFH, v41.fh("dir")), (c.OP_LOOKUP, ".."), (c.OP_GETFH, None)])
    assert st == 0 and res[-1][2] == v41.root
    # from what is not a directory, the type error comes first, as for any name
    st, res = v40.run([(c.OP_PUTFH, v40.fh("link")), (c.OP_LOOKUP, "..")])
    assert (st, res[-1][0]) == (c.NFS4ERR_SYMLINK, c.OP_LOOKUP)


def test_lockt_and_commit_of_a_file_that_is_not_regular(clients):
    """RFC 7530 Table 9: LOCKT may answer ISDIR or INVAL, COMMIT ISDIR, SYMLINK or INVAL;
    RFC 8881 has WRONG_TYPE for what is neither a directory nor a symbolic link."""
    v40, v41 = clients
    for name in OBJECTS:
        for cl in clients:
            owner = t.state_owner4.cls(cl.raw.clientid, b"tester")
            lockt = (c.OP_LOCKT, t.ARGS[c.OP_LOCKT](c.WRITE_LT, 0, 10, owner))
            commit = (c.OP_COMMIT, t.ARGS[c.OP_COMMIT](0, 0))
            for op in (lockt, commit):
                st, res = cl.run([(c.OP_PUTFH, cl.fh(name)), op])
                if name == "dir":
                    want = c.NFS4ERR_ISDIR
                elif cl is v41:
                    want = c.NFS4ERR_SYMLINK if name == "link" else c.NFS4ERR_WRONG_TYPE
                elif name == "link" and op is commit:
                    want = c.NFS4ERR_SYMLINK
                else:
                    want = c.NFS4ERR_INVAL
                assert (st, res[-1][0]) == (want, op[0]), (cl.minor, name, op[0])


def test_link_of_a_directory_is_isdir(clients):
    """RFC 7530 Table 9 gives LINK ISDIR, not PERM (which LINK may not return)."""
    for cl in clients:
        ops = [
            (c.OP_PUTFH, cl.fh("dir")),
            (c.OP_SAVEFH, None),
            (c.OP_PUTFH, cl.root),
            (c.OP_LINK, f"dir-link-{cl.minor}"),
        ]
        st, res = cl.run(ops)
        assert (st, res[-1][0]) == (c.NFS4ERR_ISDIR, c.OP_LINK), cl.minor
        # a link of a file that may have one still works
        ops[0] = (c.OP_PUTFH, cl.fh("fifo"))
        assert cl.status(ops) == 0


def _create_of_type(cl: Minor, objtype: int, name: str) -> bytes:
    """A COMPOUND of PUTFH (root) and CREATE of ``objtype`` with a void arm, by hand: no XDR
    declaration encodes a type createtype4 does not name."""
    p = Packer()
    t.COMPOUND4args_head.pack(p, (b"", cl.minor))
    ops = [(c.OP_PUTFH, t.nfs_fh4, cl.root)]
    if cl.minor != 0:
        opnum, args = cl.raw.sequence_op()
        ops.insert(0, (opnum, t.ARGS[opnum], args))
    UInt.pack(p, len(ops) + 1)
    for opnum, xdr, value in ops:
        UInt.pack(p, opnum)
        xdr.pack(p, value)
    UInt.pack(p, c.OP_CREATE)
    UInt.pack(p, objtype)
    t.component4.pack(p, name)
    t.fattr4.pack(p, NO_ATTRS)
    return p.getvalue()


def test_create_of_a_regular_file_or_an_unknown_type_is_badtype(clients):
    """RFC 7530 16.4.2: createtype4's default arm is void, and the server answers BADTYPE
    (regular files are made by OPEN), not BADXDR."""
    for cl in clients:
        for objtype in (c.NF4REG, c.NF4ATTRDIR, c.NF4NAMEDATTR, 99):
            st, res = cl.raw.parse(cl.raw.call_raw(1, _create_of_type(cl, objtype, "new")))
            assert (st, res[-1][0]) == (c.NFS4ERR_BADTYPE, c.OP_CREATE), (cl.minor, objtype)
        # the COMPOUND's XDR was whole: an operation after it is decoded in a next request
        assert cl.status([(c.OP_PUTFH, cl.root), (c.OP_LOOKUP, "new")]) == c.NFS4ERR_NOENT


def test_readdir_answers_an_entry_that_fits_a_small_maxcount(clients):
    """RFC 7530 16.24.4: maxcount bounds READDIR4resok; TOOSMALL only when not one entry fits.
    With no attributes asked, entry "a" takes 28 bytes (value-follows, cookie, name, empty
    bitmap, empty values) beside the verifier, the end of the list and eof (16)."""
    for cl in clients:
        name = f"small-{cl.minor}"
        mkdir = (c.OP_CREATE, t.ARGS[c.OP_CREATE]((c.NF4DIR, None), "a", NO_ATTRS))
        st, res = cl.run(
            [
                (c.OP_PUTFH, cl.root),
                (c.OP_CREATE, t.ARGS[c.OP_CREATE]((c.NF4DIR, None), name, NO_ATTRS)),
                (c.OP_GETFH, None),
                mkdir,
            ]
        )
        assert st == 0
        small = res[-2][2]  # GETFH
        for maxcount, want in ((16 + 28, 0), (16 + 27, c.NFS4ERR_TOOSMALL)):
            readdir = (c.OP_READDIR, t.ARGS[c.OP_READDIR](0, b"\0" * 8, 0, maxcount, []))
            st, res = cl.run([(c.OP_PUTFH, small), readdir])
            assert st == want, (cl.minor, maxcount, st)
            if want == 0:
                ok = res[-1][2]
                assert [e.name for e in ok.entries] == ["a"] and ok.eof


def test_setattr_of_an_empty_owner_is_inval(clients):
    """An empty owner or owner_group names nobody: INVAL (a bad argument), not BADOWNER (a
    name this server cannot map), which an unknown name still gets."""
    empty, unknown = b"\0\0\0\0", b"\0\0\0\x0bno-such-one\0"
    for cl in clients:
        fh = cl.fh("dir")
        for bit in (c.FATTR4_OWNER, c.FATTR4_OWNER_GROUP):
            for value, want in ((empty, c.NFS4ERR_INVAL), (unknown, c.NFS4ERR_BADOWNER)):
                setattr_ = (
                    c.OP_SETATTR,
                    t.ARGS[c.OP_SETATTR](ANONYMOUS, t.fattr4.cls(words(bit), value)),
                )
                st, res = cl.run([(c.OP_PUTFH, fh), setattr_])
                assert (st, res[-1][0]) == (want, c.OP_SETATTR), (cl.minor, bit, value)
