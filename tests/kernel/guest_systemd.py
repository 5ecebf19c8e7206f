"""Runs inside the VM booted with systemd as PID 1 (vm.run_vm(systemd=True)), as root, with
the host's /usr/bin/python3 and the standard library only: the appliance path an admin
takes, one marker line per step.

    @@CHECK PASS|FAIL NAME details

`shingle install` from the checkout (a venv in /opt/shingle on the guest's overlay root),
`shingle doctor`, `drives add` before the start and through the running daemon, a drive
path outside the daemon's sandbox refused, `systemctl start shingle.target` (Type=notify:
active only after READY=1), an NFSv4.1 mount over the guest's loopback, SMB on port 445
(smbclient puts and gets a file through shingle-smbd.service, root, over the mount it hands
to the daemon running as the service user), the web UI, the watchdog past WatchdogSec,
kill -9 then Restart=on-failure (and SMB again over the new daemon), and `systemctl stop`;
then the storage role beside the head (`install --role head,storage`: shingle-agent.service
answers a head's HELLO) and `shingle uninstall` (the agent's unit gone, its drives kept).
A step that fails leaves the ones that need it failed with the reason; the units' journal is
printed at the end.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import traceback
import urllib.error
import urllib.request

CHECK_MARKER = "@@CHECK"
CHECKS = (
    "install",
    "doctor",
    "drives-add",
    "start-ready",
    "drives-add-running",
    "drive-outside-sandbox-refused",
    "nfs-mount",
    "smb-put-get",
    "webui",
    "watchdog",
    "restart-after-kill",
    "smb-after-restart",
    "stop-clean",
    "storage-role",
    "uninstall",
)
# what each step needs to have passed
NEEDS = {
    "doctor": "install",
    "drives-add": "install",
    "start-ready": "drives-add",
    "drives-add-running": "start-ready",
    "drive-outside-sandbox-refused": "start-ready",
    "nfs-mount": "start-ready",
    "smb-put-get": "start-ready",
    "smb-after-restart": "restart-after-kill",
    "webui": "start-ready",
    "watchdog": "start-ready",
    "restart-after-kill": "start-ready",
    "stop-clean": "start-ready",
    "storage-role": "install",
    "uninstall": "install",
}
NFSD, WEBUI, TARGET = "shingle-nfsd.service", "shingle-webui.service", "shingle.target"
SMBD = "shingle-smbd.service"
AGENT = "shingle-agent.service"
AGENT_ADDRESS = "127.0.0.1:7450"
# one drive under the state folder, one outside it (a ReadWritePaths= drop-in)
AGENT_DRIVES = ("/var/lib/shingle/agent/a1", "/srv/agent/a2")
SMB_USER, SMB_PASSWORD = "alice", "alice-vm-pw-1"
CONFIG = "/etc/shingle/shingle.toml"
DRIVES = "/var/lib/shingle/drives"


class CheckFailed(Exception):
    pass


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def difference(expected: bytes, got: bytes, block: int = 64 * 1024) -> str:
    """Where ``got`` differs from ``expected``, by blocks: zeros in the differing blocks mean
    bytes the server never stored (lost writes), other bytes a mix-up."""
    bad = [
        off
        for off in range(0, max(len(expected), len(got)), block)
        if expected[off : off + block] != got[off : off + block]
    ]
    if not bad:
        return "equal"
    zero = sum(
        1 for off in bad if got[off : off + block] and not got[off : off + block].strip(b"\0")
    )
    return (
        f"{len(bad)} of {-(-len(expected) // block)} blocks of {block // 1024} KiB differ, "
        f"the first at offset {bad[0]}, the last at {bad[-1]}; {zero} of them all zero"
    )


def run(
    *cmd: str, timeout: float = 300, env: dict | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        input=stdin,
    )


def ok(*cmd: str, timeout: float = 300, env: dict | None = None, stdin: str | None = None) -> str:
    result = run(*cmd, timeout=timeout, env=env, stdin=stdin)
    expect(
        result.returncode == 0,
        f"{' '.join(cmd)} -> {result.returncode}: "
        f"{(result.stderr + result.stdout).strip()[-1500:]}",
    )
    return result.stdout + result.stderr


def streamed(*cmd: str, env: dict) -> str:
    """Run a long command with each line of its output shown as it comes (a step that
    hangs then shows where); its whole output if it exits 0."""
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **env},
        cwd="/",
    )
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        print(f"  | {line.rstrip()}", flush=True)
    status = proc.wait()
    out = "".join(lines)
    expect(status == 0, f"{' '.join(cmd)} -> {status}: {out.strip()[-1500:]}")
    return out


def show(unit: str) -> dict[str, str]:
    out = ok("systemctl", "show", unit, "--no-pager")
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _comm(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def owner(path: str) -> str:
    import pwd

    return pwd.getpwuid(os.stat(path).st_uid).pw_name


class Run:
    def __init__(self, plan: dict):
        self.plan = plan
        self.passed: set[str] = set()
        self.shingle = os.path.join(plan["venv"], "bin", "shingle")
        self.state: dict = {}

    def check(self, name: str, work) -> None:
        started = time.monotonic()
        need = NEEDS.get(name)
        if need and need not in self.passed:
            report(name, False, f"not run: {need} did not pass")
            return
        try:
            details = work()
            self.passed.add(name)
            report(name, True, f"{details} ({time.monotonic() - started:.0f} s)")
        except CheckFailed as exc:
            report(name, False, str(exc))
        except Exception:  # noqa: BLE001 - reported as this step's failure
            report(name, False, traceback.format_exc(limit=4))

    # -- the steps ------------------------------------------------------------------------
    def install(self) -> str:
        if self.plan.get("seed"):
            # the host built the venv (test_systemd_install.seed_venv): a writable layer over
            # it, so that this install refreshes it in place as an upgrade would
            venv, layer = self.plan["venv"], "/run/shingle-seed"
            os.makedirs(venv, exist_ok=True)
            os.makedirs(layer, exist_ok=True)
            ok("mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", layer)
            os.makedirs(f"{layer}/upper", mode=0o755)
            os.makedirs(f"{layer}/work")
            options = f"lowerdir={self.plan['seed']},upperdir={layer}/upper,workdir={layer}/work"
            ok("mount", "-t", "overlay", "overlay", "-o", options, venv)
        started = time.monotonic()
        out = streamed(
            self.plan["python"],
            "-m",
            "appliance.cli",
            "install",
            "--venv",
            self.plan["venv"],
            env={"PYTHONPATH": self.plan["checkout"]},
        )
        expect(f"shingle and its dependencies: {self.plan['venv']}" in out, out[-1500:])
        expect("enabled shingle.target" in out, f"target not enabled: {out[-1500:]}")
        unit = open(f"/etc/systemd/system/{NFSD}").read()
        expect(f"ExecStart={self.shingle} " in unit, "ExecStart does not run the venv")
        # short NFSv4 lease and grace: the restart step must not wait 90 s for new opens
        text = open(CONFIG).read()
        for old, new in (
            ("# lease_seconds = 90", "lease_seconds = 30"),
            ("# grace_seconds = 90", "grace_seconds = 10"),
            # SMB on its standard port: shingle-smbd.service runs smbd (the daemon is not root)
            ("# port = 0", "port = 445"),
        ):
            expect(old in text, f"{old!r} not in {CONFIG}")
            text = text.replace(old, new, 1)
        with open(CONFIG, "w") as f:
            f.write(text)
        progress = [line for line in out.splitlines() if line.startswith("[")]
        return (
            f"install took {time.monotonic() - started:.0f} s, {len(progress)} progress lines: "
            + " / ".join(progress)
        )

    def doctor(self) -> str:
        result = run(self.shingle, "doctor", "--json", timeout=300)
        checks = json.loads(result.stdout)
        by_name = {c["name"]: c for c in checks}
        for unit in (NFSD, WEBUI):
            found = by_name.get(f"exec {unit}", {})
            expect(found.get("status") == "ok", f"exec {unit}: {found}")
        fails = [c for c in checks if c["status"] == "fail"]
        expect(result.returncode == 0 and not fails, f"doctor exit {result.returncode}: {fails}")
        return by_name[f"exec {NFSD}"]["detail"]

    def add_drive(self, name: str) -> str:
        return ok(
            self.shingle,
            "drives",
            "add",
            f"{DRIVES}/{name}",
            "--size",
            "64MiB",
            "--zone-size",
            "4MiB",
            "--no-preallocate",
            timeout=600,
        )

    def drives_add(self) -> str:
        # nine here and one while running: the warm band class's 8+2 stripes need ten drives
        for i in range(1, 10):
            self.add_drive(f"vm{i}")
            expect(owner(f"{DRIVES}/vm{i}") == "shingle", f"{DRIVES}/vm{i} owned by root")
        return "9 drives made by the CLI itself, owned by shingle"

    def start_ready(self) -> str:
        started = time.monotonic()
        ok("systemctl", "start", TARGET, timeout=600)
        nfsd, webui = show(NFSD), show(WEBUI)
        for name, props in ((NFSD, nfsd), (WEBUI, webui)):
            expect(
                props["ActiveState"] == "active" and props["SubState"] == "running",
                f"{name} {props['ActiveState']}/{props['SubState']} ({props.get('Result')})",
            )
            expect(props["Type"] == "notify", f"{name} Type={props['Type']}")
        self.state["pid"] = nfsd["MainPID"]
        self.state["active_since"] = int(nfsd["ActiveEnterTimestampMonotonic"])
        return (
            f"active after {time.monotonic() - started:.0f} s (READY=1), nfsd pid "
            f"{nfsd['MainPID']}, webui pid {webui['MainPID']}"
        )

    def drives_add_running(self) -> str:
        out = self.add_drive("vm10")
        expect("the daemon" in out and "queued job" in out, f"not through the daemon: {out}")
        expect(owner(f"{DRIVES}/vm10") == "shingle", f"{DRIVES}/vm10 owned by {owner(DRIVES)}")
        return "drive 10 made by the running daemon"

    def outside_refused(self) -> str:
        result = run(self.shingle, "drives", "add", "/srv/outside", timeout=300)
        expect(result.returncode == 2, f"exit {result.returncode}: {result.stderr[-800:]}")
        expect("may write only" in result.stderr, result.stderr[-800:])
        expect(not os.path.exists("/srv/outside"), "/srv/outside was made")
        return result.stderr.strip().splitlines()[-1][:200]

    def nfs_mount(self) -> str:
        os.makedirs("/mnt/nfs", exist_ok=True)
        ok(
            "timeout",
            "120",
            "mount",
            "-t",
            "nfs",
            "-o",
            "vers=4.1,port=2049",
            "127.0.0.1:/export",
            "/mnt/nfs",
            timeout=180,
        )
        try:
            data = os.urandom(4 << 20)
            fd = os.open("/mnt/nfs/vm-check.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
            with open("/mnt/nfs/vm-check.bin", "rb") as f:
                back = f.read()
            expect(back == data, f"read back {len(back)} bytes: {difference(data, back)}")
        finally:
            run("umount", "/mnt/nfs", timeout=120)
        digest = hashlib.sha256(data).hexdigest()[:12]
        return f"4 MiB written, fsynced, re-read equal (sha256 {digest})"

    def smbclient(self, command: str) -> str:
        return ok(
            "smbclient",
            "//127.0.0.1/export",
            "-U",
            f"{SMB_USER}%{SMB_PASSWORD}",
            "--timeout",
            "120",
            "-c",
            command,
            timeout=300,
        )

    def smb_serving(self, timeout: float = 180) -> None:
        """Until smbd answers a tree connect (the unit mounts once the daemon listens)."""
        deadline = time.monotonic() + timeout
        while True:
            probe = run(
                "smbclient",
                "//127.0.0.1/export",
                "-U",
                f"{SMB_USER}%{SMB_PASSWORD}",
                "-c",
                "ls",
                timeout=120,
            )
            if probe.returncode == 0 and "NT_STATUS" not in probe.stdout:
                return
            props = show(SMBD)
            expect(
                time.monotonic() < deadline,
                f"SMB not serving: {SMBD} {props['ActiveState']}/{props['SubState']}: "
                f"{(probe.stdout + probe.stderr).strip()[-600:]}",
            )
            time.sleep(3)

    def smb_put_get(self) -> str:
        ok(
            self.shingle,
            "smb",
            "user",
            "add",
            SMB_USER,
            "--password-stdin",
            env=None,
            timeout=300,
            stdin=SMB_PASSWORD + "\n",
        )
        self.smb_serving()
        data = os.urandom(2 << 20)
        self.state["smb_data"] = data
        with open("/tmp/smb-put.bin", "wb") as f:
            f.write(data)
        self.smbclient("put /tmp/smb-put.bin smb-check.bin")
        time.sleep(1.5)  # the mount's attribute timeout (tests/smb/test_smb.py)
        self.smbclient("get smb-check.bin /tmp/smb-get.bin")
        with open("/tmp/smb-get.bin", "rb") as f:
            expect(f.read() == data, "smbclient got back different bytes")
        props = show(SMBD)
        expect(props["ActiveState"] == "active", f"{SMBD} {props['ActiveState']}")
        smbd = [pid for pid in os.listdir("/proc") if pid.isdigit() and _comm(pid) == "smbd"]
        expect(smbd, "no smbd process")
        status = open(f"/proc/{min(smbd, key=int)}/status").read()
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        uid = fields["Uid"].split()[0]
        bounding = int(fields["CapBnd"].strip(), 16)
        expect(not bounding & (1 << 21), f"smbd holds CAP_SYS_ADMIN: CapBnd {bounding:#x}")
        # root's CLI and smbd wrote the passdb: it stays the service user's (its web UI)
        private = "/var/lib/shingle/smb/private"
        owners = {owner(os.path.join(private, name)) for name in os.listdir(private)}
        expect(owners == {"shingle"}, f"{private} holds files of {owners}")
        line = next(x for x in ok(self.shingle, "status").splitlines() if x.startswith("smb "))
        expect("smbd running" in line, line)
        return (
            f"2 MiB put and got back equal through {SMBD} (smbd uid {uid}, CapBnd "
            f"{bounding:#x}, no CAP_SYS_ADMIN); status: {line[:200]}"
        )

    def smb_after_restart(self) -> str:
        started = time.monotonic()
        self.smb_serving()
        self.smbclient("get smb-check.bin /tmp/smb-again.bin")
        with open("/tmp/smb-again.bin", "rb") as f:
            expect(f.read() == self.state["smb_data"], "different bytes after the restart")
        return f"SMB served again {time.monotonic() - started:.0f} s after the daemon came back"

    def webui(self) -> str:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen("http://127.0.0.1:8080/login", timeout=30) as reply:
                    body = reply.read()
                    expect(reply.status == 200, f"status {reply.status}")
                    return f"/login: {reply.status}, {len(body)} bytes"
            except (urllib.error.URLError, ConnectionError) as exc:
                if time.monotonic() > deadline:
                    raise CheckFailed(f"web UI not answering: {exc}") from None
                time.sleep(2)

    def watchdog(self) -> str:
        props = show(NFSD)
        setting = props["WatchdogUSec"]  # "30s"
        expect(setting.endswith("s") and setting[:-1].isdigit(), f"WatchdogUSec={setting}")
        limit_s = int(setting[:-1])
        # until the daemon has been active for WatchdogSec plus a third again
        while True:
            now_us = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
            alive_s = (now_us - self.state["active_since"]) / 1e6
            if alive_s > limit_s * 4 / 3:
                break
            time.sleep(2)
        props = show(NFSD)
        expect(props["ActiveState"] == "active", f"{props['ActiveState']} ({props['Result']})")
        expect(
            props["MainPID"] == self.state["pid"], f"pid {self.state['pid']} -> {props['MainPID']}"
        )
        expect(props["NRestarts"] == "0", f"NRestarts={props['NRestarts']}")
        last_ping = int(props.get("WatchdogTimestampMonotonic") or 0)
        expect(last_ping > self.state["active_since"], f"no WATCHDOG=1 since start: {last_ping}")
        return f"alive {alive_s:.0f} s with WatchdogSec={limit_s}, last ping at {last_ping} us"

    def restart_after_kill(self) -> str:
        old = show(NFSD)["MainPID"]
        ok("kill", "-9", old)
        deadline = time.monotonic() + 300
        while True:
            props = show(NFSD)
            if (
                props["MainPID"] not in ("0", old)
                and props["ActiveState"] == "active"
                and props["SubState"] == "running"
            ):
                break
            expect(
                time.monotonic() < deadline, f"not back: {props['ActiveState']}/{props['SubState']}"
            )
            time.sleep(2)
        expect(props["NRestarts"] == "1", f"NRestarts={props['NRestarts']}")
        return f"pid {old} killed, pid {props['MainPID']} active (NRestarts=1)"

    def stop_clean(self) -> str:
        started = time.monotonic()
        ok("systemctl", "stop", TARGET, timeout=300)
        # the target is ordered after its services, so its stop job ends first and
        # systemctl returns while they are still stopping (TimeoutStopSec bounds that)
        found = []
        for unit in (NFSD, WEBUI, SMBD):
            deadline = time.monotonic() + 150
            while (props := show(unit))["ActiveState"] in ("active", "deactivating"):
                expect(time.monotonic() < deadline, f"{unit} still {props['ActiveState']}")
                time.sleep(1)
            expect(props["ActiveState"] == "inactive", f"{unit} {props['ActiveState']}")
            expect(props["Result"] == "success", f"{unit} Result={props['Result']}")
            found.append(f"{unit} inactive, exit {props['ExecMainStatus']}")
        return f"{'; '.join(found)}, after {time.monotonic() - started:.0f} s"

    def agent_hello(self) -> dict:
        """The agent's HELLO, as a head asks it (engine/drives/remote.py)."""
        probe = (
            "import json; from engine.drives.remote import hello; "
            f"print(json.dumps(hello({AGENT_ADDRESS!r})))"
        )
        result = run(os.path.join(self.plan["venv"], "bin", "python"), "-c", probe, timeout=120)
        expect(result.returncode == 0, f"HELLO to {AGENT_ADDRESS}: {result.stderr[-600:]}")
        return json.loads(result.stdout)

    def storage_role(self) -> str:
        """The head and the storage role on one host: the agent's unit starts as the service
        user over the drives the install formatted, and answers a head's HELLO."""
        out = ok(
            self.shingle,
            "install",
            "--bin",
            self.shingle,
            "--role",
            "head,storage",
            "--listen",
            AGENT_ADDRESS,
            "--drives",
            *AGENT_DRIVES,
            "--drive-size",
            "64MiB",
            "--zone-size",
            "4MiB",
            "--no-preallocate",
            timeout=600,
        )
        expect(out.count("formatted drive") == 2, out[-1500:])
        expect(f"installed unit: /etc/systemd/system/{AGENT}" in out, out[-1500:])
        for drive in AGENT_DRIVES:
            expect(owner(drive) == "shingle", f"{drive} owned by {owner(drive)}")
        ok("systemctl", "start", AGENT, timeout=300)
        deadline = time.monotonic() + 180
        while True:
            try:
                answer = self.agent_hello()
                break
            except CheckFailed:
                props = show(AGENT)
                expect(props["ActiveState"] == "active", f"{AGENT} {props['ActiveState']}")
                expect(time.monotonic() < deadline, f"{AGENT} does not answer")
                time.sleep(2)
        expect(len(answer.get("drives", [])) == 2, f"HELLO: {answer}")
        pid = show(AGENT)["MainPID"]
        expect(owner(f"/proc/{pid}") == "shingle", f"{AGENT} runs as {owner(f'/proc/{pid}')}")
        units = {c["name"]: c for c in json.loads(run(self.shingle, "doctor", "--json").stdout)}
        expect("roles head, storage" in units["units"]["detail"], str(units["units"]))
        return f"{AGENT} pid {pid} (shingle) answers HELLO with 2 drives; doctor: roles listed"

    def uninstall(self) -> str:
        out = ok(self.shingle, "uninstall", timeout=300)
        expect(f"removed unit: /etc/systemd/system/{AGENT}" in out, out[-1500:])
        props = show(AGENT)
        expect(props["LoadState"] == "not-found", f"{AGENT} LoadState={props['LoadState']}")
        expect(props["ActiveState"] == "inactive", f"{AGENT} {props['ActiveState']}")
        try:
            answered = bool(self.agent_hello())
        except CheckFailed:
            answered = False
        expect(not answered, f"{AGENT_ADDRESS} still answers after uninstall")
        expect(os.path.exists(f"{AGENT_DRIVES[1]}/drive.json"), "uninstall removed a drive")
        return f"{AGENT} stopped and gone, its drives kept"


