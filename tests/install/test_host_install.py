"""`shingle install` without --root, for real, in a private mount namespace.

/etc, /var/lib and /opt are overlays whose upper layers live in a temp folder,
so the installer creates the real service user, builds the real venv in
/opt/shingle, chowns and writes the real paths while the machine's own /etc,
/var/lib and /opt stay untouched. systemd
cannot be PID 1 here: for the steps that need it, /run/systemd/system is
made on a private /run and `systemctl` is a stand-in on PATH that logs its
arguments and, for `stop`, ends the process holding the drives lock as
systemd would."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from appliance.host.install import UNIT_NAMES
from tests.install.conftest import REPO

SCRIPT = r"""
set -eu
T=$1; PY=$2
mkdir -p $T/eu $T/ew $T/vu $T/vw $T/ou $T/ow $T/bin
mount -t overlay overlay -o lowerdir=/etc,upperdir=$T/eu,workdir=$T/ew /etc
mount -t overlay overlay -o lowerdir=/var/lib,upperdir=$T/vu,workdir=$T/vw /var/lib
mount -t overlay overlay -o lowerdir=/opt,upperdir=$T/ou,workdir=$T/ow /opt
cd "$3"
getent passwd shingle >/dev/null && { echo "precondition: user shingle already exists"; exit 3; }

# 1. no systemd
$PY -m appliance.cli install > $T/install1.out 2>&1
echo "user=$(getent passwd shingle | cut -d: -f1,6,7)"
echo "venv-version=$(cd / && setpriv --reuid=shingle --regid=shingle --clear-groups \
    /opt/shingle/bin/shingle --version)"
echo "venv-compiled=$(cd / && env -u PYTHONPATH /opt/shingle/bin/python -c 'import \
    appliance.nfs.onc.xdrcodec as x, engine.native.drivewriters, engine.native.fragmentio; \
    print(x.__file__.startswith("/opt/shingle/") and x.__file__.endswith(".so"))' 2>&1 | tail -1)"
echo "venv-doctor=$(cd / && /opt/shingle/bin/shingle doctor --json | \
    $PY -c 'import json,sys; print([c["status"] for c in json.load(sys.stdin)
        if c["name"].startswith("exec ")])')"
stat -c 'own %n %U:%G %a' /etc/shingle /etc/shingle/shingle.toml /var/lib/shingle \
    /var/lib/shingle/catalog.db /var/lib/shingle/webui-secret.key \
    /var/lib/shingle/initial-admin-password /var/lib/shingle/smb
# root adds a drive to the installed appliance: it is made as the service user
$PY -m appliance.cli -c /etc/shingle/shingle.toml drives add /var/lib/shingle/drives/added \
    --size 16MiB --zone-size 4MiB --no-preallocate > $T/drives.out 2>&1 || echo "drives-exit=$?"
