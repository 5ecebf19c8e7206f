"""What the kernel NFS client rig runs (versions, users, known failures) and the
`shingle serve` it runs against; the fixtures are in conftest.py."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import clirunner
import guest_nfs
from doc_blocks import doc_blocks
from pgserver import free_port

HERE = Path(__file__).resolve().parent
# NFSv4.2 runs the same checks as 4.1, on a mount where the client uses 4.2's operations
# (READ_PLUS, SEEK, ALLOCATE, COPY ...), and with "v42" the checks of guest_nfs.V42_CHECKS
# (cp --reflink, fallocate, punch hole, SEEK_DATA/SEEK_HOLE, xattrs, snapshot views). A version
# listed in NOT_IMPLEMENTED has its checks expected to fail (test_kernel_nfs.py marks them
# xfail(strict) by label).
# "nlm": the version locks through NLM, which the guest finds through the server's port
# mapper on 10.0.2.2:111 (the daemon serves it on the host's 127.0.0.1:111); "lock_peer": a
# mount of that version in the same guest must see this version's locks.
NFS_VERSIONS = [
    {"label": "v4.1", "options": "vers=4.1"},
    {
        "label": "v3",
        "options": "vers=3,proto=tcp,port={port},mountport={port},mountproto=tcp",
        "nlm": True,
        "lock_peer": "v4.1",
    },
    {"label": "v4.0", "options": "vers=4.0"},
    {"label": "v4.2", "options": "vers=4.2", "v42": True},
]
NOT_IMPLEMENTED: dict[str, str] = {}
# Checks that fail today for a known reason; xfail(strict) so that a fix shows up as a failure
# that asks for the entry to be removed.
_V3_ATIME = (
    "atime set to 1 ns after the epoch (utimensat) reads back 0 over NFSv3 from the Linux "
    "client, while nfs-rs over NFSv3 keeps it: client or server side not yet known"
)
KNOWN_FAILURES = {
    "v3/root/utimes-ns": _V3_ATIME,
    "v3/uid1000/utimes-ns": _V3_ATIME,
}
UIDS = [0, guest_nfs.UNPRIVILEGED]
RESTART_VERSION = "v4.1"
# the daemon's nfs.copy_offload_mib_s: guest_nfs.check_copy_offload_restart meets a copy running
COPY_OFFLOAD_MIB_S = 8
VM_TIMEOUT_S = 2400
# docs/clients.md's examples: importing torch takes minutes under TCG on a loaded machine
DOCS_TIMEOUT_S = 1200


PORTMAP_PORT = 111  # where the Linux client asks for the server's NLM port
# the root-squash checks (in the main VM boot, against a daemon of their own serving `shingle
# init`'s default export: root squashed)
ROOT_SQUASH_VERSIONS = [
    {"label": "v4.1", "options": "vers=4.1"},
    {"label": "v4.0", "options": "vers=4.0"},
    {
        "label": "v3",
        "options": "vers=3,proto=tcp,port={port},mountport={port},mountproto=tcp,nolock",
    },
]
# the delegation checks (guest_nfs.DELEGATION_CHECKS): small files read in two epochs; the
# lease is the daemon's (ShingleDaemon.init)
DELEGATIONS = {
    "label": "v4.1",
    "options": "vers=4.1",
    "files": 1000,
    "lease_seconds": 30,
    "write_check": True,
}
# NFSv4.0's: the server calls the guest's callback service back at the address the mount
# names (clientaddr, the host's side of a qemu forward to the guest's nfs.callback_tcpport);
# fewer files, the same checks
DELEGATIONS40 = {
    "label": "v4.0",
    "options": "vers=4.0,clientaddr=127.0.0.1",
    "files": 100,
    "lease_seconds": 30,
    "write_check": True,  # a write delegation over the callback address (CB_GETATTR)
}


# the Kerberos run (its own VM boot, a KDC on the host, rpc.gssd in the guest): the default
# export allows krb5, krb5i and krb5p only; a user with a ticket (uid 1, daemon@REALM, whom the
# server maps to uid 1 through its own passwd) writes and reads under each, v4.1 and v3
KRB5_GUEST = "krb5client"  # the guest's hostname: its machine key is nfs/KRB5_GUEST@REALM
KRB5_FLAVORS = ("krb5", "krb5i", "krb5p")
KRB5_VERSIONS = [
    {"label": "v4.1", "options": "vers=4.1"},
    {
        "label": "v3",
        "options": "vers=3,proto=tcp,port={port},mountport={port},mountproto=tcp,nolock",
    },
]
KRB5_USER_UID, KRB5_NO_TICKET_UID = 1, 2  # daemon and bin, in every Debian passwd
KRB5_TIMEOUT_S = 900
KRB5_IDMAP_DOMAIN = "shingle.test"  # the server's nfs.idmap_domain and the guest's idmapd.conf


def krb5_plan(port: int, kdc=None) -> dict:
    """``kdc`` (tests/kdcserver.KdcServer) fills in the realm's files; None gives the names
    only (the host lists the checks before any KDC runs)."""
    spec: dict = {
        "flavors": list(KRB5_FLAVORS),
        "versions": KRB5_VERSIONS,
        "uid": KRB5_USER_UID,
        "no_ticket_uid": KRB5_NO_TICKET_UID,
        "idmap_domain": KRB5_IDMAP_DOMAIN,
    }
    if kdc is not None:
        from kdcserver import SERVER_HOST

        spec.update(
            server_name=SERVER_HOST,
            krb5_conf=kdc.krb5_conf_text(guest_nfs.SERVER),
            keytab=str(kdc.dir / "guest.keytab"),
            user_keytab=str(kdc.client_keytab),
            user_principal=f"daemon@{kdc.realm}",
        )
    return {"port": port, "versions": [], "uids": [], "krb5": spec}


def root_squash_plan(port: int) -> dict:
    """The root-squash checks against a daemon on ``port``: the entries the main run's plan
    takes them with (guest_nfs.run_root_squash mounts ``root_squash_port``)."""
    versions = [{**v, "options": v["options"].format(port=port)} for v in ROOT_SQUASH_VERSIONS]
    return {"root_squash": versions, "root_squash_port": port}


def plan_for(port: int, skip_locks: str = "", callback_port: int = 0, lockd_port: int = 0) -> dict:
    """``skip_locks``: why NLM cannot be reached (the port mapper is not served); the NLM
    versions then mount with nolock and report their lock checks as skipped.
    ``callback_port``: the guest's NFSv4.0 callback port, forwarded from the host's
    127.0.0.1 (0: the names of the checks only). ``lockd_port``: the guest's lockd port
    (NlmCallbackPorts.lockd; 0: the kernel picks one)."""
    versions = []
    for version in NFS_VERSIONS:
        version = {**version, "options": version["options"].format(port=port)}
        if version.get("nlm") and skip_locks:
            version["options"] += ",nolock"
            version["skip_locks"] = skip_locks
        versions.append(version)
    return {
        "port": port,
        "versions": versions,
        "delegations": DELEGATIONS,
        "delegations40": {**DELEGATIONS40, "callback_port": callback_port},
        "lockd_port": lockd_port,
        "uids": UIDS,
        "worker_timeout": 420,
        # the host's restart: the daemon's stop (60 s bound) and start (60 s bound)
        "restart_timeout": 180,
        "restart_version": RESTART_VERSION,
        # docs/clients.md's runs=vm examples, with the guest's view of the server
        "docs": {
            "python": sys.executable,  # the project's venv, seen through the shared root
            "blocks": [
                {"name": b.name, "lang": b.lang, "code": b.for_server(guest_nfs.SERVER, port)}
                for b in doc_blocks()
                if b.where == "vm"
            ],
            "timeout": DOCS_TIMEOUT_S,
            # imported ahead with the examples' own imports (guest_nfs.run_doc_python): the
            # checkpoint example's first optimizer step imports torch._dynamo (sympy, some 800
            # modules: 10 s on this host, minutes under TCG)
            "warm_imports": ["torch._dynamo"],
        },
    }


@dataclass(frozen=True)
class NlmCallbackPorts:
    """Host ports qemu forwards to the guest so that the daemon's NLM_GRANTED callbacks reach
    the guest's lockd: ``rpcbind`` to the guest's port mapper (111), which the daemon asks as
    its nfs.client_rpcbind_port, and ``lockd`` to the same port of the guest, where its lockd
    listens (fs.nfs.nlm_tcpport). Without them a callback to 127.0.0.1 would ask the daemon's
    own port mapper, so the daemon sends none and a blocked NFSv3 lock waits for the client's
    30 s retry."""

    rpcbind: int
    lockd: int

    @classmethod
    def pick(cls) -> NlmCallbackPorts:
        return cls(free_port(), free_port())

    def config_line(self) -> str:
        return f"client_rpcbind_port = {self.rpcbind}\n"

    def host_forwards(self) -> tuple[tuple[int, int], int]:
        return ((self.rpcbind, 111), self.lockd)


class ShingleDaemon:
    """`shingle serve` in a subprocess on a fixed port, restartable."""

    def __init__(self, home: Path, port: int):
        self.home, self.port = home, port
        self.config = home / "shingle.toml"
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.serve_args: tuple[str, ...] = ()  # more `shingle serve` arguments (--heads N)

    def init(
        self,
        *,
        squash: str = "no_root_squash",
        portmap: str = "serve",
        drive_size: str = "32MiB",
        sec: str = "sys",
        nfs_options: str = "",
        lease_seconds: int = 30,
        clients: str = "127.0.0.1/32",
    ) -> ShingleDaemon:
        """``squash``, ``sec``: the default export's; ``portmap`` "serve" serves the port mapper
        on PORTMAP_PORT (the NLM checks need it), "off" leaves that port to another daemon;
        ``drive_size`` of each of the ten drives (zones of 4 MiB); ``nfs_options``: more lines
        for the config's [nfs] table; ``lease_seconds``: short, so that the checks that wait a
        lease are quick; ``clients``: the export's (qemu's user-mode network reaches the host
        from 127.0.0.1; vm.run_vm's guest forwards can come from other loopback addresses)."""
        run = clirunner.run(
            [
                "init",
                str(self.home),
                "--drive-size",
                drive_size,
                "--zone-size",
                "4MiB",
                "--nfs-port",
                str(self.port),
            ],
            timeout=120,
        )
        assert run.returncode == 0, run.stderr
        # a short grace period: the restart check waits it out before the client may go on;
        # the port mapper on 111 always (not the system rpcbind's, should one run)
        text = self.config.read_text().replace(
            "[nfs]\n",
            f"[nfs]\nlease_seconds = {lease_seconds}\ngrace_seconds = 10\n"
            f'portmap = "{portmap}"\nportmap_port = {PORTMAP_PORT}\n{nfs_options}',
            1,
        )
        self.config.write_text(text)
        from appliance import config as config_mod
        from engine.catalog import Catalog
        from engine.catalog.models import Export

        catalog = Catalog(config_mod.load(self.config).catalog_url)
        try:
            catalog.run(
                lambda conn: conn.execute(
                    Export.__table__.update().values(clients=clients, squash=squash, sec=sec)
                )
            )
        finally:
            catalog.close()
        return self

    def start(self, timeout: float = 60) -> None:
        self.launch()
        self.wait_started(timeout)

    def launch(self) -> None:
        """`shingle serve` started, not waited for (wait_started): daemons started together
        start in the time of the slowest."""
        self.starts += 1
        log = open(self.home / f"serve-{self.starts}.log", "w")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "appliance.cli",
                "-c",
                str(self.config),
                "serve",
                "--no-web",
                "--nfs-port",
                str(self.port),
                *self.serve_args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()

    def wait_started(self, timeout: float = 60) -> None:
        assert self.proc is not None, "not launched"
        deadline = time.monotonic() + timeout
        while "nfs://" not in self.current_log():  # this start's log, not an earlier one's
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"shingle serve did not start: {self.current_log()[-2000:]}")
            time.sleep(0.2)

    def stop(self) -> int | None:
        self.terminate()
        return self.wait_stopped()

    def terminate(self) -> None:
        """SIGTERM, not waited for (wait_stopped)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait_stopped(self) -> int | None:
        if self.proc is None:
            return None
        try:
            status = self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            status = self.proc.wait()
        self.proc = None
        return status

    def restart(self) -> str:
        started = time.monotonic()
        status = self.stop()
        self.start()
        return f"restarted (old daemon exit {status}) in {time.monotonic() - started:.1f} s"

    def cli(self, *args: str) -> tuple[int, str]:
        """`shingle -c CONF ARGS` beside the running daemon (snapshots and clones are catalog
        rows: the CLI works while the daemon serves): exit code, output or why it failed."""
        run = clirunner.run(["-c", str(self.config), *args], timeout=120)
        if run.returncode:
            return run.returncode, f"{' '.join(args[:2])} failed: {run.stderr.strip()[-500:]}"
        return 0, run.stdout.strip()

    def snapshot_create(self, path: str, name: str) -> str:
        return self.cli("snapshot", "create", path, name)[1]

    def dataset_clone(self, snapshot: str, path: str) -> str:
        return self.cli("dataset", "clone", snapshot, path)[1]

    def snapshot_delete(self, path: str, name: str) -> str:
        """Delete, then reclaim now (the daemon's job): what the snapshot alone held is freed."""
        code, out = self.cli("snapshot", "delete", path, name)
        if code:
            return out
        code, out = self.cli("snapshot", "reclaim")
        if code:
            return out
        code, listed = self.cli("snapshot", "list", path)
        if code or "pending" in listed or name in listed:
            return f"still there after the reclaim: {listed}"
        return f"deleted and reclaimed ({' '.join(out.split())[:200]})"

    def offload_counts(self) -> str:
        """The asynchronous COPY counters of the daemon's latest metrics sample, as
        "started=N completed=N answered=N ..." (what the guest's copy-offload check reads)."""
        from appliance import config as config_mod
        from engine.admin.metrics import latest
        from engine.catalog import Catalog

        catalog = Catalog(config_mod.load(self.config).catalog_url)
        try:
            counters = latest(catalog)
        finally:
            catalog.close()
        names = {"callbacks_answered": "answered", "callbacks_failed": "unanswered"}
        prefix = "nfs_offload_"
        return " ".join(
            f"{names.get(k[len(prefix) :], k[len(prefix) :])}={int(v)}"
            for k, v in sorted(counters.items())
            if k.startswith(prefix)
        )

    def portmap_problem(self) -> str:
        """Why the running daemon does not serve the port mapper on PORTMAP_PORT ("" if it
        does): the port is taken on the host."""
        text = self.current_log()
        if f"port mapper listening on 127.0.0.1:{PORTMAP_PORT}" in text:
            return ""
        warning = re.search(r'msg="(port mapper not served[^"]*)"', text)
        return (
            f"the port mapper cannot be served on the host's port {PORTMAP_PORT}, so the guest "
            f"cannot find NLM: mounted with nolock ({warning[1] if warning else 'no log line'})"
        )

    def current_log(self) -> str:
        return (self.home / f"serve-{self.starts}.log").read_text(errors="replace")

    def log(self) -> str:
        return "\n".join(
            p.read_text(errors="replace") for p in sorted(self.home.glob("serve-*.log"))
        )


def start_all(daemons: list[ShingleDaemon], timeout: float = 60) -> None:
    """Start ``daemons`` together: each launched, then each waited for."""
    for daemon in daemons:
        daemon.launch()
    for daemon in daemons:
        daemon.wait_started(timeout)


def stop_all(daemons: list[ShingleDaemon]) -> None:
    """Stop ``daemons`` together: each sent SIGTERM, then each waited for."""
    for daemon in daemons:
        daemon.terminate()
    for daemon in daemons:
        daemon.wait_stopped()


class InBackground:
    """``work()`` in a thread (daemons' init and start while the VM boots); ``wait()`` says
    "ready" once it is done, or why it failed."""

    def __init__(self, work):
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(work,), daemon=True)
        self.thread.start()

    def _run(self, work) -> None:
        try:
            work()
        except BaseException as exc:  # noqa: BLE001 - the guest reports it as its checks' failure
            self.error = exc

    def wait(self, timeout: float = 600) -> str:
        self.thread.join(timeout)
        if self.thread.is_alive():
            return f"not ready after {timeout:.0f} s"
        return "ready" if self.error is None else f"failed: {self.error!r}"


