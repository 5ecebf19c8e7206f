"""Export confinement over NFSv4.1: whatever a client of an export reaches lies inside the
export's subtree (invariant 8), however it got there: a handle kept from before an admin
moved its directory out (PUTFH), a walk upwards (LOOKUPP, LOOKUP ".."), READDIR, RENAME and
LINK with such a handle. The check is cached, and the event loop answers it from the cache."""

from __future__ import annotations

import pytest
from nfs4_rawclient import RawClient, stateid
from nfs4_support import add_export, every_worker_busy, start_server

from appliance.nfs.v4 import const as c
from appliance.nfs.v4 import types as t
from engine.namespace import ROOT

GETATTR = (c.OP_GETATTR, [1 << c.FATTR4_TYPE])
SECRET = b"the payroll of everyone"


@pytest.fixture
def two_exports(stack):
    """Export /export = / for 127.0.0.1 (the admin's) and /scratch = /scratch for 127.0.0.2,
    with /scratch/D/f, /scratch/E, /archive and /secret.txt."""
    ns = stack.namespace
    scratch = ns.mkdir(ROOT, ns.root_ino, "scratch", 0o777)
    d = ns.mkdir(ROOT, scratch.ino, "D", 0o777)
    ns.mkdir(ROOT, scratch.ino, "E", 0o777)
    f = ns.create(ROOT, d.ino, "f", 0o644)
    ns.write(f.ino, 0, b"inside", stable=True)
    ns.mkdir(ROOT, ns.root_ino, "archive", 0o777)
    secret = ns.create(ROOT, ns.root_ino, "secret.txt", 0o644)
    ns.write(secret.ino, 0, SECRET, stable=True)
    add_export(stack.catalog, name="/export", path="/", clients="127.0.0.1/32")
    add_export(stack.catalog, name="/scratch", path="/scratch", clients="127.0.0.2/32")
    srv = start_server(stack)
    admin = RawClient(srv.port).setup()
    client = RawClient(srv.port, source="127.0.0.2").setup()
    yield srv, admin, client
    admin.close()
    client.close()
    srv.stop()


def _fh(raw: RawClient, *path: str) -> bytes:
    ops = [(c.OP_PUTROOTFH, None)] + [(c.OP_LOOKUP, name) for name in path] + [(c.OP_GETFH, None)]
    st, res = raw.session(ops)
    assert st == 0, (path, res)
    return res[-1][2]


def _admin_moves_d_out(admin: RawClient) -> None:
    scratch, archive = _fh(admin, "export", "scratch"), _fh(admin, "export", "archive")
    st, res = admin.session(
        [
            (c.OP_PUTFH, scratch),
            (c.OP_SAVEFH, None),
            (c.OP_PUTFH, archive),
            (c.OP_RENAME, t.ARGS[c.OP_RENAME]("D", "D")),
        ]
    )
    assert st == 0, res


def _status_of(raw: RawClient, ops) -> tuple[int, list]:
    st, res = raw.session(ops)
    return st, [op_status for _, op_status, _ in res]


