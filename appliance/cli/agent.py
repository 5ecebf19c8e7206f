"""`shingle agent`: run the drive agent of a storage host (appliance/agent/server.py); and
`shingle drives-attach HOST:PORT`, the first name of `shingle cluster join` (appliance/cli/
cluster.py): the head records the drives an agent serves and starts using them.

The agent needs no config file and no catalog: it serves the drive folders named on its command
line; ``--format`` makes those that do not exist yet."""

from __future__ import annotations

import logging
from pathlib import Path

from appliance import config as config_mod
from appliance.agent import folders as folders_mod
from appliance.cli.common import UsageError, size_arg
from engine.base import errors


def cmd_agent(args) -> int:
    from appliance.agent.server import serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    folders = [Path(d) for d in args.drives]
    try:
        if args.format:
            folders_mod.format_drives(folders, drive_format(args))
        elif missing := folders_mod.missing_drives(folders):
            raise UsageError(f"{missing[0]} holds no drive: make it with --format")
    except folders_mod.DriveFolderError as exc:
        raise UsageError(str(exc)) from None
    if not args.body_timeout > 0:
        raise UsageError("--body-timeout must be > 0 seconds")
    try:
        serve(args.listen, folders, host=args.host, body_timeout=args.body_timeout)
    except OSError as exc:  # the address is taken, or not this host's
        if isinstance(exc, errors.FsError):
            raise
        raise UsageError(f"cannot listen on {args.listen}: {exc.strerror or exc}") from None
    return 0


def drive_format(args) -> folders_mod.DriveFormat:
    return folders_mod.DriveFormat(args.drive_size, args.zone_size, args.preallocate)


def add_format_options(p) -> None:
    """The geometry of drives made for an agent (`shingle agent --format`, `shingle install
    --role storage`): one set of options for both."""
    p.add_argument("--drive-size", type=size_arg, default=config_mod.parse_size("1GiB"))
    p.add_argument("--zone-size", type=size_arg, default=config_mod.parse_size("64MiB"))
    p.add_argument(
        "--no-preallocate",
        dest="preallocate",
        action="store_false",
        help="zone files grow as data is written instead of reserving their size now",
    )


def cmd_drives_attach(args) -> int:
    """`shingle cluster join` by its first name: one way to add an agent's drives."""
    from appliance.cli.cluster import cmd_cluster

    args.action, args.host, args.rate, args.json = "join", args.address, None, False
    return cmd_cluster(args)


def register(sub) -> None:
    p = sub.add_parser(
        "agent",
        help="run the drive agent of a storage host (the only writer of its drives)",
    )
    p.add_argument("--listen", required=True, help="HOST:PORT the heads connect to")
    p.add_argument("--drives", nargs="+", required=True, help="drive folders (zone files)")
    p.add_argument("--host", help="this host's name in placement (default: the hostname)")
    p.add_argument(
        "--format", action="store_true", help="make the drive folders that do not exist yet"
    )
    add_format_options(p)
    p.add_argument(
        "--body-timeout",
        type=float,
        default=10.0,
        help="seconds a frame's body may take to arrive after its header (default 10)",
    )
    p.set_defaults(func=cmd_agent)

    p = sub.add_parser(
        "drives-attach",
        help="record the drives a drive agent serves (HOST:PORT): `shingle cluster join`",
    )
    p.add_argument("address", help="the agent's HOST:PORT")
    p.set_defaults(func=cmd_drives_attach)
