"""`shingle serve` (the daemon, appliance/runtime.py's Daemon, in the foreground) and `shingle
smbd` (shingle-smbd.service: smbd as root over the daemon's namespace)."""

from __future__ import annotations

import argparse
import os
import signal
import threading

from appliance import log as log_mod
from appliance.cli.common import UsageError, load_config


def cmd_serve(args) -> int:
    from appliance.runtime import Daemon, DaemonBusy

    config = load_config(args)
    log_mod.configure(
        config.get("logging.level"), head=int(args.head.split("/")[0]) if args.head else None
    )
    heads = args.heads if args.heads is not None else config.get("heads.processes")
    if args.head is None:
        check_heads(config, heads)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    head = {}
    if args.head is not None:
        config, head = head_of_heads(args, config)
    try:
        if args.head is None and heads > 1:
            return serve_heads(args, config, heads, stop)
        daemon = Daemon(
            config,
            nfs_port=args.nfs_port,
            web_port=args.web_port,
            web=not args.no_web,
            smb_port=args.smb_port,
            smb_host=args.smb_host,
            mount=args.mount,
            **head,
        )
        return daemon.run(stop)
    except DaemonBusy as exc:
        raise UsageError(str(exc)) from None


def check_heads(config, count: int) -> None:
    from appliance.heads import HeadsError, check_config

    try:
        check_config(config, count)
    except HeadsError as exc:
        raise UsageError(str(exc)) from None


def serve_heads(args, config, count: int, stop: threading.Event) -> int:
    """The listener of --heads N (appliance/heads.py), and the web UI."""
    from appliance.heads import Heads

    if args.smb_port is not None or args.mount is not None or config.get("smb.port"):
        raise UsageError(
            f"--heads {count} with SMB or --mount: the local mount and smbd run beside one head "
            "only; serve SMB from `shingle serve` without --heads (or heads.processes = 1)"
        )
    heads = Heads(
        config, count, nfs_port=args.nfs_port, web_port=args.web_port, web=not args.no_web
    )
    return heads.run(stop)


def head_of_heads(args, config) -> tuple:
    """(the config, the Daemon's arguments) of one head started by the listener of --heads
    (hidden options)."""
    import socket

    from appliance.heads import head_config, head_lock_dir

    index, count = (int(n) for n in args.head.split("/"))
    mode, port = args.portmap.rsplit(":", 1)
    return head_config(config, index, count, mode, int(port)), {
        "handoff": socket.socket(fileno=args.handoff_fd),
        "lock_dir": head_lock_dir(config.data_dir, index),
        "announce": lambda line: None,  # the listener tells where to connect
    }


def cmd_smbd(args) -> int:
    """shingle-smbd.service: smbd as root over the daemon's namespace (appliance/smb/unit.py)."""
    from appliance.smb.unit import install_stop_signals, serve_smbd_unit

    config = load_config(args)
    log_mod.configure(config.get("logging.level"))
    if os.geteuid() != 0:
        raise UsageError("shingle smbd runs smbd, which acts as each SMB user: run it as root")
    return serve_smbd_unit(config, install_stop_signals())


def register(sub) -> None:
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
    p.add_argument(
        "--heads",
        type=int,
        help="head processes behind the one NFS port (else heads.processes; docs/heads.md)",
    )
    # a head started by the listener of --heads: its index/count, the channel its connections
    # come over, the port mapper's mode:port
    p.add_argument("--head", help=argparse.SUPPRESS)
    p.add_argument("--handoff-fd", type=int, help=argparse.SUPPRESS)
    p.add_argument("--portmap", default="off:0", help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser(
        "smbd",
        help="run smbd as root over the daemon's namespace (shingle-smbd.service; smb.port)",
    )
    p.set_defaults(func=cmd_smbd)
