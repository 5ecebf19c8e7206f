"""Inline stripes: small durable writes whose bytes ride in the flush's own catalog transaction.

They must read back after a restart and with drives lost (they are on no drive), die with the
extents that name them, be folded into erasure-coded stripes by tiering, stay within their
budget, and never return bytes that fail their checksum."""

from __future__ import annotations

import os

import pytest
from dphelpers import Engine, KiB, check_accounting
from sqlalchemy import func, select, update

from engine.base import errors
from engine.catalog.models import Drive, Extent, Fragment, InlineData, Inode, Stripe
from engine.lifecycle.drives import redundancy_status
from engine.lifecycle.tiering import Tiering, TieringPolicy
from engine.namespace import ROOT

STRIPES, INLINE_DATA, EXTENTS = Stripe.__table__, InlineData.__table__, Extent.__table__


def write(engine, name, pieces):
    """Create ``name`` and make each (offset, bytes) durable on its own, as a COMMIT would."""
    ns = engine.ns
    ino = ns.create(ROOT, ns.root_ino, name).ino
    for offset, data in pieces:
        ns.write(ino, offset, data, stable=True)
    return ino


def stripes_of(engine, ino):
    """(layout, band class, data length) of the stripes the file's extents name, in file order."""
    return engine.catalog.read(
        lambda c: c.execute(
            select(STRIPES.c.layout, STRIPES.c.band_class, STRIPES.c.data_length)
            .select_from(EXTENTS.join(STRIPES, STRIPES.c.id == EXTENTS.c.stripe_id))
            .where(EXTENTS.c.ino == ino)
            .order_by(EXTENTS.c.file_offset)
        ).all()
    )


def inline_bytes(engine):
    return engine.catalog.read(
        lambda c: c.execute(
            select(func.count(), func.coalesce(func.sum(INLINE_DATA.c.length), 0))
        ).one()
    )


def test_a_small_durable_write_is_kept_in_the_catalog_and_reads_back_after_restart(engine):
    data = os.urandom(4 * KiB)
    ino = write(engine, "small", [(0, data)])
    assert stripes_of(engine, ino) == [("inline", "hot", 4 * KiB)]
    assert tuple(inline_bytes(engine)) == (1, 4 * KiB)
    fragments = engine.catalog.read(
        lambda c: c.execute(select(func.count()).select_from(Fragment.__table__)).scalar()
    )
    assert fragments == 0  # no drive was written: one fsync round (the catalog's)
    assert engine.data.stats["inline_bytes_written"] == 4 * KiB
    engine.restart()
    assert engine.ns.read(ino, 0, 8 * KiB) == data
    assert engine.data.reader.stats["inline_reads"] == 1
    check_accounting(engine.catalog)


def test_inline_bytes_read_back_with_every_parity_drive_lost(sqlite_engine):
    engine = sqlite_engine
    data = os.urandom(3000)
    ino = write(engine, "f", [(0, data)])
    engine.catalog.run(
        lambda c: c.execute(
            update(Drive.__table__)
            .where(Drive.__table__.c.id.in_(engine.drive_ids[:5]))
            .values(state="failed")
        )
    )
    engine.restart()
    assert engine.ns.read(ino, 0, len(data)) == data
    status = redundancy_status(engine.catalog)
    assert status.stripes == 0 and status.lost == 0  # inline stripes are on no drive


def test_overwritten_inline_bytes_are_deleted_with_their_stripe(engine):
    first, second = os.urandom(4 * KiB), os.urandom(4 * KiB)
    ino = write(engine, "f", [(0, first), (0, second)])
    assert tuple(inline_bytes(engine)) == (
        1,
        4 * KiB,
    )  # the first stripe died and took its bytes along
    assert engine.ns.read(ino, 0, 4 * KiB) == second
    engine.ns.unlink(ROOT, engine.ns.root_ino, "f")
    assert tuple(inline_bytes(engine)) == (0, 0)
    check_accounting(engine.catalog)


def test_random_small_writes_into_a_big_file_read_back_exactly(sqlite_engine):
    engine = sqlite_engine
    ns = engine.ns
    base = bytearray(os.urandom(1024 * KiB))
    ino = ns.create(ROOT, ns.root_ino, "big").ino
    ns.write(ino, 0, bytes(base))
    ns.commit(ino)
    pieces = [((i * 37 % 256) * 4 * KiB, os.urandom(4 * KiB)) for i in range(40)]
    for offset, data in pieces:
        ns.write(ino, offset, data, stable=True)
        base[offset : offset + len(data)] = data
    layouts = {layout for layout, _c, _n in stripes_of(engine, ino)}
    assert layouts == {"ec", "inline"}
    engine.restart()
    assert engine.ns.read(ino, 0, len(base)) == bytes(base)
    check_accounting(engine.catalog)


