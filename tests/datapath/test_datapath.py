"""The data path through the namespace, on SQLite and PostgreSQL catalogs."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import threading
import time

import pytest
from dphelpers import Engine, KiB, MiB, check_accounting
from sqlalchemy import event, func, select, update

from engine.base import errors
from engine.catalog.models import Drive, Fragment, Inode, Stripe, Zone
from engine.datapath import DataPath
from engine.drives import ZoneFileDrive
from engine.namespace import ROOT

STRIPE = 8 * 64 * KiB


def make(engine, name, data, chunk=100 * KiB):
    ns = engine.ns
    ino = ns.create(ROOT, ns.root_ino, name).ino
    for off in range(0, len(data), chunk):
        ns.write(ino, off, data[off : off + chunk])
    ns.commit(ino)
    return ino


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def test_write_flush_read_round_trip(engine):
    data = os.urandom(3 * STRIPE + 12345)
    ino = make(engine, "f", data)
    ns = engine.ns
    assert ns.getattr(ino).size == len(data)
    assert ns.read(ino, 0, len(data)) == data
    assert ns.read(ino, STRIPE - 100, 300) == data[STRIPE - 100 : STRIPE + 200]
    # past EOF: short, then empty
    assert ns.read(ino, len(data) - 10, 100) == data[-10:]
    assert ns.read(ino, len(data) + 5, 100) == b""
    engine.restart()
    assert sha(engine.ns.read(ino, 0, len(data))) == sha(data)
    check_accounting(engine.catalog)


def test_buffered_writes_are_visible_before_flush_and_size_counts_them(engine):
    ns = engine.ns
    ino = ns.create(ROOT, ns.root_ino, "p").ino
    ns.write(ino, 0, b"a" * 1000)
    ns.write(ino, 4000, b"b" * 10)
    assert ns.getattr(ino).size == 4010
    got = ns.read(ino, 0, 5000)
    assert got == b"a" * 1000 + bytes(3000) + b"b" * 10
    committed = engine.catalog.read(
        lambda c: c.execute(
            select(Inode.__table__.c.size).where(Inode.__table__.c.ino == ino)
        ).scalar()
    )
    assert committed == 0  # nothing reached the catalog before the flush
    ns.commit(ino)
    assert engine.data.pending_size(ino) is None
    assert ns.read(ino, 0, 5000) == got


def test_attributes_with_buffered_writes_are_merged_once_per_write(sqlite_engine):
    """A WRITE asks for its file's attributes three times: the merge with the buffered writes
    is made once and served again while neither the cached attributes nor the buffered ones
    moved; the next write shows at once."""
    ns = sqlite_engine.ns
    ino = ns.create(ROOT, ns.root_ino, "m").ino
    ns.write(ino, 0, b"a" * 1000)
    first = ns.getattr(ino)
    assert first.size == 1000
    assert ns.getattr(ino) is first
    ns.write(ino, 1000, b"b")
    moved = ns.getattr(ino)
    assert moved.size == 1001 and moved.change > first.change
    assert ns.getattr(ino) is moved
    ns.commit(ino)
    committed = ns.getattr(ino)
    assert (committed.size, committed.change) == (1001, moved.change)


def test_flush_sets_size_mtime_change_in_the_same_transaction(engine):
    ns = engine.ns
    ino = ns.create(ROOT, ns.root_ino, "t").ino
    before = ns.getattr(ino)
    ns.write(ino, 0, b"x" * 5000)
    statements = []

    @event.listens_for(engine.catalog.engine, "commit")
    def on_commit(conn):
        statements.append("commit")

    ns.commit(ino)
    event.remove(engine.catalog.engine, "commit", on_commit)
    after = ns.getattr(ino)
    assert after.size == 5000 and after.mtime_ns > before.mtime_ns and after.change > before.change
    assert statements == ["commit"], "one flush must be one catalog transaction"


def test_overwrite_holes_truncate_and_garbage(engine):
    ns = engine.ns
    data = bytearray(os.urandom(2 * STRIPE))
    ino = make(engine, "o", bytes(data))
    ns.write(ino, 1000, b"Z" * 5000)
    data[1000:6000] = b"Z" * 5000
    ns.write(ino, 3 * STRIPE, b"tail")  # leaves a hole
    ns.commit(ino)
    expect = bytes(data) + bytes(STRIPE) + b"tail"
    assert ns.read(ino, 0, len(expect) + 10) == expect
    garbage = engine.catalog.read(
        lambda c: c.execute(select(func.sum(Zone.__table__.c.garbage_bytes))).scalar()
    )
    assert garbage > 0  # the overwritten bytes are garbage now
    check_accounting(engine.catalog)
    ns.setattr(ROOT, ino, size=1500)
    assert ns.read(ino, 0, 10_000) == expect[:1500]
    ns.setattr(ROOT, ino, size=4000)  # growing again reads zeros, not old bytes
    assert ns.read(ino, 0, 10_000) == expect[:1500] + bytes(2500)
    check_accounting(engine.catalog)
    engine.restart()
    assert engine.ns.read(ino, 0, 10_000) == expect[:1500] + bytes(2500)


def test_unlink_turns_data_into_garbage_and_drops_dead_stripes(engine):
    ns = engine.ns
    make(engine, "gone", os.urandom(STRIPE * 2))
    ns.unlink(ROOT, ns.root_ino, "gone")
    counts = engine.catalog.read(
        lambda c: (
            c.execute(select(func.count()).select_from(Stripe.__table__)).scalar(),
            c.execute(select(func.sum(Zone.__table__.c.live_bytes))).scalar(),
        )
    )
    assert counts == (0, 0)
    check_accounting(engine.catalog)


def test_invariant1_zone_refuses_writes_off_the_write_pointer(tmp_path):
    drive = ZoneFileDrive.format(tmp_path / "d", 64 * KiB, 4, "u-1")
    drive.append(0, 0, b"a" * 100)
    with pytest.raises(errors.FsError, match="write pointer 100"):
        drive.append(0, 50, b"b")  # in place
    with pytest.raises(errors.FsError, match="write pointer 100"):
        drive.append(0, 200, b"b")  # leaving a gap
    with pytest.raises(errors.FsError, match="capacity"):
        drive.append(0, 100, b"c" * 64 * KiB)
    with pytest.raises(errors.FsError, match="passes its write pointer"):
        drive.read(0, 50, 100)
    drive.finish_zone(0)
    with pytest.raises(errors.FsError, match="full"):
        drive.append(0, 100, b"d")
    drive.reset(0)
    drive.append(0, 0, b"new")
    assert drive.read(0, 0, 3) == b"new"
    assert os.path.getsize(tmp_path / "d" / "zone-000000") == 3  # the length is the write pointer
    assert os.stat(tmp_path / "d" / "zone-000001").st_blocks * 512 >= 64 * KiB  # preallocated
    drive.close()


def test_invariant2_fragments_are_durable_before_the_commit_that_references_them(
    sqlite_catalog, tmp_path, monkeypatch
):
    # the Python writers: their system calls can be watched from here; the compiled writers
    # make the same calls in C (test_native_writers.py checks their order with strace)
    from engine.datapath import writers

    monkeypatch.setattr(writers, "driveio", None)
    engine = Engine(sqlite_catalog, tmp_path / "drives")
    request_close = engine.close
    durable: dict[tuple[str, int], int] = {}  # zone -> bytes made durable by an fsync
    durable_appends: set[tuple[str, int, int, int]] = (
        set()
    )  # (zone, offset, length) written durably
    violations = []
    real_sync, real_append = ZoneFileDrive.sync, ZoneFileDrive.append

    def sync(self, idx):
        length = self.write_pointer(idx)  # appended before this fsync began: covered by it
        real_sync(self, idx)
        durable[(str(self.folder), idx)] = max(durable.get((str(self.folder), idx), 0), length)

    synced_calls = threading.local()
    real_pwritev, real_fdatasync = os.pwritev, os.fdatasync

    def pwritev(fd, buffers, offset, flags=0):
        if flags & getattr(os, "RWF_DSYNC", 0):
            synced_calls.n = getattr(synced_calls, "n", 0) + 1
        return real_pwritev(fd, buffers, offset, flags)

    def fdatasync(fd):
        synced_calls.n = getattr(synced_calls, "n", 0) + 1
        return real_fdatasync(fd)

    def append(self, idx, offset, data, durable=False):
        synced_calls.n = 0
        real_append(self, idx, offset, data, durable=durable)
        if durable and synced_calls.n:  # covers its own bytes only, not what was appended before it
            durable_appends.add((str(self.folder), idx, offset, len(data)))

    monkeypatch.setattr(os, "pwritev", pwritev)
    monkeypatch.setattr(os, "fdatasync", fdatasync)
    monkeypatch.setattr(ZoneFileDrive, "sync", sync)
    monkeypatch.setattr(ZoneFileDrive, "append", append)
    fragments, zones, drives = Fragment.__table__, Zone.__table__, Drive.__table__
    watermark = [0]

    def before_commit(conn):
        # every fragment this transaction inserts must lie in bytes an fsync already covered
        rows = conn.execute(
            select(
                fragments.c.id,
                drives.c.path,
                zones.c.idx,
                fragments.c.zone_offset,
                fragments.c.length,
            )
            .select_from(
                fragments.join(zones, fragments.c.zone_id == zones.c.id).join(
                    drives, fragments.c.drive_id == drives.c.id
                )
            )
            .where(fragments.c.id > watermark[0])
        ).all()
        for row in rows:
            synced = row.zone_offset + row.length <= durable.get((row.path, row.idx), 0)
            if (
                not synced
                and (row.path, row.idx, row.zone_offset, row.length) not in durable_appends
            ):
                violations.append((row.path, row.idx, row.zone_offset))
            watermark[0] = max(watermark[0], row.id)

    event.listen(engine.catalog.engine, "commit", before_commit)
    try:
        for i in range(4):
            make(engine, f"d{i}", os.urandom(STRIPE + 777 * i))
    finally:
        event.remove(engine.catalog.engine, "commit", before_commit)
    request_close()
    assert watermark[0] > 0
    assert durable_appends, "a lone flush writes its fragments durably in one call"
    assert not violations, f"fragments committed before an fsync covered them: {violations[:3]}"


@pytest.mark.parametrize("how", ["failed_state", "folder_removed"])
def test_invariant4_two_of_ten_drives_lost_every_file_reads_back(sqlite_engine, how):
    engine = sqlite_engine
    files = {f"f{i}": os.urandom(STRIPE * (i % 3) + 1000 * i + 1) for i in range(6)}
    inos = {name: make(engine, name, data) for name, data in files.items()}
    lost = engine.drive_ids[3], engine.drive_ids[7]
    if how == "failed_state":
        engine.catalog.run(
            lambda c: c.execute(
                update(Drive.__table__).where(Drive.__table__.c.id.in_(lost)).values(state="failed")
            )
        )
    else:
        for drive_id in lost:
            path = engine.catalog.read(
                lambda c, drive_id=drive_id: c.execute(
                    select(Drive.__table__.c.path).where(Drive.__table__.c.id == drive_id)
                ).scalar()
            )
            shutil.rmtree(path)
    engine.restart()
    for name, data in files.items():
        assert sha(engine.ns.read(inos[name], 0, len(data) + 1)) == sha(data), name
    assert engine.data.reader.stats["degraded_stripes"] > 0
    # a third loss is more than 8+2 can carry: a clear EIO, not wrong bytes
    third = engine.drive_ids[0]
    engine.catalog.run(
        lambda c: c.execute(
            update(Drive.__table__).where(Drive.__table__.c.id == third).values(state="failed")
        )
    )
    engine.restart()
    big = next(n for n, d in files.items() if len(d) > STRIPE)
    with pytest.raises(errors.IOFailure):  # the whole stripe: some data fragment is on a lost drive
        engine.ns.read(inos[big], 0, STRIPE)


def test_drive_folder_vanishing_while_running_does_not_stop_reads(sqlite_engine):
    engine = sqlite_engine
    data = os.urandom(3 * STRIPE)
    ino = make(engine, "live", data)
    engine.data.reader.drop_cache()
    for drive_id in engine.drive_ids[:2]:
        shutil.rmtree(engine.data.space.drives[drive_id].path)
    time.sleep(0.6)  # presence is re-checked twice a second
    assert engine.ns.read(ino, 0, len(data)) == data


def test_invariant5_bad_checksum_is_detected_decoded_around_and_repaired(engine):
    data = os.urandom(2 * STRIPE)
    ino = make(engine, "c", data)
    frag = engine.catalog.read(
        lambda c: c.execute(
            select(
                Fragment.__table__.c.stripe_id,
                Fragment.__table__.c.drive_id,
                Zone.__table__.c.idx,
                Fragment.__table__.c.zone_offset,
            )
            .join(Zone.__table__, Zone.__table__.c.id == Fragment.__table__.c.zone_id)
            .where(Fragment.__table__.c.idx == 1)
            .limit(1)
        ).first()
    )
    path = engine.data.space.drives[frag.drive_id].path
    with open(os.path.join(path, f"zone-{frag.idx:06d}"), "r+b") as f:
        f.seek(frag.zone_offset + 200)
        byte = f.read(1)
        f.seek(frag.zone_offset + 200)
        f.write(bytes([byte[0] ^ 0xFF]))  # one flipped byte in a data fragment
    engine.restart()
    assert engine.ns.read(ino, 0, len(data)) == data
    assert engine.data.reader.stats["checksum_errors"] == 1
    # the read repaired it: a rebuilt copy was appended elsewhere and the catalog points there
    assert engine.data.wait_repairs() == [True]
    moved = engine.catalog.read(
        lambda c: c.execute(
            select(
                Fragment.__table__.c.drive_id,
                Zone.__table__.c.idx,
                Fragment.__table__.c.zone_offset,
            )
            .join(Zone.__table__, Zone.__table__.c.id == Fragment.__table__.c.zone_id)
            .where(Fragment.__table__.c.stripe_id == frag.stripe_id, Fragment.__table__.c.idx == 1)
        ).first()
    )
    assert moved.drive_id == frag.drive_id and (moved.idx, moved.zone_offset) != (
        frag.idx,
        frag.zone_offset,
    )
    check_accounting(engine.catalog)
    engine.restart()
    assert engine.ns.read(ino, 0, len(data)) == data
    assert (
        engine.data.reader.stats["checksum_errors"] == 0
        and engine.data.reader.stats["degraded_stripes"] == 0
    )


def test_enospc_nothing_partial_then_delete_frees_space(catalog, tmp_path):
    eng = Engine(catalog, tmp_path / "small", drive_size=6 * MiB, zone_size=MiB, reserve_zones=1)
    try:
        ns = eng.ns
        total, free = eng.data.capacity()
        assert 0 < free <= total
        written = []
        with pytest.raises(errors.NoSpace):
            for i in range(1000):
                ino = ns.create(ROOT, ns.root_ino, f"fill{i}").ino
                data = os.urandom(STRIPE)
                ns.write(ino, 0, data)
                ns.commit(ino)
                written.append((ino, data))
        assert len(written) >= 3
        failed = ns.lookup(ROOT, ns.root_ino, f"fill{len(written)}").ino
        assert ns.getattr(failed).size == 0 and ns.read(failed, 0, 10) == b""  # nothing partial
        for ino, data in written:
            assert ns.read(ino, 0, len(data)) == data  # nothing silently truncated
        eng.restart()
        ns = eng.ns
        assert ns.getattr(failed).size == 0
        for i in range(len(written)):
            ns.unlink(ROOT, ns.root_ino, f"fill{i}")
        data = os.urandom(STRIPE)
        again = ns.create(ROOT, ns.root_ino, "again").ino
        for _ in range(2):
            ns.write(again, 0, data)
            ns.commit(again)
        assert ns.read(again, 0, STRIPE) == data
        check_accounting(catalog)
    finally:
        eng.close()


def test_recovery_counts_uncommitted_bytes_as_garbage_and_appends_after_them(engine):
    data = os.urandom(STRIPE + 5)
    ino = make(engine, "r", data)
    engine.data.close()
    zone = engine.catalog.read(
        lambda c: c.execute(
            select(Zone.__table__.c.drive_id, Zone.__table__.c.idx, Zone.__table__.c.write_pointer)
            .where(Zone.__table__.c.write_pointer > 0)
            .limit(1)
        ).first()
    )
    path = engine.catalog.read(
        lambda c: c.execute(
            select(Drive.__table__.c.path).where(Drive.__table__.c.id == zone.drive_id)
        ).scalar()
    )
    with open(os.path.join(path, f"zone-{zone.idx:06d}"), "ab") as f:
        f.write(b"torn flush" * 100)  # what a crash between fsync and commit leaves
    engine.start()
    report = engine.data.recovery_report
    assert report.garbage_bytes == 1000 and report.zones_with_garbage == 1
    assert engine.data.recover().garbage_bytes == 0  # accounted once
    more = os.urandom(STRIPE)
    ino2 = make(engine, "r2", more)
    assert engine.ns.read(ino, 0, len(data)) == data
    assert engine.ns.read(ino2, 0, len(more)) == more
    check_accounting(engine.catalog)


def test_bad_construction_arguments(sqlite_catalog):
    catalog = sqlite_catalog
    with pytest.raises(errors.ConfigError, match="reserve_zones"):
        DataPath(catalog, {"warm": None}, reserve_zones=-1)
    with pytest.raises(errors.ConfigError, match="band_classes"):
        DataPath(catalog, {})


def test_fragments_larger_than_zones_are_refused(sqlite_catalog, tmp_path):
    catalog = sqlite_catalog
    with pytest.raises(errors.ConfigError, match="band_classes.warm.fragment_size"):
        Engine(catalog, tmp_path / "d", policies={"warm": {"fragment_size": 2 * MiB}})


def test_backend_with_padded_fragments_reads_and_decodes(sqlite_catalog, tmp_path):
    catalog = sqlite_catalog
    # liberasurecode_rs_vand pads payloads: the reader must locate data by the real fragment length
    small = {"fragment_size": 4096}
    eng = Engine(
        catalog,
        tmp_path / "lib",
        policies={
            "warm": {"backend": "liberasurecode_rs_vand", **small},
            "cold": small,
            "hot": small,
        },
    )
    try:
        data = os.urandom(3 * 8 * 4096 + 4321)
        ino = make(eng, "padded", data, chunk=5000)
        assert eng.ns.read(ino, 0, len(data)) == data
        eng.catalog.run(
            lambda c: c.execute(
                update(Drive.__table__)
                .where(Drive.__table__.c.id.in_(eng.drive_ids[:2]))
                .values(state="failed")
            )
        )
        eng.restart()
        assert eng.ns.read(ino, 0, len(data)) == data
        assert eng.data.reader.stats["degraded_stripes"] > 0
    finally:
        eng.close()


def test_small_flushes_are_replicated_in_the_hot_class(sqlite_catalog, tmp_path):
    # with no room for inline stripes (tests/datapath/test_inline.py), small flushes are replicated
    engine = Engine(
        sqlite_catalog, tmp_path / "drives", datapath_options={"inline_budget_bytes": 0}
    )
    try:
        small = os.urandom(3000)
        ino_small = make(engine, "small", small)
        big = os.urandom(STRIPE + 100 * KiB)
        ino_big = make(engine, "big", big, chunk=STRIPE + 100 * KiB)
        stripes = engine.catalog.read(
            lambda c: c.execute(
                select(
                    Stripe.__table__.c.layout,
                    Stripe.__table__.c.k,
                    Stripe.__table__.c.m,
                    Stripe.__table__.c.data_length,
                ).order_by(Stripe.__table__.c.id)
            ).all()
        )
        assert stripes[0] == ("replica", 1, 2, 3000)  # 3 KiB cannot fill a stripe: 3 copies
        assert ("ec", 8, 2, STRIPE) in stripes and (
            "ec",
            8,
            2,
            100 * KiB,
        ) in stripes  # >= one fragment: EC
        check_accounting(engine.catalog)
        engine.catalog.run(
            lambda c: c.execute(
                update(Drive.__table__)
                .where(Drive.__table__.c.id.in_(engine.drive_ids[:2]))
                .values(state="failed")
            )
        )
        engine.restart()
        assert engine.ns.read(ino_small, 0, 5000) == small
        assert engine.ns.read(ino_big, 0, len(big)) == big
    finally:
        engine.close()


def test_replica_stripes_read_back_with_two_drives_lost(sqlite_engine):
    engine = sqlite_engine
    ns = engine.ns
    ino = ns.create(ROOT, ns.root_ino, "h").ino
    engine.catalog.run(
        lambda c: c.execute(
            update(Inode.__table__).where(Inode.__table__.c.ino == ino).values(band_class="hot")
        )
    )
    engine.restart()
    data = os.urandom(2 * MiB + 5)
    engine.ns.write(ino, 0, data)
    engine.ns.commit(ino)
    engine.catalog.run(
        lambda c: c.execute(
            update(Drive.__table__)
            .where(Drive.__table__.c.id.in_(engine.drive_ids[4:6]))
            .values(state="failed")
        )
    )
    engine.restart()
    assert engine.ns.read(ino, 0, len(data)) == data


def test_block_padded_appends_keep_the_write_pointer_and_accounting_right(sqlite_catalog, tmp_path):
    # a host-managed disk pads every append to 4 KiB: fragments must be placed on that grid
    eng = Engine(sqlite_catalog, tmp_path / "blk", write_granularity=4096)
    try:
        files = {}
        for i in range(3):
            data = os.urandom(STRIPE // 3 + 1001 * i)
            files[make(eng, f"b{i}", data, chunk=7000)] = data
        offsets = eng.catalog.read(
            lambda c: c.execute(select(Fragment.__table__.c.zone_offset)).scalars().all()
        )
        assert offsets and all(off % 4096 == 0 for off in offsets)
        check_accounting(eng.catalog)
        eng.restart()
        assert eng.data.recovery_report.short_zones == []
        for ino, data in files.items():
            assert eng.ns.read(ino, 0, len(data)) == data
    finally:
        eng.close()


def test_statfs_reports_raw_times_k_over_k_plus_m_less_the_cleaning_reserve(sqlite_engine):
    engine = sqlite_engine
    total, free = engine.data.capacity()
    assert total == int(10 * (16 - 2) * MiB * 8 / 10)  # 10 drives of 16 zones, 2 kept for cleaning
    assert free <= total
    make(engine, "x", os.urandom(4 * STRIPE))
    stat = engine.ns.statfs()
    assert stat.total_bytes == total and free - stat.free_bytes >= 4 * STRIPE


def test_writes_continue_degraded_when_a_drive_has_failed(engine):
    failed = engine.drive_ids[5]
    engine.catalog.run(
        lambda c: c.execute(
            update(Drive.__table__).where(Drive.__table__.c.id == failed).values(state="failed")
        )
    )
    engine.restart()
    data = os.urandom(2 * STRIPE + 100 * KiB)  # three erasure-coded stripes
    ino = make(engine, "during-failure", data)
    per_stripe = engine.catalog.read(
        lambda c: c.execute(
            select(
                Fragment.__table__.c.stripe_id, func.count(), func.max(Fragment.__table__.c.idx)
            ).group_by(Fragment.__table__.c.stripe_id)
        ).all()
    )
    # 9 drives left: data fragments plus one parity (the codec's write
    # quorum), rebuild adds the rest
    assert per_stripe and all(count == 9 and top == 8 for _sid, count, top in per_stripe)
    assert all(
        drive != failed
        for drive in engine.catalog.read(
            lambda c: c.execute(select(Fragment.__table__.c.drive_id)).scalars().all()
        )
    )
    assert engine.ns.read(ino, 0, len(data)) == data
    check_accounting(engine.catalog)
    # one more drive lost: 8 fragments remain, exactly k, and every byte still reads back
    engine.catalog.run(
        lambda c: c.execute(
            update(Drive.__table__)
            .where(Drive.__table__.c.id == engine.drive_ids[0])
            .values(state="failed")
        )
    )
    engine.restart()
    assert engine.ns.read(ino, 0, len(data)) == data
    # below the write quorum an erasure-coded stripe is refused, nothing half-written: an I/O
    # error naming the drives, not ENOSPC (freeing space would not help)
    with pytest.raises(errors.NoRedundancy, match="at least 9") as refused:
        make(engine, "refused", os.urandom(STRIPE))
    assert not isinstance(refused.value, errors.NoSpace) and refused.value.errno == errno.EIO


def test_times_set_while_writes_are_buffered_keep_their_size(sqlite_engine):
    """smbd sets a file's write time at every close, after its writes and before the flush: the
    attributes that setattr answers (FUSE and NFS clients adopt them) carry the buffered size."""
    ns = sqlite_engine.ns
    ino = ns.create(ROOT, ns.root_ino, "t").ino
    ns.write(ino, 0, b"x" * 1024)
    assert ns.setattr(ROOT, ino, atime_ns=1_000_000_000, mtime_ns=2_000_000_000).size == 1024
    ns.setattr(ROOT, ino, mode=0o600)
    assert ns.setattr(ROOT, ino, mode=0o640).size == 1024
    ns.commit(ino)
    assert ns.getattr(ino).size == 1024 and ns.read(ino, 0, 4096) == b"x" * 1024


OLD_MTIME_NS = 946_684_800_123_456_789  # 2000-01-01, what cp -p / rsync -t / tar x set


def _committed_times(engine, ino) -> tuple[int, int]:
    row = engine.catalog.read(
        lambda c: c.execute(
            select(Inode.__table__.c.mtime_ns, Inode.__table__.c.ctime_ns).where(
                Inode.__table__.c.ino == ino
            )
        ).one()
    )
    return row[0], row[1]


def test_mtime_set_after_buffered_writes_survives_their_commit(engine):
    """cp -p, rsync -t and tar x write, set the times, then close (COMMIT): the commit of the
    writes buffered before the setattr keeps the time set, in the committed row too."""
    ns = engine.ns
    ino = ns.create(ROOT, ns.root_ino, "copied").ino
    data = os.urandom(STRIPE + 5000)  # a full stripe in flight and a partial one buffered
    ns.write(ino, 0, data)
    ns.write(ino, len(data), b"tail")
    before_set = time.time_ns()
    ns.setattr(ROOT, ino, atime_ns=OLD_MTIME_NS, mtime_ns=OLD_MTIME_NS)
    assert ns.getattr(ino).mtime_ns == OLD_MTIME_NS  # while still buffered
    ns.commit(ino)
    after = ns.getattr(ino)
    assert after.mtime_ns == OLD_MTIME_NS and after.size == len(data) + 4
    assert after.ctime_ns >= before_set  # ctime moves on every change
    assert _committed_times(engine, ino)[0] == OLD_MTIME_NS
    engine.restart()
    assert engine.ns.getattr(ino).mtime_ns == OLD_MTIME_NS
    assert engine.ns.read(ino, 0, len(data) + 4) == data + b"tail"
    # a write after the setattr moves the mtime again, to that write's time
    written = time.time_ns()
    engine.ns.write(ino, 0, b"new")
    engine.ns.commit(ino)
    assert engine.ns.getattr(ino).mtime_ns >= written


def test_commit_records_the_time_of_the_last_write_not_its_own(engine):
    ns = engine.ns
    ino = ns.create(ROOT, ns.root_ino, "w").ino
    first = time.time_ns()
    ns.write(ino, 0, b"x" * 5000)
    ns.write(ino, 5000, b"y" * 5000)
    last = time.time_ns()
    time.sleep(0.05)  # the commit comes later than the write
    committing = time.time_ns()
    ns.commit(ino)
    mtime, ctime = _committed_times(engine, ino)
    assert first <= mtime <= last, (first, mtime, last)
    assert ctime >= committing  # the commit is a change
    assert ns.getattr(ino).mtime_ns == mtime
