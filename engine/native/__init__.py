"""Compiled parts of the engine, built from this folder's .pyx files at install time.

``driveio`` is the module of the drives' writer threads (engine/datapath/writers.py), or None
where it was not built (no compiler at install time) or ``SHINGLE_NATIVE=0`` turns it off: the
pure-Python writers then do the same work, more slowly. ``fragmentio`` (fragment read buffers
without zeroing, engine/drives/zonefile.py and engine/datapath/) likewise; ``empty_bytearray``
is its allocation or, without it, ``bytearray``."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from types import ModuleType


def _load(name: str) -> ModuleType | None:
    if os.environ.get("SHINGLE_NATIVE", "1") == "0":
        return None
    try:
        return importlib.import_module(f"engine.native.{name}")
    except ImportError:
        return None


driveio = _load("drivewriters")
fragmentio = _load("fragmentio")
# a buffer every byte of which the caller overwrites before it is read
empty_bytearray: Callable[[int], bytearray] = (
    fragmentio.empty_bytearray if fragmentio is not None else bytearray
)
