"""The `shingle` command line.

Each subcommand is a function ``cmd_NAME(args)`` registered in ``build_parser``;
commands of a domain live beside it (appliance/cli_*.py) and register
themselves through their ``register(subparsers)``. Errors a user can fix
(bad config, bad arguments, catalog out of date) print one line and exit 2;
no traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import shutil
import signal
import sys
import threading
from pathlib import Path

from appliance import config as config_mod
from appliance import log as log_mod
from engine import errors
from engine.units import format_size
from engine.version import python_version, version

DEFAULT_CONFIG = "/etc/shingle/shingle.toml"
LOCAL_CONFIG = "var/appliance/shingle.toml"  # what ./run-appliance makes, relative to the checkout
EXIT_USAGE = 2
EXIT_JOB_ABANDONED = 3  # the daemon running the job we waited for stopped
log = logging.getLogger("shingle.cli")


class UsageError(Exception):
    """A mistake the user can fix: printed as one line, exit code 2."""


def size_arg(text: str) -> int:
    try:
        return config_mod.parse_size(text, "size")
    except errors.ConfigError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: expected {exc.expected}") from None


def find_config(explicit: str | None) -> Path:
    """The config file: -c, then $SHINGLE_CONFIG, then ./var/appliance (./run-appliance's), then
    /etc/shingle (an installed appliance). A path given by -c or the variable is used as it is, so a
    typo there is reported instead of silently falling through to another appliance."""
    if explicit:
        return Path(explicit)
    if os.environ.get("SHINGLE_CONFIG"):
        return Path(os.environ["SHINGLE_CONFIG"])
    tried = [Path(LOCAL_CONFIG), Path(DEFAULT_CONFIG)]
    for path in tried:
        if path.is_file():
            return path.resolve()  # children (the web UI, gunicorn) may start in another folder
    raise UsageError(
        "no config file found: tried -c (not given), $SHINGLE_CONFIG (not set), "
        f"./{LOCAL_CONFIG} and {DEFAULT_CONFIG}; pass -c DIR/shingle.toml or "
        "export SHINGLE_CONFIG=DIR/shingle.toml (`shingle init DIR` makes one)"
    )


def load_config(args) -> config_mod.Config:
    return config_mod.load(find_config(args.config))


# -- init ---------------------------------------------------------------------
def cmd_init(args) -> int:
    from appliance.nfs.exports import ensure_default_export
    from appliance.private import write_private
    from engine import accounts, events
    from engine import exports as export_service
    from engine.catalog import Catalog, upgrade
    from engine.drives import format_emulated
    from engine.namespace import Namespace

    root = Path(args.dir).resolve()
    config_path = root / "shingle.toml"
    if config_path.exists():
        raise UsageError(
            f"{config_path} exists: this folder is already initialized "
            "(remove it or choose another folder)"
        )
    if args.drives < 1:
        raise UsageError(f"--drives {args.drives}: expected at least 1")
    overrides = {"appliance.data_dir": "."}
    if args.catalog:
        overrides["catalog.url"] = args.catalog
    if args.nfs_port is not None:
        overrides["nfs.port"] = args.nfs_port
    if args.web_port is not None:
        overrides["webui.port"] = args.web_port
    if args.tls:
        overrides.update(
            {"webui.tls_cert_file": "webui-tls.crt", "webui.tls_key_file": "webui-tls.key"}
        )
    text = config_mod.render(overrides, commented_defaults=True)
    config = config_mod.from_dict(__import__("tomllib").loads(text), config_path)
    policies = config.policies()
    k_m = max(
        (p.k + p.m) if getattr(p, "redundancy", "ec") == "ec" else p.copies
        for p in policies.values()
    )
    if args.drives < k_m:
        raise UsageError(
            f"--drives {args.drives}: the band classes need at least {k_m} drives "
            "(a stripe puts each fragment on a different drive)"
        )
    drives_dir = config.resolve("storage.drives_dir")
    zones_bytes = args.drives * (args.drive_size // args.zone_size) * args.zone_size
    if args.preallocate:
        _check_room(drives_dir, zones_bytes)
    root.mkdir(parents=True, exist_ok=True)
    upgrade(config.catalog_url)
    config_path.write_text(text)
    catalog = Catalog(config.catalog_url)
    try:
        # any client user may make its own folders; a squashed root client writes too
        export_service.prepare_new_root(Namespace(catalog))
        drive_ids = format_emulated(
            catalog,
            drives_dir,
            args.drives,
            args.drive_size,
            args.zone_size,
            preallocate=args.preallocate,
        )
        ensure_default_export(catalog)
        password = secrets.token_urlsafe(12)
        accounts.create_admin(catalog, args.admin_user, password, actor="shingle init")
        password_file = root / "initial-admin-password"
        password_file.unlink(missing_ok=True)  # left from an earlier catalog that was removed
        write_private(password_file, f"{args.admin_user} {password}\n")
        secret = config.resolve("webui.secret_key_file")
        if not secret.exists():
            write_private(secret, secrets.token_hex(32) + "\n")
        if args.tls:
            from appliance.tls import make_self_signed, names_for

            cert, key = config.resolve("webui.tls_cert_file"), config.resolve("webui.tls_key_file")
            for stale in (cert, key):
                stale.unlink(missing_ok=True)
            made_by = make_self_signed(cert, key, names_for(config.get("webui.host")))
        events.record(
            catalog,
            "appliance.init",
            f"initialized with {len(drive_ids)} emulated drives",
            actor="shingle init",
        )
    finally:
        catalog.close()
    print(f"initialized {root}")
    print(f"  config:   {config_path}")
    print(f"  catalog:  {config.catalog_url}")
    fmt = format_size
    print(
        f"  drives:   {len(drive_ids)} x {fmt(args.drive_size)} ({fmt(args.zone_size)} zones) "
        f"in {drives_dir}"
    )
    if args.preallocate:
        print(
            f"  disk:     {fmt(zones_bytes)} of real disk reserved now (zone files preallocated; "
            "--no-preallocate makes them grow as written)"
        )
    else:
        print(
            f"  disk:     {fmt(_allocated_bytes(drives_dir))} of real disk now, growing as "
            f"data is written, up to {fmt(zones_bytes)} (zone files not preallocated)"
        )
    print(f"  admin:    user {args.admin_user!r}, password in {password_file}")
    print(f"  use it:   export SHINGLE_CONFIG={config_path}")
    if args.tls:
        print(
            f"  HTTPS:    self-signed certificate {config.resolve('webui.tls_cert_file')} "
            f"(made with {made_by}; replace it with one your browsers trust)"
        )
    return 0


def _check_room(drives_dir: Path, needed: int) -> None:
    """Preallocating more than the host disk holds fails half-way: say so before starting."""
    probe = drives_dir
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if needed > free:
        raise UsageError(
            f"the zone files need {format_size(needed)} of real disk and {probe} has "
            f"{format_size(free)} free: use --no-preallocate (zone files grow as "
            "written), fewer --drives or a smaller --drive-size"
        )


def _allocated_bytes(folder: Path) -> int:
    """Real disk used by the files under ``folder`` (st_blocks, not their apparent length)."""
    return sum(p.lstat().st_blocks * 512 for p in folder.rglob("*") if p.is_file())


# -- status --------------------------------------------------------------------
def cmd_status(args) -> int:
    from appliance.runtime import open_catalog
    from appliance.status import gather, smb_line, smb_report

    config = load_config(args)
    catalog = open_catalog(config)
    try:
        report = gather(catalog, config.policies(), config.get("storage.reserve_zones"))
        report["smb"] = smb_report(config.data_dir, catalog)
    finally:
        catalog.close()
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
        return 0
    fmt = format_size
    cat, cap = report["catalog"], report["capacity"]
    print(
        f"catalog   {cat['backend']} {cat['url']} (schema {cat['revision']}), {cat['inodes']} "
        "inodes"
    )
    print(
        f"capacity  usable {fmt(cap['usable_bytes'])}, free {fmt(cap['free_bytes'])}, "
        f"raw {fmt(cap['raw_bytes'])}, live {fmt(cap['live_bytes'])}, garbage "
        f"{fmt(cap['garbage_bytes'])}"
    )
    red = report["redundancy"]
    if red["under_protected"] or red["lost"]:
        print(
            f"redundancy REDUCED: {red['under_protected']} of {red['stripes']} stripes "
            f"under-protected, {red['no_redundancy']} with no redundancy left, {red['lost']} "
            "lost; `shingle drives add PATH` / `drives replace OLD PATH`, then `shingle rebuild`"
        )
    else:
        print(f"redundancy full: {red['stripes']} stripes, none under-protected")
    print(f"drives    {len(report['drives'])}")
    for d in report["drives"]:
        print(
            f"  {d['id']:>3} {d['state']:<9} {fmt(d['size_bytes']):>10}  zones {d['zones_empty']} "
            f"empty / {d['zones_open']} open / {d['zones_full']} full  {d['path']}"
        )
    print(f"smb       {smb_line(report['smb'])}")
    return 0


# -- fsck ------------------------------------------------------------------------
def cmd_fsck(args) -> int:
    from appliance.runtime import open_catalog
    from engine.fsck import check
    from engine.namespace import ROOT_INO_KEY

    config = load_config(args)
    catalog = open_catalog(config)
    try:
        root_ino = catalog.get_setting(ROOT_INO_KEY, "1")
        assert root_ino is not None  # the default
        report = check(catalog, int(root_ino))
    finally:
        catalog.close()
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print(
            f"{report.inodes} inodes, {report.dirents} entries, {report.extents} extents: "
            f"{'clean' if report.clean else f'{len(report.problems)} problems'}"
        )
        for problem in report.problems:
            print(f"  {problem}")
    return 0 if report.clean else 1


# -- bench -----------------------------------------------------------------------
BENCH_DIR = Path(__file__).resolve().parent.parent / "bench"


def cmd_bench(args) -> int:
    """Benchmarks live in the source tree's bench/ (they are not installed)."""
    import subprocess

    available = (
        sorted(p.stem for p in BENCH_DIR.glob("*.py") if not p.stem.startswith("_"))
        if BENCH_DIR.is_dir()
        else []
    )
    if args.name not in available:
        raise UsageError(
            f"benchmark {args.name!r}: expected one of "
            f"{', '.join(available) or '(none: not a source checkout)'}"
        )
    return subprocess.call([sys.executable, str(BENCH_DIR / f"{args.name}.py"), *args.bench_args])


# -- config ----------------------------------------------------------------------
def cmd_config(args) -> int:
    if args.action == "sample":
        print(config_mod.render())
        return 0
    config = load_config(args)
    print(f"{config.path}: valid")
    return 0


# -- serve ---------------------------------------------------------------------------
def cmd_serve(args) -> int:
    from appliance.daemonlock import DaemonLock
    from appliance.maintenance import Maintenance
    from appliance.nfs.onc.limits import NetLimits
    from appliance.nfs.server import NfsServerThread
    from appliance.runtime import MALLOC_MMAP_THRESHOLD, Appliance, HeapTrim, tune_malloc

    config = load_config(args)
    log_mod.configure(config.get("logging.level"))
    if tune_malloc():
        log.debug(
            "malloc: buffers up to %d MiB are reused from the heap", MALLOC_MMAP_THRESHOLD >> 20
        )
    else:
        log.debug("malloc: left as it is (no glibc mallopt)")
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    lock = DaemonLock(config.data_dir)
    if not lock.acquire():
        raise UsageError(f"another shingle daemon (pid {lock.holder()}) serves {config.data_dir}")
    appliance = Appliance(config)
    nfs_port = args.nfs_port if args.nfs_port is not None else config.get("nfs.port")
    server = NfsServerThread(
        appliance.namespace,
        appliance.catalog,
        host=config.get("nfs.host"),
        port=nfs_port,
        limits=NetLimits.from_config(config),
        lease_seconds=config.get("nfs.lease_seconds"),
        grace_seconds=config.get("nfs.grace_seconds"),
        portmap=config.get("nfs.portmap"),
        portmap_port=config.get("nfs.portmap_port"),
        nsm_name=config.get("nfs.nsm_name"),
        client_rpcbind_port=config.get("nfs.client_rpcbind_port"),
    )
    web = watchdog = maintenance = smb = None
    try:
        server.start()
        host = config.get("nfs.host")
        log.info("NFS server listening on %s:%d", host, server.port)
        print(f"NFS:    nfs://{host}:{server.port}/export?version=4.1", flush=True)
        print(
            "        mount -t nfs -o "
            f"vers=4.1,port={server.port},nconnect=4,rsize=1048576,wsize=1048576 "
            f"{host}:/export /mnt/shingle",
            flush=True,
        )
        print(
            "        mount -t nfs -o "
            f"vers=3,port={server.port},mountport={server.port},mountproto=tcp {host}:/export "
            f"/mnt/shingle   (locks: NLM via the port mapper on port {server.server.portmap_port})",
            flush=True,
        )
        maintenance = Maintenance(
            appliance,
            counters=lambda: daemon_counters(server, appliance),
            sample_every_s=config.get("maintenance.metrics_interval_s"),
        )
        maintenance.start()
        smb = start_smb(appliance, args)
        if not args.no_web:
            web = start_webui(config, args.web_port)
        notify_ready()
        watchdog = start_watchdog(server)
        heap = HeapTrim(lambda: daemon_activity(server, appliance))
        while not stop.wait(1.0):
            heap.tick()
            if web is not None and web.poll() is not None:
                log.error("web UI exited with status %s; stopping", web.returncode)
                return 1
            if smb is not None and not smb.healthy():
                log.error("the local mount or the SMB supervisor stopped; stopping")
                return 1
    finally:
        if maintenance is not None:
            maintenance.stop()
            maintenance.join(60)
        if watchdog is not None:
            watchdog.stop()
        if web is not None and web.poll() is None:
            web.terminate()
            web.wait(30)
        if smb is not None:
            smb.stop()
        server.stop()
        appliance.close()
        lock.release()
        log.info("stopped")
    return 0


def start_smb(appliance, args):
    """The local mount (--mount) and Samba sharing it (--smb-port, else smb.port):
    appliance/smb/."""
    config = appliance.config
    port = args.smb_port if args.smb_port is not None else (config.get("smb.port") or None)
    host = args.smb_host or config.get("smb.host")
    if port is None and args.mount is None:
        return None
    from appliance.smb import SmbService

    smb = SmbService(appliance, port=port, host=host, mountpoint=args.mount)
    smb.start()
    if smb.handover is None:
        print(f"mount:  {smb.mountpoint}", flush=True)
    if port is not None:
        print(f"SMB:    //{host}:{port}/export", flush=True)
    return smb


def cmd_smbd(args) -> int:
    """shingle-smbd.service: smbd as root over the daemon's namespace (appliance/smb/unit.py)."""
    from appliance.smb.unit import install_stop_signals, serve_smbd_unit

    config = load_config(args)
    log_mod.configure(config.get("logging.level"))
    if os.geteuid() != 0:
        raise UsageError("shingle smbd runs smbd, which acts as each SMB user: run it as root")
    return serve_smbd_unit(config, install_stop_signals())


def daemon_counters(server, appliance) -> dict:
    """Cumulative counters the web UI charts (names: engine/metrics.py)."""
    return {**server.stats(), **appliance.datapath.counters()}


def daemon_activity(server, appliance) -> int:
    """A number that moves while the daemon works: request bytes the NFS server took in, bytes
    written to the drives (also by SMB and by jobs)."""
    return server.server.budget.taken + appliance.datapath.stats["media_bytes_written"]


def start_webui(config, port: int | None):
    """The web UI runs as a gunicorn child process (see webui/gunicorn.conf.py)."""
    import subprocess

    port = port if port is not None else config.get("webui.port")
    cmd = [
        sys.executable,
        "-m",
        "appliance.cli",
        "-c",
        str(config.path),
        "webui",
        "--port",
        str(port),
    ]
    return subprocess.Popen(cmd)  # `shingle webui` prints the URL and where the first password is


def notify_ready() -> None:
    """Tell systemd (Type=notify) that the daemon serves; no-op without NOTIFY_SOCKET."""
    from appliance.sdnotify import notify

    notify("READY=1\nSTATUS=serving")


def start_watchdog(server):
    from appliance.sdnotify import Watchdog, watchdog_interval

    interval = watchdog_interval()
    if interval is None:
        return None
    dog = Watchdog(interval, healthy=lambda: server.is_alive())
    dog.start()
    return dog


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shingle", description="NAS appliance for AI training data on SMR drives"
    )
    parser.add_argument(
        "-c",
        "--config",
        help="config file (default: $SHINGLE_CONFIG, else "
        f"./{LOCAL_CONFIG}, else {DEFAULT_CONFIG})",
    )
    parser.add_argument(
        "--version", action="version", version=f"shingle {version()} (Python {python_version()})"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "init", help="create a config, the catalog, emulated drives and the first admin"
    )
    p.add_argument("dir", help="folder for the appliance's state")
    p.add_argument("--drives", type=int, default=10, help="emulated drives (default 10: 8+2)")
    p.add_argument(
        "--drive-size",
        type=size_arg,
        default=config_mod.parse_size("1GiB"),
        help="e.g. 4GiB (default 1GiB)",
    )
    p.add_argument(
        "--zone-size",
        type=size_arg,
        default=config_mod.parse_size("64MiB"),
        help="e.g. 256MiB (default 64MiB)",
    )
    p.add_argument("--catalog", help="catalog URL (default: SQLite in DIR)")
    p.add_argument("--nfs-port", type=int)
    p.add_argument("--web-port", type=int)
    p.add_argument("--admin-user", default="admin")
    p.add_argument(
        "--no-preallocate",
        dest="preallocate",
        action="store_false",
        help="zone files grow as data is written instead of reserving their size now",
    )
    p.add_argument(
        "--tls",
        action="store_true",
        help="serve the web UI over HTTPS with a new self-signed certificate",
    )
    p.set_defaults(func=cmd_init)

    p = sub.add_parser("status", help="catalog, drives and capacity")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser(
        "fsck", help="check the catalog's consistency (read-only); exit 1 on problems"
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_fsck)

    p = sub.add_parser(
        "bench", help="run a benchmark from bench/ (catalog, engine, nfs, compare, ...)"
    )
    p.add_argument("name")
    p.add_argument("bench_args", nargs=argparse.REMAINDER, help="arguments for the benchmark")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("config", help="print the documented sample config, or check a config file")
    p.add_argument("action", choices=["sample", "check"])
    p.set_defaults(func=cmd_config)

    p = sub.add_parser("serve", help="run the NFS server (and the web UI) in the foreground")
    p.add_argument("--nfs-port", type=int)
    p.add_argument("--web-port", type=int)
    p.add_argument("--no-web", action="store_true", help="do not start the web UI")
    p.add_argument(
        "--smb-port", type=int, help="also serve SMB (Samba over the local mount; else smb.port)"
    )
    p.add_argument("--smb-host", help="address smbd listens on (else smb.host)")
    p.add_argument(
        "--mount", help="local POSIX mount of the namespace (default with SMB: DATA_DIR/smb/mount)"
    )
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser(
        "smbd",
        help="run smbd as root over the daemon's namespace (shingle-smbd.service; smb.port)",
    )
    p.set_defaults(func=cmd_smbd)

    for module in _command_modules():
        module.register(sub)
    return parser


