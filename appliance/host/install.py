"""Lay the appliance onto a host, or onto a staging root, and take it off again.

``install`` is idempotent and doubles as the upgrade: it never overwrites an
existing config, keeps every byte of data, rewrites units that changed and
migrates the catalog to the head revision. With ``root`` set it writes only
below that folder (an image being built, a test) and lists what is left for
the target host in ``report.pending``: the host's users, /etc and systemd
are not touched.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import secrets
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from appliance import config as config_mod
from appliance.agent import folders as folders_mod
from appliance.host.addresses import client_addresses, url_host
from appliance.private import write_private
from engine.base.errors import ConfigError
from engine.catalog.changelog import RING_SUFFIX

log = logging.getLogger("shingle.install")

SERVICE_USER = "shingle"
CONFIG_PATH = Path("/etc/shingle/shingle.toml")
STATE_DIR = Path("/var/lib/shingle")
UNIT_DIR = Path("/etc/systemd/system")
SYSUSERS_PATH = Path("/etc/sysusers.d/shingle.conf")
# The checkout's units; an installed venv keeps a copy (appliance/host/venv.py UNITS_SHARE).
CHECKOUT = Path(__file__).resolve().parents[2]
UNITS_SOURCE = (
    CHECKOUT / "systemd"
    if (CHECKOUT / "systemd" / "shingle.target").is_file()
    else Path(sys.prefix) / "share" / "shingle" / "systemd"
)
TARGET = "shingle.target"
SERVICES = ("shingle-nfsd.service", "shingle-webui.service", "shingle-smbd.service")
# the services that write the drives' paths (shingle-smbd.service writes DATA_DIR/smb only)
DRIVE_SERVICES = SERVICES[:2]
SMBD_SERVICE = SERVICES[2]
UNIT_NAMES = SERVICES + (TARGET,)
# The storage role: the drive agent of a cluster host (`shingle agent`), its settings in an
# environment file the unit reads.
AGENT_SERVICE = "shingle-agent.service"
AGENT_ENV_PATH = Path("/etc/shingle/agent.env")
SHIPPED_UNITS = UNIT_NAMES + (AGENT_SERVICE,)
# head: the daemon, the web UI and SMB (today's single-host appliance is a head with its own
# drives); storage: the drive agent. A host may hold both.
ROLES = ("head", "storage")
ROLE_SERVICES = {"head": SERVICES, "storage": (AGENT_SERVICE,)}
DEFAULT_ROLES = ("head",)
# The launcher path written in the shipped units; replaced by the one this install runs.
UNIT_BIN = "/usr/bin/shingle"
PATHS_DROPIN = "50-shingle-paths.conf"
ADMIN_USER = "admin"
SYSUSERS_LINE = f'u {SERVICE_USER} - "shingle NAS appliance" {STATE_DIR} /usr/sbin/nologin\n'
TMPFILES_PATH = Path("/etc/tmpfiles.d/shingle.conf")
# Applied at boot after systemd-sysusers: gives the daemon read access to its config in an
# image built with --root, where the installer cannot know the user's uid. (StateDirectory=
# chowns /var/lib/shingle.)
TMPFILES_TEXT = (
    f"z {CONFIG_PATH.parent} 0750 root {SERVICE_USER} -\n"
    f"z {CONFIG_PATH} 0640 root {SERVICE_USER} -\n"
)


@dataclass(frozen=True)
class AgentSetup:
    """The storage role's settings: the address the heads reach the agent at, its drive
    folders (as the target host sees them), and the geometry of those made now."""

    listen: str
    drives: tuple[Path, ...]
    fmt: folders_mod.DriveFormat | None = None


def parse_roles(text: str) -> tuple[str, ...]:
    """``head``, ``storage`` or ``head,storage`` (in any order) -> the roles, in ROLES order."""
    named = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [r for r in named if r not in ROLES]
    if unknown or not named:
        raise ConfigError("--role", text, f"one or both of {', '.join(ROLES)} (comma-separated)")
    return tuple(r for r in ROLES if r in named)


def role_services(roles: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(s for r in roles for s in ROLE_SERVICES[r])


def installed_roles(root: Path) -> tuple[str, ...]:
    """The roles whose units are installed under ``root`` (empty: none)."""
    unit_dir = under_root(root, UNIT_DIR)
    return tuple(r for r in ROLES if (unit_dir / ROLE_SERVICES[r][0]).is_file())


def unit_texts(roles: tuple[str, ...], launcher: str) -> dict[str, str]:
    """The units of ``roles`` as installed: the launcher in ExecStart=, and the target
    wanting exactly the roles' services."""
    services = role_services(roles)
    texts = {
        name: (UNITS_SOURCE / name).read_text().replace(UNIT_BIN, launcher) for name in services
    }
    target = []
    for line in (UNITS_SOURCE / TARGET).read_text().splitlines():
        key = line.split("=", 1)[0]
        if key in ("Wants", "After"):
            line = f"{key}={' '.join(services)}"
        elif key == "Description" and roles != DEFAULT_ROLES:
            line = f"Description=shingle host (roles: {', '.join(roles)})"
        target.append(line)
    texts[TARGET] = "\n".join(target) + "\n"
    return texts


