"""Extent sharing against a model: random create, write, clone, punch, truncate, delete and
snapshot create, delete and rollback.

After every sequence: fsck is clean, every stripe's live bytes are exactly what its extents
reference, and every live file and every snapshot view reads what the model says."""

from __future__ import annotations

import shutil

from dphelpers import Engine, check_accounting
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from migrated import migrate_sqlite

from engine.admin import fsck
from engine.catalog import Catalog
from engine.catalog.database import sql_all
from engine.datapath.accounting import share
from engine.namespace import ROOT
from engine.snapshots.service import Snapshots

NAMES = ["f0", "f1", "f2", "f3"]
SIZE = 300_000  # files stay below this: several 64 KiB-fragment stripes each

offsets = st.integers(0, SIZE - 1)
lengths = st.integers(1, 120_000)
name = st.sampled_from(NAMES)
step = st.one_of(
    st.tuples(st.just("write"), name, offsets, lengths, st.integers(0, 255)),
    st.tuples(st.just("clone"), name, offsets, name, offsets, lengths),
    st.tuples(st.just("punch"), name, offsets, lengths),
    st.tuples(st.just("truncate"), name, offsets),
    st.tuples(st.just("delete"), name),
    st.tuples(
        st.just("snapshot"),
    ),
    st.tuples(st.just("drop_snapshot"), st.integers(0, 3)),
    st.tuples(st.just("rollback"), st.integers(0, 3)),
)


def _apply(ns, snaps, ds, model, snapshots, counter, op) -> None:
    kind = op[0]

    def ino(n, create=True):
        if n not in model:
            if not create:
                return None
            model[n] = bytearray()
            return ns.create(ROOT, ds, n).ino
        return ns.lookup(ROOT, ds, n).ino

    if kind == "write":
        _, n, off, length, byte = op
        length = min(length, SIZE - off)
        f = ino(n)
        ns.write(f, off, bytes([byte]) * length, stable=byte % 2 == 0)
        data = model[n]
        if len(data) < off + length:
            data.extend(bytes(off + length - len(data)))
        data[off : off + length] = bytes([byte]) * length
    elif kind == "clone":
        _, src, src_off, dst, dst_off, length = op
        if src not in model or src_off >= len(model[src]):
            return
        length = min(length, len(model[src]) - src_off, SIZE - dst_off)
        if src == dst and src_off < dst_off + length and dst_off < src_off + length:
            return
        piece = bytes(model[src][src_off : src_off + length])
        ns.clone_range(ROOT, ino(src), src_off, ino(dst), dst_off, length)
        data = model[dst]
        if len(data) < dst_off + length:
            data.extend(bytes(dst_off + length - len(data)))
        data[dst_off : dst_off + length] = piece
    elif kind == "punch":
        _, n, off, length = op
        f = ino(n, create=False)
        if f is None:
            return
        ns.deallocate(ROOT, f, off, length)
        data = model[n]
        end = min(off + length, len(data))
        if end > off:
            data[off:end] = bytes(end - off)
    elif kind == "truncate":
        _, n, size = op
        f = ino(n, create=False)
        if f is None:
            return
        ns.setattr(ROOT, f, size=size)
        data = model[n]
        del data[size:]
        data.extend(bytes(size - len(data)))
    elif kind == "delete":
        if op[1] in model:
            ns.unlink(ROOT, ds, op[1])
            del model[op[1]]
    elif kind == "snapshot":
        counter[0] += 1
        label = f"s{counter[0]}"
        snaps.create("/ds", label)
        snapshots[label] = {n: bytes(d) for n, d in model.items()}
    elif kind == "rollback" and snapshots:
        label = sorted(snapshots)[op[1] % len(snapshots)]
        snaps.rollback("/ds", label)
        model.clear()
        model.update({n: bytearray(d) for n, d in snapshots[label].items()})
    elif kind == "drop_snapshot" and snapshots:
        label = sorted(snapshots)[op[1] % len(snapshots)]
        snaps.delete("/ds", label)
        del snapshots[label]
        if op[1] % 2:  # else its rows stay pending for a while, as between reclaim rounds
            snaps.reclaim(inodes_per_s=0)


def _check_zone_shares(catalog) -> None:
    """Every zone's live bytes are the recount of its fragments' shares (accounting.share)."""

    def work(conn):
        zones = dict(sql_all(conn, "SELECT id, live_bytes FROM zones"))
        rows = sql_all(
            conn,
            "SELECT f.zone_id, f.length, s.live_bytes, s.data_length "
            "FROM fragments f JOIN stripes s ON s.id = f.stripe_id",
        )
        return zones, rows

    zones, rows = catalog.read(work)
    recount = dict.fromkeys(zones, 0)
    for zone, length, live, data_length in rows:
        recount[zone] += share(length, live, data_length)
    assert recount == zones


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(step, min_size=1, max_size=25))
def test_shared_extents_match_the_model(tmp_path_factory, steps):
    root = tmp_path_factory.mktemp("model")
    url = f"sqlite:///{root}/catalog.db"
    migrate_sqlite(url)
    catalog = Catalog(url)
    engine = Engine(catalog, root / "drives", drive_size=32 << 20)
    try:
        ns = engine.ns
        snaps = Snapshots(ns)
        ds = ns.mkdir(ROOT, ns.root_ino, "ds").ino
        model: dict[str, bytearray] = {}
        snapshots: dict[str, dict[str, bytes]] = {}
        counter = [0]
        for op in steps:
            _apply(ns, snaps, ds, model, snapshots, counter, op)
        for n, data in model.items():
            f = ns.lookup(ROOT, ds, n)
            assert f.size == len(data), n
            assert ns.read(f.ino, 0, SIZE) == data, n
        for label, files in snapshots.items():
            view = ns.resolve(f"/ds/.snapshots/{label}")
            names = {e.name for e in ns.readdir(ROOT, view.ino)[0]}
            assert names == set(files), label
            for n, data in files.items():
                f = ns.lookup(ROOT, view.ino, n)
                assert ns.read(f.ino, 0, SIZE) == data, (label, n)
        engine.data.flush_all()
        check_accounting(catalog)
        _check_zone_shares(catalog)
        report = fsck.check(catalog, ns.root_ino)
        assert report.clean, report.problems
    finally:
        engine.close()
        catalog.close()
        # each example's zone files are preallocated (320 MiB): 12 examples left 4 GiB behind
        shutil.rmtree(root, ignore_errors=True)
