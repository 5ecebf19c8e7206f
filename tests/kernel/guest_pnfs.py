"""Runs inside the VM (standard library only): the pNFS checks of test_kernel_pnfs.py against
three heads over one catalog: a metadata server and two data servers (docs/pnfs.md).

    python3 guest_pnfs.py PLAN.json

The plan names the heads' ports; the host answers "written-by NAME" (bytes of the file per
head that wrote them, from the catalog), "serving" (the data servers' ports new layouts name,
as the metadata server published them), "kill-ds N" (kill -9 of data server N) and "ds-writes
MODE" (the data servers restarted in that mode), "kill-head" (kill -9 of the `--heads 2`
head serving 127.0.0.1) and "grace" (how that head's grace period went). The last checks mount
the `--heads 2` daemon with NFSv3 through two guest addresses that reach two different heads
(V3_THROUGH_1, V3_THROUGH_0). One marker line per check, as guest_nfs.py prints them; every
write and read runs in a child bounded by STEP_TIMEOUT_S."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time

from guest_nfs import (
    CheckFailed,
    expect,
    mount,
    report,
    run_check,
    sh,
    sha256,
    vmchannel_request,
)

MiB = 1 << 20
CHECKS = (
    "mount-4.1",
    "mount-4.2",
    "striped-4.1",
    "striped-4.2",
    "ds-killed-during-write",
    "non-pnfs-4.0-through-ds",
    "umount",
    "unstable-data-servers",
    "heads-kill-9",
    "heads-v3-nlm",
    "heads-v3-nlm-kill-9",
    "heads-cb-getattr",
    "heads-ipv6",
)
MDS_MNT, MDS42_MNT, DS_MNT = "/mnt/pnfs41", "/mnt/pnfs42", "/mnt/ds40"
UNSTABLE_MNT, HEADS_MNT = "/mnt/pnfs-unstable", "/mnt/heads2"
# NFSv3 through two heads of `--heads 2`: the host relays a connection to V3_THROUGH_1 from its
# 127.0.0.1 and one to V3_THROUGH_0 from 127.0.0.2 (tcp_from.py), which the listener hands to
# head 1 and head 0 (appliance.nfs.handoff.head_for); each forwards the heads' port and 111 (the
# port mapper, where the kernel's lockd asks for NLM)
V3_THROUGH_1, V3_THROUGH_0 = "10.0.2.101", "10.0.2.102"
V3_MNT_1, V3_MNT_0 = "/mnt/heads3-head1", "/mnt/heads3-head0"
V3_OPTIONS = "vers=3,proto=tcp,port={port},mountport={port},mountproto=tcp"
CB_GETATTR_MNT = "/mnt/heads-cb-getattr"
# qemu's user network with IPv6 (vm.run_vm ipv6): fec0::2 is the host's ::1, which the
# listener hands to head 1 (the address's number is odd)
HOST_IPV6, GUEST_IPV6 = "fec0::2", "fec0::15"
V6_MNT_41, V6_MNT_3 = "/mnt/heads-ipv6-41", "/mnt/heads-ipv6-3"
# a process of its own per lock owner (NLM's svid is the pid): it takes and drops a whole-file
# exclusive lock without waiting (F_SETLK) as told on stdin, one line of answer each
LOCKER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
for line in sys.stdin:
    try:
        if line.strip() == "lock":
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        else:
            fcntl.lockf(fd, fcntl.LOCK_UN)
        print("ok", flush=True)
    except OSError as exc:
        print(f"denied {exc.errno}", flush=True)
"""
# one write or read of a check: 75 s at most on a loaded machine (the killed data server's
# fallback); a stuck one fails its check after this, with the client's view of it, instead of
# holding the VM (and CI) until the host's bound
STEP_TIMEOUT_S = 240


def nfs_state() -> str:
    """What the client says of its servers when a step is stuck: the kernel's last NFS lines
    and each mount's transports (sends, receives, pending)."""
    dmesg = subprocess.run(["dmesg"], capture_output=True, text=True).stdout.splitlines()
    lines = [line for line in dmesg if "nfs" in line.lower()][-8:]
    for section in open("/proc/self/mountstats").read().split("device ")[1:]:
        if " nfs4 " in section.split("\n", 1)[0]:
            lines.append(section.split(" with ", 1)[0])
            lines += [line.strip() for line in section.splitlines() if "xprt:" in line]
    return " | ".join(lines)


