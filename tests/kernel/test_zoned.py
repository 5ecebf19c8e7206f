"""shingle's zoned backend (engine/drives/blkzoned.py) and data path on kernel zoned block
devices: one VM boot (zoned_rig.py) runs every check of guest_zoned.py on null_blk, SCSI ZBC
(tcmu-runner) and NVMe ZNS disks; each check is then its own test."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import guest_zoned
import pytest
import vm
import zoned_rig

MIB = 1 << 20
# the disks of the VM: nullb0 for the raw backend checks, the others for the data path
NULL_BLK = {
    "nullb0": {"size": 64, "zone_nr_conv": 2},
    **{f"nullb{n}": {"size": 32, "zone_nr_conv": 1} for n in range(1, 7)},
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
    return {
        "module_tree": str(module_tree),
        "null_blk": {name: {**NULL_BLK_COMMON, **attrs} for name, attrs in NULL_BLK.items()},
        "zbc": {name: {**spec, "options": ZBC_OPTIONS} for name, spec in ZBC.items()},
        "only": [x for x in os.environ.get("SHINGLE_ZONED_ONLY", "").split(",") if x],
    }


class ZonedRun:
    def __init__(self, result: vm.VmResult, checks: dict[str, tuple[str, str]]):
        self.result, self.checks = result, checks

    def outcome(self, name: str) -> tuple[str, str]:
        if name in self.checks:
            return self.checks[name]
        why = (
            "the VM timed out"
            if self.result.timed_out
            else (f"guest exit status {self.result.exit_status}")
        )
        tail = "\n".join(self.result.lines[-30:])
        return (
            "FAIL",
            f"no result ({why}); guest output tail:\n{tail}\n"
            f"console tail:\n{self.result.console[-3000:]}",
        )


@pytest.fixture(scope="module")
def zoned_results() -> ZonedRun:
    try:
        vm.check_qemu()
        zoned_rig.check_tools()
    except vm.VmUnavailable as exc:
        pytest.skip(f"zoned rig: {exc}")
    boot, tree = zoned_rig.kernels()
    folder = Path(tempfile.mkdtemp(prefix="shingle-zoned-rig-"))
    folder.chmod(0o755)
    try:
        images = zoned_rig.make_images(folder / "images")
        plan_file = folder / "plan.json"
        plan_file.write_text(json.dumps(plan(tree)))
        program = folder / "run.sh"
        program.write_text(
            f"#!/bin/sh\nexport PYTHONPATH={zoned_rig.REPO}\n"
            f"exec {sys.executable} {zoned_rig.HERE / 'guest_zoned.py'} {plan_file}\n"
        )
        program.chmod(0o755)
        verbose = os.environ.get("SHINGLE_KERNEL_RIG_VERBOSE")
        result = vm.run_vm(
            program,
            kernel=boot,
            workdir=folder / "vm",
            timeout=zoned_rig.VM_TIMEOUT_S,
            memory_mib=zoned_rig.VM_MEMORY_MIB,
            extra_args=zoned_rig.qemu_disks(images),
            on_line=(lambda line: print(line, file=sys.stderr)) if verbose else None,
        )
    finally:
        if not os.environ.get("SHINGLE_KERNEL_RIG_KEEP"):
            shutil.rmtree(folder, ignore_errors=True)
    checks = {}
    for line in result.lines:
        if line.startswith(guest_zoned.CHECK_MARKER):
            _, verdict, name, *details = line.split(" ", 3)
            checks[name] = (verdict, details[0] if details else "")
    print(
        f"zoned rig: VM ran {result.seconds:.0f} s, {len(checks)} checks, "
        f"{sum(v == 'PASS' for v, _ in checks.values())} passed",
        file=sys.stderr,
    )
    return ZonedRun(result, checks)


@pytest.mark.timeout(zoned_rig.VM_TIMEOUT_S + 300)
@pytest.mark.parametrize("check", [name for name, _ in guest_zoned.CHECKS])
def test_zoned_device(zoned_results, check):
    if os.environ.get("SHINGLE_ZONED_ONLY") and check not in os.environ["SHINGLE_ZONED_ONLY"]:
        pytest.skip("not in SHINGLE_ZONED_ONLY")
    verdict, details = zoned_results.outcome(check)
    assert verdict == "PASS", f"{check}: {details}"
    print(f"{check}: {details}")
