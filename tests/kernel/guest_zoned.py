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
        except FileExistsError:
            # EEXIST: the device is configured already (a try that reported EAGAIN reached
            # tcmu-runner after all: seen once in a run)
            break
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


@check("doctor/zoned-scheduler")
def check_doctor_scheduler(rig: Rig) -> str:
    """`shingle doctor` reads a zoned drive's scheduler from the kernel: "none" fails (the NVMe
    namespace's default), mq-deadline passes."""
    from appliance.host.doctor import check_zoned_schedulers

    dev = rig.devices["nvme"]
    drive = {"id": 1, "path": dev, "device": dev, "backend": "zoned-block", "state": "online"}
    scheduler = Path("/sys/block", Path(dev).name, "queue", "scheduler")
    scheduler.write_text("none\n")
    try:
        (bad,) = check_zoned_schedulers([drive])
    finally:
        scheduler.write_text("mq-deadline\n")
    (good,) = check_zoned_schedulers([drive])
    assert (bad.status, good.status) == ("fail", "ok"), (bad, good)
    return f"none: {bad.detail}; then {good.detail}"


# -- shingle's data path on the zoned disks -------------------------------------------------
DATA_DRIVES = [f"nullb{n}" for n in range(1, 7)] + ["zbc1", "zbc2", "zbc3", "nvme"]
WRITERS = 8
FILE_BYTES = 1536 * KiB
POLICIES = {name: {"fragment_size": 64 * KiB} for name in ("hot", "warm", "cold")}


class Shingle:
    """A catalog (SQLite on the guest's tmpfs), the zoned disks as drives, a DataPath."""

    def __init__(
        self,
        rig: Rig,
        name: str = "shingle-zoned",
        policies: dict = POLICIES,
        catalog_url: str | None = None,
    ):
        from engine.catalog import Catalog, upgrade
        from engine.coding.erasure import load_policies

        self.rig = rig
        if catalog_url is None:  # else one made already (shingle init)
            folder = Path("/tmp") / name
            folder.mkdir(exist_ok=True)
            catalog_url = f"sqlite:///{folder}/catalog.db"
            upgrade(catalog_url)
        self.catalog = Catalog(catalog_url)
        self.policies = load_policies(policies)
        self.data = self.ns = self.model = None

    def start(self):
        from engine.datapath import DataPath
        from engine.drives import SmrModel
        from engine.namespace import Namespace

        # a band of the model is a device zone: an append at a zone's pointer is sequential
        self.model = SmrModel(band_size=4 * MiB)
        self.data = DataPath(self.catalog, self.policies, reserve_zones=1, smr_model=self.model)
        self.ns = Namespace(self.catalog, data=self.data)
        return self

    def stop(self) -> None:
        if self.data is not None:
            self.data.close()
            self.data = None

    def backends(self):
        return {d.id: d.backend for d in self.data.space.drives.values()}


def active_zones(dev: str) -> tuple[int, int]:
    """(open, active) zones of a device now, by its own zone report."""
    from engine.drives.blkzoned import report_zones

    fd = os.open(dev, os.O_RDONLY)
    try:
        zones = report_zones(fd)
    finally:
        os.close(fd)
    conds = [z["cond"] for z in zones]
    opened = sum(c in (0x2, 0x3) for c in conds)
    return opened, opened + sum(c == 0x4 for c in conds)


def file_data(n: int) -> bytes:
    import random

    return random.Random(n).randbytes(FILE_BYTES)


