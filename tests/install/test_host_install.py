"""`shingle install` without --root, for real, in a private mount namespace.

/etc and /var/lib are overlays whose upper layers live in a temp folder, so
the installer creates the real service user, chowns, and writes the real
paths, while the machine's own /etc and /var/lib stay untouched."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.install.conftest import REPO

SCRIPT = r"""
set -eu
T=$1; PY=$2
mkdir -p $T/eu $T/ew $T/vu $T/vw
mount -t overlay overlay -o lowerdir=/etc,upperdir=$T/eu,workdir=$T/ew /etc
mount -t overlay overlay -o lowerdir=/var/lib,upperdir=$T/vu,workdir=$T/vw /var/lib
cd "$3"
getent passwd shingle >/dev/null && { echo "precondition: user shingle already exists"; exit 3; }
$PY -m appliance.cli install > $T/install1.out 2>&1
$PY -m appliance.cli install > $T/install2.out 2>&1
echo "user=$(getent passwd shingle | cut -d: -f1,6,7)"
stat -c 'own %n %U:%G %a' /etc/shingle /etc/shingle/shingle.toml /var/lib/shingle /var/lib/shingle/catalog.db \
    /var/lib/shingle/webui-secret.key /var/lib/shingle/initial-admin-password
for u in shingle-nfsd.service shingle-webui.service shingle.target; do
    echo "verify $u [$(systemd-analyze verify --man=no --recursive-errors=no $u 2>&1)]"
done
$PY -m appliance.cli uninstall > $T/uninstall.out 2>&1
echo "kept=$(ls /var/lib/shingle/catalog.db /etc/shingle/shingle.toml | tr '\n' ' ')"
$PY -m appliance.cli uninstall --purge > $T/purge.out 2>&1
echo "purged=$(ls -d /var/lib/shingle /etc/shingle /etc/systemd/system/shingle-nfsd.service 2>/dev/null | wc -l)"
echo "user-after-purge=$(getent passwd shingle | cut -d: -f1)"
"""


def test_host_install_creates_user_owns_files_and_leaves_systemd_for_later(tmp_path):
    assert shutil.which("unshare"), "unshare missing (Debian util-linux)"
    assert not Path("/run/systemd/system").exists()  # this machine's PID 1 is not systemd: nothing to enable
    before = {p: p.exists() for p in (Path("/etc/shingle"), Path("/var/lib/shingle"),
                                      Path("/etc/systemd/system/shingle-nfsd.service"))}
    result = subprocess.run(["unshare", "--mount", "--propagation", "private", "bash", "-c", SCRIPT, "host-install",
                             str(tmp_path), sys.executable, str(REPO)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    first = (tmp_path / "install1.out").read_text()
    second = (tmp_path / "install2.out").read_text()
    assert "created service user: shingle" in first
    assert "unchanged service user: shingle" in second and "kept config" in second
    # Not enabled (no systemd here), and the admin is told what to run once it is.
    assert "systemctl daemon-reload && systemctl enable shingle.target" in first
    assert "user=shingle:/var/lib/shingle:/usr/sbin/nologin" in out
    owners = dict(line.split()[1:3] for line in out.splitlines() if line.startswith("own "))
    assert owners["/etc/shingle/shingle.toml"] == "root:shingle"  # the daemon reads it, others cannot
    assert owners["/etc/shingle"] == "root:shingle"
    for path in ("/var/lib/shingle", "/var/lib/shingle/catalog.db", "/var/lib/shingle/webui-secret.key",
                 "/var/lib/shingle/initial-admin-password"):
        assert owners[path] == "shingle:shingle", (path, out)
    modes = {line.split()[1]: line.split()[3] for line in out.splitlines() if line.startswith("own ")}
    assert modes["/etc/shingle/shingle.toml"] == "640" and modes["/var/lib/shingle/catalog.db"] == "640"
    for unit in ("shingle-nfsd.service", "shingle-webui.service", "shingle.target"):
        assert f"verify {unit} []" in out, out  # verified where they run: the real launcher path resolves
    assert "kept=/etc/shingle/shingle.toml /var/lib/shingle/catalog.db " in out
    assert "purged=0" in out
    assert "user-after-purge=shingle" in out  # Debian practice: system users are never deleted
    # The machine itself saw none of it.
    assert {p: p.exists() for p in before} == before
    assert not any(line.startswith("shingle:") for line in Path("/etc/passwd").read_text().splitlines())


# systemd cannot run as PID 1 here: /run/systemd/system is faked and `systemctl` is a stand-in on PATH
# that logs its arguments and, for `stop`, ends the process holding the drives lock as systemd would.
SYSTEMD_SCRIPT = r"""
set -eu
T=$1; PY=$2
mkdir -p $T/eu $T/ew $T/vu $T/vw $T/bin
mount -t overlay overlay -o lowerdir=/etc,upperdir=$T/eu,workdir=$T/ew /etc
mount -t overlay overlay -o lowerdir=/var/lib,upperdir=$T/vu,workdir=$T/vw /var/lib
mount -t tmpfs tmpfs /run
mkdir -p /run/systemd/system
cat > $T/bin/systemctl <<EOS
#!/bin/sh
echo "\$*" >> $T/systemctl.log
if [ "\$1" = stop ] && [ -f $T/daemon.pid ]; then
    kill \$(cat $T/daemon.pid)
    until flock -n /var/lib/shingle/shingle.lock true; do sleep 0.05; done
fi
EOS
chmod +x $T/bin/systemctl
export PATH=$T/bin:$PATH
cd "$3"
$PY -m appliance.cli install > $T/install1.out 2>&1
echo "--- upgrade" >> $T/systemctl.log
$PY -c "from engine.catalog.migrate import downgrade; downgrade('sqlite:////var/lib/shingle/catalog.db', '-1')"
$PY -c "
import os, time
from appliance.daemonlock import DaemonLock
assert DaemonLock('/var/lib/shingle').acquire()
open('$T/daemon.pid', 'w').write(str(os.getpid()))
time.sleep(60)" &
until [ -s $T/daemon.pid ]; do sleep 0.05; done
$PY -m appliance.cli install > $T/install2.out 2>&1
echo "--- uninstall" >> $T/systemctl.log
$PY -m appliance.cli uninstall > $T/uninstall.out 2>&1
"""


def test_with_systemd_running_install_enables_upgrade_restarts_uninstall_disables(tmp_path):
    result = subprocess.run(["unshare", "--mount", "--propagation", "private", "bash", "-c", SYSTEMD_SCRIPT,
                             "systemd-install", str(tmp_path), sys.executable, str(REPO)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr + (tmp_path / "install2.out").read_text()
    calls = (tmp_path / "systemctl.log").read_text().split("--- ")
    assert calls[0].splitlines() == ["daemon-reload", "enable shingle.target"]
    # The upgrade stops the appliance, migrates under the drives lock, and starts it again.
    assert calls[1].splitlines() == ["upgrade", "stop shingle.target shingle-nfsd.service shingle-webui.service",
                                     "daemon-reload", "enable shingle.target", "start shingle.target"]
    upgrade = (tmp_path / "install2.out").read_text()
    assert "stopped shingle.target for the upgrade" in upgrade and "upgraded (from revision" in upgrade
    assert "restarted shingle.target after the upgrade" in upgrade
    assert calls[2].splitlines() == ["uninstall", "disable --now shingle.target",
                                     "stop shingle-nfsd.service shingle-webui.service", "daemon-reload"]
    assert "systemd is not running" not in (tmp_path / "install1.out").read_text()
