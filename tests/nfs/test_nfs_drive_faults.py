"""Drives missing under the NFS server: a write that cannot get its band class's redundancy is
answered NFS4ERR_IO (not NFS4ERR_NOSPC, space is plenty), reads keep working."""

from __future__ import annotations

import os
import time

import pytest
from nfs4_support import MiB, nfsrs


def test_write_below_the_write_quorum_is_an_io_error_not_nospc(stack, server):
    import nfs_rs

    kept = os.urandom(2 * MiB + 5)
    with nfsrs(server.port) as cl:
        with cl.open("kept.bin", "wb") as f:
            f.write(kept)
    drives = list(stack.data.space.drives.values())[:2]
    for drive in drives:
        os.rename(drive.path, drive.path + ".away")
    try:
        time.sleep(0.6)  # presence is looked at twice a second: the write itself sees them gone
        with nfsrs(server.port) as cl:
            with pytest.raises(nfs_rs.NfsError) as refused:
                with cl.open("refused.bin", "wb") as f:
                    f.write(os.urandom(9 * MiB))
            assert refused.value.code_name == "NFS4ERR_IO", refused.value
            with cl.open("kept.bin", "rb") as f:
                assert f.read() == kept  # decoded around the two missing drives
        deadline = time.monotonic() + 10  # the drive watch records what the write noticed
        while [d.state for d in drives] != ["missing"] * 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [drive.state for drive in drives] == ["missing", "missing"]
    finally:
        for drive in drives:
            os.rename(drive.path + ".away", drive.path)
