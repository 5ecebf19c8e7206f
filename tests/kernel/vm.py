"""A throwaway Linux VM for tests that need a real kernel (the kernel NFS client).

Debian's own kernel (``apt-get download linux-image-6.1.0-N-amd64``, unpacked with
``dpkg-deb -x``) boots under qemu-system-x86_64 from an initramfs built here from
busybox-static and the kernel's own modules. The host's root is shared read-only over
9p with a tmpfs overlay on top, and the guest ``switch_root``s into it: the guest runs
the host's userland (bash, coreutils, python3, mount.nfs, fio) on its own kernel.

Two serial ports: ttyS0 carries the kernel console (kept in a log file for failures),
ttyS1 carries the guest program's output to the host and the host's replies back
(``Guest.request`` in the guest, a ``requests`` callback on the host). Network is
qemu user-mode only: the guest reaches the host's 127.0.0.1 as 10.0.2.2.

The kernel, its modules and the decompressed vmlinux are cached in
``$SHINGLE_KERNEL_CACHE`` (default ``~/.cache/shingle-kernel-rig``) and reused.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import lzma
import os
import re
import select
import shutil
import struct
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

QEMU = "qemu-system-x86_64"
BUSYBOX = Path("/bin/busybox")  # Debian busybox-static
# What the NFS client rig needs; load order comes from each module's depends=.
NFS_CLIENT_MODULES = (
    "virtio_pci",
    "virtio_net",
    "virtio_rng",
    "9p",
    "9pnet",
    "9pnet_virtio",
    "netfs",
    "fscache",
    "overlay",
    "sunrpc",
    "grace",
    "auth_rpcgss",
    "lockd",
    "nfs_acl",
    "nfs",
    "nfsv3",
    "nfsv4",
    "dns_resolver",
    # the pNFS FILES layout driver (test_kernel_pnfs.py): loaded at boot, as the guest has no
    # modprobe for the client's request_module("nfs-layouttype4-1")
    "nfs_layout_nfsv41_files",
)
# Lines the guest program writes on ttyS1 that the host acts on.
BEGIN_MARKER = "@@SHINGLE-VM BEGIN"
EXIT_MARKER = "@@SHINGLE-VM EXIT"
REQUEST_MARKER = "@@SHINGLE-VM REQUEST"
REPLY_MARKER = "@@SHINGLE-VM REPLY"
# a guest's check result: "@@CHECK PASS|FAIL|SKIP name details" (each guest_*.py prints them)
CHECK_MARKER = "@@CHECK"


class VmUnavailable(Exception):
    """qemu cannot run on this machine at all (the only reason to skip the rig)."""


def cache_dir() -> Path:
    base = os.environ.get("SHINGLE_KERNEL_CACHE")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "shingle-kernel-rig"


# -- the kernel ---------------------------------------------------------------------------
def kernel_package() -> str:
    """The linux-image-6.1.0-N-amd64 package that Debian's linux-image-amd64 points at now."""
    try:
        return _kernel_package()
    except RuntimeError:
        _apt_update()  # a fresh machine may have no package lists yet
        return _kernel_package()


def _apt_update() -> None:
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    subprocess.run(
        [*sudo, "apt-get", "-o", "DPkg::Lock::Timeout=600", "update", "-qq"],
        capture_output=True,
        timeout=900,
    )


