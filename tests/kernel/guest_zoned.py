"""Runs inside the zoned rig's VM (zoned_rig.py): makes the zoned disks, then runs each check
of shingle's zoned backend on them and prints one ``@@CHECK VERDICT NAME details`` line per
check. Argument: the plan file (JSON) the host wrote.

Runs as root under the checkout's Python (the host's venv, seen through the shared root)."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

CHECK_MARKER = "@@CHECK"
CONFIGFS = Path("/sys/kernel/config")
NULLB = CONFIGFS / "nullb"
TCMU = CONFIGFS / "target" / "core" / "user_1"
LOOPBACK = CONFIGFS / "target" / "loopback"
ZBC_MOUNT = Path("/mnt/zbc-backing")


def sh(*cmd: str, check: bool = True) -> str:
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if check and run.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: exit {run.returncode}: {run.stderr.strip()}")
    return run.stdout


def log(text: str) -> None:
    print(text, flush=True)


# -- the devices ----------------------------------------------------------------------------
def load_modules(tree: str) -> None:
    version = os.uname().release
    target = Path("/lib/modules") / version
    target.mkdir(parents=True, exist_ok=True)
    sh("mount", "--bind", tree, str(target))
    sh("modprobe", "configfs")
    if not (CONFIGFS / "nullb").exists() and not os.path.ismount(CONFIGFS):
        sh("mount", "-t", "configfs", "none", str(CONFIGFS))
    # no device at load: each comes from configfs with its own geometry
    sh("modprobe", "null_blk", "nr_devices=0")
    for module in ("ext4", "crc32c_generic", "target_core_user", "tcm_loop", "sd_mod", "nvme"):
        sh("modprobe", module)


def make_null_blk(name: str, attrs: dict) -> str:
    """A null_blk disk made through configfs (sizes in MiB); returns its /dev path."""
    folder = NULLB / name
    folder.mkdir()
    for key, value in attrs.items():
        (folder / key).write_text(f"{value}\n")
    (folder / "power").write_text("1\n")
    return wait_block(name)


def wait_block(name: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if Path("/sys/block", name).exists() and Path("/dev", name).exists():
            return f"/dev/{name}"
        time.sleep(0.1)
    raise RuntimeError(f"/dev/{name} did not appear in {timeout} s")


def start_tcmu() -> subprocess.Popen:
    """tcmu-runner serving the target_core_user devices (its file_zbc handler)."""
    ZBC_MOUNT.mkdir(parents=True, exist_ok=True)
    sh("mount", "-t", "ext4", "/dev/vda", str(ZBC_MOUNT))
    logdir = ZBC_MOUNT.parent / "tcmu-log"
    logdir.mkdir(parents=True, exist_ok=True)
    runner = subprocess.Popen(
        ["tcmu-runner", "-d", "-l", str(logdir / "tcmu-runner.log")],
        stdout=subprocess.DEVNULL,
        stderr=open(logdir / "stderr", "w"),  # noqa: SIM115 - the runner's for its lifetime
    )
    return runner


def make_zbc(name: str, size_mib: int, options: str, wwn: int) -> str:
    """A host-managed SCSI ZBC disk backed by ZBC_MOUNT/NAME.zbc through tcmu-runner; returns
    its /dev/sdX. ``options`` (zsize-16/conv-2/open-6/model-HM) format the file: empty on a
    later boot, which keeps the file's zones."""
    backing = ZBC_MOUNT / f"{name}.zbc"
    device = TCMU / name
    device.mkdir(parents=True)
    config = f"zbc/{options}@{backing}" if options else f"zbc/{backing}"
    (device / "control").write_text(f"dev_config={config}")
    (device / "control").write_text(f"dev_size={size_mib << 20}")
    deadline = time.monotonic() + 60
    while True:
        try:
            (device / "enable").write_text("1")
            break
        except BlockingIOError:
            # EAGAIN: the kernel's netlink call found no tcmu-runner ready to answer yet
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    naa = f"naa.5001405{wwn:09x}"
    lun = LOOPBACK / naa / "tpgt_1" / "lun" / "lun_0"
    before = set(glob.glob("/sys/block/sd*"))
    lun.mkdir(parents=True)
    (LOOPBACK / naa / "tpgt_1" / "nexus").write_text(f"naa.5001406{wwn:09x}")
    os.symlink(device, lun / name)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        new = set(glob.glob("/sys/block/sd*")) - before
        if new:
            return wait_block(Path(new.pop()).name)
        time.sleep(0.2)
    dmesg = sh("dmesg")[-1500:]
    runner_log = "".join(p.read_text()[-3000:] for p in ZBC_MOUNT.parent.glob("tcmu-log/*"))
    raise RuntimeError(
        f"ZBC disk {name} ({naa}) did not appear; kernel log tail:\n{dmesg}\n"
        f"tcmu-runner's log:\n{runner_log}"
    )


