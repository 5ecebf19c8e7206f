"""nfs-rs clients as processes of a client host on the test bed (nfs_client.py), for the tests
that put NFS traffic across the bed's bridge (test_host_loss_nfs.py, test_mds_failover.py).

Not from the test process itself: a connect from the machine's own namespace to a bed address
can meet the sandbox's egress proxy, which answers for any address. The conftest fixture
``nfs_clients`` gives a ``BedClients`` and kills what it started when the test ends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from bed import kill_netns_processes

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parent / "nfs_client.py"
FINISH_TIMEOUT_S = 90.0


class ClientRun:
    """nfs_client.py in a host of the bed; its JSON lines collected as they come."""

    def __init__(self, bed, host: str, argv: list[str]):
        self.lines: list[dict] = []
        self.proc = bed.run(
            host, [sys.executable, str(SCRIPT), *argv],
            env={**os.environ, "PYTHONPATH": str(REPO)}, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self._reader = threading.Thread(target=self._collect, daemon=True)
        self._reader.start()

    def _collect(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(json.loads(line))

    def acked(self) -> list[dict]:
        return [line for line in self.lines if "sha256" in line]

    def errors(self) -> list[dict]:
        return [line for line in self.lines if "error" in line]

    def finish(self, timeout: float = FINISH_TIMEOUT_S) -> None:
        """Wait for the script to end (a writer: once its stop file exists); it must exit 0."""
        try:
            self.proc.wait(timeout)
        finally:
            self.kill()
        self._reader.join(10)
        stderr = self.proc.stderr.read() if self.proc.stderr else ""
        assert self.proc.returncode == 0, f"client exited {self.proc.returncode}: {stderr[-3000:]}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class BedClients:
    """The clients' host ``host`` of ``bed`` (added if the bed lacks it) and the nfs_client.py
    runs started there."""

    def __init__(self, bed, host: str):
        self.bed, self.host = bed, host
        if host not in bed.hosts:
            bed.add_host(host)
        self.runs: list[ClientRun] = []

    def start(self, argv: list[str]) -> ClientRun:
        run = ClientRun(self.bed, self.host, argv)
        self.runs.append(run)
        return run

    def writers(
        self, server: str, count: int, size: int, stop: Path, *, reconnect: bool = False
    ) -> list[ClientRun]:
        """``count`` writers of ``size``-byte files w0-1, w0-2, ..., w1-1, ... until ``stop``
        exists; ``reconnect``: each connects again when its server moved."""
        extra = ["--reconnect"] if reconnect else []
        return [
            self.start(["write", server, f"w{k}", str(size), str(stop), *extra])
            for k in range(count)
        ]

    def read_back(self, server: str, acked: dict[str, str]) -> dict[str, str]:
        """Every file in ``acked`` (name -> sha256) read by nfs-rs: name -> what went wrong
        (empty when every file read back with its acknowledged sha256)."""
        reader = self.start(["read", server, *sorted(acked)])
        reader.finish()
        got = {line["name"]: line for line in reader.lines if "name" in line}
        return {
            name: got.get(name, {}).get("error") or "wrong bytes"
            for name, sha in acked.items()
            if got.get(name, {}).get("sha256") != sha
        }

    def close(self) -> None:
        for run in self.runs:
            run.kill()
        if self.host in self.bed.hosts:
            kill_netns_processes(self.bed.hosts[self.host].netns)


def wait_for(
    ready: Callable[[], bool],
    what: str,
    clients: list[ClientRun],
    timeout: float,
    *,
    errors_allowed: bool = True,
) -> float:
    """Seconds until ``ready()``; fails when a client exits first, when ``timeout`` passes, and
    (``errors_allowed`` False) when a client reports a failed file."""
    started = time.monotonic()
    while not ready():
        if not errors_allowed:
            failed = [line for client in clients for line in client.errors()]
            assert not failed, f"{what}: writes failed: {failed[:5]}"
        dead = [client.proc.returncode for client in clients if client.proc.poll() is not None]
        assert not dead, f"{what}: a client exited ({dead})"
        assert time.monotonic() - started < timeout, f"{what}: not within {timeout:.0f} s"
        time.sleep(0.1)
    return time.monotonic() - started