@check("datapath/init-drives")
def check_init_drives(rig: Rig) -> str:
    """`shingle init DIR --drive DEV ...` on the ten data disks (each drive made by make_drive,
    as `drives add DEVICE` makes it): refused while a device holds written zones (the NVMe
    namespace, from the checks above; nothing is made), then, the zones reset, each device
    recorded with its own geometry; the data path checks below run on that catalog."""
    import contextlib
    import io

    from sqlalchemy import select

    from appliance import config as config_mod
    from appliance.cli import main
    from engine.admin.events import recent
    from engine.catalog.models import Drive

    home = Path("/tmp/shingle-init")
    devices = [rig.devices[role] for role in DATA_DRIVES]
    argv = ["init", str(home), *[a for dev in devices for a in ("--drive", dev)]]
    err = io.StringIO()
    began = time.monotonic()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        refused = main(argv)
    refused_s = time.monotonic() - began
    assert refused == 2 and "blkzone reset" in err.getvalue(), (refused, err.getvalue())
    assert not home.exists(), "a refused init made its folder"
    reset_all(devices)
    out = io.StringIO()
    began = time.monotonic()
    with contextlib.redirect_stdout(out):
        made = main(argv)
    made_s = time.monotonic() - began
    assert made == 0, out.getvalue()
    assert "10 zoned block devices" in out.getvalue(), out.getvalue()
    shingle = rig.state["shingle"] = Shingle(
        rig, catalog_url=config_mod.load(home / "shingle.toml").catalog_url
    )
    table = Drive.__table__
    rows = shingle.catalog.read(lambda conn: conn.execute(select(table)).all())
    got = {r.path: (r.backend, r.zone_size, r.zone_count, r.max_open_zones) for r in rows}
    (event,) = recent(shingle.catalog, 10, kind_prefix="appliance.init")
    want = {
        rig.devices["nullb1"]: ("zoned-block", 3 * MiB, 7, 4),  # 8 zones, 1 conventional
        rig.devices["zbc1"]: ("zoned-block", 4 * MiB, 6, 3),  # 8 zones, 2 conventional
        rig.devices["nvme"]: ("zoned-block", 3 * MiB, 16, 6),
    }
    assert sorted(got) == sorted(devices), got
    for path, row in want.items():
        assert got[path] == row, f"{path}: {got[path]}, expected {row}"
    assert sorted(event.details["zoned_devices"]) == sorted(devices), event.details
    return (
        f"refused with written zones in {refused_s:.1f} s: {err.getvalue().strip()!r}; then "
        f"{event.message} in {made_s:.1f} s: "
        + "; ".join(f"{p} {v}" for p, v in sorted(got.items()))
    )


