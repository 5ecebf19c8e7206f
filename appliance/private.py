"""Files that hold secrets are created with their final mode, never chmod-ed afterwards.

A file created with the default umask and narrowed later is readable by every
local user in between (and for good if the process dies there)."""

from __future__ import annotations

import os
from pathlib import Path


def write_private(path: Path, text: str) -> None:
    """A new file readable by its owner only, from the first byte on (fails if it exists)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def create_private(path: Path) -> None:
    """An empty owner-only file at ``path`` for a tool to fill (fails if it exists)."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
