"""The zoned-device rig: one VM (vm.py) whose kernel has host-managed zoned disks of three
kinds, for guest_zoned.py to run shingle's zoned backend on.

- null_blk zoned disks (made in the guest through configfs): conventional zones, a zone
  capacity below the zone size, max open/active limits, fault injection;
- SCSI ZBC disks through tcmu-runner's file_zbc handler and the kernel's target_core_user +
  tcm_loop: the interface of real SMR drives; the backing files live on an ext4 image that is
  a virtio disk of the VM, so zones and write pointers survive a kill of qemu;
- a qemu NVMe zoned namespace (no persistent zone state in qemu 7.2).

The guest loads these drivers with modprobe from a module tree built here (the modules the
rig needs, out of the cached Debian kernel package, indexed by kmod's depmod) and bound at
/lib/modules/VERSION in the guest.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import vm

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
MiB = 1 << 20
# insmod'ed by the initramfs: the shared root, the results share, the virtio disk
BOOT_MODULES = (
    "virtio_pci",
    "virtio_net",
    "virtio_rng",
    "9p",
    "9pnet",
    "9pnet_virtio",
    "netfs",
    "fscache",
    "overlay",
    "virtio_blk",
)
# modprobe'd by the guest (dependencies follow from the module index)
GUEST_MODULES = (
    "configfs",
    "null_blk",
    "target_core_user",
    "tcm_loop",
    "sd_mod",
    "nvme",
    "ext4",
    "crc32c_generic",
)
ZNS_ZONE_MIB = 4
ZNS_SIZE_MIB = 64
ZBC_IMAGE_MIB = 256
VM_TIMEOUT_S = 900
VM_MEMORY_MIB = 1536


def check_tools() -> None:
    """The rig's host tools (Debian: tcmu-runner, kmod, e2fsprogs), else VmUnavailable."""
    for tool, package in (
        ("tcmu-runner", "tcmu-runner"),
        ("depmod", "kmod"),
        ("mkfs.ext4", "e2fsprogs"),
    ):
        if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists():
            raise vm.VmUnavailable(f"{tool} not found (Debian package {package})")


def kernels() -> tuple[vm.Kernel, Path]:
    """(the kernel with the initramfs modules, the guest's module tree /lib/modules/VERSION)."""
    boot = vm.prepare_kernel(BOOT_MODULES)
    full = vm.prepare_kernel(BOOT_MODULES + GUEST_MODULES)
    home = full.vmlinux.parent
    tree = home / "zoned-tree"
    version_dir = tree / "lib" / "modules" / full.version
    if not (version_dir / "modules.dep.bin").exists():
        import json

        index = json.loads((home / "modules.json").read_text())
        shutil.rmtree(tree, ignore_errors=True)
        for ko in full.modules:
            key = ko.name.removesuffix(".ko")
            rel = Path(index[key]["path"]).relative_to(Path("lib/modules") / full.version)
            dest = version_dir / rel.parent / f"{key}.ko"
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ko, dest)
        depmod = shutil.which("depmod") or "/usr/sbin/depmod"
        subprocess.run(
            [depmod, "-b", str(tree), full.version], check=True, capture_output=True, timeout=120
        )
    return boot, version_dir


def make_images(folder: Path) -> dict[str, Path]:
    """The VM's disks: an ext4 image for the ZBC backing files, a raw one for the NVMe ZNS."""
    folder.mkdir(parents=True, exist_ok=True)
    zbc = folder / "zbc-backing.ext4"
    if not zbc.exists():
        with open(zbc, "wb") as f:
            f.truncate(ZBC_IMAGE_MIB * MiB)
        mkfs = shutil.which("mkfs.ext4") or "/usr/sbin/mkfs.ext4"
        subprocess.run(
            [mkfs, "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", str(zbc)],
            check=True,
            timeout=120,
        )
    zns = folder / "zns.raw"
    if not zns.exists():
        with open(zns, "wb") as f:
            f.truncate(ZNS_SIZE_MIB * MiB)
    return {"zbc": zbc, "zns": zns}


def qemu_disks(images: dict[str, Path]) -> tuple[str, ...]:
    return (
        # cache=writeback: a kill of qemu keeps what the guest wrote to the image (the host's
        # page cache holds it) and loses what the guest's own page cache had not written out
        "-drive",
        f"file={images['zbc']},format=raw,if=virtio,cache=writeback",
        "-drive",
        f"file={images['zns']},id=zns,format=raw,if=none",
        "-device",
        "nvme,id=nvme0,serial=zns0",
        "-device",
        f"nvme-ns,drive=zns,bus=nvme0,nsid=1,zoned=true,zoned.zone_size={ZNS_ZONE_MIB}M,"
        f"zoned.zone_capacity={ZNS_ZONE_MIB - 1}M,zoned.max_open=6,zoned.max_active=8",
    )


# the disks of the VM: nullb0 for the raw backend checks, nullb1-6 for the data path, nullb7-14
# (1 conventional and 4 sequential zones) for the fault check, nullb15-17 (the same in 1 MiB
# zones) for the full-device check
NULL_BLK = {
    "nullb0": {"size": 64, "zone_nr_conv": 2},
    **{f"nullb{n}": {"size": 32, "zone_nr_conv": 1} for n in range(1, 7)},
    **{f"nullb{n}": {"size": 20, "zone_nr_conv": 1} for n in range(7, 15)},
    **{
        f"nullb{n}": {"size": 5, "zone_nr_conv": 1, "zone_size": 1, "zone_capacity": 1}
        for n in range(15, 18)
    },
}
NULL_BLK_COMMON = {
    "memory_backed": 1,
    "zoned": 1,
    "zone_size": 4,
    "zone_capacity": 3,
    "zone_max_open": 4,
    "zone_max_active": 6,
    "blocksize": 4096,
}
ZBC = {f"zbc{n}": {"size_mib": 32 if n else 64} for n in range(4)}
ZBC_OPTIONS = "model-HM/zsize-4/conv-2/open-4"


def plan(module_tree: Path) -> dict:
    """What guest_zoned.py makes and runs: its disks, and the checks to run (all by default)."""
    return {
        "module_tree": str(module_tree),
        "null_blk": {name: {**NULL_BLK_COMMON, **attrs} for name, attrs in NULL_BLK.items()},
        "zbc": {name: {**spec, "options": ZBC_OPTIONS} for name, spec in ZBC.items()},
        "only": [x for x in os.environ.get("SHINGLE_ZONED_ONLY", "").split(",") if x],
    }
