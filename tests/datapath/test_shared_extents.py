"""Shared extents: clone_range, copy_range, deallocate, allocate, seek_data/seek_hole.

Each test ends with the accounting check (a stripe's live bytes are exactly what its extents
reference, over every file sharing it) and fsck."""

from __future__ import annotations

import random

import pytest
from dphelpers import KiB, MiB, check_accounting
from sqlalchemy import func, select

from engine.admin import fsck
from engine.base import errors
from engine.catalog.models import Stripe
from engine.namespace import ROOT

STRIPES = Stripe.__table__


def _file(ns, name: str, data: bytes):
    attr = ns.create(ROOT, ns.root_ino, name)
    if data:
        ns.write(attr.ino, 0, data, stable=True)
    return attr


def _stripes(catalog) -> int:
    return catalog.read(lambda c: c.execute(select(func.count()).select_from(STRIPES)).scalar())


def _check(engine):
    check_accounting(engine.catalog)
    report = fsck.check(engine.catalog, engine.ns.root_ino)
    assert report.clean, report.problems


def test_clone_shares_stripes_and_survives_overwrite_and_delete(engine):
    ns = engine.ns
    data = random.Random(1).randbytes(3 * MiB + 1234)
    src = _file(ns, "src", data)
    before = _stripes(engine.catalog)
    dst = _file(ns, "dst", b"")
    attr = ns.clone_range(ROOT, src.ino, 0, dst.ino, 0, 0)  # 0: to the end of the source
    assert attr.size == len(data)
    assert _stripes(engine.catalog) == before, "a clone writes no stripe"
    assert ns.read(dst.ino, 0, len(data)) == data
    _check(engine)
    # overwriting the source keeps the clone's bytes
    ns.write(src.ino, 100, b"z" * 200 * KiB, stable=True)
    assert ns.read(dst.ino, 0, len(data)) == data
    ns.unlink(ROOT, ns.root_ino, "src")
    assert ns.read(dst.ino, 0, len(data)) == data
    _check(engine)
    ns.unlink(ROOT, ns.root_ino, "dst")
    assert _stripes(engine.catalog) == 0, "stripes nothing references are freed"
    _check(engine)


def test_unaligned_clone_splits_extents(engine):
    ns = engine.ns
    data = random.Random(2).randbytes(2 * MiB)
    src = _file(ns, "src", data)
    dst = _file(ns, "dst", b"d" * (MiB // 2))
    ns.clone_range(ROOT, src.ino, 12345, dst.ino, 1000, 700_001)
    want = bytearray(b"d" * (MiB // 2))
    want[1000 : 1000 + 700_001] = data[12345 : 12345 + 700_001]
    assert ns.getattr(dst.ino).size == len(want)
    assert ns.read(dst.ino, 0, 2 * MiB) == bytes(want)
    # a clone into the middle of a file leaves the bytes around it
    ns.clone_range(ROOT, src.ino, 0, dst.ino, 3, 5)
    want[3:8] = data[0:5]
    assert ns.read(dst.ino, 0, 2 * MiB) == bytes(want)
    _check(engine)


def test_clone_refuses_overlap_read_only_and_past_the_end(engine):
    ns = engine.ns
    src = _file(ns, "src", b"x" * 100_000)
    with pytest.raises(errors.InvalidArgument):
        ns.clone_range(ROOT, src.ino, 0, src.ino, 50_000, 60_000)
    with pytest.raises(errors.InvalidArgument):
        ns.clone_range(ROOT, src.ino, 90_000, _file(ns, "d", b"").ino, 0, 20_000)
    ns.clone_range(ROOT, src.ino, 0, src.ino, 100_000, 100_000)  # apart: fine
    assert ns.read(src.ino, 0, 300_000) == b"x" * 200_000
    _check(engine)


def test_clone_of_buffered_writes_includes_them(engine):
    ns = engine.ns
    src = _file(ns, "src", b"")
    ns.write(src.ino, 0, b"a" * 10_000)  # buffered, not committed
    dst = _file(ns, "dst", b"")
    ns.write(dst.ino, 0, b"b" * 20_000)  # buffered: must not land over the clone later
    ns.clone_range(ROOT, src.ino, 0, dst.ino, 0, 10_000)
    ns.commit(dst.ino)
    assert ns.read(dst.ino, 0, 30_000) == b"a" * 10_000 + b"b" * 10_000
    _check(engine)


def test_deallocate_frees_only_what_nothing_else_references(engine):
    ns = engine.ns
    data = random.Random(3).randbytes(2 * MiB)
    a = _file(ns, "a", data)
    b = _file(ns, "b", b"")
    ns.clone_range(ROOT, a.ino, 0, b.ino, 0, MiB)
    ns.deallocate(ROOT, a.ino, 0, len(data))
    assert ns.getattr(a.ino).size == len(data)
    assert ns.read(a.ino, 0, len(data)) == bytes(len(data))
    assert ns.read(b.ino, 0, MiB) == data[:MiB], "the clone keeps the punched bytes"
    _check(engine)
    ns.deallocate(ROOT, b.ino, 0, MiB)
    assert _stripes(engine.catalog) == 0
    _check(engine)


def test_seek_data_and_hole(engine):
    ns = engine.ns
    f = _file(ns, "f", b"")
    ns.write(f.ino, 100_000, b"q" * 50_000, stable=True)
    ns.setattr(ROOT, f.ino, size=400_000)
    assert ns.seek_data(f.ino, 0) == 100_000
    assert ns.seek_data(f.ino, 120_000) == 120_000
    assert ns.seek_hole(f.ino, 0) == 0
    assert ns.seek_hole(f.ino, 100_000) == 150_000
    assert ns.seek_hole(f.ino, 200_000) == 200_000
    with pytest.raises(errors.NoSuchOffset):
        ns.seek_data(f.ino, 150_000)
    with pytest.raises(errors.NoSuchOffset):
        ns.seek_hole(f.ino, 400_000)
    ns.write(f.ino, 0, b"x" * 10, stable=True)
    assert ns.seek_data(f.ino, 0) == 0 and ns.seek_hole(f.ino, 0) == 10


def test_copy_range_shares_large_and_copies_small(engine):
    ns = engine.ns
    data = random.Random(4).randbytes(MiB)
    src = _file(ns, "src", data)
    before = _stripes(engine.catalog)
    big = _file(ns, "big", b"")
    assert ns.copy_range(ROOT, src.ino, 0, big.ino, 0, MiB) == MiB
    assert _stripes(engine.catalog) == before
    small = _file(ns, "small", b"")
    assert ns.copy_range(ROOT, src.ino, 10, small.ino, 5, 1000) == 1000
    assert ns.read(small.ino, 0, 2000) == bytes(5) + data[10:1010]
    assert ns.copy_range(ROOT, src.ino, MiB - 10, small.ino, 0, 1000) == 10, "short at the end"
    assert ns.read(big.ino, 0, MiB) == data
    _check(engine)


def test_allocate_grows_the_file_and_refuses_more_than_is_free(engine):
    ns = engine.ns
    f = _file(ns, "f", b"abc")
    attr = ns.allocate(ROOT, f.ino, 0, 100_000)
    assert attr.size == 100_000
    assert ns.read(f.ino, 0, 10) == b"abc" + bytes(7)
    assert ns.allocate(ROOT, f.ino, 0, 10).size == 100_000
    with pytest.raises(errors.NoSpace):
        ns.allocate(ROOT, f.ino, 0, 1 << 40)