def _check_agent(root: Path, agent: AgentSetup) -> None:
    """Refuse, before anything changes, an address or drive folder the agent could not use."""
    host, _, port = agent.listen.rpartition(":")
    if not host or not port.isdigit() or not 1024 <= int(port) <= 65535:
        raise ConfigError(
            "--listen",
            agent.listen,
            "HOST:PORT with a port from 1024 to 65535 (the agent runs without capabilities)",
        )
    if not agent.drives:
        raise ConfigError("--drives", "", "at least one drive folder for the agent")
    for drive in agent.drives:
        if not drive.is_absolute() or any(c.isspace() for c in str(drive)):
            raise ConfigError("--drives", str(drive), "an absolute path without white space")
    if len(set(agent.drives)) != len(agent.drives):
        raise ConfigError("--drives", " ".join(map(str, agent.drives)), "each folder once")
    try:
        missing = folders_mod.missing_drives([under_root(root, d) for d in agent.drives])
        if missing and agent.fmt is not None:
            folders_mod.check_format(agent.fmt)
    except folders_mod.DriveFolderError as exc:
        raise ConfigError("--drives", str(exc), "drive folders, or empty ones to format") from None
    if missing and agent.fmt is None:
        raise ConfigError("--drives", str(missing[0]), "a folder that holds a drive")


def read_agent_env(root: Path) -> AgentSetup | None:
    """The storage role's settings an earlier install wrote (None: none written)."""
    path = under_root(root, AGENT_ENV_PATH)
    if not path.is_file():
        return None
    values = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not key.startswith("#"):
            values[key.strip()] = value.strip()
    return AgentSetup(
        values.get("SHINGLE_AGENT_LISTEN", ""),
        tuple(Path(p) for p in values.get("SHINGLE_AGENT_DRIVES", "").split()),
    )


def _agent_env_text(agent: AgentSetup) -> str:
    return (
        f"# Written by `shingle install --role storage`: the drive agent ({AGENT_SERVICE}).\n"
        "# Edit, then `systemctl restart shingle-agent.service`; a new drive folder must hold a\n"
        "# drive (`shingle install --role storage --drives ...` formats empty ones).\n"
        f"SHINGLE_AGENT_LISTEN={agent.listen}\n"
        f"SHINGLE_AGENT_DRIVES={' '.join(map(str, agent.drives))}\n"
    )


def _install_agent(root: Path, agent: AgentSetup, report: Report, on_host: bool) -> list[Path]:
    """Format the agent's empty drive folders, hand them to the service user and write its
    settings; returns the folders outside /var/lib/shingle (for the unit's drop-in)."""
    folders = [under_root(root, d) for d in agent.drives]
    if agent.fmt is not None:
        for made in folders_mod.format_drives(folders, agent.fmt):
            report.did(f"formatted drive: {made}")
    for folder in folders:
        _chown(folder, on_host)
        for child in folder.iterdir():
            _chown(child, on_host)
    env = under_root(root, AGENT_ENV_PATH)
    env.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
    _write_if_changed(env, _agent_env_text(agent), 0o644, report, "drive agent settings")
    state = under_root(root, STATE_DIR).resolve()
    return [
        _target_path(root, f.resolve())
        for f in folders
        if not (f.resolve() == state or state in f.resolve().parents)
    ]


class InstallError(Exception):
    """A step on the host failed (a command's exit status and message are in the text)."""


@dataclass
class Report:
    """What a run did (``actions``), what it left for the target host (``pending``), and
    what the admin does next."""

    root: Path
    actions: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    next_steps: list[str] = field(default_factory=list)

    def did(self, text: str) -> None:
        self.actions.append(text)
        log.debug("%s", text)


def systemd_running() -> bool:
    """True when PID 1 is systemd (the test sd_booted() makes)."""
    return Path("/run/systemd/system").is_dir()


def under_root(root: Path, path: Path) -> Path:
    """``path`` (absolute, as the target host sees it) inside ``root``."""
    return root / path.relative_to("/")


