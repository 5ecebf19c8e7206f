"""Runs inside the VM (the host's /usr/bin/python3, standard library only): mounts the
shingle server with the kernel NFS client and prints one marker line per check.

    @@CHECK PASS|FAIL|SKIP NAME details

The host imports this module too, for the check names (``planned_checks``), so that each
check is its own pytest test. As root, ``main(plan)`` mounts each NFS version, runs the
per-user checks in a worker process per uid (``--worker``, under setpriv for uid != 0),
then the root-only checks; ``vmchannel_request`` asks the host to act (restart the server).
"""

from __future__ import annotations

import errno
import fcntl
import grp
import hashlib
import json
import os
import pwd
import random
import re
import shutil
import stat
import subprocess
import sys
import threading
import time
import traceback

CHECK_MARKER = "@@CHECK"
REQUEST, REPLY = "@@SHINGLE-VM REQUEST", "@@SHINGLE-VM REPLY"
SERVER = "10.0.2.2"  # the host's 127.0.0.1 under qemu user-mode networking
UNPRIVILEGED = 1000

# checks every user runs in its own folder on each mount
USER_CHECKS = (
    "data-verify",
    "cp-a-diff",
    "rename-over",
    "hardlink",
    "symlink",
    "chmod",
    "chown",
    "utimes-ns",
    "truncate",
    "append",
    "o-excl",
    "unlink-open",
    "mkfifo",
    "name-255",
    "lockf",
    "flock",
    "checkpoint",
)
# checks run once per version, as root
VERSION_CHECKS = (
    "mount",
    "reread-after-drop-caches",
    "lock-wait",
    "umount",
    "nconnect-4",
    "dmesg-clean",
)
# checks that take locks: skipped on a version whose plan entry has "skip_locks" (why)
LOCK_CHECKS = ("lockf", "flock", "lock-wait", "lock-vs-")
# a blocked NLM lock is granted by the server's NLM_GRANTED callback (the plan's lockd_port,
# forwarded by the host), or else by the client's retry every 30 s; NFSv4 clients poll
LOCK_WAIT_LIMIT_S = 50
# checks run once per version as root where the plan entry has "v42" (NFSv4.2's operations:
# CLONE, asynchronous COPY, ALLOCATE, DEALLOCATE, SEEK, the xattr operations) and snapshot
# views, which the host creates on request
V42_CHECKS = (
    "reflink",
    "copy-offload",
    "copy-offload-restart",
    "fallocate",
    "punch-hole",
    "seek-data-hole",
    "xattr",
    "snapshot-read",
    "snapshot-clone",
)
# checks run once per version as root in the export root of an export with the default
# squash (plan "root_squash": a daemon of their own, on "root_squash_port")
ROOT_SQUASH_CHECKS = ("root-squash/own-files", "root-squash/others-kept")
# a read delegation per small file (plan "delegations": a mount of its own, as root): the
# second epoch of a loop that opens and reads every file sends few OPEN/GETATTR; a write
# from another client (the host, through nfs-rs) recalls the file's delegation and the guest
# sees the new bytes on its next open
DELEGATION_CHECKS = ("delegations/second-epoch", "delegations/recall-on-write")
# with "write_check" (NFSv4.1): a file the guest is writing is under a write delegation; the
# host's stat of it (nfs-rs) gets the guest's size, which the server asks the guest for
# (CB_GETATTR) as the bytes are still in the guest's page cache; the host's read after the
# close sees them (the read recalls the delegation)
WRITE_DELEGATION_CHECK = "delegations/write-cb-getattr"
RESTART_CHECKS = (
    "restart/io-continues",
    "restart/lock-kept",
    "restart/new-files",
    "restart/dmesg-clean",
)


def planned_checks(plan: dict) -> list[str]:
    names = []
    for version in plan["versions"]:
        label = version["label"]
        names.append(f"{label}/mount")
        names += [
            f"{label}/{user_label(uid)}/{check}" for uid in plan["uids"] for check in USER_CHECKS
        ]
        names += [f"{label}/{check}" for check in VERSION_CHECKS[1:2]]
        if version.get("v42"):
            names += [f"{label}/{check}" for check in V42_CHECKS]
        names += [f"{label}/{check}" for check in VERSION_CHECKS[2:3]]
        if version.get("lock_peer"):
            names.append(f"{label}/lock-vs-{version['lock_peer']}")
        names += [f"{label}/{check}" for check in VERSION_CHECKS[3:]]
    for version in plan.get("root_squash", ()):
        names += [f"{version['label']}/{check}" for check in ROOT_SQUASH_CHECKS]
    for key in ("delegations", "delegations40"):
        if plan.get(key):
            names += [f"{plan[key]['label']}/{check}" for check in DELEGATION_CHECKS]
            if plan[key].get("write_check"):
                names.append(f"{plan[key]['label']}/{WRITE_DELEGATION_CHECK}")
    if plan.get("krb5"):
        names += krb5_check_names(plan["krb5"])
    if plan.get("restart_version"):
        names += [f"{plan['restart_version']}/{check}" for check in RESTART_CHECKS]
    if plan.get("docs"):
        names += [f"docs/{block['name']}" for block in plan["docs"]["blocks"]]
    return names


def user_label(uid: int) -> str:
    return "root" if uid == 0 else f"uid{uid}"


def report(name: str, ok: bool | None, details: str = "") -> None:
    """``ok`` None: the check was skipped (``details`` says why)."""
    details = " | ".join(line for line in details.strip().splitlines() if line.strip())
    verdict = "SKIP" if ok is None else "PASS" if ok else "FAIL"
    print(f"{CHECK_MARKER} {verdict} {name} {details[:3000]}", flush=True)


def takes_locks(check: str) -> bool:
    return any(check.startswith(prefix) for prefix in LOCK_CHECKS)


class CheckFailed(Exception):
    pass


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def sh(
    *cmd: str, ok_codes: tuple[int, ...] = (0,), timeout: float = 300, env: dict | None = None
) -> str:
    run = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )
    if run.returncode not in ok_codes:
        raise CheckFailed(
            f"{' '.join(cmd)} -> {run.returncode}: {(run.stderr or run.stdout).strip()[-1500:]}"
        )
    return run.stdout


def sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def write_file(path: str, data: bytes, mode: int = 0o644) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


# -- per-user checks (in the worker; cwd is the user's folder on the mount) -------------------
def check_data_verify(manifest: list[str]) -> str:
    if subprocess.run(["sh", "-c", "command -v fio"], capture_output=True).returncode == 0:
        out = sh(
            "fio",
            "--name=crc",
            "--directory=.",
            "--filename=fio.dat",
            "--size=2M",
            "--bs=64k",
            "--rw=write",
            "--ioengine=psync",
            "--verify=crc32c",
            "--do_verify=1",
            "--end_fsync=1",
            "--minimal",
        )
        fields = out.strip().split(";")
        expect(fields[4] == "0", f"fio error {fields[4]}: {out[-500:]}")
        manifest.append("fio.dat")
        return f"fio write+verify crc32c 2 MiB, status {fields[4]}"
    sh("dd", "if=/dev/urandom", "of=/tmp/dd.src", "bs=64k", "count=32", "status=none")
    sh("dd", "if=/tmp/dd.src", "of=dd.dat", "bs=64k", "conv=fsync", "status=none")
    expect(sha256("/tmp/dd.src") == sha256("dd.dat"), "dd copy differs")
    manifest.append("dd.dat")
    return "no fio: dd 2 MiB + sha256"


def make_tree(root: str, files: int = 300) -> None:
    rng = random.Random(42)
    for i in range(files):
        folder = os.path.join(root, f"d{i % 12:02d}", f"sub{i % 3}")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"f{i:04d}.bin")
        write_file(path, rng.randbytes(rng.randrange(0, 4000)))
        os.chmod(path, rng.choice([0o644, 0o600, 0o755, 0o640]))
        os.utime(path, ns=(1_600_000_000_123_456_789 + i, 1_600_000_000_987_654_321 + i * 1000))
    os.symlink("d00/sub0/f0000.bin", os.path.join(root, "link"))


def tree_listing(root: str) -> str:
    # what cp -a must keep besides contents: type, mode, size, mtime to the ns, link targets
    return "\n".join(
        sorted(
            sh(
                "find",
                root,
                "-mindepth",
                "1",
                "-not",
                "-type",
                "d",
                "-printf",
                "%P %y %m %s %T@ %l\n",
            ).splitlines()
        )
    )


def check_cp_a_diff(manifest: list[str]) -> str:
    src = f"/tmp/tree-{os.getuid()}"
    if not os.path.exists(src):
        make_tree(src)
    started = time.monotonic()
    sh("cp", "-a", src, "tree")
    copied = time.monotonic() - started
    sh("diff", "-r", "--no-dereference", src, "tree")
    want, got = tree_listing(src), tree_listing("tree")
    pairs = zip(want.splitlines(), got.splitlines(), strict=False)
    first_difference = next(
        (f"{a!r} != {b!r}" for a, b in pairs if a != b),
        f"{len(want.splitlines())} != {len(got.splitlines())} entries",
    )
    expect(want == got, f"metadata differs: {first_difference}")
    manifest += [f"tree/{line.split()[0]}" for line in got.splitlines() if line.split()[1] == "f"][
        :50
    ]
    return f"300 files + symlink, cp -a {copied:.1f} s, diff -r and mode/size/mtime-ns equal"


def check_rename_over(_m) -> str:
    write_file("ren.a", b"new contents")
    write_file("ren.b", b"old contents that are longer")
    os.rename("ren.a", "ren.b")
    expect(not os.path.exists("ren.a"), "source still there after rename")
    expect(read_file("ren.b") == b"new contents", "target does not hold the source's bytes")
    return "rename onto an existing file replaced it"


def check_hardlink(_m) -> str:
    write_file("hl.a", b"linked")
    os.link("hl.a", "hl.b")
    a, b = os.stat("hl.a"), os.stat("hl.b")
    expect(
        a.st_ino == b.st_ino and a.st_nlink == b.st_nlink == 2,
        f"ino {a.st_ino}/{b.st_ino} nlink {a.st_nlink}/{b.st_nlink}",
    )
    os.unlink("hl.a")
    expect(
        os.stat("hl.b").st_nlink == 1 and read_file("hl.b") == b"linked", "after unlink of one name"
    )
    return "link: same inode, nlink 2 then 1"


