"""DIR/.snapshots over NFS (nfs-rs, NFSv4.1): hidden from DIR's listing by default and still
reached by path; listed too when the namespace is configured visible (snapshots.visible)."""

from __future__ import annotations

from nfs4_support import add_export, nfsrs, start_server

from engine.namespace import ROOT
from engine.snapshots.service import Snapshots


def test_snapshot_dir_hidden_then_visible_over_nfs(stack):
    ns = stack.namespace
    ds = ns.mkdir(ROOT, ns.root_ino, "ds")
    f = ns.create(ROOT, ds.ino, "a.bin")
    ns.write(f.ino, 0, b"snapshotted", stable=True)
    Snapshots(ns).create("/ds", "s1")
    ns.write(f.ino, 0, b"live bytes!", stable=True)
    add_export(stack.catalog)
    server = start_server(stack)
    try:
        with nfsrs(server.port) as cl:
            assert cl.listdir("ds") == ["a.bin"]  # hidden, as ZFS's default snapdir
            assert cl.listdir("ds/.snapshots") == ["s1"]  # reached by path
            with cl.open("ds/.snapshots/s1/a.bin", "rb") as fh:
                assert fh.read() == b"snapshotted"
        ns.snapshots_visible = True  # what snapshots.visible = true gives the daemon's namespace
        with nfsrs(server.port) as cl:
            assert sorted(cl.listdir("ds")) == [".snapshots", "a.bin"]
            assert cl.listdir("ds/.snapshots/s1") == ["a.bin"]
            with cl.open("ds/a.bin", "rb") as fh:
                assert fh.read() == b"live bytes!"
    finally:
        server.stop()
