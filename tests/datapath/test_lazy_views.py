"""Lazy snapshot views (issue 35, engine/namespace/lazyviews.py; switched off on main
(``lazyviews.ENABLED``), so these tests switch it on and take whole copies beside the lazy
views with ``create(..., whole=True)``): create writing the view's root only, the namespace's
copy-up before each kind of change in the change's own transaction, the lookup order, and the
whole-view readers (fsck of a view not copied yet, diff, space counted through the lookup,
clone, rollback), checked
against copies made whole at the same instants."""

from __future__ import annotations

import random

from dphelpers import KiB, check_accounting

from engine.admin import fsck
from engine.catalog.database import sql, sql_one
from engine.catalog.models import DIR, REG
from engine.namespace import ROOT, lazyviews
from engine.namespace.lazyclones import materialize_subtree
from engine.snapshots.service import Snapshots


def _write(ns, path: str, data: bytes):
    parent, name = path.rsplit("/", 1)
    attr = ns.create(ROOT, ns.resolve(parent or "/").ino, name, exclusive=False)
    ns.setattr(ROOT, attr.ino, size=0)
    ns.write(attr.ino, 0, data, stable=True)
    return attr


def _lazy(engine, name: str) -> int:
    """A lazy snapshot of /ds (what create makes when live changes copy up); returns its id."""
    info = Snapshots(engine.ns).create("/ds", name, whole=False)
    assert (info.files, info.counted) == (0, 0), "counted later, through its lookup"
    return info.id


def _tree(engine, root: int) -> dict[str, tuple]:
    return engine.catalog.read(lambda c: Snapshots._paths(c, root))


def _contents(engine, root: int) -> dict[str, bytes]:
    ns = engine.ns
    out = {}

    def walk(ino: int, prefix: str):
        for entry in ns.readdir(ROOT, ino)[0]:
            attr = entry.attr
            if attr.type == DIR:
                walk(attr.ino, f"{prefix}{entry.name}/")
            elif attr.type == REG:
                out[prefix + entry.name] = bytes(ns.read(attr.ino, 0, attr.size))

    walk(root, "")
    return out


