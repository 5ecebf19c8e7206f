"""shingle's data path on kernel zoned block devices against the devices' own pace.

Boots the zoned rig's VM (tests/kernel/zoned_rig.py: six null_blk disks, three SCSI ZBC disks
through tcmu-runner, an NVMe zoned namespace) and in it:
- the reference: one thread per device writes PER_DEVICE MiB of its sequential zones with
  O_DIRECT 1 MiB writes at the write pointer, then an fsync (the device's own pace);
- the zones are reset, the devices become shingle drives (`drives add`), and 8 writers store
  files through the namespace (8+2 stripes of 64 KiB fragments) of about the same media bytes.
Reports MB/s of both, the ratio on media bytes (shingle's media MB/s / the reference's), the
guest CPU seconds per media MiB of each, and the write amplification and sequential-append
share the SMR model counts (must be 1.000: every append at a write pointer). Under TCG (no
KVM) both are bound by the emulated CPU: the ratio says what shingle's own work costs beside
the device writes, not what a disk would do.

    .venv/bin/python bench/zoned.py [--per-device MIB] [--files N] [--json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "kernel"))

import vm  # noqa: E402
import zoned_rig  # noqa: E402

BENCH_MARKER = "@@BENCH "


def run(per_device_mib: int, files: int) -> dict:
    vm.check_qemu()
    zoned_rig.check_tools()
    boot, tree = zoned_rig.kernels()
    folder = Path(tempfile.mkdtemp(prefix="shingle-zoned-bench-"))
    folder.chmod(0o755)
    try:
        images = zoned_rig.make_images(folder / "images")
        spec = zoned_rig.plan(tree)
        spec["bench"] = {"per_device_mib": per_device_mib, "files": files}
        (folder / "plan.json").write_text(json.dumps(spec))
        program = folder / "run.sh"
        program.write_text(
            f"#!/bin/sh\nexport PYTHONPATH={zoned_rig.REPO}\n"
            f"exec {sys.executable} {zoned_rig.HERE / 'guest_zoned.py'} {folder / 'plan.json'}\n"
        )
        program.chmod(0o755)
        result = vm.run_vm(
            program,
            kernel=boot,
            workdir=folder / "vm",
            timeout=zoned_rig.VM_TIMEOUT_S,
            memory_mib=zoned_rig.VM_MEMORY_MIB,
            extra_args=zoned_rig.qemu_disks(images),
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    for line in result.lines:
        if line.startswith(BENCH_MARKER):
            return {**json.loads(line[len(BENCH_MARKER) :]), "vm_s": round(result.seconds, 1)}
    tail = "\n".join(result.lines[-20:])
    raise RuntimeError(f"the VM gave no result (exit {result.exit_status}):\n{tail}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--per-device", type=int, default=12, help="MiB per device (default 12)")
    parser.add_argument("--files", type=int, default=16, help="files shingle writes (default 16)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    try:
        figures = run(args.per_device, args.files)
    except (vm.VmUnavailable, RuntimeError) as exc:
        print(f"bench/zoned.py: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    print(
        f"reference (O_DIRECT at the write pointer, {figures['devices']} devices): "
        f"{figures['reference_MBps']} MB/s\n"
        f"shingle: {figures['shingle_user_MBps']} MB/s of user data, "
        f"{figures['shingle_media_MBps']} MB/s on the media\n"
        f"ratio (media MB/s, shingle / reference): {figures['ratio_media']}\n"
        f"guest CPU per media MiB: reference {figures['reference_cpu_s_per_MiB']} s, "
        f"shingle {figures['shingle_cpu_s_per_MiB']} s\n"
        f"write amplification (SMR model): {figures['write_amplification']:.3f}, "
        f"appends at a write pointer: {figures['sequential_append_share']:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
