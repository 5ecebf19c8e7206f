"""The dataset both snapshot kill -9 tests build and change (test_snapshot_crash.py at random
times, test_snapshot_crash_points.py at aimed statements): FILES small files, a big one, ``gen``
naming the next snapshot, and ``churn`` made again after each create."""

from __future__ import annotations

import random

from engine.namespace import ROOT

FILES = 150
POLICIES = {
    "warm": {"fragment_size": 16384},
    "cold": {"fragment_size": 16384},
    "hot": {"fragment_size": 16384},
}


def small(i: int) -> bytes:
    return random.Random(i).randbytes(100 + i * 37)


BIG = random.Random("big").randbytes(3 << 20)
CHURN = b"churn" * 100
GEN_SIZE = 64  # ``gen`` holds a name padded to this size, so a view's size says nothing


def gen(text: str) -> bytes:
    return text.encode().ljust(GEN_SIZE, b".")


def change_live_tree(ns, ds: int, i: int) -> None:
    """Changes after a create that a snapshot's view must not see (each leaves the names as
    they were, so every view lists the same names)."""
    ns.write(ns.lookup(ROOT, ds, "gen").ino, 0, gen(f"after-{i}"))
    k = i % FILES
    f = ns.lookup(ROOT, ds, f"f{k:03d}").ino
    ns.setattr(ROOT, f, size=0)
    ns.write(f, 0, small(k))
    moved = f"f{(k + 1) % FILES:03d}"
    ns.rename(ROOT, ds, moved, ds, "moving")
    ns.rename(ROOT, ds, "moving", ds, moved)
    ns.unlink(ROOT, ds, "churn")
    ns.write(ns.create(ROOT, ds, "churn").ino, 0, CHURN)


def restore_live_tree(ns) -> None:
    """Undo what a kill cut short in ``change_live_tree`` (a name moved away, a file truncated
    or made but not written), so the next round's snapshots hold the whole dataset again."""
    ds = ns.resolve("/ds").ino
    names = {e.name: e.attr for e in ns.readdir(ROOT, ds, limit=10_000)[0]}
    if "moving" in names:
        missing = [i for i in range(FILES) if f"f{i:03d}" not in names]
        ns.rename(ROOT, ds, "moving", ds, f"f{missing[0]:03d}")
        names = {e.name: e.attr for e in ns.readdir(ROOT, ds, limit=10_000)[0]}
    if "churn" not in names:
        names["churn"] = ns.create(ROOT, ds, "churn")
    for name, body in [(f"f{i:03d}", small(i)) for i in range(FILES)] + [("churn", CHURN)]:
        if names[name].size != len(body):
            ns.write(names[name].ino, 0, body)
    ns.data.flush_all()