def is_host_root(root: Path) -> bool:
    return root.resolve() == Path("/")


def _write_if_changed(path: Path, text: str, mode: int, report: Report, what: str) -> bool:
    if path.exists() and path.read_text() == text:
        report.did(f"unchanged {what}: {path}")
        return False
    existed = path.exists()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".shingle-new")
    tmp.write_text(text)
    tmp.chmod(mode)
    os.replace(tmp, path)  # a reader sees the old unit or the new one, never half of one
    report.did(f"{'updated' if existed else 'installed'} {what}: {path}")
    return True


class _RootedConfig(config_mod.Config):
    """A config read inside a staging root: its absolute paths name places on the target host."""

    def __init__(self, config: config_mod.Config, root: Path):
        super().__init__(config.values, config.band_classes, config.path)
        self.root = root
        assert config.path is not None  # read from a file in the staging root
        data_dir = Path(os.path.normpath(config.path.parent / config.get("appliance.data_dir")))
        self.data_dir = (
            under_root(root, data_dir)
            if Path(config.get("appliance.data_dir")).is_absolute()
            else data_dir
        )

    def resolve(self, key: str) -> Path:
        value = Path(self.values[key])
        return (
            under_root(self.root, Path(os.path.normpath(value)))
            if value.is_absolute()
            else self.data_dir / value
        )


def load_installed_config(root: Path) -> config_mod.Config:
    """The installed config, with its paths seen from this host (inside ``root``)."""
    config = config_mod.load(under_root(root, CONFIG_PATH))
    return config if is_host_root(root) else _RootedConfig(config, root)


def _target_path(root: Path, path: Path) -> Path:
    """A path under ``root`` as the target host will see it."""
    if is_host_root(root):
        return path
    return Path("/") / path.resolve().relative_to(root.resolve())


def extra_rw_paths(root: Path, config: config_mod.Config, drive_paths: list[str]) -> list[Path]:
    """Writable paths the units need beyond /var/lib/shingle
    (ProtectSystem=strict hides the rest)."""
    wanted = [config.data_dir, config.resolve("storage.drives_dir")]
    wanted += [
        under_root(root, Path(p)) if not is_host_root(root) else Path(p) for p in drive_paths
    ]
    state = under_root(root, STATE_DIR).resolve()
    extra: list[Path] = []
    for path in wanted:
        resolved = path.resolve()
        if resolved == state or state in resolved.parents:
            continue
        target = _target_path(root, resolved) if not is_host_root(root) else resolved
        if not any(target == p or p in target.parents for p in extra):
            extra.append(target)
    return extra


def unit_writable_paths(root: Path) -> list[Path] | None:
    """The ReadWritePaths= of the installed shingle-nfsd.service and its drop-ins, as the
    target host sees them (None: the unit is not installed)."""
    unit_dir = under_root(root, UNIT_DIR)
    service = SERVICES[0]
    if not (unit_dir / service).is_file():
        return None
    granted: list[Path] = []
    for path in [unit_dir / service, *sorted((unit_dir / f"{service}.d").glob("*.conf"))]:
        for line in path.read_text().splitlines():
            if line.startswith("ReadWritePaths="):
                granted += [Path(p.lstrip("-+")) for p in line.split("=", 1)[1].split()]
    return granted


def _paths_dropin(extra: list[Path], unit: str) -> str:
    lines = [
        f"# Generated by `shingle install` from its settings: paths {unit} writes outside "
        "/var/lib/shingle.",
        "# '-' lets the daemon start with a drive missing (it serves degraded, from redundancy).",
        "[Service]",
    ]
    lines += [f"ReadWritePaths=-{p}" for p in extra]
    return "\n".join(lines) + "\n"


def _chown(path: Path, on_host: bool) -> None:
    if on_host and path.exists():
        shutil.chown(path, SERVICE_USER, SERVICE_USER)


def _ensure_user(report: Report, on_host: bool, run) -> None:
    if not on_host:
        report.pending.append(
            f"create the system user {SERVICE_USER!r}: systemd-sysusers does it at boot "
            f"from {SYSUSERS_PATH} (or run `systemd-sysusers` once)"
        )
        return
    try:
        pwd.getpwnam(SERVICE_USER)
        report.did(f"unchanged service user: {SERVICE_USER}")
        return
    except KeyError:
        pass
    if shutil.which("systemd-sysusers"):
        cmd = ["systemd-sysusers", str(SYSUSERS_PATH)]
    else:
        cmd = [
            "useradd",
            "--system",
            "--user-group",
            "--home-dir",
            str(STATE_DIR),
            "--no-create-home",
            "--shell",
            "/usr/sbin/nologin",
            "--comment",
            "shingle NAS appliance",
            SERVICE_USER,
        ]
    result = run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise InstallError(
            f"creating user {SERVICE_USER!r} with {' '.join(cmd)} failed "
            f"(exit {result.returncode}): {result.stderr.strip()}"
        )
    report.did(f"created service user: {SERVICE_USER}")


