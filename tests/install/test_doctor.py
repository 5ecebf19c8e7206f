"""`shingle doctor`: names what must be fixed and exits non-zero exactly then."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from appliance.host import doctor
from engine.catalog.migrate import downgrade
from tests.install.conftest import shingle
from tests.pgserver import free_port


def set_ports(config: Path, nfs: int, web: int) -> None:
    text = (
        config.read_text()
        .replace("# port = 2049", f"port = {nfs}")
        .replace("# port = 8080", f"port = {web}")
    )
    config.write_text(text)


@pytest.fixture
def installed(installed_root, tmp_path):
    """A private copy of one installed tree, on free ports (8080 may be
    taken by another test run)."""
    root = tmp_path / "root"
    shutil.copytree(installed_root, root, symlinks=True)
    set_ports(root / "etc/shingle/shingle.toml", free_port(), free_port())
    return root


@pytest.fixture(scope="module")
def appliance_dir(tmp_path_factory):
    """A folder made by `shingle init`: a catalog with 10 emulated drives."""
    folder = tmp_path_factory.mktemp("doctor") / "app"
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
        str(free_port()),
        "--web-port",
        str(free_port()),
    )
    return folder


def statuses(output: str) -> dict[str, str]:
    """'OK    port nfs    127.0.0.1:...' lines -> {'port nfs': 'OK'} (columns
    are two spaces apart)."""
    found = {}
    for line in output.splitlines():
        columns = re.split(r"\s{2,}", line.strip())
        if len(columns) >= 2 and columns[0] in ("OK", "WARN", "FAIL"):
            found[columns[1]] = columns[0]
    return found


def test_installed_tree_is_ready(installed):
    result = shingle("doctor", "--root", str(installed), check=False)
    found = statuses(result.stdout)
    assert result.returncode == 0, result.stdout
    for name in (
        "kernel",
        "python",
        "config",
        "units",
        "service user",
        "exec shingle-nfsd.service",
        "exec shingle-webui.service",
        "catalog",
        "unit paths",
        "port nfs",
        "port webui",
        "free space",
        "export folders",
    ):
        assert found[name] == "OK", (name, result.stdout)
    assert found["drives"] == "WARN"  # an install brings no drives of its own
    assert "0 to fix" in result.stdout


def test_catalog_behind_the_code_must_be_fixed(installed):
    downgrade(f"sqlite:///{installed}/var/lib/shingle/catalog.db", "-1")
    result = shingle("doctor", "--root", str(installed), check=False)
    assert result.returncode == 1
    assert statuses(result.stdout)["catalog"] == "FAIL"
    assert "fix: run `shingle install` to migrate it" in result.stdout


def test_broken_config_must_be_fixed(installed):
    (installed / "etc/shingle/shingle.toml").write_text("[nfs]\nport = 70000\n")
    result = shingle("doctor", "--root", str(installed), check=False)
    assert result.returncode == 1
    assert statuses(result.stdout)["config"] == "FAIL"
    assert "nfs.port" in result.stdout and "70000" in result.stdout
    as_json = shingle("doctor", "--root", str(installed), "--json", check=False)
    assert as_json.returncode == 1
    config = [c for c in json.loads(as_json.stdout) if c["name"] == "config"]
    assert config[0]["status"] == "fail" and "0-65535" in config[0]["detail"] and config[0]["fix"]


def test_drives_of_an_appliance_and_a_missing_one(appliance_dir, tmp_path):
    folder = tmp_path / "app"
    shutil.copytree(appliance_dir, folder)
    config = folder / "shingle.toml"
    result = shingle("-c", str(config), "doctor", check=False)
    found = statuses(result.stdout)
    # The copy's catalog still names the original drive folders; both are real and present.
    assert [k for k in found if k.startswith("drive ")] == [f"drive {i}" for i in range(1, 11)]
    assert all(found[f"drive {i}"] == "OK" for i in range(1, 11)), result.stdout
    assert result.returncode == 0, result.stdout

    # A drive folder that vanished (unmounted disk) must be fixed.
    results = doctor.check_drives(
        [
            {
                "id": 4,
                "path": str(folder / "drives" / "gone"),
                "backend": "zonefile",
                "state": "online",
                "device": None,
            }
        ],
        folder / "drives",
    )
    assert results[0].status == "fail" and "does not exist" in results[0].detail


def test_export_folder_a_root_client_cannot_create_in_is_named_with_its_fix(
    appliance_dir, tmp_path
):
    """A catalog from before `shingle init` gave the root to the anonymous user: its root
    clients' open(O_CREAT) fails on Linux clients (fs.protected_regular)."""
    from engine.catalog.database import Catalog
    from engine.namespace import ROOT, Namespace

    folder = tmp_path / "app"
    shutil.copytree(appliance_dir, folder)
    config = folder / "shingle.toml"
    assert (
        statuses(shingle("-c", str(config), "doctor", check=False).stdout)["export folders"] == "OK"
    )
    catalog = Catalog(f"sqlite:///{folder}/catalog.db")
    try:
        namespace = Namespace(catalog)
        namespace.setattr(ROOT, namespace.root_ino, uid=0, gid=0)  # as older catalogs had it
    finally:
        catalog.close()

    result = shingle("-c", str(config), "doctor", check=False)
    assert statuses(result.stdout)["export folders"] == "WARN", result.stdout
    assert "fix: shingle exports own-folder 1" in result.stdout
    assert result.returncode == 0  # a warning: nothing to fix before serving

    fixed = shingle("-c", str(config), "exports", "own-folder", "1")
    assert "now owned by 65534:65534, mode 1777" in fixed.stdout
    assert (
        statuses(shingle("-c", str(config), "doctor", check=False).stdout)["export folders"] == "OK"
    )
    catalog = Catalog(f"sqlite:///{folder}/catalog.db")
    try:
        namespace = Namespace(catalog)
        root = namespace.getattr(namespace.root_ino)
        assert (root.uid, root.gid, root.mode & 0o7777) == (65534, 65534, 0o1777)
    finally:
        catalog.close()
    missing = shingle("-c", str(config), "exports", "own-folder", "99", check=False)
    assert missing.returncode != 0 and "no export with id 99" in missing.stderr