def _second_client(port: int):
    import nfs_rs

    return nfs_rs.Client.connect(
        f"nfs://127.0.0.1:{port}/export?version=4.1",
        nfs_port=port,
        noresvport=True,
        uid=0,
        gid=0,
        connect_timeout=20,
        operation_timeout=60,
    )


def stat_as_second_client(port: int, relpath: str) -> str:
    """The size nfs-rs (NFSv4.1) sees of ``relpath``: its GETATTR of a file under the guest's
    write delegation is answered with what the guest says (CB_GETATTR)."""
    with _second_client(port) as client:
        return f"size {client.stat('/' + relpath).size}"


def read_as_second_client(port: int, relpath: str, timeout: float = 60) -> str:
    """sha256 of ``relpath`` read through nfs-rs; its OPEN waits (DELAY) while the guest's
    write delegation is recalled."""
    import hashlib

    started, tries = time.monotonic(), 0
    with _second_client(port) as client:
        while True:
            tries += 1
            try:
                with client.open("/" + relpath, "rb") as f:
                    data = f.read()
                break
            except Exception as exc:  # noqa: BLE001 - DELAY surfaces as an error nfs-rs does not retry
                if time.monotonic() - started > timeout:
                    return f"read failed after {tries} tries: {exc}"
                time.sleep(0.5)
    took = time.monotonic() - started
    return f"sha256 {hashlib.sha256(data).hexdigest()} ({tries} tries, {took:.1f} s)"


def write_as_second_client(port: int, relpath: str, data: bytes, timeout: float = 60) -> str:
    """Write ``relpath`` of the export through nfs-rs (NFSv4.1), a client other than the
    guest's: its OPEN waits (DELAY) while the guest's delegation of the file is recalled."""
    import nfs_rs

    started = time.monotonic()
    tries = 0
    client = nfs_rs.Client.connect(
        f"nfs://127.0.0.1:{port}/export?version=4.1",
        nfs_port=port,
        noresvport=True,
        uid=0,
        gid=0,
        connect_timeout=20,
        operation_timeout=60,
    )
    try:
        while True:
            tries += 1
            try:
                with client.open("/" + relpath, "wb") as f:
                    f.write(data)
                break
            except OSError as exc:  # DELAY surfaces as an error nfs-rs does not retry
                if time.monotonic() - started > timeout:
                    return f"write failed after {tries} tries: {exc}"
                time.sleep(0.5)
    finally:
        client.close()
    return f"written by nfs-rs in {time.monotonic() - started:.1f} s ({tries} tries)"
