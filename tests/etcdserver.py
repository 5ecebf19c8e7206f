"""Throw-away etcd clusters for tests and benchmarks (Debian's etcd-server 3.4).

Members listen on 127.0.0.1, client and peer ports taken from 24300-24399 (a port another run
holds is skipped), data in a temp folder. The processes are our children, so the run reaps
them; ``stop()`` kills every member and removes the folder. ``kill(i)`` is a kill -9 of one
member, ``pause(i)``/``resume(i)`` a SIGSTOP/SIGCONT (a member that stops answering without
closing its sockets, as a host cut off does).

    with EtcdCluster(3) as etcd:
        client = EtcdClient(etcd.endpoints)
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

ETCD = Path(os.environ.get("SHINGLE_ETCD", "/usr/bin/etcd"))
PORTS = range(24300, 24400)
_taken: set[int] = set()  # ports this process handed out (other runs: bind test below)


def etcd_installed() -> bool:
    return ETCD.exists()


def _free_ports(count: int) -> list[int]:
    ports = []
    for port in PORTS:
        if port in _taken:
            continue
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
        if len(ports) == count:
            _taken.update(ports)
            return ports
    raise RuntimeError(f"no {count} free ports in {PORTS.start}-{PORTS.stop - 1} for etcd")


class EtcdCluster:
    def __init__(self, members: int = 1, *, election_ms: int = 1000, heartbeat_ms: int = 100):
        self.size = members
        self.election_ms = election_ms
        self.heartbeat_ms = heartbeat_ms
        self.dir = Path(tempfile.mkdtemp(prefix="shingle-etcd-"))
        ports = _free_ports(2 * members)
        self.client_ports = ports[:members]
        self.peer_ports = ports[members:]
        self.procs: list[subprocess.Popen | None] = [None] * members
        self.paused: set[int] = set()

    @property
    def endpoints(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.client_ports]

    def _name(self, i: int) -> str:
        return f"m{i}"

    def _start_member(self, i: int, state: str) -> None:
        cluster = ",".join(
            f"{self._name(j)}=http://127.0.0.1:{self.peer_ports[j]}" for j in range(self.size)
        )
        peer = f"http://127.0.0.1:{self.peer_ports[i]}"
        client = f"http://127.0.0.1:{self.client_ports[i]}"
        log = open(self.dir / f"{self._name(i)}.log", "ab")
        self.procs[i] = subprocess.Popen(
            [
                str(ETCD),
                "--name",
                self._name(i),
                "--data-dir",
                str(self.dir / self._name(i)),
                "--listen-client-urls",
                client,
                "--advertise-client-urls",
                client,
                "--listen-peer-urls",
                peer,
                "--initial-advertise-peer-urls",
                peer,
                "--initial-cluster",
                cluster,
                "--initial-cluster-state",
                state,
                "--initial-cluster-token",
                self.dir.name,
                "--election-timeout",
                str(self.election_ms),
                "--heartbeat-interval",
                str(self.heartbeat_ms),
                "--enable-v2=false",
                "--logger=zap",
                "--log-outputs=stderr",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()

    def start(self) -> EtcdCluster:
        if not etcd_installed():
            raise RuntimeError(f"{ETCD} not found: scripts/bootstrap.sh installs etcd-server")
        for i in range(self.size):
            self._start_member(i, "new")
        self.wait_ready()
        return self

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Until every running member answers and the cluster has a raft leader."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(self._has_leader(i) for i in self.running()):
                return
            for i in self.running():
                proc = self.procs[i]
                if proc is not None and proc.poll() is not None:
                    raise RuntimeError(f"etcd member {i} exited: {self.log_tail(i)}")
            time.sleep(0.05)
        raise RuntimeError(f"etcd did not become ready: {self.log_tail(0)}")

    def _status(self, i: int) -> dict:
        request = urllib.request.Request(
            self.endpoints[i] + "/v3/maintenance/status", data=b"{}", method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=1) as response:
                return json.loads(response.read())
        except (OSError, ValueError):
            return {}

    def _has_leader(self, i: int) -> bool:
        return int(self._status(i).get("leader", 0)) != 0

    def raft_leader(self) -> int | None:
        """The member that is etcd's raft leader, as it says itself (None: none answers so)."""
        for i in self.running():
            status = self._status(i)
            if status and status.get("leader") == status.get("header", {}).get("member_id"):
                return i
        return None

    def running(self) -> list[int]:
        return [
            i
            for i, proc in enumerate(self.procs)
            if proc is not None and proc.poll() is None and i not in self.paused
        ]

    def log_tail(self, i: int) -> str:
        path = self.dir / f"{self._name(i)}.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else "(no log)"

    def kill(self, i: int) -> None:
        """kill -9 of member ``i`` (its data stays: ``restart(i)`` brings it back)."""
        proc = self.procs[i]
        if proc is not None and proc.poll() is None:
            if i in self.paused:
                self.resume(i)
            proc.kill()
            proc.wait()

    def restart(self, i: int) -> None:
        self._start_member(i, "existing")

    def pause(self, i: int) -> None:
        proc = self.procs[i]
        assert proc is not None and proc.poll() is None, f"etcd member {i} is not running"
        os.kill(proc.pid, signal.SIGSTOP)
        self.paused.add(i)

    def resume(self, i: int) -> None:
        proc = self.procs[i]
        if proc is not None and i in self.paused:
            os.kill(proc.pid, signal.SIGCONT)
        self.paused.discard(i)

    def stop(self) -> None:
        for i, proc in enumerate(self.procs):
            if proc is None:
                continue
            if i in self.paused:
                self.resume(i)
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        self.procs = [None] * self.size
        _taken.difference_update(self.client_ports + self.peer_ports)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> EtcdCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


REPO = Path(__file__).resolve().parent.parent
# a maintenance leader in a process of its own (a host a test can kill -9): prints "elected TOKEN"
_LEADER_PROCESS = """
import sys, time
from engine.cluster.etcd import EtcdClient
from engine.cluster.leader import FencedLeader
endpoints, name, ttl = sys.argv[1].split(","), sys.argv[2], float(sys.argv[3])
leader = FencedLeader(EtcdClient(endpoints), name, ttl_s=ttl).start()
token = leader.wait_elected(60)
print("elected", token, flush=True)
time.sleep(3600)
"""


class LeaderProcess:
    """A FencedLeader campaigning in a child process; ``wait_elected()`` is its token."""

    def __init__(self, endpoints: list[str], name: str, ttl_s: float):
        import sys

        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _LEADER_PROCESS, ",".join(endpoints), name, str(ttl_s)],
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )

    def wait_elected(self) -> int:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().split()
        if len(line) != 2 or line[0] != "elected" or line[1] == "None":
            raise RuntimeError(f"leader process was not elected: {line}")
        return int(line[1])

    def kill(self) -> None:
        """kill -9: the lease is left to expire."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
