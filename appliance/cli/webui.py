"""`shingle webui [--port W]`: the admin web UI under gunicorn, in the foreground.

It execs gunicorn with webui/gunicorn.conf.py and ``webui.app:create_app()``,
so signals (systemd's SIGTERM, Ctrl-C) reach gunicorn directly."""

from __future__ import annotations

import os
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]  # the folder holding webui/ and appliance/


def cmd_webui(args) -> int:
    from appliance.cli.common import load_config
    from appliance.host.addresses import client_addresses, url_host, wildcard_note
    from appliance.runtime import open_catalog

    config = load_config(args)
    open_catalog(config).close()  # fail here with one clear line, not in every worker
    port = args.port if args.port is not None else config.get("webui.port")
    if not 0 < port < 65536:
        from appliance.cli.common import UsageError

        raise UsageError(f"--port {port}: expected a TCP port 1-65535")
    host = config.get("webui.host")
    conf = CHECKOUT / "webui" / "gunicorn.conf.py"
    assert config.path is not None  # load_config read it from a file
    env = dict(
        os.environ,
        SHINGLE_CONFIG=str(Path(config.path).resolve()),
        SHINGLE_WEBUI_BIND=f"{host}:{port}",
        SHINGLE_WEBUI_WORKERS=str(config.get("webui.workers")),
        SHINGLE_WEBUI_LOGLEVEL=config.get("logging.level"),
    )
    scheme = "http"
    if config.get("webui.tls_cert_file"):
        for key in ("webui.tls_cert_file", "webui.tls_key_file"):
            if not os.access(config.resolve(key), os.R_OK):
                from appliance.config import ConfigError

                raise ConfigError(key, str(config.resolve(key)), "a readable PEM file")
        env.update(
            SHINGLE_WEBUI_CERTFILE=str(config.resolve("webui.tls_cert_file")),
            SHINGLE_WEBUI_KEYFILE=str(config.resolve("webui.tls_key_file")),
        )
        scheme = "https"
    addresses = client_addresses(host)
    print(
        f"Web UI: {scheme}://{url_host(addresses[0])}:{port}/  (first admin login in "
        f"{config.data_dir / 'initial-admin-password'})" + wildcard_note(host, addresses),
        flush=True,
    )
    argv = [sys.executable, "-m", "gunicorn", "--config", str(conf), "webui.app:create_app()"]
    os.chdir(CHECKOUT)  # so gunicorn imports this tree's webui package
    os.execve(sys.executable, argv, env)
    return 0  # not reached


def register(subparsers) -> None:
    p = subparsers.add_parser("webui", help="run the admin web UI (gunicorn) in the foreground")
    p.add_argument("--port", type=int, help="TCP port (default: [webui] port)")
    p.set_defaults(func=cmd_webui)
