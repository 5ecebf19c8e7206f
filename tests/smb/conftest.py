"""A real `shingle serve --smb-port P` (NFS, the FUSE mount, smbd) with small drives, shared by the
tests of this folder that use it; SMB users are added through the CLI as an admin would."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import clirunner
import pytest

REPO = Path(__file__).resolve().parents[2]
PASSWORDS = {"alice": "alice-pw-1", "bob": "bob-pw-2"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def shingle(
    config: Path, *args: str, stdin: str | None = None, check: bool = True
) -> subprocess.CompletedProcess:
    done = clirunner.run(["-c", str(config), *args], input=stdin, timeout=60)
    if check:
        assert done.returncode == 0, done.stderr + done.stdout
    return done


@dataclass
class Served:
    root: Path
    config: Path
    nfs_port: int
    smb_port: int
    proc: subprocess.Popen

    @property
    def mount(self) -> Path:
        return self.root / "a" / "smb" / "mount"

    @property
    def data(self) -> Path:
        return self.root / "a"

    def smbclient(
        self, share: str, user: str | None, commands: str, check: bool = True
    ) -> subprocess.CompletedProcess:
        auth = ["-N"] if user is None else ["-U", f"{user}%{PASSWORDS[user]}"]
        done = subprocess.run(
            [
                "smbclient",
                f"//127.0.0.1/{share}",
                "-p",
                str(self.smb_port),
                *auth,
                "--timeout",
                "300",
                "-c",
                commands,
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if check:
            assert done.returncode == 0 and "NT_STATUS" not in done.stdout, (
                done.stdout + done.stderr
            )
        return done

    def wait_for(self, predicate, timeout: float = 20.0, what: str = "condition") -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert self.proc.poll() is None, "shingle serve exited"
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.2)

    def smbd_pids(self) -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    cmd = (entry / "cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if cmd and cmd[0].endswith(b"smbd") and str(self.data).encode() in b" ".join(cmd):
                    found.append(int(entry.name))
        return found


def start_served(drive_size: str = "256MiB") -> Served:
    # smbd works as each SMB user: every folder above the mount must be searchable by others
    # (pytest's own temp folders are 0700)
    root = Path(tempfile.mkdtemp(prefix="shingle-smb-"))
    root.chmod(0o755)
    nfs_port, smb_port = free_port(), free_port()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "appliance.cli",
            "init",
            str(root / "a"),
            "--drives",
            "10",
            "--drive-size",
            drive_size,
            "--zone-size",
            "16MiB",
            "--nfs-port",
            str(nfs_port),
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=60,
    )
    config = root / "a" / "shingle.toml"
    log = open(root / "serve.log", "w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "appliance.cli",
            "-c",
            str(config),
            "serve",
            "--no-web",
            "--smb-port",
            str(smb_port),
        ],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    served = Served(root, config, nfs_port, smb_port, proc)
    served.wait_for(lambda: "SMB:" in (root / "serve.log").read_text(), 30, "shingle serve")
    return served


def stop_served(served: Served) -> None:
    served.proc.send_signal(signal.SIGTERM)
    try:
        served.proc.wait(60)
    except subprocess.TimeoutExpired:
        served.proc.kill()
        served.proc.wait(30)
    log = (served.root / "serve.log").read_text()
    leftover = served.smbd_pids()
    for pid in leftover:
        os.kill(pid, signal.SIGKILL)
    mounted = os.path.ismount(served.mount)
    if mounted:
        subprocess.run(["fusermount3", "-u", "-z", str(served.mount)], check=False)
    shutil.rmtree(served.root, ignore_errors=True)
    assert served.proc.returncode == 0, log[-3000:]
    assert not leftover, f"smbd processes left behind: {leftover}"
    assert not mounted, "the mount was left behind"


HERE = Path(__file__).resolve().parent
_shared: list[Served] = []  # the folder's one appliance while it runs


@pytest.fixture(scope="session")
def _stop_served_at_the_end():
    """Stops the shared appliance if the run ends early (-x), before the folder's last test."""
    yield
    if _shared:
        stop_served(_shared.pop())


@pytest.fixture
def served(_stop_served_at_the_end) -> Served:
    """One `shingle serve` for the tests of this folder that need no private one: starting it
    takes ~4 s on a quiet machine and ~60 s at the suite's load, once per module before. Each
    test works in files, folders and shares of names of its own. It is stopped after the last
    test of the folder that runs (pytest_runtest_teardown below), so not left serving while
    other folders run."""
    if not _shared:
        started = start_served()
        try:
            for name, password in PASSWORDS.items():
                shingle(
                    started.config,
                    "smb",
                    "user",
                    "add",
                    name,
                    "--password-stdin",
                    stdin=password + "\n",
                )
        except BaseException:
            stop_served(started)
            raise
        _shared.append(started)
    return _shared[0]


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem) -> None:
    # after the item's own fixtures are torn down (trylast): stop the shared appliance when the
    # next test is not in this folder, or none is left
    if _shared and (nextitem is None or Path(nextitem.path).resolve().parent != HERE):
        stop_served(_shared.pop())


@pytest.fixture
def smb_session(served):
    """smbprotocol's high-level client logged in as alice."""
    import smbclient

    smbclient.register_session(
        "127.0.0.1",
        username="alice",
        password=PASSWORDS["alice"],
        port=served.smb_port,
        encrypt=False,
    )
    yield smbclient
    smbclient.reset_connection_cache()


def unc(served: Served, share: str, path: str = "") -> str:
    return f"\\\\127.0.0.1\\{share}" + ("\\" + path.replace("/", "\\") if path else "")
