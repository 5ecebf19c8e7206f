#!/usr/bin/env bash
# Installs what shingle needs on a fresh Debian 12 machine, and nothing on a re-run
# that has it all: Debian packages (only those missing), then the project into
# .venv (only when pyproject.toml changed since the last install).
# Sourced by ./run-appliance and ./run-tests; set SHINGLE_APT_PACKAGES to override.
# tests/test_debian_packages.py fails when the code names a program or file whose package this
# list does not bring by name or hard dependency (a Recommends does not count).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# postgresql: catalog tests on a real server; chromium: web UI tests through Playwright;
# libnfs-utils: a third NFS client (NFSv3); systemd: systemd-analyze verifies the units;
# nfs-ganesha(-vfs): the reference server of bench/compare.py, whose smoke test runs in the suite;
# samba, smbclient: the SMB server the daemon supervises and a client for its tests;
# samba-vfs-modules: streams_xattr, fruit and catia, which the generated smb.conf names (only a
# Recommends of samba: without it every tree connect fails with NT_STATUS_BAD_NETWORK_NAME);
# samba-common-bin: testparm and smbpasswd for an admin checking the generated smb.conf;
# libnss-wrapper: SMB users get their uids from a passwd file of shingle's, not /etc/passwd;
# fuse3, libfuse3-dev, pkg-config: pyfuse3 builds against libfuse3 (the mount Samba shares);
# qemu-system-x86 busybox-static nfs-common keyutils fio attr: the kernel NFS client rig
# (tests/kernel), a VM that shares this host's userland (mount.nfs, request-key for NFSv4 owners,
# fio, setfattr/getfattr for the NFSv4.2 xattr check).
# gcc, python3-dev: build the compiled hot path (engine/native/*.pyx) at install (Python.h);
# python3-venv: Debian's python3 makes .venv only with it; openssl: `shingle init --tls` makes
# its certificate with the openssl command when the cryptography package is absent;
# strace: a test reads the compiled drive writers' system calls;
# etcd-server, etcd-client, patroni: the cluster test bed (tests/cluster) runs etcd and
# PostgreSQL under Patroni in network namespaces; iproute2 makes those namespaces (and `ip addr`
# moves the metadata server's floating address, appliance/mds_address.py).
# tcmu-runner, kmod, e2fsprogs: the zoned-device rig (tests/kernel/test_zoned.py): SCSI ZBC disks
# through tcmu-runner's file_zbc handler, kmod's depmod and modprobe for the guest's module tree,
# an ext4 image holding the ZBC backing files.
# libkrb5-dev: the gssapi package (RPCSEC_GSS, sec=krb5/krb5i/krb5p) builds against MIT krb5;
# krb5-kdc, krb5-admin-server (kadmin.local), krb5-user (kinit, klist): the KDC the Kerberos
# tests start in a temp folder, and the tickets and keytabs of the VM rig's users.
apt_packages=${SHINGLE_APT_PACKAGES:-"postgresql chromium libnfs-utils systemd smartmontools nfs-ganesha nfs-ganesha-vfs
  samba samba-vfs-modules samba-common-bin smbclient libnss-wrapper fuse3 libfuse3-dev pkg-config
  qemu-system-x86 busybox-static nfs-common keyutils fio attr gcc python3-dev python3-venv
  openssl strace etcd-server etcd-client patroni iproute2 tcmu-runner kmod e2fsprogs
  libkrb5-dev krb5-kdc krb5-admin-server krb5-user"}
missing=()
for pkg in $apt_packages; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "bootstrap: installing Debian packages: ${missing[*]}"
  sudo_cmd=(); [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get -o DPkg::Lock::Timeout=600 update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

python=${PYTHON:-python3}
if [ ! -x "$repo/.venv/bin/python" ]; then
  echo "bootstrap: creating $repo/.venv"
  "$python" -m venv "$repo/.venv"
fi
stamp="$repo/.venv/.bootstrap-stamp"
# a changed .pyx (engine/native, appliance/nfs/onc) must be compiled again: its hash is in the stamp
pyx=$(find "$repo/engine" "$repo/appliance" -name '*.pyx' | sort)
# shellcheck disable=SC2086  # one path per word
want=$(cat "$repo/pyproject.toml" "$repo/setup.py" $pyx | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "bootstrap: installing shingle and its Python dependencies into .venv"
  "$repo/.venv/bin/python" -m pip install -q --upgrade pip 2>&1 | grep -v -i warning || true
  # Cython in .venv itself: `shingle install` builds the appliance's wheel with this venv's
  # setuptools and no build isolation, and without Cython that wheel lacks the compiled hot paths
  "$repo/.venv/bin/python" -m pip install -q "Cython>=3.0" 2>&1 | grep -v -i warning || true
  "$repo/.venv/bin/python" -m pip install -q -e "$repo[test]" 2>&1 | grep -v -i "warning\|location" || true
  "$repo/.venv/bin/python" -c "import engine, appliance, webui, sqlalchemy, pyeclib"
  "$repo/.venv/bin/python" -c "import engine.native.drivewriters" 2>/dev/null ||
    echo "bootstrap: the compiled drive writers were not built (no gcc?): the engine runs its Python fallback"
  echo "$want" > "$stamp"
fi
