"""NFS-Ganesha as the reference server of the benchmarks.

    from bench.ganesha import GaneshaServer, ensure_installed
    ensure_installed()  # apt-get nfs-ganesha nfs-ganesha-vfs when missing (root)
    with GaneshaServer(workdir, port) as g:  # exports workdir/export over NFSv4.1 on 127.0.0.1
        g.url, g.port, g.backing_dir

The server runs in the foreground (-F) as a child process of the harness,
with a generated config, recovery dir and log in ``workdir``: PID 1 of this
machine does not reap orphans, so the harness must own and wait for it.
pNFS is off (no pNFS FSAL configured), grace is skipped (Graceless), only
NFSv4.1 over TCP is served and no rpcbind registration is needed.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

PACKAGES = ("nfs-ganesha", "nfs-ganesha-vfs")
DAEMON = "ganesha.nfsd"
FSAL_DIRS = ("/usr/lib/x86_64-linux-gnu/ganesha", "/usr/lib/ganesha", "/usr/lib64/ganesha")
PSEUDO = "/export"

CONFIG = """\
NFS_CORE_PARAM {{
    NFS_Port = {port};
    Bind_addr = 127.0.0.1;
    Protocols = 4;
    Enable_NLM = false;
    Enable_RQUOTA = false;
    Plugins_Dir = "{plugins}";
}}
NFS_KRB5 {{ {krb5} }}
NFSV4 {{
    Graceless = true;
    Minor_Versions = 1;
    RecoveryBackend = fs;
    RecoveryRoot = "{recovery}";
}}
EXPORT {{
    Export_Id = 1;
    Path = "{export}";
    Pseudo = "{pseudo}";
    Access_Type = RW;
    Squash = No_Root_Squash;
    Protocols = 4;
    Transports = TCP;
    SecType = {sectype};
    FSAL {{ Name = VFS; }}
}}
LOG {{ Default_Log_Level = WARN; }}
"""


class GaneshaError(RuntimeError):
    """NFS-Ganesha could not be installed or started (the message says why)."""


def plugins_dir() -> str | None:
    for d in FSAL_DIRS:
        if os.path.exists(os.path.join(d, "libfsalvfs.so")):
            return d
    return None


def installed() -> bool:
    return shutil.which(DAEMON) is not None and plugins_dir() is not None


def ensure_installed() -> str:
    """Path of ganesha.nfsd; installs the Debian packages when missing (needs root)."""
    if not installed():
        if os.geteuid() != 0:
            raise GaneshaError(
                f"{DAEMON} or its VFS FSAL is missing and this is not root: "
                f"install the Debian packages {' '.join(PACKAGES)}"
            )
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        proc = subprocess.run(
            ["apt-get", "install", "-y", *PACKAGES], env=env, capture_output=True, text=True
        )
        if proc.returncode != 0 or not installed():
            raise GaneshaError(
                f"apt-get install -y {' '.join(PACKAGES)} failed (exit {proc.returncode}): "
                f"{proc.stderr.strip()[-500:]}"
            )
    return shutil.which(DAEMON)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(
    port: int, proc: subprocess.Popen, timeout: float, log: Path | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-1500:] if log and log.exists() else ""
            raise GaneshaError(
                f"server exited with status {proc.returncode} before listening on "
                f"127.0.0.1:{port}\n{tail}"
            )
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise GaneshaError(f"nothing listening on 127.0.0.1:{port} after {timeout:.0f} s")


class ChildServer:
    """A server run as this harness's child process (``self.proc``): shared by both servers."""

    proc: subprocess.Popen | None = None
    stop_timeout_s = 20

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class GaneshaServer(ChildServer):
    """NFS-Ganesha exporting ``workdir/export`` as /export over NFSv4.1 on 127.0.0.1:port."""

    name = "ganesha"

    def __init__(
        self, workdir: Path, port: int | None = None, *, krb5: tuple[str, str] | None = None
    ):
        """``krb5``: (keytab, principal as ``nfs@HOST``) to serve RPCSEC_GSS with, the export then
        taking sys, krb5, krb5i and krb5p (the process's KRB5_CONFIG names the realm)."""
        self.krb5 = krb5
        self.workdir = Path(workdir).resolve()
        self.port = port or free_port()
        self.backing_dir = self.workdir / "export"
        self.proc: subprocess.Popen | None = None
        self.log = self.workdir / "ganesha.log"

    @property
    def url(self) -> str:
        return f"nfs://127.0.0.1:{self.port}/export?version=4.1"

    def start(self, timeout: float = 30.0) -> GaneshaServer:
        daemon = ensure_installed()
        self.backing_dir.mkdir(parents=True, exist_ok=True)
        recovery = self.workdir / "recovery"
        recovery.mkdir(exist_ok=True)
        conf = self.workdir / "ganesha.conf"
        conf.write_text(
            CONFIG.format(
                port=self.port,
                plugins=plugins_dir(),
                recovery=recovery,
                export=self.backing_dir,
                pseudo=PSEUDO,
                krb5=(
                    "Active_krb5 = false;"
                    if self.krb5 is None
                    else f'Active_krb5 = true; KeytabPath = "{self.krb5[0]}"; '
                    f'PrincipalName = "{self.krb5[1]}";'
                ),
                sectype="sys" if self.krb5 is None else "sys, krb5, krb5i, krb5p",
            )
        )
        self.proc = subprocess.Popen(
            [
                daemon,
                "-F",
                "-L",
                str(self.log),
                "-f",
                str(conf),
                "-p",
                str(self.workdir / "ganesha.pid"),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            wait_listening(self.port, self.proc, timeout, self.log)
        except BaseException:
            self.stop()
            raise
        return self

    def version(self) -> str:
        try:
            out = subprocess.run(
                [shutil.which(DAEMON) or DAEMON, "-v"], capture_output=True, text=True
            ).stdout
            return (
                out.strip().splitlines()[0].replace("NFS-Ganesha Release = ", "")
                if out.strip()
                else "?"
            )
        except OSError:
            return "?"
