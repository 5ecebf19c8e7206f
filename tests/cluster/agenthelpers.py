"""Helpers of the agent tests: agent processes on 127.0.0.1 (ports 46400-46499), a head over them.

``agents(n, drives=1)`` starts ``n`` agents (`shingle agent`), each a host of its own with
``drives`` small zone-file drives under the test's tmp_path/drives; every agent the test started
is stopped when it ends, also when it fails. ``AgentHead`` is a catalog + DataPath + Namespace
over the agents' drives (recorded with ``add_agent_drives``) that a test can restart."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from engine.coding.erasure import load_policies
from engine.datapath import DataPath
from engine.drives import add_agent_drives
from engine.namespace import Namespace

KiB, MiB = 1 << 10, 1 << 20
FIRST_PORT, LAST_PORT = 46400, 46499
REPO = Path(__file__).resolve().parents[2]
# small geometry keeps tests fast: 8+2 stripes of 8 x 64 KiB, zones of 1 MiB
SMALL = {
    "warm": {"fragment_size": 64 * KiB},
    "cold": {"fragment_size": 64 * KiB},
    "hot": {"fragment_size": 64 * KiB},
}
STRIPE = 8 * 64 * KiB
SERVING = "shingle agent: serving"  # what an agent prints once it listens


def free_port(taken: set[int]) -> int:
    for port in range(FIRST_PORT, LAST_PORT + 1):
        if port in taken:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        taken.add(port)
        return port
    raise RuntimeError(f"no free port in {FIRST_PORT}-{LAST_PORT}")


class Agent:
    """One `shingle agent` process: a storage host with its drive folders."""

    def __init__(self, root: Path, name: str, port: int, drives: int, extra: list[str]):
        self.name = name
        self.port = port
        self.address = f"127.0.0.1:{port}"
        self.folders = [root / name / f"drive-{j}" for j in range(drives)]
        # beside the drives, not in their folder (removed after each test): kept for a failure
        self.log = root.parent / f"agent-{name}.log"
        self.extra = extra
        self.process: subprocess.Popen | None = None
        self.log_from = 0

    def start(self) -> Agent:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        # a restarted agent appends to its log: only what this start writes says it is ready
        self.log_from = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "appliance.cli",
                    "agent",
                    "--listen",
                    self.address,
                    "--host",
                    self.name,
                    "--format",
                    "--drive-size",
                    "16MiB",
                    "--zone-size",
                    "1MiB",
                    "--no-preallocate",
                    *self.extra,
                    "--drives",
                    *map(str, self.folders),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=REPO,
            )
        return self

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Until it says it serves (its line comes once it listens). Not a connect: the ports
        lie in the ephemeral range, where a connect to a port nobody listens on yet can meet
        itself (a TCP self-connect) and look like a listener. Ten agents importing at once on
        a busy 2-core machine took more than 30 s (about 1 s of CPU each)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if SERVING in self.log.read_bytes()[self.log_from :].decode(errors="replace"):
                return
            if self.process.poll() is not None:
                raise AssertionError(f"agent {self.name} exited: {self.log.read_text()[-2000:]}")
            time.sleep(0.05)
        raise AssertionError(f"agent {self.name} not serving after {timeout} s")

    def kill(self) -> None:
        """kill -9: the host is gone, nothing flushed or closed."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def terminate(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.kill()


class AgentHead:
    """A head over agents' drives: catalog rows, DataPath and Namespace; restartable."""

    def __init__(self, catalog, agents: list[Agent], *, policies=None, **datapath_options):
        self.catalog = catalog
        self.drive_ids = [i for agent in agents for i in add_agent_drives(catalog, agent.address)]
        self.policies = load_policies(policies or SMALL)
        self.options = datapath_options
        self.data: DataPath | None = None
        self.ns: Namespace | None = None
        self.start()

    def start(self) -> AgentHead:
        self.data = DataPath(self.catalog, self.policies, reserve_zones=2, **self.options)
        self.ns = Namespace(self.catalog, data=self.data)
        return self

    def restart(self) -> AgentHead:
        self.close()
        return self.start()

    def close(self) -> None:
        if self.data is not None:
            self.data.close()
            self.data = None
