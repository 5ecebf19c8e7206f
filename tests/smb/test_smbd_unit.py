"""smbd in a unit of its own, as shingle-smbd.service runs it beside a daemon that is not root: a
real `shingle serve` with ``smb.smbd = "unit"`` writes smb.conf and waits for the mount; `shingle
smbd` (root, in a private mount namespace of its own as systemd gives the unit) mounts /dev/fuse,
hands the descriptor to the daemon and runs smbd. smbclient puts and gets a file through it; the
unit stops and starts again while the daemon keeps serving and takes the new mount."""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from appliance.smb.unit import CAP_SETPCAP, CAP_SYS_ADMIN
from tests.smb.conftest import PASSWORDS, REPO, free_port, shingle


def _wait_in_log(path: Path, text: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while text not in path.read_text():
        assert proc.poll() is None, f"exited {proc.returncode}: {path.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"{text!r} not in {path}: {path.read_text()[-3000:]}"
        time.sleep(0.2)


def _wait_listening(port: int, proc: subprocess.Popen, log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert proc.poll() is None, f"exited {proc.returncode}: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"smbd not listening: {log.read_text()[-3000:]}"
            time.sleep(0.2)


def _smbclient(port: int, commands: str, password: str = PASSWORDS["alice"]):
    return subprocess.run(
        [
            "smbclient",
            "//127.0.0.1/export",
            "-p",
            str(port),
            "-U",
            f"alice%{password}",
            "-c",
            commands,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _stop(proc: subprocess.Popen | None) -> int | None:
    if proc is None:
        return None
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
    return proc.returncode


def _smbd_pids(root: Path) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmd = (entry / "cmdline").read_bytes().split(b"\0") if entry.name.isdigit() else []
        except OSError:
            continue
        if cmd and cmd[0].endswith(b"smbd") and str(root).encode() in b" ".join(cmd):
            found.append(int(entry.name))
    assert found, "no smbd"
    return found


def unit_capabilities() -> str:
    """CapabilityBoundingSet= of systemd/shingle-smbd.service, as setpriv takes it."""
    unit = (REPO / "systemd" / "shingle-smbd.service").read_text()
    line = next(x for x in unit.splitlines() if x.startswith("CapabilityBoundingSet="))
    names = line.split("=", 1)[1].split()
    return ",".join("+" + n.removeprefix("CAP_").lower() for n in names)


@pytest.fixture
def unit_rig():
    root = Path(tempfile.mkdtemp(prefix="shingle-smbd-unit-"))
    root.chmod(0o755)
    nfs_port, smb_port = free_port(), free_port()
    subprocess.run(
        [sys.executable, "-m", "appliance.cli", "init", str(root / "a"), "--drives", "10"]
        + ["--drive-size", "128MiB", "--zone-size", "16MiB", "--nfs-port", str(nfs_port)],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=60,
    )
    # as /var/lib/shingle (StateDirectoryMode=0750): SMB users cannot reach the daemon's folders
    (root / "a").chmod(0o750)
    runtime = root / "run-shingle-smbd"  # the unit's RuntimeDirectory=
    runtime.mkdir(mode=0o755)
    config = root / "a" / "shingle.toml"
    text = config.read_text()
    for old, new in (("# port = 0", f"port = {smb_port}"), ('# smbd = "auto"', 'smbd = "unit"')):
        assert old in text
        text = text.replace(old, new, 1)
    config.write_text(text)
    procs: dict[str, subprocess.Popen | None] = {"daemon": None, "unit": None}

    def start(name: str, argv: list[str], env: dict | None = None) -> Path:
        log = root / f"{name}.log"
        with open(log, "a") as out:
            procs[name] = subprocess.Popen(
                argv,
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **(env or {})},
            )
        return log

    def start_unit() -> Path:
        # the unit's capabilities and NoNewPrivileges, and a mount namespace of its own as
        # systemd gives the unit: the mount stays in it
        return start(
            "unit",
            ["setpriv", "--no-new-privs", "--bounding-set", f"-all,{unit_capabilities()}"]
            + ["unshare", "--mount", "--propagation", "private", sys.executable]
            + ["-m", "appliance.cli", "-c", str(config), "smbd"],
            {"RUNTIME_DIRECTORY": str(runtime)},
        )

    try:
        daemon_log = start(
            "daemon",
            [sys.executable, "-m", "appliance.cli", "-c", str(config), "serve", "--no-web"],
        )
        yield root, config, smb_port, procs, daemon_log, start_unit
    finally:
        unit_status = _stop(procs["unit"])
        daemon_status = _stop(procs["daemon"])
        shutil.rmtree(root, ignore_errors=True)
        assert unit_status in (None, 0), f"shingle smbd exited {unit_status}"
        assert daemon_status in (None, 0), f"shingle serve exited {daemon_status}"


def test_smbd_unit_mounts_for_the_daemon_and_serves_put_and_get(unit_rig, tmp_path):
    root, config, port, procs, daemon_log, start_unit = unit_rig
    _wait_in_log(daemon_log, "hand over the SMB mount", procs["daemon"])
    assert (root / "a" / "smb" / "smb.conf").exists()
    assert not os.path.ismount(root / "a" / "smb" / "mount"), "the daemon mounted by itself"
    # DATA_DIR/smb belongs to the service user (here nobody), as on an installed appliance
    smb_dir = root / "a" / "smb"
    nobody = pwd.getpwnam("nobody")
    os.chown(root / "a", 0, nobody.pw_gid)
    os.chown(smb_dir, nobody.pw_uid, nobody.pw_gid)
    shingle(config, "smb", "user", "add", "alice", "--password-stdin", stdin="alice-pw-1\n")

    unit_log = start_unit()
    _wait_in_log(daemon_log, "hand-over 1", procs["daemon"])
    _wait_listening(port, procs["unit"], unit_log)
    source = tmp_path / "put.bin"
    data = os.urandom(3 << 20)
    source.write_bytes(data)
    done = _smbclient(port, f"put {source} unit.bin")
    assert done.returncode == 0 and "NT_STATUS" not in done.stdout, done.stdout + done.stderr
    # the mount's kernel may hold the size it read mid-transfer for its attribute timeout (1 s),
    # as tests/smb/test_smb.py notes; the bytes are what this test is about
    time.sleep(1.5)
    done = _smbclient(port, f"get unit.bin {tmp_path / 'back.bin'}")
    assert done.returncode == 0 and "NT_STATUS" not in done.stdout, done.stdout + done.stderr
    assert hashlib.sha256((tmp_path / "back.bin").read_bytes()).digest() == (
        hashlib.sha256(data).digest()
    )
    # smbd itself keeps neither the mount's capability nor the one that dropped it
    for pid in _smbd_pids(root):
        status = Path(f"/proc/{pid}/status").read_text()
        bounding = int(
            next(x for x in status.splitlines() if x.startswith("CapBnd:")).split()[1], 16
        )
        assert not bounding & (1 << CAP_SYS_ADMIN | 1 << CAP_SETPCAP), f"smbd {pid}: {bounding:#x}"
    # the mount lives only in the unit's namespace: never in the host's (the daemon's)
    assert not os.path.ismount(root / "run-shingle-smbd" / "mount")
    assert f"path = {root / 'run-shingle-smbd' / 'mount'}" in (root / "a/smb/smb.conf").read_text()

    # what root wrote to the passdb (the CLI; smbd's secrets) stays the service user's: its web
    # UI changes alice's password with pdbedit, as itself
    assert {p.stat().st_uid for p in (smb_dir / "private").iterdir()} == {nobody.pw_uid}
    changed = subprocess.run(
        ["runuser", "-u", "nobody", "--", "env", "LD_PRELOAD=libnss_wrapper.so"]
        + [
            f"NSS_WRAPPER_PASSWD={smb_dir / 'nss/passwd'}",
            f"NSS_WRAPPER_GROUP={smb_dir / 'nss/group'}",
        ]
        + ["pdbedit", "-s", str(smb_dir / "tools.conf"), "-a", "-t", "-u", "alice"],
        input="alice-pw-2\nalice-pw-2\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    # (it also says it cannot open smbd's root-owned state databases: warnings only; the login
    # with the new password below is the proof)
    assert changed.returncode == 0, changed.stderr

    # the unit stops and comes back: the daemon serves on, and takes the new mount
    assert _stop(procs["unit"]) == 0
    _wait_in_log(daemon_log, "the SMB mount went away", procs["daemon"])
    assert procs["daemon"].poll() is None
    unit_log = start_unit()
    _wait_in_log(daemon_log, "hand-over 2", procs["daemon"])
    deadline = time.monotonic() + 60
    while True:
        again = _smbclient(port, f"get unit.bin {tmp_path / 'again.bin'}", "alice-pw-2")
        if again.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert again.returncode == 0, again.stdout + again.stderr + unit_log.read_text()[-2000:]
    assert (tmp_path / "again.bin").read_bytes() == data
