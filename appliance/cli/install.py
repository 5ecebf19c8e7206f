"""`shingle install`, `shingle uninstall` and `shingle doctor`: putting the appliance on a host."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

from appliance import log as log_mod


def _configure_logging(root) -> None:
    """Structured lines (Alembic's migration steps among them) at the installed config's level."""
    from appliance.host import install

    level = "info"
    try:
        level = install.load_installed_config(install.Path(root or "/").resolve()).get(
            "logging.level"
        )
    except Exception:  # no config yet, or a broken one that install reports itself
        pass
    log_mod.configure(level)
    logging.getLogger("alembic.runtime.plugins").setLevel(
        max(logging.WARNING, logging.getLogger().level)
    )


def cmd_install(args) -> int:
    from appliance.host import install

    _configure_logging(args.root)
    started = time.monotonic()

    def progress(text: str) -> None:  # building the venv takes a while: say what happens
        print(f"[{time.monotonic() - started:5.1f} s] {text}", file=sys.stderr, flush=True)

    from appliance.cli.agent import drive_format

    roles = install.parse_roles(args.role) if args.role else None
    agent = None
    if args.listen or args.drives:
        agent = install.AgentSetup(
            args.listen or "", tuple(Path(d) for d in args.drives or ()), drive_format(args)
        )
    try:
        report = install.install(
            args.root,
            launcher=args.bin,
            venv=args.venv,
            python=args.python,
            index=args.index,
            roles=roles,
            agent=agent,
            progress=progress,
        )
    except install.InstallError as exc:
        print(f"shingle: install: {exc}", file=sys.stderr)
        return 1
    install.print_report(report, "installed shingle")
    return 0


def cmd_uninstall(args) -> int:
    from appliance.host import install

    _configure_logging(args.root)
    try:
        report = install.uninstall(args.root, purge=args.purge)
    except install.InstallError as exc:
        print(f"shingle: uninstall: {exc}", file=sys.stderr)
        return 1
    install.print_report(
        report, "purged shingle" if args.purge else "uninstalled shingle (data kept)"
    )
    return 0


def cmd_doctor(args) -> int:
    from appliance.host import doctor

    results = doctor.run_checks(config_path=args.config, root=args.root)
    if args.json:
        import json

        print(json.dumps([r.as_dict() for r in results], indent=2))
    else:
        doctor.print_results(results, sys.stdout)
    return 1 if doctor.must_fix(results) else 0


def register(subparsers) -> None:
    from appliance.cli.agent import add_format_options

    p = subparsers.add_parser(
        "install", help="install or upgrade the appliance on this host (or under --root)"
    )
    p.add_argument(
        "--root", metavar="DIR", help="lay the tree out under DIR without touching this host"
    )
    p.add_argument(
        "--venv",
        metavar="DIR",
        help="the venv the units run shingle from, built or refreshed from this checkout "
        "(default /opt/shingle; under --root as the target host sees it)",
    )
    p.add_argument(
        "--python",
        metavar="PATH",
        help="the interpreter of that venv (default: this one's base, else /usr/bin/python3; "
        "never one under /home or /root, which the units cannot see)",
    )
    p.add_argument(
        "--index",
        action="store_true",
        help="let pip fetch from the package index (default: offline, every dependency "
        "repacked from this environment)",
    )
    p.add_argument(
        "--bin",
        metavar="PATH",
        help="run an existing shingle launcher instead of building a venv",
    )
    p.add_argument(
        "--role",
        metavar="ROLES",
        help="head (the daemon, web UI and SMB: the single-host appliance), storage (a drive "
        "agent over this host's drives, for a cluster), or head,storage; default: the roles "
        "installed already, else head. Roles left out are uninstalled.",
    )
    p.add_argument(
        "--listen", metavar="HOST:PORT", help="storage role: the address the heads reach it at"
    )
    p.add_argument(
        "--drives",
        nargs="+",
        metavar="DIR",
        help="storage role: the drive folders the agent serves; empty or absent ones are "
        "formatted now (--drive-size, --zone-size, --no-preallocate)",
    )
    add_format_options(p)
    p.set_defaults(func=cmd_install)

    p = subparsers.add_parser(
        "uninstall", help="remove the units; config and data stay unless --purge"
    )
    p.add_argument("--root", metavar="DIR", help="act under DIR instead of this host")
    p.add_argument(
        "--purge", action="store_true", help="also delete /etc/shingle and /var/lib/shingle"
    )
    p.set_defaults(func=cmd_uninstall)

    p = subparsers.add_parser(
        "doctor", help="check this host for the appliance and print what to fix"
    )
    p.add_argument(
        "--root", metavar="DIR", help="check the install under DIR (its config and data)"
    )
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
    p.set_defaults(func=cmd_doctor)
