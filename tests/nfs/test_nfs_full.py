"""Drives full under the NFS server: the write that finds no room is answered NFS4ERR_NOSPC
(the engine's ENOSPC; tests/kernel/test_zoned.py meets it on full zoned devices), never
NFS4ERR_IO, and every write nfs-rs saw acknowledged (durable: UNSTABLE + COMMIT) reads back."""

from __future__ import annotations

import hashlib
import os

import pytest
from nfs4_support import MiB, nfsrs


def test_full_drives_answer_nospc_and_keep_every_acknowledged_write(stack, server):
    import nfs_rs

    acknowledged: dict[str, str] = {}
    with nfsrs(server.port) as cl:
        with pytest.raises(nfs_rs.NfsError) as refused:
            for n in range(200):  # 8 MiB each: the drives hold about 150 MiB of user data
                name = f"fill{n}.bin"
                data = os.urandom(8 * MiB)
                with cl.open(name, "wb") as f:
                    f.write(data)  # returns once the bytes are committed
                acknowledged[name] = hashlib.sha256(data).hexdigest()
        assert refused.value.code_name == "NFS4ERR_NOSPC", refused.value
        assert len(acknowledged) >= 10, "full far sooner than the drives' size says"
        for name, digest in acknowledged.items():
            with cl.open(name, "rb") as f:
                assert hashlib.sha256(f.read()).hexdigest() == digest, name
    assert {d.state for d in stack.data.space.drives.values()} == {"online"}
