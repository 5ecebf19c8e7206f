"""load_extents finds the extents touching a range by two index seeks, whatever the extents'
lengths, and does work bounded by what it returns, not by how finely the file is cut."""

from __future__ import annotations

import random
import time

from engine.catalog.database import sql, sql_one
from engine.datapath.accounting import load_extents
from engine.namespace import ROOT

KiB, MiB = 1 << 10, 1 << 20


def _file_with_extents(engine, pieces: list[tuple[int, int]]) -> int:
    """A file whose extents are ``pieces`` (offset, length), all on one stripe row."""
    ino = engine.ns.create(ROOT, engine.ns.root_ino, "f").ino

    def work(conn):
        total = max(o + n for o, n in pieces)
        stripe = sql_one(
            conn,
            "INSERT INTO stripes (band_class, layout, k, m, backend, data_length, "
            "fragment_length, compression, live_bytes, created_ns) "
            "VALUES ('hot', 'inline', 1, 0, NULL, ?, ?, NULL, ?, ?) RETURNING id",
            (total, total, total, time.time_ns()),
        )[0]
        for offset, length in pieces:
            sql(
                conn,
                "INSERT INTO extents (ino, file_offset, length, stripe_id, stripe_offset) "
                "VALUES (?, ?, ?, ?, ?)",
                (ino, offset, length, stripe, offset),
            ).close()

    engine.catalog.run(work)
    return ino


def _touching(pieces, lo, hi):
    return sorted((o, n) for o, n in pieces if o + n > lo and (hi is None or o < hi))


def test_ranges_find_every_touching_extent_of_any_length(engine):
    # a 64 MiB extent (longer than any stripe) followed by small ones and a gap
    pieces = [(0, 64 * MiB)] + [(64 * MiB + i * 4 * KiB, 4 * KiB) for i in range(20)]
    pieces.append((80 * MiB, 8 * KiB))
    ino = _file_with_extents(engine, pieces)
    edges = [0, 1, 32 * MiB, 64 * MiB - 1, 64 * MiB, 64 * MiB + 4 * KiB, 64 * MiB + 6 * KiB]
    edges += [70 * MiB, 80 * MiB, 80 * MiB + 8 * KiB, 90 * MiB]
    for lo in edges:
        for hi in [None] + [e for e in edges if e > lo]:
            rows = engine.catalog.read(lambda conn, lo=lo, hi=hi: load_extents(conn, ino, lo, hi))
            got = sorted((r[0], r[1]) for r in rows)
            assert got == _touching(pieces, lo, hi), (lo, hi)
    rows = engine.catalog.read(lambda conn: load_extents(conn, ino, None, 64 * MiB + 1))
    assert sorted((r[0], r[1]) for r in rows) == _touching(pieces, 0, 64 * MiB + 1)
    assert len(engine.catalog.read(lambda conn: load_extents(conn, ino))) == len(pieces)


def test_a_small_range_of_a_finely_cut_file_reads_few_rows(sqlite_engine):
    """The commit of a 4 KiB overwrite looks up the extents under it: a file cut into 4 KiB
    extents must not make that lookup walk the extents of the stripes before it."""
    engine = sqlite_engine
    pieces = [(i * 4 * KiB, 4 * KiB) for i in range(4096)]  # 16 MiB in 4 KiB extents
    ino = _file_with_extents(engine, pieces)
    rng = random.Random(3)

    def steps(conn):
        raw = conn.connection.driver_connection
        counted = [0]

        def tick():
            counted[0] += 1
            return 0

        raw.set_progress_handler(tick, 10)
        try:
            for _ in range(50):
                lo = rng.randrange(1, 4095) * 4 * KiB
                rows = load_extents(conn, ino, lo, lo + 4 * KiB)
                assert [(r[0], r[1]) for r in rows] == [(lo, 4 * KiB)]
        finally:
            raw.set_progress_handler(None, 0)
        return counted[0] * 10 / 50

    per_lookup = engine.catalog.read(steps)
    # two seeks and a row or two: about 150 VM steps here; a scan of the 8 MiB before the
    # range (the longest extent of these policies' stripes) took tens of thousands
    assert per_lookup < 1000, per_lookup
