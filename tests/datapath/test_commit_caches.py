"""What a flush leaves cached so the next call needs no catalog query (SQLite), and when it
must not be trusted: the namespace caches the attributes read inside the flush's own
transaction; the data path remembers an idle file's size and class until a commit it cannot
account for (another process's, or an untracked one of this process)."""

from __future__ import annotations

import os

from sqlalchemy import select, update

from engine.catalog.models import Extent, Inode, Stripe
from engine.namespace import ROOT

INODES, EXTENTS, STRIPES = Inode.__table__, Extent.__table__, Stripe.__table__


def catalog_attrs(catalog, ino):
    return catalog.read(
        lambda c: c.execute(
            select(INODES.c.size, INODES.c.mtime_ns, INODES.c.change).where(INODES.c.ino == ino)
        ).one()
    )


def test_a_flush_leaves_the_files_new_attributes_cached(sqlite_engine, count_reads):
    engine = sqlite_engine
    ns = engine.ns
    ino = ns.create(ROOT, ns.root_ino, "f").ino
    ns.getattr(ino)
    ns.write(ino, 0, os.urandom(5000))
    ns.commit(ino)
    size, mtime, change = catalog_attrs(engine.catalog, ino)
    reads = count_reads(engine.catalog)
    attr = ns.getattr(ino)
    assert reads == [], "the attributes the flush changed were not cached"
    assert (attr.size, attr.mtime_ns, attr.change) == (size, mtime, change) and size == 5000


def test_a_write_after_a_flush_needs_no_catalog_read(sqlite_engine, count_reads):
    engine = sqlite_engine
    ns = engine.ns
    ino = ns.create(ROOT, ns.root_ino, "f").ino
    data = bytearray(os.urandom(64 << 10))
    ns.write(ino, 0, bytes(data))
    ns.commit(ino)
    reads = count_reads(engine.catalog)
    for offset in (4096, 40960, 8192):
        piece = os.urandom(4096)
        data[offset : offset + 4096] = piece
        ns.write(ino, offset, piece)
        ns.commit(ino)
    assert reads == [], (
        "a write to a file its last flush left idle asked the catalog for size and class"
    )
    engine.restart()
    assert engine.ns.read(ino, 0, len(data)) == bytes(data)


def test_a_commit_by_anyone_else_makes_the_next_write_read_the_catalog(engine):
    ns = engine.ns
    ino = ns.create(ROOT, ns.root_ino, "f").ino
    ns.write(ino, 0, b"a" * 4096, stable=True)  # settled: unpinned, 4096 bytes
    # tiering or retention pin the file to a class in a transaction of their own
    engine.catalog.run(
        lambda c: c.execute(update(INODES).where(INODES.c.ino == ino).values(band_class="warm"))
    )
    ns.write(ino, 4096, b"b" * 4096, stable=True)
    layouts = engine.catalog.read(
        lambda c: c.execute(
            select(EXTENTS.c.file_offset, STRIPES.c.layout, STRIPES.c.band_class)
            .select_from(EXTENTS.join(STRIPES, STRIPES.c.id == EXTENTS.c.stripe_id))
            .where(EXTENTS.c.ino == ino)
            .order_by(EXTENTS.c.file_offset)
        ).all()
    )
    assert [tuple(r) for r in layouts] == [(0, "inline", "hot"), (4096, "ec", "warm")]
    assert ns.read(ino, 0, 8192) == b"a" * 4096 + b"b" * 4096


def test_the_first_write_to_a_new_file_needs_no_catalog_read(sqlite_engine, count_reads):
    engine = sqlite_engine
    ns = engine.ns
    ino = ns.create(ROOT, ns.root_ino, "new").ino
    reads = count_reads(engine.catalog)
    ns.write(ino, 0, b"x" * 100)
    assert reads == [], (
        "the create's own transaction told the data path the new file's size and class"
    )
    ns.commit(ino)
    engine.restart()
    assert engine.ns.read(ino, 0, 200) == b"x" * 100


def test_other_files_flushes_leave_a_settled_file_alone(sqlite_engine, count_reads):
    """Eight checkpoint writers flush in turn: each one's next write must not ask the catalog
    again just because the others committed meanwhile (their commits are tracked)."""
    engine = sqlite_engine
    ns = engine.ns
    files = [ns.create(ROOT, ns.root_ino, f"rank{i}").ino for i in range(3)]
    for ino in files:
        ns.write(ino, 0, os.urandom(8192))
        ns.commit(ino)
    reads = count_reads(engine.catalog)
    for round_ in range(1, 3):
        for ino in files:
            ns.write(ino, round_ * 8192, os.urandom(8192))
            ns.commit(ino)
    assert reads == [], "another file's flush made a settled file read its size and class again"
    # a truncate (a tracked namespace commit) changes the size: the next write must see it
    ns.setattr(ROOT, files[0], size=100)
    ns.write(files[0], 100, b"z" * 10)
    assert ns.getattr(files[0]).size == 110  # unflushed: the size is the data path's
    ns.commit(files[0])
    assert ns.getattr(files[0]).size == 110
    engine.restart()
    assert engine.ns.getattr(files[0]).size == 110
    assert engine.ns.read(files[0], 100, 20) == b"z" * 10
