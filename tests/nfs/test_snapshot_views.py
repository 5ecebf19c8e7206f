"""A snapshot view (DIR/.snapshots/NAME) over NFSv4: readable, and every way of opening it
for writing refused up front with NFS4ERR_ROFS (the Linux client's open(O_WRONLY) sends only
OPEN, no WRITE). The kernel rig checks the same from Linux (v4.2/snapshot-read)."""

from __future__ import annotations

import hashlib

import pytest
from nfs4_rawclient import RawClient, open_args
from nfs4_support import nfsrs

from appliance.nfs.v4 import const as c
from engine.snapshots.service import Snapshots

ALL_CHANGES = c.ACCESS4_MODIFY | c.ACCESS4_EXTEND


@pytest.fixture
def view(server, stack):
    with nfsrs(server.port) as cl:
        cl.mkdir("ds")
        with cl.open("ds/f.bin", "wb") as f:
            f.write(b"frozen bytes")
    Snapshots(stack.namespace).create("/ds", "s1")
    client = RawClient(server.port, minor=1).setup()
    yield client
    client.close()


def _at(raw, *names):
    return [(c.OP_PUTFH, raw.root_fh()), *[(c.OP_LOOKUP, n) for n in names]]


@pytest.mark.parametrize(
    "share", [c.OPEN4_SHARE_ACCESS_WRITE, c.OPEN4_SHARE_ACCESS_BOTH], ids=["write", "both"]
)
def test_open_for_writing_in_a_snapshot_is_rofs(view, share):
    args = open_args("f.bin", b"w", view.clientid, access=share, create=False)
    st, _ = view.session([*_at(view, "ds", ".snapshots", "s1"), (c.OP_OPEN, args)])
    assert st == c.NFS4ERR_ROFS
    # the live file beside it opens for writing as before
    st, _ = view.session([*_at(view, "ds"), (c.OP_OPEN, args)])
    assert st == 0


def test_open_for_reading_in_a_snapshot_works(view):
    args = open_args("f.bin", b"r", view.clientid, access=c.OPEN4_SHARE_ACCESS_READ, create=False)
    st, res = view.session([*_at(view, "ds", ".snapshots", "s1"), (c.OP_OPEN, args)])
    assert st == 0, res


def test_access_in_a_snapshot_leaves_the_refusal_to_the_change(view):
    # ACCESS grants MODIFY as on the live file: the Linux client checks ACCESS before a
    # truncate and would answer EACCES itself; the SETATTR it sends instead fails with ROFS,
    # and the user sees EROFS as on a read-only local file system
    asked = c.ACCESS4_READ | ALL_CHANGES
    for path in (("ds", ".snapshots", "s1", "f.bin"), ("ds", "f.bin")):
        st, res = view.session([*_at(view, *path), (c.OP_ACCESS, asked)])
        assert st == 0 and res[-1][2].access == asked, path


def test_the_view_holds_through_changes_made_over_nfs(server, stack):
    """A rename, overwrite, truncate, unlink and hard link made through NFS after a snapshot
    leave the snapshot's view, read back through NFS, as it was (size, link count, sha256)."""
    contents = {f"f{i}": bytes([65 + i]) * (3000 + 1000 * i) for i in range(6)}
    with nfsrs(server.port) as cl:
        cl.mkdir("ds")
        cl.mkdir("ds/sub")
        for name, data in contents.items():
            with cl.open(f"ds/{name}", "wb") as f:
                f.write(data)
        cl.link("ds/f0", "ds/sub/hard0")
    Snapshots(stack.namespace).create("/ds", "s1")

    def tree(cl, top: str) -> dict[str, tuple]:
        out = {}
        for name in cl.listdir(top):
            path = f"{top}/{name}"
            st = cl.stat(path)
            if name == "sub":
                out.update(tree(cl, path))
                continue
            with cl.open(path, "rb") as f:
                out[path[len(top) :]] = (st.size, st.nlink, hashlib.sha256(f.read()).hexdigest())
        return out

    with nfsrs(server.port) as cl:
        view = "ds/.snapshots/s1"
        before = tree(cl, view)
        assert len(before) == 7 and before["/f0"][1] == 2, before
        cl.rename("ds/f1", "ds/sub/f1-moved")
        with cl.open("ds/f2", "wb") as f:
            f.write(b"overwritten")
        cl.truncate("ds/f3", 5)
        cl.remove("ds/f4")
        cl.link("ds/f5", "ds/sub/hard5")
        live = tree(cl, "ds")
        assert "/f4" not in live and live["/f3"][0] == 5 and live["/f5"][1] == 2
        assert tree(cl, view) == before, "the snapshot's view did not move"
