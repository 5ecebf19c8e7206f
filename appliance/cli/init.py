"""`shingle init DIR`: a config, the catalog, the drives and the first admin in a folder.

The drives are emulated ones (folders of zone files) by default, or those named by ``--drive``:
each a zoned block device (its geometry read from the device) or a new folder, made by the same
function as `shingle drives add` (engine.lifecycle.replace.make_drive)."""

from __future__ import annotations

import os
import secrets
import shutil
import tomllib
from dataclasses import dataclass
from pathlib import Path

from appliance import config as config_mod
from appliance.cli.common import UsageError, size_arg
from engine.base.units import format_size

DEFAULT_DRIVES = 10  # 8+2, the default band classes' widest stripe


@dataclass
class Made:
    """What `init` made, for the summary it prints."""

    drive_count: int
    zoned_devices: list[str]
    password_file: Path
    tls_made_by: str | None


def cmd_init(args) -> int:
    from engine.catalog import upgrade

    root = Path(args.dir).resolve()
    config_path = root / "shingle.toml"
    if config_path.exists():
        raise UsageError(
            f"{config_path} exists: this folder is already initialized "
            "(remove it or choose another folder)"
        )
    if args.drive_paths and args.drives is not None:
        raise UsageError(
            "--drives and --drive: give either a count of emulated drives or each drive"
        )
    if args.drive_paths:
        args.drive_paths = [os.path.abspath(p) for p in args.drive_paths]
        args.drives = len(args.drive_paths)
    elif args.drives is None:
        args.drives = DEFAULT_DRIVES
    if args.drives < 1:
        raise UsageError(f"--drives {args.drives}: expected at least 1")
    text = config_mod.render(_overrides(args), commented_defaults=True)
    config = config_mod.from_dict(tomllib.loads(text), config_path)
    _check_drive_count(config, args.drives)
    drives_dir = config.resolve("storage.drives_dir")
    emulated = args.drives - len(_check_named_drives(config, args.drive_paths or []))
    zones_bytes = emulated * (args.drive_size // args.zone_size) * args.zone_size
    if args.preallocate:
        _check_room(drives_dir, zones_bytes)
    root.mkdir(parents=True, exist_ok=True)
    upgrade(config.catalog_url)
    config_path.write_text(text)
    made = _first_state(config, root, args)
    _print_summary(args, config, root, made, zones_bytes)
    return 0


def _overrides(args) -> dict:
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
    return overrides


def _check_drive_count(config: config_mod.Config, drives: int) -> None:
    k_m = max(
        (p.k + p.m) if getattr(p, "redundancy", "ec") == "ec" else p.copies
        for p in config.policies().values()
    )
    if drives < k_m:
        raise UsageError(
            f"--drives {drives}: the band classes need at least {k_m} drives "
            "(a stripe puts each fragment on a different drive)"
        )


def _largest_fragment(config: config_mod.Config) -> int:
    return max(p.max_fragment_length for p in config.policies().values())


def _check_named_drives(config: config_mod.Config, paths: list[str]) -> list[str]:
    """The zoned block devices among ``paths``, each checked as `drives add` would (before
    anything is made, so a refused drive leaves no half-made appliance); a folder must be new
    or empty."""
    import stat

    from engine.drives import check_zoned_block

    if len(set(paths)) < len(paths):
        twice = sorted({p for p in paths if paths.count(p) > 1})
        raise UsageError(f"--drive {twice[0]}: given twice (each drive once)")
    devices = []
    largest = 0
    for path in paths:
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            if path.startswith("/dev/"):
                raise UsageError(f"--drive {path}: no such device") from None
            continue  # a new folder of zone files
        if stat.S_ISBLK(mode):
            largest = largest or _largest_fragment(config)  # built once: each builds codecs
            check_zoned_block(path, largest)
            devices.append(path)
        elif not stat.S_ISDIR(mode) or any(Path(path).iterdir()):
            raise UsageError(
                f"--drive {path}: expected a zoned block device or a new or empty folder "
                "(it becomes an emulated drive of zone files)"
            )
    return devices


def _make_drives(catalog, config: config_mod.Config, args) -> list[int]:
    """The drives of the new appliance: each ``--drive`` as `drives add` makes it, else
    ``--drives`` emulated ones in storage.drives_dir."""
    from engine.drives import format_emulated
    from engine.lifecycle.replace import make_drive

    if not args.drive_paths:
        return format_emulated(
            catalog,
            config.resolve("storage.drives_dir"),
            args.drives,
            args.drive_size,
            args.zone_size,
            preallocate=args.preallocate,
        )
    largest = _largest_fragment(config)
    return [
        make_drive(
            catalog,
            path,
            size=args.drive_size,
            zone_size=args.zone_size,
            preallocate=args.preallocate,
            min_zone_size=largest,
        )
        for path in args.drive_paths
    ]


def _first_state(config: config_mod.Config, root: Path, args) -> Made:
    """The new catalog's root folder, drives, default export, first admin and secrets."""
    from appliance.nfs.exports import ensure_default_export
    from appliance.private import write_private
    from engine.admin import accounts, events
    from engine.admin import exports as export_service
    from engine.catalog import Catalog
    from engine.namespace import Namespace

    catalog = Catalog(config.catalog_url)
    try:
        # any client user may make its own folders; a squashed root client writes too
        export_service.prepare_new_root(Namespace(catalog))
        drive_ids = _make_drives(catalog, config, args)
        zoned = _zoned_devices(catalog)
        ensure_default_export(catalog)
        password = secrets.token_urlsafe(12)
        accounts.create_admin(catalog, args.admin_user, password, actor="shingle init")
        password_file = root / "initial-admin-password"
        password_file.unlink(missing_ok=True)  # left from an earlier catalog that was removed
        write_private(password_file, f"{args.admin_user} {password}\n")
        secret = config.resolve("webui.secret_key_file")
        if not secret.exists():
            write_private(secret, secrets.token_hex(32) + "\n")
        made_by = _self_signed(config) if args.tls else None
        events.record(
            catalog,
            "appliance.init",
            f"initialized with {len(drive_ids)} drives ({len(zoned)} zoned block devices)",
            actor="shingle init",
            details={"drives": drive_ids, "zoned_devices": zoned},
        )
    finally:
        catalog.close()
    return Made(len(drive_ids), zoned, password_file, made_by)


def _zoned_devices(catalog) -> list[str]:
    from engine.lifecycle.drives import list_drives

    return [d.path for d in list_drives(catalog) if d.backend == "zoned-block"]


def _self_signed(config: config_mod.Config) -> str:
    from appliance.host.tls import make_self_signed, names_for

    cert, key = config.resolve("webui.tls_cert_file"), config.resolve("webui.tls_key_file")
    for stale in (cert, key):
        stale.unlink(missing_ok=True)
    return make_self_signed(cert, key, names_for(config.get("webui.host")))


def _print_summary(args, config: config_mod.Config, root: Path, made: Made, zones_bytes: int):
    fmt = format_size
    drives_dir = config.resolve("storage.drives_dir")
    print(f"initialized {root}")
    print(f"  config:   {config.path}")
    print(f"  catalog:  {config.catalog_url}")
    emulated = made.drive_count - len(made.zoned_devices)
    if made.zoned_devices:
        print(
            f"  drives:   {len(made.zoned_devices)} zoned block devices "
            f"({', '.join(made.zoned_devices)}; `shingle drives list` shows their zones)"
        )
    if emulated and args.drive_paths:
        print(
            f"  drives:   {emulated} emulated ({fmt(args.drive_size)}, {fmt(args.zone_size)} zones)"
        )
    elif emulated:
        print(
            f"  drives:   {made.drive_count} x {fmt(args.drive_size)} ({fmt(args.zone_size)} "
            f"zones) in {drives_dir}"
        )
    if emulated and args.preallocate:
        print(
            f"  disk:     {fmt(zones_bytes)} of real disk reserved now (zone files preallocated; "
            "--no-preallocate makes them grow as written)"
        )
    elif emulated:
        print(
            f"  disk:     {fmt(_allocated_bytes(drives_dir))} of real disk now, growing as "
            f"data is written, up to {fmt(zones_bytes)} (zone files not preallocated)"
        )
    print(f"  admin:    user {args.admin_user!r}, password in {made.password_file}")
    print(f"  use it:   export SHINGLE_CONFIG={config.path}")
    if made.tls_made_by is not None:
        print(
            f"  HTTPS:    self-signed certificate {config.resolve('webui.tls_cert_file')} "
            f"(made with {made.tls_made_by}; replace it with one your browsers trust)"
        )


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


def register(sub) -> None:
    p = sub.add_parser("init", help="create a config, the catalog, the drives and the first admin")
    p.add_argument("dir", help="folder for the appliance's state")
    p.add_argument("--drives", type=int, help=f"emulated drives (default {DEFAULT_DRIVES}: 8+2)")
    p.add_argument(
        "--drive",
        dest="drive_paths",
        action="append",
        metavar="PATH",
        help="a drive, repeatable, instead of --drives: a host-managed zoned block device "
        "(/dev/sdX, /dev/nvme0n1: zones, capacity and open limits read from it) or a new folder "
        "(an emulated drive of --drive-size); the same as `shingle drives add PATH`",
    )
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