def check_symlink(_m) -> str:
    os.mkdir("sl.dir")
    write_file("sl.dir/target", b"through the link")
    os.symlink("sl.dir/target", "sl.link")
    expect(os.readlink("sl.link") == "sl.dir/target", f"readlink {os.readlink('sl.link')!r}")
    expect(stat.S_ISLNK(os.lstat("sl.link").st_mode), "lstat is not a symlink")
    expect(read_file("sl.link") == b"through the link", "read through the link")
    os.symlink("x" * 1000, "sl.long")
    expect(os.readlink("sl.long") == "x" * 1000, "1000-byte link target")
    return "symlink, readlink, lstat, open through it, 1000-byte target"


def check_chmod(_m) -> str:
    write_file("mode", b"")
    for mode in (0o640, 0o755, 0o4750, 0o2711, 0o1777, 0o000):
        os.chmod("mode", mode)
        got = stat.S_IMODE(os.stat("mode").st_mode)
        expect(got == mode, f"chmod {mode:o} -> {got:o}")
    os.chmod("mode", 0o644)
    return "modes 640 755 4750 2711 1777 000 read back"


def check_chown(_m) -> str:
    write_file("owner", b"")
    uid, gid = os.getuid(), os.getgid()
    if uid == 0:
        os.chown("owner", 1234, 5678)
        st = os.stat("owner")
        expect(
            (st.st_uid, st.st_gid) == (1234, 5678), f"chown 1234:5678 -> {st.st_uid}:{st.st_gid}"
        )
        out = sh("stat", "-c", "%u:%g", "owner").strip()
        expect(out == "1234:5678", f"stat -c %u:%g -> {out}")
        return "root chown 1234:5678 read back (owner mapping works)"
    st = os.stat("owner")
    expect(
        (st.st_uid, st.st_gid) == (uid, gid),
        f"new file owned by {st.st_uid}:{st.st_gid}, expected {uid}:{gid}",
    )
    os.chown("owner", uid, gid)
    try:
        os.chown("owner", 0, 0)
    except PermissionError:
        return f"owned by {uid}:{gid}; chown to self works, to root is EPERM"
    raise CheckFailed("an unprivileged user gave a file to root")


def check_utimes_ns(_m) -> str:
    write_file("times", b"")
    env = {"TZ": "UTC"}
    sh("touch", "-m", "-d", "2021-03-04 05:06:07.123456789 +0000", "times", env=env)
    sh("touch", "-a", "-d", "2020-01-02 03:04:05.987654321 +0000", "times", env=env)
    mtime = sh("stat", "-c", "%y", "times", env=env).strip()
    atime = sh("stat", "-c", "%x", "times", env=env).strip()
    expect(mtime == "2021-03-04 05:06:07.123456789 +0000", f"mtime {mtime}")
    expect(atime == "2020-01-02 03:04:05.987654321 +0000", f"atime {atime}")
    os.utime("times", ns=(1, 2_000_000_001))
    st = os.stat("times")
    expect(
        (st.st_atime_ns, st.st_mtime_ns) == (1, 2_000_000_001),
        f"utimensat -> {st.st_atime_ns} {st.st_mtime_ns}",
    )
    return f"mtime {mtime}, atime {atime}"


def check_truncate(_m) -> str:
    data = random.randbytes(10000)
    write_file("trunc", data)
    os.truncate("trunc", 1234)
    expect(read_file("trunc") == data[:1234], "shrink")
    with open("trunc", "r+b") as f:
        f.truncate(50000)
    got = read_file("trunc")
    expect(len(got) == 50000 and got[:1234] == data[:1234] and got[1234:] == bytes(48766), "grow")
    sh("truncate", "-s", "0", "trunc")
    expect(os.stat("trunc").st_size == 0, "truncate -s 0")
    return "10000 -> 1234 -> 50000 (zeros) -> 0"


def check_append(_m) -> str:
    write_file("app", b"head\n")
    first = os.open("app", os.O_WRONLY | os.O_APPEND)
    second = os.open("app", os.O_WRONLY | os.O_APPEND)
    for i in range(20):
        os.write(first if i % 2 else second, f"line {i}\n".encode())
    os.close(first)
    os.close(second)
    sh("sh", "-c", "echo tail >> app")
    want = b"head\n" + b"".join(f"line {i}\n".encode() for i in range(20)) + b"tail\n"
    expect(read_file("app") == want, f"got {read_file('app')[:200]!r}")
    return "O_APPEND from two descriptors and the shell, in order"


