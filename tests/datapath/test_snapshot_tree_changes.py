"""A snapshot of a tree of 1,000 files made through the engine keeps its view whatever the live
tree does afterwards: renames (a file, a file across folders, a whole folder, over an existing
name), overwrites, truncates (shorter and longer), unlinks, hard links (into the tree and out
of it), new files, folders, symlinks and xattrs. A writable clone of the snapshot shows the same
tree, takes writes of its own, and outlives the snapshot. Every file is compared by sha256.

These are the views any version model must keep (docs/snapshots.md: today's copy, and the
overlay that copies rows up before a change); on SQLite and PostgreSQL (the ``engine``
fixture)."""

from __future__ import annotations

import hashlib
import random

from dphelpers import check_accounting

from engine.admin import fsck
from engine.catalog.models import DIR, LNK
from engine.namespace import ROOT
from engine.snapshots.service import Snapshots

FOLDERS, PER_FOLDER = 10, 100  # 1,000 files


def _content(i: int) -> bytes:
    return random.Random(i).randbytes(64 + (i * 37) % 3000)


def _build(ns) -> int:
    ds = ns.mkdir(ROOT, ns.root_ino, "ds").ino
    for f in range(FOLDERS):
        folder = ns.mkdir(ROOT, ds, f"d{f}").ino
        for i in range(PER_FOLDER):
            n = f * PER_FOLDER + i
            attr = ns.create(ROOT, folder, f"f{i:03d}")
            ns.write(attr.ino, 0, _content(n))
    ns.symlink(ROOT, ds, "link", "d0/f000")
    ns.setxattr(ROOT, ns.resolve("/ds/d1/f001").ino, "user.tag", b"one")
    ns.link(ROOT, ns.resolve("/ds/d2/f002").ino, ns.resolve("/ds/d3").ino, "hard")
    ns.data.flush_all()
    return ds


def _tree(ns, top: int, only: str | None = None) -> dict[str, tuple]:
    """Relative path -> (type, size, mode, nlink, sha256 or link target, xattrs) of every
    name under ``top`` (``only``: of that name in ``top`` alone)."""
    out: dict[str, tuple] = {}
    todo = [("", top)]
    while todo:
        prefix, dir_ino = todo.pop()
        cookie, eof = 0, False
        while not eof:
            entries, eof = ns.readdir(ROOT, dir_ino, cookie, show_snapshots=False)
            for entry in entries:
                if only is not None and entry.name != only:
                    continue
                attr, path = entry.attr, prefix + entry.name
                if attr.type == DIR:
                    body = ""
                    if only is None:
                        todo.append((path + "/", attr.ino))
                elif attr.type == LNK:
                    body = ns.readlink(attr.ino).hex()
                else:
                    body = hashlib.sha256(bytes(ns.read(attr.ino, 0, attr.size))).hexdigest()
                xattrs = tuple(
                    (name, ns.getxattr(ROOT, attr.ino, name))
                    for name in sorted(ns.listxattr(ROOT, attr.ino))
                )
                out[path] = (attr.type, attr.size, attr.mode, attr.nlink, body, xattrs)
            cookie = entries[-1].cookie if entries else cookie
    return out


def _tree_entry(ns, path: str) -> tuple:
    parent, name = path.rsplit("/", 1)
    return _tree(ns, ns.resolve(parent).ino, only=name)[name]


def _change_everything(ns, ds: int) -> None:
    d = {f: ns.resolve(f"/ds/d{f}").ino for f in range(FOLDERS)}
    ns.rename(ROOT, d[0], "f001", d[0], "renamed")  # in place
    ns.rename(ROOT, d[0], "f002", d[1], "moved-in")  # across folders
    ns.rename(ROOT, d[0], "f003", d[0], "f004")  # over an existing name
    ns.rename(ROOT, ds, "d5", ds, "d5-renamed")  # a whole folder
    ns.rename(ROOT, d[6], "f000", ns.root_ino, "escaped")  # out of the dataset
    ns.write(ns.lookup(ROOT, d[1], "f010").ino, 5, b"overwritten")
    ns.write(ns.lookup(ROOT, d[1], "f011").ino, 0, b"x" * 5000)  # past its end
    ns.setattr(ROOT, ns.lookup(ROOT, d[2], "f020").ino, size=10)  # shorter
    ns.setattr(ROOT, ns.lookup(ROOT, d[2], "f021").ino, size=100_000)  # longer
    ns.setattr(ROOT, ns.lookup(ROOT, d[2], "f022").ino, mode=0o600)
    ns.unlink(ROOT, d[3], "f030")
    ns.unlink(ROOT, d[3], "hard")  # one of two names
    ns.link(ROOT, ns.lookup(ROOT, d[4], "f040").ino, d[7], "new-hard")  # inside
    ns.link(ROOT, ns.lookup(ROOT, d[4], "f041").ino, ns.root_ino, "outside-hard")  # outside
    ns.setxattr(ROOT, ns.lookup(ROOT, d[1], "f001").ino, "user.tag", b"two")
    ns.setxattr(ROOT, ns.lookup(ROOT, d[4], "f042").ino, "user.new", b"v")
    for i in range(PER_FOLDER):  # a folder emptied and removed
        ns.unlink(ROOT, d[9], f"f{i:03d}")
    ns.rmdir(ROOT, ds, "d9")
    ns.mkdir(ROOT, ds, "new-folder")
    ns.write(ns.create(ROOT, d[8], "new-file").ino, 0, b"new")
    ns.unlink(ROOT, ds, "link")
    ns.symlink(ROOT, ds, "link", "elsewhere")
    ns.data.flush_all()


def _check(engine) -> None:
    check_accounting(engine.catalog)
    report = fsck.check(engine.catalog, engine.ns.root_ino)
    assert report.clean, report.problems


def test_snapshot_view_holds_through_every_change_and_a_clone_outlives_it(engine):
    ns, snaps = engine.ns, Snapshots(engine.ns)
    ds = _build(ns)
    before = _tree(ns, ds)
    assert sum(1 for v in before.values() if v[0] != DIR) == FOLDERS * PER_FOLDER + 2
    snaps.create("/ds", "s1")
    view = ns.resolve("/ds/.snapshots/s1").ino

    _change_everything(ns, ds)
    after = _tree(ns, ds)
    assert after != before and "d5-renamed/f050" in after and "d9/f000" not in after
    assert _tree(ns, view) == before, "the snapshot's view did not move"
    _check(engine)

    snaps.clone("/ds", "s1", "/fork")
    fork = ns.resolve("/fork").ino
    assert _tree(ns, fork) == before
    ns.write(ns.resolve("/fork/d0/f000").ino, 0, b"the fork's own")
    ns.unlink(ROOT, ns.resolve("/fork/d1").ino, "f015")
    ns.data.flush_all()
    forked = _tree(ns, fork)
    assert forked["d0/f000"] != before["d0/f000"] and "d1/f015" not in forked
    for path in ("d0/f000", "d1/f015"):  # the clone changes only itself
        assert _tree_entry(ns, "/ds/.snapshots/s1/" + path) == before[path]

    snaps.delete("/ds", "s1")
    snaps.finish_deletions()
    assert _tree(ns, fork) == forked, "the clone outlives its origin"
    assert _tree_entry(ns, "/ds/d0/f000") == after["d0/f000"]
    _check(engine)
