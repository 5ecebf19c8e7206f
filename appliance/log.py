"""Structured log lines on stdout (journald keeps them when run by systemd)."""

from __future__ import annotations

import logging
import sys
import time


class LogfmtFormatter(logging.Formatter):
    """``ts=... level=info logger=shingle.nfs msg="..."``: greppable and machine-readable.
    ``head``: which head of `shingle serve --heads` writes the line (``head=1`` after level)."""

    def __init__(self, head: int | None = None):
        super().__init__()
        self.tag = "" if head is None else f" head={head}"

    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage().replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        ts = (
            time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z"
        )
        line = (
            f'ts={ts} level={record.levelname.lower()}{self.tag} logger={record.name} msg="{msg}"'
        )
        if record.exc_info:
            exc = self.formatException(record.exc_info).replace("\n", "\\n").replace('"', '\\"')
            line += f' exc="{exc}"'
        return line


def configure(level: str = "info", *, head: int | None = None) -> None:
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(LogfmtFormatter(head))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Alembic announces its context on every revision check; only its problems matter here.
    logging.getLogger("alembic").setLevel(max(logging.WARNING, root.level))
