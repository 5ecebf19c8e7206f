"""The FUSE mount itself: the POSIX operations of the kernel rig, where they apply."""

from __future__ import annotations

import errno
import os
import subprocess

import pytest

from tests.smb.conftest import shingle


def as_user(uid: int, script: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "/bin/sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_posix_operations_on_the_mount(served):
    root = served.mount / "posix"
    root.mkdir()
    a, b = root / "a", root / "b"
    a.write_bytes(b"old")
    b.write_bytes(b"new")
    os.rename(b, a)  # rename over
    assert a.read_bytes() == b"new" and not b.exists()
    os.link(a, root / "hard")
    assert os.stat(a).st_nlink == 2 and (root / "hard").read_bytes() == b"new"
    os.symlink("a", root / "sym")
    assert os.readlink(root / "sym") == "a" and (root / "sym").read_bytes() == b"new"
    os.chmod(a, 0o640)
    os.chown(a, 1234, 5678)
    os.utime(a, ns=(1_000_000_000, 2_000_000_000))
    st = os.stat(a)
    assert (st.st_mode & 0o7777, st.st_uid, st.st_gid) == (0o640, 1234, 5678)
    assert (st.st_atime_ns, st.st_mtime_ns) == (1_000_000_000, 2_000_000_000)
    with open(a, "ab") as f:  # append
        f.write(b"+more")
    assert a.read_bytes() == b"new+more"
    os.truncate(a, 3)
    assert a.read_bytes() == b"new"
    with open(a, "r+b") as f:
        f.truncate(10)
    assert a.read_bytes() == b"new" + bytes(7)
    with pytest.raises(FileExistsError):
        os.open(root / "hard", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    opened = open(root / "hard", "rb")  # unlink while open: the data stays until close
    os.unlink(a)
    os.unlink(root / "hard")
    assert opened.read() == b"new" + bytes(7)
    opened.close()
    os.setxattr(root, "user.k", b"v")
    assert os.getxattr(root, "user.k") == b"v" and "user.k" in os.listxattr(root)
    os.mkfifo(root / "fifo")
    assert sorted(os.listdir(root)) == ["fifo", "sym"]


def test_the_mount_applies_the_namespace_permissions(served):
    private = served.mount / "private"
    private.mkdir(mode=0o700)
    (served.mount / "open.txt").write_bytes(b"x")
    os.chmod(served.mount / "open.txt", 0o644)
    done = as_user(4321, f"touch '{private}/f'")
    assert done.returncode != 0 and "Permission denied" in done.stderr
    done = as_user(4321, f"echo y >> '{served.mount}/open.txt'")
    assert done.returncode != 0 and "Permission denied" in done.stderr
    done = as_user(4321, f"cat '{served.mount}/open.txt'")
    assert done.returncode == 0 and done.stdout.strip() == "x"
    done = as_user(4321, f"echo y > '{served.mount}/mine.txt'")
    assert done.returncode == 0, done.stderr  # the root is 1777, as over NFS
    assert os.stat(served.mount / "mine.txt").st_uid == 4321


def test_the_guest_account_owns_nothing_it_did_not_create(served):
    """SMB guests are nobody (65534), the uid the mount's root is given to so that squashed NFS
    root clients can open their files there: the guest gets no owner rights over it."""
    theirs = served.mount / "theirs.txt"
    done = as_user(4321, f"echo theirs > '{theirs}' && chmod 644 '{theirs}'")
    assert done.returncode == 0, done.stderr
    assert os.stat(served.mount).st_uid == 65534
    for attempt in (
        f"rm -f '{theirs}'",
        f"mv '{theirs}' '{served.mount}/taken.txt'",
        f"chmod 777 '{served.mount}'",
    ):
        done = as_user(65534, attempt)
        assert done.returncode != 0 and "Operation not permitted" in done.stderr, attempt
    assert theirs.read_bytes() == b"theirs\n"
    assert os.stat(served.mount).st_mode & 0o7777 == 0o1777
    done = as_user(
        65534,
        f"echo mine > '{served.mount}/guest.txt' && mv '{served.mount}/guest.txt' "
        f"'{served.mount}/guest2.txt' && chmod 600 '{served.mount}/guest2.txt' && "
        f"rm '{served.mount}/guest2.txt'",
    )
    assert done.returncode == 0, done.stderr  # its own files stay its own
    theirs.unlink()


def test_a_hard_quota_fails_a_write_on_the_mount_with_edquot(served):
    tree = served.mount / "quota-tree"
    tree.mkdir()
    (tree / "kept").write_bytes(b"k" * 40_000)
    shingle(served.config, "quota", "set", "/quota-tree", "--bytes", "64KiB")
    path = tree / "refused"
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        with pytest.raises(OSError) as raised:
            os.write(fd, b"r" * 40_000)  # 80,000 bytes would pass 65,536
        assert raised.value.errno == errno.EDQUOT
        assert os.write(fd, b"r" * 20_000) == 20_000  # what fits is taken
    finally:
        os.close(fd)
    assert os.stat(path).st_size == 20_000
    listed = shingle(served.config, "quota", "list", "--json").stdout
    assert '"used_bytes": 60000' in listed
    shingle(served.config, "quota", "remove", "/quota-tree")
