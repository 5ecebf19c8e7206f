"""`shingle doctor`: is this host fit to run the appliance, and what must change.

Every check returns ok, warn (works, but worth a look) or fail (must be
fixed: the command exits non-zero). Before an install the checks run with
the default config, so a host can be vetted first.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import shutil
import socket
import stat
import subprocess
import sys
import tomllib
from pathlib import Path

from appliance import config as config_mod
from appliance.host import install
from appliance.host.checks import Check
from engine.base.errors import ConfigError

MIN_PYTHON = (3, 11)
# BLKGETZONESZ / BLKGETNRZONES (zone geometry of a host-managed drive) arrived in Linux 5.2.
MIN_KERNEL = (5, 2)
FAIL_FREE_BYTES = 256 << 20  # below this the catalog's next checkpoint may not fit
WARN_FREE_BYTES = 1 << 30
ZONED_MODELS = ("host-managed", "host-aware")


def must_fix(results: list[Check]) -> bool:
    return any(r.status == "fail" for r in results)


# -- host ------------------------------------------------------------------------
def check_python(version=None) -> Check:
    version = tuple(version or sys.version_info[:3])
    text = ".".join(map(str, version))
    if version[:2] < MIN_PYTHON:
        return Check(
            "python",
            "fail",
            f"Python {text}",
            f"install Python >= {'.'.join(map(str, MIN_PYTHON))} (Debian 12: python3 3.11)",
        )
    return Check("python", "ok", f"Python {text}")


def parse_kernel_release(release: str) -> tuple[int, int]:
    parts = release.split("-", 1)[0].split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    except ValueError:
        return (0, 0)


def check_kernel(release: str | None = None) -> Check:
    release = release or os.uname().release
    if parse_kernel_release(release) < MIN_KERNEL:
        return Check(
            "kernel",
            "fail",
            f"Linux {release}",
            f"boot Linux >= {MIN_KERNEL[0]}.{MIN_KERNEL[1]} (zoned block device ioctls)",
        )
    return Check("kernel", "ok", f"Linux {release}")


# -- drives ----------------------------------------------------------------------
def block_queue(path: str | Path, sys_root: Path = Path("/sys")) -> Path | None:
    """The sysfs queue/ folder of the disk behind ``path`` (a block device or any file on a
    filesystem); None when there is no block device behind it (tmpfs, overlay, a network
    filesystem)."""
    st = os.stat(path)
    dev = st.st_rdev if stat.S_ISBLK(st.st_mode) else st.st_dev
    node = sys_root / "dev" / "block" / f"{os.major(dev)}:{os.minor(dev)}"
    if not node.exists():
        return None
    node = node.resolve()
    # A partition has no queue/ of its own: the zone model is its disk's.
    for candidate in (node, node.parent):
        if (candidate / "queue" / "zoned").is_file():
            return candidate / "queue"
    return None


def zoned_model(path: str | Path, sys_root: Path = Path("/sys")) -> str | None:
    """The zone model ('none', 'host-aware', 'host-managed') of the block device behind ``path``;
    None when there is no block device behind it."""
    queue = block_queue(path, sys_root)
    return (queue / "zoned").read_text().strip() if queue is not None else None


def check_zoned_schedulers(drives: list[dict], sys_root: Path = Path("/sys")) -> list[Check]:
    """Each zoned-block drive's I/O scheduler: Linux 6.1 keeps the writes to a zone in order
    (zone write locking) only under mq-deadline; under "none" two writes in flight to one zone
    may reach the device out of order and fail."""
    results = []
    for d in drives:
        if d["backend"] != "zoned-block" or d["state"] in ("failed", "removed"):
            continue
        probe = d.get("device") or d["path"]
        try:
            queue = block_queue(probe, sys_root)
            text = (queue / "scheduler").read_text() if queue is not None else ""
        except OSError:
            continue  # check_drives reports a missing or unreadable device
        if not text:
            continue
        chosen = next((w.strip("[]") for w in text.split() if w.startswith("[")), text.strip())
        name = f"drive {d['id']} scheduler"
        if chosen == "mq-deadline":
            results.append(Check(name, "ok", f"{probe}: mq-deadline"))
        else:
            disk = queue.parent.name if queue is not None else probe
            results.append(
                Check(
                    name,
                    "fail",
                    f"{probe}: I/O scheduler {chosen}; zoned writes need mq-deadline",
                    f"echo mq-deadline > /sys/block/{disk}/queue/scheduler, and a udev rule "
                    f'(ACTION=="add|change", KERNEL=="{disk}", ATTR{{queue/scheduler}}='
                    '"mq-deadline") to keep it after a reboot',
                )
            )
    return results


def _drives(config: config_mod.Config) -> list[dict]:
    from sqlalchemy import select

    from engine.catalog import Catalog
    from engine.catalog.models import Drive

    catalog = Catalog(config.catalog_url)
    try:
        table = Drive.__table__
        rows = catalog.run(
            lambda conn: conn.execute(
                select(table.c.id, table.c.path, table.c.backend, table.c.state, table.c.device)
            ).all(),
            write=False,
        )
        return [dict(r._mapping) for r in rows]
    finally:
        catalog.close()


def check_drives(
    drives: list[dict], drives_dir: Path, sys_root: Path = Path("/sys")
) -> list[Check]:
    results = []
    if not drives:
        where = "present" if drives_dir.is_dir() else "missing"
        return [
            Check(
                "drives",
                "warn",
                f"no drives in the catalog (drives_dir {drives_dir} {where})",
                "add drives before storing data (emulated: `shingle init DIR --drives N`)",
            )
        ]
    for d in drives:
        name = f"drive {d['id']}"
        if d["state"] in ("failed", "removed"):
            results.append(
                Check(
                    name,
                    "warn",
                    f"{d['path']} is {d['state']}",
                    "replace it and run `shingle rebuild`",
                )
            )
            continue
        path = Path(d["path"])
        if not path.exists():
            results.append(
                Check(
                    name,
                    "fail",
                    f"{path} does not exist (state {d['state']})",
                    "mount the drive, or mark it failed so its stripes are rebuilt",
                )
            )
            continue
        if not os.access(path, os.R_OK | os.W_OK):
            results.append(
                Check(
                    name,
                    "fail",
                    f"{path} is not readable and writable by uid {os.getuid()}",
                    f"chown it to the service user {install.SERVICE_USER!r} (or add it to group "
                    "disk)",
                )
            )
            continue
        probe = d.get("device") or path
        try:
            model = zoned_model(probe, sys_root)
        except OSError as exc:
            results.append(Check(name, "fail", f"{probe}: {exc.strerror}", "check the device node"))
            continue
        kind = {
            None: "no block device (virtual filesystem)",
            "none": "conventional (not zoned)",
        }.get(model, model)
        if d["backend"] == "zoned-block" and model not in ZONED_MODELS:
            results.append(
                Check(
                    name,
                    "fail",
                    f"{probe}: backend zoned-block but the device is {kind}",
                    "use a host-managed/host-aware SMR drive, or a zone-file drive on a filesystem",
                )
            )
        else:
            results.append(Check(name, "ok", f"{path} ({d['backend']}, {kind}, {d['state']})"))
    return results


# -- space, ports, clock -----------------------------------------------------------
def check_free_space(paths: dict[str, Path]) -> list[Check]:
    results, seen = [], set()
    for label, path in paths.items():
        probe = path
        while not probe.exists() and probe != probe.parent:
            probe = (
                probe.parent
            )  # before install the folder does not exist yet: its parent's filesystem counts
        dev = os.stat(probe).st_dev
        if dev in seen:
            continue
        seen.add(dev)
        free = shutil.disk_usage(probe).free
        detail = f"{config_mod.format_size(free)} free for {label} ({path})"
        if free < FAIL_FREE_BYTES:
            results.append(
                Check(
                    "free space",
                    "fail",
                    detail,
                    f"free at least {config_mod.format_size(FAIL_FREE_BYTES)} on {probe}",
                )
            )
        elif free < WARN_FREE_BYTES:
            results.append(Check("free space", "warn", detail, f"free space on {probe}"))
        else:
            results.append(Check("free space", "ok", detail))
    return results


def is_shingle_process(cmdline: list[str]) -> bool:
    """The daemon or the web UI: `shingle ...`, `python -m appliance.cli ...`, or
    gunicorn serving webui."""
    return any(
        os.path.basename(arg) == "shingle" or arg == "appliance.cli" or arg.startswith("webui.app")
        for arg in cmdline
    )


def _listener(port: int):
    """(pid, command line) of the process listening on TCP ``port``, or None."""
    import psutil

    try:
        conns = psutil.net_connections(kind="tcp")
    except psutil.AccessDenied:
        return None
    for c in conns:
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port:
            if c.pid is None:
                return (None, [])
            try:
                return (c.pid, psutil.Process(c.pid).cmdline())
            except psutil.Error:
                return (c.pid, [])
    return None


def check_port(label: str, host: str, port: int) -> Check:
    name = f"port {label}"
    if port == 0:
        return Check(name, "ok", f"{host}:0 (a free port is chosen at start)")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
            return Check(name, "ok", f"{host}:{port} is free")
        except OSError as exc:
            err = exc.errno
    if err == errno.EACCES:
        return Check(
            name,
            "ok",
            f"{host}:{port} is privileged; shingle-nfsd.service grants CAP_NET_BIND_SERVICE",
        )
    if err == errno.EADDRNOTAVAIL:
        return Check(
            name,
            "fail",
            f"{host} is not an address of this host",
            f"set {label}.host in the config to an address of this host (or 0.0.0.0)",
        )
    holder = _listener(port)
    if holder is not None:
        pid, cmdline = holder
        if is_shingle_process(cmdline):
            return Check(name, "ok", f"{host}:{port} is held by shingle (pid {pid})")
        who = (
            f"pid {pid}: {' '.join(cmdline)[:80]}"
            if pid
            else "a process of another user or the kernel (e.g. nfsd)"
        )
        hint = (
            " (the kernel NFS server: `systemctl disable --now nfs-server`)" if port == 2049 else ""
        )
        return Check(
            name,
            "fail",
            f"{host}:{port} is held by {who}",
            f"stop it{hint} or set {label}.port in the config to a free port",
        )
    reason = os.strerror(err) if err is not None else "no errno"
    return Check(
        name,
        "fail",
        f"{host}:{port} cannot be bound ({reason})",
        f"free the port or set {label}.port to another one",
    )


def check_heads(config: config_mod.Config) -> Check:
    """The head processes of `shingle serve --heads N` (appliance/heads.py): the running
    listener's heads.json, else what the config would start."""
    from appliance.heads import read_status

    status = read_status(config.data_dir)
    if status is None:
        count = config.get("heads.processes")
        return Check(
            "heads", "ok", f"not serving; `shingle serve` starts {count} (heads.processes)"
        )
    down = [h for h in status["heads"] if not (h["alive"] and h["serving"])]
    restarts = sum(h["restarts"] for h in status["heads"])
    detail = (
        f"{status['count']} behind {status['host']}:{status['port']} (listener pid "
        f"{status['pid']}): {status['count'] - len(down)} serving, {restarts} restarts"
    )
    if down:
        which = ", ".join(str(h["index"]) for h in down)
        return Check(
            "heads",
            "warn",
            f"{detail}; head {which} not serving",
            "a head that keeps dying says why in the daemon's log (lines with head=I)",
        )
    return Check("heads", "ok", detail)


