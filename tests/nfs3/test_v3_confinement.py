"""Export confinement over NFSv3 (invariant 8): a handle of an export whose object an admin
moved out of the export's subtree gets NFS3ERR_ACCES, whichever procedure names it (LOOKUP
"..", READ, READDIR, RENAME, LINK, CREATE), and what stays inside keeps working."""

from __future__ import annotations

from nfs3_helpers import Rpc3, add_export, start_server

from appliance.nfs.v3 import types as t
from engine.namespace import ROOT

SECRET = b"the payroll of everyone"


def _mount(peer: Rpc3, path: str) -> bytes:
    status, ok = peer.mount(t.MOUNTPROC3_MNT, path)
    assert status == t.MNT3_OK, status
    return ok.fhandle


def _lookup(peer: Rpc3, fh: bytes, name: str) -> bytes:
    status, ok = peer.nfs(t.NFSPROC3_LOOKUP, (fh, name))
    assert status == t.NFS3_OK, (name, status)
    return ok.object


def test_handle_moved_out_of_the_export_gets_acces(stack):
    ns = stack.namespace
    scratch = ns.mkdir(ROOT, ns.root_ino, "scratch", 0o777)
    d = ns.mkdir(ROOT, scratch.ino, "D", 0o777)
    ns.mkdir(ROOT, scratch.ino, "E", 0o777)
    f = ns.create(ROOT, d.ino, "f", 0o644)
    ns.write(f.ino, 0, b"inside", stable=True)
    archive = ns.mkdir(ROOT, ns.root_ino, "archive", 0o777)
    secret = ns.create(ROOT, ns.root_ino, "secret.txt", 0o644)
    ns.write(secret.ino, 0, SECRET, stable=True)
    add_export(stack.catalog, name="/export", path="/", clients="127.0.0.1/32")
    add_export(stack.catalog, name="/scratch", path="/scratch", clients="127.0.0.2/32")
    srv = start_server(stack)
    client = Rpc3(srv.port, source="127.0.0.2")
    try:
        root = _mount(client, "/scratch")
        d_fh = _lookup(client, root, "D")
        f_fh = _lookup(client, d_fh, "f")
        status, ok = client.nfs(t.NFSPROC3_READ, t.READ3args.cls(f_fh, 0, 100))
        assert status == t.NFS3_OK and ok.data == b"inside"
        ns.rename(ROOT, scratch.ino, "D", archive.ino, "D")  # the admin, through another export
        # the walk of the finding: LOOKUP "..", LOOKUP secret.txt, READ
        assert client.nfs(t.NFSPROC3_LOOKUP, (d_fh, ".."))[0] == t.NFS3ERR_ACCES
        assert client.nfs(t.NFSPROC3_READ, t.READ3args.cls(f_fh, 0, 100))[0] == t.NFS3ERR_ACCES
        readdir = t.READDIR3args.cls(d_fh, 0, b"\0" * 8, 8192)
        assert client.nfs(t.NFSPROC3_READDIR, readdir)[0] == t.NFS3ERR_ACCES
        rename = t.RENAME3args.cls(t.diropargs3.cls(d_fh, "f"), t.diropargs3.cls(root, "stolen"))
        assert client.nfs(t.NFSPROC3_RENAME, rename)[0] == t.NFS3ERR_ACCES
        link = t.LINK3args.cls(f_fh, t.diropargs3.cls(root, "stolen"))
        assert client.nfs(t.NFSPROC3_LINK, link)[0] == t.NFS3ERR_ACCES
        mkdir = t.MKDIR3args.cls(t.diropargs3.cls(d_fh, "planted"), t.NO_ATTRS)
        assert client.nfs(t.NFSPROC3_MKDIR, mkdir)[0] == t.NFS3ERR_ACCES
        assert "stolen" not in [e.name for e in ns.readdir(ROOT, scratch.ino)[0]]
        # inside still works; ".." of the export's root stays at the root
        e_fh = _lookup(client, root, "E")
        assert _lookup(client, e_fh, "..") == root
        assert _lookup(client, root, "..") == root
        # moved back: the same handles work again
        ns.rename(ROOT, archive.ino, "D", scratch.ino, "D")
        assert client.nfs(t.NFSPROC3_READ, t.READ3args.cls(f_fh, 0, 100))[0] == t.NFS3_OK
    finally:
        client.close()
        srv.stop()
