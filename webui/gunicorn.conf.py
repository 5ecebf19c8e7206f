"""gunicorn settings for the admin web UI (`shingle webui` runs gunicorn with this file).

The bind address, port and worker count come from shingle.toml ([webui]);
`shingle webui` passes them as SHINGLE_WEBUI_BIND / SHINGLE_WEBUI_WORKERS, and
the TLS pair ([webui] tls_cert_file, tls_key_file) as SHINGLE_WEBUI_CERTFILE /
SHINGLE_WEBUI_KEYFILE: with them gunicorn serves HTTPS only.
Each worker opens its own catalog connection pool (no preload: SQLite and
PostgreSQL connections must not cross a fork)."""

import logging
import os
import sys

from gunicorn.glogging import Logger

from appliance.facade import log as log_mod

bind = os.environ.get("SHINGLE_WEBUI_BIND", "127.0.0.1:8080")
workers = int(os.environ.get("SHINGLE_WEBUI_WORKERS", "2"))
worker_class = "gthread"
threads = 4
timeout = 120  # a retention run over a large tree or a smartctl call can take a while
graceful_timeout = 20
preload_app = False
accesslog = "-"
errorlog = "-"
loglevel = os.environ.get("SHINGLE_WEBUI_LOGLEVEL", "info")
access_log_format = "%(h)s %(m)s %(U)s%(q)s %(s)s %(B)s bytes %(M)s ms"


class LogfmtLogger(Logger):
    """gunicorn's error and access lines in the daemon's logfmt (appliance/log.py), on stdout,
    so the journal holds one format; the app's own loggers go the same way."""

    def setup(self, cfg):
        super().setup(cfg)
        log_mod.configure(cfg.loglevel)
        for logger in (self.error_log, self.access_log):
            for handler in logger.handlers:
                handler.setFormatter(log_mod.LogfmtFormatter())
                if isinstance(handler, logging.StreamHandler) and handler.stream is sys.stderr:
                    handler.setStream(sys.stdout)


logger_class = LogfmtLogger
proc_name = "shingle-webui"
certfile = os.environ.get("SHINGLE_WEBUI_CERTFILE") or None
keyfile = os.environ.get("SHINGLE_WEBUI_KEYFILE") or None
forwarded_allow_ips = "127.0.0.1"
# gunicorn >= 25.1 opens a control socket in $XDG_RUNTIME_DIR or ~/.gunicorn: two appliances on one
# host would share it, and the systemd unit's ProtectHome makes ~ read-only. Nothing here uses it.
control_socket_disable = True