class _Timex(ctypes.Structure):
    # struct timex (linux/timex.h) up to `status`; the kernel fills a buffer sized by _pad.
    _fields_ = [
        ("modes", ctypes.c_uint),
        ("offset", ctypes.c_long),
        ("freq", ctypes.c_long),
        ("maxerror", ctypes.c_long),
        ("esterror", ctypes.c_long),
        ("status", ctypes.c_int),
        ("_pad", ctypes.c_byte * 256),
    ]


TIME_ERROR = 5
STA_UNSYNC = 0x0040


def adjtimex_synchronized() -> bool | None:
    """The kernel's own view (what NTP daemons set): None when adjtimex is unavailable."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    tx = _Timex()  # modes 0: read only
    state = libc.adjtimex(ctypes.byref(tx))
    if state < 0:
        return None
    return state != TIME_ERROR and not tx.status & STA_UNSYNC


def check_clock(run=subprocess.run) -> Check:
    fix = (
        "run an NTP client (apt-get install chrony, or systemd-timesyncd) so leases and mtimes "
        "are right"
    )
    if install.systemd_running() and shutil.which("timedatectl"):
        result = run(
            ["timedatectl", "show", "-p", "NTPSynchronized", "--value"],
            capture_output=True,
            text=True,
        )
        if result.returncode == 0 and result.stdout.strip() in ("yes", "no"):
            if result.stdout.strip() == "yes":
                return Check("clock", "ok", "synchronized (timedatectl)")
            return Check("clock", "warn", "not synchronized (timedatectl NTPSynchronized=no)", fix)
    synced = adjtimex_synchronized()
    if synced is None:
        return Check("clock", "warn", "synchronization state unknown (adjtimex failed)", fix)
    if synced:
        return Check("clock", "ok", "synchronized (kernel adjtimex state)")
    return Check(
        "clock", "warn", "not synchronized (kernel adjtimex reports TIME_ERROR/STA_UNSYNC)", fix
    )


# -- config and catalog -------------------------------------------------------------
def check_catalog(config: config_mod.Config) -> Check:
    from engine.catalog.migrate import bounded_url, current_revision, head_revision

    url = config.catalog_url
    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///") :]).exists():
        return Check(
            "catalog",
            "fail",
            f"{url} does not exist",
            "run `shingle install` (or `shingle init DIR`)",
        )
    try:
        revision = current_revision(bounded_url(url))
    except Exception as exc:  # driver errors vary by database; the message is what matters
        return Check(
            "catalog",
            "fail",
            f"{url} unreachable ({exc.__class__.__name__}: {exc})",
            "start the database or fix catalog.url",
        )
    head = head_revision()
    if revision != head:
        return Check(
            "catalog",
            "fail",
            f"{url} at schema revision {revision}, the code needs {head}",
            "run `shingle install` to migrate it (config and data are kept)",
        )
    return Check("catalog", "ok", f"{url} at revision {head}")


def check_export_folders(config: config_mod.Config) -> Check:
    """Export folders in a state older versions left: a root squashed to someone other than
    the folder's owner, whose open of a new file Linux clients refuse (engine.admin.exports.
    root_create_refused), and a world-writable folder without its sticky bit, as a squashed
    root could leave it (engine.admin.exports.sticky_bit_lost). Warnings: nothing is lost yet."""
    from engine.admin import exports as export_service
    from engine.catalog.database import Catalog
    from engine.catalog.migrate import bounded_url
    from engine.namespace import Namespace

    catalog = Catalog(bounded_url(config.catalog_url))
    try:
        namespace = Namespace(catalog)
        problems = []
        for e in export_service.list_exports(catalog):
            if export_service.sticky_bit_lost(namespace, e):
                problems.append(
                    (
                        e,
                        "world-writable without the sticky bit: any client user may remove "
                        "or rename every other user's files there",
                    )
                )
            elif export_service.root_create_refused(namespace, e):
                problems.append(
                    (
                        e,
                        "a sticky world-writable folder not owned by the export's anonymous "
                        "user, so Linux clients' fs.protected_regular refuses a root user's "
                        "open of a new file there (EACCES) after the server made it",
                    )
                )
    finally:
        catalog.close()
    if not problems:
        return Check(
            "export folders",
            "ok",
            "sticky where world-writable; root clients can open the files they create",
        )
    return Check(
        "export folders",
        "warn",
        "; ".join(f"export {e.id} ({e.name}: {e.path}): {why}" for e, why in problems),
        "; ".join(f"shingle exports own-folder {e.id}" for e, _ in problems),
    )


def check_units(root: Path) -> Check:
    unit_dir = install.under_root(root, install.UNIT_DIR)
    roles = install.installed_roles(root)
    if not roles:
        return Check(
            "units",
            "warn",
            f"not installed in {unit_dir}: no role's units ({', '.join(install.SHIPPED_UNITS)})",
            "run `shingle install`",
        )
    # The launcher an install wrote into ExecStart=, to compare each unit with
    # what this version ships.
    first = unit_dir / install.ROLE_SERVICES[roles[0]][0]
    exec_start = [line for line in first.read_text().splitlines() if line.startswith("ExecStart=")]
    launcher = exec_start[0].split("=", 1)[1].split()[0] if exec_start else install.UNIT_BIN
    expected = install.unit_texts(roles, launcher)
    missing = [n for n in expected if not (unit_dir / n).is_file()]
    if missing:
        return Check(
            "units",
            "warn",
            f"roles {', '.join(roles)}: not installed in {unit_dir}: {', '.join(missing)}",
            "run `shingle install`",
        )
    stale = [name for name, text in expected.items() if (unit_dir / name).read_text() != text]
    if stale:
        return Check(
            "units",
            "warn",
            f"{', '.join(stale)} in {unit_dir} differ from the units of this version",
            "run `shingle install` (edits belong in drop-ins: systemctl edit UNIT)",
        )
    return Check("units", "ok", f"roles {', '.join(roles)}: {', '.join(expected)} in {unit_dir}")


def check_unit_paths(root: Path, config: config_mod.Config, drive_paths: list[str]) -> Check:
    """ProtectSystem=strict makes everything read-only but the unit's ReadWritePaths=:
    drives must be among them."""
    service = install.SERVICES[0]
    granted = set(install.unit_writable_paths(root) or [])
    needed = [install.STATE_DIR, *install.extra_rw_paths(root, config, drive_paths)]
    hidden = [str(p) for p in needed if not any(p == g or g in p.parents for g in granted)]
    if hidden:
        return Check(
            "unit paths",
            "fail",
            f"{service} may not write {', '.join(hidden)} (ProtectSystem=strict)",
            "run `shingle install` again: it writes a ReadWritePaths= drop-in for them",
        )
    return Check("unit paths", "ok", f"{service} may write data_dir and every drive")


def check_unit_exec(root: Path) -> list[Check]:
    """Each service's ExecStart= as its User= meets it inside its sandbox (ProtectHome,
    PrivateTmp): every file of the chain reachable and executable, or 203/EXEC at start."""
    from appliance.host import unitexec

    unit_dir = install.under_root(root, install.UNIT_DIR)
    results = []
    for service in (*install.SERVICES, install.AGENT_SERVICE):
        unit = unit_dir / service
        if not unit.is_file():
            continue
        dropins = sorted((unit_dir / f"{service}.d").glob("*.conf"))
        sandbox = unitexec.read_service([p.read_text() for p in [unit, *dropins]])
        chain, problems = unitexec.exec_problems(sandbox, root)
        name = f"exec {service}"
        if problems:
            results.append(
                Check(
                    name,
                    "fail",
                    f"{sandbox.user or 'root'} cannot start {' '.join(sandbox.exec_start[:1])}: "
                    + "; ".join(problems),
                    "run `shingle install` from the checkout (it builds a venv in /opt/shingle "
                    "that the service user can execute)",
                )
            )
        else:
            results.append(
                Check(
                    name,
                    "ok",
                    f"{sandbox.user or 'root'} may execute {' -> '.join(map(str, chain))}",
                )
            )
    return results


def check_service_user(root: Path) -> Check:
    import pwd

    if not install.is_host_root(root):
        return Check(
            "service user",
            "ok",
            f"created on the target by systemd-sysusers ({install.SYSUSERS_PATH})",
        )
    try:
        pwd.getpwnam(install.SERVICE_USER)
        return Check("service user", "ok", f"{install.SERVICE_USER} exists")
    except KeyError:
        return Check(
            "service user",
            "fail",
            f"user {install.SERVICE_USER!r} missing: the units cannot start",
            f"run `systemd-sysusers {install.SYSUSERS_PATH}` or `shingle install`",
        )


def _load_config(config_path: str | None, root: Path):
    """(config, Check) for the config the checks use; config is None when it cannot load."""
    if config_path is None and os.environ.get("SHINGLE_CONFIG"):
        config_path = os.environ["SHINGLE_CONFIG"]
    installed = install.under_root(root, install.UNIT_DIR / install.SERVICES[0]).is_file()
    try:
        if config_path is None:
            config = install.load_installed_config(root)
        else:
            config = config_mod.load(config_path)
        return config, Check("config", "ok", f"{config.path} is valid")
    except ConfigError as exc:
        path = config_path or install.under_root(root, install.CONFIG_PATH)
        if not Path(path).exists() and install.installed_roles(root) == ("storage",):
            return None, Check(
                "config", "ok", f"{path} absent: a storage host's agent reads only its own settings"
            )
        if not Path(path).exists() and not installed and config_path is None:
            # Before the first install: vet the host against the defaults.
            defaults = config_mod.from_dict(
                tomllib.loads(config_mod.render({"appliance.data_dir": str(install.STATE_DIR)})),
                None,
            )
            return defaults, Check(
                "config",
                "warn",
                f"{path} missing: not installed yet, checking the defaults",
                "run `shingle install`",
            )
        return None, Check(
            "config", "fail", str(exc), f"fix {path} (`shingle config sample` shows every option)"
        )


# -- Kerberos ------------------------------------------------------------------------------------
KRB5_SKEW_S = 300  # MIT's default clockskew: a client ticket further off is refused


def check_kerberos(keytab: str, principal: str = "", run=subprocess.run) -> list[Check]:
    """nfs.krb5_keytab: readable, holding the service key (``principal``, else any nfs/ key),
    and the clock against the realm's KDC (the offset MIT records when it gets a ticket with
    that key; a KDC that does not answer leaves it unknown)."""
    fix = "make nfs/HOST@REALM in the KDC and `ktadd -k KEYTAB` it (docs/security.md)"
    try:
        with open(keytab, "rb"):
            pass
    except OSError as exc:
        return [Check("krb5 keytab", "fail", f"{keytab}: {exc.strerror}", fix)]
    listed = run(["klist", "-k", keytab], capture_output=True, text=True)
    names = sorted({line.split()[-1] for line in listed.stdout.splitlines()[3:] if line.strip()})
    want = service_principal(principal)
    found = [n for n in names if (n.startswith(want) if want else n.startswith("nfs/"))]
    if listed.returncode != 0 or not found:
        what = want or "nfs/ service key"
        return [Check("krb5 keytab", "fail", f"{keytab} holds no {what} ({names})", fix)]
    results = [Check("krb5 keytab", "ok", f"{keytab}: {', '.join(found)}")]
    results.append(_kdc_clock(keytab, found[0], run))
    return results


def service_principal(principal: str) -> str:
    """'nfs@host' (a GSS host-based name) -> 'nfs/host@'; 'nfs/host@R' as it is."""
    if principal and "/" not in principal and "@" in principal:
        service, host = principal.split("@", 1)
        return f"{service}/{host}@"
    return principal


def _kdc_clock(keytab: str, principal: str, run) -> Check:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="shingle-doctor-") as tmp:
        cache = Path(tmp) / "ccache"
        got = run(
            ["kinit", "-k", "-t", keytab, "-c", f"FILE:{cache}", principal],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if got.returncode != 0:
            detail = (got.stderr or got.stdout).strip().splitlines()[-1:] or ["no answer"]
            if "skew" in detail[0].lower():
                return Check("krb5 clock", "fail", detail[0], "synchronise the clock (NTP)")
            return Check("krb5 clock", "warn", f"no ticket from the KDC: {detail[0]}")
        offset = ccache_time_offset(cache.read_bytes())
    if offset is None:
        return Check("krb5 clock", "ok", "a ticket from the KDC (no clock offset recorded)")
    if abs(offset) > KRB5_SKEW_S:
        return Check(
            "krb5 clock",
            "fail",
            f"{offset:+d} s from the KDC (at most {KRB5_SKEW_S} s)",
            "synchronise the clock (NTP)",
        )
    return Check("krb5 clock", "ok", f"{offset:+d} s from the KDC")


def ccache_time_offset(data: bytes) -> int | None:
    """The KDC's clock minus ours, in seconds, from an MIT ccache (file format 4 keeps it in
    its header's DeltaTime tag when kdc_timesync is on, the default)."""
    if len(data) < 4 or data[:2] != b"\x05\x04":
        return None
    end = 4 + int.from_bytes(data[2:4], "big")
    pos = 4
    while pos + 4 <= end:
        tag = int.from_bytes(data[pos : pos + 2], "big")
        length = int.from_bytes(data[pos + 2 : pos + 4], "big")
        if tag == 1 and length >= 8:
            return int.from_bytes(data[pos + 4 : pos + 8], "big", signed=True)
        pos += 4 + length
    return None


