"""Reads by a caller that must not block (the NFS event loop): fragments the page cache holds
are read there and then (preadv2 RWF_NOWAIT), checked against their crc32c; anything else
(not in memory, a bad checksum, a missing drive) is WouldBlock, and the blocking read that
follows reports, decodes and repairs as before. A warm file starts no read-ahead."""

from __future__ import annotations

import os
import shutil
import time

import pytest
from dphelpers import KiB
from page_cache import evict_zone_files
from sqlalchemy import select
from test_datapath import STRIPE, make

from engine.base.blocking import WouldBlock, no_blocking
from engine.catalog.models import Extent, Fragment, Zone
from engine.coding.erasure import FRAGMENT_HEADER
from engine.drives import ZoneFileDrive


@pytest.fixture(params=["native", "python"])
def fragment_io(request, monkeypatch):
    """Runs a test with the compiled fragment reads (engine/native/fragmentio.pyx: buffers not
    zeroed first, the in-memory read) and with the pure-Python fallback."""
    from engine import native
    from engine.datapath import extents, reader
    from engine.drives import zonefile

    if request.param == "native":
        if native.fragmentio is None:
            pytest.fail("engine.native.fragmentio is not built: run `pip install -e .`")
    else:
        monkeypatch.setattr(zonefile, "fragmentio", None)
        monkeypatch.setattr(extents, "empty_bytearray", bytearray)
        monkeypatch.setattr(reader, "empty_bytearray", bytearray)
    return request.param


def evict(engine) -> None:
    evict_zone_files(engine.data.space.drives.values())


def open_all_zones(engine, ino, size) -> None:
    """A blocking read opens the zone files (the loop never opens one itself)."""
    engine.ns.read(ino, 0, size)
    engine.data.reader.drop_cache()


def count_prefetches(engine) -> list:
    calls: list = []
    reader = engine.data.reader
    original = reader.prefetch

    def prefetch(info):
        calls.append(info.id)
        original(info)

    reader.prefetch = prefetch
    return calls


def test_a_warm_file_is_read_without_blocking_and_starts_no_read_ahead(sqlite_engine, fragment_io):
    engine = sqlite_engine
    data = os.urandom(4 * STRIPE)
    ino = make(engine, "warm", data)
    open_all_zones(engine, ino, len(data))
    prefetched = count_prefetches(engine)
    reads = engine.data.reader.stats["fragment_reads"]
    with no_blocking():
        for off in range(0, len(data), STRIPE):
            assert engine.data.read(ino, off, STRIPE, len(data)) == data[off : off + STRIPE]
    assert engine.data.reader.stats["fragment_reads"] - reads == 4 * 8
    assert prefetched == []
    # served from the cache now, still without blocking
    with no_blocking():
        assert engine.data.read(ino, 100, 2 * STRIPE, len(data)) == data[100 : 100 + 2 * STRIPE]


def test_a_file_out_of_memory_hands_off_and_reads_ahead_again(sqlite_engine):
    engine = sqlite_engine
    data = os.urandom(6 * STRIPE)
    ino = make(engine, "cold", data)
    open_all_zones(engine, ino, len(data))
    evict(engine)
    prefetched = count_prefetches(engine)
    with no_blocking(), pytest.raises(WouldBlock, match="fragment read"):
        engine.data.read(ino, 0, STRIPE, len(data))
    # as the loop would: the worker reads it, then the next READs come in order
    assert engine.data.read(ino, 0, STRIPE, len(data)) == data[:STRIPE]
    evict(engine)  # what the kernel read ahead meanwhile
    assert engine.data.read(ino, STRIPE, STRIPE, len(data)) == data[STRIPE : 2 * STRIPE]
    assert prefetched, "a sequential reader of a file out of memory gets read-ahead"


def test_ranges_read_in_memory_match_every_offset(sqlite_engine, fragment_io):
    engine = sqlite_engine
    data = os.urandom(2 * STRIPE + 12345)
    ino = make(engine, "ranges", data)
    open_all_zones(engine, ino, len(data))
    # the 12,345-byte tail is an inline stripe: a catalog read, which the loop leaves to a worker
    with no_blocking(), pytest.raises(WouldBlock):
        engine.data.read(ino, 2 * STRIPE, 100, len(data))
    assert engine.data.read(ino, 2 * STRIPE, 100, len(data)) == data[2 * STRIPE : 2 * STRIPE + 100]
    with no_blocking():
        for off, n in ((0, 1), (STRIPE - 100, 300), (64 * KiB - 1, 64 * KiB + 2), (0, len(data))):
            assert engine.data.read(ino, off, n, len(data)) == data[off : off + n]


