"""Snapshots of a dataset through the engine: views, read-only, space, delete, rollback, clone,
diff.

On SQLite and PostgreSQL (the ``engine`` fixture)."""

from __future__ import annotations

import random

import pytest
from dphelpers import KiB, check_accounting
from sqlalchemy import func, select

from engine.admin import fsck
from engine.base import errors
from engine.catalog.models import Stripe
from engine.namespace import ROOT, Namespace
from engine.snapshots.service import Snapshots

STRIPES = Stripe.__table__


def _write(ns, path: str, data: bytes):
    parent, name = path.rsplit("/", 1)
    dir_ino = ns.resolve(parent or "/").ino
    attr = ns.create(ROOT, dir_ino, name, exclusive=False)
    ns.setattr(ROOT, attr.ino, size=0)
    ns.write(attr.ino, 0, data, stable=True)
    return attr


def _read(ns, path: str) -> bytes:
    attr = ns.resolve(path)
    return bytes(ns.read(attr.ino, 0, attr.size))


def _check(engine):
    check_accounting(engine.catalog)
    report = fsck.check(engine.catalog, engine.ns.root_ino)
    assert report.clean, report.problems


def _stripes(catalog) -> int:
    return catalog.read(lambda c: c.execute(select(func.count()).select_from(STRIPES)).scalar())


@pytest.fixture
def dataset(engine):
    ns = engine.ns
    ds = ns.mkdir(ROOT, ns.root_ino, "ds")
    sub = ns.mkdir(ROOT, ds.ino, "sub")
    files = {
        "/ds/a": random.Random(1).randbytes(300 * KiB),
        "/ds/sub/b": b"bee" * 1000,
        "/ds/sub/c": random.Random(2).randbytes(1500 * KiB),
    }
    for path, data in files.items():
        _write(ns, path, data)
    ns.symlink(ROOT, sub.ino, "link", "../a")
    ns.setxattr(ROOT, ns.resolve("/ds/a").ino, "user.k", b"v")
    ns.link(ROOT, ns.resolve("/ds/a").ino, sub.ino, "hard-a")
    return files


def test_snapshot_view_is_readable_read_only_and_hidden(engine, dataset):
    ns, snaps = engine.ns, Snapshots(engine.ns)
    stripes = _stripes(engine.catalog)
    info = snaps.create("/ds", "s1")
    # a lazy view (lazyviews.ENABLED) returns its figures not counted: counted now, through it
    counted = info if info.counted else snaps.space_of("/ds", "s1")
    assert info.name == "s1" and counted.files == 6  # ds, sub, a, b, c, link (hard-a is a)
    assert _stripes(engine.catalog) == stripes, "a snapshot writes no data"
    for path in dataset:
        _write(ns, path, b"changed")
    for path, data in dataset.items():
        assert _read(ns, path.replace("/ds/", "/ds/.snapshots/s1/")) == data
    view = ns.resolve("/ds/.snapshots/s1")
    assert ns.readlink(ns.resolve("/ds/.snapshots/s1/sub/link", follow=False).ino) == b"../a"
    assert ns.getxattr(ROOT, ns.resolve("/ds/.snapshots/s1/a").ino, "user.k") == b"v"
    assert ns.resolve("/ds/.snapshots/s1/sub/hard-a").ino == ns.resolve("/ds/.snapshots/s1/a").ino
    assert ns.parent(view.ino).ino == ns.resolve("/ds/.snapshots").ino
    names = [e.name for e in ns.readdir(ROOT, ns.resolve("/ds").ino)[0]]
    assert ".snapshots" not in names and sorted(names) == ["a", "sub"]
    assert [e.name for e in ns.readdir(ROOT, ns.resolve("/ds/.snapshots").ino)[0]] == ["s1"]
    frozen = ns.resolve("/ds/.snapshots/s1/a")
    attempts = [
        lambda: ns.write(frozen.ino, 0, b"x"),
        lambda: ns.setattr(ROOT, frozen.ino, size=0),
        lambda: ns.setattr(ROOT, frozen.ino, mode=0o600),
        lambda: ns.setxattr(ROOT, frozen.ino, "user.k", b"w"),
        lambda: ns.removexattr(ROOT, frozen.ino, "user.k"),
        lambda: ns.create(ROOT, view.ino, "new"),
        lambda: ns.mkdir(ROOT, view.ino, "new"),
        lambda: ns.unlink(ROOT, view.ino, "a"),
        lambda: ns.rename(ROOT, view.ino, "a", ns.resolve("/ds").ino, "stolen"),
        lambda: ns.link(ROOT, frozen.ino, ns.resolve("/ds").ino, "linked"),
        lambda: ns.rmdir(ROOT, ns.resolve("/ds/.snapshots").ino, "s1"),
        lambda: ns.rmdir(ROOT, ns.resolve("/ds").ino, ".snapshots"),
        lambda: ns.rename(ROOT, ns.resolve("/ds").ino, ".snapshots", ns.root_ino, "x"),
        lambda: ns.clone_range(ROOT, ns.resolve("/ds/a").ino, 0, frozen.ino, 0, 0),
        lambda: ns.deallocate(ROOT, frozen.ino, 0, 10),
    ]
    for attempt in attempts:
        with pytest.raises(errors.ReadOnly):
            attempt()
    with pytest.raises(errors.Exists):
        ns.mkdir(ROOT, ns.resolve("/ds").ino, ".snapshots")
    _check(engine)