def remove_zbc() -> None:
    """Take the ZBC disks away while tcmu-runner still serves them: a SCSI disk left without
    its runner hangs the guest's final sync for minutes (command timeouts and retries)."""
    for tpg in LOOPBACK.glob("naa.*/tpgt_1"):
        for link in tpg.glob("lun/lun_0/*"):
            if link.is_symlink():
                link.unlink()
        for lun in tpg.glob("lun/lun_*"):
            lun.rmdir()
        tpg.rmdir()
        tpg.parent.rmdir()
    for device in TCMU.glob("*"):
        if device.is_dir():
            device.rmdir()


def describe(dev: str) -> str:
    queue = Path("/sys/block", Path(dev).name, "queue")
    keys = ("zoned", "chunk_sectors", "nr_zones", "max_open_zones", "max_active_zones")
    keys += ("logical_block_size", "scheduler")
    return f"{dev}: " + ", ".join(
        f"{k}={(queue / k).read_text().strip()}" for k in keys if (queue / k).exists()
    )


# -- the checks ------------------------------------------------------------------------------
KiB, MiB = 1 << 10, 1 << 20
CHECKS: list = []


def check(name: str):
    def register(fn):
        CHECKS.append((name, fn))
        return fn

    return register


class Rig:
    """What the checks share: the devices by role, and the data path's state between checks."""

    def __init__(self, plan: dict, devices: dict[str, str]):
        self.plan = plan
        self.devices = devices  # role name -> /dev path
        self.state: dict = {}


def raw_write(dev: str, offset: int, length: int) -> int:
    """An O_DIRECT write of ``length`` bytes at byte ``offset``, outside shingle: its errno, or
    0 when the device took it."""
    import mmap

    fd = os.open(dev, os.O_WRONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, length)
    try:
        os.pwrite(fd, buf, offset)
        return 0
    except OSError as exc:
        return exc.errno or -1
    finally:
        buf.close()
        os.close(fd)


def kinds(rig: Rig) -> list[tuple[str, str]]:
    """(kind, device) of one disk of each kind."""
    return [
        ("null_blk", rig.devices["nullb0"]),
        ("zbc", rig.devices["zbc0"]),
        ("nvme", rig.devices["nvme"]),
    ]


@check("geometry/null_blk")
def check_geometry_null_blk(rig: Rig) -> str:
    from engine.drives.blkzoned import ZonedBlockDrive, read_geometry

    g = read_geometry(rig.devices["nullb0"])
    want = dict(
        device_zone_size=4 * MiB,
        zone_capacity=3 * MiB,
        conventional_zones=2,
        sequential_zones=14,
        max_open_zones=4,
        max_active_zones=6,
    )
    got = {k: getattr(g, k) for k in want}
    assert got == want, f"geometry {got}, expected {want}"
    drive = ZonedBlockDrive(rig.devices["nullb0"])
    try:
        zones = drive.report()
        # shingle's zone 0 is the first sequential zone: the conventional ones are left alone
        assert zones[0].start == 2 * 4 * MiB, zones[0]
        assert (drive.zone_size, drive.zone_count) == (3 * MiB, 14)
    finally:
        drive.close()
    return f"{g.as_dict()}"


@check("geometry/zbc-and-nvme")
def check_geometry_others(rig: Rig) -> str:
    from engine.drives.blkzoned import read_geometry

    zbc = read_geometry(rig.devices["zbc0"])
    nvme = read_geometry(rig.devices["nvme"])
    assert (zbc.device_zone_size, zbc.zone_capacity, zbc.conventional_zones) == (
        4 * MiB,
        4 * MiB,
        2,
    ), zbc
    assert zbc.max_open_zones == 4, zbc
    assert (nvme.device_zone_size, nvme.zone_capacity, nvme.conventional_zones) == (
        4 * MiB,
        3 * MiB,
        0,
    ), nvme
    assert (nvme.max_open_zones, nvme.max_active_zones) == (6, 8), nvme
    return f"zbc {zbc.as_dict()}; nvme {nvme.as_dict()}"


