"""NFSv3: a write below its band class's write quorum (drives missing) is NFS3ERR_IO, not
NFS3ERR_NOSPC."""

from __future__ import annotations

import os
import time

import pytest
from nfs3_helpers import MiB, nfsrs3


def test_v3_write_below_the_write_quorum_is_an_io_error_not_nospc(stack, server):
    import nfs_rs

    drives = list(stack.data.space.drives.values())[:2]
    for drive in drives:
        os.rename(drive.path, drive.path + ".away")
    try:
        time.sleep(0.6)  # presence is looked at twice a second: the write itself sees them gone
        with nfsrs3(server.port) as cl:
            with pytest.raises(nfs_rs.NfsError) as refused:
                with cl.open("refused.bin", "wb") as f:
                    f.write(os.urandom(9 * MiB))
            assert refused.value.code_name == "NFS3ERR_IO", refused.value
    finally:
        for drive in drives:
            os.rename(drive.path + ".away", drive.path)
