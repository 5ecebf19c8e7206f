"""Hostile clients at the network layer, against `shingle serve` in its own process (so
that its RSS is the server's alone): record marks that announce 5 MiB and send nothing,
a thousand idle connections, a slowloris, more connections than the limit, a record
longer than the limit. A good nfs-rs client keeps working throughout."""

from __future__ import annotations

import os
import re
import resource
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time

import psutil
import pytest
from nfs4_support import MiB, nfsrs
from pgserver import free_port

MANY = 1000
RSS_BOUND = 64 * MiB  # growth allowed for MANY hostile connections (about 16 KiB each + objects)
FIVE_MIB_MARK = struct.pack(">I", 0x80000000 | (5 * MiB))


class Daemon:
    """`shingle init` + `shingle serve --no-web` with [nfs] options set, its log in a file."""

    def __init__(self, home, **nfs_options):
        self.home = home
        self.port = free_port()
        self._run(
            "init",
            str(home),
            "--drive-size",
            "48MiB",
            "--zone-size",
            "4MiB",
            "--nfs-port",
            str(self.port),
        )
        path = home / "shingle.toml"
        text = path.read_text()
        for key, value in nfs_options.items():
            text, count = re.subn(rf"^# {key} = .*$", f"{key} = {value!r}", text, flags=re.M)
            assert count == 1, key
        path.write_text(text)
        self.log_path = home / "serve.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "appliance.cli", "-c", str(path), "serve", "--no-web"],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while "nfs://" not in self.log():
            assert self.proc.poll() is None, self.log()
            assert time.monotonic() < deadline, self.log()
            time.sleep(0.1)
        self.ps = psutil.Process(self.proc.pid)

    @staticmethod
    def _run(*args):
        run = subprocess.run(
            [sys.executable, "-m", "appliance.cli", *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stderr

    def log(self) -> str:
        return self.log_path.read_text()

    def rss(self) -> int:
        return self.ps.memory_info().rss

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()
        shutil.rmtree(self.home / "drives", ignore_errors=True)


@pytest.fixture
def daemon_factory(tmp_path):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4 * MANY:  # MANY sockets in this process, the nfs-rs client's beside them
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(4 * MANY, hard), hard))
    started = []

    def start(**nfs_options):
        started.append(Daemon(tmp_path / f"d{len(started)}", **nfs_options))
        return started[-1]

    yield start
    for daemon in started:
        daemon.stop()


def good_client_works(client, name: str) -> None:
    payload = os.urandom(MiB)
    with client.open(name, "wb") as f:
        f.write(payload)
    with client.open(name, "rb") as f:
        assert f.read() == payload
    assert client.stat(name).size == MiB


def connect_many(port: int, n: int) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        socks.append(sock)
    return socks


def server_connections(daemon) -> int:
    return sum(
        1
        for c in daemon.ps.net_connections(kind="tcp")
        if c.status == psutil.CONN_ESTABLISHED and c.laddr.port == daemon.port
    )


def wait_closed(socks: list[socket.socket], timeout: float) -> dict[socket.socket, float]:
    """When each socket saw the server close it (EOF or reset), by time.monotonic()."""
    closed = {}
    sel = selectors.DefaultSelector()
    for sock in socks:
        sock.setblocking(False)
        sel.register(sock, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    while len(closed) < len(socks) and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=0.1):
            sock = key.fileobj
            try:
                data = sock.recv(65536)
            except (ConnectionResetError, BrokenPipeError):
                data = b""
            if not data:
                closed[sock] = time.monotonic()
                sel.unregister(sock)
    sel.close()
    return closed


def test_marks_announcing_5_mib_allocate_nothing_and_time_out(daemon_factory):
    record_timeout = 6
    daemon = daemon_factory(record_timeout_seconds=float(record_timeout))
    with nfsrs(daemon.port) as client:
        good_client_works(client, "warm.bin")  # the server's steady state before measuring
        before = daemon.rss()
        socks = connect_many(daemon.port, MANY)
        sent_at = time.monotonic()
        for sock in socks:
            sock.sendall(FIVE_MIB_MARK)
        while server_connections(daemon) < MANY + 1:
            assert time.monotonic() - sent_at < record_timeout - 2, server_connections(daemon)
            time.sleep(0.1)
        time.sleep(0.5)
        growth = daemon.rss() - before
        print(f"RSS growth for {MANY} connections sending a 5 MiB mark: {growth / MiB:.1f} MiB")
        assert growth < RSS_BOUND, f"{growth / MiB:.1f} MiB"
        good_client_works(client, "during.bin")
        # the records never complete: every such connection closes after the record timeout
        closed = wait_closed(socks, record_timeout + 10)
        assert len(closed) == MANY
        first = min(closed.values()) - sent_at
        last = max(closed.values()) - sent_at
        print(
            f"closed {first:.1f}-{last:.1f} s after the marks (record timeout {record_timeout} s)"
        )
        assert record_timeout - 1 < first and last < record_timeout + 3
        for sock in socks:
            sock.close()
        good_client_works(client, "after.bin")
    assert "was not complete after" in daemon.log()


