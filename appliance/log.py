"""Structured log lines on stdout (journald keeps them when run by systemd)."""
from __future__ import annotations

import logging
import sys
import threading
import time


class LogfmtFormatter(logging.Formatter):
    """``ts=... level=info logger=shingle.nfs msg="..."``: greppable and machine-readable."""

    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage().replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        line = f'ts={ts} level={record.levelname.lower()} logger={record.name} msg="{msg}"'
        if record.exc_info:
            exc = self.formatException(record.exc_info).replace("\n", "\\n").replace('"', '\\"')
            line += f' exc="{exc}"'
        return line


def configure(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(LogfmtFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Alembic announces its context on every revision check; only its problems matter here.
    logging.getLogger("alembic").setLevel(max(logging.WARNING, root.level))


class Throttled:
    """At most one line per key per interval, for what clients can cause at any rate (bad
    requests, a catalog outage, even a server bug a request triggers): the first line of an
    interval is logged (with its traceback when asked), the others are counted, and the next
    line logged says how many were left out. Keys must come from a small set (an operation
    and an error class), never from a client's bytes."""

    def __init__(self, logger: logging.Logger, interval_s: float = 60.0):
        self.logger = logger
        self.interval_s = interval_s
        self._seen: dict[object, list] = {}  # key -> [when logged, left out since]
        self._lock = threading.Lock()

    def log(self, level: int, key: object, msg: str, *args: object,
            exc_info: bool = False) -> bool:
        """Log ``msg % args`` unless a line of ``key`` was logged within the interval; returns
        whether it logged."""
        if not self.logger.isEnabledFor(level):
            return False
        now = time.monotonic()
        with self._lock:
            seen = self._seen.get(key)
            if seen is not None and now - seen[0] < self.interval_s:
                seen[1] += 1
                return False
            left_out = seen[1] if seen is not None else 0
            if len(self._seen) >= 4096:  # keys are few; this only bounds a caller's mistake
                self._seen.clear()
            self._seen[key] = [now, 0]
        if left_out:
            msg += f" (and {left_out} more like it since the last such line)"
        self.logger.log(level, msg, *args, exc_info=exc_info)
        return True