def test_export_folder_without_its_sticky_bit_is_named_and_fixed(appliance_dir, tmp_path):
    """A squashed root client could chmod the export root 0777 while the anonymous user owned
    it, which let every client user remove or rename the others' files there."""
    from engine.catalog.database import Catalog
    from engine.namespace import ROOT, Namespace

    folder = tmp_path / "app"
    shutil.copytree(appliance_dir, folder)
    config = folder / "shingle.toml"
    catalog = Catalog(f"sqlite:///{folder}/catalog.db")
    try:
        namespace = Namespace(catalog)
        namespace.setattr(ROOT, namespace.root_ino, mode=0o777)  # what the squashed root did
    finally:
        catalog.close()

    result = shingle("-c", str(config), "doctor", check=False)
    assert statuses(result.stdout)["export folders"] == "WARN", result.stdout
    assert "world-writable without the sticky bit" in result.stdout
    assert "fix: shingle exports own-folder 1" in result.stdout
    fixed = shingle("-c", str(config), "exports", "own-folder", "1")
    assert "now owned by 65534:65534, mode 1777" in fixed.stdout
    assert (
        statuses(shingle("-c", str(config), "doctor", check=False).stdout)["export folders"] == "OK"
    )


def test_missing_drive_fails_the_command(appliance_dir, tmp_path):
    folder = tmp_path / "app"
    shutil.copytree(appliance_dir, folder)
    # The catalog names absolute drive paths: point them at the copy, then lose one.
    from sqlalchemy import create_engine, text

    engine = create_engine(f"sqlite:///{folder}/catalog.db")
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE drives SET path = replace(path, :old, :new)"),
            {"old": str(appliance_dir), "new": str(folder)},
        )
    engine.dispose()
    shutil.rmtree(folder / "drives" / "drive-003")
    result = shingle("-c", str(folder / "shingle.toml"), "doctor", check=False)
    assert result.returncode == 1
    assert statuses(result.stdout)["drive 4"] == "FAIL"
    assert "drive-003 does not exist" in result.stdout


def test_port_held_by_another_program_must_be_fixed(installed):
    port = free_port()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"""
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", {port})); s.listen(); print("listening", flush=True); time.sleep(60)
""",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "listening"
        config = installed / "etc/shingle/shingle.toml"
        config.write_text(
            config.read_text().replace("\nport = ", f"\nport = {port}\n# was: port = ", 1)
        )
        result = shingle("doctor", "--root", str(installed), check=False)
        assert result.returncode == 1
        assert statuses(result.stdout)["port nfs"] == "FAIL"
        assert f"127.0.0.1:{port} is held by pid {holder.pid}" in result.stdout
        assert "set nfs.port" in result.stdout
    finally:
        holder.kill()
        holder.wait()