def _command_modules():
    """Domain command modules (appliance/cli_*.py) that exist in this build."""
    import importlib
    import pkgutil

    import appliance

    for info in sorted(pkgutil.iter_modules(appliance.__path__), key=lambda i: i.name):
        if info.name.startswith("cli_"):
            yield importlib.import_module(f"appliance.{info.name}")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)  # inside: `shingle --help | head -1` closes the pipe too
        code = args.func(args) or 0
        sys.stdout.flush()  # a reader that left shows here, not in the interpreter's exit
        return code
    except BrokenPipeError:
        # `shingle status | head`: the reader left, which is not an error of this command. Point
        # stdout at /dev/null so the interpreter's final flush does not fail a second time.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # as a shell reports a process ended by SIGPIPE (128 + 13)
    except errors.ConfigError as exc:
        print(f"shingle: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except UsageError as exc:
        print(f"shingle: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except errors.FsError as exc:
        print(f"shingle: {exc.strerror}", file=sys.stderr)
        return 1
    except errors.JobAbandoned as exc:
        print(f"shingle: {exc}", file=sys.stderr)
        return EXIT_JOB_ABANDONED
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    # `python -m appliance.cli` runs this file as __main__: use the appliance.cli module itself,
    # whose UsageError the cli_*.py modules import and raise, so that main() catches it
    from appliance.cli import main as module_main

    sys.exit(module_main())