def test_each_lazy_view_equals_a_whole_copy_taken_with_it(engine, monkeypatch):
    monkeypatch.setattr(lazyviews, "ENABLED", True)  # live changes copy up
    ns = engine.ns
    snaps = Snapshots(ns)
    ds = ns.mkdir(ROOT, ns.root_ino, "ds").ino
    sub = ns.mkdir(ROOT, ds, "sub").ino
    ns.mkdir(ROOT, sub, "deep")
    rng = random.Random(3)
    for path in ("/ds/a", "/ds/sub/b", "/ds/sub/c", "/ds/sub/deep/d", "/ds/keep"):
        _write(ns, path, rng.randbytes(40 * KiB))
    a, b, c, d = (ns.resolve(p).ino for p in ("/ds/a", "/ds/sub/b", "/ds/sub/c", "/ds/sub/deep/d"))
    ns.link(ROOT, a, sub, "hard-a")
    ns.symlink(ROOT, sub, "link", "../a")
    ns.setxattr(ROOT, a, "user.k", b"v")

    e1 = snaps.create("/ds", "e1", whole=True)
    l1 = _lazy(engine, "l1")
    ns.write(a, 0, b"changed after 1", stable=True)
    ns.setattr(ROOT, b, size=10)
    # a folder leaves the dataset; a later snapshot does not hold it, the first one still does
    ns.rename(ROOT, sub, "deep", ns.root_ino, "moved")

    e2 = snaps.create("/ds", "e2", whole=True)
    l2 = _lazy(engine, "l2")
    # d is in l1 only: its write copies into the newest snapshot that holds it
    ns.write(d, 0, b"written outside the dataset", stable=True)
    ns.unlink(ROOT, sub, "c")
    _write(ns, "/ds/sub/new", b"new")
    ns.setxattr(ROOT, a, "user.k", b"w")
    ns.write(b, 0, b"again", stable=True)
    ns.link(ROOT, b, ds, "hard-b")  # b's link count, ds's names
    keep = ns.resolve("/ds/keep").ino
    ns.write(keep, 0, b"after 2", stable=True)  # the same at 1 and 2: copied into l2 only
    # while l2 is being deleted, copy-up goes to l1, which reads l2's copy: copied from it
    deleting = "UPDATE snapshots SET deleting = ? WHERE id = ?"
    engine.catalog.run(lambda conn: sql(conn, deleting, (True, l2)).close())
    ns.write(keep, 0, b"after 2 deleted", stable=True)
    engine.catalog.run(lambda conn: sql(conn, deleting, (False, l2)).close())

    # views not copied yet: fsck counts the names their folders will get
    report = fsck.check(engine.catalog, ns.root_ino)
    assert report.clean, report.problems
    # the whole-view readers copy a lazy view's folders first, then read its blocks
    assert snaps.diff("/ds", "l2") == snaps.diff("/ds", "e2")
    assert snaps.diff("/ds", "l1", "l2") == snaps.diff("/ds", "e1", "e2")
    whole = {i.name: i for i in snaps.list("/ds", recount=True)}
    for eager, lazy in (("e1", "l1"), ("e2", "l2")):
        assert (whole[lazy].files, whole[lazy].referenced_bytes) == (
            whole[eager].files,
            whole[eager].referenced_bytes,
        )
    clones = [snaps.clone("/ds", name, f"/clone-{name}") for name in ("e1", "l1")]
    engine.catalog.run(lambda conn: [materialize_subtree(conn, c) for c in clones])
    assert _tree(engine, clones[1]) == _tree(engine, clones[0])

    # l1 reads what l2 copied of b (b changed after l2 was taken): a deleted l2 must keep
    # serving l1's lookups until its copies are moved
    engine.catalog.run(
        lambda conn: sql(conn, "UPDATE snapshots SET deleting = ? WHERE id = ?", (True, l2)).close()
    )
    for eager, lazy in ((e1, l1), (e2, l2)):
        engine.catalog.run(lambda conn, s=lazy: lazyviews.materialize_all(conn, s), durable=True)
        ns.forget_read_only()
        ns.invalidate()
        eager_root = ns.resolve(f"/ds/.snapshots/{eager.name}").ino
        lazy_root = engine.catalog.read(
            lambda conn, s=lazy: sql_one(conn, "SELECT root_ino FROM snapshots WHERE id = ?", (s,))
        )[0]
        assert _tree(engine, lazy_root) == _tree(engine, eager_root), eager.name
        assert _contents(engine, lazy_root) == _contents(engine, eager_root), eager.name
    engine.catalog.run(
        lambda conn: sql(
            conn, "UPDATE snapshots SET deleting = ? WHERE id = ?", (False, l2)
        ).close()
    )
    snaps.rollback("/ds", "l1")
    rolled = _tree(engine, ds)
    snaps.rollback("/ds", "e1")
    assert rolled == _tree(engine, ds)
    check_accounting(engine.catalog)
    report = fsck.check(engine.catalog, ns.root_ino)
    assert report.clean, report.problems


def _count(catalog, table: str) -> int:
    return catalog.read(lambda c: c.exec_driver_sql(f"SELECT COUNT(*) FROM {table}").scalar())


