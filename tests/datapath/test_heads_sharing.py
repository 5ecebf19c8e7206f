"""Two heads over one catalog and one set of drives (docs/pnfs.md): each its own Catalog,
DataPath and Namespace, as two processes have; [heads] count 2 gives each its own zones. Each
reads what the other wrote, at once, though it had the file's extent map cached."""

from __future__ import annotations

import os

from dphelpers import Engine, check_accounting

from engine.catalog import Catalog
from engine.datapath import DataPath
from engine.namespace import ROOT, Namespace


def test_two_heads_write_one_file_in_their_own_zones(sqlite_catalog, tmp_path, count_reads):
    first = Engine(sqlite_catalog, tmp_path / "drives", datapath_options={"zone_share": (0, 2)})
    catalog = Catalog(str(sqlite_catalog.engine.url))
    data = DataPath(catalog, first.policies, reserve_zones=2, zone_share=(1, 2))
    second = Namespace(catalog, data=data)
    try:
        stripe = 8 * 64 * 1024
        ino = first.ns.create(ROOT, first.ns.root_ino, "shared").ino
        part_a, part_b = os.urandom(2 * stripe), os.urandom(2 * stripe)
        first.ns.write(ino, 0, part_a, stable=True)
        # both heads read the file: each caches its extent map now
        assert first.ns.read(ino, 0, 4 * stripe) == part_a
        assert second.read(ino, 0, 4 * stripe) == part_a
        second.write(ino, 2 * stripe, part_b, stable=True)  # as a data server's FILE_SYNC WRITE
        # the first head's cached map and attributes follow the other head's commit at once
        assert first.ns.getattr(ino).size == 4 * stripe
        assert first.ns.read(ino, 0, 4 * stripe) == part_a + part_b
        first.ns.write(ino, 0, b"x" * 100, stable=True)  # an overwrite the other must see
        assert second.read(ino, 0, 4 * stripe) == b"x" * 100 + part_a[100:] + part_b
        # more appended by the second head to zones whose files the first has open already:
        # the first reads past the pointer it knew
        part_c = os.urandom(stripe)
        second.write(ino, 4 * stripe, part_c, stable=True)
        assert first.ns.read(ino, 4 * stripe, stripe) == part_c
        part_b = part_b + part_c

        # change records (engine/catalog/changelog.py): the other head's commit of another
        # file keeps this file's extent map and what this head knows of it as an idle file
        other = first.ns.create(ROOT, first.ns.root_ino, "other").ino
        first.ns.write(other, 0, b"o" * 100, stable=True)
        assert first.ns.read(other, 0, 100) == b"o" * 100
        reads = count_reads(first.catalog)
        second.write(ino, 5 * stripe, b"y" * 10, stable=True)
        assert first.ns.read(other, 0, 100) == b"o" * 100
        first.ns.write(other, 100, b"p", stable=False)
        assert reads == [], "another head's commit of one file emptied the caches of another"
        first.ns.commit(other)
        assert first.ns.read(ino, 5 * stripe, 10) == b"y" * 10
        part_b += b"y" * 10

        # each head appended only to its own zones (number modulo 2 = its index)
        rows = sqlite_catalog.read(
            lambda conn: conn.exec_driver_sql(
                "SELECT z.idx, s.id FROM fragments f JOIN zones z ON z.id = f.zone_id "
                "JOIN stripes s ON s.id = f.stripe_id"
            ).all()
        )
        assert {idx % 2 for idx, _ in rows} == {0, 1}
        by_stripe: dict[int, set[int]] = {}
        for idx, sid in rows:
            by_stripe.setdefault(sid, set()).add(idx % 2)
        assert all(len(parities) == 1 for parities in by_stripe.values()), by_stripe
    finally:
        data.close()
        catalog.close()
    first.restart()  # recovery of its own zones finds nothing amiss
    assert first.ns.read(ino, 0, 5 * stripe + 10) == b"x" * 100 + part_a[100:] + part_b
    check_accounting(sqlite_catalog)