def test_idle_connections_close_after_the_idle_timeout(daemon_factory):
    idle = 2.0
    daemon = daemon_factory(idle_timeout_seconds=idle)
    with nfsrs(daemon.port) as client:
        good_client_works(client, "warm.bin")
        before = daemon.rss()
        started = time.monotonic()
        socks = connect_many(daemon.port, MANY)
        connected = time.monotonic()  # under load, making 1,000 connections takes seconds
        while server_connections(daemon) < MANY + 1 and time.monotonic() - started < idle - 0.5:
            time.sleep(0.05)
        growth = daemon.rss() - before
        print(f"RSS growth for {MANY} idle connections: {growth / MiB:.1f} MiB")
        assert growth < RSS_BOUND, f"{growth / MiB:.1f} MiB"
        closed = wait_closed(socks, idle + 10)
        assert len(closed) == MANY
        first, last = min(closed.values()) - started, max(closed.values()) - connected
        print(
            f"idle connections closed {first:.1f} s after the first connected, "
            f"{last:.1f} s after the last"
        )
        assert idle - 0.5 < first and last < idle + 3
        for sock in socks:
            sock.close()
        # the client's own connection has a session bound: it may idle longer
        time.sleep(idle + 1.5)
        good_client_works(client, "after.bin")


def test_slowloris_closed_within_the_record_timeout(daemon_factory):
    record_timeout = 3.0
    daemon = daemon_factory(record_timeout_seconds=record_timeout, idle_timeout_seconds=2.0)
    with nfsrs(daemon.port) as client, socket.create_connection(("127.0.0.1", daemon.port)) as sock:
        record = struct.pack(">I", 0x80000000 | 200) + bytes(200)
        began = time.monotonic()
        closed_after = None
        for byte in record:  # one byte a second: never idle, never a whole record
            try:
                sock.send(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed_after = time.monotonic() - began
                break
            sock.settimeout(1.0)
            try:
                if sock.recv(1) == b"":
                    closed_after = time.monotonic() - began
                    break
            except TimeoutError:
                pass
            except ConnectionResetError:
                closed_after = time.monotonic() - began
                break
            if time.monotonic() - began > record_timeout + 10:
                break
        print(f"slowloris closed after {closed_after} s (record timeout {record_timeout} s)")
        assert closed_after is not None
        assert record_timeout - 0.5 < closed_after < record_timeout + 1.5
        good_client_works(client, "after.bin")


def test_connection_limit_closes_extras_with_one_log_line(daemon_factory):
    limit = 50
    daemon = daemon_factory(max_connections=limit)
    with nfsrs(daemon.port) as client:  # one of the 50
        good_client_works(client, "warm.bin")
        socks = connect_many(daemon.port, limit + 30)
        closed = wait_closed(socks, 3)
        assert len(closed) == 31, len(closed)  # 49 more fit beside the client
        good_client_works(client, "during.bin")
        for sock in socks:
            sock.close()
        deadline = time.monotonic() + 5
        while server_connections(daemon) > 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        more = connect_many(daemon.port, 5)  # room again
        assert not wait_closed(more, 1)
        for sock in more:
            sock.close()
        good_client_works(client, "after.bin")
    lines = [line for line in daemon.log().splitlines() if "connection limit reached" in line]
    assert len(lines) == 1, lines


def test_record_longer_than_the_limit_closes_the_connection(daemon_factory):
    daemon = daemon_factory(max_record_size="2MiB")
    with nfsrs(daemon.port) as client, socket.create_connection(("127.0.0.1", daemon.port)) as sock:
        sock.sendall(struct.pack(">I", 0x80000000 | (2 * MiB + 1)))
        began = time.monotonic()
        assert wait_closed([sock], 5)
        assert time.monotonic() - began < 1
        good_client_works(client, "after.bin")  # a 1 MiB WRITE still fits
    assert "exceeds nfs.max_record_size" in daemon.log()


def test_request_bytes_past_the_budget_wait_for_tcp(daemon_factory):
    """Many connections sending real bytes of records they never finish: the server holds
    at most its total budget of them; the rest waits in TCP, and the good client gets through
    once the record timeout has closed the hogs (small calls need no budget meanwhile)."""
    record_timeout = 5.0
    daemon = daemon_factory(
        max_record_size="2MiB",
        connection_budget="3MiB",
        total_budget="8MiB",
        record_timeout_seconds=record_timeout,
    )
    hogs = 60
    with nfsrs(daemon.port) as client:
        good_client_works(client, "warm.bin")
        before = daemon.rss()
        socks = connect_many(daemon.port, hogs)
        began = time.monotonic()
        chunk = struct.pack(">I", 0x80000000 | (2 * MiB)) + os.urandom(3 * MiB // 2)
        for sock in socks:
            sock.setblocking(False)
            try:
                sock.send(chunk)  # as much as the kernel takes now; never the whole record
            except BlockingIOError:
                pass
        time.sleep(1.5)
        growth = daemon.rss() - before
        print(
            f"RSS growth with {hogs} connections holding 1.5 MiB of 2 MiB records: "
            f"{growth / MiB:.1f} MiB (total budget 8 MiB)"
        )
        assert growth < 32 * MiB, f"{growth / MiB:.1f} MiB"
        assert client.stat("warm.bin").size == MiB  # a small call needs no budget
        good_client_works(client, "during.bin")  # waits for budget, at most the record timeout
        assert time.monotonic() - began < record_timeout + 10
        closed = wait_closed(socks, record_timeout + 10)
        assert len(closed) == hogs
        for sock in socks:
            sock.close()
        good_client_works(client, "after.bin")
