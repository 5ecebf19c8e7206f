"""`shingle serve` under a Type=notify unit: READY=1 once NFS accepts connections,
WATCHDOG=1 at half WatchdogSec.

The test is systemd's side of the protocol: a datagram socket named by
NOTIFY_SOCKET, and WATCHDOG_USEC in the daemon's environment."""

from __future__ import annotations

import itertools
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from appliance.host import doctor
from tests.install.conftest import REPO, shingle
from tests.pgserver import free_port

# Pings are expected every WATCHDOG_USEC / 2 = 0.5 s; systemd would kill the
# daemon after 1 s without one.
WATCHDOG_USEC = 1_000_000


@pytest.fixture(scope="module")
def appliance_dir(tmp_path_factory):
    """One `shingle init` for the module; each test passes its own free
    ports on the command line."""
    folder = tmp_path_factory.mktemp("sdnotify") / "app"
    shingle(
        "init",
        str(folder),
        "--drives",
        "10",
        "--drive-size",
        "16MiB",
        "--zone-size",
        "4MiB",
        "--nfs-port",
        "0",
        "--web-port",
        "0",
    )
    return folder


@pytest.fixture
def notify_socket():
    folder = tempfile.mkdtemp(
        prefix="sdn-"
    )  # AF_UNIX paths are limited to 108 bytes: keep it short
    path = os.path.join(folder, "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    yield sock, path
    sock.close()
    os.unlink(path)
    os.rmdir(folder)


def accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def receive_until_ready(sock, daemon, timeout: float = 60.0) -> list[tuple[float, str]]:
    """Datagrams up to and including READY=1; fails at once with the daemon's stderr if it exits."""
    sock.settimeout(0.2)
    messages, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            data = sock.recv(4096).decode()
        except TimeoutError:
            if daemon.poll() is not None:
                pytest.fail(
                    f"shingle serve exited {daemon.returncode} before "
                    f"READY=1:\n{daemon.stderr.read()[-3000:]}"
                )
            continue
        messages.append((time.monotonic(), data))
        if "READY=1" in data.split("\n"):
            return messages
    pytest.fail(f"no READY=1 within {timeout} s (got {messages})")


@pytest.mark.parametrize("heads", [1, 2])
def test_ready_after_nfs_accepts_and_watchdog_at_interval(appliance_dir, notify_socket, heads):
    """With --heads 2 the listener answers for its heads: READY=1 once both serve, its own
    watchdog pings."""
    sock, path = notify_socket
    nfs_port = free_port()
    folder = appliance_dir

    first_accept = []

    def probe():  # when did the port first accept, as seen from outside?
        while not first_accept and daemon.poll() is None:
            if accepts(nfs_port):
                first_accept.append(time.monotonic())
            time.sleep(0.01)

    env = {**os.environ, "NOTIFY_SOCKET": path, "WATCHDOG_USEC": str(WATCHDOG_USEC)}
    env.pop("WATCHDOG_PID", None)
    daemon = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "appliance.cli",
            "-c",
            str(folder / "shingle.toml"),
            "serve",
            "--no-web",
            "--nfs-port",
            str(nfs_port),
            "--heads",
            str(heads),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    try:
        messages = receive_until_ready(sock, daemon)
        ready_at = messages[-1][0]
        assert accepts(nfs_port), "READY=1 sent while the NFS port does not accept connections"
        prober.join(5)
        assert first_accept and first_accept[0] <= ready_at + 0.05
        assert "STATUS=serving" in messages[-1][1].split("\n")
        assert not any(
            "WATCHDOG=1" in m for _, m in messages[:-1]
        )  # no ping before the daemon is ready

        # Watchdog pings, for about 2.6 s.
        sock.settimeout(WATCHDOG_USEC / 1e6 * 2)
        pings = []
        deadline = time.monotonic() + 2.6
        while time.monotonic() < deadline:
            data = sock.recv(4096).decode()
            if data == "WATCHDOG=1":
                pings.append(time.monotonic())
        gaps = [b - a for a, b in itertools.pairwise(pings)]
        assert len(pings) >= 4, pings
        interval = WATCHDOG_USEC / 1e6 / 2
        assert interval * 0.8 <= statistics.median(gaps) <= interval * 1.5, gaps
        assert max(gaps) < WATCHDOG_USEC / 1e6, gaps  # never late enough for systemd to kill it

        # While the daemon holds the port, doctor counts it as shingle's, not a conflict.
        check = doctor.check_port("nfs", "127.0.0.1", nfs_port)
        assert check.status == "ok" and "held by shingle" in check.detail, check
    finally:
        daemon.send_signal(signal.SIGTERM)
        out, err = daemon.communicate(timeout=60)
    assert daemon.returncode == 0, err
    # Structured log lines on stdout, for journald.
    assert any(
        line.startswith("ts=")
        and f" level=info{' head=1' if heads > 1 else ''} logger=shingle.daemon "
        'msg="NFS server listening'
        in line
        for line in out.splitlines()
    ), out


def test_watchdog_pings_only_while_healthy(notify_socket, monkeypatch, caplog):
    """A server thread that died or a probe that raises stops the pings, so
    systemd restarts the daemon."""
    from appliance.host.sdnotify import Watchdog, watchdog_interval

    sock, path = notify_socket
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    monkeypatch.setenv("WATCHDOG_USEC", "100000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))  # systemd meant another process
    assert watchdog_interval() is None
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert watchdog_interval() == 0.05

    state = {"healthy": True}

    def probe():
        if state["healthy"] is None:
            raise RuntimeError("probe broke")
        return state["healthy"]

    dog = Watchdog(0.05, healthy=probe)
    dog.start()
    try:
        sock.settimeout(1)
        assert sock.recv(64) == b"WATCHDOG=1"
        for broken in (False, None):
            state["healthy"] = broken
            time.sleep(0.12)  # a ping already in flight may still arrive
            sock.setblocking(False)
            while True:
                try:
                    sock.recv(64)
                except BlockingIOError:
                    break
            sock.settimeout(0.3)
            with pytest.raises(TimeoutError):
                sock.recv(64)
        assert dog.is_alive()  # the raising probe was logged, the thread lives on
        assert "watchdog health probe failed" in caplog.text
        state["healthy"] = True
        sock.settimeout(1)
        assert sock.recv(64) == b"WATCHDOG=1"
    finally:
        dog.stop()
        dog.join(1)


def test_webui_is_ready_once_gunicorn_listens(appliance_dir, notify_socket):
    """shingle-webui.service is Type=notify: `shingle webui` must leave gunicorn as
    the notifying main PID."""
    sock, path = notify_socket
    web_port = free_port()
    folder = appliance_dir
    env = {**os.environ, "NOTIFY_SOCKET": path}
    web = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "appliance.cli",
            "-c",
            str(folder / "shingle.toml"),
            "webui",
            "--port",
            str(web_port),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        receive_until_ready(sock, web)
        ready_accepts = accepts(web_port)
        running = web.poll() is None
    finally:
        web.send_signal(signal.SIGTERM)
        out, err = web.communicate(timeout=60)
    assert ready_accepts, (
        f"READY=1 sent while the web UI port does not accept connections:\n{out}\n{err[-3000:]}"
    )
    assert running and web.returncode == 0, f"exit {web.returncode}:\n{out}\n{err[-3000:]}"