def report(name: str, passed: bool, details: str = "") -> None:
    details = " | ".join(line for line in details.strip().splitlines() if line.strip())
    print(f"{CHECK_MARKER} {'PASS' if passed else 'FAIL'} {name} {details[:3000]}", flush=True)


def main(plan: dict) -> int:
    print("@@SHINGLE-VM BEGIN", flush=True)
    uptime = float(open("/proc/uptime").read().split()[0])
    print(f"guest: {os.uname().nodename}, systemd up, {uptime:.0f} s since boot", flush=True)
    steps = Run(plan)
    for name, work in (
        ("install", steps.install),
        ("doctor", steps.doctor),
        ("drives-add", steps.drives_add),
        ("start-ready", steps.start_ready),
        ("drives-add-running", steps.drives_add_running),
        ("drive-outside-sandbox-refused", steps.outside_refused),
        ("nfs-mount", steps.nfs_mount),
        ("smb-put-get", steps.smb_put_get),
        ("webui", steps.webui),
        ("watchdog", steps.watchdog),
        ("restart-after-kill", steps.restart_after_kill),
        ("smb-after-restart", steps.smb_after_restart),
        ("stop-clean", steps.stop_clean),
        ("storage-role", steps.storage_role),
        ("uninstall", steps.uninstall),
    ):
        steps.check(name, work)
    if len(steps.passed) < len(CHECKS):
        journal = run(
            "journalctl",
            "--no-pager",
            "-n",
            "120",
            "-u",
            NFSD,
            "-u",
            WEBUI,
            "-u",
            SMBD,
            "-u",
            AGENT,
        )
        print("--- journal of the units ---\n" + journal.stdout, flush=True)
    return 0


if __name__ == "__main__":
    with open(sys.argv[1]) as plan_file:
        sys.exit(main(json.load(plan_file)))