def _kernel_package() -> str:
    out = subprocess.run(
        ["apt-cache", "depends", "linux-image-amd64"], capture_output=True, text=True, timeout=60
    ).stdout
    found = re.findall(r"Depends: (linux-image-6\.1\.0-\d+-amd64)\b", out)
    if found:
        return found[0]
    out = subprocess.run(
        ["apt-cache", "search", "--names-only", r"^linux-image-6\.1\.0-[0-9]+-amd64$"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    names = sorted(
        re.findall(r"^(linux-image-6\.1\.0-(\d+)-amd64) ", out, re.M), key=lambda n: int(n[1])
    )
    if not names:
        raise RuntimeError(
            "apt-cache knows no linux-image-6.1.0-N-amd64 package (run apt-get update)"
        )
    return names[-1][0]


def extract_vmlinux(vmlinuz: bytes) -> bytes:
    """The uncompressed ELF kernel inside a bzImage (what the kernel's scripts/extract-vmlinux
    does): find a compressed payload's magic, decompress from there, keep the first ELF."""
    decoders = [
        (b"\xfd7zXZ\x00", lambda d: lzma.LZMADecompressor(lzma.FORMAT_XZ).decompress(d)),
        (b"\x28\xb5\x2f\xfd", _zstd_decompress),
        (b"\x1f\x8b\x08", lambda d: _gunzip(d)),
        (b"\x5d\x00\x00", lambda d: lzma.LZMADecompressor(lzma.FORMAT_ALONE).decompress(d)),
    ]
    for magic, decode in decoders:
        start = vmlinuz.find(magic)
        while start != -1:
            try:
                out = decode(vmlinuz[start:])
            except Exception:  # noqa: BLE001 - a false magic inside other data: try the next one
                out = b""
            if out[:4] == b"\x7fELF":
                return out
            start = vmlinuz.find(magic, start + 1)
    raise RuntimeError("no xz, zstd, gzip or lzma payload holding an ELF kernel found in vmlinuz")


def _gunzip(data: bytes) -> bytes:
    return gzip.GzipFile(fileobj=__import__("io").BytesIO(data)).read1(1 << 30)


def _zstd_decompress(data: bytes) -> bytes:
    if shutil.which("zstd") is None:
        raise RuntimeError("zstd not installed")
    run = subprocess.run(["zstd", "-dc"], input=data, capture_output=True, timeout=120)
    return run.stdout  # zstd complains about trailing data after the frame; the output is whole


def modinfo(ko: bytes) -> dict[str, list[str]]:
    """The key=value strings of a module's .modinfo ELF section (64-bit little-endian)."""
    (shoff,) = struct.unpack_from("<Q", ko, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", ko, 0x3A)

    def section(i: int) -> tuple[int, int, int]:
        name, _type, _flags, _addr, offset, size = struct.unpack_from(
            "<IIQQQQ", ko, shoff + i * shentsize
        )
        return name, offset, size

    _, names_off, _ = section(shstrndx)
    for i in range(shnum):
        name, offset, size = section(i)
        if ko[names_off + name : ko.index(b"\0", names_off + name)] == b".modinfo":
            info: dict[str, list[str]] = {}
            for item in ko[offset : offset + size].split(b"\0"):
                key, sep, value = item.decode(errors="replace").partition("=")
                if sep:
                    info.setdefault(key, []).append(value)
            return info
    return {}


@dataclass
class Kernel:
    version: str
    vmlinux: Path
    modules: list[Path]  # uncompressed .ko files in load order


def prepare_kernel(
    wanted: tuple[str, ...] = NFS_CLIENT_MODULES, log: Callable[[str], None] = print
) -> Kernel:
    """Download Debian's kernel once into the cache; return it with the ``wanted`` modules
    and their dependencies (uncompressed, in load order; modules built into the kernel are
    left out). The .deb stays in the cache: modules asked for later come out of it."""
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    package = _cached_package(cache) or kernel_package()
    home = cache / package
    if not (home / "vmlinux").exists():
        _fetch(package, home, log)
    (cache / "current").write_text(package + "\n")
    index = json.loads((home / "modules.json").read_text())
    order: list[str] = []

    def visit(name: str, path: tuple[str, ...]) -> None:
        key = name.replace("-", "_")
        if key not in index or key in order:
            return  # built into this kernel, or in the order already
        if key in path:
            raise RuntimeError(f"module dependency cycle: {' -> '.join(path + (key,))}")
        for dep in index[key]["depends"]:
            visit(dep, path + (key,))
        order.append(key)

    for name in wanted:
        visit(name, ())
    missing = [key for key in order if not (home / "modules" / f"{key}.ko").exists()]
    if missing:
        _unpack_modules(home, {key: index[key]["path"] for key in missing})
    return Kernel(
        (home / "version").read_text().strip(),
        home / "vmlinux",
        [home / "modules" / f"{key}.ko" for key in order],
    )


def _cached_package(cache: Path) -> str | None:
    # Reuse what a previous run fetched instead of asking apt again (new kernels arrive
    # often; the rig does not need the newest one). SHINGLE_KERNEL_REFRESH=1 asks again.
    current = cache / "current"
    if os.environ.get("SHINGLE_KERNEL_REFRESH") or not current.exists():
        return None
    package = current.read_text().strip()
    return package if (cache / package / "vmlinux").exists() else None


def _fetch(package: str, home: Path, log: Callable[[str], None]) -> None:
    log(f"kernel rig: fetching {package} into {home} (once; cached after)")
    with tempfile.TemporaryDirectory(dir=home.parent) as tmp:
        staged = Path(tmp) / "staged"
        (staged / "modules").mkdir(parents=True)
        download = ["apt-get", "download", package]
        if subprocess.run(download, cwd=staged, capture_output=True, timeout=900).returncode:
            _apt_update()  # lists older than the mirror: the package file is gone from it
            run = subprocess.run(download, cwd=staged, capture_output=True, text=True, timeout=900)
            if run.returncode:
                raise RuntimeError(f"apt-get download {package} failed: {run.stderr.strip()}")
        (deb,) = staged.glob("*.deb")
        deb.rename(staged / "kernel.deb")
        root = Path(tmp) / "root"
        subprocess.run(
            ["dpkg-deb", "-x", str(staged / "kernel.deb"), str(root)], check=True, timeout=600
        )
        (vmlinuz,) = (root / "boot").glob("vmlinuz-*")
        version = vmlinuz.name.removeprefix("vmlinuz-")
        (staged / "vmlinux").write_bytes(extract_vmlinux(vmlinuz.read_bytes()))
        index = {}
        for ko in (root / "lib" / "modules" / version / "kernel").rglob("*.ko*"):
            key = ko.name.split(".ko")[0].replace("-", "_")
            depends = modinfo(_module_bytes(ko)).get("depends", [""])[0]
            index[key] = {
                "path": str(ko.relative_to(root)),
                "depends": [d for d in depends.split(",") if d],
            }
        (staged / "modules.json").write_text(json.dumps(index, indent=0, sort_keys=True))
        (staged / "version").write_text(version + "\n")
        shutil.rmtree(home, ignore_errors=True)
        staged.rename(home)


def _module_bytes(ko: Path) -> bytes:
    data = ko.read_bytes()
    if ko.name.endswith(".xz"):
        return lzma.decompress(data)
    if ko.name.endswith(".zst"):
        return _zstd_decompress(data)
    if ko.name.endswith(".gz"):
        return gzip.decompress(data)
    return data


def _unpack_modules(home: Path, paths: dict[str, str]) -> None:
    with tempfile.TemporaryDirectory(dir=home) as tmp:
        tar = subprocess.Popen(
            ["dpkg-deb", "--fsys-tarfile", str(home / "kernel.deb")], stdout=subprocess.PIPE
        )
        subprocess.run(
            ["tar", "-x", "-C", tmp, *[f"./{p}" for p in paths.values()]],
            stdin=tar.stdout,
            check=True,
            timeout=600,
        )
        tar.stdout.close()
        tar.wait()
        for key, path in paths.items():
            (home / "modules" / f"{key}.ko").write_bytes(_module_bytes(Path(tmp) / path))


# -- the initramfs ------------------------------------------------------------------------
INIT = r"""#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev /host /overlay /newroot /usr/bin /usr/sbin /sbin
/bin/busybox --install -s
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for ko in $(cat /modules/order); do
  insmod /modules/$ko || echo "init: insmod $ko failed" >/dev/ttyS1
done
ip link set lo up
ip link set eth0 up
ip addr add 10.0.2.15/24 dev eth0
ninep=trans=virtio,version=9p2000.L,msize=512000,ro${shingle_9p_cache:+,cache=$shingle_9p_cache}
mount -t 9p -o "$ninep" hostroot /host
mount -t tmpfs -o mode=0755 tmpfs /overlay
mkdir -p /overlay/upper /overlay/work
mount -t overlay overlay -o lowerdir=/host,upperdir=/overlay/upper,workdir=/overlay/work /newroot
for d in proc sys dev; do mount --move /$d /newroot/$d; done
mount -t tmpfs -o mode=0755 tmpfs /newroot/run
mount -t devpts devpts /newroot/dev/pts 2>/dev/null
hostname "$shingle_hostname"
echo "$shingle_hostname" > /newroot/etc/hostname
if [ -n "$shingle_results" ]; then
  mkdir -p /newroot/mnt/results
  mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 results /newroot/mnt/results
fi
if [ "$shingle_init" = systemd ]; then
  /bin/busybox sh /systemd-setup /newroot
  exec switch_root /newroot /lib/systemd/systemd
fi
exec switch_root /newroot /bin/sh -c '
  export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
  stty -F /dev/ttyS1 raw -echo 2>/dev/null
  "$shingle_program" >/dev/ttyS1 2>&1 </dev/null
  echo "@@SHINGLE-VM EXIT $?" >/dev/ttyS1
  sync
  echo o > /proc/sysrq-trigger
  while :; do :; done'
"""


# run_vm(systemd=True): the guest boots the host's systemd as PID 1 on the overlay root. The
# host's own units stay out of it (no enablement symlinks, no fstab: the VM would start the
# host's servers), the gettys are masked (one on the console would cut the program's output
# off), and the program runs as a oneshot unit after multi-user.target: its output goes to
# ttyS1 as without systemd, and to /mnt/results/program.log, a writable 9p share of a host
# folder, should the serial line lose it. All of it is files on the overlay, not systemd.*
# kernel options: the host root of a container machine has /.dockerenv, so systemd detects
# "docker" and ignores the kernel command line.
SYSTEMD_SETUP = r"""
R=$1
rm -rf $R/etc/systemd/system/*.wants $R/etc/systemd/system/*.d
: > $R/etc/fstab
# no "D /tmp" at boot: it would walk the host's /tmp over 9p for minutes and hide the
# program (the rigs keep their folders there)
mkdir -p $R/etc/tmpfiles.d && : > $R/etc/tmpfiles.d/tmp.conf
cat /proc/sys/kernel/random/uuid | tr -d - > $R/etc/machine-id  # set: not a first boot
cat > $R/etc/systemd/system/shingle-vm-program.service <<UNIT
[Unit]
Description=the VM's test program
After=multi-user.target
[Service]
Type=oneshot
Environment=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
ExecStart=/bin/sh /shingle-vm-program $shingle_program
StandardOutput=journal
TimeoutStartSec=infinity
UNIT
mkdir -p $R/etc/systemd/system/multi-user.target.wants
ln -s ../shingle-vm-program.service $R/etc/systemd/system/multi-user.target.wants/
for unit in serial-getty@ttyS0.service console-getty.service getty.target \
    systemd-firstboot.service; do
  ln -sf /dev/null $R/etc/systemd/system/$unit
done
cat > $R/shingle-vm-program <<'PROGRAM'
stty -F /dev/ttyS1 raw -echo 2>/dev/null
{ "$1"; echo "@@SHINGLE-VM EXIT $?"; } </dev/null 2>&1 | tee /mnt/results/program.log >/dev/ttyS1
sync
echo o > /proc/sysrq-trigger
PROGRAM
"""


def cpio_newc(entries: list[tuple[str, int, bytes]]) -> bytes:
    """A newc cpio archive of (path, mode, data) entries (directories have empty data)."""
    out = bytearray()
    for ino, (name, mode, data) in enumerate([*entries, ("TRAILER!!!", 0, b"")], start=1):
        encoded = name.encode() + b"\0"
        fields = (ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(encoded), 0)
        out += b"070701" + b"".join(b"%08X" % f for f in fields) + encoded
        out += b"\0" * (-len(out) % 4) + data
        out += b"\0" * (-len(out) % 4)
    return bytes(out)


def build_initramfs(kernel: Kernel, dest: Path) -> Path:
    entries: list[tuple[str, int, bytes]] = [
        ("bin", 0o40755, b""),
        ("modules", 0o40755, b""),
        ("bin/busybox", 0o100755, BUSYBOX.read_bytes()),
        ("init", 0o100755, INIT.encode()),
        ("systemd-setup", 0o100644, SYSTEMD_SETUP.encode()),
        ("modules/order", 0o100644, "".join(f"{ko.name}\n" for ko in kernel.modules).encode()),
    ]
    entries += [(f"modules/{ko.name}", 0o100644, ko.read_bytes()) for ko in kernel.modules]
    dest.write_bytes(cpio_newc(entries))
    return dest


# -- running it ---------------------------------------------------------------------------
def accelerator() -> list[str]:
    """kvm only where it boots a stock kernel: a PVM /dev/kvm (kvm_pvm loaded) does not."""
    if not Path("/sys/module/kvm_pvm").exists():
        try:
            os.close(os.open("/dev/kvm", os.O_RDWR))
            return ["-accel", "kvm", "-cpu", "host"]
        except OSError:
            pass
    return ["-accel", "tcg,thread=multi", "-cpu", "max"]


def check_qemu() -> None:
    if shutil.which(QEMU) is None:
        raise VmUnavailable(
            f"{QEMU} not found (Debian package qemu-system-x86; ./run-tests installs it)"
        )
    if not BUSYBOX.exists():
        raise VmUnavailable(f"{BUSYBOX} not found (Debian package busybox-static)")
    run = subprocess.run([QEMU, "-accel", "help"], capture_output=True, text=True, timeout=60)
    if run.returncode != 0 or "tcg" not in run.stdout:
        raise VmUnavailable(f"{QEMU} cannot run: {run.stderr.strip() or run.stdout.strip()}")


@dataclass
class VmResult:
    exit_status: int | None  # None: the guest never reported one (crash, timeout)
    lines: list[str]  # the guest program's output between the begin and exit markers
    console: str  # kernel console (ttyS0)
    seconds: float
    timed_out: bool = False
    extra: dict = field(default_factory=dict)

    def checks(self) -> dict[str, tuple[str, str]]:
        return parse_checks(self.lines)


def parse_checks(lines: list[str]) -> dict[str, tuple[str, str]]:
    """{check name: (PASS|FAIL|SKIP, details)} from a guest's check lines; a name reported
    twice keeps its last result."""
    checks = {}
    for line in lines:
        if line.startswith(CHECK_MARKER + " "):
            _, verdict, name, *details = line.split(" ", 3)
            checks[name] = (verdict, details[0] if details else "")
    return checks


def run_vm(
    program: Path,
    *,
    kernel: Kernel,
    workdir: Path,
    hostname: str | None = None,
    requests: Callable[[str], str] | None = None,
    timeout: float = 900,
    memory_mib: int = 1024,
    cpus: int = 2,
    # the 9p cache mode of the guest's view of the host's root (None: the kernel's default,
    # none); "loose" keeps metadata and pages in the guest, so imports and program starts read
    # over 9p far less (`import torch` 188 -> 98 s at load 10): for runs that read no host file
    # changed after the boot
    host_cache: str | None = None,
    on_line: Callable[[str], None] | None = None,
    systemd: bool = False,
    extra_args: tuple[str, ...] = (),
    host_forwards: tuple[int | tuple[int, int], ...] = (),
    guest_forwards: tuple[tuple[str, int, str], ...] = (),
    ipv6: bool = False,
) -> VmResult:
    """Boot a VM that runs ``program`` (a host path, seen through the shared root) as root
    and powers off. Each ``@@SHINGLE-VM REQUEST text`` line it prints calls ``requests(text)``
    and the answer goes back as a ``@@SHINGLE-VM REPLY answer`` line on its ttyS1.

    ``systemd``: boot the host's systemd as PID 1 and run ``program`` as a oneshot unit
    after multi-user.target (SYSTEMD_SETUP); ``workdir/results`` is the guest's writable
    /mnt/results, and the program's output comes from its program.log when the serial line
    lost it. ``extra_args``: more qemu arguments (disks for the zoned rig). ``host_forwards``:
    TCP ports of the host's 127.0.0.1 that qemu forwards to the same port of the guest (a
    service in the guest the host must reach, such as an NFSv4.0 callback service), or (host
    port, guest port).
    ``guest_forwards``: (guest address, port, command): a connection of the guest to that
    address and port runs the host command with the connection on its stdin and stdout
    (qemu's guestfwd; tcp_from.py relays it from another source address). ``ipv6``: qemu's
    user network carries IPv6 too (prefix fec0::/64, the guest sets its own address): a guest
    connection to fec0::2 reaches the host's ::1, as one to 10.0.2.2 reaches its 127.0.0.1."""
    check_qemu()
    workdir.mkdir(parents=True, exist_ok=True)
    initrd = build_initramfs(kernel, workdir / "initramfs.cpio")
    console_log = workdir / "console.log"
    hostname = hostname or f"shingle-vm-{uuid.uuid4().hex[:8]}"
    # no_timer_check: a starved TCG guest fails the IO-APIC timer check and panics at boot
    # (seen under the systemd rig, and at load 15 under a plain one: every check of it lost)
    append = (
        f"console=ttyS0 panic=-1 loglevel=6 no_timer_check rdinit=/init "
        f"shingle_hostname={hostname} shingle_program={program}"
        + (f" shingle_9p_cache={host_cache}" if host_cache else "")
    )
    results = workdir / "results"
    extra: list[str] = []
    if systemd:
        results.mkdir(exist_ok=True)
        append += " shingle_results=1 shingle_init=systemd"
        extra = [
            "-virtfs",
            f"local,path={results},mount_tag=results,security_model=none,multidevs=remap",
        ]
    cmd = [
        QEMU,
        *accelerator(),
        "-m",
        str(memory_mib),
        "-smp",
        str(cpus),
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-no-reboot",
        "-kernel",
        str(kernel.vmlinux),
        "-initrd",
        str(initrd),
        "-append",
        append,
        "-serial",
        f"file:{console_log}",
        "-chardev",
        "stdio,id=results,signal=off",
        "-serial",
        "chardev:results",
        "-netdev",
        # ipv6=on alone would turn IPv4 off (qemu: naming one family enables only those named)
        f"user,id=net0,{'ipv4=on,ipv6=on' if ipv6 else 'ipv6=off'}"
        + "".join(
            f",hostfwd=tcp:127.0.0.1:{ports[0]}-:{ports[1]}"
            for ports in ((p, p) if isinstance(p, int) else p for p in host_forwards)
        )
        + "".join(f",guestfwd=tcp:{ip}:{port}-cmd:{cmd}" for ip, port, cmd in guest_forwards),
        "-device",
        "virtio-net-pci,netdev=net0",
        "-device",
        "virtio-rng-pci",
        "-virtfs",
        "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
        *extra,
        *extra_args,
    ]
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    lines: list[str] = []
    status = None
    began = timed_out = False
    buffer = b""
    try:
        while True:
            left = timeout - (time.monotonic() - started)
            if left <= 0:
                timed_out = True
                break
            ready, _, _ = select.select([proc.stdout], [], [], min(left, 5))
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            buffer += chunk
            *complete, buffer = buffer.split(b"\n")
            for raw in complete:
                line = raw.decode(errors="replace").rstrip("\r")
                if on_line is not None:
                    on_line(line)
                if line.startswith(BEGIN_MARKER):
                    began = True
                elif line.startswith(EXIT_MARKER):
                    status = int(line.split()[-1])
                elif line.startswith(REQUEST_MARKER):
                    answer = (
                        requests(line[len(REQUEST_MARKER) :].strip()) if requests else "no handler"
                    )
                    # a guest that gave up waiting has powered off: its output still counts
                    with contextlib.suppress(BrokenPipeError):
                        proc.stdin.write(f"{REPLY_MARKER} {answer}\n".encode())
                        proc.stdin.flush()
                elif began:
                    lines.append(line)
    finally:
        if proc.poll() is None:
            deadline = time.monotonic() + (60 if status is not None else 0)
            while proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            if proc.poll() is None:
                proc.kill()
        proc.wait()
        stderr = proc.stderr.read().decode(errors="replace")
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            try:
                pipe.close()
            except OSError:
                pass
    console = console_log.read_text(errors="replace") if console_log.exists() else ""
    if stderr.strip():
        console += "\n--- qemu stderr ---\n" + stderr
    if systemd and status is None and (results / "program.log").exists():
        status, lines = _program_log(results / "program.log")
    return VmResult(status, lines, console, time.monotonic() - started, timed_out)


def _program_log(path: Path) -> tuple[int | None, list[str]]:
    """(exit status, lines after the begin marker) of a program's log file."""
    status, lines, began = None, [], False
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith(BEGIN_MARKER):
            began = True
        elif line.startswith(EXIT_MARKER):
            status = int(line.split()[-1])
        elif began:
            lines.append(line)
    return status, lines