def test_a_second_namespace_sees_a_snapshot_taken_by_another(engine, dataset):
    """What the CLI does with a daemon running: the daemon's caches follow the catalog."""
    ns = engine.ns
    frozen_path = "/ds/.snapshots/s1/a"
    assert not ns.is_read_only(ns.resolve("/ds/a").ino)
    with pytest.raises(errors.NotFound):
        ns.resolve(frozen_path)
    Snapshots(Namespace(engine.catalog)).create("/ds", "s1")  # another namespace, no data path
    frozen = ns.resolve(frozen_path)
    with pytest.raises(errors.ReadOnly):
        ns.write(frozen.ino, 0, b"x")
    assert ".snapshots" not in [e.name for e in ns.readdir(ROOT, ns.resolve("/ds").ino)[0]]


def test_space_referenced_and_unique(engine, dataset):
    ns, snaps = engine.ns, Snapshots(engine.ns)
    total = sum(len(d) for d in dataset.values())  # hard-a is the inode of a: counted once
    if not snaps.create("/ds", "s1").counted:  # a lazy view: counted after, through it
        snaps.recount_space("/ds")
    [s1] = snaps.list("/ds")
    assert s1.referenced_bytes == total and s1.unique_bytes == 0, "all shared with the live tree"
    assert s1.shared_bytes == total
    _write(ns, "/ds/sub/c", b"new")  # the old bytes of c are now the snapshot's alone
    assert snaps.list("/ds") == [s1], "a listing reads the figures as last counted"
    assert snaps.space_due(0) and not snaps.space_due(3600)
    [s1] = snaps.list("/ds", recount=True)
    assert s1.unique_bytes == len(dataset["/ds/sub/c"])
    assert s1.shared_bytes == total - len(dataset["/ds/sub/c"])
    assert snaps.list("/ds") == [s1], "the recount is stored"
    snaps.create("/ds", "s2")
    assert [s.name for s in snaps.list("/ds")] == ["s1", "s2"]
    before = _stripes(engine.catalog)
    snaps.delete("/ds", "s1")  # at once: its rows are freed in the background
    assert [s.name for s in snaps.list("/ds")] == ["s2"]
    [pending] = snaps.pending("/ds")
    assert pending.name == "s1" and pending.pending_bytes is None, "not counted yet"
    assert _stripes(engine.catalog) == before, "nothing is freed before the reclaim"
    _check(engine)  # a pending deletion's rows still hold their stripes
    assert snaps.reclaim(inodes_per_s=0) >= 1, "the reclaim frees what only it referenced"
    assert _stripes(engine.catalog) < before and snaps.pending() == []
    # what s2 shared with s1 alone may be s2's alone now: its figures are due for a recount
    [s2] = snaps.list("/ds")
    assert s2.counted == 0 and snaps.space_due(3600)
    assert snaps.recount_space(older_than_s=3600) == 1 and not snaps.space_due(3600)
    assert snaps.recount_space(older_than_s=3600) == 0, "nothing due any more"
    with pytest.raises(errors.NotFound):
        ns.resolve("/ds/.snapshots/s1")
    with pytest.raises(errors.NotFound):
        snaps.delete("/ds", "s1")
    with pytest.raises(errors.Exists):
        snaps.create("/ds", "s2")
    _check(engine)


