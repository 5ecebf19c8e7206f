"""The kernel NFS client rig: one VM boot per test session runs every check of
guest_nfs.py against `shingle serve`; each check is then its own test (test_kernel_nfs.py).

- ``shingle_daemon``: `shingle init` with ten small emulated drives, the export limited to
  127.0.0.1 (where qemu's user-mode network delivers the VM's traffic) without root
  squashing, then `shingle serve --no-web` in a subprocess; ``restart()`` stops and starts it
  on the same port (the guest asks for that over the serial line); it serves the port mapper
  on the host's 127.0.0.1:111, where the guest's lockd finds NLM (else the v3 lock checks skip).
- ``kernel_nfs_results``: boots the VM once (vm.py); {check name: (PASS|FAIL|SKIP, details)}.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import vm
from nfs_rig import (
    COPY_OFFLOAD_MIB_S,
    HERE,
    KRB5_GUEST,
    KRB5_IDMAP_DOMAIN,
    KRB5_TIMEOUT_S,
    VM_TIMEOUT_S,
    InBackground,
    NlmCallbackPorts,
    ShingleDaemon,
    krb5_plan,
    plan_for,
    read_as_second_client,
    root_squash_plan,
    stat_as_second_client,
    write_as_second_client,
)
from pgserver import free_port


@pytest.fixture(scope="session")
def vm_kernel() -> vm.Kernel:
    try:
        vm.check_qemu()
    except vm.VmUnavailable as exc:
        print(f"kernel rig skipped: {exc}", file=sys.stderr)
        pytest.skip(f"kernel rig: {exc}")
    return vm.prepare_kernel(log=lambda text: print(text, file=sys.stderr, flush=True))


@pytest.fixture(scope="session")
def kernel_rig_dir():
    # world-readable (pytest's tmp_path is not): the guest's unprivileged user runs from it
    folder = Path(tempfile.mkdtemp(prefix="shingle-kernel-rig-"))
    folder.chmod(0o755)
    yield folder
    if os.environ.get("SHINGLE_KERNEL_RIG_KEEP"):
        print(f"kernel rig: kept {folder} (console.log, serve-*.log)", file=sys.stderr)
    else:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def nlm_callback_ports() -> NlmCallbackPorts:
    return NlmCallbackPorts.pick()


@pytest.fixture(scope="session")
def shingle_daemon(kernel_rig_dir, nlm_callback_ports):
    # asynchronous COPYs paced so that the guest's copy-offload-restart check meets one
    # running; NLM_GRANTED sent to the guest through qemu's forwards (NlmCallbackPorts)
    daemon = ShingleDaemon(kernel_rig_dir / "appliance", free_port()).init(
        nfs_options=f"copy_offload_mib_s = {COPY_OFFLOAD_MIB_S}\n"
        + nlm_callback_ports.config_line()
    )
    # counters sampled every 2 s: the copy-offload check reads the daemon's from its samples
    text = daemon.config.read_text()
    assert "metrics_interval_s = 10.0" in text
    daemon.config.write_text(text.replace("metrics_interval_s = 10.0", "metrics_interval_s = 2.0"))
    daemon.start()
    yield daemon
    daemon.stop()
    shutil.rmtree(daemon.home / "drives", ignore_errors=True)


class RigRun:
    def __init__(self, result: vm.VmResult, checks: dict[str, tuple[str, str]], server_log: str):
        self.result, self.checks, self.server_log = result, checks, server_log

    def outcome(self, name: str) -> tuple[str, str]:
        """(PASS, FAIL or SKIP, details) of a check."""
        if name in self.checks:
            return self.checks[name]
        why = (
            "the VM timed out"
            if self.result.timed_out
            else f"guest exit status {self.result.exit_status}"
        )
        tail = "\n".join(self.result.lines[-20:])
        return (
            "FAIL",
            f"no result ({why}); guest output tail:\n{tail}\n"
            f"console tail:\n{self.result.console[-3000:]}",
        )


def run_guest(
    vm_kernel,
    folder: Path,
    plan: dict,
    timeout: float,
    on_request=None,
    hostname=None,
    host_forwards: tuple[int | tuple[int, int], ...] = (),
):
    """Boot the VM once to run guest_nfs.py with ``plan``: (VmResult, {check: (verdict,
    details)}). ``host_forwards``: host ports forwarded to the guest (vm.run_vm)."""
    guest = folder / "guest"
    guest.mkdir()
    shutil.copy(HERE / "guest_nfs.py", guest / "guest_nfs.py")
    plan_file = guest / "plan.json"
    plan_file.write_text(json.dumps(plan))
    program = guest / "run.sh"
    program.write_text(f"#!/bin/sh\nexec /usr/bin/python3 {guest / 'guest_nfs.py'} {plan_file}\n")
    for path in guest.iterdir():
        path.chmod(0o755)
    verbose = os.environ.get("SHINGLE_KERNEL_RIG_VERBOSE")
    result = vm.run_vm(
        program,
        kernel=vm_kernel,
        workdir=folder / "vm",
        requests=on_request,
        timeout=timeout,
        hostname=hostname,
        host_cache="loose",  # the guest reads only what was written before it boots
        host_forwards=host_forwards,
        on_line=(lambda line: print(line, file=sys.stderr)) if verbose else None,
    )
    checks = result.checks()
    verdicts = [verdict for verdict, _ in checks.values()]
    print(
        f"kernel rig: VM ran {result.seconds:.0f} s, {len(checks)} checks, "
        f"{verdicts.count('PASS')} passed, {verdicts.count('SKIP')} skipped",
        file=sys.stderr,
    )
    return result, checks


@pytest.fixture(scope="session")
def kernel_nfs_results(vm_kernel, kernel_rig_dir, shingle_daemon, nlm_callback_ports) -> RigRun:
    skip_locks = shingle_daemon.portmap_problem()
    if skip_locks:
        print(f"kernel rig: NLM lock checks skipped: {skip_locks}", file=sys.stderr)

    def on_request(text: str) -> str:
        # "restart-server", "snapshot-create|snapshot-delete PATH NAME", "dataset-clone
        # SNAPSHOT PATH" (paths in the namespace), or
        # "root-squash-ready" (the root-squash checks' daemon started: "ready", or why not),
        # "deleg-write PATH HEX" (PATH in the export: another client writes it), "deleg-stat
        # PATH", "deleg-read PATH" (another client's stat, read), or
        # "offload-stats" (the daemon's asynchronous COPY counters)
        action, *args = text.split()
        try:
            if action == "root-squash-ready" and not args:
                return squashed_ready.wait()
            if action == "restart-server" and not args:
                return shingle_daemon.restart()
            if action == "snapshot-create" and len(args) == 2:
                return shingle_daemon.snapshot_create(*args)
            if action == "snapshot-delete" and len(args) == 2:
                return shingle_daemon.snapshot_delete(*args)
            if action == "dataset-clone" and len(args) == 2:
                return shingle_daemon.dataset_clone(*args)
            if action == "deleg-write" and len(args) == 2:
                return write_as_second_client(shingle_daemon.port, args[0], bytes.fromhex(args[1]))
            if action == "deleg-stat" and len(args) == 1:
                return stat_as_second_client(shingle_daemon.port, args[0])
            if action == "deleg-read" and len(args) == 1:
                return read_as_second_client(shingle_daemon.port, args[0])
            if action == "offload-stats" and not args:
                return shingle_daemon.offload_counts()
        except Exception as exc:  # noqa: BLE001 - the guest reports it as its check's failure
            return f"{action} failed: {exc}"
        return f"unknown request {text!r}"

    # the NFSv4.0 delegation mount's callback service: the guest listens on this port, and
    # qemu forwards the host's 127.0.0.1 to it (the mount says clientaddr=127.0.0.1)
    callback_port = free_port()
    plan = plan_for(shingle_daemon.port, skip_locks, callback_port, nlm_callback_ports.lockd)
    # the same boot runs the root-squash checks against a daemon of their own
    # (root_squash_plan), made and started while the VM boots and runs the other checks: the
    # guest asks "root-squash-ready" before its first root-squash mount
    squashed = ShingleDaemon(kernel_rig_dir / "root-squash" / "appliance", free_port())
    squashed_ready = InBackground(lambda: start_root_squash_daemon(squashed))
    try:
        plan.update(root_squash_plan(squashed.port))
        result, checks = run_guest(
            vm_kernel,
            kernel_rig_dir,
            plan,
            VM_TIMEOUT_S,
            on_request,
            host_forwards=(callback_port, *nlm_callback_ports.host_forwards()),
        )
    finally:
        squashed_ready.wait()  # not started after the stop
        squashed.stop()
        shutil.rmtree(squashed.home / "drives", ignore_errors=True)
    return RigRun(result, checks, shingle_daemon.log() + squashed.log())


def start_root_squash_daemon(daemon: ShingleDaemon) -> None:
    """``daemon`` serving `shingle init`'s default export (root squashed, the root 1777 and
    owned by the anonymous user) for the root-squash checks; no port mapper (the v3 mount uses
    nolock), so it runs beside shingle_daemon. The caller stops it."""
    daemon.home.parent.mkdir()
    daemon.init(squash="root_squash", portmap="off")
    daemon.start()


@pytest.fixture(scope="session")
def root_squash_results(kernel_nfs_results) -> RigRun:
    """The root-squash checks ran in the main VM boot (kernel_nfs_results), against a daemon of
    their own (root_squash_daemon): a boot and a guest start fewer."""
    return kernel_nfs_results


@pytest.fixture(scope="session")
def krb5_results(kernel_rig_dir) -> RigRun:
    """A VM run of the Kerberos checks: a KDC of its own realm on the host, a daemon whose
    default export allows krb5, krb5i and krb5p only and squashes root (root on the guest uses
    the machine key), rpc.gssd in the guest with the guest's machine key and a user's ticket;
    the guest also loads rpcsec_gss_krb5 and cts."""
    from kdcserver import SERVER_HOST, KdcServer

    try:
        vm.check_qemu()
    except vm.VmUnavailable as exc:
        pytest.skip(f"kernel rig: {exc}")
    if not Path("/usr/sbin/rpc.gssd").exists():
        pytest.skip("kernel rig: rpc.gssd (nfs-common) is not installed")
    kernel = vm.prepare_kernel(
        vm.NFS_CLIENT_MODULES + ("rpcsec_gss_krb5", "cts"),
        log=lambda text: print(text, file=sys.stderr, flush=True),
    )
    folder = kernel_rig_dir / "krb5"
    folder.mkdir()
    kdc = KdcServer().start()
    try:
        kdc.add_service(f"nfs/{KRB5_GUEST}", kdc.dir / "guest.keytab")
        kdc.add_user("daemon")
        for path in (kdc.dir, kdc.dir / "guest.keytab", kdc.client_keytab):
            path.chmod(0o755 if path.is_dir() else 0o644)  # read in the guest through the share
        daemon = ShingleDaemon(folder / "appliance", free_port())
        daemon.init(
            squash="root_squash",
            portmap="off",
            sec="krb5:krb5i:krb5p",
            nfs_options=(
                f'krb5_keytab = "{kdc.server_keytab}"\n'
                f'krb5_principal = "nfs@{SERVER_HOST}"\n'
                f'idmap_domain = "{KRB5_IDMAP_DOMAIN}"\n'
            ),
        )
        daemon.start()
        try:
            result, checks = run_guest(
                kernel, folder, krb5_plan(daemon.port, kdc), KRB5_TIMEOUT_S, hostname=KRB5_GUEST
            )
        finally:
            daemon.stop()
            shutil.rmtree(daemon.home / "drives", ignore_errors=True)
    finally:
        kdc.stop()
    return RigRun(result, checks, daemon.log())
