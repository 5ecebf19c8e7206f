"""nfs-rs (a real NFSv4.1 client) as the process of a client host on the test bed.

    python nfs_client.py write SERVER PREFIX SIZE STOP [--reconnect]
                                         # files PREFIX-1, PREFIX-2, ... until the file STOP exists
    python nfs_client.py read SERVER NAME...   # each file read back whole

SERVER is an IPv4 or IPv6 address (without brackets).

One JSON line per file on stdout, flushed at once: ``{"name", "began", "done", "sha256"}`` once
the client's write returned (nfs-rs returns once its COMMIT was answered: the server has made
the bytes durable) or the read ended, ``"error"`` (the NFS status name, or the exception)
instead of ``"sha256"`` when it failed. ``began`` and ``done`` are CLOCK_MONOTONIC readings,
which the test process shares. A file's bytes are ``content(name)``: the test computes them
too, and never sends them here. A file that failed is not acknowledged; the next file has a new
name.

``--reconnect`` (a client whose server moved: the floating metadata server address): a failure
that is no NFS status (the connection went, a time-out), or the fifth NFS error in a row, makes
the writer connect again to the same address, and ``{"reconnected": when}`` is printed; nfs-rs's
own recoveries are printed as ``{"recovery": [...], "at": when}``. Its connects are short
(2 s) and retried every 0.2 s until one succeeds, so a connect whose SYN met the address in the
middle of its move costs no long SYN back-off. It also waits PACE_S after each file: unpaced,
one writer whose partner was still reconnecting filled the test's drives' hot bands by itself
within seconds (NOSPC), and the partner never acknowledged a file after the move."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

NFS_PORT = 2049
RETRY_S = 0.2
ERRORS_BEFORE_RECONNECT = 5
PACE_S = 0.1  # --reconnect: the pause after each file (see above)


def content(name: str, size: int) -> bytes:
    """The bytes of file ``name``: different for every file and every 1 KiB of it."""
    seed = hashlib.sha256(name.encode()).digest()
    block = b"".join(hashlib.sha256(seed + i.to_bytes(4, "big")).digest() for i in range(32))
    return (block * (size // len(block) + 1))[:size]


def connect(server: str, *, moving: bool = False):
    """A client of ``server``; ``moving``: short connects, retried until one succeeds."""
    import nfs_rs

    from appliance.host.addresses import url_host  # an IPv6 server in brackets

    while True:
        try:
            return nfs_rs.Client.connect(
                f"nfs://{url_host(server)}:{NFS_PORT}/export?version=4.1", nfs_port=NFS_PORT,
                noresvport=True, uid=0, gid=0, connect_timeout=2 if moving else 20,
                operation_timeout=20 if moving else 60,
            )  # fmt: skip
        except Exception:  # noqa: BLE001 - the address is moving: try again
            if not moving:
                raise
            time.sleep(RETRY_S)


def say(line: dict) -> None:
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


def report(name: str, began: float, **outcome) -> None:
    say({"name": name, "began": began, "done": time.monotonic(), **outcome})


def write(server: str, prefix: str, size: int, stop: str, *, reconnect: bool = False) -> None:
    client = connect(server, moving=reconnect)
    seq = errors = 0
    while not os.path.exists(stop):
        seq += 1
        name = f"{prefix}-{seq}"
        data = content(name, size)
        began = time.monotonic()
        try:
            with client.open(f"/{name}", "wb") as file:
                file.write(data)
        except Exception as exc:  # noqa: BLE001 - the test judges every failure
            status = getattr(exc, "code_name", None)
            report(name, began, error=status or repr(exc))
            errors += 1
            if not reconnect:
                continue
            if status is None or errors >= ERRORS_BEFORE_RECONNECT:
                try:
                    client.close()
                except Exception:  # noqa: BLE001, S110 - the old connection is gone anyway
                    pass
                client = connect(server, moving=True)
                errors = 0
                say({"reconnected": time.monotonic()})
            else:
                time.sleep(RETRY_S)
            continue
        errors = 0
        report(name, began, sha256=hashlib.sha256(data).hexdigest())
        recovered = client.drain_recovery_events() if reconnect else None
        if recovered:  # nfs-rs's own recovery (a reconnect, a reclaim): shown by the test
            events = [f"{e.operation}: {e.recovery_action.name} {e.message}" for e in recovered]
            say({"recovery": events, "at": time.monotonic()})
        if reconnect:
            time.sleep(PACE_S)
    client.close()


def read(server: str, names: list[str]) -> None:
    client = connect(server)
    try:
        for name in names:
            began = time.monotonic()
            try:
                with client.open(f"/{name}", "rb") as file:
                    data = file.read()
            except Exception as exc:  # noqa: BLE001 - the test judges every failure
                report(name, began, error=getattr(exc, "code_name", None) or repr(exc))
                continue
            report(name, began, sha256=hashlib.sha256(data).hexdigest(), size=len(data))
    finally:
        client.close()


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(
            sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5],
            reconnect="--reconnect" in sys.argv[6:],
        )  # fmt: skip
    else:
        read(sys.argv[2], sys.argv[3:])