def _migrate_catalog(config: config_mod.Config, report: Report, on_host: bool) -> str | None:
    """Upgrade to head; returns the revision found before (None: a new catalog),
    or head when unchanged."""
    from engine.catalog.migrate import current_revision, head_revision, upgrade

    url = config.catalog_url
    head = head_revision()
    try:
        before = current_revision(url)
    except Exception as exc:  # driver errors vary by database; the message is what matters
        raise ConfigError(
            "catalog.url", url, f"a reachable database ({exc.__class__.__name__}: {exc})"
        ) from None
    if before == head:
        report.did(f"unchanged catalog: {url} at revision {head}")
    else:
        upgrade(url)
        report.did(
            f"{'created' if before is None else f'upgraded (from revision {before})'} catalog: "
            f"{url} at revision {head}"
        )
    return before


def _own_catalog_files(config: config_mod.Config, on_host: bool) -> None:
    """An SQLite catalog (and a WAL left behind) belongs to the service user, which writes it."""
    url = config.catalog_url
    if url.startswith("sqlite:///"):
        db = Path(url[len("sqlite:///") :])
        # the change ring (engine/catalog/changelog.py) names files too
        siblings = ("-wal", "-shm", RING_SUFFIX)
        for path in (db, *(db.with_name(db.name + suffix) for suffix in siblings)):
            if path.exists():
                path.chmod(0o640)  # password hashes and token digests: not for every local user
            _chown(path, on_host)


def _first_run_state(
    config: config_mod.Config,
    report: Report,
    on_host: bool,
    upgraded_from: str | None,
    new_catalog: bool = False,
) -> None:
    """What `shingle init` also creates: root inode, default export, first admin, session key."""
    from sqlalchemy import func, select

    from appliance.nfs.exports import ensure_default_export
    from engine.admin import accounts, events
    from engine.admin import exports as export_service
    from engine.catalog import Catalog
    from engine.catalog.models import AdminUser
    from engine.namespace import Namespace

    catalog = Catalog(config.catalog_url)
    try:
        ns = Namespace(catalog)
        if new_catalog:
            export_service.prepare_new_root(ns)  # as `shingle init` does
        ensure_default_export(catalog)
        admins = catalog.run(
            lambda conn: conn.execute(
                select(func.count()).select_from(AdminUser.__table__)
            ).scalar_one(),
            write=False,
        )
        password_file = config.data_dir / "initial-admin-password"
        if admins == 0:
            password = secrets.token_urlsafe(12)
            accounts.create_admin(catalog, ADMIN_USER, password, actor="shingle install")
            password_file.unlink(missing_ok=True)  # left from an earlier catalog that was removed
            write_private(password_file, f"{ADMIN_USER} {password}\n")
            _chown(password_file, on_host)
            events.record(catalog, "appliance.install", "installed", actor="shingle install")
            report.did(f"created admin user {ADMIN_USER!r}: password in {password_file}")
        elif upgraded_from is not None:  # a no-op re-run leaves the catalog untouched
            events.record(
                catalog,
                "appliance.install",
                f"upgraded in place from schema revision {upgraded_from}",
                actor="shingle install",
            )
    finally:
        catalog.close()
    secret = config.resolve("webui.secret_key_file")
    if not secret.exists():
        write_private(secret, secrets.token_hex(32) + "\n")
        _chown(secret, on_host)
        report.did(f"created web UI session key: {secret}")


def _drive_paths(config: config_mod.Config) -> list[str]:
    from sqlalchemy import select

    from engine.catalog import Catalog
    from engine.catalog.models import Drive

    catalog = Catalog(config.catalog_url)
    try:
        return catalog.run(
            lambda conn: [r[0] for r in conn.execute(select(Drive.__table__.c.path))], write=False
        )
    finally:
        catalog.close()


