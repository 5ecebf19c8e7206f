"""`shingle serve` (the daemon, appliance/runtime.py's Daemon, in the foreground) and `shingle
smbd` (shingle-smbd.service: smbd as root over the daemon's namespace)."""

from __future__ import annotations

import os
import signal
import threading

from appliance import log as log_mod
from appliance.cli.common import UsageError, load_config


def cmd_serve(args) -> int:
    from appliance.runtime import Daemon, DaemonBusy

    config = load_config(args)
    log_mod.configure(config.get("logging.level"))
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    daemon = Daemon(
        config,
        nfs_port=args.nfs_port,
        web_port=args.web_port,
        web=not args.no_web,
        smb_port=args.smb_port,
        smb_host=args.smb_host,
        mount=args.mount,
    )
    try:
        return daemon.run(stop)
    except DaemonBusy as exc:
        raise UsageError(str(exc)) from None


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
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser(
        "smbd",
        help="run smbd as root over the daemon's namespace (shingle-smbd.service; smb.port)",
    )
    p.set_defaults(func=cmd_smbd)