def test_deleting_a_snapshot_frees_the_inline_data_only_it_held(engine, dataset):
    """The chunks of a deletion run without SQLite's foreign-key cascades: a small file's
    inline stripe that only the snapshot held must go with its bytes."""
    ns, snaps = engine.ns, Snapshots(engine.ns)

    def inline_rows() -> tuple[int, int]:
        return engine.catalog.read(
            lambda c: c.exec_driver_sql(
                "SELECT COUNT(*), COUNT(*) - COUNT(s.id) FROM inline_data i "
                "LEFT JOIN stripes s ON s.id = i.stripe_id"
            ).one()
        )

    held, orphans = inline_rows()
    assert held >= 1 and orphans == 0, "/ds/sub/b is a small durable write: inline"
    snaps.create("/ds", "s1")
    ns.unlink(ROOT, ns.resolve("/ds/sub").ino, "b")
    assert inline_rows() == (held, 0), "the snapshot still references it"
    snaps.delete("/ds", "s1")
    assert inline_rows() == (held, 0), "held until the background reclaim"
    snaps.finish_deletions()
    assert inline_rows() == (held - 1, 0)
    _check(engine)


def test_rollback_restores_the_tree_and_keeps_other_snapshots(engine, dataset):
    ns, snaps = engine.ns, Snapshots(engine.ns)
    snaps.create("/ds", "s1")
    _write(ns, "/ds/a", b"A2")
    _write(ns, "/ds/new", b"N")
    ns.unlink(ROOT, ns.resolve("/ds/sub").ino, "b")
    ns.setattr(ROOT, ns.resolve("/ds").ino, mode=0o700)
    snaps.create("/ds", "s2")
    assert sorted((e.change, e.path) for e in snaps.diff("/ds", "s1")) == [
        ("added", "new"),
        ("changed", "a"),
        ("changed", "sub"),
        ("changed", "sub/hard-a"),
        ("removed", "sub/b"),
    ]
    snaps.rollback("/ds", "s1")
    for path, data in dataset.items():
        assert _read(ns, path) == data
    assert ns.resolve("/ds/sub/hard-a").ino == ns.resolve("/ds/a").ino
    with pytest.raises(errors.NotFound):
        ns.resolve("/ds/new")
    assert snaps.diff("/ds", "s1") == []
    assert _read(ns, "/ds/.snapshots/s2/a") == b"A2", "later snapshots stay"
    # the rolled-back files are writable, and their writes leave the snapshot alone
    _write(ns, "/ds/a", b"A3")
    assert _read(ns, "/ds/.snapshots/s1/a") == dataset["/ds/a"]
    _check(engine)
    for name in ("s1", "s2"):
        snaps.delete("/ds", name)
    _check(engine)


