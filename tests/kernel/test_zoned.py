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
        plan_file.write_text(json.dumps(zoned_rig.plan(tree)))
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
