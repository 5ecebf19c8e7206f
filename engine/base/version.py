"""The version of this build: the source tree's pyproject.toml, else the installed package's."""

from __future__ import annotations

import functools
import importlib.metadata
import platform
import tomllib
from pathlib import Path

PACKAGE = "shingle-nas"
PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


@functools.cache
def version() -> str:
    # the checkout's own file first: an editable install may name another worktree's version
    try:
        return tomllib.loads(PYPROJECT.read_text())["project"]["version"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        pass
    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def python_version() -> str:
    return platform.python_version()
