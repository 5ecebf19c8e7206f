"""What the FUSE mount answers without the catalog or a worker thread, and that it stays exact:
Samba's create sequence (a lookup of the new name, the folder's ACL xattrs, the create, the
DOS-attribute xattr read, set and read back, write, utimes, close), the kernel's negative
entries, the caller's supplementary groups, and the read-ahead window of sequential readers.

The mount runs in this process over an Appliance of a fresh ``shingle init`` folder, so the
namespace calls it makes can be counted."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyfuse3
import pytest

from appliance import config as config_mod
from appliance.runtime import Appliance
from appliance.smb import mount as mount_mod
from appliance.smb.mount import FuseMount
from engine.namespace import ROOT
from tests.smb.conftest import REPO, free_port

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts with allow_other, as root")

DOS = b"\0\0\5\0\5\0\0\0\21\0\0\0 \0\0\0xR\275\3.\205\335\1"  # what smbd stores on a create


@pytest.fixture(scope="module")
def mounted(tmp_path_factory):
    """One appliance and mount for the module (a `shingle init` and a mount cost 1 s quiet, 10-30 s
    at the suite's load): each test works in a folder of its own and puts back what it patches."""
    data = tmp_path_factory.mktemp("mount-cache") / "data"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "appliance.cli",
            "init",
            str(data),
            "--drives",
            "10",
            "--drive-size",
            "256MiB",
            "--zone-size",
            "16MiB",
            "--nfs-port",
            str(free_port()),
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=120,
    )
    appliance = Appliance(config_mod.load(data / "shingle.toml"))
    # outside pytest's own folder (0700): other users must reach the mount point
    above = Path(tempfile.mkdtemp(prefix="shingle-mount-"))
    above.chmod(0o755)
    mount = FuseMount(appliance.namespace, above / "mnt")
    try:
        mount.start()
        yield appliance, mount
    finally:
        mount.stop()
        appliance.close()
        shutil.rmtree(above, ignore_errors=True)


def count_worker_calls(mount: FuseMount, monkeypatch) -> list[str]:
    """The namespace calls the mount hands to a worker thread, by name, from now on."""
    names: list[str] = []
    original = mount.fs._call

    async def counted(fn, *args, **kwargs):
        names.append(fn.__name__)
        return await original(fn, *args, **kwargs)

    monkeypatch.setattr(mount.fs, "_call", counted)
    return names