def _require_executable(root: Path, texts: dict[str, str], on_host: bool) -> None:
    """Refuse units whose service user cannot execute their ExecStart= in their sandbox
    (systemd would fail them with 203/EXEC and restart them until it gives up)."""
    from appliance.host import unitexec

    for name in texts:
        if name == TARGET:
            continue
        sandbox = unitexec.read_service([texts[name]])
        _, problems = unitexec.exec_problems(sandbox, root)
        if problems:
            raise InstallError(
                f"{name} could not start: {'; '.join(problems)}. Install shingle and its "
                "Python outside /home, /root and /tmp (`shingle install` without --bin builds "
                "a venv in /opt/shingle); nothing was enabled"
            )


def _require_root_user(on_host: bool, what: str) -> None:
    if on_host and os.geteuid() != 0:
        raise InstallError(
            f"{what} on this host needs root (uid 0, running as uid {os.geteuid()}); "
            "use sudo, or --root DIR to lay out a tree without touching the host"
        )


def install(
    root: str | Path | None = None,
    *,
    launcher: str | None = None,
    venv: str | Path | None = None,
    python: str | None = None,
    index: bool = False,
    roles: tuple[str, ...] | None = None,
    agent: AgentSetup | None = None,
    progress: Callable[[str], None] = lambda text: None,
    run=subprocess.run,
) -> Report:
    """Install or upgrade. ``root`` None or "/" means this host.

    Without ``launcher`` the units run shingle from a venv of its own (``venv``, default
    /opt/shingle, as the target host sees it), built or refreshed from this checkout
    (appliance/host/venv.py); ``launcher`` names an existing `shingle` instead.

    ``roles`` (default: the roles installed already, else the head) picks the units; the
    storage role needs ``agent`` (or the settings an earlier install wrote)."""
    root = Path(root or "/").resolve()
    on_host = is_host_root(root)
    _require_root_user(on_host, "shingle install")
    report = Report(root)
    if launcher is not None and not Path(launcher).is_absolute():
        raise ConfigError(
            "--bin", launcher, "an absolute path (systemd runs ExecStart= without a PATH search)"
        )
    venv_path = None
    if launcher is None:  # a venv: venv.py says where it goes
        from appliance.host import venv as venv_mod

        venv_path = Path(venv or venv_mod.DEFAULT_VENV)
    if venv_path is not None and not venv_path.is_absolute():
        raise ConfigError("--venv", str(venv_path), "an absolute path")
    roles = roles or installed_roles(root) or DEFAULT_ROLES
    agent = _agent_for(root, roles, agent)
    # every shipped unit, kept in the venv too: a later run may add a role
    sources = {name: UNITS_SOURCE / name for name in SHIPPED_UNITS}
    missing = [str(p) for p in sources.values() if not p.is_file()]
    if missing:
        raise ConfigError(
            "systemd units",
            ", ".join(missing),
            "the unit files shipped in systemd/ of the source tree",
        )

    # 0. shingle itself, where the units' sandbox lets the service user execute it (first:
    #    a failed build changes nothing else)
    if venv_path is not None:
        launcher = _install_venv(
            root,
            venv_path,
            sources,
            report,
            python=python,
            index=index,
            progress=progress,
            run=run,
        )
    assert launcher is not None
    # 1. the service user (declared for systemd-sysusers; created now only on this host)
    _write_if_changed(
        under_root(root, SYSUSERS_PATH), SYSUSERS_LINE, 0o644, report, "service user declaration"
    )
    _ensure_user(report, on_host, run)
    _write_if_changed(
        under_root(root, TMPFILES_PATH),
        TMPFILES_TEXT,
        0o644,
        report,
        "config permissions (tmpfiles.d)",
    )
    config, restart = None, False
    if "head" in roles:
        config = _install_config(root, report, on_host)  # 2.
        _make_state_folders(root, config, report, on_host)  # 3.
        restart = _install_catalog(config, report, on_host, run)  # 4.
    agent_paths = _install_agent(root, agent, report, on_host) if agent else []
    texts = unit_texts(roles, launcher)
    _require_executable(root, texts, on_host)
    changed = _drop_other_roles(root, roles, on_host, run, report)
    changed |= _install_units(root, config, texts, report)  # 5.
    if agent:
        changed |= _write_dropin(root, AGENT_SERVICE, agent_paths, report)
    _enable_target(root, on_host, run, report)  # 6.
    if config is not None:
        _add_next_steps(root, config, on_host, report)
    if agent:
        report.next_steps += [
            f"start: systemctl start {TARGET}   (logs: journalctl -u {AGENT_SERVICE} -f)",
            "from a head: shingle cluster join "
            + agent.listen.replace("0.0.0.0:", "THIS-HOST:").replace("[::]:", "THIS-HOST:"),
        ]
    if restart:
        _systemctl(run, "start", TARGET)
        report.did(f"restarted {TARGET} after the upgrade")
    elif changed and on_host and systemd_running():
        report.next_steps.insert(2, f"units changed: `systemctl restart {TARGET}` applies them")
    return report


