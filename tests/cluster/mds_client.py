"""nfs-rs writing through the floating metadata server address, reconnecting when it must.

    python mds_client.py SERVER PREFIX SIZE STOP   # files PREFIX-1, PREFIX-2, ... until the
                                                   # file STOP exists

As nfs_client.py's writer (one JSON line per file: ``name``, ``began``, ``done``, and
``sha256`` once the write returned, after nfs-rs's COMMIT was answered, or ``error``), except
that a failure does not end the run: a failure that is no NFS status (the connection went, a
time-out), or the fifth NFS error in a row, makes it connect again to the same address, as a
client whose server moved does; ``{"reconnected": when}`` is printed then. A file that failed
is not acknowledged; the next file has a new name. Connects are short (2 s) and retried every
0.2 s, so a connect whose SYN met the address in the middle of its move costs no long
SYN back-off."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

from nfs_client import NFS_PORT, content, report

CONNECT_TIMEOUT_S = 2
RETRY_S = 0.2
ERRORS_BEFORE_RECONNECT = 5


def connect(server: str):
    import nfs_rs

    while True:
        try:
            return nfs_rs.Client.connect(
                f"nfs://{server}:{NFS_PORT}/export?version=4.1", nfs_port=NFS_PORT,
                noresvport=True, uid=0, gid=0, connect_timeout=CONNECT_TIMEOUT_S,
                operation_timeout=20,
            )  # fmt: skip
        except Exception:  # noqa: BLE001 - the address is moving: try again
            time.sleep(RETRY_S)


def write(server: str, prefix: str, size: int, stop: str) -> None:
    client = connect(server)
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
            if status is None or errors >= ERRORS_BEFORE_RECONNECT:
                try:
                    client.close()
                except Exception:  # noqa: BLE001, S110 - the old connection is gone anyway
                    pass
                client = connect(server)
                errors = 0
                sys.stdout.write(json.dumps({"reconnected": time.monotonic()}) + "\n")
                sys.stdout.flush()
            else:
                time.sleep(RETRY_S)
            continue
        errors = 0
        report(name, began, sha256=hashlib.sha256(data).hexdigest())
        recovered = client.drain_recovery_events()
        if recovered:  # nfs-rs's own recovery (a reconnect, a reclaim): shown by the test
            events = [f"{e.operation}: {e.recovery_action.name} {e.message}" for e in recovered]
            sys.stdout.write(json.dumps({"recovery": events, "at": time.monotonic()}) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    write(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