def flip_a_byte(engine, ino: int, idx: int, at: int = 200) -> None:
    """At byte ``at`` of data fragment ``idx`` of the file's last stripe."""
    extents, fragments, zones = Extent.__table__, Fragment.__table__, Zone.__table__
    frag = engine.catalog.read(
        lambda c: c.execute(
            select(fragments.c.drive_id, zones.c.idx, fragments.c.zone_offset)
            .join(zones, zones.c.id == fragments.c.zone_id)
            .join(extents, extents.c.stripe_id == fragments.c.stripe_id)
            .where(extents.c.ino == ino, fragments.c.idx == idx)
            .order_by(extents.c.file_offset.desc())
            .limit(1)
        ).first()
    )
    path = os.path.join(engine.data.space.drives[frag.drive_id].path, f"zone-{frag.idx:06d}")
    with open(path, "r+b") as f:
        f.seek(frag.zone_offset + at)
        byte = f.read(1)
        f.seek(frag.zone_offset + at)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_a_bad_checksum_in_memory_is_never_served_and_the_blocking_read_repairs(
    sqlite_engine, fragment_io
):
    engine = sqlite_engine
    other = os.urandom(STRIPE)
    other_ino = make(engine, "other", other)  # its fragments share the zone files with "bad"
    data = os.urandom(STRIPE)
    ino = make(engine, "bad", data)
    flip_a_byte(engine, ino, 2)  # the flipped byte is in the page cache: a read finds it there
    engine.restart()
    assert engine.ns.read(other_ino, 0, STRIPE) == other  # a worker opens the zone files
    engine.data.extents.extent_map(ino)  # and loads the map
    with no_blocking(), pytest.raises(WouldBlock):
        engine.data.read(ino, 0, STRIPE, len(data))
    assert engine.data.reader.stats["checksum_errors"] == 0  # counted by the read that decodes
    assert engine.data.read(ino, 0, STRIPE, len(data)) == data
    assert engine.data.reader.stats["checksum_errors"] == 1
    assert engine.data.wait_repairs() == [True]
    engine.data.reader.drop_cache()
    assert engine.data.read(ino, 0, STRIPE, len(data)) == data  # in memory, the map reloaded
    assert engine.data.reader.stats["checksum_errors"] == 1
    engine.data.reader.drop_cache()
    with no_blocking():  # the repaired fragment reads in memory on the loop again
        assert engine.data.read(ino, 0, STRIPE, len(data)) == data


def test_a_bad_checksum_read_into_a_streaming_readers_reply_is_never_served(
    sqlite_engine, fragment_io
):
    engine = sqlite_engine
    data = os.urandom(2 * STRIPE)
    ino = make(engine, "stream", data)
    flip_a_byte(engine, ino, 2)  # of the second stripe
    engine.restart()
    assert engine.data.read(ino, 0, STRIPE, len(data)) == data[:STRIPE]  # opens the zone files
    with no_blocking(), pytest.raises(WouldBlock):  # the next READ streams on: into the reply
        engine.data.read(ino, STRIPE, STRIPE, len(data))
    assert engine.data.reader.stats["checksum_errors"] == 0
    assert engine.data.read(ino, STRIPE, STRIPE, len(data)) == data[STRIPE:]
    assert engine.data.reader.stats["checksum_errors"] == 1
    assert engine.data.wait_repairs() == [True]


PAYLOAD = STRIPE // 8  # of a data fragment
PAIR_TAIL = 4 * KiB  # nfs-rs reads each MiB as READs of 1,020 KiB and 4 KiB


def cache_entries(engine, kind: str) -> list:
    return [e for e in engine.data.reader.cache.values() if type(e).__name__ == kind]


def cached_bytes_add_up(engine) -> bool:
    reader = engine.data.reader
    return reader.cached_bytes == sum(e.nbytes for e in reader.cache.values())


def stream_into_the_second_stripe(engine, ino: int, data) -> bool:
    """A streaming reader's READ (after one of the first stripe) of the second stripe but its last
    4 KiB, on the loop: whether it returns the right bytes."""
    with no_blocking():
        got = engine.data.read(ino, STRIPE, STRIPE - PAIR_TAIL, len(data))
    return got == data[STRIPE:-PAIR_TAIL]