def test_large_flushes_and_pinned_files_are_never_inline(sqlite_engine):
    engine = sqlite_engine
    big = write(engine, "big", [(0, os.urandom(100 * KiB))])
    assert {layout for layout, _c, _n in stripes_of(engine, big)} == {"ec"}
    ns = engine.ns
    pinned = ns.create(ROOT, ns.root_ino, "pinned").ino
    engine.catalog.run(
        lambda c: c.execute(
            update(Inode.__table__).where(Inode.__table__.c.ino == pinned).values(band_class="warm")
        )
    )
    engine.restart()
    engine.ns.write(pinned, 0, b"x" * 1000, stable=True)
    assert stripes_of(engine, pinned) == [("ec", "warm", 1000)]


def test_inline_budget_sends_the_rest_to_replicated_hot_stripes(sqlite_catalog, tmp_path):
    engine = Engine(
        sqlite_catalog, tmp_path / "drives", datapath_options={"inline_budget_bytes": 8 * KiB}
    )
    try:
        ino = write(engine, "f", [(i * 4 * KiB, os.urandom(4 * KiB)) for i in range(4)])
        assert [layout for layout, _c, _n in stripes_of(engine, ino)] == [
            "inline",
            "inline",
            "replica",
            "replica",
        ]
        assert tuple(inline_bytes(engine)) == (2, 8 * KiB)
    finally:
        engine.close()


def test_tiering_folds_inline_stripes_into_erasure_coded_ones(engine):
    pieces = [(i * 10 * KiB, os.urandom(10 * KiB)) for i in range(12)]
    ino = write(engine, "ds", pieces)
    assert {layout for layout, _c, _n in stripes_of(engine, ino)} == {"inline"}
    moved, _written = Tiering(engine.ns, engine.data, engine.catalog, TieringPolicy()).move_file(
        ino, "warm"
    )
    assert moved == 120 * KiB
    assert {(layout, band) for layout, band, _n in stripes_of(engine, ino)} == {("ec", "warm")}
    assert tuple(inline_bytes(engine)) == (0, 0)
    engine.restart()
    assert engine.ns.read(ino, 0, 120 * KiB) == b"".join(data for _o, data in pieces)
    check_accounting(engine.catalog)


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_damaged_inline_bytes_fail_the_read_instead_of_returning_them(sqlite_engine, damage):
    engine = sqlite_engine
    data = os.urandom(4 * KiB)
    ino = write(engine, "f", [(0, data)])
    bad = bytes([data[0] ^ 1]) + data[1:] if damage == "flip" else data[:100]
    engine.catalog.run(lambda c: c.execute(update(INLINE_DATA).values(data=bad)))
    engine.restart()
    with pytest.raises(errors.IOFailure, match="inline stripe"):
        engine.ns.read(ino, 0, 4 * KiB)
    assert engine.data.reader.stats["checksum_errors"] >= 1


def test_bad_inline_settings_are_refused(sqlite_catalog, tmp_path):
    for name, value in (
        ("inline_write_bytes", -1),
        ("inline_budget_bytes", "lots"),
        ("inline_budget_bytes", True),
    ):
        with pytest.raises(errors.ConfigError, match=f"storage.{name}"):
            Engine(sqlite_catalog, tmp_path / f"d-{name}-{value}", datapath_options={name: value})


def test_scrub_verifies_inline_bytes_and_reports_damage_it_cannot_repair(sqlite_engine):
    from engine.admin.events import recent
    from engine.lifecycle.scrub import scrub

    engine = sqlite_engine
    inos = [write(engine, f"f{i}", [(0, os.urandom(4 * KiB))]) for i in range(3)]
    clean = scrub(engine.data, engine.catalog)
    assert (clean.inline_checked, clean.bad) == (3, 0)
    victim = engine.catalog.read(
        lambda c: c.execute(select(EXTENTS.c.stripe_id).where(EXTENTS.c.ino == inos[1])).scalar()
    )
    engine.catalog.run(
        lambda c: c.execute(
            update(INLINE_DATA)
            .where(INLINE_DATA.c.stripe_id == victim)
            .values(data=b"\0" * 4 * KiB)
        )
    )
    report = scrub(engine.data, engine.catalog)
    assert (report.inline_checked, report.bad, report.unrepairable) == (3, 1, 1)
    assert [p[0] for p in report.problems] == [victim]
    assert any(
        e.severity == "error" and e.details["stripe_id"] == victim
        for e in recent(engine.catalog, 20, kind_prefix="scrub.unrepairable")
    )


def test_the_appliance_config_sets_or_turns_off_inline_stripes(tmp_path):
    import subprocess
    import sys
    import tomllib

    from appliance.config import from_dict
    from appliance.runtime import Appliance

    for value, expected in ((0, None), (8192, 8192)):
        data_dir = tmp_path / f"inline-{value}"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "appliance.cli",
                "init",
                str(data_dir),
                "--drives",
                "10",
                "--drive-size",
                "64MiB",
                "--zone-size",
                "4MiB",
            ],
            check=True,
            capture_output=True,
        )
        path = data_dir / "shingle.toml"
        raw = tomllib.loads(path.read_text())
        raw.setdefault("storage", {})["inline_write_bytes"] = value
        app = Appliance(from_dict(raw, path))
        try:
            inline = app.datapath.inline
            assert (inline.fragment_size if inline is not None else None) == expected
        finally:
            app.close()
