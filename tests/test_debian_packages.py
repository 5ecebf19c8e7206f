"""Every Debian program or file the code and tests use comes from a package scripts/bootstrap.sh
installs: one it names, or a hard dependency (Depends, Pre-Depends) of one, or a package of
Priority required that every Debian system has. A Recommends does not count: bootstrap.sh
installs with --no-install-recommends, so SMB once passed here, where samba-vfs-modules was
installed by hand, and failed on every fresh machine (it is only a Recommends of samba).

The programs are found in the code itself: every string constant (docstrings aside) that is a
program in Debian's bin folders (or PostgreSQL 15's), or an absolute path to a file there;
LOADED_FILES adds what is loaded by a path the code builds (libraries, modules, firmware).
Each is traced to its package with dpkg, so a program installed here by hand, from a package
bootstrap.sh does not bring, fails this test."""

from __future__ import annotations

import ast
import functools
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("appliance", "engine", "webui", "tests", "bench")
# Debian's own folders only: a program found only in /usr/local or a home folder is one a
# fresh machine lacks whatever it installs (PostgreSQL's programs are not on Debian's PATH)
PROGRAM_DIRS = ("/usr/sbin", "/usr/bin", "/sbin", "/bin", "/usr/lib/postgresql/15/bin")
# string constants that name a program in this machine's bin folders but are words of the
# code (NFS operations, dict keys, compression names), never run: with the package they are
NOT_PROGRAMS = {
    "file": "file",  # a file type, an attribute name
    "time": "time",  # an attribute name
    "write": "bsdextrautils",  # an NFS operation, a delegation type
    "hd": "bsdextrautils",  # liberasurecode's ec_args field
    "red": "ed",  # a colour in tests
    "patch": "patch",  # an HTTP method
    "route": "net-tools",  # `ip route`
    "node": "nodejs",  # a name in tests
    "lz4": "lz4",  # a compression name the code refuses
    "zstd": "zstd",  # the compression name; the kernel rig's zstd -dc is a fallback (xz today)
    "git": "git",  # bench/: the revision of a checkout made with git
    "pip": "python3-pip",  # `python -m pip`: the venv's own (python3-venv)
}
# files the code loads by a path it builds, and why
LOADED_FILES = {
    "/usr/lib/x86_64-linux-gnu/samba/vfs/fruit.so": "smb.conf's vfs objects (appliance/smb)",
    "/usr/lib/x86_64-linux-gnu/samba/vfs/catia.so": "smb.conf's vfs objects (appliance/smb)",
    "/usr/lib/x86_64-linux-gnu/samba/vfs/streams_xattr.so": "smb.conf's vfs objects",
    "/usr/lib/x86_64-linux-gnu/libnss_wrapper.so": "LD_PRELOAD of smbd (appliance/smb)",
    "/usr/lib/x86_64-linux-gnu/libkrb5.so.3": "ctypes in appliance/nfs/onc/gss.py",
    "/usr/lib/x86_64-linux-gnu/ganesha/libfsalvfs.so": "bench/ganesha.py's FSAL VFS",
    "/usr/lib/x86_64-linux-gnu/tcmu-runner/handler_file_zbc.so": "the zoned rig's ZBC disks",
    "/usr/share/seabios/bios-256k.bin": "qemu's BIOS for the kernel rig",
    "/usr/share/qemu/linuxboot_dma.bin": "qemu -kernel",
    "/usr/lib/ipxe/qemu/efi-virtio.rom": "the rig's virtio-net-pci",
    "/lib/systemd/systemd": "PID 1 of tests/kernel/test_systemd_install.py",
    "/usr/lib/postgresql/15/bin/pg_ctl": "Patroni (tests/cluster/bed.py bin_dir)",
    "/usr/lib/postgresql/15/bin/pg_rewind": "Patroni (tests/cluster/bed.py bin_dir)",
    "/usr/lib/postgresql/15/bin/pg_basebackup": "Patroni's replicas (bin_dir)",
    "/usr/lib/python3/dist-packages/etcd/__init__.py": "Patroni's etcd3 store (python3-etcd)",
    "/usr/bin/etcdctl": "docs/cluster.md's checks of the rendered etcd members",
}


def bootstrap_packages() -> list[str]:
    text = (ROOT / "scripts" / "bootstrap.sh").read_text()
    return text.split('apt_packages=${SHINGLE_APT_PACKAGES:-"', 1)[1].split('"}')[0].split()