def test_handle_moved_out_of_the_export_is_refused(two_exports):
    srv, admin, client = two_exports
    d = _fh(client, "scratch", "D")
    f = _fh(client, "scratch", "D", "f")
    read = (c.OP_READ, t.ARGS[c.OP_READ](stateid(0, b"\0" * 12), 0, 100))
    st, res = client.session([(c.OP_PUTFH, f), read])
    assert st == 0 and res[-1][2].data == b"inside"
    _admin_moves_d_out(admin)
    # the walk of the finding: PUTFH(D), LOOKUPP, LOOKUPP, LOOKUP secret.txt, READ
    st, statuses = _status_of(
        client,
        [
            (c.OP_PUTFH, d),
            (c.OP_LOOKUPP, None),
            (c.OP_LOOKUPP, None),
            (c.OP_LOOKUP, "secret.txt"),
            read,
        ],
    )
    assert st == c.NFS4ERR_ACCESS and statuses == [0, c.NFS4ERR_ACCESS]
    st, _ = _status_of(client, [(c.OP_PUTFH, d), (c.OP_LOOKUP, ".."), (c.OP_LOOKUP, "secret.txt")])
    assert st == c.NFS4ERR_ACCESS
    mkdir = (c.OP_CREATE, t.ARGS[c.OP_CREATE]((c.NF4DIR, None), "planted", t.fattr4.cls([], b"")))
    st, _ = _status_of(client, [(c.OP_PUTFH, d), (c.OP_LOOKUPP, None), mkdir])
    assert st == c.NFS4ERR_ACCESS
    assert _status_of(client, [(c.OP_PUTFH, f), read])[0] == c.NFS4ERR_ACCESS
    ns = srv.server.namespace
    assert "planted" not in [e.name for e in ns.readdir(ROOT, ns.root_ino)[0]]
    # READDIR of it, RENAME and LINK with it as the source, into the export
    root = _fh(client, "scratch")
    readdir = (c.OP_READDIR, t.ARGS[c.OP_READDIR](0, b"\0" * 8, 8192, 32768, [1 << c.FATTR4_TYPE]))
    assert _status_of(client, [(c.OP_PUTFH, d), readdir])[0] == c.NFS4ERR_ACCESS
    st, _ = _status_of(
        client,
        [
            (c.OP_PUTFH, d),
            (c.OP_SAVEFH, None),
            (c.OP_PUTFH, root),
            (c.OP_RENAME, t.ARGS[c.OP_RENAME]("f", "stolen")),
        ],
    )
    assert st == c.NFS4ERR_ACCESS
    st, _ = _status_of(
        client, [(c.OP_PUTFH, f), (c.OP_SAVEFH, None), (c.OP_PUTFH, root), (c.OP_LINK, "stolen")]
    )
    assert st == c.NFS4ERR_ACCESS
    # what stayed inside still works, and the admin's export sees everything
    up_to_the_pseudo_root = [
        (c.OP_PUTFH, root),
        (c.OP_LOOKUP, "E"),
        (c.OP_LOOKUPP, None),
        (c.OP_LOOKUPP, None),
    ]
    assert _status_of(client, up_to_the_pseudo_root)[0] == 0
    moved_f = _fh(admin, "export", "archive", "D", "f")
    assert _status_of(admin, [(c.OP_PUTFH, moved_f), read])[0] == 0
    # moved back in: the same handle works again
    archive, scratch = _fh(admin, "export", "archive"), _fh(admin, "export", "scratch")
    assert (
        admin.session(
            [
                (c.OP_PUTFH, archive),
                (c.OP_SAVEFH, None),
                (c.OP_PUTFH, scratch),
                (c.OP_RENAME, t.ARGS[c.OP_RENAME]("D", "D")),
            ]
        )[0]
        == 0
    )
    assert _status_of(client, [(c.OP_PUTFH, f), read])[0] == 0


def test_file_with_links_inside_and_outside(two_exports):
    """A file is inside while one of its links is: an admin's hard link elsewhere does not
    take it away from the export, removing the last link inside does."""
    srv, admin, client = two_exports
    ns = srv.server.namespace
    f = _fh(client, "scratch", "D", "f")
    ino = ns.resolve("/scratch/D/f").ino
    ns.link(ROOT, ino, ns.resolve("/archive").ino, "f2")
    assert _status_of(client, [(c.OP_PUTFH, f), GETATTR])[0] == 0
    ns.unlink(ROOT, ns.resolve("/scratch/D").ino, "f")
    assert _status_of(client, [(c.OP_PUTFH, f), GETATTR])[0] == c.NFS4ERR_ACCESS


def test_confinement_is_answered_from_the_cache_by_the_event_loop(two_exports):
    srv, admin, client = two_exports
    d = _fh(client, "scratch", "D")
    assert _status_of(client, [(c.OP_PUTFH, d), GETATTR])[0] == 0  # cached now
    with every_worker_busy(srv):
        assert _status_of(client, [(c.OP_PUTFH, d), GETATTR])[0] == 0
    _admin_moves_d_out(admin)
    assert _status_of(client, [(c.OP_PUTFH, d), GETATTR])[0] == c.NFS4ERR_ACCESS  # a worker asked
    with every_worker_busy(srv):  # the refusal is cached too
        assert _status_of(client, [(c.OP_PUTFH, d), GETATTR])[0] == c.NFS4ERR_ACCESS
