"""`shingle init DIR`: a config, the catalog, emulated drives and the first admin in a folder."""

from __future__ import annotations

import secrets
import shutil
import tomllib
from dataclasses import dataclass
from pathlib import Path

from appliance import config as config_mod
from appliance.cli.common import UsageError, size_arg
from engine.base.units import format_size


@dataclass
class Made:
    """What `init` made, for the summary it prints."""

    drive_count: int
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
    if args.drives < 1:
        raise UsageError(f"--drives {args.drives}: expected at least 1")
    text = config_mod.render(_overrides(args), commented_defaults=True)
    config = config_mod.from_dict(tomllib.loads(text), config_path)
    _check_drive_count(config, args.drives)
    drives_dir = config.resolve("storage.drives_dir")
    zones_bytes = args.drives * (args.drive_size // args.zone_size) * args.zone_size
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


def _first_state(config: config_mod.Config, root: Path, args) -> Made:
    """The new catalog's root folder, drives, default export, first admin and secrets."""
    from appliance.nfs.exports import ensure_default_export
    from appliance.private import write_private
    from engine.admin import accounts, events
    from engine.admin import exports as export_service
    from engine.catalog import Catalog
    from engine.drives import format_emulated
    from engine.namespace import Namespace

    catalog = Catalog(config.catalog_url)
    try:
        # any client user may make its own folders; a squashed root client writes too
        export_service.prepare_new_root(Namespace(catalog))
        drive_ids = format_emulated(
            catalog,
            config.resolve("storage.drives_dir"),
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
        made_by = _self_signed(config) if args.tls else None
        events.record(
            catalog,
            "appliance.init",
            f"initialized with {len(drive_ids)} emulated drives",
            actor="shingle init",
        )
    finally:
        catalog.close()
    return Made(len(drive_ids), password_file, made_by)


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
    print(
        f"  drives:   {made.drive_count} x {fmt(args.drive_size)} ({fmt(args.zone_size)} zones) "
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