@check("datapath/write-read-verify")
def check_write_read(rig: Rig) -> str:
    """8 writers store files through the namespace on the 10 zoned drives; every byte reads
    back, no write error, no off-pointer write, each device within its open/active limits
    (sampled from its zone report meanwhile), write amplification 1.000."""
    import threading

    from engine.namespace import ROOT

    shingle = rig.state["shingle"].start()
    ns = shingle.ns
    limits = {d.path: d.max_open_zones for d in shingle.data.space.drives.values()}
    peaks = dict.fromkeys(limits, (0, 0))
    done = threading.Event()

    def sample():
        while not done.is_set():
            for dev in limits:
                now = active_zones(dev)
                peaks[dev] = (max(peaks[dev][0], now[0]), max(peaks[dev][1], now[1]))
            time.sleep(0.05)

    failures = []

    def writer(w: int):
        try:
            for n in range(w, w + WRITERS * 2, WRITERS):
                ino = ns.create(ROOT, ns.root_ino, f"f{n}").ino
                data = file_data(n)
                for off in range(0, len(data), 256 * KiB):
                    ns.write(ino, off, data[off : off + 256 * KiB])
                ns.commit(ino)
        except Exception as exc:  # noqa: BLE001 - reported below
            failures.append(f"writer {w}: {exc!r}")

    sampler = threading.Thread(target=sample)
    sampler.start()
    began = time.monotonic()
    threads = [threading.Thread(target=writer, args=(w,)) for w in range(WRITERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.monotonic() - began
    done.set()
    sampler.join()
    assert not failures, failures
    files = WRITERS * 2
    rig.state["files"] = files
    for n in range(files):
        ino = ns.lookup(ROOT, ns.root_ino, f"f{n}").ino
        assert ns.read(ino, 0, FILE_BYTES) == file_data(n), f"f{n} reads back different"
    errors = {
        d.path: (d.backend.write_errors, d.backend.off_pointer_errors)
        for d in shingle.data.space.drives.values()
    }
    assert all(e == (0, 0) for e in errors.values()), f"write errors: {errors}"
    over = {
        dev: (peaks[dev], limit) for dev, limit in limits.items() if limit and peaks[dev][1] > limit
    }
    assert not over, f"open/active zones past the limit: {over}"
    model = shingle.model.report()
    wa, sequential = model["write_amplification"], model["sequential_append_share"]
    assert abs(wa - 1.0) < 1e-9, f"write amplification {wa}"
    assert sequential == 1.0, f"appends at a write pointer: {sequential}"
    return (
        f"{files} files of {FILE_BYTES} bytes by {WRITERS} writers in {seconds:.1f} s "
        f"({files * FILE_BYTES / seconds / 1e6:.2f} MB/s under TCG), WA {wa:.3f}, "
        f"peak (open, active) zones per device {sorted(peaks.values())}"
    )


@check("datapath/cleaning-resets-zones")
def check_cleaning(rig: Rig) -> str:
    """Deleting files and cleaning gives zones back with BLKRESETZONE: every zone the catalog
    calls empty is empty on its device."""
    from sqlalchemy import select

    from engine.catalog.models import Zone
    from engine.lifecycle.cleaning import clean
    from engine.namespace import ROOT

    shingle = rig.state["shingle"]
    ns = shingle.ns
    for n in range(0, rig.state["files"], 2):
        ns.unlink(ROOT, ns.root_ino, f"f{n}")
    shingle.data.flush_all()
    report = clean(shingle.data, shingle.catalog)
    assert report.zones_reset > 0, report
    zones = Zone.__table__
    rows = shingle.catalog.read(lambda conn: conn.execute(select(zones)).all())
    backends = shingle.backends()
    wrong = []
    for row in rows:
        info = backends[row.drive_id].report()[row.idx]
        if row.state == "empty" and (info.write_pointer, info.condition) != (0, "empty"):
            wrong.append((row.drive_id, row.idx, info))
    assert not wrong, f"catalog-empty zones not empty on the device: {wrong[:3]}"
    for n in range(1, rig.state["files"], 2):
        ino = ns.lookup(ROOT, ns.root_ino, f"f{n}").ino
        assert ns.read(ino, 0, FILE_BYTES) == file_data(n), f"f{n} differs after cleaning"
    return f"cleaning: {report.zones_cleaned} zones cleaned, {report.zones_reset} reset"


@check("datapath/restart-recovery")
def check_restart(rig: Rig) -> str:
    """A restart reads every zone's write pointer back from the devices: they match the
    catalog (no short zone), and the files read back."""
    from engine.namespace import ROOT

    shingle = rig.state["shingle"]
    shingle.stop()
    shingle.start()
    report = shingle.data.recovery_report
    assert not report.short_zones and not report.missing_drives, report
    ns = shingle.ns
    for n in range(1, rig.state["files"], 2):
        ino = ns.lookup(ROOT, ns.root_ino, f"f{n}").ino
        assert ns.read(ino, 0, FILE_BYTES) == file_data(n), f"f{n} differs after restart"
    return f"recovery: {report.as_dict()}"


@check("datapath/pointer-behind-catalog")
def check_short_zone(rig: Rig) -> str:
    """A zone whose device write pointer is behind what the catalog committed (a lost flush):
    the restart detects it, never appends there, and a scrub of the drive decodes its
    fragments from the other drives and writes them elsewhere; every file reads back."""
    from sqlalchemy import select

    from engine.catalog.models import Zone
    from engine.lifecycle.scrub import scrub
    from engine.namespace import ROOT

    shingle = rig.state["shingle"]
    zones = Zone.__table__
    victim = shingle.catalog.read(
        lambda conn: conn.execute(
            select(zones).where(zones.c.live_bytes > 0).order_by(zones.c.live_bytes.desc())
        ).first()
    )
    backend = shingle.backends()[victim.drive_id]
    shingle.stop()
    from engine.drives.blkzoned import ZonedBlockDrive

    device = ZonedBlockDrive(backend.device)
    try:
        device.reset(victim.idx)  # the device lost what the catalog committed there
    finally:
        device.close()
    shingle.start()
    short = shingle.data.recovery_report.short_zones
    assert (victim.drive_id, victim.idx) in [(d, i) for d, i, *_ in short], short
    result = scrub(shingle.data, shingle.catalog, drive_id=victim.drive_id)
    assert result.repaired > 0 and result.unrepairable == 0, result
    again = scrub(shingle.data, shingle.catalog, drive_id=victim.drive_id)
    assert again.bad == 0, again
    ns = shingle.ns
    for n in range(1, rig.state["files"], 2):
        ino = ns.lookup(ROOT, ns.root_ino, f"f{n}").ino
        assert ns.read(ino, 0, FILE_BYTES) == file_data(n), f"f{n} differs after the repair"
    shingle.stop()
    return (
        f"zone {victim.idx} of drive {victim.drive_id} ({victim.live_bytes} live bytes) reset "
        f"behind the catalog: short zones {short}; scrub repaired {result.repaired}, "
        f"a second scrub found {again.bad} bad"
    )


# -- faults and a full device, on the small null_blk disks ------------------------------------
FAULT_DRIVES = [f"nullb{n}" for n in range(7, 15)]
FAULT_POLICIES = {
    name: {"redundancy": "ec", "k": 2, "m": 3, "fragment_size": 64 * KiB}
    for name in ("hot", "warm", "cold")
}
FAULT_FILE_BYTES = 384 * KiB


def fault_data(n: int) -> bytes:
    import random

    return random.Random(5000 + n).randbytes(FAULT_FILE_BYTES)


def write_files(ns, names: list[str], data, writers: int) -> list[str]:
    """Each file written in 128 KiB pieces and committed, by ``writers`` threads; the failures."""
    import threading

    from engine.namespace import ROOT

    failures: list[str] = []

    def writer(w: int) -> None:
        for n in range(w, len(names), writers):
            try:
                ino = ns.create(ROOT, ns.root_ino, names[n]).ino
                payload = data(names[n])
                for off in range(0, len(payload), 128 * KiB):
                    ns.write(ino, off, payload[off : off + 128 * KiB])
                ns.commit(ino)
            except Exception as exc:  # noqa: BLE001 - reported by the caller
                failures.append(f"{names[n]}: {exc!r}")

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return failures


def null_blk_attr(dev: str, name: str, value: str) -> None:
    """Write a null_blk configfs attribute of the disk ``dev`` (its directory is its name)."""
    (NULLB / Path(dev).name / name).write_text(f"{value}\n")


class Tracebacks:
    """Counts log records that carry a traceback (exc_info), from any logger."""

    def __init__(self):
        import logging

        self.records: list = []
        outer = self

        class Handler(logging.Handler):
            def emit(self, record):
                if record.exc_info:
                    outer.records.append(record)

        self.handler = Handler()
        logging.getLogger().addHandler(self.handler)

    def close(self) -> None:
        import logging

        logging.getLogger().removeHandler(self.handler)


def wait_until(predicate, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.1)


@check("faults/zone-offline-readonly-badblocks-device-gone")
def check_faults(rig: Rig) -> str:
    """Eight small null_blk disks, 2+3 stripes: files written, then through configfs a zone
    holding fragments goes offline (disk A), sectors of a data fragment fail (B), the open zone
    of C goes read-only, and D is powered off. Every file reads back (decoded from the others),
    four more are written without an error (a fragment refused by C is done without, later
    stripes go to the drives left), A, B and C become degraded and D missing, each with a
    drive.state event; the devices' errors are counted (device_errors, in the metrics), none is
    an off-pointer write, no log record carries a traceback. A restart finds the read-only and
    offline zones in the devices' reports and every file still reads back."""
    from sqlalchemy import select

    from engine.admin.events import recent
    from engine.catalog.models import Fragment, Zone
    from engine.lifecycle.drives import get_drive
    from engine.lifecycle.replace import make_drive
    from engine.namespace import ROOT

    devices = [rig.devices[role] for role in FAULT_DRIVES]
    shingle = rig.state["faults"] = Shingle(rig, "shingle-faults", FAULT_POLICIES)
    for dev in devices:
        make_drive(shingle.catalog, dev, min_zone_size=64 * KiB)
    shingle.start()
    ns = shingle.ns
    first = [f"g{n}" for n in range(8)]
    failures = write_files(ns, first, lambda name: fault_data(int(name[1:])), 4)
    assert not failures, failures
    drives = {d.path: d for d in shingle.data.space.drives.values()}
    a, b, c, d = (drives[dev] for dev in devices[:4])
    zones, fragments = Zone.__table__, Fragment.__table__

    def live_zone(drive) -> int:
        return shingle.catalog.read(
            lambda conn: conn.execute(
                select(zones.c.idx)
                .where(zones.c.drive_id == drive.id, zones.c.live_bytes > 0)
                .order_by(zones.c.live_bytes.desc())
            ).first()
        )[0]

    def sector(drive, idx: int, offset: int = 0) -> int:
        return (drive.backend.report()[idx].start + offset) // 512

    offline_idx = live_zone(a)
    null_blk_attr(a.path, "zone_offline", str(sector(a, offline_idx)))
    bad = shingle.catalog.read(
        lambda conn: conn.execute(
            select(fragments.c.zone_offset, fragments.c.length, zones.c.idx)
            .join(zones, zones.c.id == fragments.c.zone_id)
            .where(fragments.c.drive_id == b.id, fragments.c.idx < 2)  # a data fragment
        ).first()
    )
    first_bad = sector(b, bad.idx, bad.zone_offset)
    null_blk_attr(b.path, "badblocks", f"+{first_bad}-{first_bad + bad.length // 512 - 1}")
    readonly_idx = next(iter(c.open.values())).idx  # where C's next fragment would go
    null_blk_attr(c.path, "zone_readonly", str(sector(c, readonly_idx)))
    null_blk_attr(d.path, "power", "0")
    Path("/proc/sys/vm/drop_caches").write_text("3\n")
    tracebacks = Tracebacks()
    try:
        for n in range(8):
            ino = ns.lookup(ROOT, ns.root_ino, f"g{n}").ino
            assert ns.read(ino, 0, FAULT_FILE_BYTES) == fault_data(n), f"g{n} reads back different"
        second = [f"g{n}" for n in range(8, 12)]
        failures = write_files(ns, second, lambda name: fault_data(int(name[1:])), 4)
        assert not failures, f"writes failed after the faults: {failures}"
        shingle.data.flush_all()
        for n in range(12):
            ino = ns.lookup(ROOT, ns.root_ino, f"g{n}").ino
            assert ns.read(ino, 0, FAULT_FILE_BYTES) == fault_data(n), f"g{n} reads back different"
        want = {a.id: "degraded", b.id: "degraded", c.id: "degraded", d.id: "missing"}

        def states():
            return {i: get_drive(shingle.catalog, i).state for i in want}

        wait_until(lambda: states() == want)
    finally:
        tracebacks.close()
    events = {
        (e.details or {}).get("drive_id"): e.message
        for e in recent(shingle.catalog, 100, kind_prefix="drive.state")
        if (e.details or {}).get("drive_id") in want
    }
    assert sorted(events) == sorted(want), events
    assert "the device reports the zone offline" in events[a.id], events
    assert "read_only" in events[c.id], events
    counters = shingle.data.counters()
    faults = {x.path: counters[f"drive_{x.id}_device_errors"] for x in (a, b, c)}
    assert all(n > 0 for n in faults.values()), faults
    off_pointer = {
        x.path: x.backend.off_pointer_errors for x in drives.values() if x.backend is not None
    }
    assert not any(off_pointer.values()), off_pointer
    assert not tracebacks.records, [r.getMessage() for r in tracebacks.records[:3]]
    lost = shingle.data.stats["fragments_lost_on_write"]
    assert lost >= 1, "no fragment was refused by the read-only zone"
    shingle.stop()
    shingle.start()
    report = shingle.data.recovery_report
    found = {(drive_id, idx): cond for drive_id, idx, cond in report.faulty_zones}
    assert found.get((a.id, offline_idx)) == "offline", report
    assert found.get((c.id, readonly_idx)) == "read_only", report
    assert d.id in report.missing_drives, report
    for n in range(12):
        ino = ns_lookup(shingle, f"g{n}")
        assert shingle.ns.read(ino, 0, FAULT_FILE_BYTES) == fault_data(n), f"g{n} after restart"
    shingle.stop()
    return (
        f"events {events}; device errors {faults}; fragments done without {lost}; "
        f"after a restart: faulty zones {report.faulty_zones}"
    )


def ns_lookup(shingle, name: str) -> int:
    from engine.namespace import ROOT

    return shingle.ns.lookup(ROOT, shingle.ns.root_ino, name).ino


FULL_DRIVES = ["nullb15", "nullb16", "nullb17"]  # 4 sequential zones of 1 MiB each
FULL_POLICIES = {
    name: {"redundancy": "ec", "k": 2, "m": 1, "fragment_size": 64 * KiB}
    for name in ("hot", "warm", "cold")
}


@check("enospc/full-devices")
def check_full(rig: Rig) -> str:
    """Three tiny null_blk disks (4 sequential zones of 1 MiB), 2+1 stripes: four writers store
    1 MiB files until the drives are full. The writer that meets the end gets ENOSPC (NFS4ERR_NOSPC
    over NFS), never EIO; every file whose commit returned reads back; no drive leaves online,
    no write error, no off-pointer write."""
    import errno

    from appliance.nfs.v4.const import ERRNO_TO_NFS4, NFS4ERR_NOSPC
    from engine.lifecycle.drives import list_drives
    from engine.lifecycle.replace import make_drive

    devices = [rig.devices[role] for role in FULL_DRIVES]
    shingle = Shingle(rig, "shingle-full", FULL_POLICIES)
    for dev in devices:
        make_drive(shingle.catalog, dev, min_zone_size=64 * KiB)
    shingle.start()
    ns = shingle.ns
    acked: list[str] = []
    errors_seen: list[OSError] = []
    import threading

    from engine.namespace import ROOT

    def writer(w: int) -> None:
        for n in range(w, 1000, 4):
            name = f"full{n}"
            try:
                ino = ns.create(ROOT, ns.root_ino, name).ino
                payload = full_data(n)
                for off in range(0, len(payload), 256 * KiB):
                    ns.write(ino, off, payload[off : off + 256 * KiB])
                ns.commit(ino)
            except OSError as exc:
                errors_seen.append(exc)
                return
            acked.append(name)

    began = time.monotonic()
    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.monotonic() - began
    codes = sorted({exc.errno for exc in errors_seen})
    assert codes == [errno.ENOSPC], [repr(e) for e in errors_seen]
    assert ERRNO_TO_NFS4[errno.ENOSPC] == NFS4ERR_NOSPC
    for name in acked:
        assert shingle.ns.read(ns_lookup(shingle, name), 0, MiB) == full_data(int(name[4:]))
    states = {d.path: d.state for d in list_drives(shingle.catalog)}
    assert set(states.values()) == {"online"}, states
    errors = {
        d.path: (d.backend.write_errors, d.backend.off_pointer_errors)
        for d in shingle.data.space.drives.values()
    }
    assert all(e == (0, 0) for e in errors.values()), errors
    shingle.stop()
    return (
        f"{len(acked)} files of 1 MiB acknowledged in {seconds:.1f} s, all read back; the "
        f"writers then got {errors_seen[0]!r}"
    )


def full_data(n: int) -> bytes:
    import random

    return random.Random(9000 + n).randbytes(MiB)


# -- bench/zoned.py ----------------------------------------------------------------------------
def reference_write(devices: list[str], per_device: int) -> float:
    """The devices' own pace: one thread per device writes ``per_device`` bytes of its sequential
    zones with O_DIRECT 1 MiB writes at the write pointer; returns the seconds taken."""
    import mmap
    import threading

    from engine.drives.blkzoned import ZonedBlockDrive

    def fill(dev: str) -> None:
        drive = ZonedBlockDrive(dev)
        buf = mmap.mmap(-1, MiB)
        buf.write(os.urandom(MiB))
        try:
            left, idx = per_device, 0
            while left > 0:
                base = drive.report()[idx].start
                for off in range(0, min(drive.zone_size, left), MiB):
                    os.pwrite(drive.fd, buf, base + off)
                left -= drive.zone_size
                idx += 1
            os.fsync(drive.fd)
        finally:
            buf.close()
            drive.close()

    began = time.monotonic()
    threads = [threading.Thread(target=fill, args=(dev,)) for dev in devices]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.monotonic() - began


def reset_all(devices: list[str]) -> None:
    from engine.drives.blkzoned import ZonedBlockDrive

    for dev in devices:
        drive = ZonedBlockDrive(dev)
        try:
            for idx in range(drive.zone_count):
                drive.reset(idx)
        finally:
            drive.close()


def run_bench(rig: Rig, spec: dict) -> dict:
    """The reference pace, then shingle's data path writing files on the same (reset) devices:
    MB/s of each, their ratio on media bytes, and the SMR model's write amplification."""
    import threading

    from engine.lifecycle.replace import make_drive
    from engine.namespace import ROOT

    devices = [rig.devices[role] for role in DATA_DRIVES]
    per_device = spec["per_device_mib"] * MiB
    cpu = time.process_time()  # this process's CPU, all its threads: the guest is shingle's host
    ref_s = reference_write(devices, per_device)
    ref_cpu = time.process_time() - cpu
    reset_all(devices)
    shingle = Shingle(rig)
    for dev in devices:
        make_drive(shingle.catalog, dev)
    shingle.start()
    ns = shingle.ns
    files = spec["files"]
    size = per_device * len(devices) * 8 // 10 // files  # 8+2: the same media bytes, about
    payload = os.urandom(size)

    def writer(w: int) -> None:
        for n in range(w, files, WRITERS):
            ino = ns.create(ROOT, ns.root_ino, f"b{n}").ino
            for off in range(0, size, MiB):
                ns.write(ino, off, payload[off : off + MiB])
            ns.commit(ino)

    began, cpu = time.monotonic(), time.process_time()
    threads = [threading.Thread(target=writer, args=(w,)) for w in range(WRITERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    shingle.data.flush_all()
    shingle_s = time.monotonic() - began
    shingle_cpu = time.process_time() - cpu
    model = shingle.model.report()
    shingle.stop()
    ref_bytes = per_device * len(devices)
    media = model["host_write_bytes"]
    return {
        "devices": len(devices),
        "reference_bytes": ref_bytes,
        "reference_s": round(ref_s, 2),
        "reference_MBps": round(ref_bytes / ref_s / 1e6, 2),
        "user_bytes": size * files,
        "media_bytes": media,
        "shingle_s": round(shingle_s, 2),
        "shingle_user_MBps": round(size * files / shingle_s / 1e6, 2),
        "shingle_media_MBps": round(media / shingle_s / 1e6, 2),
        "ratio_media": round((media / shingle_s) / (ref_bytes / ref_s), 3),
        # guest CPU seconds per MiB written to the media (emulated CPU under TCG)
        "reference_cpu_s_per_MiB": round(ref_cpu / (ref_bytes / MiB), 4),
        "shingle_cpu_s_per_MiB": round(shingle_cpu / (media / MiB), 4),
        "write_amplification": round(model["write_amplification"], 6),
        "sequential_append_share": round(model["sequential_append_share"], 6),
    }


# -- power loss on the ZBC disks (two boots: test_zoned.py kills qemu mid-write) -------------
CRASH_DRIVES = ["zbc1", "zbc2", "zbc3"]
CRASH_POLICIES = {
    name: {"redundancy": "ec", "k": 2, "m": 1, "fragment_size": 64 * KiB}
    for name in ("hot", "warm", "cold")
}
ACK_MARKER = "@@ACK"
CRASH_FILE_BYTES = 200 * KiB
CRASH_FILES = 6


class CrashShingle(Shingle):
    """shingle with its catalog on the ext4 disk, which survives the kill as the ZBC files do."""

    def __init__(self, rig: Rig):
        from engine.catalog import Catalog, upgrade
        from engine.coding.erasure import load_policies

        self.rig = rig
        url = f"sqlite:///{ZBC_MOUNT}/crash-catalog.db"
        upgrade(url)
        self.catalog = Catalog(url)
        self.policies = load_policies(CRASH_POLICIES)
        self.data = self.ns = self.model = None


def crash_writes(rig: Rig) -> None:
    """Write and commit files on the ZBC disks, one ACK line per committed file, until qemu
    is killed; the guest's page cache is not written back meanwhile (only fsync'd bytes
    survive)."""
    from engine.lifecycle.replace import make_drive
    from engine.namespace import ROOT

    devices = [rig.devices[role] for role in CRASH_DRIVES]
    reset_all(devices)
    Path("/proc/sys/vm/dirty_writeback_centisecs").write_text("0\n")
    Path("/proc/sys/vm/dirty_expire_centisecs").write_text("360000\n")
    shingle = CrashShingle(rig)
    for dev in devices:
        make_drive(shingle.catalog, dev)
    shingle.start()
    ns = shingle.ns
    import threading

    stop = threading.Event()

    def writer(w: int) -> None:
        for n in range(w, 1 << 30, 3):
            if stop.is_set():
                return
            ino = ns.create(ROOT, ns.root_ino, f"c{n}").ino
            data = crash_data(n)
            for off in range(0, len(data), 64 * KiB):
                ns.write(ino, off, data[off : off + 64 * KiB])
            ns.commit(ino)
            log(f"{ACK_MARKER} c{n}")
            if n >= CRASH_FILES:
                stop.set()

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # a flush that reached the disks and never committed (the crash came between): bytes past
    # the catalog's pointer in each drive's open zone, on stable storage
    for drive in shingle.data.space.drives.values():
        zone = next(iter(drive.open.values()))
        drive.backend.append(zone.idx, zone.wp, os.urandom(64 * KiB), durable=True)
    log(f"{ACK_MARKER}-END tails written; kill now")
    while True:  # more unsynced writes while qemu dies: lost with the guest's page cache
        time.sleep(1)


def crash_data(n: int) -> bytes:
    import random

    return random.Random(1000 + n).randbytes(CRASH_FILE_BYTES)


def after_crash(rig: Rig, acked: list[str]) -> str:
    """The boot after the kill: recovery reads every zone's pointer back from the ZBC disks,
    tails past the catalog are garbage, no zone is behind it, every acknowledged file reads
    back whole."""
    from engine.namespace import ROOT

    shingle = CrashShingle(rig).start()
    report = shingle.data.recovery_report
    assert not report.short_zones and not report.missing_drives, report
    assert report.zones_with_garbage >= len(CRASH_DRIVES), report
    assert report.garbage_bytes >= len(CRASH_DRIVES) * 64 * KiB, report
    ns = shingle.ns
    # new appends go after the tails: a file written now reads back too
    ino = ns.create(ROOT, ns.root_ino, "after").ino
    ns.write(ino, 0, crash_data(-1))
    ns.commit(ino)
    assert ns.read(ino, 0, CRASH_FILE_BYTES) == crash_data(-1)
    for name in acked:
        ino = ns.lookup(ROOT, ns.root_ino, name).ino
        n = int(name[1:])
        assert ns.read(ino, 0, CRASH_FILE_BYTES) == crash_data(n), f"{name} differs"
    shingle.stop()
    return f"{len(acked)} acknowledged files read back; recovery {report.as_dict()}"


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
        if plan.get("after_crash") is not None:
            name = "crash/recovery-after-power-loss"
            try:
                log(f"{CHECK_MARKER} PASS {name} {after_crash(rig, plan['after_crash'])}")
            except Exception as exc:  # noqa: BLE001 - reported as the check's failure
                trace = traceback.format_exc()[-1500:].replace("\n", " | ")
                log(f"{CHECK_MARKER} FAIL {name} {exc!r} | {trace}")
            return 0
        if plan.get("bench"):
            log("@@BENCH " + json.dumps(run_bench(rig, plan["bench"])))
            return 0
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
        if plan.get("crash"):
            crash_writes(rig)  # until the host kills qemu
    finally:
        os.sync()
        remove_zbc()
        runner.terminate()
        runner.wait()
    return 0


if __name__ == "__main__":
    print("@@SHINGLE-VM BEGIN", flush=True)
    sys.exit(main())