stat -c 'own %n %U:%G %a' /var/lib/shingle/drives/added /var/lib/shingle/drives/added/* \
    /var/lib/shingle/catalog.db* | sort -u -k3,4 | head -20
echo "drives=$($PY -m appliance.cli -c /etc/shingle/shingle.toml drives list --json | \
    $PY -c 'import json,sys; print([d["path"] for d in json.load(sys.stdin)])')"
for u in shingle-nfsd.service shingle-webui.service shingle-smbd.service shingle.target; do
    echo "verify $u [$(systemd-analyze verify --man=no --recursive-errors=no $u 2>&1)]"
done

# 2. systemd (stand-in) from here on
mount -t tmpfs tmpfs /run
mkdir -p /run/systemd/system
cat > $T/bin/systemctl <<EOS
#!/bin/sh
echo "\$*" >> $T/systemctl.log
if [ "\$1" = stop ] && [ -f $T/daemon.pid ]; then
    kill \$(cat $T/daemon.pid) 2>/dev/null || true
    until flock -n /var/lib/shingle/shingle.lock true; do sleep 0.05; done
fi
EOS
chmod +x $T/bin/systemctl
export PATH=$T/bin:$PATH
echo "--- install again" >> $T/systemctl.log
$PY -m appliance.cli install > $T/install2.out 2>&1

echo "--- upgrade" >> $T/systemctl.log
$PY -c "
import os, time
from engine.catalog.migrate import downgrade
from appliance.daemonlock import DaemonLock
downgrade('sqlite:////var/lib/shingle/catalog.db', '-1')
assert DaemonLock('/var/lib/shingle').acquire()
open('$T/daemon.pid', 'w').write(str(os.getpid()))
time.sleep(60)" &
until [ -s $T/daemon.pid ]; do sleep 0.05; done
$PY -m appliance.cli install --bin /opt/shingle/bin/shingle > $T/install3.out 2>&1

echo "--- uninstall" >> $T/systemctl.log
$PY -m appliance.cli uninstall > $T/uninstall.out 2>&1
echo "kept=$(ls /var/lib/shingle/catalog.db /etc/shingle/shingle.toml | tr '\n' ' ')"
echo "--- purge" >> $T/systemctl.log
$PY -m appliance.cli uninstall --purge > $T/purge.out 2>&1
echo "purged=$(ls -d /var/lib/shingle /etc/shingle /etc/systemd/system/shingle-nfsd.service \
    2>/dev/null | wc -l)"
echo "user-after-purge=$(getent passwd shingle | cut -d: -f1)"
"""


def test_host_install_upgrade_and_uninstall(tmp_path):
    assert shutil.which("unshare") and shutil.which("flock"), (
        "unshare/flock missing (Debian util-linux)"
    )
    assert not Path("/run/systemd/system").exists()  # this machine's PID 1 is not systemd
    watched = (
        Path("/opt/shingle"),
        Path("/etc/shingle"),
        Path("/var/lib/shingle"),
        Path("/etc/systemd/system/shingle-nfsd.service"),
    )
    before = {p: p.exists() for p in watched}
    result = subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "bash",
            "-c",
            SCRIPT,
            "host-install",
            str(tmp_path),
            sys.executable,
            str(REPO),
        ],
        capture_output=True,
        text=True,
        timeout=600,  # two venv builds from this checkout, ~10 s each on an idle machine
    )
    outputs = {p.name: p.read_text() for p in tmp_path.glob("*.out")}
    assert result.returncode == 0, (result.stdout, result.stderr, outputs)
    out = result.stdout

    # 1. without systemd: the real user, ownership and modes; enabling is left for later
    first = outputs["install1.out"]
    assert "created service user: shingle" in first
    assert (
        "systemd is not running (no /run/systemd/system): once it is, run "
        "`systemctl daemon-reload && systemctl enable shingle.target`" in first
    )
    assert "user=shingle:/var/lib/shingle:/usr/sbin/nologin" in out
    # shingle runs from its own venv, which the service user can execute; its doctor agrees
    assert "installed shingle and its dependencies: /opt/shingle" in first
    assert "venv-version=shingle " in out
    # the compiled hot paths are in the installed venv, not only in the checkout's
    assert "venv-compiled=True" in out, out
    assert "venv-doctor=['ok', 'ok', 'ok']" in out, out
    stat = {
        line.split()[1]: line.split()[2:] for line in out.splitlines() if line.startswith("own ")
    }
    assert stat["/etc/shingle"] == ["root:shingle", "750"]
    assert stat["/etc/shingle/shingle.toml"] == [
        "root:shingle",
        "640",
    ]  # the daemon reads it, others cannot
    assert stat["/var/lib/shingle"] == ["shingle:shingle", "750"]
    assert stat["/var/lib/shingle/catalog.db"] == ["shingle:shingle", "640"]
    assert stat["/var/lib/shingle/webui-secret.key"] == ["shingle:shingle", "600"]
    assert stat["/var/lib/shingle/initial-admin-password"] == ["shingle:shingle", "600"]
    # made before shingle-smbd.service starts: it may write only this folder of the appliance
    assert stat["/var/lib/shingle/smb"] == ["shingle:shingle", "750"]
    # the drive root added (and every file of it) belongs to the daemon's user, and so do
    # the catalog's files it wrote
    assert "drives=['/var/lib/shingle/drives/added']" in out, (out, outputs.get("drives.out"))
    assert "drives-exit" not in out, outputs["drives.out"]
    owners = {
        line.split()[1]: line.split()[2] for line in out.splitlines() if line.startswith("own ")
    }
    added = [p for p in owners if p.startswith("/var/lib/shingle/drives/added")]
    assert added and all(owners[p] == "shingle:shingle" for p in added), owners
    assert all(owners[p] == "shingle:shingle" for p in owners if "catalog.db" in p), owners
    for unit in UNIT_NAMES:
        assert f"verify {unit} []" in out, out  # verified in place: the real launcher path resolves

    # 2. with systemd: a re-run changes nothing on disk and enables the target
    calls = dict(
        block.split("\n", 1) for block in (tmp_path / "systemctl.log").read_text().split("--- ")[1:]
    )
    second = outputs["install2.out"]
    assert "unchanged service user: shingle" in second and "kept config" in second
    assert calls["install again"].splitlines() == ["daemon-reload", "enable shingle.target"]
    # The upgrade stops the appliance, migrates under the drives lock, and starts it again.
    assert calls["upgrade"].splitlines() == [
        "stop shingle.target shingle-nfsd.service shingle-webui.service shingle-smbd.service",
        "daemon-reload",
        "enable shingle.target",
        "start shingle.target",
    ]
    third = outputs["install3.out"]
    assert "stopped shingle.target for the upgrade" in third and "upgraded (from revision" in third
    assert "restarted shingle.target after the upgrade" in third
    stop = [
        "disable --now shingle.target",
        # The storage role's unit too, whichever roles were installed (check=False: absent is fine).
        "stop shingle-nfsd.service shingle-webui.service shingle-smbd.service"
        " shingle-agent.service",
        "daemon-reload",
    ]
    assert calls["uninstall"].splitlines() == stop
    assert "kept=/etc/shingle/shingle.toml /var/lib/shingle/catalog.db " in out
    assert calls["purge"].splitlines() == stop
    assert "purged=0" in out
    assert "user-after-purge=shingle" in out  # Debian practice: system users are never deleted

    # The machine itself saw none of it.
    assert {p: p.exists() for p in watched} == before
    assert not any(
        line.startswith("shingle:") for line in Path("/etc/passwd").read_text().splitlines()
    )