def _agent_for(root: Path, roles: tuple[str, ...], agent: AgentSetup | None):
    """The storage role's settings, checked; refuses them without that role, and the role
    without them."""
    if "storage" not in roles:
        if agent is not None:
            raise ConfigError(
                "--listen/--drives",
                " ".join(map(str, agent.drives)) or agent.listen,
                "only with --role storage (they are the drive agent's settings)",
            )
        return None
    agent = agent or read_agent_env(root)
    if agent is None:
        raise ConfigError(
            "--role storage",
            "no drives",
            "--listen HOST:PORT and --drives DIR... (the drive agent's address and the "
            "folders it serves)",
        )
    _check_agent(root, agent)
    return agent


def _drop_other_roles(root: Path, roles: tuple[str, ...], on_host: bool, run, report) -> bool:
    """Stop and remove the services of roles installed before but not asked for now."""
    dropped = [s for s in SHIPPED_UNITS if s not in (*role_services(roles), TARGET)]
    present = [s for s in dropped if under_root(root, UNIT_DIR / s).exists()]
    if present and on_host and systemd_running():
        _systemctl(run, "stop", *present, check=False)
    _unlink_units(root, present, report)
    return bool(present)


def _install_venv(root: Path, venv_path: Path, sources: dict, report: Report, **build) -> str:
    """Build or refresh the venv the units run from this checkout: its `shingle`."""
    from appliance.host import venv as venv_mod

    if not (CHECKOUT / "pyproject.toml").is_file():
        raise InstallError(
            f"no checkout at {CHECKOUT} to build {venv_path} from: run `shingle install` "
            "from the source tree, or pass --bin PATH"
        )
    built = under_root(root, venv_path)
    try:
        venv_changed = venv_mod.build(built, CHECKOUT, **build)
    except venv_mod.VenvError as exc:
        raise InstallError(str(exc)) from None
    if not is_host_root(root):
        venv_mod.relocate(built, venv_path)
    venv_mod.keep_units(built, sources)
    report.did(
        f"{'installed' if venv_changed else 'unchanged'} shingle and its dependencies: "
        f"{venv_path} (from {CHECKOUT})"
    )
    return str(venv_path / "bin" / "shingle")


def _install_config(root: Path, report: Report, on_host: bool) -> config_mod.Config:
    """The config: written once, never overwritten (an admin's edits survive every upgrade)."""
    config_path = under_root(root, CONFIG_PATH)
    if config_path.exists():
        load_installed_config(root)  # a broken config stops the upgrade before anything changes
        report.did(f"kept config: {config_path}")
    else:
        config_path.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
        text = config_mod.render({"appliance.data_dir": str(STATE_DIR)}, commented_defaults=True)
        _write_if_changed(config_path, text, 0o640, report, "config")
        if on_host:  # readable by the daemon, not by everyone (it may hold a database password)
            shutil.chown(config_path.parent, "root", SERVICE_USER)
            shutil.chown(config_path, "root", SERVICE_USER)
    return load_installed_config(root)


def _make_state_folders(
    root: Path, config: config_mod.Config, report: Report, on_host: bool
) -> None:
    """The state folders (DATA_DIR/smb too: shingle-smbd.service may write only that folder,
    and a folder made after its start would stay read-only to it)."""
    for folder in dict.fromkeys(
        (
            under_root(root, STATE_DIR),
            config.data_dir,
            config.resolve("storage.drives_dir"),
            config.data_dir / "smb",
        )
    ):
        if folder.is_dir():
            report.did(f"kept data folder: {folder}")
        else:
            folder.mkdir(parents=True, mode=0o750)
            report.did(f"created data folder: {folder}")
        _chown(folder, on_host)


def _install_catalog(config: config_mod.Config, report: Report, on_host: bool, run) -> bool:
    """Migrate the catalog (an existing install is upgraded in place), then its first-run
    state. True when the appliance was stopped for it and is to be started again."""
    from engine.catalog.migrate import bounded_url, current_revision, head_revision

    try:
        # fail in 5 s, not minutes, on an unreachable host
        found = current_revision(bounded_url(config.catalog_url))
    except Exception as exc:  # driver errors vary by database; the message is what matters
        raise ConfigError(
            "catalog.url",
            config.catalog_url,
            f"a reachable database ({exc.__class__.__name__}: {exc})",
        ) from None
    # Only a schema change needs the daemon out of the way; a re-run on a live
    # appliance just refreshes units.
    quiet = (
        _drives_quiet(config, report, on_host, run)
        if found != head_revision()
        else contextlib.nullcontext(False)
    )
    with quiet as restart:
        before = _migrate_catalog(config, report, on_host)
        _first_run_state(
            config,
            report,
            on_host,
            None if before == head_revision() else before,
            new_catalog=before is None,
        )
        _own_catalog_files(config, on_host)
    return restart


