"""Namespace.is_inside, the check behind export confinement, on both catalogs: right after
every change that moves an inode in or out of a subtree (a rename to another directory, a
link added or removed, a commit of another process), and answered from its cache otherwise."""

from __future__ import annotations

from engine.catalog import Catalog
from engine.namespace import ROOT, Namespace


def test_is_inside_follows_renames_links_and_other_processes(namespace, catalog_url, count_reads):
    ns = namespace
    top = ns.mkdir(ROOT, ns.root_ino, "scratch", 0o755)
    d = ns.mkdir(ROOT, top.ino, "D", 0o755)
    deep = ns.mkdir(ROOT, d.ino, "deeper", 0o755)
    f = ns.create(ROOT, deep.ino, "f", 0o644)
    archive = ns.mkdir(ROOT, ns.root_ino, "archive", 0o755)

    def inside(attr) -> bool:
        return ns.is_inside(top.ino, ns.getattr(attr.ino))

    assert inside(top) and inside(d) and inside(deep) and inside(f)
    assert not inside(archive)
    assert ns.is_inside(ns.root_ino, archive)  # everything is inside the root
    if ns.catalog.epoch() is not None:  # SQLite: cached, no query the second time
        reads = count_reads(ns.catalog)
        assert ns.is_inside(top.ino, f)
        assert not reads
    ns.rename(ROOT, top.ino, "D", archive.ino, "D")  # the subtree moves out
    assert not inside(d) and not inside(deep) and not inside(f)
    ns.rename(ROOT, archive.ino, "D", top.ino, "D")
    assert inside(f)
    ns.link(ROOT, f.ino, archive.ino, "f2")  # linked outside too: still inside
    assert inside(f)
    ns.unlink(ROOT, deep.ino, "f")  # its only link inside gone
    assert not inside(f)
    ns.rename(ROOT, archive.ino, "f2", archive.ino, "f3")  # within one directory: no change
    assert not inside(f)
    assert inside(deep)  # cached
    # another process moves the directory out
    other = Catalog(catalog_url)
    try:
        Namespace(other).rename(ROOT, top.ino, "D", archive.ino, "D")
    finally:
        other.close()
    # SQLite: seen at once; PostgreSQL: once the notification is in (catch_up, or 1 s at most)
    assert ns.catalog.catch_up()
    assert not inside(deep)