def test_a_streaming_reader_takes_the_rest_of_its_last_fragment_from_the_tail_it_left(
    sqlite_engine, fragment_io
):
    engine = sqlite_engine
    data = os.urandom(4 * STRIPE)
    ino = make(engine, "pairs", data)
    open_all_zones(engine, ino, len(data))
    assert engine.data.read(ino, 0, STRIPE, len(data)) == data[:STRIPE]  # streaming from here on
    engine.data.reader.drop_cache()
    stats = engine.data.reader.stats
    for off in range(STRIPE, len(data), STRIPE):
        reads = stats["fragment_reads"]
        with no_blocking():
            head = engine.data.read(ino, off, STRIPE - PAIR_TAIL, len(data))
            tail = engine.data.read(ino, off + STRIPE - PAIR_TAIL, PAIR_TAIL, len(data))
        assert head + tail == data[off : off + STRIPE]
        assert stats["fragment_reads"] - reads == 8  # the 4 KiB came from the tail, not a drive
    tails = cache_entries(engine, "TailFragment")
    assert len(tails) == 3 and all(t.nbytes == PAIR_TAIL for t in tails)
    assert cache_entries(engine, "ReadyFragment") == []  # the rest went into the replies only
    assert cached_bytes_add_up(engine)


def test_a_tail_serves_no_bytes_before_it_and_a_whole_fragment_replaces_it(
    sqlite_engine, fragment_io
):
    engine = sqlite_engine
    data = os.urandom(2 * STRIPE)
    ino = make(engine, "tails", data)
    open_all_zones(engine, ino, len(data))
    assert engine.data.read(ino, 0, STRIPE, len(data)) == data[:STRIPE]
    last = STRIPE + 7 * PAYLOAD  # the second stripe's last data fragment
    assert stream_into_the_second_stripe(engine, ino, data)  # fragment 7's last 4 KiB: a tail
    assert len(cache_entries(engine, "TailFragment")) == 1
    with no_blocking():
        # a reader that ends where fragment 7 starts streams on into all of it: read again
        six = STRIPE + 6 * PAYLOAD
        assert engine.data.read(ino, six, PAYLOAD, len(data)) == data[six:last]
        assert engine.data.read(ino, last, PAYLOAD, len(data)) == data[last:]
        # another reader (not streaming) reads the whole fragment and caches it over the tail
        assert engine.data.read(ino, last + 10, 100, len(data)) == data[last + 10 : last + 110]
    assert len(cache_entries(engine, "TailFragment")) == 0
    assert cached_bytes_add_up(engine)
    engine.data.reader.drop_cache()
    assert engine.data.read(ino, 0, STRIPE, len(data)) == data[:STRIPE]
    assert stream_into_the_second_stripe(engine, ino, data)
    # the blocking path (a worker) takes a tail for a miss as well
    assert len(cache_entries(engine, "TailFragment")) == 1
    assert engine.data.read(ino, last, PAYLOAD, len(data)) == data[last:]
    assert len(cache_entries(engine, "TailFragment")) == 0
    assert cached_bytes_add_up(engine)


def test_a_bad_checksum_in_the_part_a_streaming_read_leaves_is_never_served(
    sqlite_engine, fragment_io
):
    engine = sqlite_engine
    data = os.urandom(2 * STRIPE)
    ino = make(engine, "badtail", data)
    flip_a_byte(engine, ino, 7, at=FRAGMENT_HEADER + PAYLOAD - 100)  # in the 4 KiB left over
    engine.restart()
    assert engine.data.read(ino, 0, STRIPE, len(data)) == data[:STRIPE]  # opens the zone files
    with no_blocking(), pytest.raises(WouldBlock):
        engine.data.read(ino, STRIPE, STRIPE - PAIR_TAIL, len(data))
    assert cache_entries(engine, "TailFragment") == []
    assert engine.data.read(ino, STRIPE, STRIPE - PAIR_TAIL, len(data)) == data[STRIPE:-PAIR_TAIL]
    assert engine.data.reader.stats["checksum_errors"] == 1
    assert engine.data.wait_repairs() == [True]


