"""A cluster on one machine: every host a Linux network namespace, wired to a bridge.

The bridge lives in a namespace of its own (``shb-<pid>-bridge``), and each host's namespace
(``shb-<pid>-<host>``) holds the far end of a veth pair whose near end (``v-<host>``) is a port
of that bridge. Addresses come from ``SUBNET`` (10.131.0.0/24) and, for IPv6, ``SUBNET6``
(fdbe:d131::/64, a unique local prefix; a host's IPv6 address ends in its IPv4 address's last
number), which exist only inside these namespaces: they have no default route, and the
machine's own interfaces, routes and firewall are never touched, so nothing a test sends leaves
the machine. The run's pid in every name
tells parallel runs apart, and lets a later run remove what a killed one left behind
(``remove_leftovers``).

What runs there: three etcd members (Debian etcd-server, v3 API only) and two or three
PostgreSQL 15 members under Patroni (Debian patroni 3.0.2) with synchronous_mode on, each in
its own host; clients (a head, the writers of a test) run in further hosts (``add_host``,
``run``). The test process itself stays in the machine's namespace and reaches the hosts by
``call`` (a thread that joins a host's namespace) or through a PostgreSQL member's Unix socket
(``socket_url``): no address of the machine's own namespace is used.

Failures: ``kill_host`` kills every process of a host at once (a power cut, as far as its
processes go: the kernel keeps what they wrote); ``cut_link`` sets the bridge's end of the
host's veth down (netem is not available, and a down link drops everything both ways);
``heal`` brings every host back and waits until the cluster is whole again.

Patroni's timings are shortened (ttl 10 s, loop_wait 2 s, retry_timeout 3 s; its defaults
30/10/10 make a failover take half a minute), and wal_sender_timeout is 5 s, else an isolated
primary's shutdown waits a minute for its WAL senders.

Processes: Patroni starts the postmaster detached from itself, so the test process becomes a
child subreaper (prctl) while a bed is up, and every process a bed kills is reaped by it (PID 1
here reaps nothing)."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

SUBNET = "10.131.0"  # a /24 that exists only inside the bed's namespaces
SUBNET6 = "fdbe:d131::"  # a /64 likewise (unique local, used nowhere else): SUBNET6 + "21"
PREFIX = "shb-"  # every namespace and run folder of a bed: shb-<pid>-...
NAME = re.compile(rf"^{PREFIX}(\d+)-")
PG_BIN = Path("/usr/lib/postgresql/15/bin")
ETCD_CLIENT_PORT = 2379
ETCD_PEER_PORT = 2380
POSTGRES_PORT = 5432
PATRONI_PORT = 8008
SCOPE = "shingle"  # the Patroni cluster's name
CLEAN_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
CLONE_NEWNET = 0x40000000
PR_SET_CHILD_SUBREAPER = 36
# Patroni's timings (see the module docstring); loop_wait + 2 * retry_timeout <= ttl
PATRONI_TTL_S = 10
PATRONI_LOOP_WAIT_S = 2
PATRONI_RETRY_TIMEOUT_S = 3
STUCK_AFTER_S = 20.0  # a member not back this long after heal() restored its link is restarted

_libc = ctypes.CDLL(None, use_errno=True)


class BedUnavailable(RuntimeError):
    """Network namespaces cannot be made here (not root, no iproute2, a sandbox)."""


@dataclass
class Service:
    """A process a host runs, started again by ``revive`` after the host was killed."""

    name: str
    argv: list[str]
    user: str | None
    log: Path
    proc: subprocess.Popen | None = None


@dataclass
class Host:
    name: str
    address: str
    address6: str
    netns: str
    link: str  # the bridge's end of the host's veth pair
    folder: Path
    services: list[Service] = field(default_factory=list)
    killed: bool = False
    cut: bool = False


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def netns_pids(netns: str) -> list[int]:
    done = _ip("netns", "pids", netns, check=False)
    return [int(word) for word in done.stdout.split()]


def _reap(pids: list[int], timeout: float = 10.0) -> None:
    """Wait for ``pids`` killed by us: our children, or orphans we adopted as subreaper."""
    deadline = time.monotonic() + timeout
    left = set(pids)
    while left and time.monotonic() < deadline:
        for pid in list(left):
            try:
                done, _status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # not ours (or already reaped): gone from our view
                if not _pid_alive(pid):
                    left.discard(pid)
                continue
            if done:
                left.discard(pid)
        if left:
            time.sleep(0.02)


def kill_netns_processes(netns: str) -> None:
    """SIGKILL every process of ``netns`` until none is left (a postmaster may fork meanwhile)."""
    for _ in range(20):
        pids = netns_pids(netns)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _reap(pids)
    raise RuntimeError(f"processes of {netns} survive SIGKILL: {netns_pids(netns)}")


def remove_leftovers() -> list[str]:
    """Delete the namespaces (and their processes) and run folders of beds whose test run is
    gone (killed before its clean-up ran); returns the names removed."""
    removed = []
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        netns = line.split()[0] if line.split() else ""
        found = NAME.match(netns)
        if found and not _pid_alive(int(found.group(1))):
            kill_netns_processes(netns)
            _ip("netns", "del", netns, check=False)
            removed.append(netns)
    for folder in Path(tempfile.gettempdir()).glob(f"{PREFIX}*"):
        found = re.match(rf"^{PREFIX}(\d+)$", folder.name)
        if found and not _pid_alive(int(found.group(1))):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(str(folder))
    return removed


def check_netns() -> None:
    """Raise BedUnavailable with the reason if network namespaces cannot be made here."""
    if os.geteuid() != 0:
        raise BedUnavailable("the cluster test bed needs root (network namespaces)")
    if shutil.which("ip") is None:
        raise BedUnavailable("the cluster test bed needs iproute2 (the ip command)")
    probe = f"{PREFIX}{os.getpid()}-netns-check"  # a hyphen: no host of a bed has it
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        raise BedUnavailable(f"cannot make a network namespace: {made.stderr.strip()}")
    try:
        veth = _ip(
            "-n",
            probe,
            "link",
            "add",
            "name",
            "va",
            "type",
            "veth",
            "peer",
            "name",
            "vb",
            check=False,
        )
        if veth.returncode != 0:
            raise BedUnavailable(f"cannot make a veth pair: {veth.stderr.strip()}")
    finally:
        _ip("netns", "del", probe, check=False)


def root_network() -> str:
    """The machine's own links, addresses, routes and rules, as ``ip`` lists them: a bed must
    leave them as they were."""
    return "\n".join(
        _ip(*args).stdout
        for args in (
            ["-o", "link"], ["-o", "addr"], ["route", "show", "table", "all"],
            ["-6", "route", "show", "table", "all"], ["rule"],
        )
    )  # fmt: skip


def in_netns(netns: str, work: Callable[[], T]) -> T:
    """``work()`` run by a new thread that first joins ``netns``: sockets it opens belong to
    that namespace (setns changes only the calling thread's namespace; the thread then ends)."""
    outcome: dict[str, Any] = {}

    def joined():
        try:
            fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
            try:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns into {netns}: {os.strerror(err)}")
            finally:
                os.close(fd)
            outcome["value"] = work()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=joined, name=f"in-{netns}")
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _get_json(url: str, timeout: float = 2.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as reply:
        return json.loads(reply.read())


class Bed:
    """See the module docstring. ``with Bed() as bed:`` or ``start()`` / ``close()``."""

    def __init__(self, *, etcd_members: int = 3, postgres_members: int = 3):
        # no members at all: a bed of plain hosts (drive agents and their head, bench/cluster.py)
        if not 0 <= etcd_members <= 9 or not 0 <= postgres_members <= 9:
            raise ValueError(
                f"{etcd_members} etcd and {postgres_members} PostgreSQL members: 0-9 each"
            )
        if postgres_members and not etcd_members:
            raise ValueError("PostgreSQL members under Patroni need etcd members")
        self.pid = os.getpid()
        self.prefix = f"{PREFIX}{self.pid}-"
        self.folder = Path(tempfile.gettempdir()) / f"{PREFIX}{self.pid}"
        self.bridge_netns = self.prefix + "bridge"
        self.hosts: dict[str, Host] = {}
        self.etcd_names = [f"etcd{i}" for i in range(1, etcd_members + 1)]
        self.postgres_names = [f"pg{i}" for i in range(1, postgres_members + 1)]
        self.probe = "probe"  # where the test's own queries (Patroni, etcd health) come from
        self._next_client = 100
        self._lock = threading.Lock()
        self._closed = False
        self.restarted_stuck: list[str] = []  # members heal() had to restart (see heal)
        self.root_network_before = ""  # root_network() when the bed started

    # -- life ----------------------------------------------------------------------------------
    def __enter__(self) -> Bed:
        return self.start()

    def __exit__(self, *_exc) -> None:
        self.close()

    def start(self, timeout: float = 120.0) -> Bed:
        remove_leftovers()
        self.root_network_before = root_network()
        if _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
        atexit.register(self.close)
        try:
            self.folder.mkdir(mode=0o755)
            _ip("netns", "add", self.bridge_netns)
            _ip("-n", self.bridge_netns, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.bridge_netns, "link", "set", "br0", "up")
            for i, name in enumerate(self.etcd_names, start=11):
                self.add_host(name, f"{SUBNET}.{i}")
            for i, name in enumerate(self.postgres_names, start=21):
                self.add_host(name, f"{SUBNET}.{i}")
            self.add_host(self.probe, f"{SUBNET}.250")
            for name in self.etcd_names:
                self._start_etcd(self.hosts[name])
            if self.etcd_names:
                self.wait_for(self._etcd_healthy, timeout, "etcd members healthy")
            for name in self.postgres_names:
                self._start_patroni(self.hosts[name])
            if self.postgres_names:
                self.wait_healthy(timeout)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Stop every process, delete every namespace and the run folder (also after a failed
        start; a second call does nothing). Every step is tried even when one fails (a process
        stuck in the kernel, say); the first failure is raised at the end. In a forked child of
        the test process it does nothing: the bed is its parent's."""
        with self._lock:
            if self._closed or os.getpid() != self.pid:
                return
            self._closed = True
        failures: list[BaseException] = []

        def attempt(step: Callable[[], object]) -> None:
            try:
                step()
            except Exception as exc:  # noqa: BLE001 - raised once everything was tried
                failures.append(exc)

        for host in self.hosts.values():
            attempt(lambda host=host: kill_netns_processes(host.netns))
            for service in host.services:
                if service.proc is not None:
                    attempt(lambda proc=service.proc: proc.wait(10))
        for host in self.hosts.values():
            _ip("netns", "del", host.netns, check=False)
        attempt(lambda: kill_netns_processes(self.bridge_netns))
        _ip("netns", "del", self.bridge_netns, check=False)
        shutil.rmtree(self.folder, ignore_errors=True)
        atexit.unregister(self.close)
        _libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        if failures:
            raise failures[0]

    # -- hosts ---------------------------------------------------------------------------------
    def add_host(self, name: str, address: str | None = None) -> Host:
        """A new host: its namespace, its veth pair on the bridge, its address, a folder."""
        if not re.fullmatch(r"[a-z][a-z0-9]{0,11}", name):
            raise ValueError(f"host name {name!r}: expected 1-12 lowercase letters and digits")
        if name in self.hosts:
            raise ValueError(f"host {name} exists already")
        if address is None:
            with self._lock:
                self._next_client += 1
                if self._next_client >= 250:
                    raise ValueError("no free address left in the bed's subnet")
                address = f"{SUBNET}.{self._next_client}"
        netns, link = self.prefix + name, f"v-{name}"
        folder = self.folder / name
        folder.mkdir(mode=0o755)
        address6 = SUBNET6 + address.rsplit(".", 1)[1]
        host = Host(name, address, address6, netns, link, folder)
        self.hosts[name] = host  # before anything is made: close() removes what was
        _ip("netns", "add", netns)
        _ip("-n", self.bridge_netns, "link", "add", link, "type", "veth",
            "peer", "name", "eth0", "netns", netns)  # fmt: skip
        _ip("-n", self.bridge_netns, "link", "set", link, "master", "br0", "up")
        _ip("-n", netns, "addr", "add", f"{address}/24", "dev", "eth0")
        # nodad: usable at once (duplicate address detection would hold it a second or more)
        _ip("-n", netns, "addr", "add", f"{address6}/64", "dev", "eth0", "nodad")
        _ip("-n", netns, "link", "set", "eth0", "up")
        _ip("-n", netns, "link", "set", "lo", "up")
        return host

    def remove_host(self, name: str) -> None:
        """A host gone for good: its processes killed, its namespace (and so its veth pair)
        and its folder deleted."""
        host = self.hosts.pop(name)
        kill_netns_processes(host.netns)
        for service in host.services:
            if service.proc is not None:
                service.proc.wait(10)
        _ip("netns", "del", host.netns, check=False)
        shutil.rmtree(host.folder, ignore_errors=True)

    def run(
        self, host: str, argv: list[str], *, user: str | None = None, **popen: Any
    ) -> subprocess.Popen:
        """Start ``argv`` in ``host``'s namespace (as ``user``, else root); the caller waits."""
        return subprocess.Popen(self._in_host(host, argv, user), **popen)

    def call(self, host: str, work: Callable[[], T]) -> T:
        """``work()`` from inside ``host``'s namespace (see in_netns)."""
        return in_netns(self.hosts[host].netns, work)

    def _in_host(self, host: str, argv: list[str], user: str | None) -> list[str]:
        # setpriv execs (runuser would fork): the service stays our child
        drop = [] if user is None else [
            "setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups"]  # fmt: skip
        return ["ip", "netns", "exec", self.hosts[host].netns, *drop, *argv]

    def _start(self, host: Host, service: Service) -> None:
        env = {"PATH": CLEAN_PATH, "LANG": "C.UTF-8", "HOME": str(host.folder)}
        with open(service.log, "ab") as log:
            service.proc = self.run(
                host.name, service.argv, user=service.user, env=env,
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=host.folder,
            )  # fmt: skip

    # -- failures ------------------------------------------------------------------------------
    def kill_host(self, name: str) -> None:
        """Every process of the host killed at once (SIGKILL); ``revive`` starts them again."""
        host = self.hosts[name]
        kill_netns_processes(host.netns)
        for service in host.services:
            if service.proc is not None:
                service.proc.wait()
        host.killed = True

    def revive(self, name: str) -> None:
        """Start a killed host's services again, on the data they left."""
        host = self.hosts[name]
        for service in host.services:
            self._start(host, service)
        host.killed = False

    def cut_link(self, name: str) -> None:
        """The host's link down: nothing goes in or out until ``restore_link``."""
        _ip("-n", self.bridge_netns, "link", "set", self.hosts[name].link, "down")
        self.hosts[name].cut = True

    def restore_link(self, name: str) -> None:
        _ip("-n", self.bridge_netns, "link", "set", self.hosts[name].link, "up")
        self.hosts[name].cut = False

    def heal(self, timeout: float = 120.0) -> None:
        """Every link up, every killed host revived; returns once the cluster is whole.

        A PostgreSQL member whose Patroni is not running within ``STUCK_AFTER_S`` is
        restarted (its host killed and revived), and its name added to ``restarted_stuck``:
        Patroni 3.0.2 can hang a primary for good when its demotion (DCS lost) is slower
        than retry_timeout and the main loop starts a second one alongside
        (patroni/patroni#3372); an operator, or systemd, restarts it likewise. Not only a cut
        member: on a loaded machine a primary whose link stayed up can lose etcd long enough
        (seen in CI after the 12-agent host-loss test: state "stopping" for good)."""
        for host in self.hosts.values():
            if host.cut:
                self.restore_link(host.name)
            if host.killed:
                self.revive(host.name)
        self.wait_for(self._etcd_healthy, timeout, "etcd members healthy")
        try:
            self.wait_healthy(STUCK_AFTER_S)
            return
        except TimeoutError:
            pass
        members = self._running_members()
        for name in self.postgres_names:
            if name not in members:
                self.restarted_stuck.append(name)
                self.kill_host(name)
                self.revive(name)
        self.wait_healthy(timeout)

    def _running_members(self) -> set[str]:
        try:
            return {m["name"] for m in self.cluster() if m.get("state") in ("running", "streaming")}
        except RuntimeError:
            return set()

    # -- etcd ----------------------------------------------------------------------------------
    @property
    def etcd_endpoints(self) -> list[str]:
        return [f"http://{self.hosts[n].address}:{ETCD_CLIENT_PORT}" for n in self.etcd_names]

    def _start_etcd(self, host: Host) -> None:
        data = host.folder / "data"
        data.mkdir(mode=0o700)
        etcd_user = pwd.getpwnam("etcd")
        os.chown(data, etcd_user.pw_uid, etcd_user.pw_gid)
        peers = ",".join(
            f"{n}=http://{self.hosts[n].address}:{ETCD_PEER_PORT}" for n in self.etcd_names
        )
        argv = [
            "etcd", "--name", host.name, "--data-dir", str(data),
            "--listen-peer-urls", f"http://{host.address}:{ETCD_PEER_PORT}",
            "--initial-advertise-peer-urls", f"http://{host.address}:{ETCD_PEER_PORT}",
            "--listen-client-urls", f"http://{host.address}:{ETCD_CLIENT_PORT}",
            "--advertise-client-urls", f"http://{host.address}:{ETCD_CLIENT_PORT}",
            "--initial-cluster", peers, "--initial-cluster-state", "new",
            "--initial-cluster-token", self.prefix + "etcd", "--enable-v2=false",
        ]  # fmt: skip
        host.services.append(Service("etcd", argv, "etcd", host.folder / "etcd.log"))
        self._start(host, host.services[-1])

    def etcd_status(self) -> dict[str, dict]:
        """Each member's status (``/v3/maintenance/status``: its raft leader's id, its own, the
        raft term) as the probe host gets it; {"error": why} for a member that did not answer."""

        def status(endpoint: str) -> dict:
            request = urllib.request.Request(
                f"{endpoint}/v3/maintenance/status", data=b"{}", method="POST"
            )
            try:
                with urllib.request.urlopen(request, timeout=2.0) as reply:
                    got = json.loads(reply.read())
            except (OSError, ValueError) as exc:
                return {"error": str(exc)}
            return {
                "leader": got.get("leader"),
                "self": got.get("header", {}).get("member_id"),
                "term": got.get("raftTerm"),
            }

        return {
            name: self.call(self.probe, lambda e=endpoint: status(e))
            for name, endpoint in zip(self.etcd_names, self.etcd_endpoints, strict=True)
        }

    def etcd_leader(self) -> str | None:
        """The member every etcd member names as its raft leader; None while they disagree, or
        one does not answer (an election under way, a member cut off)."""
        seen = self.etcd_status()
        names = {state.get("self"): name for name, state in seen.items()}
        leaders = {state.get("leader") for state in seen.values()}
        if len(leaders) != 1 or any("error" in state for state in seen.values()):
            return None
        return names.get(leaders.pop())

    def etcd_elections(self) -> list[str]:
        """The raft elections the members' logs tell of, member by member (each logs each
        one): an election renews every lease for a whole TTL (etcd 3.4 keeps no remaining
        TTL), so it delays the expiry of a lease nobody keeps alive."""
        lines = []
        for name in self.etcd_names:
            for service in self.hosts[name].services:
                try:
                    text = service.log.read_text(errors="replace")
                except OSError:
                    continue
                lines += [f"{name}: {x}" for x in text.splitlines() if "elected leader" in x]
        return lines

    def _etcd_healthy(self) -> bool:
        def healthy(endpoint: str) -> bool:
            try:
                return _get_json(f"{endpoint}/health").get("health") == "true"
            except (OSError, ValueError):
                return False

        return all(self.call(self.probe, lambda e=e: healthy(e)) for e in self.etcd_endpoints)

    # -- PostgreSQL under Patroni --------------------------------------------------------------
    def _start_patroni(self, host: Host) -> None:
        postgres_user = pwd.getpwnam("postgres")
        os.chown(host.folder, postgres_user.pw_uid, postgres_user.pw_gid)
        config = host.folder / "patroni.yml"
        # JSON is YAML: no YAML writer needed
        config.write_text(json.dumps(self._patroni_config(host), indent=1))
        argv = ["patroni", str(config)]
        host.services.append(Service("patroni", argv, "postgres", host.folder / "patroni.log"))
        self._start(host, host.services[-1])

    def _patroni_config(self, host: Host) -> dict:
        subnet = f"{SUBNET}.0/24"
        return {
            "scope": SCOPE,
            "name": host.name,
            "log": {"level": "INFO"},
            "restapi": {
                "listen": f"{host.address}:{PATRONI_PORT}",
                "connect_address": f"{host.address}:{PATRONI_PORT}",
            },
            "etcd3": {
                "hosts": [f"{self.hosts[n].address}:{ETCD_CLIENT_PORT}" for n in self.etcd_names]
            },
            "bootstrap": {
                "dcs": {
                    "ttl": PATRONI_TTL_S,
                    "loop_wait": PATRONI_LOOP_WAIT_S,
                    "retry_timeout": PATRONI_RETRY_TIMEOUT_S,
                    "maximum_lag_on_failover": 1 << 20,
                    # a commit is acknowledged once a standby has it; only that standby may
                    # be promoted
                    "synchronous_mode": True,
                    "postgresql": {
                        "use_pg_rewind": True,
                        "use_slots": True,
                        "parameters": {
                            "wal_log_hints": "on",
                            "max_connections": 200,
                            "shared_buffers": "32MB",
                            "wal_keep_size": "128MB",
                            "wal_sender_timeout": "5s",
                            "wal_receiver_timeout": "5s",
                            "hot_standby": "on",
                        },
                    },
                },
                "initdb": [{"encoding": "UTF8"}, "no-sync"],
            },
            "postgresql": {
                "listen": f"{host.address}:{POSTGRES_PORT}",
                "connect_address": f"{host.address}:{POSTGRES_PORT}",
                "data_dir": str(host.folder / "data"),
                "bin_dir": str(PG_BIN),
                "pgpass": str(host.folder / "pgpass"),
                "authentication": {
                    "superuser": {"username": "postgres", "password": "postgres"},
                    "replication": {"username": "replicator", "password": "replicator"},
                },
                # the machine's /var/run/postgresql is not the member's: a folder each
                "parameters": {"unix_socket_directories": str(host.folder)},
                # only the bed's own subnet exists where these members listen
                "pg_hba": [
                    "local all all trust",
                    f"host all all {subnet} trust",
                    f"host replication all {subnet} trust",
                ],
                # an old primary that cannot be rewound is cloned again
                "remove_data_directory_on_rewind_failure": True,
                "remove_data_directory_on_diverged_timelines": True,
            },
            "watchdog": {"mode": "off"},
        }

    def postgres_url(self, database: str, **query: str) -> str:
        """The catalog URL of a head: every member, and libpq picks the writable one."""
        hosts = "&".join(
            f"host={self.hosts[n].address}:{POSTGRES_PORT}" for n in self.postgres_names
        )
        extra = "".join(f"&{key}={value}" for key, value in query.items())
        return (
            f"postgresql+psycopg://postgres@/{database}?{hosts}"
            f"&target_session_attrs=read-write{extra}"
        )

    def socket_url(self, member: str, database: str) -> str:
        """A URL of one member through its Unix socket, for the test process itself (Unix
        sockets are files: no network namespace in between)."""
        folder = self.hosts[member].folder
        return f"postgresql+psycopg://postgres@/{database}?host={folder}&port={POSTGRES_PORT}"

    def socket_conninfo(self, member: str, database: str = "postgres") -> str:
        return (
            f"host={self.hosts[member].folder} port={POSTGRES_PORT} user=postgres dbname={database}"
        )

    def cluster(self) -> list[dict]:
        """Patroni's view of its members (``/cluster`` of the first member that answers)."""
        last: Exception | None = None
        for name in self.postgres_names:
            host = self.hosts[name]
            if host.killed or host.cut:
                continue
            url = f"http://{host.address}:{PATRONI_PORT}/cluster"
            try:
                return self.call(self.probe, lambda url=url: _get_json(url))["members"]
            except (OSError, ValueError, KeyError) as exc:
                last = exc
        raise RuntimeError(f"no Patroni member answers: {last}")

    def _role(self, role: str) -> str | None:
        try:
            members = self.cluster()
        except RuntimeError:
            return None
        for member in members:
            if member.get("role") == role and member.get("state") in ("running", "streaming"):
                return member["name"]
        return None

    def primary(self) -> str | None:
        """The member Patroni holds as leader, running; None during a failover."""
        return self._role("leader")

    def sync_standby(self) -> str | None:
        return self._role("sync_standby")

    def wait_primary(self, timeout: float = 60.0, *, other_than: str | None = None) -> str:
        found: list[str] = []

        def ready() -> bool:
            name = self.primary()
            if name is None or name == other_than:
                return False
            found.append(name)
            return True

        self.wait_for(ready, timeout, f"a primary other than {other_than}")
        return found[-1]

    def wait_healthy(self, timeout: float = 120.0) -> None:
        """A running primary, a synchronous standby, and every other member streaming."""

        def whole() -> bool:
            try:
                members = self.cluster()
            except RuntimeError:
                return False
            roles = {m["name"]: (m.get("role"), m.get("state")) for m in members}
            if set(roles) != set(self.postgres_names):
                return False
            if any(state not in ("running", "streaming") for _role, state in roles.values()):
                return False
            kinds = [role for role, _state in roles.values()]
            return kinds.count("leader") == 1 and kinds.count("sync_standby") == 1

        self.wait_for(whole, timeout, "the PostgreSQL members whole (a primary, a sync standby)")

    def wait_for(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not within {timeout:.0f} s\n{self.log_tails()}")
            time.sleep(0.2)

    def log_tails(self, lines: int = 15) -> str:
        """The last lines of every service's log (they go with the run folder at close)."""
        parts = []
        for host in self.hosts.values():
            for service in host.services:
                try:
                    tail = service.log.read_text(errors="replace").splitlines()[-lines:]
                except OSError:
                    continue
                parts.append(f"--- {host.name} {service.name}\n" + "\n".join(tail))
        return "\n".join(parts)