def _docstring_ids(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


@functools.cache
def named_files() -> dict[str, set[str]]:
    """{a file in Debian's folders: the source files naming it}: programs named by a string
    constant, absolute paths to existing files, and LOADED_FILES."""
    search = os.pathsep.join(PROGRAM_DIRS)
    named: dict[str, set[str]] = {
        path: {f"LOADED_FILES: {why}"} for path, why in LOADED_FILES.items()
    }
    for area in SCANNED:
        for source in sorted((ROOT / area).rglob("*.py")):
            if source.name == Path(__file__).name:
                continue  # NOT_PROGRAMS' packages
            tree = ast.parse(source.read_text(), str(source))
            docstrings = _docstring_ids(tree)
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                    continue
                value = node.value.strip()
                if id(node) in docstrings or not value or " " in value or "\n" in value:
                    continue
                path = None
                if value.startswith(("/usr/", "/bin/", "/sbin/", "/lib/")):
                    path = value if os.path.isfile(value) else None
                elif "/" not in value and value not in NOT_PROGRAMS:
                    path = shutil.which(value, path=search)
                if path:
                    named.setdefault(path, set()).add(str(source.relative_to(ROOT)))
    return named


@functools.cache
def owners(paths: tuple[str, ...]) -> dict[str, str | None]:
    """{path: the package dpkg says owns it}, trying the other side of merged /usr (one dpkg
    call: each loads every package's file list)."""
    candidates: dict[str, list[str]] = {}
    for path in paths:
        real = os.path.realpath(path)
        sides = [p[4:] if p.startswith("/usr/") else "/usr" + p for p in (path, real)]
        candidates[path] = list(dict.fromkeys([path, real, *sides]))
    every = sorted({c for cs in candidates.values() for c in cs})
    out = subprocess.run(["dpkg", "-S", *every], capture_output=True, text=True).stdout
    owned: dict[str, str] = {}
    for line in out.splitlines():
        if line.startswith("diversion ") or ": " not in line:
            continue
        packages, _, path = line.partition(": ")
        owned.setdefault(path, packages.split(",")[0].strip().split(":")[0])
    return {
        path: next((owned[c] for c in cs if c in owned), None) for path, cs in candidates.items()
    }


def _dependency_names(field: str) -> list[str]:
    """The first alternative of each dependency (what apt picks when none is installed)."""
    names = []
    for group in filter(None, (g.strip() for g in field.split(","))):
        first = group.split("|")[0].strip()
        names.append(re.split(r"[\s(:]", first, maxsplit=1)[0])
    return names


def installed_closure(named: list[str]) -> set[str]:
    """The packages a --no-install-recommends install of ``named`` brings (from dpkg's status
    of this machine's packages), with the Priority: required ones every Debian system has."""
    fields = "${Package}\t${db:Status-Abbrev}\t${Priority}\t${Essential}\t${Pre-Depends}\t"
    out = subprocess.run(
        ["dpkg-query", "-W", "-f", fields + "${Depends}\t${Provides}\n"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    depends: dict[str, list[str]] = {}
    providers: dict[str, list[str]] = {}
    base = []
    for line in out.splitlines():
        package, status, priority, essential, pre, deps, provides = line.split("\t")
        if not status.startswith("ii"):
            continue
        depends[package] = _dependency_names(pre) + _dependency_names(deps)
        for virtual in _dependency_names(provides):
            providers.setdefault(virtual, []).append(package)
        if priority == "required" or essential == "yes":
            base.append(package)
    closure: set[str] = set()
    todo = list(named) + base
    while todo:
        name = todo.pop()
        if name in closure:
            continue
        closure.add(name)
        if name in depends:
            todo.extend(depends[name])
        else:  # a virtual package: the installed packages that provide it
            todo.extend(providers.get(name, []))
    return closure


def unbootstrapped(packages: list[str]) -> list[str]:
    named = named_files()
    owner = owners(tuple(sorted(named)))
    closure = installed_closure(packages)
    problems = []
    for path, where in sorted(named.items()):
        places = ", ".join(sorted(where)[:3])
        if owner[path] is None:
            problems.append(f"{path} (named in {places}) belongs to no Debian package")
        elif owner[path] not in closure:
            problems.append(
                f"{path} (named in {places}) comes from {owner[path]}, which "
                "scripts/bootstrap.sh neither names nor gets as a hard dependency"
            )
    missing = [p for p in LOADED_FILES if not os.path.exists(p)]
    return problems + [f"{p} is not installed ({LOADED_FILES[p]})" for p in missing]


pytestmark = pytest.mark.skipif(shutil.which("dpkg") is None, reason="not a Debian system")


def test_every_program_and_file_the_code_names_comes_from_a_bootstrap_package():
    assert unbootstrapped(bootstrap_packages()) == []


def test_a_package_left_out_of_the_bootstrap_is_found():
    """samba-vfs-modules (a Recommends of samba) and smbclient left out: their files are named."""
    packages = [p for p in bootstrap_packages() if p not in ("samba-vfs-modules", "smbclient")]
    problems = unbootstrapped(packages)
    assert any("/samba/vfs/fruit.so" in p and "samba-vfs-modules" in p for p in problems)
    assert any(p.startswith("/usr/bin/smbclient ") and "from smbclient" in p for p in problems)
    assert len(problems) == len(
        [p for p in problems if "samba-vfs-modules" in p or "smbclient" in p]
    )