def test_clone_is_writable_and_shares_stripes(engine, dataset):
    ns, snaps = engine.ns, Snapshots(engine.ns)
    snaps.create("/ds", "s1")
    stripes = _stripes(engine.catalog)
    snaps.clone("/ds", "s1", "/copy")
    assert _stripes(engine.catalog) == stripes
    for path, data in dataset.items():
        assert _read(ns, path.replace("/ds/", "/copy/")) == data
    _write(ns, "/copy/a", b"mine")
    assert _read(ns, "/ds/.snapshots/s1/a") == dataset["/ds/a"]
    assert _read(ns, "/ds/a") == dataset["/ds/a"]
    with pytest.raises(errors.Exists):
        snaps.clone("/ds", "s1", "/copy")
    snaps.delete("/ds", "s1")
    snaps.finish_deletions()
    assert _read(ns, "/copy/sub/c") == dataset["/ds/sub/c"]
    _check(engine)


def test_diff_between_two_snapshots(engine, dataset):
    ns, snaps = engine.ns, Snapshots(engine.ns)
    snaps.create("/ds", "s1")
    _write(ns, "/ds/sub/b", b"bee2")
    snaps.create("/ds", "s2")
    assert [(e.change, e.path) for e in snaps.diff("/ds", "s1", "s2")] == [("changed", "sub/b")]
    assert snaps.diff("/ds", "s2") == []


def test_snapshot_of_a_tree_holding_a_dataset_leaves_its_snapshots_out(engine, dataset):
    ns, snaps = engine.ns, Snapshots(engine.ns)
    snaps.create("/ds/sub", "inner")
    snaps.create("/ds", "outer")
    with pytest.raises(errors.NotFound):
        ns.resolve("/ds/.snapshots/outer/sub/.snapshots")
    assert _read(ns, "/ds/.snapshots/outer/sub/b") == dataset["/ds/sub/b"]
    with pytest.raises(errors.NotEmpty):
        snaps.rollback("/ds", "outer")  # it would drop /ds/sub's snapshots
    with pytest.raises(errors.ReadOnly):
        snaps.create("/ds/.snapshots/outer", "x")
    _check(engine)


def test_space_never_counted_is_counted_by_the_listing(engine, dataset):
    """Snapshots made before their figures were stored (NULL): the listing counts them, the
    recount stores them."""
    snaps = Snapshots(engine.ns)
    made = snaps.create("/ds", "s1")
    fresh = snaps.list("/ds", recount=True)
    engine.catalog.run(
        lambda c: c.exec_driver_sql(
            "UPDATE snapshots SET files = NULL, referenced_bytes = NULL, unique_bytes = NULL, "
            "shared_bytes = NULL, space_counted_ns = NULL"
        )
    )
    [listed] = snaps.list("/ds")
    assert (listed.referenced_bytes, listed.unique_bytes, listed.files) == (
        made.referenced_bytes,
        0,
        made.files,
    )
    assert snaps.space_due(3600), "listing did not store them"
    assert snaps.recount_space(older_than_s=3600) == 1
    assert [(s.referenced_bytes, s.shared_bytes) for s in snaps.list("/ds")] == [
        (f.referenced_bytes, f.shared_bytes) for f in fresh
    ]