def test_shingle_processes_are_recognised():
    assert doctor.is_shingle_process(
        ["/opt/shingle/bin/shingle", "-c", "/etc/shingle/shingle.toml", "serve"]
    )
    assert doctor.is_shingle_process(["/usr/bin/python3", "-m", "appliance.cli", "serve"])
    assert not doctor.is_shingle_process(["/usr/sbin/rpc.nfsd", "8"])
    assert not doctor.is_shingle_process(["python3", "/home/a/shingle-notes/server.py"])


def test_zone_model_comes_from_the_disk_of_a_partition(tmp_path):
    """No zoned device exists on this machine, so its sysfs entries are laid
    out as the kernel does."""
    probe = tmp_path / "zone-file"
    probe.write_bytes(b"x")
    dev = os.stat(probe).st_dev
    sys_root = tmp_path / "sys"
    disk = sys_root / "devices/virtual/block/sdz"
    (disk / "sdz1").mkdir(parents=True)
    (disk / "queue").mkdir()
    (disk / "queue/zoned").write_text("host-managed\n")
    (sys_root / "dev/block").mkdir(parents=True)
    (sys_root / "dev/block" / f"{os.major(dev)}:{os.minor(dev)}").symlink_to(disk / "sdz1")
    assert doctor.zoned_model(probe, sys_root) == "host-managed"
    drive = {
        "id": 1,
        "path": str(tmp_path),
        "backend": "zoned-block",
        "state": "online",
        "device": None,
    }
    assert doctor.check_drives([drive], tmp_path, sys_root)[0].status == "ok"
    (disk / "queue/zoned").write_text("none\n")
    result = doctor.check_drives([drive], tmp_path, sys_root)[0]
    assert result.status == "fail" and "conventional" in result.detail
    # The real sysfs of this machine: its disks are not zoned (or the folder is
    # on a virtual filesystem).
    assert doctor.zoned_model(probe) in ("none", None)


def test_kernel_and_python_floors():
    assert doctor.check_kernel("4.19.0-20-amd64").status == "fail"
    assert doctor.check_kernel("5.1.21").status == "fail"
    assert doctor.check_kernel("6.1.0-13-amd64").status == "ok"
    assert doctor.check_python((3, 10, 12)).status == "fail"
    assert doctor.check_python((3, 11, 2)).status == "ok"


def test_clock_state_is_read_from_the_kernel():
    synced = doctor.adjtimex_synchronized()
    assert synced in (True, False)  # the syscall answered
    check = doctor.check_clock()
    assert check.status == (
        "ok" if synced else "warn"
    )  # never a hard failure: the appliance still runs


def test_host_before_install_is_checked_against_defaults(tmp_path):
    results = doctor.run_checks(root=tmp_path)
    by_name = {r.name: r for r in results}
    assert by_name["config"].status == "warn" and "not installed yet" in by_name["config"].detail
    assert by_name["units"].status == "warn"
    assert "catalog" not in by_name  # nothing to reach yet
    assert {"port nfs", "port webui", "free space", "clock", "kernel", "python"} <= set(by_name)


def test_drive_hidden_by_protect_system_must_be_fixed(installed):
    """A drives_dir moved outside /var/lib/shingle is read-only to the daemon until
    install writes the drop-in."""
    from appliance.host import install

    config = installed / "etc/shingle/shingle.toml"
    config.write_text(
        config.read_text().replace('# drives_dir = "drives"', 'drives_dir = "/srv/smr"')
    )
    result = shingle("doctor", "--root", str(installed), check=False)
    assert result.returncode == 1
    assert statuses(result.stdout)["unit paths"] == "FAIL"
    assert "may not write /srv/smr" in result.stdout
    install.install(installed, launcher="/opt/shingle/bin/shingle")
    result = shingle("doctor", "--root", str(installed), check=False)
    assert result.returncode == 0, result.stdout
    assert statuses(result.stdout)["unit paths"] == "OK"


