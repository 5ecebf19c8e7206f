"""`shingle install --role`: the head (today's appliance), the storage role (a drive agent
over this host's drives) or both, each its own systemd unit; bad combinations refused before
anything changes."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from appliance.host import doctor, install
from tests.install.conftest import LAUNCHER, REPO, shingle, verify
from tests.install.test_units import directives

STORAGE = [
    "--listen",
    "127.0.0.1:7400",
    "--drives",
    "/srv/smr/d1",
    "/var/lib/shingle/agent/d2",
    "--drive-size",
    "16MiB",
    "--zone-size",
    "1MiB",
    "--no-preallocate",
]


def install_roles(root: Path, *args: str, check: bool = True):
    return shingle("install", "--root", str(root), "--bin", LAUNCHER, *args, check=check)


def unit_dir(root: Path) -> Path:
    return root / "etc/systemd/system"


def test_storage_role_unit_runs_the_agent_over_its_drives(root):
    out = install_roles(root, "--role", "storage", *STORAGE).stdout
    assert "formatted drive" in out and "shingle cluster join 127.0.0.1:7400" in out
    # no head: no daemon, web UI, config or catalog on a storage host
    assert sorted(p.name for p in unit_dir(root).glob("*.service")) == [install.AGENT_SERVICE]
    assert not (root / "etc/shingle/shingle.toml").exists()
    for drive in ("srv/smr/d1", "var/lib/shingle/agent/d2"):
        assert json.loads((root / drive / "drive.json").read_text())["zone_size"] == 1 << 20
    d = directives(unit_dir(root) / install.AGENT_SERVICE)
    assert d[("Service", "ExecStart")] == [
        f"{LAUNCHER} agent --listen ${{SHINGLE_AGENT_LISTEN}} --drives $SHINGLE_AGENT_DRIVES"
    ]
    assert d[("Service", "EnvironmentFile")] == [str(install.AGENT_ENV_PATH)]
    assert d[("Service", "User")] == [install.SERVICE_USER]
    env = (root / "etc/shingle/agent.env").read_text()
    assert "SHINGLE_AGENT_LISTEN=127.0.0.1:7400\n" in env
    assert "SHINGLE_AGENT_DRIVES=/srv/smr/d1 /var/lib/shingle/agent/d2\n" in env
    # only the drive outside /var/lib/shingle needs a drop-in under ProtectSystem=strict
    dropin = unit_dir(root) / f"{install.AGENT_SERVICE}.d" / install.PATHS_DROPIN
    assert directives(dropin)[("Service", "ReadWritePaths")] == ["-/srv/smr/d1"]
    target = directives(unit_dir(root) / install.TARGET)
    assert target[("Unit", "Wants")] == [install.AGENT_SERVICE]
    for unit in (install.AGENT_SERVICE, install.TARGET):
        result = verify(root, unit)
        assert result.returncode == 0 and result.stderr == "", result.stderr
    checks = {c.name: c for c in doctor.run_checks(root=root)}
    assert checks["units"].status == "ok" and "roles storage" in checks["units"].detail
    assert checks["config"].status == "ok"
    # a re-run without options keeps the role and its settings (the upgrade path)
    again = install_roles(root).stdout
    assert "unchanged unit" in again and "formatted" not in again
    assert (root / "etc/shingle/agent.env").read_text() == env


def test_head_and_storage_on_one_host_then_back_to_head(root):
    install_roles(root, "--role", "head,storage", *STORAGE)
    services = sorted(p.name for p in unit_dir(root).glob("*.service"))
    assert services == sorted((*install.SERVICES, install.AGENT_SERVICE))
    wants = directives(unit_dir(root) / install.TARGET)[("Unit", "Wants")][0].split()
    assert sorted(wants) == services
    assert (
        "roles head, storage" in {c.name: c for c in doctor.run_checks(root=root)}["units"].detail
    )
    out = install_roles(root, "--role", "head").stdout
    assert f"removed unit: {unit_dir(root) / install.AGENT_SERVICE}" in out
    # the head alone is today's appliance, unit for unit
    for name in install.UNIT_NAMES:
        shipped = (install.UNITS_SOURCE / name).read_text().replace(install.UNIT_BIN, LAUNCHER)
        assert (unit_dir(root) / name).read_text() == shipped
    assert (root / "srv/smr/d1/drive.json").exists()  # data stays
    out = shingle("uninstall", "--root", str(root)).stdout
    assert not list(unit_dir(root).glob("shingle*"))


def test_uninstall_removes_the_agent_unit(root):
    install_roles(root, "--role", "storage", *STORAGE)
    out = shingle("uninstall", "--root", str(root)).stdout
    assert f"removed unit: {unit_dir(root) / install.AGENT_SERVICE}" in out
    assert not list(unit_dir(root).glob("shingle*"))
    assert (root / "etc/shingle/agent.env").exists()  # settings kept unless --purge
    out = shingle("uninstall", "--root", str(root), "--purge").stdout
    assert "kept agent drive /srv/smr/d1" in out
    assert not (root / "etc/shingle").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--role", "storage"], "--role storage = 'no drives'"),
        (["--role", "storage", "--listen", "127.0.0.1:7400"], "at least one drive folder"),
        (["--role", "head", *STORAGE], "only with --role storage"),
        (["--drives", "/srv/smr/d1"], "only with --role storage"),
        (["--role", "archive"], "one or both of head, storage"),
        (["--role", "storage", "--listen", "127.0.0.1:80", "--drives", "/srv/d"], "from 1024"),
        (["--role", "storage", "--listen", "7400", "--drives", "/srv/d"], "HOST:PORT"),
        (["--role", "storage", "--listen", "127.0.0.1:7400", "--drives", "srv/d"], "absolute"),
        (
            ["--role", "storage", "--listen", "127.0.0.1:7400", "--drives", "/srv/d", "/srv/d"],
            "each folder once",
        ),
        (
            ["--role", "storage", *STORAGE[:5], "--zone-size", "1000"],
            "--zone-size must be a multiple",
        ),
    ],
)
def test_bad_role_input_is_refused_and_changes_nothing(root, args, message):
    result = install_roles(root, *args, check=False)
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()) == [
        LAUNCHER.lstrip("/")
    ]


def test_a_folder_holding_something_else_is_not_formatted(root):
    busy = root / "srv/busy"
    busy.mkdir(parents=True)
    (busy / "photo.jpg").write_bytes(b"keep me")
    result = install_roles(
        root,
        "--role",
        "storage",
        "--listen",
        "127.0.0.1:7400",
        "--drives",
        "/srv/busy",
        check=False,
    )
    assert result.returncode == 2 and "neither a drive nor empty" in result.stderr
    assert [p.name for p in busy.iterdir()] == ["photo.jpg"]
    assert not unit_dir(root).exists()


def test_installed_settings_start_an_agent_that_answers(root):
    """What the unit runs, run here: `shingle agent` with the installed settings answers a
    head's HELLO with the drives the install formatted."""
    from engine.drives.remote import hello

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    drives = [root / "d1", root / "d2"]
    install.install(
        root,
        launcher=LAUNCHER,
        roles=("storage",),
        agent=install.AgentSetup(
            f"127.0.0.1:{port}",
            tuple(Path("/") / d.relative_to(root) for d in drives),
            install.folders_mod.DriveFormat(16 << 20, 1 << 20, False),
        ),
    )
    settings = install.read_agent_env(root)
    assert settings is not None
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "appliance.cli",
            "agent",
            "--listen",
            settings.listen,
            "--drives",
            *(str(install.under_root(root, d)) for d in settings.drives),
        ],
        cwd=REPO,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                answer = hello(settings.listen)
                break
            except OSError:
                assert agent.poll() is None, agent.stderr.read().decode()
                assert time.monotonic() < deadline
                time.sleep(0.2)
        assert len(answer["drives"]) == 2
    finally:
        agent.terminate()
        agent.wait(timeout=30)