def run_checks(
    config_path: str | None = None, root: str | Path | None = None, sys_root: Path = Path("/sys")
) -> list[Check]:
    root = Path(root or "/").resolve()
    results = [check_kernel(), check_python()]
    config, config_check = _load_config(config_path, root)
    results.append(config_check)
    units = check_units(root)
    results.append(units)
    if units.status == "ok":
        results.append(check_service_user(root))
    results += check_unit_exec(root)
    if config is not None:
        catalog_check = None
        if config.path is not None:
            catalog_check = check_catalog(config)
            results.append(catalog_check)
        if catalog_check is not None and catalog_check.status == "ok":
            results.append(check_export_folders(config))
            drives = _drives(config)
            results += check_drives(drives, config.resolve("storage.drives_dir"), sys_root)
            results += check_zoned_schedulers(drives, sys_root)
            if (
                units.status == "ok" and config_path is None
            ):  # the units serve the installed config only
                results.append(check_unit_paths(root, config, [d["path"] for d in drives]))
        results += check_free_space(
            {"data_dir": config.data_dir, "drives_dir": config.resolve("storage.drives_dir")}
        )
        if config.get("nfs.krb5_keytab"):
            results += check_kerberos(
                config.get("nfs.krb5_keytab"), config.get("nfs.krb5_principal")
            )
        results.append(check_port("nfs", config.get("nfs.host"), config.get("nfs.port")))
        results.append(check_heads(config))
        results.append(check_port("webui", config.get("webui.host"), config.get("webui.port")))
    plan = root / "etc" / "shingle" / "cluster.toml"
    if plan.exists():  # a host of a cluster set up by `shingle cluster plan`
        from appliance.host.clusterdoctor import check_cluster

        member = socket.gethostname().split(".")[0]
        url = config.catalog_url if config is not None else None
        results += check_cluster(plan, root / "etc", member, url)
    results.append(check_clock())
    return results


def print_results(results: list[Check], out) -> None:
    width = max(len(r.name) for r in results)
    for r in results:
        print(f"{r.status.upper():<4}  {r.name:<{width}}  {r.detail}", file=out)
        if r.fix and r.status != "ok":
            print(f"{'':<4}  {'':<{width}}  fix: {r.fix}", file=out)
    fails = sum(r.status == "fail" for r in results)
    warns = sum(r.status == "warn" for r in results)
    verdict = "must be fixed" if fails else "ready"
    print(f"{fails} to fix, {warns} warnings: {verdict}", file=out)
