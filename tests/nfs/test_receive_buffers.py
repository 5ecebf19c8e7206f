"""Receive buffers of big fragments are pooled: a buffer goes to the next WRITE only once nothing
refers to the last one's data, so WRITEs waiting for a worker keep their bytes."""

from __future__ import annotations

import hashlib
import threading
import time

import numpy as np
from nfs4_support import MiB, every_worker_busy, nfsrs

from appliance.nfs.onc.limits import ReceiveBuffers


def test_a_buffer_is_handed_out_again_only_when_nothing_refers_to_it():
    pool = ReceiveBuffers(capacity=MiB, count=2)
    assert pool.take(MiB + 1) is None  # longer than the pool's buffers: the connection's own
    first = pool.take(MiB)
    assert first is not None and len(first) == MiB
    view = memoryview(first)[:100]  # what a decoded WRITE holds of its record
    first_id = id(first)
    del first  # the connection lets go of the buffer once the record is whole
    second = pool.take(4096)
    assert second is not None and id(second) != first_id
    assert pool.in_use() == 2  # one held through the view, one here
    assert pool.take(4096) is None  # both in use, and no more than ``count`` are made
    del view
    again = pool.take(4096)
    assert again is not None and id(again) == first_id  # its last view is gone: free again
    del again, second
    assert pool.in_use() == 0


def _data(seed: int) -> bytes:
    return np.random.default_rng(seed).bytes(MiB)


def test_writes_queued_behind_busy_workers_keep_their_bytes(server):
    """Four clients write 1 MiB at a time while every worker is busy, so their WRITEs wait
    holding their receive buffers; more arrive meanwhile. Every file reads back as written,
    and the pool's buffers were used again."""
    writers, chunks = 4, 6
    digests: dict[int, str] = {}
    errors: list[BaseException] = []
    in_use_seen = []
    clients = [nfsrs(server.port) for _ in range(writers)]
    files = [client.open(f"w{i}.bin", "wb") for i, client in enumerate(clients)]

    def write(i: int) -> None:
        try:
            digest = hashlib.sha256()
            for c in range(chunks):
                data = _data(i * 100 + c)
                digest.update(data)
                files[i].write(data)
            files[i].close()
            digests[i] = digest.hexdigest()
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            errors.append(exc)

    pool = server.server.receive_buffers
    try:
        with every_worker_busy(server):
            threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
            for t in threads:
                t.start()
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline:
                in_use_seen.append(pool.in_use())
                time.sleep(0.01)
        for t in threads:
            t.join(60)
    finally:
        for client in clients:
            client.close()
    assert not errors, errors
    # WRITEs waited for a worker with their bytes in pooled buffers, several at once
    assert max(in_use_seen) >= 2, in_use_seen
    # 24 WRITEs of 1 MiB went through at most ``count`` buffers
    assert 0 < len(pool.buffers) <= pool.count
    with nfsrs(server.port) as client:
        for i in range(writers):
            read = hashlib.sha256()
            with client.open(f"w{i}.bin", "rb") as f:
                while block := f.read(MiB):
                    read.update(block)
            assert read.hexdigest() == digests[i], f"w{i}.bin differs from what was written"
