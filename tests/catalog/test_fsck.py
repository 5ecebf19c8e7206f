"""fsck finds nothing on a tree built through the namespace, and finds real damage."""

from __future__ import annotations

from sqlalchemy import update

from engine.admin.fsck import check
from engine.catalog.models import Inode
from engine.namespace import ROOT


def build(ns):
    a = ns.mkdir(ROOT, ns.root_ino, "a")
    b = ns.mkdir(ROOT, a.ino, "b")
    f = ns.create(ROOT, b.ino, "f")
    ns.link(ROOT, f.ino, a.ino, "g")
    ns.symlink(ROOT, ns.root_ino, "l", "a/b/f")
    ns.rename(ROOT, a.ino, "b", ns.root_ino, "b2")
    return f


def test_clean_tree(namespace, catalog):
    build(namespace)
    report = check(catalog, namespace.root_ino)
    assert report.clean, report.problems
    assert report.inodes == 5 and report.dirents == 5


def test_damage_is_reported(namespace, catalog):
    f = build(namespace)
    catalog.run(
        lambda conn: conn.execute(
            update(Inode.__table__).where(Inode.__table__.c.ino == f.ino).values(nlink=7)
        )
    )
    report = check(catalog, namespace.root_ino)
    assert not report.clean
    assert any(f"inode {f.ino} has nlink 7, but 2" in p for p in report.problems)