def test_a_lazy_view_is_counted_through_its_lookup_without_copying(engine, monkeypatch):
    monkeypatch.setattr(lazyviews, "ENABLED", True)
    ns, catalog = engine.ns, engine.catalog
    snaps = Snapshots(ns)
    ds = ns.mkdir(ROOT, ns.root_ino, "ds").ino
    sub = ns.mkdir(ROOT, ds, "sub").ino
    rng = random.Random(5)
    for path in ("/ds/a", "/ds/sub/b", "/ds/sub/c", "/outside"):
        _write(ns, path, rng.randbytes(24 * KiB))
    a, b = ns.resolve("/ds/a").ino, ns.resolve("/ds/sub/b").ino
    ns.link(ROOT, a, sub, "hard-a")  # one file, counted once
    ns.link(ROOT, ns.resolve("/outside").ino, sub, "in")  # a name outside the dataset too
    e1 = snaps.create("/ds", "e1", whole=True)
    sid = _lazy(engine, "l1")
    ns.write(a, 0, rng.randbytes(24 * KiB), stable=True)  # l1's copy holds a's old stripe
    ns.unlink(ROOT, sub, "c")  # l1 holds c's rows through its copy
    _write(ns, "/ds/new", b"not in the views")
    ns.write(b, 0, b"x", stable=True)
    snaps.delete("/ds", "e1")
    snaps.finish_deletions()  # a's old stripe is now l1's alone

    inodes, pending = _count(catalog, "inodes"), _count(catalog, "clone_pending")
    assert snaps.recount_space("/ds") == 1
    assert (_count(catalog, "inodes"), _count(catalog, "clone_pending")) == (inodes, pending)
    [info] = snaps.list("/ds")
    assert (info.files, info.referenced_bytes) == (e1.files, e1.referenced_bytes)
    assert info.unique_bytes >= 24 * KiB and info.counted > 0
    report = fsck.check(catalog, ns.root_ino)
    assert report.clean, report.problems  # the recorded figures are the walk's

    # the same view made whole: its blocks then hold all of it, and count the same
    catalog.run(lambda conn: lazyviews.materialize_all(conn, sid), durable=True)
    whole = catalog.read(lambda conn: snaps._count_space(conn, sid))
    walked = catalog.read(lambda conn: lazyviews.count_space(conn, sid))
    assert (
        walked
        == whole
        == (
            info.files,
            info.referenced_bytes,
            info.unique_bytes,
            info.shared_bytes,
        )
    )
    # fsck compares a counted view's row with the walk
    engine.catalog.run(
        lambda conn: sql(
            conn, "UPDATE snapshots SET files = files + 1 WHERE id = ?", (sid,)
        ).close()
    )
    report = fsck.check(catalog, ns.root_ino)
    assert any("its view holds" in p for p in report.problems), report.problems


def test_a_deleted_view_hands_its_copies_down_and_frees_its_blocks_in_few_chunks(
    engine, monkeypatch
):
    monkeypatch.setattr(lazyviews, "ENABLED", True)
    ns, catalog = engine.ns, engine.catalog
    snaps = Snapshots(ns)
    ds = ns.mkdir(ROOT, ns.root_ino, "ds").ino
    rng = random.Random(8)
    files = [_write(ns, f"/ds/f{i}", rng.randbytes(4 * KiB)).ino for i in range(24)]
    e1 = snaps.create("/ds", "e1", whole=True)
    l1 = _lazy(engine, "l1")
    ns.write(files[0], 0, b"after 1", stable=True)  # l1's own copy
    snaps.create("/ds", "e2", whole=True)
    _lazy(engine, "l2")
    for i, ino in enumerate(files):  # copied into l2, which l1 reads; live files between them
        ns.write(ino, 0, b"after 2", stable=True)
        _write(ns, f"/ds/new{i}", b"new")
    ns.unlink(ROOT, ds, "f1")
    # a clone inside the dataset, not copied yet: a lazy create copies its folders first
    snaps.clone("/ds", "e1", "/ds/fork")
    _lazy(engine, "l3")
    assert _contents(engine, ns.resolve("/ds/.snapshots/l3/fork").ino) == _contents(
        engine, ns.resolve("/ds/.snapshots/e1").ino
    )
    snaps.delete("/ds", "l2")
    snaps.delete("/ds", "e2")
    chunks = []
    snaps.reclaim(inodes_per_s=0, progress=lambda done, total, message: chunks.append(done))
    # e2 is one range; l2's 25 single-number blocks go together, not one per transaction
    assert len(chunks) <= 3, chunks
    assert _count(catalog, "snapshot_blocks") > 0 and not snaps.pending()
    l1_root = catalog.read(
        lambda conn: sql_one(conn, "SELECT root_ino FROM snapshots WHERE id = ?", (l1,))
    )[0]
    e1_root = ns.resolve("/ds/.snapshots/e1").ino
    assert _contents(engine, l1_root) == _contents(engine, e1_root)
    assert _tree(engine, l1_root) == _tree(engine, e1_root)
    assert e1.files == 25
    check_accounting(catalog)
    report = fsck.check(catalog, ns.root_ino)
    assert report.clean, report.problems