def test_a_write_over_a_cached_tail_is_seen_by_the_next_read(sqlite_engine, fragment_io):
    engine = sqlite_engine
    data = bytearray(os.urandom(2 * STRIPE))
    ino = make(engine, "overwrite", bytes(data))
    open_all_zones(engine, ino, len(data))
    assert engine.data.read(ino, 0, STRIPE, len(data)) == data[:STRIPE]
    assert stream_into_the_second_stripe(engine, ino, data)
    assert len(cache_entries(engine, "TailFragment")) == 1
    new = os.urandom(PAIR_TAIL)
    engine.ns.write(ino, len(data) - PAIR_TAIL, new)
    data[-PAIR_TAIL:] = new
    # not yet committed: a pending write, which the loop leaves to a worker
    with no_blocking(), pytest.raises(WouldBlock):
        engine.data.read(ino, len(data) - PAIR_TAIL, PAIR_TAIL, len(data))
    assert engine.data.read(ino, len(data) - PAIR_TAIL, PAIR_TAIL, len(data)) == new
    engine.ns.commit(ino)
    assert engine.ns.read(ino, 0, len(data)) == data


def test_a_missing_drive_in_memory_hands_off_and_decodes(sqlite_engine):
    engine = sqlite_engine
    data = os.urandom(3 * STRIPE)
    ino = make(engine, "gone", data)
    open_all_zones(engine, ino, len(data))
    for drive_id in engine.drive_ids[:2]:
        shutil.rmtree(engine.data.space.drives[drive_id].path)
    gone = [engine.data.space.drives[d] for d in engine.drive_ids[:2]]

    def seen_gone() -> bool:  # as the event loop sees them: the drive watch's last look
        with no_blocking():
            return not any(d.present() for d in gone)

    deadline = time.monotonic() + 10
    while not seen_gone() and time.monotonic() < deadline:
        time.sleep(0.05)
    with no_blocking(), pytest.raises(WouldBlock):
        engine.data.read(ino, 0, len(data), len(data))
    assert engine.data.read(ino, 0, len(data), len(data)) == data
    assert engine.data.reader.stats["degraded_stripes"] > 0


def test_holes_read_as_zeros_from_buffers_that_are_not_zeroed(sqlite_engine, fragment_io):
    engine = sqlite_engine
    ns = engine.ns
    head, tail = os.urandom(STRIPE), os.urandom(STRIPE)
    ino = make(engine, "holes", head)
    ns.write(ino, 3 * STRIPE, tail)  # a hole of two stripes between them
    ns.commit(ino)
    size = 4 * STRIPE
    expect = head + bytes(2 * STRIPE) + tail
    for _ in range(3):
        junk = b"\xff" * (size + 100)  # freed, it is what the next buffer is likely made of
        del junk
        assert engine.data.read(ino, 0, size + 100, size + 100) == expect + bytes(100)
        engine.data.reader.drop_cache()
    open_all_zones(engine, ino, size)
    with no_blocking():
        assert (
            engine.data.read(ino, STRIPE - 10, 2 * STRIPE + 20, size)
            == (expect[STRIPE - 10 : 3 * STRIPE + 10])
        )


def test_read_cached_refuses_what_is_not_in_memory(tmp_path, fragment_io):
    drive = ZoneFileDrive.format(tmp_path / "d", 1 << 20, 2, "u")
    data = os.urandom(256 * KiB)
    drive.append(0, 0, data, durable=True)
    assert drive.read(0, 0, 1)  # a blocking read opens the zone file
    assert drive.read_cached(0, 64 * KiB, 64 * KiB) == data[64 * KiB : 128 * KiB]
    assert drive.read_cached(0, 240 * KiB, 64 * KiB) is None  # past the write pointer
    assert drive.read_cached(1, 0, 1) is None  # a zone file not open
    with open(tmp_path / "d" / "zone-000000", "rb") as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    assert drive.read_cached(0, 128 * KiB, 64 * KiB) is None
    drive.read_into(0, 0, [bytearray(256 * KiB)])  # in memory again
    head, out = bytearray(16), bytearray(b"\xee" * (128 * KiB))
    view = memoryview(out)
    assert drive.read_cached_into(0, 16 * KiB, [head, view[KiB : KiB + 64 * KiB]])
    assert head == data[16 * KiB : 16 * KiB + 16]
    assert out[KiB : KiB + 64 * KiB] == data[16 * KiB + 16 : 80 * KiB + 16]
    assert out[:KiB] == b"\xee" * KiB and out[65 * KiB :] == b"\xee" * (63 * KiB)
    assert not drive.read_cached_into(0, 200 * KiB, [view[: 64 * KiB]])  # past the pointer
    with open(tmp_path / "d" / "zone-000000", "rb") as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    assert not drive.read_cached_into(0, 0, [view[: 64 * KiB]])