def _install_units(
    root: Path, config: config_mod.Config | None, texts: dict[str, str], report: Report
) -> bool:
    """The units, with this install's launcher, and a drop-in for paths outside
    /var/lib/shingle: True when any changed."""
    unit_dir = under_root(root, UNIT_DIR)
    changed = False
    for name, text in texts.items():
        changed |= _write_if_changed(unit_dir / name, text, 0o644, report, "unit")
    if config is None:
        return changed
    extra = extra_rw_paths(root, config, _drive_paths(config))
    smb_dir = config.data_dir.resolve() / "smb"
    state = under_root(root, STATE_DIR).resolve()
    smb_extra = [] if state in smb_dir.parents else [_target_path(root, smb_dir)]
    for service in SERVICES:
        paths = extra if service in DRIVE_SERVICES else smb_extra
        changed |= _write_dropin(root, service, paths, report)
    return changed


def _write_dropin(root: Path, service: str, paths: list[Path], report: Report) -> bool:
    """The ReadWritePaths= drop-in of ``service`` (removed when no path needs one)."""
    dropin = under_root(root, UNIT_DIR) / f"{service}.d" / PATHS_DROPIN
    if paths:
        return _write_if_changed(dropin, _paths_dropin(paths, service), 0o644, report, "drop-in")
    if dropin.exists():
        dropin.unlink()
        _rmdir_if_empty(dropin.parent)
        report.did(f"removed drop-in: {dropin}")
        return True
    return False


def _enable_target(root: Path, on_host: bool, run, report: Report) -> None:
    if on_host and systemd_running():
        _systemctl(run, "daemon-reload")
        _systemctl(run, "enable", TARGET)
        report.did(f"enabled {TARGET} (systemctl daemon-reload; systemctl enable {TARGET})")
    elif on_host:
        report.pending.append(
            f"systemd is not running (no /run/systemd/system): once it is, run "
            f"`systemctl daemon-reload && systemctl enable {TARGET}`"
        )
    else:
        report.pending.append(
            f"enable the appliance in the image: `systemctl --root={root} enable {TARGET}`"
        )


def _add_next_steps(root: Path, config: config_mod.Config, on_host: bool, report: Report):
    password_file = config.data_dir / "initial-admin-password"
    report.next_steps += [
        f'review {CONFIG_PATH} (set nfs.host = "0.0.0.0" to serve the network; nfs.port is '
        f"{config.get('nfs.port')})",
        f"check the host: shingle -c {CONFIG_PATH} doctor",
        f"start: systemctl start {TARGET}   (logs: journalctl -u 'shingle-*' -f)",
        f"web UI: http://{url_host(client_addresses(config.get('webui.host'))[0])}:"
        f"{config.get('webui.port')}/  (first admin "
        f"login in {_target_path(root, password_file) if not on_host else password_file})",
    ]


@contextlib.contextmanager
def _drives_quiet(config: config_mod.Config, report: Report, on_host: bool, run):
    """Hold the daemon lock while the catalog is migrated: a running daemon would meet
    a schema it does not know.

    Yields True when it stopped the appliance (systemd on this host) and the caller
    should start it again."""
    from appliance.daemonlock import DaemonLock

    lock = DaemonLock(config.data_dir)
    stopped = False
    if not lock.acquire():
        holder = lock.holder()
        if not (on_host and systemd_running()):
            raise InstallError(
                f"a shingle daemon (pid {holder}) serves {config.data_dir}: stop it first "
                f"(`systemctl stop {TARGET}` or end `shingle serve`), then run install again"
            )
        _systemctl(run, "stop", TARGET, *SERVICES)
        report.did(f"stopped {TARGET} for the upgrade (daemon pid {holder})")
        stopped = True
        if not lock.acquire():
            raise InstallError(
                f"process {lock.holder()} still holds {lock.path} after `systemctl stop {TARGET}`: "
                "a daemon outside systemd serves this data; stop it, then run install again"
            )
    _chown(lock.path, on_host)  # the daemon, as the service user, opens it read-write
    try:
        yield stopped
    finally:
        lock.release()


