"""The local mount (and SMB, which shares it) recalls NFS clients' delegations before it
changes a file: a write through the mount waits while an NFSv4.1 client that holds a read
delegation of the file is sent CB_RECALL, and goes on once it returned it."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "nfs"))

from test_delegations import CallbackClient, read_delegation  # noqa: E402

from appliance.nfs.v4 import const as c  # noqa: E402


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