def test_samba_create_sequence_needs_workers_only_for_its_changes(mounted, monkeypatch):
    appliance, mount = mounted
    ns = appliance.namespace
    folder = mount.mountpoint / "small"
    folder.mkdir()
    os.setxattr(folder, "user.k", b"v")
    lookups: list[str] = []
    original_lookup = ns.lookup

    def lookup(cred, dir_ino, name):
        lookups.append(name)
        return original_lookup(cred, dir_ino, name)

    monkeypatch.setattr(ns, "lookup", lookup)
    workers: list[str] = []
    for i in range(4):  # the first one reads the folder once
        name = f"f{i}"
        if i == 1:
            lookups.clear()
            workers = count_worker_calls(mount, monkeypatch)
        dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.stat(dir_fd)
            for _ in range(2):  # a name probed again is answered by the kernel's negative entry
                with pytest.raises(FileNotFoundError):
                    os.stat(name, dir_fd=dir_fd)
            for acl in ("system.posix_acl_access", "system.posix_acl_default"):
                with pytest.raises(OSError) as no_acl:
                    os.getxattr(f"/proc/self/fd/{dir_fd}", acl)
                assert no_acl.value.errno == errno.ENODATA
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
        try:
            with pytest.raises(OSError) as no_dos:
                os.getxattr(fd, "user.DOSATTRIB")
            assert no_dos.value.errno == errno.ENODATA
            os.setxattr(fd, "user.DOSATTRIB", DOS)
            assert os.getxattr(fd, "user.DOSATTRIB") == DOS
            assert os.pwrite(fd, b"x" * 1024, 0) == 1024
            assert os.getxattr(fd, "user.DOSATTRIB") == DOS
            os.utime(fd, ns=(1_000_000_000, 2_000_000_000))
        finally:
            os.close(fd)
        assert os.getxattr(folder / name, "user.DOSATTRIB") == DOS  # kept by the data commit
        assert os.stat(folder / name).st_size == 1024
    # only the changes (create, setxattr, utimes, the commit at close) went to a worker
    assert set(workers) <= {"create", "setxattr", "setattr", "commit"}, workers
    assert workers.count("create") == 3 and workers.count("setxattr") == 3, workers
    # one lookup for both probes; the kernel looks the name up again for an O_EXCL create
    assert lookups == ["f1", "f1", "f2", "f2", "f3", "f3"], lookups
    for i in range(4):
        assert (folder / f"f{i}").read_bytes() == b"x" * 1024

    # a cached negative entry gives way at once to a name made outside the mount (as by NFS)
    with pytest.raises(FileNotFoundError):
        os.stat(folder / "by-nfs")
    parent = ns.lookup(ROOT, ns.root_ino, "small")
    made = ns.create(ROOT, parent.ino, "by-nfs", 0o600)
    deadline = time.monotonic() + 0.5  # well inside the entry timeout (CACHE_TIMEOUT_S)
    while not (folder / "by-nfs").exists():
        assert time.monotonic() < deadline, "the negative entry outlived the create"
        time.sleep(0.01)
    assert os.stat(folder / "by-nfs").st_ino == made.ino
    ns.unlink(ROOT, parent.ino, "by-nfs")
    deadline = time.monotonic() + 0.5
    while (folder / "by-nfs").exists():
        assert time.monotonic() < deadline, "a removed name outlived the unlink"
        time.sleep(0.01)


def test_supplementary_groups_are_read_once_per_caller_and_still_decide(mounted, monkeypatch):
    appliance, mount = mounted
    shared = mount.mountpoint / "shared"
    shared.mkdir(mode=0o755)
    secret = shared / "group-only"
    secret.write_bytes(b"for group 4242")
    os.chown(secret, 0, 4242)
    secret.chmod(0o640)
    reads: list[int] = []
    original = pyfuse3.get_sup_groups
    monkeypatch.setattr(
        mount_mod.pyfuse3, "get_sup_groups", lambda pid: reads.append(pid) or original(pid)
    )
    script = (
        "import os, sys\n"
        f"p = {str(secret)!r}\n"
        "for _ in range(20):\n"
        "    try:\n"
        "        os.getxattr(p, 'user.DOSATTRIB')\n"
        "    except OSError:\n"
        "        pass\n"
        "try:\n"
        "    sys.stdout.write(open(p).read())\n"
        "except PermissionError:\n"
        "    sys.stdout.write('denied')\n"
    )

    def as_user(groups: list[str]) -> str:
        done = subprocess.run(
            ["setpriv", "--reuid=20001", "--regid=20001", *groups, sys.executable, "-c", script],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert as_user(["--groups=4242"]) == "for group 4242"
    assert len(reads) <= 2, f"groups read {len(reads)} times for one process"
    # another process of the same uid and gid without the group: its own groups decide
    assert as_user(["--clear-groups"]) == "denied"


def test_sequential_reads_reach_the_namespace_in_large_requests(mounted, monkeypatch):
    appliance, mount = mounted
    data = os.urandom(1 << 20) * 8
    target = mount.mountpoint / "big.bin"
    target.write_bytes(data)
    sizes: list[int] = []
    ns = appliance.namespace
    original = ns.read

    def read(ino, offset, length):
        sizes.append(length)
        return original(ino, offset, length)

    monkeypatch.setattr(ns, "read", read)
    with open(target, "rb", buffering=0) as f:  # open drops cached pages (no keep_cache)
        got = b"".join(iter(lambda: f.read(4 << 20), b""))
    assert got == data
    assert max(sizes) >= 1 << 20, f"FUSE reads of at most {max(sizes)} bytes"
    assert len(sizes) <= 16, f"{len(sizes)} FUSE reads for 8 MiB"
