"""Samba's VFS modules (catia, fruit, streams_xattr): Debian ships them in samba-vfs-modules, only a
Recommends of samba, so a fresh machine bootstrapped with --no-install-recommends lacked them and
every tree connect failed with NT_STATUS_BAD_NETWORK_NAME while shingle said nothing. The module
check runs before smbd starts; what it finds reaches the log (once), `shingle status`, the alert
sources and /metrics, and smbd starts once the modules are there."""

from __future__ import annotations

import logging
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from appliance.smb import samba
from appliance.smb.samba import (
    SambaLayout,
    SmbdBuild,
    SmbdSupervisor,
    configured_vfs_modules,
    missing_vfs_modules,
    render_conf,
)
from appliance.status import smb_line, smb_report
from engine.admin import smb as smb_service
from engine.admin.alerts import CRITICAL, AlertMonitor, AlertSettings, SmbProblem
from tests.smb.conftest import free_port
from webui.metrics import Exposition, _smb

REPO = Path(__file__).resolve().parents[2]


def test_every_vfs_module_the_generated_smb_conf_names_is_installed(tmp_path):
    conf = render_conf(
        SambaLayout(tmp_path / "smb"), [], mount=tmp_path / "m", host="127.0.0.1", port=4450
    )
    build = SmbdBuild.probe()
    named = configured_vfs_modules(conf)
    assert {"catia", "fruit", "streams_xattr"} <= set(named), named
    assert missing_vfs_modules(conf, build) == [], (
        f"smbd's modules dir {build.modules_dir} lacks modules smb.conf names: "
        "scripts/bootstrap.sh must install samba-vfs-modules"
    )


def test_bootstrap_installs_the_package_of_every_samba_module_and_tool():
    """Each program or library the SMB code paths run, and the package Debian ships it in."""
    text = (REPO / "scripts" / "bootstrap.sh").read_text()
    listed = set(text.split('apt_packages=${SHINGLE_APT_PACKAGES:-"', 1)[1].split('"}')[0].split())
    build = SmbdBuild.probe()
    needed = [
        build.module_file("streams_xattr"),
        build.module_file("fruit"),
        build.module_file("catia"),
        *(shutil.which(tool) for tool in ("smbd", "pdbedit", "smbstatus", "smbclient")),
        shutil.which("testparm"),
        shutil.which("fusermount3"),
    ]
    for path in needed:
        assert path is not None
        owner = subprocess.run(
            ["dpkg", "-S", str(Path(path).resolve())], capture_output=True, text=True
        )
        if owner.returncode != 0:  # merged /usr: dpkg knows /bin/X for /usr/bin/X
            owner = subprocess.run(
                ["dpkg", "-S", str(Path(path).resolve()).replace("/usr/bin/", "/bin/")],
                capture_output=True,
                text=True,
            )
        assert owner.returncode == 0, owner.stderr
        package = owner.stdout.split(":", 1)[0].strip()
        assert package in listed, f"{path} comes from {package}, which bootstrap.sh does not name"
    wrapper = subprocess.run(["dpkg", "-S", "libnss_wrapper.so"], capture_output=True, text=True)
    assert wrapper.stdout.split(":", 1)[0] in listed


@pytest.fixture
def share_dir():
    # smbd's guest (nobody) must reach the shared folder: pytest's temp folders are 0700
    folder = Path(tempfile.mkdtemp(prefix="shingle-vfs-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _wait(predicate, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_missing_vfs_module_is_reported_and_smbd_waits_for_it(
    sqlite_catalog, share_dir, tmp_path, monkeypatch, caplog
):
    monkeypatch.setattr(samba, "RELOAD_S", 0.1)
    layout = SambaLayout(share_dir / "smb")
    smb_service.create_share(sqlite_catalog, {"name": "pub", "guest": True}, actor="t")
    mount = share_dir / "mount"
    mount.mkdir(mode=0o777)
    mount.chmod(0o777)
    port = free_port()
    # an earlier smbd's complaint (before the package was installed) is history, not a problem
    layout.create()
    layout.log_file.write_text(
        "Error loading module '/usr/lib/x86_64-linux-gnu/samba/vfs/fruit.so': cannot open\n"
    )
    # smbd's own modules are there: the check looks in a folder without them
    no_modules = SmbdBuild(tmp_path / "no-modules", frozenset({"default"}))
    supervisor = SmbdSupervisor(
        sqlite_catalog, layout, mount=mount, host="127.0.0.1", port=port, build=no_modules
    )
    caplog.set_level(logging.INFO, logger="shingle.smb")
    settings = AlertSettings(smb_problem_file=str(layout.problem_file))
    seen: list = []
    monitor = AlertMonitor(sqlite_catalog, settings, deliver=seen.append, sources=[SmbProblem()])
    supervisor.start()
    try:
        _wait(lambda: supervisor.problem is not None, "the module check")
        time.sleep(1.0)  # ten more rounds: still one log line, still no smbd
        assert supervisor.proc is None, "smbd started without the modules smb.conf names"
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1, [r.getMessage() for r in errors]
        message = errors[0].getMessage()
        for name in ("catia", "fruit", "streams_xattr", "samba-vfs-modules"):
            assert name in message, message

        report = smb_report(share_dir, sqlite_catalog)
        assert report["problem"] and not report["running"], report
        line = smb_line(report)
        assert line.startswith("FAILING: smbd cannot load the VFS modules catia, fruit"), line

        notices = monitor.tick(force=True)
        assert [(n.change, n.alert.kind, n.alert.severity) for n in notices] == [
            ("active", "smb_problem", CRITICAL)
        ]
        assert "samba-vfs-modules" in notices[0].alert.message

        out = Exposition()
        _smb(out, SimpleNamespace(config=SimpleNamespace(data_dir=share_dir)))
        assert "shingle_smb_problem 1" in out.text() and "shingle_smb_up 0" in out.text()

        # the package installed: smbd starts at the next round and serves the share
        supervisor.build = SmbdBuild.probe()
        _wait(supervisor.started_ok.is_set, "smbd to start once its modules are there")
        assert supervisor.problem is None and not layout.problem_file.exists()
        done = subprocess.run(
            ["smbclient", "//127.0.0.1/pub", "-p", str(port), "-N", "-c", "ls"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0 and "NT_STATUS" not in done.stdout, done.stdout + done.stderr
        assert [(n.change, n.alert.kind) for n in monitor.tick(force=True)] == [
            ("cleared", "smb_problem")
        ]
        assert smb_line(smb_report(share_dir, sqlite_catalog)).startswith("smbd running")
    finally:
        supervisor.stop()
    assert supervisor.proc is None


def test_a_problem_an_earlier_daemon_left_is_cleared_when_smbd_serves(
    sqlite_catalog, share_dir, monkeypatch
):
    """A daemon killed while it reported a problem leaves problem.json; the next one, with the
    modules there, must not go on reporting it."""
    monkeypatch.setattr(samba, "RELOAD_S", 0.1)
    layout = SambaLayout(share_dir / "smb")
    layout.create()
    samba.write_problem(layout, "smbd cannot load the VFS modules fruit (an earlier run)")
    mount = share_dir / "mount"
    mount.mkdir()
    supervisor = SmbdSupervisor(
        sqlite_catalog, layout, mount=mount, host="127.0.0.1", port=free_port()
    )
    supervisor.start()
    try:
        _wait(supervisor.started_ok.is_set, "smbd to start")
        assert not layout.problem_file.exists()
        assert smb_report(share_dir, sqlite_catalog)["problem"] is None
    finally:
        supervisor.stop()
