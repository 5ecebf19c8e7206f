"""A file of 1 GiB written and read back sha256-identical through nfs-rs,
erasure-coded 8+2 on ten emulated drives."""

from __future__ import annotations

import hashlib

import numpy as np
from nfs4_support import MiB, add_export, nfsrs, start_server

SIZE = 1 << 30
CHUNK = 8 * MiB


def _chunk(i: int) -> bytes:
    # every chunk differs, so a misplaced chunk cannot go unnoticed
    return np.random.default_rng(i).bytes(CHUNK)


def test_one_gib_round_trip(big_stack):
    add_export(big_stack.catalog)
    srv = start_server(big_stack)
    try:
        written = hashlib.sha256()
        with nfsrs(srv.port) as cl:
            with cl.open("checkpoint.bin", "wb") as f:
                for i in range(SIZE // CHUNK):
                    data = _chunk(i)
                    written.update(data)
                    f.write(data)
            assert cl.stat("checkpoint.bin").size == SIZE
            read = hashlib.sha256()
            total = 0
            with cl.open("checkpoint.bin", "rb") as f:
                while True:
                    data = f.read(CHUNK)
                    if not data:
                        break
                    read.update(data)
                    total += len(data)
        assert total == SIZE
        assert read.hexdigest() == written.hexdigest()
    finally:
        srv.stop()
