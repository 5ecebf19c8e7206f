"""nfs-rs (a real NFSv4.1 client) as the process of a client host on the test bed.

    python nfs_client.py write SERVER PREFIX SIZE STOP   # files PREFIX-1, PREFIX-2, ... until
                                                         # the file STOP exists
    python nfs_client.py read SERVER NAME...             # each file read back whole

One JSON line per file on stdout, flushed at once: ``{"name", "began", "done", "sha256"}`` once
the client's write returned (nfs-rs returns once its COMMIT was answered: the server has made
the bytes durable) or the read ended, ``"error"`` (the NFS status name, or the exception)
instead of ``"sha256"`` when it failed. ``began`` and ``done`` are CLOCK_MONOTONIC readings,
which the test process shares. A file's bytes are ``content(name)``: the test computes them
too, and never sends them here."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

NFS_PORT = 2049


def content(name: str, size: int) -> bytes:
    """The bytes of file ``name``: different for every file and every 1 KiB of it."""
    seed = hashlib.sha256(name.encode()).digest()
    block = b"".join(hashlib.sha256(seed + i.to_bytes(4, "big")).digest() for i in range(32))
    return (block * (size // len(block) + 1))[:size]


def connect(server: str):
    import nfs_rs

    return nfs_rs.Client.connect(
        f"nfs://{server}:{NFS_PORT}/export?version=4.1", nfs_port=NFS_PORT, noresvport=True,
        uid=0, gid=0, connect_timeout=20, operation_timeout=60,
    )  # fmt: skip


def report(name: str, began: float, **outcome) -> None:
    line = {"name": name, "began": began, "done": time.monotonic(), **outcome}
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


def write(server: str, prefix: str, size: int, stop: str) -> None:
    with connect(server) as client:
        seq = 0
        while not os.path.exists(stop):
            seq += 1
            name = f"{prefix}-{seq}"
            data = content(name, size)
            began = time.monotonic()
            try:
                with client.open(f"/{name}", "wb") as file:
                    file.write(data)
            except Exception as exc:  # noqa: BLE001 - the test judges every failure
                report(name, began, error=getattr(exc, "code_name", None) or repr(exc))
                continue
            report(name, began, sha256=hashlib.sha256(data).hexdigest())


def read(server: str, names: list[str]) -> None:
    with connect(server) as client:
        for name in names:
            began = time.monotonic()
            try:
                with client.open(f"/{name}", "rb") as file:
                    data = file.read()
            except Exception as exc:  # noqa: BLE001 - the test judges every failure
                report(name, began, error=getattr(exc, "code_name", None) or repr(exc))
                continue
            report(name, began, sha256=hashlib.sha256(data).hexdigest(), size=len(data))


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
    else:
        read(sys.argv[2], sys.argv[3:])
