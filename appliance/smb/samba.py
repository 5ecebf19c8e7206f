"""Samba for shingle: the generated smb.conf, SMB passwords, and smbd supervised by the daemon.

Everything Samba keeps lives under ``DATA_DIR/smb/`` (``SambaLayout``): its private dir (the
tdbsam passdb), lock, state, cache, pid and ncalrpc dirs and its log, so an appliance's state
stays in one folder and two appliances on one host never share a database. SMB users are not
host accounts: Samba (smbd, pdbedit, smbstatus) runs with libnss_wrapper preloaded
and a passwd/group file written from the catalog's ``smb_users``, so each SMB user has the
uid/gid the catalog gives it without touching /etc/passwd.

``SmbdSupervisor`` (a thread of ``shingle serve``) renders smb.conf from engine.admin.smb's shares
every ``RELOAD_S`` seconds, writes it when it changed and sends smbd SIGHUP (smbd re-reads its
config), and restarts smbd when it exits (backoff up to ``RESTART_MAX_S``). smbd runs
``--foreground --debug-stdout`` as a child of the daemon; never ``--no-process-group``: then
SIGTERM makes smbd kill its whole process group, the daemon's included."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.admin import smb as smb_service
from engine.admin.exports import ANY_CLIENT
from engine.base import errors
from engine.catalog import CatalogUnreachable
from engine.namespace.readonly import SNAPSHOT_DIR_NAME
from engine.snapshots import schedules

log = logging.getLogger("shingle.smb")

RELOAD_S = 2.0  # how soon a share or user change reaches smbd
RESTART_MIN_S, RESTART_MAX_S = 1.0, 30.0
STOP_WAIT_S = 15.0
NSS_WRAPPER = "libnss_wrapper.so"
NOBODY_UID = NOGROUP_GID = 65534
TOOL_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class SambaLayout:
    """Where Samba's files live for one appliance (all under ``DATA_DIR/smb``)."""

    root: Path

    @classmethod
    def for_data_dir(cls, data_dir: Path | str) -> SambaLayout:
        return cls(Path(data_dir).resolve() / "smb")

    @property
    def conf(self) -> Path:  # what smbd runs with (written by the daemon)
        return self.root / "smb.conf"

    @property
    def tools_conf(self) -> Path:  # for pdbedit/smbstatus from any process
        return self.root / "tools.conf"

    @property
    def mount(self) -> Path:  # the FUSE mount Samba shares (the default)
        return self.root / "mount"

    @property
    def log_file(self) -> Path:
        return self.dir("log") / "smbd.log"

    @property
    def problem_file(self) -> Path:  # why SMB does not serve, for status/alerts/metrics
        return self.root / "problem.json"

    @property
    def fuse_socket(self) -> Path:  # shingle-smbd.service hands the daemon its /dev/fuse here
        return self.root / "fuse.sock"

    @property
    def passwd(self) -> Path:
        return self.dir("nss") / "passwd"

    @property
    def group(self) -> Path:
        return self.dir("nss") / "group"

    def dir(self, name: str) -> Path:
        return self.root / name

    DIRS = ("private", "state", "lock", "cache", "pid", "ncalrpc", "binddns", "log", "nss")

    def create(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for name in self.DIRS:
            self.dir(name).mkdir(exist_ok=True)
        self.dir("private").chmod(0o700)
        if not self.tools_conf.exists():
            _write_atomic(self.tools_conf, render_global(self))

    def env(self) -> dict[str, str]:
        """The environment of every Samba program: SMB users from shingle's passwd file."""
        env = dict(os.environ)
        env.update(
            LD_PRELOAD=NSS_WRAPPER,
            NSS_WRAPPER_PASSWD=str(self.passwd),
            NSS_WRAPPER_GROUP=str(self.group),
        )
        return env


def _write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    # the daemon and the web UI both write the nss files: each process its own temp name
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(text)
    tmp.chmod(mode)
    os.replace(tmp, path)


# -- smb.conf --------------------------------------------------------------------------------
def render_global(layout: SambaLayout, *, host: str = "127.0.0.1", port: int = 445) -> str:
    d = layout.dir
    lines = [
        "# Written by shingle (appliance/smb/samba.py) from the catalog: edits are overwritten.",
        "[global]",
        "server role = standalone server",
        "security = user",
        f"passdb backend = tdbsam:{d('private') / 'passdb.tdb'}",
        f"private dir = {d('private')}",
        f"lock directory = {d('lock')}",
        f"state directory = {d('state')}",
        f"cache directory = {d('cache')}",
        f"pid directory = {d('pid')}",
        f"ncalrpc dir = {d('ncalrpc')}",
        f"binddns dir = {d('binddns')}",
        f"log file = {layout.log_file}",
        "log level = 1",
        f"interfaces = {host}",
        "bind interfaces only = yes",
        f"smb ports = {port}",
        "disable netbios = yes",
        "server min protocol = SMB2_02",
        "load printers = no",
        "printing = bsd",
        "printcap name = /dev/null",
        "disable spoolss = yes",
        "usershare max shares = 0",
        "map to guest = Bad User",
        "guest account = nobody",
        # the mount is FUSE: no kernel leases or share modes on it (smbd's own locking stays)
        "kernel share modes = no",
        "kernel oplocks = no",
        # Windows grants execute on files by default; clients open with FILE_EXECUTE to resolve a
        # path (smbprotocol's replace does): without this a 0644 file refuses them
        "acl allow execute always = yes",
        "create mask = 0644",
        "directory mask = 0755",
        # macOS clients: Apple's SMB extensions, resource forks and Finder info in xattrs;
        # Windows' Previous Versions: shadow_copy2 (below)
        "vfs objects = catia fruit streams_xattr shadow_copy2",
        "fruit:aapl = yes",
        "fruit:metadata = stream",
        "fruit:nfs_aces = no",
        # Previous Versions: each dataset's snapshots are DIR/.snapshots/NAME/ (a subtree, as
        # GPFS filesets), found by looking in every folder from the file's up. A snapshot shows
        # when its name is the default schedule's (auto-YYYY-MM-DDTHHMMZ, UTC): shadow_copy2
        # turns a client's time into that name by its format alone, on any connection. With
        # shadow:snapprefix (any prefix) it looks the name up in a list it fills only when a
        # client lists a file's versions, so a path with an @GMT token on a new connection fails
        f"shadow:snapdir = {SNAPSHOT_DIR_NAME}",
        "shadow:snapdirseverywhere = yes",
        f"shadow:format = {schedules.DEFAULT_PREFIX}-{schedules.NAME_TIME}",
        "shadow:localtime = no",
    ]
    return "\n".join(lines) + "\n"


def _users(text: str) -> str:
    return " ".join(n for n in text.split(",") if n)


def render_share(share: smb_service.Share, mount: Path) -> str:
    path = mount / share.path.lstrip("/") if share.path != "/" else mount
    lines = [
        f"[{share.name}]",
        f"path = {path}",
        f"read only = {'yes' if share.read_only else 'no'}",
        f"guest ok = {'yes' if share.guest else 'no'}",
        f"case sensitive = {'no' if share.case_insensitive else 'yes'}",
        "preserve case = yes",
        "short preserve case = yes",
    ]
    if share.clients != ANY_CLIENT:
        lines.append(f"hosts allow = {' '.join(share.clients.split(','))}")
    if share.users:
        lines.append(f"valid users = {_users(share.users)}")
    if share.read_only_users:
        lines.append(f"read list = {_users(share.read_only_users)}")
    return "\n".join(lines) + "\n"


def render_conf(layout: SambaLayout, shares, *, mount: Path, host: str, port: int) -> str:
    """smb.conf: the global section and one section per enabled share."""
    parts = [render_global(layout, host=host, port=port)]
    parts += [render_share(share, mount) for share in shares if share.enabled]
    return "\n".join(parts)


def render_nss(users) -> tuple[str, str]:
    """passwd and group files for nss_wrapper: root, nobody and every SMB user."""
    passwd = [
        "root:x:0:0:root:/root:/bin/false",
        f"nobody:x:{NOBODY_UID}:{NOGROUP_GID}:nobody:/nonexistent:/usr/sbin/nologin",
    ]
    groups: dict[int, tuple[str, list[str]]] = {0: ("root", []), NOGROUP_GID: ("nogroup", [])}
    for user in users:
        passwd.append(
            f"{user.name}:x:{user.uid}:{user.gid}:SMB user:/nonexistent:/usr/sbin/nologin"
        )
        if user.gid not in groups:
            groups[user.gid] = (user.name if user.gid == user.uid else f"g{user.gid}", [])
        groups[user.gid][1].append(user.name)
    group = [f"{name}:x:{gid}:{','.join(members)}" for gid, (name, members) in groups.items()]
    return "\n".join(passwd) + "\n", "\n".join(group) + "\n"


def write_nss(layout: SambaLayout, users) -> None:
    passwd, group = render_nss(users)
    _write_atomic(layout.passwd, passwd)
    _write_atomic(layout.group, group)


def _run_tool(
    layout: SambaLayout, argv: list[str], stdin: str = "", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    if shutil.which(argv[0]) is None:
        raise errors.IOFailure(f"{argv[0]} not found: install Debian's samba package")
    return subprocess.run(
        argv,
        input=stdin,
        capture_output=True,
        text=True,
        env={**layout.env(), **(env or {})},
        timeout=TOOL_TIMEOUT_S,
    )


def give_private_to_owner(layout: SambaLayout) -> None:
    """Root's pdbedit (`shingle smb` by root) and smbd (shingle-smbd.service) create passdb.tdb
    and secrets.tdb as root, 0600: the owner of DATA_DIR/smb (the service user, whose web UI sets
    passwords) must go on writing them."""
    if os.geteuid() != 0:
        return
    owner = layout.root.stat()
    if owner.st_uid == 0:
        return
    private = layout.dir("private")
    for path in [private, *private.iterdir()]:
        found = path.lstat()
        if (found.st_uid, found.st_gid) != (owner.st_uid, owner.st_gid):
            os.chown(path, owner.st_uid, owner.st_gid, follow_symlinks=False)


class SambaPassdb:
    """engine.admin.smb.Passdb over Samba's tdbsam in the layout's private dir (pdbedit)."""

    def __init__(self, layout: SambaLayout, catalog=None):
        self.layout = layout
        self.catalog = catalog
        layout.create()

    def _known_users(self, extra: smb_service.SmbUser | None = None):
        users = {
            u.name: u
            for u in (smb_service.list_users(self.catalog) if self.catalog is not None else [])
        }
        if extra is not None:
            users[extra.name] = extra
        return list(users.values())

    def set_password(self, user: smb_service.SmbUser, password: str) -> None:
        # the user must exist for Samba before its passdb entry, but its row is not committed
        # yet: the daemon's refresh round rewrites the shared nss files from the catalog at any
        # moment (dropping this user), so pdbedit reads a copy of its own
        users = self._known_users(user)
        write_nss(self.layout, users)
        passwd, group = render_nss(users)
        tag = f"{os.getpid()}.{threading.get_ident()}"
        own_passwd = self.layout.passwd.with_name(f"passwd.{tag}.pdbedit")
        own_group = self.layout.group.with_name(f"group.{tag}.pdbedit")
        try:
            _write_atomic(own_passwd, passwd)
            _write_atomic(own_group, group)
            # pdbedit, not smbpasswd: smbpasswd -a refuses anyone but root, and the web UI (and
            # the daemon under systemd) run as the service user owning DATA_DIR/smb; -a on an
            # existing entry sets its password
            done = _run_tool(
                self.layout,
                ["pdbedit", "-s", str(self.layout.tools_conf), "-a", "-t", "-u", user.name],
                f"{password}\n{password}\n",
                env={"NSS_WRAPPER_PASSWD": str(own_passwd), "NSS_WRAPPER_GROUP": str(own_group)},
            )
        finally:
            own_passwd.unlink(missing_ok=True)
            own_group.unlink(missing_ok=True)
        give_private_to_owner(self.layout)
        if done.returncode != 0:
            raise errors.IOFailure(
                f"pdbedit -a {user.name} failed: {(done.stderr or done.stdout).strip()}"
            )

    def remove(self, name: str) -> None:
        done = _run_tool(
            self.layout, ["pdbedit", "-s", str(self.layout.tools_conf), "-x", "-u", name]
        )
        give_private_to_owner(self.layout)
        if done.returncode != 0 and "not find" not in (done.stderr + done.stdout).lower():
            log.warning("pdbedit -x %s: %s", name, (done.stderr or done.stdout).strip())

    def names(self) -> list[str]:
        """The users Samba's passdb holds (pdbedit -L)."""
        done = _run_tool(self.layout, ["pdbedit", "-s", str(self.layout.tools_conf), "-L"])
        return sorted(line.split(":", 1)[0] for line in done.stdout.splitlines() if ":" in line)


def _conf_port(conf: Path) -> int | None:
    for line in conf.read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "smb ports" and value.strip().isdigit():
            return int(value.strip())
    return None


def smb_status(layout: SambaLayout) -> dict:
    """smbd's health and sessions, from any process of the appliance (the web UI's too):
    {enabled, running, pid, port, sessions: [{user, machine, protocol}], error}. ``enabled``:
    the daemon has served SMB here (it wrote smb.conf); smbstatus reads the same lock folder."""
    report: dict = {
        "enabled": layout.conf.exists(),
        "running": False,
        "pid": None,
        "port": None,
        "sessions": [],
        "error": None,
        "problem": read_problem(layout),
    }
    if not report["enabled"]:
        return report
    try:
        report["port"] = _conf_port(layout.conf)
    except OSError:
        pass
    pid_file = layout.dir("pid") / "smbd.pid"
    try:
        pid = int(pid_file.read_text().strip())
        os.kill(pid, 0)
        report.update(running=True, pid=pid)
    except (OSError, ValueError):
        return report
    try:
        done = _run_tool(layout, ["smbstatus", "-s", str(layout.conf), "--json", "-b"])
        data = json.loads(done.stdout or "{}")
    except (errors.FsError, subprocess.TimeoutExpired, json.JSONDecodeError) as exc:
        report["error"] = str(exc)
        return report
    if done.returncode != 0:
        report["error"] = f"smbstatus: {(done.stderr or done.stdout).strip()[:300]}"
    for session in (data.get("sessions") or {}).values():
        report["sessions"].append(
            {
                "user": session.get("username"),
                "machine": session.get("remote_machine"),
                "protocol": session.get("session_dialect"),
            }
        )
    return report


# -- Samba's VFS modules ------------------------------------------------------------------------
# smbd loads a share's "vfs objects" at tree connect: one that is not installed refuses every
# tree connect with NT_STATUS_BAD_NETWORK_NAME and says so only in smbd's own log, so they are
# checked before smbd starts and smbd's log is watched for the ones that fail to load anyway.
VFS_PACKAGE = "samba-vfs-modules"  # Debian: catia, fruit, streams_xattr (a Recommends of samba)
MODULE_LOAD_ERROR = "Error loading module"


@dataclass(frozen=True)
class SmbdBuild:
    """Where this smbd looks for its modules (``smbd -b``: MODULESDIR) and the VFS modules
    compiled into it (no file needed)."""

    modules_dir: Path
    builtin: frozenset[str]

    @classmethod
    def probe(cls, smbd: str = "smbd") -> SmbdBuild:
        done = subprocess.run(
            [smbd, "-b"], capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=True
        )
        modules_dir: Path | None = None
        builtin: set[str] = set()
        in_builtin = False
        for line in done.stdout.splitlines():
            key, _, value = line.strip().partition(":")
            if key == "MODULESDIR":
                modules_dir = Path(value.strip())
            if line.startswith("Builtin modules:"):
                in_builtin = True
            elif in_builtin and line.startswith(" "):
                builtin.update(n[4:] for n in line.split() if n.startswith("vfs_"))
            elif in_builtin:
                in_builtin = False
        if modules_dir is None:
            raise errors.IOFailure(f"{smbd} -b names no MODULESDIR: {done.stdout[:300]!r}")
        return cls(modules_dir, frozenset(builtin))

    def module_file(self, name: str) -> Path:
        return Path(name) if "/" in name else self.modules_dir / "vfs" / f"{name}.so"


def configured_vfs_modules(conf_text: str) -> list[str]:
    """Every module named by a ``vfs objects`` line of smb.conf, in order, once."""
    names: list[str] = []
    for line in conf_text.splitlines():
        key, _, value = line.partition("=")
        if key.strip().lower() in ("vfs objects", "vfs object"):
            names += [n for n in value.replace(",", " ").split() if n not in names]
    return names


def missing_vfs_modules(conf_text: str, build: SmbdBuild) -> list[str]:
    """The modules smb.conf names that smbd has neither built in nor as a file."""
    return [
        name
        for name in configured_vfs_modules(conf_text)
        if name not in build.builtin and not build.module_file(name).is_file()
    ]


def missing_modules_problem(missing: list[str], build: SmbdBuild) -> str:
    return (
        f"smbd cannot load the VFS modules {', '.join(missing)} that smb.conf names (not in "
        f"{build.modules_dir / 'vfs'}): every tree connect would fail with "
        f"NT_STATUS_BAD_NETWORK_NAME; install Debian's {VFS_PACKAGE}"
    )


def write_problem(layout: SambaLayout, problem: str | None) -> None:
    """Record (or with None clear) why SMB does not serve, for processes other than this one."""
    if problem is None:
        layout.problem_file.unlink(missing_ok=True)
        return
    _write_atomic(layout.problem_file, json.dumps({"problem": problem, "since_ns": time.time_ns()}))


def read_problem(layout: SambaLayout) -> str | None:
    try:
        return str(json.loads(layout.problem_file.read_text())["problem"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


class SmbdSupervisor(threading.Thread):
    """Keeps smbd running with a smb.conf that follows the catalog's shares and users."""

    def __init__(
        self,
        catalog,
        layout: SambaLayout,
        *,
        mount: Path,
        host: str,
        port: int,
        mount_alive=lambda: True,
        run_smbd: bool = True,
        build: SmbdBuild | None = None,
    ):
        super().__init__(name="smbd-supervisor", daemon=True)
        self.catalog, self.layout, self.mount = catalog, layout, Path(mount)
        self.host, self.port = host, port
        self.mount_alive = mount_alive  # smbd must never share the empty folder under the mount
        # False: shingle-smbd.service runs smbd (the daemon is not root); only smb.conf is written
        self.run_smbd = run_smbd
        self.build = build
        self.problem: str | None = None  # why smbd does not serve (None: it does, or may)
        self._load_error: str | None = None  # a module smbd failed to load, from its log
        self._log_offset = 0
        self.proc: subprocess.Popen | None = None
        # run in smbd's child before exec (shingle-smbd.service drops a capability)
        self.preexec: Callable[[], None] | None = None
        self.restarts = 0
        self._stopping = threading.Event()
        self._refresh_lock = threading.Lock()
        self._conf_text = ""
        self._nss = ("", "")
        self._backoff = RESTART_MIN_S
        self._next_start = 0.0
        self.started_ok = threading.Event()  # set once smbd accepts connections

    # -- configuration --------------------------------------------------------------------------
    def set_mount(self, mount: Path) -> None:
        """Share ``mount`` from now on (shingle-smbd.service's mount point): smb.conf names it
        when this returns."""
        with self._refresh_lock:
            self.mount = Path(mount)
        self.refresh()

    def refresh(self) -> bool:
        """Write smb.conf and the nss files from the catalog; whether anything changed."""
        with self._refresh_lock:  # the thread's round and set_mount() write one after the other
            return self._refresh()

    def _refresh(self) -> bool:
        users = smb_service.list_users(self.catalog)
        shares = smb_service.list_shares(self.catalog, enabled_only=True)
        text = render_conf(self.layout, shares, mount=self.mount, host=self.host, port=self.port)
        nss = render_nss(users)
        changed = False
        if nss != self._nss:
            write_nss(self.layout, users)
            self._nss, changed = nss, True
        if text != self._conf_text:
            _write_atomic(self.layout.conf, text)
            self._conf_text, changed = text, True
        return changed

    # -- smbd -------------------------------------------------------------------------------------
    def _start_smbd(self) -> None:
        out = open(self.layout.log_file, "ab")
        self._log_offset = out.tell()
        self._load_error = None
        try:
            self.proc = subprocess.Popen(
                ["smbd", "--foreground", "--debug-stdout", "-s", str(self.layout.conf)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.layout.env(),
                preexec_fn=self.preexec,
            )
        finally:
            out.close()
        log.info("smbd started (pid %d) on %s:%d", self.proc.pid, self.host, self.port)

    def listening(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=1.0):
                return True
        except OSError:
            return False

    def healthy(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and self.listening()

    def run(self) -> None:
        self.layout.create()
        if self.run_smbd:
            write_problem(self.layout, None)  # a daemon killed before it could clear its own
        while not self._stopping.is_set():
            try:
                if not self.mount_alive():
                    log.error("the namespace mount is gone: stopping smbd")
                    self._stop_smbd()
                    return
                changed = self.refresh()
                if not self.run_smbd:
                    self._stopping.wait(RELOAD_S)
                    continue
                self._report(self._find_problem())
                if self.proc is not None and self.proc.poll() is not None:
                    log.error(
                        "smbd exited with status %s; restarting in %.0f s",
                        self.proc.returncode,
                        self._backoff,
                    )
                    self.proc = None
                    self.restarts += 1
                    self._next_start = time.monotonic() + self._backoff
                    self._backoff = min(self._backoff * 2, RESTART_MAX_S)
                if (
                    self.proc is None
                    and self.problem is None
                    and time.monotonic() >= self._next_start
                ):
                    self._start_smbd()
                    proc = self.proc
                    assert proc is not None  # _start_smbd started it
                    started = time.monotonic()
                    while time.monotonic() - started < 10 and not self._stopping.is_set():
                        if proc.poll() is not None or self.listening():
                            break
                        time.sleep(0.05)
                    if proc.poll() is None:
                        self.started_ok.set()
                        self._backoff = RESTART_MIN_S
                elif changed and self.proc is not None:
                    self.proc.send_signal(signal.SIGHUP)  # smbd re-reads smb.conf
            except CatalogUnreachable:
                pass  # the catalog's outage log counts it; the next round reads the shares again
            except Exception:  # noqa: BLE001 - the supervisor must outlive one bad round
                log.exception("SMB supervisor")
            self._stopping.wait(RELOAD_S)

    def stop(self) -> None:
        self._stopping.set()
        if self.is_alive():
            self.join(STOP_WAIT_S)
        self._stop_smbd()
        if self.run_smbd:
            write_problem(self.layout, None)  # describes a running supervisor only

    # -- what keeps smbd from serving -------------------------------------------------------------
    def _find_problem(self) -> str | None:
        """A VFS module smb.conf names that is not installed (checked before smbd starts and
        after each change), or one smbd's log says it failed to load."""
        if self.build is None:
            self.build = SmbdBuild.probe()
        missing = missing_vfs_modules(self.layout.conf.read_text(), self.build)
        if missing:
            return missing_modules_problem(missing, self.build)
        if (
            self.proc is None
        ):  # only this smbd's lines count: not an earlier run's, nor a dead one's
            self._load_error = None
            return None
        try:
            with open(self.layout.log_file, "rb") as f:
                f.seek(self._log_offset)
                new = f.read()
                self._log_offset = f.tell()
        except OSError:
            new = b""
        for line in new.decode(errors="replace").splitlines():
            if MODULE_LOAD_ERROR in line and self._load_error is None:
                self._load_error = (
                    f"smbd failed to load a VFS module that smb.conf names, so shares naming it "
                    f"refuse every tree connect: {line.strip()[:300]}"
                )
        return self._load_error

    def _report(self, problem: str | None) -> None:
        """One log line when the problem appears, changes or goes; the file for the others."""
        if problem == self.problem:
            return
        if problem is not None:
            log.error("SMB: %s", problem)
        else:
            log.info("SMB: the problem is gone (%s)", self.problem)
        self.problem = problem
        write_problem(self.layout, problem)

    def _stop_smbd(self) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.terminate()  # smbd ends its children (its own process group) and exits
            try:
                proc.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                log.warning("smbd did not stop in %.0f s; killing it", STOP_WAIT_S)
                proc.kill()
                proc.wait(STOP_WAIT_S)
        self.proc = None
