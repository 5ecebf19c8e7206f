"""SMB benchmark: shingle (smbd over the daemon's FUSE mount) against Samba sharing a plain ext4
folder, same machine, same run, same client.

    .venv/bin/python bench/smb.py                      # 2 GiB sequential, 2,000 small files
    .venv/bin/python bench/smb.py --size-mib 512       # a loaded machine: less, and say so
    .venv/bin/python bench/smb.py --smoke              # tiny sizes: does the harness work

Both servers are children of this process on 127.0.0.1: ``shingle serve --no-web --smb-port P``
on a fresh ``shingle init`` folder (10 emulated zone-file drives, 8+2), and a second smbd with
its own temp config (appliance/smb/samba.py's global settings, the same user through
nss_wrapper and a tdbsam passdb) sharing a folder of the host's file system. The client is
smbprotocol (SMB 3, one session per server), in this process. Workloads, each on shingle then
on the reference: sequential write of SIZE in 4 MiB writes, sequential read of it back after
dropping the page cache (``/proc/sys/vm/drop_caches``, else read warm and said so), and FILES
creates of a 1 KiB file each (open, write, close). Server CPU is the CPU time of the server's
whole process tree (shingle: the daemon and its smbd; reference: its smbd) over the workload,
per MiB or per file.

The last lines are one per metric: ``smb.METRIC SHINGLE REFERENCE RATIO`` (ratio = shingle /
reference; for the *_cpu_* metrics lower is better; ``nan`` where a server failed, or for a
CPU ratio when the reference used less than a clock tick)."""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# bench/ itself must not come first: bench/engine.py would shadow the engine package
sys.path[:] = [str(REPO)] + [p for p in sys.path if Path(p or ".").resolve() != REPO / "bench"]

MiB = 1 << 20
USER, PASSWORD = "bench", "bench-password-1"
SHARE = "export"
BLOCK = 4 * MiB
SMALL_FILE = 1024
METRICS = (
    "seq_write_MBps",
    "seq_read_MBps",
    "create_per_s",
    "seq_write_cpu_ms_per_MiB",
    "seq_read_cpu_ms_per_MiB",
    "create_cpu_ms_per_file",
)


def log(message: str) -> None:
    print(f"[smb-bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_listening(port: int, proc: subprocess.Popen, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{what} is not listening on 127.0.0.1:{port} after {timeout:.0f} s")


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of a process and every descendant alive now."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def stop(proc: subprocess.Popen | None, timeout: float = 60.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(30)