def test_fsck_checks_the_snapshot_rows(engine, dataset):
    """The file count and referenced bytes a snapshot's row recorded are what its range holds
    (its frozen rows never change), and no two snapshots' ranges overlap."""
    snaps = Snapshots(engine.ns)
    snaps.create("/ds", "s1", whole=True)  # copies: their ranges (lazy views: test_lazy_views)
    snaps.create("/ds", "s2", whole=True)
    _write(engine.ns, "/ds/sub/c", b"changed")  # the live tree moves on: the rows hold still
    snaps.recount_space()
    _check(engine)

    def fault(statement: str) -> list[str]:
        engine.catalog.run(lambda c: c.exec_driver_sql(statement))
        return fsck.check(engine.catalog, engine.ns.root_ino).problems

    [problem] = fault("UPDATE snapshots SET files = files + 1 WHERE name = 's1'")
    assert "'s1'" in problem and "inodes, its range holds" in problem
    fault("UPDATE snapshots SET files = files - 1 WHERE name = 's1'")
    [problem] = fault("UPDATE snapshots SET referenced_bytes = 7 WHERE name = 's2'")
    assert "'s2' of inode" in problem and "recorded 7 referenced bytes" in problem
    fault("UPDATE snapshots SET referenced_bytes = NULL, files = NULL")  # not counted: no claim
    _check(engine)
    problems = fault(
        "UPDATE snapshots SET ino_lo = (SELECT ino_hi FROM snapshots WHERE name = 's1') "
        "WHERE name = 's2'"
    )
    assert any("overlap those of 's1'" in p for p in problems), problems
    assert any("'s2' of inode" in p and "not its one block" in p for p in problems), problems
    problems = fault(  # the read-only check bisects the blocks: they must not overlap either
        "UPDATE snapshot_blocks SET ino_lo = (SELECT ino_hi FROM snapshots WHERE name = 's1') "
        "WHERE snapshot_id = (SELECT id FROM snapshots WHERE name = 's2')"
    )
    assert any("block" in p and "overlaps a block of 's1'" in p for p in problems), problems


def test_each_snapshot_takes_as_many_inode_numbers_as_it_copies(engine, dataset):
    """A snapshot's range is as wide as its tree has inodes, however many snapshots came
    before: numbered ``ino + delta``, each one spanned the earlier ones' ranges once a file was
    made after them, and reserved twice the numbers of the one before."""
    ns, snaps = engine.ns, Snapshots(engine.ns)
    ds = ns.resolve("/ds").ino
    for k in range(8):
        info = snaps.create("/ds", f"s{k}", whole=True)  # a lazy view has no range
        lo, hi, blocks = engine.catalog.read(
            lambda c, n=info.name: c.exec_driver_sql(
                "SELECT ino_lo, ino_hi, (SELECT COUNT(*) FROM snapshot_blocks b WHERE "
                f"b.snapshot_id = s.id AND b.ino_lo = s.ino_lo AND b.ino_hi = s.ino_hi) "
                f"FROM snapshots s WHERE name = '{n}'"
            ).one()
        )
        assert hi - lo + 1 == info.files == 6 + k, (k, lo, hi)
        assert blocks == 1, "a snapshot copied whole is one block of inode numbers"
        ns.create(ROOT, ds, f"new{k}")  # numbered after every range so far
    views = {
        name: sorted(e.name for e in ns.readdir(ROOT, ns.resolve(f"/ds/.snapshots/{name}").ino)[0])
        for name in ("s0", "s7")
    }
    assert views["s0"] == ["a", "sub"] and views["s7"] == [
        "a",
        *(f"new{k}" for k in range(7)),
        "sub",
    ]
    assert _read(ns, "/ds/.snapshots/s7/sub/hard-a") == dataset["/ds/a"]
    _check(engine)


def test_a_sparse_range_is_reclaimed_by_its_inodes_not_its_numbers(engine, dataset):
    """Snapshots numbered ``ino + delta`` (before dense numbering) hold ranges far wider than
    their inodes: the reclaim jumps to the next inode, and paces by the rows it frees."""
    snaps = Snapshots(engine.ns)
    snaps.create("/ds", "old")
    snaps.delete("/ds", "old")
    engine.catalog.run(  # a range of 10**12 numbers holding 6 inodes, as the doubling made
        lambda c: (
            c.exec_driver_sql("UPDATE snapshots SET ino_hi = ino_hi + 1000000000000"),
            c.exec_driver_sql("UPDATE snapshot_blocks SET ino_hi = ino_hi + 1000000000000"),
        )
    )
    chunks: list[int] = []
    snaps.reclaim(inodes_per_s=10, progress=lambda done, total, _m: chunks.append(done))
    assert snaps.pending() == [] and len(chunks) <= 2, chunks
    _check(engine)