def test_units_edited_or_left_from_an_older_version_are_flagged(installed):
    unit = installed / "etc/systemd/system/shingle-nfsd.service"
    unit.write_text(unit.read_text().replace("WatchdogSec=30", "WatchdogSec=300"))
    by_name = {c.name: c for c in doctor.run_checks(root=installed)}
    assert by_name["units"].status == "warn" and "shingle-nfsd.service" in by_name["units"].detail
    from appliance.host import install

    install.install(installed, launcher="/opt/shingle/bin/shingle")
    assert {c.name: c for c in doctor.run_checks(root=installed)}["units"].status == "ok"


def test_exec_start_the_sandbox_hides_must_be_fixed(installed):
    """What systemd would fail with 203/EXEC: a launcher under /root (ProtectHome=yes), a
    venv whose base Python is under /root, a folder on the way the user may not enter."""
    result = shingle("doctor", "--root", str(installed), check=False)
    assert statuses(result.stdout)["exec shingle-nfsd.service"] == "OK", result.stdout
    dropin = installed / "etc/systemd/system/shingle-webui.service.d/60-local.conf"
    dropin.parent.mkdir(parents=True, exist_ok=True)
    dropin.write_text("[Service]\nExecStart=\nExecStart=/root/venv/bin/shingle webui\n")
    result = shingle("doctor", "--root", str(installed), check=False)
    assert result.returncode == 1
    assert statuses(result.stdout)["exec shingle-webui.service"] == "FAIL"
    assert "/root/venv/bin/shingle is under /root, which the unit's sandbox hides" in result.stdout
    assert re.search(r"[1-9]\d* to fix", result.stdout)
    dropin.unlink()

    # a venv in /opt whose python links to a pyenv build in /root
    venv = installed / "opt/shingle"
    (venv / "bin/shingle").write_text("#!/opt/shingle/bin/python\nimport sys\n")
    (venv / "bin/python").symlink_to("/root/.pyenv/versions/3.11.7/bin/python3.11")
    result = shingle("doctor", "--root", str(installed), check=False)
    assert result.returncode == 1
    assert "/root/.pyenv/versions/3.11.7/bin/python3.11 is under /root" in result.stdout
    (venv / "bin/python").unlink()
    (venv / "pyvenv.cfg").write_text("home = /root/.pyenv/versions/3.11.7/bin\n")
    (venv / "bin/python").write_text("")  # stands in for a copied interpreter
    (venv / "bin/python").chmod(0o755)
    result = shingle("doctor", "--root", str(installed), check=False)
    assert "/root/.pyenv/versions/3.11.7/bin/python3 is under /root" in result.stdout

    # a folder on the way that the service user may not search
    (venv / "pyvenv.cfg").unlink()
    (venv / "bin").chmod(0o700)
    try:
        result = shingle("doctor", "--root", str(installed), check=False)
    finally:
        (venv / "bin").chmod(0o755)
    assert result.returncode == 1
    assert "shingle may not enter /opt/shingle/bin (mode drwx------" in result.stdout


def test_a_zoned_drive_needs_the_mq_deadline_scheduler(tmp_path):
    """Laid out as the kernel does (no zoned device on this machine; the VM rig,
    tests/kernel/test_zoned.py, has real ones): a zoned-block drive under "none" fails."""
    device = tmp_path / "dev-sdz"
    device.write_bytes(b"x")
    dev = os.stat(device).st_dev
    sys_root = tmp_path / "sys"
    disk = sys_root / "devices/virtual/block/sdz"
    (disk / "queue").mkdir(parents=True)
    (disk / "queue/zoned").write_text("host-managed\n")
    (disk / "queue/scheduler").write_text("[none] mq-deadline\n")
    (sys_root / "dev/block").mkdir(parents=True)
    (sys_root / "dev/block" / f"{os.major(dev)}:{os.minor(dev)}").symlink_to(disk)
    drive = {"id": 3, "path": str(device), "backend": "zoned-block", "state": "online"}
    (result,) = doctor.check_zoned_schedulers([drive], sys_root)
    assert result.status == "fail" and "mq-deadline" in result.fix and "sdz" in result.fix
    (disk / "queue/scheduler").write_text("[mq-deadline] none\n")
    (result,) = doctor.check_zoned_schedulers([drive], sys_root)
    assert result.status == "ok"
    emulated = {**drive, "backend": "zonefile"}
    assert doctor.check_zoned_schedulers([emulated], sys_root) == []
