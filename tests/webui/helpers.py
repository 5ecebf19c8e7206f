"""Namespace set-up shared by the web UI tests."""

from __future__ import annotations

import time

from engine.base import errors
from engine.namespace import ROOT, Namespace

HOUR_NS = 3600 * 10**9


def mkdirs(ns: Namespace, path: str):
    attr = ns.getattr(ns.root_ino)
    for part in [p for p in path.split("/") if p]:
        try:
            attr = ns.lookup(ROOT, attr.ino, part)
        except errors.NotFound:
            attr = ns.mkdir(ROOT, attr.ino, part)
    return attr


def make_checkpoints(ns: Namespace, parent: str, steps: range, *, size: int = 0) -> dict[str, int]:
    """step-N directories holding a model file of ``size`` bytes (written through the data path when
    the namespace has one), an hour apart in mtime, oldest first. Returns path -> mtime_ns."""
    base = time.time_ns() - 10 * HOUR_NS
    out = {}
    for n, step in enumerate(steps):
        mtime = base + n * HOUR_NS
        step_dir = mkdirs(ns, f"{parent}/step-{step}")
        model = ns.create(ROOT, step_dir.ino, "model.pt")
        if size:
            ns.write(model.ino, 0, bytes([step % 251]) * size)
            ns.commit(model.ino)
        ns.setattr(ROOT, model.ino, mtime_ns=mtime)
        ns.setattr(ROOT, step_dir.ino, mtime_ns=mtime)
        out[f"{parent}/step-{step}"] = mtime
    return out


def exists(ns: Namespace, path: str) -> bool:
    ns.invalidate()
    try:
        ns.resolve(path)
        return True
    except errors.NotFound:
        return False