def start(cmd: list[str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, what: str, timeout: float = STEP_TIMEOUT_S) -> str:
    """``proc``'s output once it is done, within ``timeout``; a child stuck in an NFS wait is
    killed and left behind (never waited for) and the check fails with the client's state."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise CheckFailed(f"{what}: not done after {timeout:.0f} s; {nfs_state()}") from None
    expect(proc.returncode == 0, f"{what}: exit {proc.returncode}: {err.strip()[-1000:]}")
    return out


def step(*cmd: str) -> str:
    return finish(start(list(cmd)), " ".join(cmd))


def file_sha256(path: str) -> str:
    """The file's sha256, read by a child (a read stuck on the mount fails the check)."""
    return step("sha256sum", path).split()[0]


def mountstats(target: str) -> str:
    """This mount's section of /proc/self/mountstats."""
    text = open("/proc/self/mountstats").read()
    for section in text.split("device ")[1:]:
        if f" mounted on {target} " in section:
            return section
    raise CheckFailed(f"{target} not in /proc/self/mountstats")


def op_count(target: str, op: str) -> int:
    """How many ``op`` calls the mount sent to the metadata server (its per-op statistics)."""
    found = re.search(rf"^\s*{op}:\s+(\d+)", mountstats(target), re.M)
    return int(found[1]) if found else 0


def make_source(path: str, size: int) -> str:
    with open(path, "wb") as f:
        for _ in range(size // MiB):
            f.write(os.urandom(MiB))
    return sha256(path)


def drop_caches() -> None:
    step("sync")
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def check_mount(target: str, options: str, port: int) -> str:
    run = mount(options, port, target)
    expect(run.returncode == 0, f"mount -o {options}: {run.stderr.strip()}")
    stats = mountstats(target)
    found = re.search(r"pnfs=([^,\s]+)", stats)  # in the nfsv4: line of the mount's stats
    # the layout driver is chosen at mount from fs_layout_type, before any I/O
    expect(found and found[1] == "LAYOUT_NFSV4_1_FILES", f"pnfs line: {found and found[0]}")
    return f"{options}: pnfs {found[1]}"


def written_by(name: str) -> dict[int, int]:
    """Bytes of the file per head index that wrote them (0: the metadata server), from the
    catalog, by the host."""
    answer = vmchannel_request(f"written-by {name}")
    try:
        return {int(k): v for k, v in json.loads(answer).items()}
    except ValueError:
        raise CheckFailed(f"written-by: {answer}") from None


def await_serving(want: list[int], seconds: float) -> float:
    """Wait until the metadata server's published data servers (the host reads them from the
    catalog) are the ports ``want``; how long it took."""
    started = time.monotonic()
    while True:
        answer = vmchannel_request("serving")
        try:
            serving = json.loads(answer)
        except ValueError:
            raise CheckFailed(f"serving: {answer}") from None
        if serving == want:
            return time.monotonic() - started
        if time.monotonic() - started > seconds:
            raise CheckFailed(
                f"data servers in new layouts {serving} after {seconds:.0f} s, not {want}"
            )
        time.sleep(1)


def mds_sends(target: str) -> int:
    """RPCs sent on the mount's own transports (its "xprt:" lines: the metadata server's
    connections; a data server's are not listed)."""
    total = 0
    for line in mountstats(target).splitlines():
        fields = line.split()
        if fields[:2] == ["xprt:", "tcp"]:
            total += int(fields[7])  # srcport, bind, connects, connect time, idle, sends
    return total


def check_striped(target: str, size: int) -> str:
    source = f"/tmp/striped-{size}"
    digest = make_source(source, size)
    name = f"striped-{os.path.basename(target)}"
    path = f"{target}/{name}"
    # the per-op counts include the calls to data servers: COMMIT and LAYOUTCOMMIT must stay 0
    before = {op: op_count(target, op) for op in ("WRITE", "COMMIT", "LAYOUTCOMMIT")}
    step("dd", f"if={source}", f"of={path}", "bs=1M", "conv=fsync", "status=none")
    sent = {op: op_count(target, op) - n for op, n in before.items()}
    expect(sent["WRITE"] >= size // MiB, f"WRITEs counted {sent}")
    expect(sent["COMMIT"] == sent["LAYOUTCOMMIT"] == 0, f"FILE_SYNC, yet {sent}")
    heads = written_by(name)  # -1: bytes kept inline in the catalog, written by any head
    expect(sum(heads.values()) == size, f"bytes per head {heads}: not the file's {size}")
    expect(heads.get(0, 0) == 0, f"the metadata server wrote {heads.get(0)} bytes of it")
    busy = [index for index, n in heads.items() if index > 0 and n >= MiB]
    expect(len(busy) >= 2, f"bytes per data server {heads}: fewer than two wrote 1 MiB")
    drop_caches()
    sends = mds_sends(target)
    got = file_sha256(path)
    expect(got == digest, f"sha256 after drop_caches {got}, wrote {digest}")
    sends = mds_sends(target) - sends
    # reading through the metadata server would take at least one READ per MiB
    expect(sends < size // MiB // 2, f"{sends} RPCs to the metadata server for the read back")
    return (
        f"{size // MiB} MiB written and read back (sha256 equal after drop_caches); bytes "
        f"written per head (0: the metadata server, -1: inline) {heads}; {sent['WRITE']} "
        f"WRITEs, no COMMIT or LAYOUTCOMMIT; {sends} RPCs to the metadata server while "
        "reading it back"
    )


def check_ds_killed(target: str, size: int, ds_ports: list[int]) -> str:
    """A data server killed (kill -9) while a direct write goes on: the write completes
    through the metadata server and reads back, and once the other heads expired the dead one
    (a lease: 30 s) the metadata server leaves it out of new layouts."""
    source = f"/tmp/fallback-{size}"
    digest = make_source(source, size)
    path = f"{target}/fallback"
    writes_before = op_count(target, "WRITE")
    # O_DIRECT: every MiB goes out as it is written, so the kill lands mid-file
    writer = start(["dd", f"if={source}", f"of={path}", "bs=1M", "oflag=direct", "status=none"])
    deadline = time.monotonic() + STEP_TIMEOUT_S
    while writer.poll() is None and time.monotonic() < deadline:
        if os.path.exists(path) and os.stat(path).st_size >= size // 4:
            break
        time.sleep(0.2)
    at = os.stat(path).st_size if os.path.exists(path) else 0
    answer = vmchannel_request("kill-ds 1")
    expect(answer.startswith("killed"), f"kill-ds: {answer}")
    finish(writer, f"the O_DIRECT dd after the kill at {at // MiB} MiB")
    drop_caches()
    got = file_sha256(path)
    expect(got == digest, f"sha256 after the kill {got}, wrote {digest}")
    mds_writes = op_count(target, "WRITE") - writes_before
    expect(mds_writes > 0, "no WRITE reached the metadata server after the kill")
    heads = written_by("fallback")
    expect(heads.get(0, 0) > 0, f"bytes per head {heads}: none by the metadata server")
    waited = await_serving(ds_ports[:1], 90)
    return (
        f"killed at {at // MiB} of {size // MiB} MiB; the write completed, {mds_writes} WRITEs "
        f"through the metadata server, bytes per head {heads}, sha256 equal; the killed data "
        f"server out of new layouts {waited:.0f} s after that"
    )


def check_non_pnfs(ds_port: int, mds_target: str) -> str:
    run = mount("vers=4.0", ds_port, DS_MNT)
    expect(run.returncode == 0, f"mount vers=4.0 of a data server: {run.stderr.strip()}")
    expect("pnfs=LAYOUT" not in mountstats(DS_MNT), "a layout driver on a mount of a data server")
    name = f"striped-{os.path.basename(mds_target)}"
    got = file_sha256(f"{DS_MNT}/{name}")
    want = file_sha256(f"{mds_target}/{name}")
    expect(got == want, f"the data server reads {got}, the metadata server {want}")
    data = os.urandom(3 * MiB + 17)
    with open(f"{DS_MNT}/through-ds", "wb") as f:
        f.write(data)
        os.fsync(f.fileno())
    with open(f"{mds_target}/through-ds", "rb") as f:
        back = f.read()
    expect(back == data, f"the metadata server reads {len(back)} bytes of {len(data)}")
    return (
        "NFSv4.0 through a data server head: a pNFS-written file reads the same; "
        "its write reads back through the metadata server"
    )


def tune_data_server_timeouts() -> None:
    """A data server killed under qemu's user networking does not always refuse at once: the
    client waits for its RPC to a data server to time out (dataserver_timeo, 60 s by default,
    times dataserver_retrans + 1) before it goes to the metadata server. Shorter here, as an
    admin would set them (modprobe.d) where a hung data server must cost seconds."""
    params = "/sys/module/nfs_layout_nfsv41_files/parameters"
    for name, value in (("dataserver_timeo", "50"), ("dataserver_retrans", "1")):
        with open(f"{params}/{name}", "w") as f:
            f.write(value)


def check_unstable(mds_port: int, size: int, ds_ports: list[int]) -> str:
    """Data servers restarted with [pnfs] data_server_writes = "unstable": they answer the
    layout's WRITEs UNSTABLE, so the client COMMITs to them and sends LAYOUTCOMMIT. The killed
    one is back in new layouts once its head joined again."""
    answer = vmchannel_request("ds-writes unstable")
    expect(answer.startswith("data servers restarted"), f"ds-writes: {answer}")
    await_serving(ds_ports, 60)
    run = mount("vers=4.1", mds_port, UNSTABLE_MNT)
    expect(run.returncode == 0, f"mount: {run.stderr.strip()}")
    try:
        source = f"/tmp/unstable-{size}"
        digest = make_source(source, size)
        before = {op: op_count(UNSTABLE_MNT, op) for op in ("COMMIT", "LAYOUTCOMMIT")}
        path = f"{UNSTABLE_MNT}/unstable"
        step("dd", f"if={source}", f"of={path}", "bs=1M", "conv=fsync", "status=none")
        sent = {op: op_count(UNSTABLE_MNT, op) - n for op, n in before.items()}
        expect(sent["COMMIT"] > 0 and sent["LAYOUTCOMMIT"] > 0, f"sent {sent}")
        heads = written_by("unstable")
        expect(sum(heads.values()) == size, f"bytes per head {heads}: not the file's {size}")
        expect(heads.get(0, 0) == 0, f"the metadata server wrote {heads.get(0)} bytes")
        expect(os.stat(path).st_size == size, f"size {os.stat(path).st_size}")
        drop_caches()
        got = file_sha256(path)
        expect(got == digest, f"sha256 after drop_caches {got}, wrote {digest}")
        return (
            f"{size // MiB} MiB through data servers answering UNSTABLE: {sent}, bytes per "
            f"head {heads}, sha256 equal"
        )
    finally:
        subprocess.run(["timeout", "120", "umount", UNSTABLE_MNT], capture_output=True)


def in_thread(work, what: str, timeout: float = STEP_TIMEOUT_S):
    """``work()`` in a thread, its result; one stuck in an NFS wait fails the check (the thread
    is left behind)."""
    result: list = []
    errors: list = []

    def run() -> None:
        try:
            result.append(work())
        except Exception as exc:  # noqa: BLE001 - reported as the check's failure
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise CheckFailed(f"{what}: not done after {timeout:.0f} s; {nfs_state()}")
    if errors:
        raise CheckFailed(f"{what}: {errors[0]!r}")
    return result[0]


def check_heads_kill(port: int) -> str:
    """`shingle serve --heads 2`, a plain NFSv4.1 mount (issue 32 item 3): a file written and
    synced, held open with a byte-range lock; the host kills -9 the head serving this client
    and the listener starts it again; through the same open file and lock the write goes on
    (the client reclaims both within the grace period) and nothing acknowledged is lost."""
    run = mount("vers=4.1", port, HEADS_MNT)
    expect(run.returncode == 0, f"mount: {run.stderr.strip()}")
    path = f"{HEADS_MNT}/kept"
    first, second = os.urandom(2 * MiB), os.urandom(MiB)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        in_thread(lambda: (os.write(fd, first), os.fsync(fd)), "the first write")
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
        answer = vmchannel_request("kill-head")
        expect(answer.startswith("killed"), f"kill-head: {answer}")
        started = time.monotonic()
        # EIO here when the open or the lock was not reclaimed (the client marks them lost)
        in_thread(lambda: (os.pwrite(fd, second, len(first)), os.fsync(fd)), "the write after")
        went_on = time.monotonic() - started
        fcntl.lockf(fd, fcntl.LOCK_UN, 1, 0)
    finally:
        os.close(fd)
    drop_caches()
    got = file_sha256(path)
    want = hashlib.sha256(first + second).hexdigest()
    expect(got == want, f"sha256 {got}, wrote {want}")
    step("umount", HEADS_MNT)
    reply = vmchannel_request("grace")
    try:
        grace = json.loads(reply)
    except ValueError:
        raise CheckFailed(f"grace: {reply}") from None
    # over before its time: this client reclaimed its open and lock and said RECLAIM_COMPLETE
    expect(grace["clients"] == 1 and grace["over_after"] < grace["seconds"], f"grace {grace}")
    return (
        f"{answer}; the write through the reclaimed open and lock went on {went_on:.1f} s "
        f"later; the restarted head's grace period of {grace['seconds']} s over after "
        f"{grace['over_after']:.1f} s (reclaimed), sha256 equal"
    )


class Locker:
    """A lock owner in a process of its own over ``path`` (see LOCKER)."""

    def __init__(self, path: str):
        self.path = path
        self.proc = subprocess.Popen(
            [sys.executable, "-c", LOCKER, path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def ask(self, word: str, timeout: float = STEP_TIMEOUT_S) -> tuple[str, float]:
        """The answer to ``word`` ("lock" or "unlock") and how long it took."""
        started = time.monotonic()
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(word + "\n")
        self.proc.stdin.flush()
        line = in_thread(self.proc.stdout.readline, f"{word} of {self.path}", timeout)
        expect(line != "", f"{word} of {self.path}: the locker exited: {self.proc.stderr}")
        return line.strip(), time.monotonic() - started

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # its locks go with it (an NLM call it is stuck in stays behind)


def start_statd(statd_port: int) -> None:
    """rpcbind and rpc.statd (a locking NFSv3 mount needs them), statd on ``statd_port``, which
    the host forwards here with the port mapper, so that a restarted head's SM_NOTIFY reaches
    it. --no-notify: this guest has no previous boot to tell servers of."""
    os.makedirs("/run/rpcbind", exist_ok=True)  # /run is a fresh tmpfs
    shutil.chown("/run/rpcbind", "_rpc")  # Debian's rpcbind runs as _rpc
    sh("rpcbind", timeout=60)
    sh("rpc.statd", "--no-notify", "-p", str(statd_port), timeout=60)
    services = sh("rpcinfo", "-p", "127.0.0.1", timeout=60)
    expect(" status" in services, f"rpc.statd is not registered: {services}")


def check_heads_v3(port: int, statd_port: int) -> str:
    """NFSv3 and NLM through two heads (issue 32 item 1): a mount through head 1 and one
    through head 0; what one writes the other reads after close (close-to-open), both ways; an
    NLM lock through one head denies the other's until it is dropped."""
    start_statd(statd_port)
    options = V3_OPTIONS.format(port=port)
    for server, target in ((V3_THROUGH_1, V3_MNT_1), (V3_THROUGH_0, V3_MNT_0)):
        run = mount(options, port, target, server=server)
        expect(run.returncode == 0, f"mount {server}: {run.stderr.strip()}")
    seen = []
    for size, (writer, reader) in ((MiB + 5, (V3_MNT_1, V3_MNT_0)), (4099, (V3_MNT_0, V3_MNT_1))):
        data = os.urandom(size)

        def write(path: str = f"{writer}/across", data: bytes = data) -> None:
            with open(path, "wb") as f:
                f.write(data)

        def read(path: str = f"{reader}/across") -> bytes:
            with open(path, "rb") as f:
                return f.read()

        in_thread(write, f"the write through {writer}")
        back = in_thread(read, f"the read through {reader}")
        expect(back == data, f"{reader} read {len(back)} bytes, {writer} wrote {len(data)}")
        seen.append(f"{size} bytes through {writer[-5:]} read back through {reader[-5:]}")
    one, zero = Locker(f"{V3_MNT_1}/locked"), Locker(f"{V3_MNT_0}/locked")
    try:
        took = {}
        answer, took["lock 1"] = one.ask("lock")
        expect(answer == "ok", f"the lock through head 1: {answer}")
        answer, took["denied 0"] = zero.ask("lock")
        expect(answer.startswith("denied"), f"head 0's lock while head 1's held: {answer}")
        answer, _ = one.ask("unlock")
        expect(answer == "ok", f"head 1's unlock: {answer}")
        answer, took["lock 0"] = zero.ask("lock")
        expect(answer == "ok", f"head 0's lock after head 1's unlock: {answer}")
        answer, took["denied 1"] = one.ask("lock")
        expect(answer.startswith("denied"), f"head 1's lock while head 0's held: {answer}")
        answer, _ = zero.ask("unlock")
        expect(answer == "ok", f"head 0's unlock: {answer}")
    finally:
        one.close()
        zero.close()
    return f"{'; '.join(seen)}; NLM locks across heads (s): " + ", ".join(
        f"{k} {v:.2f}" for k, v in took.items()
    )


def check_heads_v3_kill(port: int) -> str:
    """The head serving an NLM lock holder killed with kill -9 (issue 32 item 1): the listener
    starts it again; its NSM state rose, so its SM_NOTIFY (to the guest's statd, forwarded by
    the host) makes the guest's lockd reclaim the lock in the grace period; a lock through the
    other head waits the grace period out (NLM4_DENIED_GRACE_PERIOD, which the Linux client
    retries every 5 s) and is then denied: the reclaimed lock holds."""
    one, zero = Locker(f"{V3_MNT_1}/kept"), Locker(f"{V3_MNT_0}/kept")
    try:
        answer, _ = one.ask("lock")
        expect(answer == "ok", f"the lock through head 1: {answer}")
        killed = vmchannel_request("kill-head")
        expect(killed.startswith("killed"), f"kill-head: {killed}")
        other, waited = zero.ask("lock")
        report = vmchannel_request("grace")
        try:
            grace = json.loads(report)
        except ValueError:
            raise CheckFailed(
                f"grace: {report}; head 0's lock: {other} after {waited:.1f} s"
            ) from None
        expect(
            other.startswith("denied"),
            f"head 0's lock {other} {waited:.1f} s after the kill: the lock was not reclaimed "
            f"(grace {grace})",
        )
        answer, _ = one.ask("unlock")
        expect(answer == "ok", f"head 1's unlock after the restart: {answer}")
        answer, freed = zero.ask("lock")
        expect(answer == "ok", f"head 0's lock after the reclaimed lock's unlock: {answer}")
        zero.ask("unlock")
    finally:
        one.close()
        zero.close()
    sh("umount", V3_MNT_1, timeout=120)  # (V3_MNT_0 stays for heads-ipv6, which unmounts it)
    return (
        f"{killed}; head 0's lock answered DENIED {waited:.1f} s after the kill (the grace "
        f"period, then the reclaimed lock); grace {grace}; granted {freed:.2f} s after the "
        "holder's unlock"
    )


def check_heads_cb_getattr(port: int) -> str:
    """CB_GETATTR across heads (issue 34 item 4 with issue 32): a file the guest writes through
    head 0 (its mount through V3_THROUGH_0) is under its write delegation, the bytes only in
    its page cache; nfs-rs on the host asks GETATTR through head 1: head 1 asks head 0, which
    asks the guest on the backchannel, and nfs-rs gets the guest's size while the guest sent no
    WRITE and no DELEGRETURN. After the close, nfs-rs's read (an OPEN through head 1, which
    recalls the delegation through head 0 if the client still holds it) reads the bytes."""
    run = mount("vers=4.1", port, CB_GETATTR_MNT, server=V3_THROUGH_0)
    expect(run.returncode == 0, f"mount {V3_THROUGH_0}: {run.stderr.strip()}")
    try:
        rel = "cb-getattr-across-heads"
        data = os.urandom(3 * 4096 + 17)
        ops = ("WRITE", "DELEGRETURN")
        with open(f"{CB_GETATTR_MNT}/{rel}", "wb") as f:
            f.write(data)
            f.flush()  # into the page cache: the client sends no WRITE before the close
            before = {op: op_count(CB_GETATTR_MNT, op) for op in ops}
            started = time.monotonic()
            answer = vmchannel_request(f"heads-stat {rel}")
            took = time.monotonic() - started
            sent = {op: op_count(CB_GETATTR_MNT, op) - n for op, n in before.items()}
            expect(
                answer == f"size {len(data)}",
                f"nfs-rs through head 1 saw {answer!r} of the {len(data)} bytes in the guest's "
                f"cache (sent meanwhile {sent}): no CB_GETATTR across heads?",
            )
            expect(sent == {"WRITE": 0, "DELEGRETURN": 0}, f"sent during the GETATTR: {sent}")
        # the client may give the delegation back on its own after the close: a recall then
        # has nothing to ask (counted, not required)
        returned = op_count(CB_GETATTR_MNT, "DELEGRETURN")
        read = vmchannel_request(f"heads-read {rel}")
        returned = op_count(CB_GETATTR_MNT, "DELEGRETURN") - returned
        want = f"sha256 {hashlib.sha256(data).hexdigest()}"
        expect(read.startswith(want), f"nfs-rs read {read!r} after the close, not {want}")
    finally:
        subprocess.run(["timeout", "120", "umount", CB_GETATTR_MNT], capture_output=True)
    return (
        f"nfs-rs's stat through head 1 got the guest's cached {answer} in {took:.2f} s, no "
        f"WRITE or DELEGRETURN meanwhile; its read after the close: {read}, "
        f"{returned} DELEGRETURN during it"
    )


def check_heads_ipv6(port: int, rpcbind: bool) -> str:
    """NFS over IPv6 (the daemon listens on ::): NFSv4.1 and NFSv3 (MOUNT over tcp6) mounts of
    [fec0::2], which reach head 1 from ::1; a file written over IPv6 reads back over IPv4
    through head 0 and over IPv6 through NFSv3; an NLM lock over IPv6 (the guest's lockd finds
    NLM by rpcbind GETADDR tcp6 at [fec0::2]:111, which the host relays to the heads' port)
    denies one over IPv4 through head 0 until it is dropped."""
    sh("ip", "-6", "addr", "add", f"{GUEST_IPV6}/64", "dev", "eth0", "nodad")
    server = f"[{HOST_IPV6}]"
    v3 = V3_OPTIONS.format(port=port)
    mounts = (
        (V6_MNT_41, "vers=4.1,proto=tcp6", server),
        (V6_MNT_3, v3.replace("proto=tcp", "proto=tcp6") + ("" if rpcbind else ",nolock"), server),
        (V3_MNT_0, v3, V3_THROUGH_0),
    )
    try:
        with open("/proc/mounts") as f:
            kept = {line.split()[1] for line in f}  # heads-v3-nlm-kill-9's V3_MNT_0
        for target, options, where in mounts:
            if target in kept:
                continue
            run = mount(options, port, target, server=where)
            expect(run.returncode == 0, f"mount -o {options} {where}: {run.stderr.strip()}")
        with open("/proc/mounts") as f:
            table = {line.split()[1]: line.split()[3] for line in f}
        for target in (V6_MNT_41, V6_MNT_3):
            expect(f"addr={HOST_IPV6}" in table.get(target, ""), f"{target}: {table.get(target)}")
        data = os.urandom(MiB + 7)

        def write() -> None:
            with open(f"{V6_MNT_41}/over-ipv6", "wb") as f:
                f.write(data)

        in_thread(write, "the write over IPv6")
        for target in (V3_MNT_0, V6_MNT_3):
            back = in_thread(lambda t=target: open(f"{t}/over-ipv6", "rb").read(), target)
            expect(back == data, f"{target} read {len(back)} bytes of {len(data)}")
        if not rpcbind:
            return "NFSv4.1 and NFSv3 over IPv6; NLM not checked: the host's [::1]:111 is taken"
        six, four = Locker(f"{V6_MNT_3}/locked-v6"), Locker(f"{V3_MNT_0}/locked-v6")
        try:
            answer, took = six.ask("lock")
            expect(answer == "ok", f"the lock over IPv6: {answer}")
            answer, _ = four.ask("lock")
            expect(answer.startswith("denied"), f"head 0's lock over IPv4: {answer}")
            answer, _ = six.ask("unlock")
            expect(answer == "ok", f"the unlock over IPv6: {answer}")
            answer, _ = four.ask("lock")
            expect(answer == "ok", f"head 0's lock after the unlock: {answer}")
        finally:
            six.close()
            four.close()
    finally:
        for target, _, _ in mounts:
            subprocess.run(["timeout", "120", "umount", target], capture_output=True)
    return (
        f"NFSv4.1 and NFSv3 mounts of {server} ({table[V6_MNT_41].split('addr=')[-1]}): "
        f"{len(data)} bytes written over IPv6 read back over IPv4 through head 0 and over "
        f"NFSv3; an NLM lock over IPv6 ({took:.2f} s) denied head 0's over IPv4"
    )


def main(plan_file: str) -> int:
    print("@@SHINGLE-VM BEGIN", flush=True)  # the host keeps the lines after it
    plan = json.load(open(plan_file))
    tune_data_server_timeouts()
    # the host starts its daemons while this VM boots
    ready = vmchannel_request("daemons-ready")
    if ready != "ready":
        for name in CHECKS:
            report(f"pnfs/{name}", False, f"the host's daemons: {ready}")
        return 1
    mds_port, ds_ports = plan["mds_port"], plan["ds_ports"]
    size = plan["size_mib"] * MiB
    run_check("pnfs/mount-4.1", lambda: check_mount(MDS_MNT, "vers=4.1", mds_port))
    run_check("pnfs/mount-4.2", lambda: check_mount(MDS42_MNT, "vers=4.2", mds_port))
    # two stripe units of 8 MiB (one per data server) for the striping; the killed data
    # server's write takes four, so that the kill lands mid-file with units left on both
    run_check("pnfs/striped-4.1", lambda: check_striped(MDS_MNT, size // 2))
    run_check("pnfs/striped-4.2", lambda: check_striped(MDS42_MNT, size // 2))
    run_check("pnfs/ds-killed-during-write", lambda: check_ds_killed(MDS_MNT, size, ds_ports))
    run_check("pnfs/non-pnfs-4.0-through-ds", lambda: check_non_pnfs(ds_ports[0], MDS_MNT))

    def unmount() -> str:
        for target in (DS_MNT, MDS42_MNT, MDS_MNT):
            sh("umount", target, timeout=120)
        return "unmounted"

    run_check("pnfs/umount", unmount)
    run_check("pnfs/unstable-data-servers", lambda: check_unstable(mds_port, size // 2, ds_ports))
    run_check("pnfs/heads-kill-9", lambda: check_heads_kill(plan["heads_port"]))
    run_check("pnfs/heads-v3-nlm", lambda: check_heads_v3(plan["heads_port"], plan["statd_port"]))
    run_check("pnfs/heads-v3-nlm-kill-9", lambda: check_heads_v3_kill(plan["heads_port"]))
    run_check("pnfs/heads-cb-getattr", lambda: check_heads_cb_getattr(plan["heads_port"]))
    run_check("pnfs/heads-ipv6", lambda: check_heads_ipv6(plan["heads_port"], plan["ipv6_rpcbind"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
