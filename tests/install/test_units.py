"""The shipped units, as installed, pass `systemd-analyze verify` without a single message."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from appliance.host import install
from tests.install.conftest import LAUNCHER, verify

UNITS = install.UNIT_NAMES


def directives(path: Path) -> dict[tuple[str, str], list[str]]:
    """(section, key) -> values; systemd allows a key to repeat, so values are a list."""
    section, found = None, {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        found.setdefault((section, key.strip()), []).append(value.strip())
    return found


def test_every_shipped_unit_is_installed():
    shipped = sorted(
        p.name
        for p in install.UNITS_SOURCE.iterdir()
        if p.suffix in (".service", ".target", ".timer")
    )
    assert shipped == sorted(install.SHIPPED_UNITS)


@pytest.mark.parametrize("unit", UNITS)
def test_unit_verifies_clean(installed_root, unit):
    result = verify(installed_root, unit)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def test_verify_reports_a_bad_unit(root):
    """The harness can fail: an unknown key and a missing executable are both reported."""
    unit_dir = root / "etc/systemd/system"
    unit_dir.mkdir(parents=True)
    text = (
        (install.UNITS_SOURCE / "shingle-nfsd.service")
        .read_text()
        .replace("[Service]", "[Service]\nWatchdogSecs=5")
    )
    (unit_dir / "shingle-nfsd.service").write_text(text)
    result = verify(root, "shingle-nfsd.service")
    assert "Unknown key 'WatchdogSecs'" in result.stderr
    assert "/usr/bin/shingle is not executable" in result.stderr


def test_units_run_the_installed_launcher(installed_root):
    for service in install.SERVICES:
        exec_start = directives(installed_root / "etc/systemd/system" / service)[
            ("Service", "ExecStart")
        ]
        assert exec_start[0].startswith(f"{LAUNCHER} -c /etc/shingle/shingle.toml ")


def test_nfsd_is_supervised_and_hardened(installed_root):
    d = directives(installed_root / "etc/systemd/system/shingle-nfsd.service")
    one = {k: v[-1] for k, v in d.items()}
    assert one[("Service", "Type")] == "notify"
    assert one[("Service", "ExecStart")].endswith(" serve --no-web")  # the web UI has its own unit
    assert int(one[("Service", "WatchdogSec")]) > 0
    assert one[("Service", "Restart")] == "on-failure"
    assert int(one[("Service", "LimitNOFILE")]) >= 65536
    assert one[("Service", "ProtectSystem")] == "strict"
    assert "/var/lib/shingle" in d[("Service", "ReadWritePaths")]
    for key in ("ProtectHome", "PrivateTmp", "NoNewPrivileges"):
        assert one[("Service", key)] == "yes", key
    # Port 2049 needs CAP_NET_BIND_SERVICE; drives are opened through group disk, not a capability.
    assert one[("Service", "CapabilityBoundingSet")].split() == ["CAP_NET_BIND_SERVICE"]
    assert one[("Service", "AmbientCapabilities")].split() == ["CAP_NET_BIND_SERVICE"]
    assert one[("Service", "User")] == install.SERVICE_USER
    assert "disk" in one[("Service", "SupplementaryGroups")].split()
    assert one[("Unit", "PartOf")] == install.TARGET


def test_webui_is_unprivileged(installed_root):
    d = directives(installed_root / "etc/systemd/system/shingle-webui.service")
    one = {k: v[-1] for k, v in d.items()}
    assert one[("Service", "ExecStart")].endswith(" webui")
    assert one[("Service", "User")] == install.SERVICE_USER != "root"
    assert one[("Service", "CapabilityBoundingSet")] == ""
    assert one[("Service", "NoNewPrivileges")] == "yes"
    assert one[("Service", "PrivateDevices")] == "yes"  # the web UI never opens a drive
    assert one[("Service", "ProtectSystem")] == "strict"
    assert one[("Unit", "PartOf")] == install.TARGET


def test_target_groups_the_services_and_maintenance_runs_in_the_daemon(installed_root):
    d = directives(installed_root / "etc/systemd/system/shingle.target")
    assert sorted(d[("Unit", "Wants")][0].split()) == sorted(install.SERVICES)
    assert d[("Install", "WantedBy")] == ["multi-user.target"]
    # The decision is documented where an admin looks: in the units themselves.
    assert re.search(
        r"Maintenance .*runs inside",
        (installed_root / "etc/systemd/system/shingle-nfsd.service").read_text().replace("\n#", ""),
    )
    assert not list((installed_root / "etc/systemd/system").glob("shingle-maintenance*"))


def test_drives_outside_the_state_dir_get_a_verified_drop_in(installed_root, tmp_path):
    """A drive on its own mount must stay writable under ProtectSystem=strict."""
    from tests.install.conftest import shingle

    staging = tmp_path / "root"
    shutil.copytree(installed_root, staging, symlinks=True)
    config = staging / "etc/shingle/shingle.toml"
    config.write_text(
        config.read_text().replace('# drives_dir = "drives"', 'drives_dir = "/srv/smr"')
    )
    out = shingle("install", "--root", str(staging), "--bin", LAUNCHER).stdout
    assert "installed drop-in" in out
    for service in install.DRIVE_SERVICES:
        dropin = staging / f"etc/systemd/system/{service}.d" / install.PATHS_DROPIN
        assert directives(dropin)[("Service", "ReadWritePaths")] == ["-/srv/smr"]
        result = verify(staging, service)
        assert (result.returncode, result.stderr) == (0, "")
    # smbd never writes a drive
    assert not (staging / f"etc/systemd/system/{install.SMBD_SERVICE}.d").exists()
    assert (staging / "srv/smr").is_dir()
    # Back to the default: the drop-in goes away.
    config.write_text(
        config.read_text().replace('drives_dir = "/srv/smr"', '# drives_dir = "drives"')
    )
    shingle("install", "--root", str(staging), "--bin", LAUNCHER)
    assert not (staging / "etc/systemd/system/shingle-nfsd.service.d").exists()


def test_smbd_runs_as_root_with_the_least_it_needs(installed_root):
    """smbd switches to each SMB user, so its unit is root's; what root may do there is cut to
    the capabilities smbd and the FUSE mount use, and it may write DATA_DIR/smb only."""
    d = directives(installed_root / "etc/systemd/system" / install.SMBD_SERVICE)
    one = {k: v[-1] for k, v in d.items()}
    assert one[("Service", "ExecStart")].endswith(" smbd")
    assert one[("Service", "User")] == "root"
    assert sorted(one[("Service", "CapabilityBoundingSet")].split()) == sorted(
        "CAP_SYS_ADMIN CAP_SETPCAP CAP_SETUID CAP_SETGID CAP_NET_BIND_SERVICE CAP_CHOWN CAP_FOWNER "
        "CAP_DAC_OVERRIDE CAP_DAC_READ_SEARCH CAP_KILL CAP_SYS_RESOURCE".split()
    )
    for key in ("NoNewPrivileges", "ProtectHome", "PrivateTmp", "ProtectKernelModules"):
        assert one[("Service", key)] == "yes", key
    assert one[("Service", "ProtectSystem")] == "strict"
    assert d[("Service", "ReadWritePaths")] == ["-/var/lib/shingle/smb"]
    assert one[("Service", "DevicePolicy")] == "closed"
    assert d[("Service", "DeviceAllow")] == ["/dev/fuse rw"]
    assert one[("Service", "RuntimeDirectory")] == "shingle-smbd"
    assert one[("Unit", "PartOf")] == install.TARGET
    assert "shingle-nfsd.service" in one[("Unit", "After")].split()


def test_a_data_dir_elsewhere_gives_smbd_a_drop_in_for_its_smb_folder(installed_root, tmp_path):
    from tests.install.conftest import shingle

    staging = tmp_path / "root"
    shutil.copytree(installed_root, staging, symlinks=True)
    config = staging / "etc/shingle/shingle.toml"
    text = config.read_text()
    assert 'data_dir = "/var/lib/shingle"' in text
    config.write_text(text.replace('data_dir = "/var/lib/shingle"', 'data_dir = "/srv/nas"'))
    shingle("install", "--root", str(staging), "--bin", LAUNCHER)
    dropin = staging / f"etc/systemd/system/{install.SMBD_SERVICE}.d" / install.PATHS_DROPIN
    assert directives(dropin)[("Service", "ReadWritePaths")] == ["-/srv/nas/smb"]
    assert (staging / "srv/nas/smb").is_dir()
    result = verify(staging, install.SMBD_SERVICE)
    assert (result.returncode, result.stderr) == (0, "")