def check_o_excl(_m) -> str:
    fd = os.open("excl", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.close(fd)
    try:
        os.open("excl", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        raise CheckFailed("second O_EXCL create succeeded")
    except FileExistsError:
        pass
    run = subprocess.run(["bash", "-c", "set -C; echo x > excl"], capture_output=True, text=True)
    expect(run.returncode != 0, "set -C overwrote an existing file")
    expect(read_file("excl") == b"", "contents changed")
    return "O_CREAT|O_EXCL and set -C refuse an existing file"


def check_unlink_open(_m) -> str:
    with open("gone", "w+b") as f:
        f.write(b"still readable")
        f.flush()
        os.unlink("gone")
        expect(not os.path.exists("gone"), "name still there")
        f.seek(0)
        expect(f.read() == b"still readable", "read after unlink")
        f.write(b" and writable")
        f.seek(0)
        expect(f.read() == b"still readable and writable", "write after unlink")
    leftovers = [n for n in os.listdir(".") if n.startswith(".nfs")]
    # the client removes its silly-renamed .nfsXXXX file on close; give it a moment
    for _ in range(50):
        if not leftovers:
            break
        time.sleep(0.1)
        leftovers = [n for n in os.listdir(".") if n.startswith(".nfs")]
    expect(not leftovers, f"left behind: {leftovers}")
    return "read and write after unlink; no .nfs file left after close"


def check_mkfifo(_m) -> str:
    os.mkfifo("fifo", 0o640)
    st = os.lstat("fifo")
    expect(stat.S_ISFIFO(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o640, f"mode {st.st_mode:o}")
    out = sh("stat", "-c", "%F", "fifo").strip()
    expect(out == "fifo", f"stat says {out}")
    return "mkfifo: a fifo, mode 640"


def check_name_255(_m) -> str:
    name = ("n" * 250) + ".data"
    write_file(name, b"long name")
    expect(len(name) == 255 and name in os.listdir("."), "not listed")
    expect(read_file(name) == b"long name", "read back")
    os.rename(name, name[:-1] + "e")
    os.unlink(name[:-1] + "e")
    try:
        write_file("m" * 256, b"")
        raise CheckFailed("a 256-byte name was created")
    except OSError as exc:
        expect(exc.errno == errno.ENAMETOOLONG, f"256 bytes: {exc}")
    return "255-byte name created, listed, renamed, removed; 256 is ENAMETOOLONG"


LOCKER = r"""
import fcntl, os, sys
kind, path = sys.argv[1], sys.argv[2]
fd = os.open(path, os.O_RDWR)
lock = fcntl.lockf if kind == "lockf" else fcntl.flock
try:
    lock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    print("got")
except OSError as exc:
    print("busy" if exc.errno in (11, 13) else f"error {exc}")
"""


def lock_check(kind: str) -> str:
    write_file(f"{kind}.lock", b"0" * 100)
    fd = os.open(f"{kind}.lock", os.O_RDWR)
    lock = fcntl.lockf if kind == "lockf" else fcntl.flock
    lock(fd, fcntl.LOCK_EX)
    try:
        other = sh(sys.executable, "-c", LOCKER, kind, f"{kind}.lock").strip()
        expect(other == "busy", f"second process while held: {other}")
    finally:
        lock(fd, fcntl.LOCK_UN)
    other = sh(sys.executable, "-c", LOCKER, kind, f"{kind}.lock").strip()
    os.close(fd)
    expect(other == "got", f"second process after unlock: {other}")
    if kind == "lockf":  # byte ranges: a lock on bytes 0-9 leaves bytes 50-59 free
        fd = os.open("lockf.lock", os.O_RDWR)
        fcntl.lockf(fd, fcntl.LOCK_EX, 10, 0)
        ranged = sh(
            sys.executable,
            "-c",
            "import fcntl,os,sys; fd=os.open(sys.argv[1], os.O_RDWR); "
            "fcntl.lockf(fd, fcntl.LOCK_EX|fcntl.LOCK_NB, 10, 50); print('got')",
            "lockf.lock",
        )
        os.close(fd)
        expect(ranged.strip() == "got", "a non-overlapping range was refused")
    return f"{kind}: second process gets EAGAIN while held, the lock after release"


WAITER = r"""
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
print("waiting", flush=True)
fcntl.lockf(fd, fcntl.LOCK_EX)
print("got", flush=True)
"""


def lock_wait(held: str, waited: str) -> float:
    """Hold a lock on ``held`` while another process waits (F_SETLKW) for one on ``waited``
    (the same file, maybe through another mount); the seconds from the release to its grant,
    at most LOCK_WAIT_LIMIT_S: a waiter left blocked is killed, not waited for."""
    fd = os.open(held, os.O_RDWR)
    waiter = None
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        waiter = subprocess.Popen(
            [sys.executable, "-c", WAITER, waited], stdout=subprocess.PIPE, text=True
        )
        expect(waiter.stdout.readline().strip() == "waiting", "the waiter did not start")
        time.sleep(2)
        expect(waiter.poll() is None, f"the waiter got the lock while it was held: {waiter.poll()}")
        fcntl.lockf(fd, fcntl.LOCK_UN)
        released = time.monotonic()
        try:
            out, _ = waiter.communicate(timeout=LOCK_WAIT_LIMIT_S)
        except subprocess.TimeoutExpired:
            raise CheckFailed(
                f"the blocked lock was not granted within {LOCK_WAIT_LIMIT_S} s of the release"
            ) from None
        expect(out.strip() == "got", f"waiter: {out.strip()} (exit {waiter.returncode})")
        return time.monotonic() - released
    finally:
        if waiter is not None and waiter.poll() is None:
            waiter.kill()  # not waited for: it may be stuck in the kernel
        os.close(fd)


def check_lock_wait(folder: str) -> str:
    # two processes on one mount: the client makes the waiter wait for the local holder,
    # then asks the server, which grants at once (the cross-version check waits at the server)
    path = os.path.join(folder, "wait.lock")
    write_file(path, b"0" * 100)
    waited = lock_wait(path, path)
    return f"F_SETLKW blocked while held, granted {waited:.1f} s after the release"


def check_lock_vs_peer(folder: str, peer_folder: str, label: str, peer: str) -> str:
    """The same file through two mounts of different NFS versions (two superblocks, so the
    client cannot decide locally): each version's lock excludes the other's, at the server,
    and a waiter of one version gets the lock after the other's release (an NLM waiter
    through the server's NLM_GRANTED callback)."""
    mine, theirs = os.path.join(folder, "cross.lock"), os.path.join(peer_folder, "cross.lock")
    write_file(mine, b"0" * 100)
    waits = []
    for held, tried, holder, tester in ((mine, theirs, label, peer), (theirs, mine, peer, label)):
        fd = os.open(held, os.O_RDWR)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            other = sh(sys.executable, "-c", LOCKER, "lockf", tried, timeout=60).strip()
            expect(other == "busy", f"a {tester} lock while a {holder} one is held: {other}")
            fcntl.lockf(fd, fcntl.LOCK_UN)
            other = sh(sys.executable, "-c", LOCKER, "lockf", tried, timeout=60).strip()
            expect(other == "got", f"a {tester} lock after the {holder} unlock: {other}")
        finally:
            os.close(fd)
        waits.append(f"{tester} waiter granted {lock_wait(held, tried):.1f} s after the release")
    return (
        f"a {label} lock excludes a {peer} one on the same file, and the other way round; "
        + "; ".join(waits)
    )


def check_lockf(_m) -> str:
    return lock_check("lockf")


def check_flock(_m) -> str:
    return lock_check("flock")


def check_checkpoint(manifest: list[str]) -> str:
    payload = random.randbytes(1 << 20)
    for step in range(3):
        tmp, final = f"ckpt-{step}.pt.tmp", f"ckpt-{step}.pt"
        with open(tmp, "wb") as f:
            f.write(payload[step:] + payload[:step])
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, final)
        dfd = os.open(".", os.O_RDONLY)
        os.fsync(dfd)
        os.close(dfd)
        expect(sha256(final) == hashlib.sha256(payload[step:] + payload[:step]).hexdigest(), final)
        manifest.append(final)
    expect(not [n for n in os.listdir(".") if n.endswith(".tmp")], "a .tmp left behind")
    return "3 x 1 MiB: write .tmp, fsync, rename, fsync dir, sha256 read back"


# -- NFSv4.2 checks (as root, in a child; cwd is the version's root folder) -------------------
def drop_caches() -> None:
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def write_synced(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def op_counts(mountpoint: str) -> dict[str, int]:
    """How many of each NFS operation the mount at ``mountpoint`` has sent so far (the first
    field of its per-op statistics in /proc/self/mountstats)."""
    counts: dict[str, int] = {}
    mine = False
    with open("/proc/self/mountstats") as f:
        for line in f:
            if line.startswith("device "):
                mine = f" mounted on {mountpoint} with " in line
            elif mine and re.match(r"\s+[A-Z_]+: \d", line):
                name, _, numbers = line.strip().partition(": ")
                counts[name] = int(numbers.split()[0])
    return counts


class SentOps:
    """``with SentOps(mountpoint, "CLONE") as sent: ...`` then ``sent.expect()``: the block made
    the client send each named operation at least once (it did not fall back to others)."""

    def __init__(self, mountpoint: str, *ops: str):
        self.mountpoint, self.ops = mountpoint, ops

    def __enter__(self) -> SentOps:
        self.before = op_counts(self.mountpoint)
        return self

    def __exit__(self, *exc) -> None:
        after = op_counts(self.mountpoint)
        self.sent = {op: after.get(op, 0) - self.before.get(op, 0) for op in self.ops}

    def expect(self) -> str:
        missing = [op for op, n in self.sent.items() if n < 1]
        expect(not missing, f"the client sent no {'/'.join(missing)}: {self.sent}")
        return ", ".join(f"{op} x{n}" for op, n in self.sent.items())


def check_reflink(mountpoint: str, _ns_folder: str) -> str:
    data = random.randbytes(3 << 20)
    write_synced("clone.src", data)
    with SentOps(mountpoint, "CLONE") as sent:
        sh("cp", "--reflink=always", "clone.src", "clone.dst")
    drop_caches()
    expect(sha256("clone.dst") == hashlib.sha256(data).hexdigest(), "the clone's bytes differ")
    # a clone shares the source's extents until one of them is written
    with open("clone.dst", "r+b") as f:
        f.seek(1 << 20)
        f.write(b"x" * 4096)
        f.flush()
        os.fsync(f.fileno())
    drop_caches()
    expect(read_file("clone.src") == data, "a write into the clone changed the source")
    changed = data[: 1 << 20] + b"x" * 4096 + data[(1 << 20) + 4096 :]
    expect(read_file("clone.dst") == changed, "the clone after a 4 KiB write into it")
    return f"cp --reflink=always of 3 MiB ({sent.expect()}), bytes equal, copies independent"


def offload_counts() -> dict[str, int]:
    """The server's asynchronous COPY counters (the daemon's latest metrics sample)."""
    answer = vmchannel_request("offload-stats")
    try:
        return {k: int(v) for k, v in (item.split("=") for item in answer.split())}
    except ValueError:
        raise CheckFailed(f"host: {answer}") from None


def check_copy_offload(mountpoint: str, _ns_folder: str) -> str:
    """copy_file_range of 12 MiB: the client asks for an asynchronous COPY (more than two
    rsizes), the server answers with a copy stateid and the client waits for CB_OFFLOAD."""
    data = random.randbytes(12 << 20)
    write_synced("offload.src", data)
    before = offload_counts()
    started = time.monotonic()
    with SentOps(mountpoint, "COPY") as sent:
        with open("offload.src", "rb") as src, open("offload.dst", "wb") as dst:
            copied = 0
            while copied < len(data):
                n = os.copy_file_range(src.fileno(), dst.fileno(), len(data) - copied)
                expect(n > 0, f"copy_file_range returned {n} after {copied} bytes")
                copied += n
    took = time.monotonic() - started
    polls = op_counts(mountpoint).get("OFFLOAD_STATUS", 0)
    drop_caches()
    expect(sha256("offload.dst") == hashlib.sha256(data).hexdigest(), "the copy's bytes differ")
    # the daemon records its counters every few seconds: wait for a sample after the copy
    deadline = time.monotonic() + 40
    after = offload_counts()
    while after.get("answered", 0) <= before.get("answered", 0) and time.monotonic() < deadline:
        time.sleep(1)
        after = offload_counts()
    gained = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    expect(
        gained.get("started", 0) >= 1 and gained.get("answered", 0) >= 1,
        f"no asynchronous COPY answered by the client's CB_OFFLOAD: {before} -> {after}",
    )
    os.unlink("offload.dst")
    os.unlink("offload.src")
    return (
        f"copy_file_range of 12 MiB in {took:.1f} s ({sent.expect()}, OFFLOAD_STATUS so far "
        f"x{polls}), sha256 equal; server: {gained}"
    )


def copy_whole(src_path: str, dst_path: str, size: int, outcome: dict) -> None:
    """copy_file_range of ``src_path`` into a new ``dst_path`` until ``size`` bytes or 0;
    ``outcome`` gets "copied" or "error"."""
    try:
        with open(src_path, "rb") as src, open(dst_path, "wb") as dst:
            copied = 0
            while copied < size:
                n = os.copy_file_range(src.fileno(), dst.fileno(), size - copied)
                if n == 0:
                    break
                copied += n
        outcome["copied"] = copied
    except OSError as exc:
        outcome["error"] = f"{errno.errorcode.get(exc.errno, exc.errno)}: {exc}"


def check_copy_offload_restart(mountpoint: str, _ns_folder: str) -> str:
    """The server restarts while it copies in the background (the rig's daemon paces
    asynchronous COPYs at nfs.copy_offload_mib_s): no CB_OFFLOAD reports the half copy
    complete; the client learns of the restart, copies again, and copy_file_range returns
    the whole file."""
    data = random.randbytes(16 << 20)
    write_synced("redrive.src", data)
    outcome: dict = {}
    with SentOps(mountpoint, "COPY") as sent:
        worker = threading.Thread(
            target=copy_whole, args=("redrive.src", "redrive.dst", len(data), outcome)
        )
        worker.start()
        time.sleep(0.5)  # under way: 16 MiB take the server about 2 s
        answer = vmchannel_request("restart-server")
        worker.join(240)
    expect(not worker.is_alive(), f"copy_file_range still running 240 s after: {answer}")
    expect("error" not in outcome, f"copy_file_range failed: {outcome.get('error')} ({answer})")
    expect(outcome["copied"] == len(data), f"copied {outcome['copied']} of {len(data)} bytes")
    drop_caches()
    expect(sha256("redrive.dst") == hashlib.sha256(data).hexdigest(), "the bytes differ")
    os.unlink("redrive.dst")
    os.unlink("redrive.src")
    return f"server {answer} during the copy; 16 MiB copied whole ({sent.expect()}), sha256 equal"


def check_fallocate(mountpoint: str, _ns_folder: str) -> str:
    with SentOps(mountpoint, "ALLOCATE") as sent:
        sh("fallocate", "-l", "8M", "falloc.new")
        head = random.randbytes(1 << 20)
        write_synced("falloc.grow", head)
        sh("fallocate", "-l", "4M", "falloc.grow")
    drop_caches()
    size = os.stat("falloc.new").st_size
    expect(size == 8 << 20, f"fallocate -l 8M on a new file: size {size}")
    expect(read_file("falloc.new") == bytes(8 << 20), "an allocated range does not read as zeros")
    grown = read_file("falloc.grow")
    expect(grown == head + bytes(3 << 20), f"1 MiB file after fallocate -l 4M: {len(grown)} bytes")
    return f"fallocate -l 8M (new) and 4M (over 1 MiB of data) ({sent.expect()}), zeros beyond"


def check_punch_hole(mountpoint: str, _ns_folder: str) -> str:
    data = random.randbytes(8 << 20)
    write_synced("punch.dat", data)
    drop_caches()
    before = os.stat("punch.dat").st_blocks * 512
    with SentOps(mountpoint, "DEALLOCATE") as sent:
        sh("fallocate", "-p", "-o", "2M", "-l", "4M", "punch.dat")
    drop_caches()
    st = os.stat("punch.dat")
    after = st.st_blocks * 512
    expect(st.st_size == 8 << 20, f"size {st.st_size} after the punch, expected 8 MiB kept")
    want = data[: 2 << 20] + bytes(4 << 20) + data[6 << 20 :]
    expect(read_file("punch.dat") == want, "the punched range is not zeros, or the rest changed")
    expect(
        after <= before - (4 << 20),
        f"stat blocks {before // 512} before, {after // 512} after punching 4 MiB",
    )
    return (
        f"fallocate -p 4 MiB of 8 MiB ({sent.expect()}): zeros, size kept, "
        f"st_blocks {before // 512} -> {after // 512}"
    )


def check_seek_data_hole(mountpoint: str, _ns_folder: str) -> str:
    kib64, mib4, mib6 = 64 << 10, 4 << 20, 6 << 20
    first, second = random.randbytes(kib64), random.randbytes(kib64)
    fd = os.open("sparse.dat", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.pwrite(fd, first, 0)
        os.pwrite(fd, second, mib4)
        os.ftruncate(fd, mib6)
        os.fsync(fd)
        with SentOps(mountpoint, "SEEK") as sent:
            found = {
                "data@0": os.lseek(fd, 0, os.SEEK_DATA),
                "hole@0": os.lseek(fd, 0, os.SEEK_HOLE),
                "data@64K": os.lseek(fd, kib64, os.SEEK_DATA),
                "hole@4M": os.lseek(fd, mib4, os.SEEK_HOLE),
                "hole@5M": os.lseek(fd, 5 << 20, os.SEEK_HOLE),
            }
            past = []
            for offset in (mib4 + kib64, mib6):
                try:
                    past.append(os.lseek(fd, offset, os.SEEK_DATA))
                except OSError as exc:
                    past.append(errno.errorcode.get(exc.errno, exc.errno))
        want = {
            "data@0": 0,
            "hole@0": kib64,
            "data@64K": mib4,
            "hole@4M": mib4 + kib64,
            "hole@5M": 5 << 20,
        }
        expect(found == want, f"lseek found {found}, expected {want}")
        expect(past == ["ENXIO", "ENXIO"], f"SEEK_DATA past the last data: {past}")
    finally:
        os.close(fd)
    drop_caches()
    got = read_file("sparse.dat")
    expect(got == first + bytes(mib4 - kib64) + second + bytes(mib6 - mib4 - kib64), "bytes")
    return f"SEEK_DATA/SEEK_HOLE at 0, 64K, 4M, 5M and past the data ({sent.expect()})"


def check_xattr(mountpoint: str, _ns_folder: str) -> str:
    write_file("xattr.dat", b"labelled")
    blob = random.randbytes(4000)
    with SentOps(mountpoint, "SETXATTR", "GETXATTR", "LISTXATTRS", "REMOVEXATTR") as sent:
        sh("setfattr", "-n", "user.dataset", "-v", "imagenet-v2", "xattr.dat")
        os.setxattr("xattr.dat", "user.blob", blob)
        os.setxattr(".", "user.owner-team", b"vision")
        drop_caches()  # what follows reads the server's copy, not the client's xattr cache
        value = sh("getfattr", "--only-values", "-n", "user.dataset", "xattr.dat")
        expect(value == "imagenet-v2", f"getfattr -n user.dataset: {value!r}")
        expect(os.getxattr("xattr.dat", "user.blob") == blob, "4000-byte value read back")
        expect(os.getxattr(".", "user.owner-team") == b"vision", "a directory's xattr")
        dump = sh("getfattr", "-d", "xattr.dat")
        expect('user.dataset="imagenet-v2"' in dump, f"getfattr -d: {dump[:300]!r}")
        names = sorted(os.listxattr("xattr.dat"))
        expect(names == ["user.blob", "user.dataset"], f"listxattr {names}")
        sh("setfattr", "-x", "user.dataset", "xattr.dat")
        drop_caches()
        gone = subprocess.run(
            ["getfattr", "-n", "user.dataset", "xattr.dat"], capture_output=True, text=True
        )
        expect(
            gone.returncode != 0 and "No such attribute" in gone.stderr,
            f"after setfattr -x: {gone.returncode} {gone.stderr.strip()}",
        )
        expect(os.listxattr("xattr.dat") == ["user.blob"], f"after -x: {os.listxattr('xattr.dat')}")
    return f"setfattr/getfattr -n/-d/-x, 4000-byte and directory values ({sent.expect()})"


def tree_digest(top: str) -> dict[str, tuple[int, int, str]]:
    """Every file under ``top``: relative path -> (size, link count, sha256)."""
    found = {}
    for folder, _dirs, names in os.walk(top):
        for name in names:
            path = os.path.join(folder, name)
            st = os.stat(path)
            found[os.path.relpath(path, top)] = (st.st_size, st.st_nlink, sha256(path))
    return found


def check_snapshot_read(_mountpoint: str, ns_folder: str) -> str:
    files = {
        "dataset/a.bin": random.randbytes(300_000),
        "dataset/sub/b.bin": random.randbytes(1 << 20),
        "dataset/c.txt": b"version 1\n",
        "dataset/d.bin": random.randbytes(200_000),
        "dataset/e.bin": random.randbytes(100_000),
    }
    os.makedirs("dataset/sub")
    for path, data in files.items():
        write_synced(path, data)
    os.link("dataset/e.bin", "dataset/sub/e-link")
    answer = vmchannel_request(f"snapshot-create {ns_folder}/dataset s1")
    expect(answer.startswith("snapshot s1"), f"host: {answer}")
    view = "dataset/.snapshots/s1"
    drop_caches()
    frozen = tree_digest(view)
    expect(len(frozen) == 6 and frozen["e.bin"][1] == 2, f"the view at first: {frozen}")
    # the live tree moves on through this client: overwrite, unlink, create, rename out of a
    # folder, truncate, a hard link made and one removed; the snapshot keeps what it held
    write_synced("dataset/c.txt", b"version 2\n")
    os.unlink("dataset/a.bin")
    write_synced("dataset/new.bin", b"after the snapshot")
    os.rename("dataset/sub/b.bin", "dataset/b-moved.bin")
    os.truncate("dataset/d.bin", 10)
    os.link("dataset/d.bin", "dataset/sub/d-link")
    os.unlink("dataset/sub/e-link")
    drop_caches()
    live = tree_digest("dataset")
    expect(
        live["d.bin"][:2] == (10, 2) and live["e.bin"][1] == 1 and "a.bin" not in live,
        f"the live tree after the changes: {live}",
    )
    expect(".snapshots" not in os.listdir("dataset"), "DIR lists .snapshots")
    listed = sorted(os.listdir(view))
    expect(listed == ["a.bin", "c.txt", "d.bin", "e.bin", "sub"], f"view: {listed}")
    after = tree_digest(view)
    moved = sorted(k for k in frozen.keys() | after.keys() if frozen.get(k) != after.get(k))
    expect(not moved, f"the view changed (size, links, sha256) at {moved}")
    for path, data in files.items():
        inside = os.path.join(view, os.path.relpath(path, "dataset"))
        expect(read_file(inside) == data, f"{inside} does not hold the bytes of the snapshot")
    expect(read_file("dataset/c.txt") == b"version 2\n", "the live file")
    refused = []
    attempts = {
        "open for write": lambda: os.close(os.open(f"{view}/c.txt", os.O_WRONLY)),
        "create": lambda: write_file(f"{view}/made.bin", b"x"),
        "unlink": lambda: os.unlink(f"{view}/a.bin"),
        "mkdir": lambda: os.mkdir(f"{view}/newdir"),
        "rename": lambda: os.rename(f"{view}/c.txt", f"{view}/d.txt"),
        "chmod": lambda: os.chmod(f"{view}/c.txt", 0o600),
        "truncate": lambda: os.truncate(f"{view}/sub/b.bin", 0),
    }
    for what, attempt in attempts.items():
        try:
            attempt()
            refused.append(f"{what}: allowed")
        except OSError as exc:
            if exc.errno != errno.EROFS:
                refused.append(f"{what}: {errno.errorcode.get(exc.errno, exc.errno)}")
    expect(not refused, f"changes in the snapshot view not refused with EROFS: {refused}")
    expect(read_file(f"{view}/sub/b.bin") == files["dataset/sub/b.bin"], "after the attempts")
    return (
        f"host {answer}; 6 names of .snapshots/s1 unchanged (size, links, sha256) through 7 "
        f"changes of the live tree; {len(attempts)} changes in the view EROFS"
    )


def check_snapshot_clone(_mountpoint: str, ns_folder: str) -> str:
    """A dataset clone (made by the host's `shingle dataset clone`) written through this client,
    its origin snapshot then deleted and reclaimed, the clone read back (sha256)."""
    files = {
        "big.bin": random.randbytes(2 << 20),
        "small.txt": b"origin\n",
        "sub/c.bin": random.randbytes(50_000),
    }
    os.makedirs("origin/sub")
    for path, data in files.items():
        write_synced(f"origin/{path}", data)
    answer = vmchannel_request(f"snapshot-create {ns_folder}/origin o1")
    expect(answer.startswith("snapshot o1"), f"host: {answer}")
    answer = vmchannel_request(f"dataset-clone {ns_folder}/origin/.snapshots/o1 {ns_folder}/forked")
    expect("cloned" in answer, f"host: {answer}")
    drop_caches()
    origin = tree_digest("origin")
    expect(tree_digest("forked") == origin, f"the clone {tree_digest('forked')} vs {origin}")
    # written here: part of the big file overwritten, a file appended to, one made, one renamed
    big = bytearray(files["big.bin"])
    patch = random.randbytes(4096)
    big[1 << 20 : (1 << 20) + 4096] = patch
    with open("forked/big.bin", "r+b") as f:
        f.seek(1 << 20)
        f.write(patch)
        f.flush()
        os.fsync(f.fileno())
    with open("forked/small.txt", "ab") as f:
        f.write(b"forked\n")
        f.flush()
        os.fsync(f.fileno())
    made = random.randbytes(300_000)
    write_synced("forked/sub/new.bin", made)
    os.rename("forked/sub/c.bin", "forked/c-moved.bin")
    want = {
        "big.bin": hashlib.sha256(big).hexdigest(),
        "small.txt": hashlib.sha256(b"origin\nforked\n").hexdigest(),
        "sub/new.bin": hashlib.sha256(made).hexdigest(),
        "c-moved.bin": hashlib.sha256(files["sub/c.bin"]).hexdigest(),
    }
    drop_caches()
    expect(tree_digest("origin") == origin, "writing the clone changed its origin")
    expect(tree_digest("origin/.snapshots/o1") == origin, "writing the clone changed the snapshot")
    answer = vmchannel_request(f"snapshot-delete {ns_folder}/origin o1")
    expect("reclaimed" in answer, f"host: {answer}")
    drop_caches()
    expect(not os.path.exists("origin/.snapshots/o1"), "the deleted snapshot still shows")
    got = {path: digest for path, (_, _, digest) in tree_digest("forked").items()}
    expect(got == want, f"the clone after its origin was reclaimed: {got} vs {want}")
    return f"clone written (4 changes); origin deleted and reclaimed; 4 sha256 equal ({answer})"


def run_v42(mountpoint: str, folder: str) -> None:
    """In a child (the parent bounds its time): the V42_CHECKS in ``folder`` on ``mountpoint``."""
    label = os.path.basename(mountpoint)
    ns_folder = "/" + os.path.relpath(folder, mountpoint)  # the export is the namespace's root
    os.chdir(folder)
    for check in V42_CHECKS:
        work = globals()["check_" + check.replace("-", "_")]
        run_check(f"{label}/{check}", lambda work=work: work(mountpoint, ns_folder))


def run_worker(folder: str, label: str, skip_locks: str = "") -> None:
    os.makedirs(folder, exist_ok=True)
    os.chdir(folder)
    manifest: list[str] = []
    for check in USER_CHECKS:
        name = f"{label}/{check}"
        if skip_locks and takes_locks(check):
            report(name, None, skip_locks)
            continue
        started = time.monotonic()
        try:
            details = globals()["check_" + check.replace("-", "_")](manifest)
            report(name, True, f"{details} ({time.monotonic() - started:.1f} s)")
        except CheckFailed as exc:
            report(name, False, str(exc))
        except Exception:  # noqa: BLE001 - any error is this check's failure, the next ones still run
            report(name, False, traceback.format_exc(limit=3))
    with open("manifest.sha256", "w") as f:
        f.writelines(f"{sha256(path)}  {path}\n" for path in manifest if os.path.exists(path))


# -- as root: mounts, workers, version-wide checks ------------------------------------------
def vmchannel_request(text: str) -> str:
    """Ask the host to do something (e.g. restart the server); returns its answer."""
    with open("/dev/ttyS1", "wb", buffering=0) as tty:
        tty.write(f"{REQUEST} {text}\n".encode())
    with open("/dev/ttyS1", "rb", buffering=0) as tty:
        line = b""
        while True:
            ch = tty.read(1)
            if ch in (b"\n", b"\r"):
                if line.startswith(REPLY.encode()):
                    return line[len(REPLY) :].decode().strip()
                line = b""
            else:
                line += ch


def mount(
    options: str, port: int, target: str, server: str = SERVER
) -> subprocess.CompletedProcess:
    """``server``: the address the guest mounts (another than SERVER reaches the host through
    a guestfwd of vm.run_vm)."""
    os.makedirs(target, exist_ok=True)
    if not re.search(r"(^|,)port=", options):
        options += f",port={port}"
    return subprocess.run(
        [
            "timeout",
            "120",
            "mount",
            "-t",
            "nfs",
            "-o",
            options,
            f"{server}:/export",
            target,
        ],
        capture_output=True,
        text=True,
    )


def run_check(name: str, work) -> None:
    started = time.monotonic()
    try:
        report(name, True, f"{work()} ({time.monotonic() - started:.1f} s)")
    except CheckFailed as exc:
        report(name, False, str(exc))
    except Exception:  # noqa: BLE001 - reported as this check's failure
        report(name, False, traceback.format_exc(limit=3))


def run_lock_check(version: dict, check: str, work) -> None:
    name = f"{version['label']}/{check}"
    if version.get("skip_locks"):
        report(name, None, version["skip_locks"])
    else:
        run_check(name, work)


def run_bounded(cmd: list[str], timeout: float, expected: list[str]) -> None:
    """Run a child that reports checks, forward its reports, and report every expected check
    it did not reach. A child stuck in an uninterruptible NFS wait cannot be killed: it is
    left behind rather than waited for."""
    proc, out_path = start_bounded(cmd)
    finish_bounded(proc, out_path, timeout, expected)


def start_bounded(cmd: list[str], stdin=None) -> tuple[subprocess.Popen, str]:
    """run_bounded's child started (with a text pipe on its stdin if ``stdin`` is PIPE):
    the process and the file its output goes to."""
    out_path = f"/tmp/child-{time.monotonic_ns()}.out"
    with open(out_path, "w") as out:
        proc = subprocess.Popen(
            cmd, stdin=stdin, stdout=out, stderr=subprocess.STDOUT, cwd="/", text=True
        )
    return proc, out_path


def tell_go(proc: subprocess.Popen) -> None:
    """The line a child started early waits for (run_docs, run_doc_python)."""
    try:
        proc.stdin.write("go\n")
        proc.stdin.close()
    except OSError:  # it is gone: finish_bounded reports its checks as not reached
        pass


def finish_bounded(
    proc: subprocess.Popen, out_path: str, timeout: float, expected: list[str]
) -> None:
    """run_bounded's wait (``timeout`` from now), reports and reports of checks not reached."""
    try:
        status = proc.wait(timeout)
        why = f"exited with status {status}"
    except subprocess.TimeoutExpired:
        proc.kill()
        why = f"still running after {timeout:.0f} s (a hung NFS call?)"
    seen, other = set(), []
    with open(out_path) as out:
        for line in out:
            if line.startswith(CHECK_MARKER):
                print(line.rstrip("\n"), flush=True)
                seen.add(line.split()[2])
            else:
                other.append(line)
    tail = "".join(other[-15:])
    for name in expected:
        if name not in seen:
            report(name, False, f"not reached: the child {why}; its output: {tail}")


def run_workers(plan: dict, version: dict, mountpoint: str) -> None:
    label = version["label"]
    for uid in plan["uids"]:
        who = user_label(uid)
        folder = os.path.join(mountpoint, f"{label}-{who}")
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", folder, f"{label}/{who}"]
        cmd += [version.get("skip_locks", "")]
        if uid != 0:
            cmd = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *cmd]
        run_bounded(
            cmd, plan["worker_timeout"], [f"{label}/{who}/{check}" for check in USER_CHECKS]
        )


def dmesg_lines() -> list[str]:
    return subprocess.run(["dmesg"], capture_output=True, text=True).stdout.splitlines()


def nfs_errors(lines: list[str]) -> list[str]:
    words = ("nfs", "rpc", "lockd", "sunrpc")
    bad = (
        "error",
        "fail",
        "not responding",
        "bad",
        "warn",
        "unhandled",
        "invalid",
        "bug",
        "oops",
        "call trace",
        "lost",
    )
    return [
        line
        for line in lines
        if any(w in line.lower() for w in words) and any(b in line.lower() for b in bad)
    ]


def nfs_connections(port: int) -> int:
    # /proc/net/tcp: remote address 10.0.2.2 is 0202000A in host-order hex; state 01 = ESTABLISHED
    want = f"0202000A:{port:04X}"
    with open("/proc/net/tcp") as f:
        return sum(
            1 for line in f.readlines()[1:] if line.split()[2] == want and line.split()[3] == "01"
        )


LOCK_DAEMONS: list[str] = []  # what start_lock_daemons started, once per boot


def start_lock_daemons() -> str:
    """rpcbind and rpc.statd, which a locking NFSv3 mount needs: mount.nfs refuses one
    without statd, the kernel's lockd registers with the local rpcbind and asks statd to
    monitor the server. --no-notify: this guest has no previous boot to tell servers of."""
    if not LOCK_DAEMONS:
        os.makedirs("/run/rpcbind", exist_ok=True)  # /run is a fresh tmpfs
        shutil.chown("/run/rpcbind", "_rpc")  # Debian's rpcbind runs as _rpc
        sh("rpcbind", timeout=60)
        sh("rpc.statd", "--no-notify", timeout=60)
        LOCK_DAEMONS.append("rpcbind, rpc.statd --no-notify")
    services = sh("rpcinfo", "-p", "127.0.0.1", timeout=60)
    expect(" status" in services, f"rpc.statd is not registered: {services}")
    return f"{LOCK_DAEMONS[0]} running"


def run_version(plan: dict, version: dict) -> None:
    label, port = version["label"], plan["port"]
    mountpoint = f"/mnt/{label}"
    dmesg_before = len(dmesg_lines())
    lock_daemons = ""
    try:
        if version.get("nlm") and not version.get("skip_locks"):
            lock_daemons = f"; {start_lock_daemons()}"
        mounted = mount(version["options"], port, mountpoint)
    except CheckFailed as exc:
        mounted = subprocess.CompletedProcess([], 1, "", f"locking daemons: {exc}")
    if mounted.returncode != 0:
        why = (
            f"mount -o {version['options']} failed ({mounted.returncode}): {mounted.stderr.strip()}"
        )
        report(
            f"{label}/mount",
            False,
            why + " | dmesg: " + " | ".join(dmesg_lines()[dmesg_before:][-5:]),
        )
        for name in planned_checks(
            {**plan, "versions": [version], "restart_version": None, "docs": None}
        )[1:]:
            report(name, False, "not run: the mount failed")
        return
    report(
        f"{label}/mount",
        True,
        subprocess.run(["grep", mountpoint, "/proc/mounts"], capture_output=True, text=True).stdout
        + lock_daemons,
    )
    run_workers(plan, version, mountpoint)

    def reread() -> str:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        checked = 0
        for uid in plan["uids"]:
            folder = os.path.join(mountpoint, f"{label}-{user_label(uid)}")
            out = subprocess.run(
                ["sha256sum", "--quiet", "-c", "manifest.sha256"],
                cwd=folder,
                capture_output=True,
                text=True,
            )
            expect(out.returncode == 0, f"{folder}: {out.stdout[-800:]} {out.stderr[-800:]}")
            with open(os.path.join(folder, "manifest.sha256")) as f:
                checked += len(f.readlines())
        expect(checked > 0, "nothing to check: the workers wrote no manifest")
        return f"{checked} files read back from the server after drop_caches"

    run_check(f"{label}/reread-after-drop-caches", reread)
    root_folder = os.path.join(mountpoint, f"{label}-root")
    if version.get("v42"):
        run_bounded(
            [sys.executable, os.path.abspath(__file__), "--v42", mountpoint, root_folder],
            plan["worker_timeout"],
            [f"{label}/{check}" for check in V42_CHECKS],
        )
    run_lock_check(version, "lock-wait", lambda: check_lock_wait(root_folder))
    if version.get("lock_peer"):

        def lock_vs_peer() -> str:
            peer = next(v for v in plan["versions"] if v["label"] == version["lock_peer"])
            target = f"/mnt/{label}-{peer['label']}"
            out = mount(peer["options"], port, target)
            expect(out.returncode == 0, f"mount {peer['options']}: {out.stderr.strip()}")
            try:
                peer_folder = os.path.join(target, f"{label}-root")
                return check_lock_vs_peer(root_folder, peer_folder, label, peer["label"])
            finally:
                subprocess.run(["timeout", "120", "umount", target], capture_output=True)

        run_lock_check(version, f"lock-vs-{version['lock_peer']}", lock_vs_peer)

    def umount() -> str:
        sh("timeout", "120", "umount", mountpoint)
        return "umount returned 0"

    run_check(f"{label}/umount", umount)

    def nconnect() -> str:
        target = f"/mnt/{label}-nconnect"
        out = mount(version["options"] + ",nconnect=4", port, target)
        expect(out.returncode == 0, f"mount nconnect=4: {out.stderr.strip()}")
        try:
            data = random.randbytes(4 << 20)
            path = os.path.join(target, f"{label}-root", "nconnect.dat")
            with open(path, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
            expect(sha256(path) == hashlib.sha256(data).hexdigest(), "4 MiB read back differs")
            names = len(os.listdir(os.path.join(target, f"{label}-root", "tree")))
            connections = nfs_connections(port)
            expect(connections == 4, f"{connections} TCP connections to the server, expected 4")
        finally:
            subprocess.run(["timeout", "120", "umount", target], capture_output=True)
        return f"4 TCP connections; 4 MiB written, read back after drop_caches; tree lists {names}"

    run_check(f"{label}/nconnect-4", nconnect)

    def dmesg_clean() -> str:
        errors = nfs_errors(dmesg_lines()[dmesg_before:])
        expect(not errors, "\n".join(errors[-10:]))
        return "no NFS/RPC errors in dmesg"

    run_check(f"{label}/dmesg-clean", dmesg_clean)


def restart_scenario(folder: str, label: str) -> None:
    """In a child process (the parent bounds its time): state that must survive a server
    restart, the restart itself (asked of the host), then the client carrying on."""
    os.makedirs(folder, exist_ok=True)
    names = [f"{label}/{c}" for c in RESTART_CHECKS]
    first, second = random.randbytes(1 << 20), random.randbytes(1 << 20)
    path = os.path.join(folder, "across.dat")
    lock_path = os.path.join(folder, "held.lock")
    write_file(lock_path, b"lock")
    lock_fd = os.open(lock_path, os.O_RDWR)
    fcntl.lockf(lock_fd, fcntl.LOCK_EX)
    f = open(path, "wb")
    f.write(first)
    f.flush()
    os.fsync(f.fileno())
    answer = vmchannel_request("restart-server")

    def io_continues() -> str:
        expect(answer.startswith("restarted"), f"host: {answer}")
        started = time.monotonic()
        f.write(second)
        f.flush()
        os.fsync(f.fileno())
        f.close()
        with open("/proc/sys/vm/drop_caches", "w") as dc:
            dc.write("3\n")
        expect(
            sha256(path) == hashlib.sha256(first + second).hexdigest(), "file differs after restart"
        )
        return (
            f"host {answer}; the open file took 1 MiB more {time.monotonic() - started:.1f} s later"
        )

    run_check(names[0], io_continues)

    def lock_kept() -> str:
        other = sh(sys.executable, "-c", LOCKER, "lockf", lock_path).strip()
        expect(other == "busy", f"another process got the lock held across the restart: {other}")
        fcntl.lockf(lock_fd, fcntl.LOCK_UN)
        os.close(lock_fd)
        other = sh(sys.executable, "-c", LOCKER, "lockf", lock_path).strip()
        expect(other == "got", f"after unlock: {other}")
        return "the lock held across the restart still excludes another process"

    run_check(names[1], lock_kept)

    def new_files() -> str:
        for i in range(20):
            write_file(os.path.join(folder, f"after-{i}"), b"x" * i)
        expect(len([n for n in os.listdir(folder) if n.startswith("after-")]) == 20, "listing")
        return "20 new files after the restart"

    run_check(names[2], new_files)


def run_restart(plan: dict, version: dict) -> None:
    """The server restarts under a mounted client, which carries on: an open file keeps
    being written, a held lock still holds, new files can be made."""
    label = version["label"]
    mountpoint = f"/mnt/{label}-restart"
    names = [f"{label}/{c}" for c in RESTART_CHECKS[:-1]]
    dmesg_before = len(dmesg_lines())
    out = mount(version["options"], plan["port"], mountpoint)
    if out.returncode != 0:
        for check in RESTART_CHECKS:
            report(f"{label}/{check}", False, f"mount failed: {out.stderr.strip()}")
        return
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--restart",
        os.path.join(mountpoint, f"{label}-restart"),
        label,
    ]
    run_bounded(cmd, plan["restart_timeout"], names)
    errors = nfs_errors(dmesg_lines()[dmesg_before:])
    report(
        f"{label}/restart/dmesg-clean",
        not errors,
        " | ".join(errors[-8:]) or "no NFS/RPC errors in dmesg",
    )
    subprocess.run(["timeout", "60", "umount", "-f", "-l", mountpoint], capture_output=True)


# -- docs/clients.md's examples (runs=vm), in a child, as root --------------------------------
DOC_MOUNT = re.compile(r"^mount -t nfs -o (?P<options>\S+) (?P<source>\S+) (?P<target>\S+)$", re.M)
# what /proc/mounts shows for a mount option that it does not show as given
SHOWN_AS = {"actimeo": "acregmin={0},acregmax={0},acdirmin={0},acdirmax={0}"}


def run_doc_mount(code: str, mounted: list[str]) -> str:
    """A shell example that mounts: it runs, then /proc/mounts must show each option it gave."""
    sh("sh", "-e", "-c", code, timeout=180)
    seen = []
    for line in DOC_MOUNT.finditer(code):
        target = line["target"]
        mounted.append(target)
        with open("/proc/mounts") as f:
            entry = next((e.split() for e in f if e.split()[1] == target), None)
        expect(entry is not None, f"{target} is not in /proc/mounts")
        shown = set(entry[3].split(","))
        for option in line["options"].split(","):
            key, _, value = option.partition("=")
            want = SHOWN_AS[key].format(value) if key in SHOWN_AS else option
            expect(set(want.split(",")) <= shown, f"{target}: {want} not in {entry[3]}")
        seen.append(f"{line['source']} on {target} ({entry[3][:120]})")
    expect(bool(seen), "the example mounts nothing")
    return "; ".join(seen)


IMPORTED = re.compile(r"^(?:import|from)\s+([\w.]+)", re.M)


def run_doc_python(blocks: list[dict], warm_imports: tuple[str, ...] = ()) -> None:
    """Run by the project's venv Python (docs["python"]): each example as a script of its own
    (``runpy.run_path`` as ``__main__``, from a file that DataLoader workers could import) in
    this one process, so torch is imported once (minutes under TCG), not once per example.
    The process starts with the VM run (run_docs): it imports what the examples import while
    the other checks run (and ``warm_imports``, what their first calls import), then waits for
    a line on stdin before it runs them. An import that fails here fails again, and is
    reported, in its example."""
    import contextlib
    import importlib
    import io
    import runpy

    imports = [n for block in blocks for n in IMPORTED.findall(block["code"])]
    for name in dict.fromkeys([*imports, *warm_imports]):
        with contextlib.suppress(Exception):  # the example's own import reports it
            importlib.import_module(name)
    sys.stdin.readline()
    for block in blocks:
        path = f"/tmp/doc-{block['name']}.py"
        with open(path, "w") as f:
            f.write(block["code"])

        def work(path=path) -> str:
            out = io.StringIO()
            try:
                with contextlib.redirect_stdout(out):
                    runpy.run_path(path, run_name="__main__")
            except Exception:  # noqa: BLE001 - the example's own frames say what failed
                raise CheckFailed(traceback.format_exc(limit=-4)) from None
            finally:
                printed = out.getvalue().strip().splitlines()
            expect(bool(printed), "the example printed nothing")
            return printed[-1]

        run_check(f"docs/{block['name']}", work)


def run_docs(docs_path: str) -> None:
    """Started with the VM run (main): starts a process per run of consecutive Python
    examples, which imports what they import meanwhile; waits for a line on stdin, then runs
    the examples in order, each Python group told to go on its turn."""
    with open(docs_path) as f:
        docs = json.load(f)
    if not os.path.ismount("/dev/shm"):  # multiprocessing's locks (DataLoader workers) need it
        os.makedirs("/dev/shm", exist_ok=True)
        sh("mount", "-t", "tmpfs", "-o", "mode=1777", "tmpfs", "/dev/shm")
    steps: list = []  # a shell example's block, or a started Python group
    for block in docs["blocks"]:
        if block["lang"] != "python":
            steps.append(block)
        elif steps and isinstance(steps[-1], list):
            steps[-1].append(block)
        else:
            steps.append([block])
    for i, step in enumerate(steps):
        if isinstance(step, list):
            group = f"/tmp/docs-{step[0]['name']}.json"
            with open(group, "w") as f:
                json.dump({"blocks": step, "warm_imports": docs.get("warm_imports", [])}, f)
            cmd = [docs["python"], os.path.abspath(__file__), "--doc-python", group]
            steps[i] = (start_bounded(cmd, stdin=subprocess.PIPE), step)
    sys.stdin.readline()
    mounted: list[str] = []
    try:
        for step in steps:
            if isinstance(step, tuple):
                (proc, out_path), blocks = step
                tell_go(proc)
                finish_bounded(
                    proc, out_path, docs["timeout"], [f"docs/{b['name']}" for b in blocks]
                )
            else:
                code = step["code"]
                run_check(f"docs/{step['name']}", lambda code=code: run_doc_mount(code, mounted))
    finally:
        for target in reversed(mounted):
            subprocess.run(["timeout", "120", "umount", target], capture_output=True)


def check_squashed_own_files(mountpoint: str, label: str) -> str:
    """Root, squashed to nobody, makes, rewrites and renames its own files in the sticky
    world-writable export root: fs.protected_regular lets root's open(O_CREAT) of an existing
    file through only because the file's owner (nobody) is the folder's."""
    with open("/proc/sys/fs/protected_regular") as f:
        kept = f.read()
    with open("/proc/sys/fs/protected_regular", "w") as f:
        f.write("1\n")  # systemd's default (the kernel's is 0)
    try:
        return squashed_own_files(mountpoint, label)
    finally:  # the main run's later checks as they were
        with open("/proc/sys/fs/protected_regular", "w") as f:
            f.write(kept)


def squashed_own_files(mountpoint: str, label: str) -> str:
    own = os.path.join(mountpoint, f"root-{label}.txt")
    sh("sh", "-c", f"echo first > {own}")
    sh("sh", "-c", f"echo x > {own}")  # open(O_CREAT|O_TRUNC) of an existing file
    with open(own, "a") as f:  # O_CREAT too
        f.write("y\n")
    expect(read_file(own) == b"x\ny\n", f"{own} reads {read_file(own)!r}")
    renamed = own + ".renamed"
    os.rename(own, renamed)
    sh("sh", "-c", f"echo z > {renamed}")
    expect(read_file(renamed) == b"z\n", f"{renamed} reads {read_file(renamed)!r}")
    owner = os.stat(renamed).st_uid
    os.unlink(renamed)
    return f"fs.protected_regular=1: made, rewrote, appended to, renamed, removed (owner {owner})"


def check_squashed_others_kept(mountpoint: str, label: str) -> str:
    """Root, squashed to nobody, neither removes nor renames another user's file in the sticky
    export root, nor chmods the export root (which would drop the sticky bit for everyone)."""
    theirs = os.path.join(mountpoint, f"uid{UNPRIVILEGED}-{label}.txt")
    as_user = ["setpriv", f"--reuid={UNPRIVILEGED}", f"--regid={UNPRIVILEGED}", "--clear-groups"]
    sh(*as_user, "sh", "-c", f"echo theirs > {theirs}")
    mode = os.stat(mountpoint).st_mode & 0o7777
    refused = []
    attempts = {
        "unlink another user's file": lambda: os.unlink(theirs),
        "rename another user's file": lambda: os.rename(theirs, theirs + ".taken"),
        "chmod 0777 the export root": lambda: os.chmod(mountpoint, 0o777),
    }
    for what, attempt in attempts.items():
        try:
            attempt()
        except PermissionError as exc:
            refused.append(f"{what}: {exc.strerror}")
            continue
        raise CheckFailed(f"a squashed root could {what}")
    expect(read_file(theirs) == b"theirs\n", f"{theirs} reads {read_file(theirs)!r}")
    drop_caches()
    after = os.stat(mountpoint).st_mode & 0o7777
    expect(mode == after == 0o1777, f"export root mode {mode:o} -> {after:o}, expected 1777")
    sh(*as_user, "rm", theirs)
    return "; ".join(refused) + f"; export root stays {after:o}"


def run_root_squash(plan: dict, version: dict) -> None:
    label = version["label"]
    mountpoint = f"/mnt/squash-{label}"
    names = [f"{label}/{check}" for check in ROOT_SQUASH_CHECKS]
    mounted = mount(version["options"], plan["root_squash_port"], mountpoint)
    if mounted.returncode != 0:
        for name in names:
            report(name, False, f"mount -o {version['options']} failed: {mounted.stderr.strip()}")
        return
    try:
        run_check(names[0], lambda: check_squashed_own_files(mountpoint, label))
        run_check(names[1], lambda: check_squashed_others_kept(mountpoint, label))
    finally:
        subprocess.run(["timeout", "120", "umount", mountpoint], capture_output=True)


# -- delegations (as root, a mount of their own) ----------------------------------------------
EPOCH_OPS = ("OPEN", "GETATTR", "READ", "CLOSE")  # always shown; others when sent


def read_epoch(mountpoint: str, paths: list[str]) -> dict[str, int]:
    """Open, read and close every file once (a DataLoader's epoch over small shards): the
    operations the mount sent meanwhile."""
    before = op_counts(mountpoint)
    for path in paths:
        with open(path, "rb") as f:
            f.read()
    after = op_counts(mountpoint)
    sent = {op: after.get(op, 0) - before.get(op, 0) for op in after}
    return {op: n for op, n in sent.items() if n or op in EPOCH_OPS}


def check_second_epoch(mountpoint: str, paths: list[str]) -> str:
    """Three epochs with Python's open() (what a DataLoader's dataset does): the second opens
    from the delegations (no OPEN, no READ: the page cache), but Python's fstat of each file
    asks the atime the first epoch's READs made stale (the client invalidates it after every
    READ RPC): one GETATTR per file; the third epoch sends nothing."""
    epochs, seconds = [], []
    for _ in range(3):
        started = time.monotonic()
        epochs.append(read_epoch(mountpoint, paths))
        seconds.append(max(time.monotonic() - started, 1e-6))
    rates = [round(len(paths) / s) for s in seconds]
    calls = [sum(epoch.values()) for epoch in epochs]
    first, second, third = epochs
    # the Linux client returns a delegation it did not use since its last lease renewal (every
    # 2/3 of a lease: nfs_expire_unreferenced_delegations): an epoch 1 longer than that loses
    # its first files' delegations before epoch 2 (DELEGRETURN in epoch 1), as on a loaded host
    took = f"epochs took {[round(s, 1) for s in seconds]} s: {epochs}"
    expect(first["OPEN"] >= len(paths), f"first epoch sent only {first['OPEN']} OPENs: {first}")
    expect(second["OPEN"] * 10 <= first["OPEN"], f"second epoch OPENs; {took}")
    expect(calls[1] * 2 <= calls[0], f"second epoch not cheaper; {took}")
    expect(calls[2] * 10 <= calls[0], f"third epoch still asks the server; {took}")
    # files/s: under TCG a round trip through the VM's network costs milliseconds, so the
    # rate follows the calls (bench/delegations.py reports it)
    return f"{len(paths)} files; calls per epoch {calls}; files/s per epoch {rates}; " + "; ".join(
        f"epoch {i + 1} {epoch}" for i, epoch in enumerate(epochs)
    )


def check_recall_on_write(mountpoint: str, path: str, relpath: str, lease: float) -> str:
    with open(path, "rb") as f:
        old = f.read()
    new = b"written by another client " + os.urandom(8).hex().encode()
    before = op_counts(mountpoint)
    started = time.monotonic()
    answer = vmchannel_request(f"deleg-write {relpath} {new.hex()}")
    took = time.monotonic() - started
    expect(answer.startswith("written"), f"the host's write: {answer}")
    with open(path, "rb") as f:
        seen = f.read()
    returned = op_counts(mountpoint).get("DELEGRETURN", 0) - before.get("DELEGRETURN", 0)
    expect(seen == new, f"the guest reads {seen[:60]!r} (was {old[:60]!r}), not the new bytes")
    expect(returned >= 1, f"the guest sent no DELEGRETURN ({returned})")
    # a guest that did not answer the recall would be revoked after a lease: far slower
    expect(took < lease / 2, f"the write waited {took:.1f} s (lease {lease} s): no recall?")
    return f"{answer}; the guest returned the delegation ({returned} DELEGRETURN) in {took:.1f} s"


def check_write_cb_getattr(mountpoint: str, folder: str) -> str:
    rel = f"{folder}/checkpoint.bin"
    path = os.path.join(mountpoint, rel)
    data = os.urandom(3 * 4096 + 17)
    with open(path, "wb") as f:
        f.write(data)
        f.flush()  # into the page cache: the client sends no WRITE before the close
        before = op_counts(mountpoint)
        answer = vmchannel_request(f"deleg-stat {rel}")
        writes = op_counts(mountpoint).get("WRITE", 0) - before.get("WRITE", 0)
        expect(
            answer == f"size {len(data)}",
            f"the host saw {answer!r} of {len(data)} bytes in the guest's cache "
            f"({writes} WRITE sent meanwhile): no CB_GETATTR?",
        )
    answer2 = vmchannel_request(f"deleg-read {rel}")
    want = f"sha256 {hashlib.sha256(data).hexdigest()}"
    expect(answer2.startswith(want), f"the host read {answer2!r} after the close, not {want}")
    return f"host stat while the bytes were cached: {answer} ({writes} WRITE meanwhile); {answer2}"


def set_lockd_port(port: int) -> None:
    """lockd's TCP port (fs.nfs.nlm_tcpport), before the first locking NFSv3 mount starts
    lockd: the host forwards that port here, so that the server's NLM_GRANTED reaches it."""
    with open("/proc/sys/fs/nfs/nlm_tcpport", "w") as f:
        f.write(str(port))


def set_callback_port(port: int) -> None:
    """The port of the NFSv4.0 callback service (nfs.callback_tcpport), before the first
    NFSv4.0 mount starts it: the host reaches it through a qemu forward."""
    with open("/sys/module/nfs/parameters/callback_tcpport", "w") as f:
        f.write(str(port))


def run_delegations(plan: dict, spec: dict) -> None:
    label = spec["label"]
    mountpoint = f"/mnt/deleg-{label}"
    names = [f"{label}/{check}" for check in DELEGATION_CHECKS]
    mounted = mount(spec["options"], plan["port"], mountpoint)
    if mounted.returncode != 0:
        for name in names:
            report(name, False, f"mount -o {spec['options']} failed: {mounted.stderr.strip()}")
        return
    folder = f"deleg-shards-{label}"
    rels = [f"{folder}/shard-{i:04d}.bin" for i in range(spec["files"])]
    try:
        os.makedirs(os.path.join(mountpoint, folder), exist_ok=True)
        for rel in rels:
            with open(os.path.join(mountpoint, rel), "wb") as f:
                f.write(os.urandom(2048))
        # a fresh client state: no open left of the writes
        sh("timeout", "120", "umount", mountpoint)
        mounted = mount(spec["options"], plan["port"], mountpoint)
        expect(mounted.returncode == 0, f"mount again: {mounted.stderr.strip()}")
        paths = [os.path.join(mountpoint, rel) for rel in rels]
        run_check(names[0], lambda: check_second_epoch(mountpoint, paths))
        run_check(
            names[1],
            lambda: check_recall_on_write(mountpoint, paths[0], rels[0], spec["lease_seconds"]),
        )
        if spec.get("write_check"):
            run_check(
                f"{label}/{WRITE_DELEGATION_CHECK}",
                lambda: check_write_cb_getattr(mountpoint, folder),
            )
    except CheckFailed as exc:
        for name in names:
            report(name, False, f"not run: {exc}")
    finally:
        subprocess.run(["timeout", "120", "umount", mountpoint], capture_output=True)


# -- Kerberos (a VM of its own: rpc.gssd, a keytab and a KDC on the host) ----------------------
KRB5_USER_CHECKS = ("rw", "no-ticket", "root-is-squashed")
KRB5_REFUSED = ("sys-refused-v4.1", "sys-refused-v3")


def krb5_check_names(spec: dict) -> list[str]:
    names = []
    for flavor in spec["flavors"]:
        for version in spec["versions"]:
            names += [f"krb5/{flavor}-{version['label']}/{c}" for c in KRB5_USER_CHECKS]
    return names + [f"krb5/{c}" for c in KRB5_REFUSED]


def krb5_setup(spec: dict) -> subprocess.Popen:
    """/etc/hosts, krb5.conf and krb5.keytab for this guest; rpc.gssd running; a ticket for the
    user (``spec['uid']``) in the ccache rpc.gssd looks for (/tmp/krb5cc_UID)."""
    hostname = os.uname().nodename
    with open("/etc/hosts", "w") as f:
        f.write(f"127.0.0.1 localhost {hostname}\n{SERVER} {spec['server_name']}\n")
    with open("/etc/krb5.conf", "w") as f:
        f.write(spec["krb5_conf"])
    with open("/etc/idmapd.conf", "w") as f:  # owners travel as user@domain under Kerberos
        f.write(f"[General]\nDomain = {spec['idmap_domain']}\n")
    shutil.copy(spec["keytab"], "/etc/krb5.keytab")
    os.chmod("/etc/krb5.keytab", 0o600)
    os.makedirs("/run/rpc_pipefs", exist_ok=True)
    sh("mount", "-t", "rpc_pipefs", "sunrpc", "/run/rpc_pipefs")
    log = open("/tmp/rpc.gssd.log", "w")
    gssd = subprocess.Popen(
        ["rpc.gssd", "-f", "-v", "-p", "/run/rpc_pipefs", "-k", "/etc/krb5.keytab"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    uid = spec["uid"]
    cache = f"/tmp/krb5cc_{uid}"
    sh("kinit", "-k", "-t", spec["user_keytab"], "-c", f"FILE:{cache}", spec["user_principal"])
    os.chown(cache, uid, uid)
    time.sleep(1)  # rpc.gssd opens the pipes
    return gssd


def krb5_mount(options: str, port: int, server: str, target: str) -> subprocess.CompletedProcess:
    os.makedirs(target, exist_ok=True)
    if not re.search(r"(^|,)port=", options):
        options += f",port={port}"
    return subprocess.run(
        ["timeout", "120", "mount", "-t", "nfs", "-o", options, f"{server}:/export", target],
        capture_output=True,
        text=True,
    )


def as_uid(uid: int, *cmd: str, ok_codes: tuple[int, ...] = (0,)) -> str:
    return sh(
        "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *cmd, ok_codes=ok_codes
    )


def check_krb5_rw(mountpoint: str, uid: int, label: str) -> str:
    """The user with a ticket writes, renames and reads back a file; it is the user's."""
    data = random.randbytes(3 * 1024 * 1024 + 17)
    source = f"/tmp/krb5-{label}.bin"
    with open(source, "wb") as f:
        f.write(data)
    os.chmod(source, 0o644)
    work = os.path.join(mountpoint, f"krb5-{label}.tmp")
    final = os.path.join(mountpoint, f"krb5-{label}.bin")
    as_uid(uid, "cp", source, work)
    seen = sh("stat", "-c", "%u:%g", work).strip()
    domain = subprocess.run(["nfsidmap", "-d"], capture_output=True, text=True).stdout.strip()
    expect(seen == f"{uid}:{uid}", f"{work} is {seen} in the guest (its nfsidmap domain: {domain})")
    as_uid(uid, "mv", work, final)
    drop_caches()
    back = as_uid(uid, "sha256sum", final).split()[0]
    expect(back == hashlib.sha256(data).hexdigest(), f"{final} reads back other bytes")
    # chgrp sends the group as a name (group@domain); ls shows names the server sent
    group = grp.getgrgid(uid).gr_name
    as_uid(uid, "chgrp", group, final)
    drop_caches()
    st = os.stat(final)
    expect((st.st_uid, st.st_gid) == (uid, uid), f"{final} is {st.st_uid}:{st.st_gid}")
    shown = sh("stat", "-c", "%U:%G", final).strip()
    user = pwd.getpwuid(uid).pw_name
    expect(shown == f"{user}:{group}", f"{final} shows {shown}, not {user}:{group}")
    as_uid(uid, "rm", final)
    return f"wrote, renamed, read back {len(data)} bytes, chgrp by name, shown {shown}"


def check_krb5_no_ticket(mountpoint: str, uid: int, v3: bool) -> str:
    """A user without a ticket reads nothing: rpc.gssd has no credential for the uid, so no
    call goes out. The v4.1 client says EACCES; the v3 client, revalidating the mount's root
    with the call refused, says ESTALE (the kernel's mapping, seen against shingle here)."""
    run = subprocess.run(
        ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "ls", mountpoint],
        capture_output=True,
        text=True,
        timeout=120,
    )
    expect(run.returncode != 0, f"uid {uid} without a ticket listed the export: {run.stdout!r}")
    allowed = ("Permission denied", "Stale file handle") if v3 else ("Permission denied",)
    expect(any(e in run.stderr for e in allowed), f"uid {uid}: {run.stderr.strip()}")
    return f"uid {uid} without a ticket: {run.stderr.strip()}"


def check_krb5_root_squashed(mountpoint: str, label: str) -> str:
    """Root on the client speaks with the guest's machine key (rpc.gssd takes nfs/GUEST@REALM
    from the keytab), as do the client's state operations: the server maps no machine
    principal, so on this root-squashed export root writes as the export's anonymous user."""
    path = os.path.join(mountpoint, f"krb5-root-{label}")
    with open(path, "wb") as f:
        f.write(b"written by root with the machine key\n")
    drop_caches()
    owner = os.stat(path).st_uid
    expect(owner == 65534, f"root's file is uid {owner}, not the anonymous 65534")
    os.unlink(path)
    return f"root's new file belongs to uid {owner}; the mount's state ran under the machine key"


def check_sys_refused(options: str, port: int, server: str, target: str) -> str:
    mounted = krb5_mount(options, port, server, target)
    if mounted.returncode == 0:
        listing = subprocess.run(["ls", target], capture_output=True, text=True, timeout=60)
        subprocess.run(["timeout", "60", "umount", target], capture_output=True)
        raise CheckFailed(f"sec=sys mounted the krb5-only export (ls: {listing.returncode})")
    return f"refused: {mounted.stderr.strip()}"


def run_krb5(plan: dict, spec: dict) -> None:
    try:
        gssd = krb5_setup(spec)
    except Exception:  # noqa: BLE001 - every check reports the setup's failure
        for name in krb5_check_names(spec):
            report(name, False, f"Kerberos setup failed: {traceback.format_exc(limit=2)}")
        return
    server, port, uid = spec["server_name"], plan["port"], spec["uid"]
    try:
        for flavor in spec["flavors"]:
            for version in spec["versions"]:
                label = f"{flavor}-{version['label']}"
                names = [f"krb5/{label}/{c}" for c in KRB5_USER_CHECKS]
                target = f"/mnt/{label}"
                options = version["options"].format(port=port) + f",sec={flavor}"
                mounted = krb5_mount(options, port, server, target)
                if mounted.returncode != 0:
                    for name in names:
                        report(name, False, f"mount -o {options}: {mounted.stderr.strip()}")
                    continue
                try:
                    run_check(names[0], lambda t=target, lb=label: check_krb5_rw(t, uid, lb))
                    run_check(
                        names[1],
                        lambda t=target, v3=version["label"] == "v3": check_krb5_no_ticket(
                            t, spec["no_ticket_uid"], v3
                        ),
                    )
                    run_check(names[2], lambda t=target, lb=label: check_krb5_root_squashed(t, lb))
                finally:
                    subprocess.run(["timeout", "120", "umount", target], capture_output=True)
        for name, version in zip(KRB5_REFUSED, spec["versions"], strict=True):
            options = version["options"].format(port=port) + ",sec=sys"
            run_check(
                f"krb5/{name}",
                lambda o=options, n=name: check_sys_refused(o, port, server, f"/mnt/{n}"),
            )
    finally:
        gssd.terminate()
        gssd.wait(30)
        with open("/tmp/rpc.gssd.log") as f:
            tail = f.read()[-3000:]
        print(f"rpc.gssd log tail:\n{tail}", flush=True)


def main(plan: dict) -> int:
    print("@@SHINGLE-VM BEGIN", flush=True)
    print(f"guest: {os.uname().nodename} kernel {os.uname().release}", flush=True)
    docs = None
    if plan.get("docs"):
        # started now: its Python examples' imports (torch: minutes under TCG) go on while the
        # other checks run; it waits for a line on stdin before it runs the examples
        docs_path = "/tmp/docs.json"
        with open(docs_path, "w") as f:
            json.dump(plan["docs"], f)
        docs = start_bounded(
            [sys.executable, os.path.abspath(__file__), "--docs", docs_path],
            stdin=subprocess.PIPE,
        )
    if plan.get("delegations40"):
        set_callback_port(plan["delegations40"]["callback_port"])
    if plan.get("lockd_port"):
        set_lockd_port(plan["lockd_port"])
    for version in plan["versions"]:
        run_version(plan, version)
    if plan.get("root_squash"):
        # the host starts that daemon while the checks above run
        ready = vmchannel_request("root-squash-ready")
        for version in plan["root_squash"]:
            if ready == "ready":
                run_root_squash(plan, version)
            else:
                for check in ROOT_SQUASH_CHECKS:
                    report(f"{version['label']}/{check}", False, f"its daemon: {ready}")
    for key in ("delegations", "delegations40"):
        if plan.get(key):
            run_delegations(plan, plan[key])
    if plan.get("krb5"):
        run_krb5(plan, plan["krb5"])
    if docs is not None:
        proc, out_path = docs
        tell_go(proc)
        finish_bounded(
            proc,
            out_path,
            plan["docs"]["timeout"] + 300,
            [f"docs/{block['name']}" for block in plan["docs"]["blocks"]],
        )
    if plan.get("restart_version"):
        run_restart(
            plan, next(v for v in plan["versions"] if v["label"] == plan["restart_version"])
        )
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "--worker":
        run_worker(*sys.argv[2:5])
    elif sys.argv[1] == "--docs":
        run_docs(sys.argv[2])
    elif sys.argv[1] == "--doc-python":
        with open(sys.argv[2]) as group_file:
            group = json.load(group_file)
        run_doc_python(group["blocks"], tuple(group["warm_imports"]))
    elif sys.argv[1] == "--v42":
        run_v42(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "--restart":
        restart_scenario(sys.argv[2], sys.argv[3])
    else:
        with open(sys.argv[1]) as plan_file:
            sys.exit(main(json.load(plan_file)))