class ShingleSmb:
    """``shingle init`` + ``serve --no-web --smb-port P``, with one SMB user."""

    name = "shingle"

    def __init__(self, root: Path, size_mib: int):
        self.root = root / "shingle"
        self.port = free_port()
        # 8+2 over 10 drives: the data x 10/8, half as much again for open bands and the
        # cleaning reserve, 1 GiB for the small files and the catalog's inline data
        self.drive_mib = max(256, -(-((size_mib * 10 // 8) * 3 // 2 + 1024) // 10 // 16) * 16)
        self.proc: subprocess.Popen | None = None

    def cli(self, *args: str, stdin: str | None = None) -> None:
        done = subprocess.run(
            [sys.executable, "-m", "appliance.cli", *args],
            cwd=REPO,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"shingle {' '.join(args[:3])} failed: "
                f"{(done.stderr or done.stdout).strip()[-800:]}"
            )

    def start(self) -> None:
        self.cli(
            "init",
            str(self.root),
            "--drives",
            "10",
            "--drive-size",
            f"{self.drive_mib}MiB",
            "--zone-size",
            "16MiB",
            "--nfs-port",
            str(free_port()),
        )
        config = str(self.root / "shingle.toml")
        out = open(self.root / "serve.log", "ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "appliance.cli",
                "-c",
                config,
                "serve",
                "--no-web",
                "--smb-port",
                str(self.port),
            ],
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        out.close()
        wait_listening(self.port, self.proc, 120, "shingle serve --smb-port")
        self.cli(
            "-c", config, "smb", "user", "add", USER, "--password-stdin", stdin=PASSWORD + "\n"
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        stop(self.proc)
        mount = self.root / "smb" / "mount"
        if os.path.ismount(mount):
            subprocess.run(["fusermount3", "-u", "-z", str(mount)], check=False)


class ReferenceSmb:
    """A second smbd with its own temp config sharing a folder of the host's file system, with
    shingle's global Samba settings and the same user (nss_wrapper, its own tdbsam)."""

    name = "reference"

    def __init__(self, root: Path):
        from appliance.smb.samba import SambaLayout

        self.root = root / "reference"
        self.layout = SambaLayout(self.root / "smb")
        self.folder = self.root / "share"
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        from appliance.smb import samba
        from engine.admin import smb as smb_service
        from engine.admin.exports import ANY_CLIENT

        self.folder.mkdir(parents=True)
        self.folder.chmod(0o777)
        self.layout.create()
        user = smb_service.SmbUser(1, USER, smb_service.FIRST_UID, smb_service.FIRST_UID)
        samba.write_nss(self.layout, [user])
        samba.SambaPassdb(self.layout).set_password(user, PASSWORD)
        share = smb_service.Share(1, SHARE, "/", "rw", ANY_CLIENT, False, "", "", False, True)
        conf = samba.render_conf(
            self.layout, [share], mount=self.folder, host="127.0.0.1", port=self.port
        )
        # the very settings shingle's smbd runs with (kernel share modes and oplocks off too:
        # with them on, smbd as root holding a lease refused the user's second open)
        self.layout.conf.write_text(conf)
        out = open(self.layout.log_file, "ab")
        self.proc = subprocess.Popen(
            ["smbd", "--foreground", "--debug-stdout", "-s", str(self.layout.conf)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=self.layout.env(),
        )
        out.close()
        wait_listening(self.port, self.proc, 60, "reference smbd")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        stop(self.proc)


def drop_caches() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def unc(port_server, path: str = "") -> str:
    return f"\\\\127.0.0.1\\{SHARE}" + (f"\\{path}" if path else "")


def run_workloads(server, size_mib: int, files: int, notes: list[str]) -> dict[str, float]:
    import smbclient

    out: dict[str, float] = {}
    smbclient.register_session(
        "127.0.0.1", username=USER, password=PASSWORD, port=server.port, encrypt=False
    )
    try:
        block = os.urandom(BLOCK)
        total = size_mib * MiB
        cpu0, t0 = tree_cpu_s(server.pid), time.perf_counter()
        with smbclient.open_file(unc(server, "big.bin"), mode="wb", port=server.port) as f:
            written = 0
            while written < total:
                n = min(BLOCK, total - written)
                f.write(block[:n])
                written += n
        elapsed, cpu = time.perf_counter() - t0, tree_cpu_s(server.pid) - cpu0
        out["seq_write_MBps"] = total / MiB / elapsed
        out["seq_write_cpu_ms_per_MiB"] = cpu * 1000 / (total / MiB)
        log(f"{server.name}: wrote {size_mib} MiB in {elapsed:.1f} s, server cpu {cpu:.1f} s")

        cold = drop_caches()
        if not cold and "warm reads: page cache not dropped (not permitted)" not in notes:
            notes.append("warm reads: page cache not dropped (not permitted)")
        cpu0, t0 = tree_cpu_s(server.pid), time.perf_counter()
        got = 0
        with smbclient.open_file(
            unc(server, "big.bin"), mode="rb", port=server.port, buffering=BLOCK
        ) as f:
            while chunk := f.read(BLOCK):
                got += len(chunk)
        elapsed, cpu = time.perf_counter() - t0, tree_cpu_s(server.pid) - cpu0
        if got != total:
            raise RuntimeError(f"{server.name}: read {got} bytes back, expected {total}")
        out["seq_read_MBps"] = total / MiB / elapsed
        out["seq_read_cpu_ms_per_MiB"] = cpu * 1000 / (total / MiB)
        log(f"{server.name}: read {size_mib} MiB in {elapsed:.1f} s, server cpu {cpu:.1f} s")
        smbclient.remove(unc(server, "big.bin"), port=server.port)

        smbclient.mkdir(unc(server, "small"), port=server.port)
        payload = os.urandom(SMALL_FILE)
        cpu0, t0 = tree_cpu_s(server.pid), time.perf_counter()
        for i in range(files):
            with smbclient.open_file(
                unc(server, f"small\\f{i:05d}"), mode="wb", port=server.port
            ) as f:
                f.write(payload)
        elapsed, cpu = time.perf_counter() - t0, tree_cpu_s(server.pid) - cpu0
        out["create_per_s"] = files / elapsed
        out["create_cpu_ms_per_file"] = cpu * 1000 / files
        log(f"{server.name}: created {files} files in {elapsed:.1f} s, server cpu {cpu:.1f} s")
    finally:
        smbclient.reset_connection_cache()
    return out


def fmt(value: float) -> str:
    return "nan" if value is None or math.isnan(value) else f"{value:.2f}"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size-mib", type=int, default=2048, help="sequential file size (MiB)")
    p.add_argument("--files", type=int, default=2000, help="small files to create")
    p.add_argument("--smoke", action="store_true", help="16 MiB and 50 files")
    p.add_argument("--json", type=Path, help="write the results here too")
    p.add_argument("--keep", action="store_true", help="leave the temp folder")
    args = p.parse_args(argv)
    if args.smoke:
        args.size_mib, args.files = 16, 50
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="shingle-smb-bench-"))
    root.chmod(0o755)  # smbd works as the SMB user: every folder above the shares is searchable
    results: dict[str, dict[str, float]] = {}
    errors: dict[str, str] = {}
    notes: list[str] = []
    try:
        servers = [ShingleSmb(root, args.size_mib), ReferenceSmb(root)]
        log(
            f"{args.size_mib} MiB sequential, {args.files} small files; shingle's drives "
            f"{servers[0].drive_mib} MiB x 10; reference folder {servers[1].folder}"
        )
        for server in servers:
            try:
                server.start()
                results[server.name] = run_workloads(server, args.size_mib, args.files, notes)
            except Exception as exc:  # noqa: BLE001 - one server failing still reports the other
                errors[server.name] = f"{type(exc).__name__}: {exc}"
                log(f"{server.name} failed: {errors[server.name]}")
            finally:
                server.stop()
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    nan = float("nan")
    lines = []
    for metric in METRICS:
        ours = results.get("shingle", {}).get(metric, nan)
        ref = results.get("reference", {}).get(metric, nan)
        ratio = ours / ref if ref and not math.isnan(ours) and not math.isnan(ref) else nan
        lines.append(f"smb.{metric} {fmt(ours)} {fmt(ref)} {fmt(ratio)}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "size_mib": args.size_mib,
                    "files": args.files,
                    "results": results,
                    "errors": errors,
                    "notes": notes,
                },
                indent=2,
            )
        )
    for note in notes:
        print(f"# note: {note}")
    for name, error in errors.items():
        print(f"# error: {name}: {error}")
    print(
        f"# {len(lines)} metrics: smb.METRIC shingle reference ratio (shingle / reference; "
        "cpu: lower is better)"
    )
    print("\n".join(lines))
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())
