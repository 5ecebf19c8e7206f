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


CRASH_CHECK = "crash/recovery-after-power-loss"


class KillQemu(Exception):
    """Raised from the serial-line callback: run_vm kills qemu on its way out."""


def boot(kernel, tree, folder: Path, name: str, images, spec: dict, on_line=None):
    plan_file = folder / f"{name}.json"
    plan_file.write_text(json.dumps(spec))
    program = folder / f"{name}.sh"
    program.write_text(
        f"#!/bin/sh\nexport PYTHONPATH={zoned_rig.REPO}\n"
        f"exec {sys.executable} {zoned_rig.HERE / 'guest_zoned.py'} {plan_file}\n"
    )
    program.chmod(0o755)
    verbose = os.environ.get("SHINGLE_KERNEL_RIG_VERBOSE")

    def line(text: str) -> None:
        if verbose:
            print(text, file=sys.stderr)
        if on_line is not None:
            on_line(text)

    return vm.run_vm(
        program,
        kernel=kernel,
        workdir=folder / name,
        timeout=zoned_rig.VM_TIMEOUT_S,
        memory_mib=zoned_rig.VM_MEMORY_MIB,
        extra_args=zoned_rig.qemu_disks(images),
        on_line=line,
    )


@pytest.fixture(scope="module")
def zoned_results() -> ZonedRun:
    """Boot 1 runs the checks, then writes files on the ZBC disks and durable tails past the
    catalog, and qemu is killed; boot 2, on the same disk images, checks recovery."""
    try:
        vm.check_qemu()
        zoned_rig.check_tools()
    except vm.VmUnavailable as exc:
        pytest.skip(f"zoned rig: {exc}")
    kernel, tree = zoned_rig.kernels()
    folder = Path(tempfile.mkdtemp(prefix="shingle-zoned-rig-"))
    folder.chmod(0o755)
    seen: list[str] = []
    acked: list[str] = []

    def watch(text: str) -> None:
        seen.append(text)
        if text.startswith(f"{guest_zoned.ACK_MARKER}-END"):
            raise KillQemu()
        if text.startswith(f"{guest_zoned.ACK_MARKER} "):
            acked.append(text.split()[1])

    try:
        images = zoned_rig.make_images(folder / "images")
        spec = zoned_rig.plan(tree)
        crash = os.environ.get("SHINGLE_ZONED_CRASH") != "0" and (
            not spec["only"] or CRASH_CHECK in spec["only"]
        )
        spec["crash"] = crash
        try:
            result = boot(kernel, tree, folder, "vm", images, spec, watch)
        except KillQemu:
            result = vm.VmResult(None, seen, "", 0.0, extra={"killed": True})
        checks = vm.parse_checks(result.lines)
        if crash and result.extra.get("killed"):
            after = {**spec, "null_blk": {}, "crash": False, "after_crash": acked}
            # the bare backing file: any option would format it again
            after["zbc"] = {name: {**z, "options": ""} for name, z in spec["zbc"].items()}
            second = boot(kernel, tree, folder, "vm-after-crash", images, after)
            checks.update(vm.parse_checks(second.lines))
            if not vm.parse_checks(second.lines):
                result = second  # its output explains the missing check
    finally:
        if not os.environ.get("SHINGLE_KERNEL_RIG_KEEP"):
            shutil.rmtree(folder, ignore_errors=True)
    print(
        f"zoned rig: {len(checks)} checks, {sum(v == 'PASS' for v, _ in checks.values())} "
        f"passed, {len(acked)} files acknowledged before the kill",
        file=sys.stderr,
    )
    return ZonedRun(result, checks)


@pytest.mark.timeout(zoned_rig.VM_TIMEOUT_S + 300)
@pytest.mark.parametrize("check", [name for name, _ in guest_zoned.CHECKS] + [CRASH_CHECK])
def test_zoned_device(zoned_results, check):
    if os.environ.get("SHINGLE_ZONED_ONLY") and check not in os.environ["SHINGLE_ZONED_ONLY"]:
        pytest.skip("not in SHINGLE_ZONED_ONLY")
    if check == CRASH_CHECK and os.environ.get("SHINGLE_ZONED_CRASH") == "0":
        pytest.skip("SHINGLE_ZONED_CRASH=0 leaves out the second boot (2-3 minutes under TCG)")
    verdict, details = zoned_results.outcome(check)
    assert verdict == "PASS", f"{check}: {details}"
    print(f"{check}: {details}")
