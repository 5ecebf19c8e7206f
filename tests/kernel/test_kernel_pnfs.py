"""The Linux kernel client (6.1, fs/nfs/filelayout) against a pNFS metadata server and two
data servers: three `shingle serve` heads over one catalog and one set of drives
(docs/pnfs.md). One VM boot runs every check of guest_pnfs.py; each is its own test. Then
nfs-rs, an NFSv4.1 client without pNFS, reads and writes through a data server head.

The heads: `shingle init` makes the metadata server's folder (catalog, ten drives); each data
server has a folder of its own (its daemon lock) with a config naming the same catalog, so all
three write the same drives, each in its own zones ([heads] count 3). The guest reaches them
at 10.0.2.2:PORT (qemu user networking), which is also how the metadata server lists them.

The same boot mounts a `shingle serve --heads 2` of its own (TwoHeads): NFSv4.1 over a kill -9
of its head, and NFSv3 with NLM through both heads at once (qemu's guestfwd relays two guest
addresses from two loopback addresses of the host, tcp_from.py, so the listener hands them to
different heads), then a kill -9 under an NLM lock: the guest's statd gets SM_NOTIFY (its
port mapper and statd are forwarded from the host) and its lockd reclaims. The guest's
write delegation through head 0 answers nfs-rs's GETATTR through head 1 (CB_GETATTR across
heads). The daemon listens on :: and the VM has IPv6: NFSv4.1 and NFSv3 with NLM over IPv6
(Relay6 serves the guest's rpcbind lookups on the host's [::1]:111)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import guest_nfs
import guest_pnfs
import pytest
import vm
from nfs_rig import (
    HERE,
    InBackground,
    ShingleDaemon,
    read_as_second_client,
    start_all,
    stat_as_second_client,
    stop_all,
)
from pgserver import free_port

from appliance.nfs.handoff import head_for
from appliance.nfs.pnfs import MEMBERSHIP_KEY

CHECKS = [f"pnfs/{name}" for name in guest_pnfs.CHECKS]
# the whole VM run: 93-220 s measured (one boot, every check); a stuck write fails its check
# after guest_pnfs.STEP_TIMEOUT_S, and this bounds the rest, far inside CI's budget
VM_TIMEOUT_S = 600
SIZE_MIB = 32  # four stripe units of 8 MiB (the killed data server's write; the others half)


def _configure(text: str, section: str, lines: str) -> str:
    head = f"[{section}]\n"
    assert head in text, f"no [{section}] in the rendered config"
    return text.replace(head, head + lines, 1)


class Heads:
    """A metadata server and two data servers on 127.0.0.1, sharing one catalog: their ports
    now, their folders by prepare() (the guest's plan needs only the ports)."""

    def __init__(self, folder: Path):
        self.folder = folder
        ports = [free_port() for _ in range(3)]
        self.mds = ShingleDaemon(folder / "mds", ports[0])
        self.others: list[ShingleDaemon] = []  # more daemons of the run, whose logs help too
        self.ds = [ShingleDaemon(folder / f"ds{i}", port) for i, port in enumerate(ports[1:])]
        self.catalog = (self.mds.home / "catalog.db").resolve()

    def prepare(self) -> None:
        # 3 heads share each drive's zones: 32 of 4 MiB, about 10 each, 2 kept for cleaning
        self.mds.init(portmap="off", drive_size="128MiB")
        catalog = self.catalog
        assert catalog.exists(), f"no catalog at {catalog}"
        listed = ",".join(f"{guest_nfs.SERVER}:{d.port}" for d in self.ds)
        common = 'lease_seconds = 30\ngrace_seconds = 0\nportmap = "off"\n'
        text = self.mds.config.read_text()
        text = _configure(text, "heads", "count = 3\nindex = 0\n")
        text = _configure(text, "pnfs", f'role = "mds"\ndata_servers = "{listed}"\n')
        text = text.replace("grace_seconds = 10\n", "grace_seconds = 0\n", 1)
        self.mds.config.write_text(text)
        for index, head in enumerate(self.ds, start=1):
            head.home.mkdir(parents=True)
            head.config.write_text(
                f'[catalog]\nurl = "sqlite:///{catalog}"\n\n[nfs]\nport = {head.port}\n{common}'
                f'\n[heads]\ncount = 3\nindex = {index}\n\n[pnfs]\nrole = "ds"\n'
                f'address = "{guest_nfs.SERVER}:{head.port}"\n'
                + ('\n[logging]\nlevel = "debug"\n' if os.environ.get("SHINGLE_PNFS_DEBUG") else "")
            )

    def daemons(self) -> list[ShingleDaemon]:
        return [self.mds, *self.ds]

    def written_by(self, name: str) -> dict[str, int]:
        """Bytes of the export's file ``name`` per head that wrote them, from the catalog: a
        head appends only to zones whose number modulo 3 is its index, so the zone of a
        stripe's first fragment names the head that wrote it (the heads' own counters would be
        the code under test, and TCP counters restart with each connection the client
        re-makes)."""
        with sqlite3.connect(f"file:{self.catalog}?mode=ro", uri=True) as conn:
            rows = conn.execute(
                "SELECT COALESCE(z.idx % 3, -1), SUM(e.length) FROM dirents d "
                "JOIN extents e ON e.ino = d.child "
                "LEFT JOIN fragments f ON f.stripe_id = e.stripe_id AND f.idx = 0 "
                "LEFT JOIN zones z ON z.id = f.zone_id WHERE d.name = ? "
                "GROUP BY COALESCE(z.idx % 3, -1)",
                (name,),
            ).fetchall()
        # -1: bytes kept inline in the catalog (a write of less than 64 KiB): no zone
        return {str(index): int(total) for index, total in rows}

    def serving(self) -> list[int]:
        """The ports of the data servers new layouts name, as the metadata server published
        them (docs/pnfs.md: a dead head's data server is left out)."""
        with sqlite3.connect(f"file:{self.catalog}?mode=ro", uri=True) as conn:
            (raw,) = conn.execute(
                "SELECT value FROM settings WHERE key = ?", (MEMBERSHIP_KEY,)
            ).fetchone()
        return [int(address.rsplit(":", 1)[1]) for address in json.loads(raw)["data_servers"]]

    def kill_ds(self, index: int) -> str:
        proc = self.ds[index].proc
        if proc is None:
            return f"data server {index} is not running"
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        self.ds[index].proc = None
        return f"killed data server {index} (port {self.ds[index].port})"

    def ds_writes(self, mode: str) -> str:
        """Restart every data server with [pnfs] data_server_writes = ``mode`` (the killed
        one comes back too)."""
        stop_all(self.ds)
        for head in self.ds:
            text = head.config.read_text()
            text = "\n".join(
                line for line in text.splitlines() if not line.startswith("data_server_writes")
            )
            text = text.replace("[pnfs]\n", f'[pnfs]\ndata_server_writes = "{mode}"\n', 1)
            head.config.write_text(text + "\n")
        start_all(self.ds)
        return f"data servers restarted with data_server_writes = {mode}"

    def remove_drives(self) -> None:
        shutil.rmtree(self.mds.home / "drives", ignore_errors=True)

    def logs(self) -> str:
        daemons = [self.mds, *self.ds, *self.others]
        return "\n".join(f"== {h.home.name}\n{h.log()[-3000:]}" for h in daemons)


class Relay6:
    """The host's [::1]:111 relayed to the heads' port, which answers the port mapper too: the
    guest's lockd asks rpcbind at the IPv6 address it mounted (qemu's guestfwd, which the IPv4
    mounts use, is IPv4 only). IPv6 only, so another test's IPv4 port mapper on 111 stays
    free to run; None when [::1]:111 is taken."""

    def __init__(self, port: int):
        self.port = port
        self.sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("::1", 111))
        self.sock.listen(16)
        threading.Thread(target=self._accept, daemon=True).start()

    @classmethod
    def start(cls, port: int) -> Relay6 | None:
        try:
            return cls(port)
        except OSError:
            return None

    def _accept(self) -> None:
        while True:
            try:
                guest, _ = self.sock.accept()
                server = socket.create_connection(("::1", self.port), timeout=30)
            except OSError:
                return  # closed
            for a, b in ((guest, server), (server, guest)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for end in (src, dst):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.close()


def _when(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


class TwoHeads:
    """`shingle serve --heads 2` of its own (issue 32: a mounted client goes on after a kill -9
    of the head serving it): one port, two head processes behind the listener."""

    def __init__(self, folder: Path):
        # the NFSv3 checks: the guest's statd on statd_port, its port mapper on
        # client_rpcbind_port (both forwarded from the host's 127.0.0.1), and this server's
        # NSM name the address its client mounted, as the guest's statd knows the server
        self.statd_port, self.guest_rpcbind_port = free_port(), free_port()
        self.daemon = ShingleDaemon(folder / "heads2", free_port())
        self.daemon.serve_args = ("--heads", "2")

    def prepare(self) -> None:
        # listening on :: takes the IPv4 clients too; the guest's IPv6 ones come from ::1
        self.daemon.init(
            portmap="off",
            clients="127.0.0.0/8,::1/128",
            nfs_options=f'nsm_name = "{guest_pnfs.V3_THROUGH_1}"\n'
            f'client_rpcbind_port = {self.guest_rpcbind_port}\nhost = "::"\n',
        )

    def guest_forwards(self) -> tuple[tuple[str, int, str], ...]:
        """The guest's two ways to the heads (tcp_from.py): through V3_THROUGH_1 from 127.0.0.1
        (head 1) and through V3_THROUGH_0 from 127.0.0.2 (head 0), for the heads' port and the
        port mapper's (which the heads also answer on their port)."""
        relay = f"/usr/bin/python3 -I -S {HERE / 'tcp_from.py'}"
        port = self.daemon.port
        return tuple(
            (address, guest_port, f"{relay} {source} {port}")
            for address, source in (
                (guest_pnfs.V3_THROUGH_1, "127.0.0.1"),
                (guest_pnfs.V3_THROUGH_0, "127.0.0.2"),
            )
            for guest_port in (port, 111)
        )

    def status(self) -> list[dict]:
        return json.loads((self.daemon.home / "heads.json").read_text())["heads"]

    def grace(self) -> str:
        """How the restarted head's grace period went, from its log lines since the kill: the
        seconds it was given and after how many it was over (before its time: every previous
        client reclaimed and sent RECLAIM_COMPLETE)."""
        text = self.daemon.current_log().rsplit("exited with status -9", 1)[-1]
        given = re.search(r'ts=(\S+) .*msg="grace period of (\d+) s for (\d+) previous', text)
        over = re.search(r'ts=(\S+) .*msg="grace period over"', text)
        if given is None or over is None:
            return "no grace period in the restarted head's log"
        took = (_when(over[1]) - _when(given[1])).total_seconds()
        notified = re.findall(r'msg="(SM_NOTIFY [^"]*)"', text)
        return json.dumps(
            {
                "seconds": int(given[2]),
                "clients": int(given[3]),
                "over_after": took,
                "sm_notify": notified,
            }
        )

    def kill_serving(self) -> str:
        """kill -9 of the head that serves the guest (qemu connects from 127.0.0.1), then wait
        for the listener to start it again under its index."""
        index = head_for("127.0.0.1", 2)
        old = self.status()[index]["pid"]
        os.kill(old, signal.SIGKILL)
        started = time.monotonic()
        while time.monotonic() - started < 60:
            now = self.status()[index]
            if now["serving"] and now["pid"] != old:
                took = time.monotonic() - started
                return f"killed head {index} (pid {old}), serving again in {took:.1f} s"
            time.sleep(0.2)
        return f"head {index} not serving again 60 s after the kill: {self.status()}"


@pytest.fixture(scope="module")
def pnfs_run(vm_kernel, kernel_rig_dir):
    folder = kernel_rig_dir / "pnfs"
    folder.mkdir()
    heads = Heads(folder)
    two = TwoHeads(folder)
    heads.others.append(two.daemon)
    daemons = [*heads.daemons(), two.daemon]

    def prepare_and_start() -> None:
        heads.prepare()
        two.prepare()
        start_all(daemons)

    # the daemons' init and start (a minute at load) go on while the VM boots; the guest asks
    # "daemons-ready" before its first mount
    ready = InBackground(prepare_and_start)
    relay6 = Relay6.start(two.daemon.port)

    def on_request(text: str) -> str:
        action, *args = text.split()
        try:
            if action == "daemons-ready" and not args:
                return ready.wait()
            if action == "written-by" and len(args) == 1:
                return json.dumps(heads.written_by(args[0]))
            if action == "ds-writes" and len(args) == 1:
                return heads.ds_writes(args[0])
            if action == "serving" and not args:
                return json.dumps(heads.serving())
            if action == "kill-head" and not args:
                return two.kill_serving()
            if action == "grace" and not args:
                return two.grace()
            if action == "kill-ds" and len(args) == 1:
                return heads.kill_ds(int(args[0]))
            # nfs-rs connects from 127.0.0.1: head 1 of the `--heads 2` daemon
            if action == "heads-stat" and len(args) == 1:
                return stat_as_second_client(two.daemon.port, args[0])
            if action == "heads-read" and len(args) == 1:
                return read_as_second_client(two.daemon.port, args[0])
        except Exception as exc:  # noqa: BLE001 - the guest reports it as its check's failure
            return f"{action} failed: {exc}"
        return f"unknown request {text!r}"

    guest = folder / "guest"
    guest.mkdir()
    for name in ("guest_nfs.py", "guest_pnfs.py"):
        shutil.copy(HERE / name, guest / name)
    plan = guest / "plan.json"
    plan.write_text(
        json.dumps(
            {
                "mds_port": heads.mds.port,
                "ds_ports": [d.port for d in heads.ds],
                "heads_port": two.daemon.port,
                "size_mib": SIZE_MIB,
                "statd_port": two.statd_port,
                "ipv6_rpcbind": relay6 is not None,
            }
        )
    )
    program = guest / "run.sh"
    program.write_text(f"#!/bin/sh\ncd {guest}\nexec /usr/bin/python3 guest_pnfs.py {plan}\n")
    for path in guest.iterdir():
        path.chmod(0o755)
    verbose = os.environ.get("SHINGLE_KERNEL_RIG_VERBOSE")
    try:
        result = vm.run_vm(
            program,
            kernel=vm_kernel,
            workdir=folder / "vm",
            requests=on_request,
            timeout=VM_TIMEOUT_S,
            on_line=(lambda line: print(line, file=sys.stderr)) if verbose else None,
            guest_forwards=two.guest_forwards(),
            host_forwards=((two.guest_rpcbind_port, 111), two.statd_port),
            ipv6=True,
            host_cache="loose",  # the guest reads only what was written before it boots
        )
        print(f"kernel pNFS rig: VM ran {result.seconds:.0f} s", file=sys.stderr)
        checks = result.checks()
        for name, (verdict, details) in checks.items():
            print(f"kernel pNFS rig: {verdict} {name} {details}", file=sys.stderr)
        yield heads, result, checks
    finally:
        if relay6 is not None:
            relay6.close()
        ready.wait()  # none is started after the stop
        stop_all(daemons)
        heads.remove_drives()
        shutil.rmtree(two.daemon.home / "drives", ignore_errors=True)


@pytest.mark.timeout(VM_TIMEOUT_S + 120)
@pytest.mark.parametrize("check", CHECKS)
def test_kernel_pnfs(pnfs_run, check):
    heads, result, checks = pnfs_run
    if check not in checks:
        pytest.fail(
            f"{check}: no result (exit {result.exit_status}, timed out {result.timed_out});\n"
            + "\n".join(result.lines[-20:])
            + f"\nconsole:\n{result.console[-2000:]}\n{heads.logs()}"
        )
    verdict, details = checks[check]
    assert verdict == "PASS", f"{check}: {details}\n{heads.logs()}"


@pytest.mark.timeout(VM_TIMEOUT_S + 120)
def test_nfs_rs_through_a_data_server(pnfs_run):
    """A client without pNFS (nfs-rs, NFSv4.1) works through a data server head: it reads the
    file the kernel client wrote through the layout, and what it writes reads back."""
    heads, _, checks = pnfs_run
    assert "pnfs/striped-4.1" in checks, "the VM run wrote nothing to read"
    import nfs_rs

    def client(port: int):
        return nfs_rs.Client.connect(
            f"nfs://127.0.0.1:{port}/export?version=4.1",
            nfs_port=port,
            noresvport=True,
            uid=0,
            gid=0,
            connect_timeout=20,
            operation_timeout=60,
        )

    digests = {}
    payload = os.urandom(3 << 20)
    with client(heads.ds[0].port) as cl:  # data server 1 was killed in the VM run; 0 serves
        with cl.open("striped-pnfs41", "rb") as f:
            data = f.read()
        assert len(data) == SIZE_MIB << 19  # (guest_pnfs: striped-4.1 writes half)
        digests["data server"] = hashlib.sha256(data).hexdigest()
        with cl.open("nfs-rs-through-ds", "wb") as f:
            f.write(payload)
    with client(heads.mds.port) as cl:
        with cl.open("striped-pnfs41", "rb") as f:
            digests["metadata server"] = hashlib.sha256(f.read()).hexdigest()
        with cl.open("nfs-rs-through-ds", "rb") as f:
            assert f.read() == payload
    assert digests["data server"] == digests["metadata server"], digests
