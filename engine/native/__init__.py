"""Compiled parts of the engine, built from this folder's .pyx files at install time.

``driveio`` is the module of the drives' writer threads (engine/datapath/writers.py), or None
where it was not built (no compiler at install time) or ``SHINGLE_NATIVE=0`` turns it off: the
pure-Python writers then do the same work, more slowly."""

from __future__ import annotations

import os
from types import ModuleType


def _load() -> ModuleType | None:
    if os.environ.get("SHINGLE_NATIVE", "1") == "0":
        return None
    try:
        from engine.native import drivewriters
    except ImportError:
        return None
    return drivewriters


driveio = _load()