def _rmdir_if_empty(path: Path) -> None:
    try:
        path.rmdir()
    except OSError:
        pass


def _systemctl(run, *args: str, check: bool = True) -> None:
    result = run(["systemctl", *args], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise InstallError(
            f"systemctl {' '.join(args)} failed (exit {result.returncode}): {result.stderr.strip()}"
        )


def uninstall(root: str | Path | None = None, *, purge: bool = False, run=subprocess.run) -> Report:
    """Remove the units (and with ``purge`` the config and /var/lib/shingle).
    Data stays unless purged."""
    root = Path(root or "/").resolve()
    on_host = is_host_root(root)
    _require_root_user(on_host, "shingle uninstall")
    report = Report(root)
    config = None
    if purge and under_root(root, CONFIG_PATH).exists():
        try:
            config = load_installed_config(root)
        except ConfigError as exc:
            report.pending.append(
                f"config unreadable ({exc}): remove any data it points at yourself"
            )
    agent = read_agent_env(root) if purge else None
    _remove_units(root, on_host, run, report)
    if not purge:
        report.next_steps.append(
            f"kept config {under_root(root, CONFIG_PATH).parent} and data "
            f"{under_root(root, STATE_DIR)}: `shingle install` brings the appliance back; "
            "`shingle uninstall --purge` deletes them"
        )
        if not report.actions:
            report.did("nothing to remove: no shingle units installed")
        return report
    _purge(root, config, report)
    state = under_root(root, STATE_DIR)
    for drive in agent.drives if agent else ():
        if state not in under_root(root, drive).parents and under_root(root, drive).exists():
            report.pending.append(f"kept agent drive {drive}: delete it yourself if unused")
    if on_host:
        report.next_steps.append(
            f"the system user {SERVICE_USER!r} is kept (Debian practice: files elsewhere "
            f"may still carry its uid); `userdel {SERVICE_USER}` removes it"
        )
    if not report.actions:
        report.did("nothing to remove: shingle is not installed")
    return report


def _remove_units(root: Path, on_host: bool, run, report: Report) -> None:
    if on_host and systemd_running():
        _systemctl(run, "disable", "--now", TARGET, check=False)
        _systemctl(run, "stop", *SERVICES, AGENT_SERVICE, check=False)
        report.did(f"stopped and disabled {TARGET}")
    _unlink_units(root, SHIPPED_UNITS, report)
    if on_host and systemd_running():
        _systemctl(run, "daemon-reload", check=False)


def _unlink_units(root: Path, names, report: Report) -> None:
    unit_dir = under_root(root, UNIT_DIR)
    for name in names:
        path = unit_dir / name
        if path.exists():
            path.unlink()
            report.did(f"removed unit: {path}")
        dropins = unit_dir / f"{name}.d"
        if (dropins / PATHS_DROPIN).exists():
            (dropins / PATHS_DROPIN).unlink()
            report.did(f"removed drop-in: {dropins / PATHS_DROPIN}")
        _rmdir_if_empty(dropins)


def _purge(root: Path, config: config_mod.Config | None, report: Report) -> None:
    """Delete the config, the state folder and the host declarations; say what stays (data
    outside the state folder, a PostgreSQL catalog)."""
    for path in (under_root(root, CONFIG_PATH).parent, under_root(root, STATE_DIR)):
        if path.exists():
            shutil.rmtree(path)
            report.did(f"purged: {path}")
    for path, what in (
        (under_root(root, SYSUSERS_PATH), "service user declaration"),
        (under_root(root, TMPFILES_PATH), "config permissions (tmpfiles.d)"),
    ):
        if path.exists():
            path.unlink()
            report.did(f"removed {what}: {path}")
    if config is None:
        return
    for path in (config.data_dir, config.resolve("storage.drives_dir")):
        if path.exists():
            report.pending.append(
                f"kept {path}: it lies outside {STATE_DIR}; delete it yourself if unused"
            )
    if not config.catalog_url.startswith("sqlite"):
        report.pending.append(f"kept the catalog database {config.catalog_url}: drop it yourself")


def print_report(report: Report, title: str, out=None) -> None:
    out = out or sys.stdout
    print(f"{title} (root {report.root})", file=out)
    for line in report.actions:
        print(f"  {line}", file=out)
    if report.pending:
        print("left for the target host:", file=out)
        for line in report.pending:
            print(f"  - {line}", file=out)
    if report.next_steps:
        print("next steps:", file=out)
        for i, line in enumerate(report.next_steps, 1):
            print(f"  {i}. {line}", file=out)
