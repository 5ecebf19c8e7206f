"""The small-file epoch with and without read delegations, as the Linux kernel client sends it.

Boots the kernel rig's VM (tests/kernel: vm.py, guest_nfs.py's delegation checks) once per
setting against a `shingle serve` of its own (the export's delegations on, then off with
`shingle exports set 1 --no-delegations`): the guest writes FILES small files on a vers=4.1
mount, mounts again, opens, reads and closes every file in three epochs, and reports the calls
the mount sent per epoch (/proc/self/mountstats) and the files it read per second. The figure
is the ratio of epoch 2's and epoch 3's calls with delegations to those without (the server's
work per epoch follows the calls: every call is a round trip). Under TCG the files per second
say how much the round trips cost there, not what a real machine reaches; the counts do not
depend on speed.

    .venv/bin/python bench/delegations.py [--files N] [--lease SECONDS] [--json]
"""

from __future__ import annotations

import argparse
import ast
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
# bench/engine.py would hide the engine package: the checkout's root instead of bench/
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path[:0] = [str(HERE.parent / "tests" / "kernel"), str(HERE.parent / "tests"), str(HERE.parent)]

import vm  # noqa: E402
from conftest import run_guest  # noqa: E402
from nfs_rig import DELEGATIONS, ShingleDaemon, write_as_second_client  # noqa: E402
from pgserver import free_port  # noqa: E402


def one_run(kernel, files: int, delegations: bool, lease: int) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="shingle-bench-deleg-"))
    folder.chmod(0o755)  # the guest reads the plan as another uid
    daemon = ShingleDaemon(folder / "appliance", free_port())
    try:
        daemon.init(portmap="off", lease_seconds=lease)
        if not delegations:
            subprocess.run(
                [sys.executable, "-m", "appliance.cli", "-c", str(daemon.config)]
                + ["exports", "set", "1", "--no-delegations"],
                check=True,
                capture_output=True,
            )
        daemon.start()

        def on_request(text: str) -> str:
            action, *args = text.split()
            if action == "deleg-write" and len(args) == 2:
                return write_as_second_client(daemon.port, args[0], bytes.fromhex(args[1]))
            return f"unknown request {text!r}"

        plan = {
            "port": daemon.port,
            "versions": [],
            "uids": [],
            "delegations": {
                **DELEGATIONS,
                "files": files,
                "write_check": False,
                "lease_seconds": lease,
            },
        }
        result, checks = run_guest(kernel, folder, plan, 1800, on_request)
        verdict, details = checks.get(
            f"{DELEGATIONS['label']}/delegations/second-epoch", ("FAIL", "no result")
        )
        epochs = [
            ast.literal_eval(part.split(" ", 2)[2].split(" (")[0])
            for part in details.split("; ")
            if part.startswith("epoch ")
        ]
        if not epochs:  # the check's own message holds them when it failed
            found = details[details.index("[{") : details.rindex("}]") + 2]
            epochs = ast.literal_eval(found)
        rates = [
            ast.literal_eval(part[len("files/s per epoch ") :])
            for part in details.split("; ")
            if part.startswith("files/s per epoch ")
        ]
        if not rates and "epochs took [" in details:  # a failed check gives the seconds
            took = details[details.index("epochs took [") + len("epochs took ") :]
            rates = [[round(files / s) for s in ast.literal_eval(took[: took.index("]") + 1])]]
        return {
            "delegations": delegations,
            "verdict": verdict,
            "epochs": epochs,
            "files_per_s": rates[0] if rates else [],
        }
    finally:
        daemon.stop()
        shutil.rmtree(folder, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=DELEGATIONS["files"])
    parser.add_argument(
        "--lease",
        type=int,
        default=90,
        help="the server's lease in seconds (default 90, shingle's default; the kernel rig "
        "runs 30): the Linux client returns a delegation unused since its last renewal, every "
        "2/3 of a lease, so an epoch longer than that keeps only its last files' delegations",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    kernel = vm.prepare_kernel(log=lambda text: print(text, file=sys.stderr))
    runs = [one_run(kernel, args.files, on, args.lease) for on in (True, False)]
    calls = {run["delegations"]: [sum(e.values()) for e in run["epochs"]] for run in runs}
    rates = {run["delegations"]: run["files_per_s"] for run in runs}
    report = {
        "files": args.files,
        "lease_seconds": args.lease,
        "calls_per_epoch_with": calls[True],
        "calls_per_epoch_without": calls[False],
        "files_per_s_with": rates[True],
        "files_per_s_without": rates[False],
        "ratio_epoch2": calls[True][1] / max(calls[False][1], 1),
        "ratio_epoch3": calls[True][2] / max(calls[False][2], 1),
        "runs": runs,
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{args.files} files, lease {args.lease} s, calls per epoch (/proc/self/mountstats):")
        print(f"  with delegations:    {calls[True]}")
        print(f"  without delegations: {calls[False]}")
        print("files per second per epoch (the guest's clock, under TCG: compare, not absolute):")
        print(f"  with delegations:    {rates[True]}")
        print(f"  without delegations: {rates[False]}")
        print(
            f"  ratio with/without: epoch 2 {report['ratio_epoch2']:.2f}, "
            f"epoch 3 {report['ratio_epoch3']:.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
