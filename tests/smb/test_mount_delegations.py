"""The local mount (and SMB, which shares it) recalls NFS clients' delegations before it
changes a file: a write through the mount, or through Samba, waits while an NFSv4.1 client
that holds a read delegation of the file is sent CB_RECALL, and goes on once it returned it; a
read through the mount waits so for a write delegation (its holder may have written what the
server lacks)."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "nfs"))

from test_delegations import CallbackClient, read_delegation  # noqa: E402
from test_delegations_write import answering  # noqa: E402

from appliance.nfs.v4 import const as c  # noqa: E402
from appliance.nfs.v4 import types as t  # noqa: E402


def test_a_write_through_the_mount_recalls_the_delegation(served):
    path = served.mount / "deleg-shard"
    path.write_bytes(b"first")
    reader = CallbackClient(served.nfs_port).setup()
    try:
        fh, dsid = read_delegation(reader, "deleg-shard")
        done = threading.Event()

        def write_locally():
            with open(path, "r+b") as f:
                f.write(b"local")
            done.set()

        writer = threading.Thread(target=write_locally, daemon=True)
        writer.start()
        assert reader.wait_for_recall(), "no CB_RECALL for the mount's write"
        assert not done.is_set(), "the mount's write did not wait for the delegation"
        st, _ = reader.session([(c.OP_PUTFH, fh), (c.OP_DELEGRETURN, dsid)])
        assert st == 0, st
        assert done.wait(20), "the mount's write still waits after DELEGRETURN"
        assert path.read_bytes() == b"local"
    finally:
        reader.close()


def test_a_write_through_smb_recalls_the_delegation(served, tmp_path):
    """The same through Samba (smbclient as alice), which reaches the files through the mount."""
    path = served.mount / "deleg-smb"
    path.write_bytes(b"first")
    path.chmod(0o666)  # alice's to write
    source = tmp_path / "source"
    source.write_bytes(b"over smb")
    reader = CallbackClient(served.nfs_port).setup()
    try:
        fh, dsid = read_delegation(reader, "deleg-smb")
        done = threading.Event()

        def write_over_smb():
            served.smbclient("export", "alice", f"put {source} deleg-smb")
            done.set()

        writer = threading.Thread(target=write_over_smb, daemon=True)
        writer.start()
        assert reader.wait_for_recall(), "no CB_RECALL for the SMB client's write"
        assert not done.is_set(), "the SMB client's write did not wait for the delegation"
        st, _ = reader.session([(c.OP_PUTFH, fh), (c.OP_DELEGRETURN, dsid)])
        assert st == 0, st
        writer.join(60)
        assert done.is_set(), "the SMB client's write failed or still waits after DELEGRETURN"
        assert path.read_bytes() == b"over smb"
    finally:
        reader.close()


def test_a_read_through_the_mount_recalls_a_write_delegation(served):
    path = served.mount / "deleg-ckpt"
    holder = CallbackClient(served.nfs_port).setup()
    try:  # made by the NFS client (the export squashes root: a file of the mount's is not its)
        st, res = holder.open_file("deleg-ckpt", c.OPEN4_SHARE_ACCESS_BOTH, create=True)
        assert st == 0 and res[2][2].delegation[0] == c.OPEN_DELEGATE_WRITE, (st, res)
        fh, dsid = res[3][2], res[2][2].delegation[1].stateid
        write = (c.OP_WRITE, t.ARGS[c.OP_WRITE](dsid, 0, c.FILE_SYNC4, b"holder"))
        st, _ = holder.session([(c.OP_PUTFH, fh), write])
        assert st == 0, st
        # a stat through the mount asks the holder (CB_GETATTR): 12,345 bytes in its cache
        holder.attrs = (12345, 1 << 40)  # a change attribute other than the grant's
        with answering(holder):
            assert path.stat().st_size == 12345
        assert holder.getattrs() == 1 and holder.recalls() == []
        # a listing's entries (READDIRPLUS attributes) ask it too
        with answering(holder):
            assert "deleg-ckpt" in os.listdir(served.mount)
        assert holder.getattrs() == 2 and holder.recalls() == []
        seen: list[bytes] = []

        def read_locally():
            seen.append(path.read_bytes())

        reader = threading.Thread(target=read_locally, daemon=True)
        reader.start()
        assert holder.wait_for_recall(), "no CB_RECALL for the mount's read"
        assert not seen, "the mount's read did not wait for the write delegation"
        st, _ = holder.session([(c.OP_PUTFH, fh), (c.OP_DELEGRETURN, dsid)])
        assert st == 0, st
        reader.join(20)
        assert seen == [b"holder"]
    finally:
        holder.close()
