"""Lazy snapshot views (issue 35, engine/namespace/lazyviews.py; create still copies whole and
copy-up is switched off, so the test makes the lazy views and switches it on): the namespace's
copy-up before each kind of change in the change's own transaction, the lookup order, and the
whole-view readers (fsck of a view not copied yet, diff, space, clone, rollback), checked
against copies made whole at the same instants."""

from __future__ import annotations

import random
import time

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


def _lazy(engine, dataset: int, name: str) -> int:
    """A lazy snapshot of ``dataset`` named in its .snapshots (what create will do): its row
    and root; returns its id."""

    def work(conn):
        top = sql_one(conn, "SELECT MAX(ino) FROM inodes")[0]
        sid = sql_one(
            conn,
            "INSERT INTO snapshots (name, source_ino, root_ino, ino_lo, ino_hi, created_ns, "
            "deleting, top_ino) VALUES (?, ?, ?, 0, 0, ?, ?, ?) RETURNING id",
            (name, dataset, dataset, time.time_ns(), False, top),
        )[0]
        root = lazyviews.create(conn, dataset, sid)
        sql(
            conn,
            "UPDATE snapshots SET root_ino = ?, ino_lo = ?, ino_hi = ? WHERE id = ?",
            (root, root, root, sid),
        ).close()
        snapdir = sql_one(
            conn, "SELECT dir_ino FROM snapshot_dirs WHERE dataset_ino = ?", (dataset,)
        )[0]
        sql(
            conn,
            "INSERT INTO dirents (parent, name, child) VALUES (?, ?, ?)",
            (snapdir, name, root),
        ).close()
        Snapshots._touch(conn, snapdir, nlink_delta=1)
        return sid

    sid = engine.catalog.run(work, durable=True)
    engine.ns.forget_read_only()
    engine.ns.invalidate()
    return sid


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

    e1 = snaps.create("/ds", "e1")
    l1 = _lazy(engine, ds, "l1")
    ns.write(a, 0, b"changed after 1", stable=True)
    ns.setattr(ROOT, b, size=10)
    # a folder leaves the dataset; a later snapshot does not hold it, the first one still does
    ns.rename(ROOT, sub, "deep", ns.root_ino, "moved")

    e2 = snaps.create("/ds", "e2")
    l2 = _lazy(engine, ds, "l2")
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