@check("append-read-verify")
def check_append_read(rig: Rig) -> str:
    from engine.drives.blkzoned import ZonedBlockDrive

    out = []
    for kind, dev in kinds(rig):
        drive = ZonedBlockDrive(dev)
        try:
            idx = drive.zone_count - 1
            drive.reset(idx)
            pieces = [os.urandom(n) for n in (4096, 10_000, 64 * KiB)]
            offset = 0
            for piece in pieces:
                drive.append(idx, offset, piece, durable=True)
                start = offset
                offset += -(-len(piece) // drive.write_granularity) * drive.write_granularity
                assert drive.read(idx, start, len(piece)) == piece, f"{kind}: read back differs"
            reported = drive.report()[idx].write_pointer
            assert reported == offset, f"{kind}: device write pointer {reported}, expected {offset}"
            out.append(f"{kind} wp {reported}")
        finally:
            drive.close()
    return ", ".join(out)


@check("off-pointer-writes")
def check_off_pointer(rig: Rig) -> str:
    """shingle refuses a write off the write pointer before the device sees it; the device
    refuses one too (shown with a raw write), with its transport's errno."""
    import errno

    from engine.drives.blkzoned import ZonedBlockDrive
    from engine.drives.zoned import ZoneError

    out = []
    for kind, dev in kinds(rig):
        drive = ZonedBlockDrive(dev)
        try:
            idx = drive.zone_count - 2
            drive.reset(idx)
            drive.append(idx, 0, b"x" * 4096, durable=True)
            try:
                drive.append(idx, 8192, b"y" * 4096)
            except ZoneError:
                pass
            else:
                raise AssertionError(f"{kind}: an append off the write pointer was taken")
            assert drive.write_errors == 0 and drive.off_pointer_errors == 0, kind
            start = drive.report()[idx].start
            err = raw_write(dev, start + 8192, 4096)
            assert err in (errno.EIO, errno.EREMOTEIO), f"{kind}: raw off-pointer write gave {err}"
            assert drive.report()[idx].write_pointer == 4096, f"{kind}: the pointer moved"
            out.append(f"{kind} device errno {errno.errorcode.get(err, err)}")
        finally:
            drive.close()
    return ", ".join(out)


@check("capacity-and-full")
def check_capacity(rig: Rig) -> str:
    import errno

    from engine.drives.blkzoned import ZonedBlockDrive
    from engine.drives.zoned import FULL, ZoneError

    drive = ZonedBlockDrive(rig.devices["nullb0"])
    try:
        idx = 0
        drive.reset(idx)
        chunk = b"c" * MiB
        for n in range(3):  # the capacity: 3 MiB of the 4 MiB zone
            drive.append(idx, n * MiB, chunk)
        try:
            drive.append(idx, 3 * MiB, b"d" * 4096)
        except ZoneError as exc:
            assert exc.errno_value in (errno.EIO, errno.ENOSPC), exc
        else:
            raise AssertionError("an append past the zone capacity was taken")
        zone = drive.report()[idx]
        assert zone.condition == FULL, zone
        assert drive.write_errors == 0
        return f"zone of capacity {zone.capacity} full after 3 MiB: {zone}"
    finally:
        drive.close()


@check("reset-finish-open-close")
def check_zone_management(rig: Rig) -> str:
    from engine.drives.blkzoned import ZonedBlockDrive
    from engine.drives.zoned import CLOSED, EMPTY, EXPLICIT_OPEN, FULL

    out = []
    for kind, dev in kinds(rig):
        drive = ZonedBlockDrive(dev)
        try:
            idx = 1
            drive.reset(idx)
            assert drive.report()[idx].condition == EMPTY, kind
            drive.open_zone(idx)
            assert drive.report()[idx].condition == EXPLICIT_OPEN, kind
            drive.append(idx, 0, b"z" * 4096, durable=True)
            drive.close_zone(idx)
            assert drive.report()[idx].condition == CLOSED, kind
            drive.finish_zone(idx)
            assert drive.report()[idx].condition == FULL, kind
            drive.reset(idx)
            zone = drive.report()[idx]
            assert (zone.condition, zone.write_pointer) == (EMPTY, 0), (kind, zone)
            out.append(kind)
        finally:
            drive.close()
    return "reset, open, close, finish on " + ", ".join(out)


def main() -> int:
    plan = json.loads(Path(sys.argv[1]).read_text())
    started = time.monotonic()
    load_modules(plan["module_tree"])
    devices: dict[str, str] = {}
    for name, attrs in plan["null_blk"].items():
        devices[name] = make_null_blk(name, attrs)
    runner = start_tcmu()
    for n, (name, spec) in enumerate(plan["zbc"].items()):
        devices[name] = make_zbc(name, spec["size_mib"], spec["options"], n + 1)
    for path in sorted(glob.glob("/sys/block/nvme*")):
        devices["nvme"] = f"/dev/{Path(path).name}"
        # Linux 6.1 writes a zoned device only under mq-deadline (zone write locking)
        (Path(path) / "queue" / "scheduler").write_text("mq-deadline\n")
    log(f"devices ready in {time.monotonic() - started:.1f} s")
    for dev in devices.values():
        log(describe(dev))
    rig = Rig(plan, devices)
    try:
        for name, fn in CHECKS:
            if plan.get("only") and name not in plan["only"]:
                continue
            began = time.monotonic()
            try:
                details = fn(rig)
                verdict = "PASS"
            except Exception as exc:  # noqa: BLE001 - reported as the check's failure
                details = f"{type(exc).__name__}: {exc} | " + traceback.format_exc()[-1500:]
                verdict = "FAIL"
            details = f"{details} ({time.monotonic() - began:.1f} s)".replace("\n", " | ")
            log(f"{CHECK_MARKER} {verdict} {name} {details}")
    finally:
        os.sync()
        remove_zbc()
        runner.terminate()
        runner.wait()
    return 0


if __name__ == "__main__":
    print("@@SHINGLE-VM BEGIN", flush=True)
    sys.exit(main())
