"""Writable clones in constant time (engine/namespace/lazyclones.py): a clone writes its root
row only; each directory's names and children are copied from the snapshot when first needed.
Every way of meeting a directory not copied yet sees what an eager copy would have: lookups and
listings, a create over a name it holds, rmdir of it, a snapshot or diff of a tree holding it,
a new quota over it, the deletion of its snapshot, fsck while it is pending. On SQLite and
PostgreSQL (the ``engine`` fixture)."""

from __future__ import annotations

import random

import pytest
from dphelpers import KiB, check_accounting

from engine.admin import fsck
from engine.admin.quota_service import QuotaService
from engine.base import errors
from engine.namespace import ROOT, lazyviews
from engine.snapshots.service import Snapshots

FILES = {
    "a": random.Random(1).randbytes(300 * KiB),
    "sub/b": b"bee" * 1000,
    "sub/deeper/c": random.Random(2).randbytes(700 * KiB),
}


# a clone's folders not copied yet (a lazy view's own pending folders are rows there too)
CLONE_PENDING = "clone_pending WHERE delta <> 0"


def _count(catalog, table: str) -> int:
    return catalog.read(lambda c: c.exec_driver_sql(f"SELECT COUNT(*) FROM {table}").scalar())


def _read(ns, path: str) -> bytes:
    attr = ns.resolve(path)
    return bytes(ns.read(attr.ino, 0, attr.size))


def _check(engine) -> None:
    check_accounting(engine.catalog)
    report = fsck.check(engine.catalog, engine.ns.root_ino)
    assert report.clean, report.problems


@pytest.fixture(params=["whole", "lazy"])
def snaps(engine, request, monkeypatch):
    """A snapshot copied whole, or a lazy view (live changes copy up: lazyviews.ENABLED), whose
    clones read it through its lookup and number their inodes as they copy them."""
    if request.param == "lazy":
        monkeypatch.setattr(lazyviews, "ENABLED", True)
    ns = engine.ns
    ds = ns.mkdir(ROOT, ns.root_ino, "ds").ino
    deeper = ns.mkdir(ROOT, ns.mkdir(ROOT, ds, "sub").ino, "deeper").ino
    for path, data in FILES.items():
        f = ns.create(ROOT, ns.resolve("/ds/" + path.rpartition("/")[0]).ino, path.split("/")[-1])
        ns.write(f.ino, 0, data, stable=True)
    ns.link(ROOT, ns.resolve("/ds/a").ino, deeper, "hard-a")  # a name in a deep folder
    snaps = Snapshots(ns)
    snaps.create("/ds", "s1")
    return snaps


def test_a_clone_writes_its_root_only_and_copies_folders_when_first_read(engine, snaps):
    ns, catalog = engine.ns, engine.catalog
    inodes, stripes = _count(catalog, "inodes"), _count(catalog, "stripes")
    snaps.clone("/ds", "s1", "/fork")
    assert _count(catalog, "inodes") == inodes + 1, "the root alone"
    assert _count(catalog, CLONE_PENDING) == 1 and _count(catalog, "stripes") == stripes
    _check(engine)  # a pending folder's link count holds the names its snapshot gives it
    assert _read(ns, "/fork/a") == FILES["a"]  # the root's lookup copies the root's names
    assert _count(catalog, CLONE_PENDING) == 1, "sub is pending now"
    _check(engine)  # a is copied, its second name (in sub/deeper) is not yet
    assert sorted(e.name for e in ns.readdir(ROOT, ns.resolve("/fork/sub").ino)[0]) == [
        "b",
        "deeper",
    ]
    assert _read(ns, "/fork/sub/deeper/c") == FILES["sub/deeper/c"]
    hard = ns.resolve("/fork/sub/deeper/hard-a")
    assert hard.ino == ns.resolve("/fork/a").ino and hard.nlink == 2, "one inode, two names"
    assert _count(catalog, CLONE_PENDING) == 0
    ns.write(hard.ino, 0, b"forked", stable=True)
    assert _read(ns, "/ds/.snapshots/s1/a") == FILES["a"] and _read(ns, "/ds/a") == FILES["a"]
    _check(engine)


def test_changes_in_a_folder_not_copied_yet_see_its_names(engine, snaps):
    ns = engine.ns
    snaps.clone("/ds", "s1", "/fork")
    fork = ns.getattr(ns.resolve("/fork").ino)
    with pytest.raises(errors.Exists):  # the create sees the name the snapshot gives it
        ns.create(ROOT, fork.ino, "a", exclusive=True)
    with pytest.raises(errors.NotEmpty):
        ns.rmdir(ROOT, ns.root_ino, "fork")
    sub = ns.resolve("/fork/sub").ino  # pending: its names are not copied yet
    with pytest.raises(errors.NotEmpty):
        ns.rmdir(ROOT, ns.resolve("/fork").ino, "sub")
    ns.rename(ROOT, sub, "b", sub, "b2")  # a change in it copies its names first
    assert sorted(e.name for e in ns.readdir(ROOT, sub)[0]) == ["b2", "deeper"]
    empty = ns.mkdir(ROOT, ns.root_ino, "empty").ino
    with pytest.raises(errors.NotEmpty):  # a rename over a pending folder: not empty either
        ns.rename(ROOT, ns.root_ino, "empty", sub, "deeper")
    assert ns.getattr(empty).nlink == 2
    _check(engine)


def test_snapshot_diff_and_quota_of_a_tree_holding_a_pending_clone(engine, snaps):
    ns = engine.ns
    snaps.clone("/ds", "s1", "/ds/fork")  # inside the dataset
    snaps.create("/ds", "s2")  # copies the clone's folders first: the view holds every file
    for path, data in FILES.items():
        assert _read(ns, "/ds/.snapshots/s2/fork/" + path) == data
    snaps.clone("/ds", "s1", "/ds/fork2")
    added = {e.path for e in snaps.diff("/ds", "s2") if e.change == "added"}
    assert "fork2/sub/deeper/c" in added
    snaps.clone("/ds", "s1", "/team")
    quotas = QuotaService(ns)
    quotas.set("/team", files_limit=100)  # counts the whole clone: a (twice named), sub, b,
    assert next(q for q in quotas.list() if q.path == "/team").used_files == 5  # deeper, c
    snaps.clone("/ds", "s1", "/team/under")  # under a quota: copied at once
    assert next(q for q in quotas.list() if q.path == "/team").used_files == 11
    _check(engine)


def test_a_clone_outlives_its_snapshot_before_it_is_read(engine, snaps):
    ns = engine.ns
    snaps.clone("/ds", "s1", "/fork")
    snaps.delete("/ds", "s1")
    assert _count(engine.catalog, CLONE_PENDING) == 1, "the reclaim copies it, not the delete"
    snaps.finish_deletions()
    assert _count(engine.catalog, CLONE_PENDING) == 0
    for path, data in FILES.items():
        assert _read(ns, "/fork/" + path) == data
    assert ns.resolve("/fork/sub/deeper/hard-a").nlink == 2
    _check(engine)
