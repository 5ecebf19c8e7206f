"""zstd on cold stripes end to end: tiering compresses, reads decompress, and scrub, rebuild,
cleaning and fsck keep working on compressed stripes (emulated zoned drives)."""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import asdict

import pytest
from sqlalchemy import select, update

from engine.admin.fsck import check
from engine.base import errors
from engine.base.blocking import WouldBlock, no_blocking
from engine.catalog.models import Extent, Stripe
from engine.coding import compression
from engine.coding.erasure import load_policies
from engine.lifecycle import drives as drive_states
from engine.lifecycle.cleaning import Cleaner
from engine.lifecycle.rebuild import rebuild
from engine.lifecycle.scrub import Scrubber
from engine.lifecycle.tiering import Tiering, TieringPolicy, TieringReport
from engine.namespace import ROOT

from .conftest import SMALL, KiB, check_accounting, flip_bits, sha
from .test_tiering import pin

ZSTD_COLD = {**SMALL, "cold": {**SMALL["cold"], "compression": "zstd", "compression_level": 3}}
TO_COLD = TieringPolicy(hot_to_warm_after_s=0, warm_to_cold_after_s=0)
STRIPES, EXTENTS = Stripe.__table__, Extent.__table__


def noise(n: int, seed: int) -> bytes:
    """Bytes zstd cannot shrink (conftest's random_bytes repeats each hash 8 times)."""
    return random.Random(seed).randbytes(n)


def text_bytes(n: int, seed: int) -> bytes:
    """JSON lines as a training run logs them: compresses well."""
    lines, i = [], 0
    while sum(len(line) for line in lines) < n:
        lines.append(
            json.dumps({"run": seed, "step": i, "loss": round(3.0 / (1 + i * 0.01), 5), "lr": 3e-4})
            + "\n"
        )
        i += 1
    return "".join(lines).encode()[:n]


def metrics_bytes(n: int, seed: int) -> bytes:
    """JSON lines of measured values (full-precision floats): compresses 2-3 times."""
    rng, lines, size = random.Random(seed), [], 0
    while size < n:
        lines.append(json.dumps({"step": len(lines), "grad_norm": rng.random(), "ok": True}) + "\n")
        size += len(lines[-1])
    return "".join(lines).encode()[:n]


@pytest.fixture
def zrig(rig_factory):
    return rig_factory(policies=ZSTD_COLD)


def stripes_of(rig, path):
    ino = rig.ns.resolve(path).ino
    return rig.catalog.read(
        lambda c: c.execute(
            select(
                STRIPES.c.id,
                STRIPES.c.band_class,
                STRIPES.c.data_length,
                STRIPES.c.fragment_length,
                STRIPES.c.compression,
                STRIPES.c.stored_length,
            )
            .where(STRIPES.c.id.in_(select(EXTENTS.c.stripe_id).where(EXTENTS.c.ino == ino)))
            .order_by(STRIPES.c.id)
        ).all()
    )


def to_cold(rig) -> TieringReport:
    """Tiering rounds until nothing moves (a file's hot tail goes hot -> warm first); their
    reports summed."""
    total = TieringReport()
    tiering = Tiering(rig.ns, rig.data, rig.catalog, TO_COLD)
    for _round in range(3):
        report = tiering.run()
        if not report.files_moved:
            break
        for name, value in asdict(report).items():
            if name == "moves":
                for key, n in value.items():
                    total.moves[key] = total.moves.get(key, 0) + n
            elif name != "elapsed_s":
                setattr(total, name, getattr(total, name) + value)
    assert total.moves.get("warm->cold"), total
    return total


def test_tiering_to_cold_compresses_each_stripe_and_reads_back_every_byte(zrig):
    text = text_bytes(300 * KiB, 1)
    tokens = noise(200 * KiB, 2)  # token shards: random-ish, nothing to gain
    mixed = text_bytes(128 * KiB, 3) + noise(128 * KiB, 4)  # one file, both kinds
    files = {"/logs/run.jsonl": text, "/tok/shard-0": tokens, "/mix/both": mixed}
    for path, data in files.items():
        zrig.write_file(path, data)
    report = to_cold(zrig)
    assert report.moves["warm->cold"] == 3
    stripe_size = zrig.data.policies["cold"].stripe_size
    text_stripes = stripes_of(zrig, "/logs/run.jsonl")
    assert len(text_stripes) == -(-len(text) // stripe_size)
    for s in text_stripes:
        assert s.band_class == "cold" and s.compression == "zstd"
        # the recorded length is the frame's, and the fragments are sized for it
        assert 0 < s.stored_length < s.data_length // 4
        assert s.fragment_length < zrig.data.policies["cold"].fragment_length(s.data_length) // 2
    token_stripes = stripes_of(zrig, "/tok/shard-0")
    assert all(
        (s.band_class, s.compression, s.stored_length) == ("cold", None, None)
        for s in token_stripes
    )
    assert {s.compression for s in stripes_of(zrig, "/mix/both")} == {"zstd", None}
    assert report.stripes_compressed == len(text_stripes) + 2
    assert report.stripes_stored_raw == len(token_stripes) + 2
    assert report.compression_ratio > 1.5 and report.compress_cpu_s > 0
    for path, data in files.items():
        assert sha(zrig.read_file(path)) == sha(data), path
    # unaligned ranges across stripe ends
    ino = zrig.ns.resolve("/mix/both").ino
    for offset, length in ((1, 100), (stripe_size - 7, 20), (3 * stripe_size - 5000, 9000)):
        assert zrig.ns.read(ino, offset, length) == mixed[offset : offset + length]
    check_accounting(zrig.catalog)
    assert check(zrig.catalog, zrig.ns.root_ino).clean
    zrig.restart()
    for path, data in files.items():
        assert sha(zrig.read_file(path)) == sha(data), path
    # promoted back to warm: decompressed on the way, stored raw there
    pin(zrig, "/logs/run.jsonl", "warm")
    Tiering(zrig.ns, zrig.data, zrig.catalog, TieringPolicy()).run()
    back = stripes_of(zrig, "/logs/run.jsonl")
    assert {(s.band_class, s.compression) for s in back} == {("warm", None)}
    assert sha(zrig.read_file("/logs/run.jsonl")) == sha(text)
    check_accounting(zrig.catalog)


def test_incompressible_data_is_stored_raw_no_bigger_than_warm(zrig):
    data = noise(256 * KiB, 11)
    zrig.write_file("/tok/shard-1", data)
    warm = stripes_of(zrig, "/tok/shard-1")
    to_cold(zrig)
    cold = stripes_of(zrig, "/tok/shard-1")
    assert [s.compression for s in cold] == [None] * len(warm)
    assert [s.fragment_length for s in cold] == [s.fragment_length for s in warm]
    assert sha(zrig.read_file("/tok/shard-1")) == sha(data)


def test_sequential_reads_decompress_each_stripe_once(zrig):
    text = text_bytes(512 * KiB, 5)
    zrig.write_file("/logs/big.jsonl", text)
    to_cold(zrig)
    compressed = [s for s in stripes_of(zrig, "/logs/big.jsonl") if s.compression]
    assert len(compressed) == 8
    zrig.restart()
    stats = zrig.data.reader.stats
    ino = zrig.ns.resolve("/logs/big.jsonl").ino
    out = bytearray()
    for pos in range(0, len(text), 4 * KiB):  # 128 READ calls of 4 KiB
        out += zrig.ns.read(ino, pos, 4 * KiB)
    assert out == text
    assert stats["stripes_decompressed"] == len(compressed)
    assert stats["decompressed_bytes"] == len(text)


def test_a_read_decodes_around_a_bad_fragment_of_a_compressed_stripe_and_repairs_it(zrig):
    text = text_bytes(200 * KiB, 6)
    zrig.write_file("/logs/r.jsonl", text)
    to_cold(zrig)
    packed = next(s for s in stripes_of(zrig, "/logs/r.jsonl") if s.compression)
    first = next(f for f in zrig.fragments() if f.stripe_id == packed.id and f.idx == 0)
    flip_bits(zrig, first, at=85)  # inside the frame's first bytes
    assert sha(zrig.read_file("/logs/r.jsonl")) == sha(text)
    assert zrig.data.reader.stats["checksum_errors"] == 1
    assert zrig.data.repairs.wait() == [True]
    moved = next(f for f in zrig.fragments() if f.id == first.id)
    assert (moved.zone_id, moved.zone_offset) != (first.zone_id, first.zone_offset)
    assert moved.checksum == first.checksum
    zrig.restart()
    assert sha(zrig.read_file("/logs/r.jsonl")) == sha(text)


def test_the_event_loop_reads_a_compressed_stripe_only_from_the_cache(zrig):
    text = text_bytes(100 * KiB, 8)
    zrig.write_file("/logs/e.jsonl", text)
    to_cold(zrig)
    zrig.restart()
    ino = zrig.ns.resolve("/logs/e.jsonl").ino
    zrig.ns.read(ino, 0, 1)  # the extent map and the first stripe, in a worker as the loop would
    zrig.data.reader.drop_cache()
    with no_blocking(), pytest.raises(WouldBlock, match="decompression"):
        zrig.data.read(ino, 0, 4096, len(text))
    assert zrig.data.read(ino, 0, 4096, len(text)) == text[:4096]
    with no_blocking():
        assert zrig.data.read(ino, 100, 4096, len(text)) == text[100:4196]


def test_scrub_and_rebuild_after_a_failed_drive_keep_compressed_stripes_whole(zrig):
    files = {f"/ckpt/opt-{i}.jsonl": text_bytes(150 * KiB + 999 * i, 20 + i) for i in range(4)}
    for path, data in files.items():
        zrig.write_file(path, data)
    to_cold(zrig)
    packed = {s.id for p in files for s in stripes_of(zrig, p) if s.compression}
    assert packed
    on_packed = [f for f in zrig.fragments() if f.stripe_id in packed]
    # scrub: bad fragments of compressed stripes are rebuilt with their recorded checksums
    victims = [on_packed[0], on_packed[len(on_packed) // 2]]
    for victim in victims:
        flip_bits(zrig, victim, at=90)
    report = Scrubber(zrig.data, zrig.catalog).run()
    assert (report.bad, report.repaired, report.unrepairable) == (2, 2, 0)
    after = {f.id: f for f in zrig.fragments()}
    assert all(after[v.id].checksum == v.checksum for v in victims)
    # a failed drive: its fragments of compressed stripes are rebuilt elsewhere
    first = zrig.drive_ids[0]
    lost = [f for f in zrig.fragments() if f.drive_id == first and f.stripe_id in packed]
    assert lost
    drive_states.fail_drive(zrig.catalog, first, actor="admin")
    zrig.data.refresh_drive_states()
    done = rebuild(zrig.data, zrig.catalog, actor="admin")
    assert not done.unrecoverable and done.unplaced == 0 and done.status["reduced"] == 0
    assert all(f.drive_id != first for f in zrig.fragments())
    check_accounting(zrig.catalog)
    # two more drives gone: every compressed stripe decodes from the rest and decompresses
    for drive_id in zrig.drive_ids[1:3]:
        drive_states.fail_drive(zrig.catalog, drive_id)
        shutil.rmtree(zrig.data.space.drives[drive_id].path)
    zrig.restart()
    for path, data in files.items():
        assert sha(zrig.read_file(path)) == sha(data), path
    assert {s.id for p in files for s in stripes_of(zrig, p) if s.compression} == packed


def test_cleaning_moves_fragments_of_compressed_stripes(rig_factory):
    # small zones, so the compressed cold data fills some (cleaning picks only full zones)
    zrig = rig_factory(policies=ZSTD_COLD, zone_size=64 * KiB, zones=96)
    files = {f"/logs/f{i:02d}": metrics_bytes(70 * KiB, 100 + i) for i in range(24)}
    for path, data in files.items():
        zrig.write_file(path, data)
    to_cold(zrig)
    packed = {s.id for p in files for s in stripes_of(zrig, p) if s.compression}
    before = {f.id: (f.zone_id, f.zone_offset) for f in zrig.fragments()}
    doomed = sorted(files)[::2]
    for path in doomed:
        zrig.ns.unlink(ROOT, zrig.ns.resolve("/logs").ino, path.rsplit("/", 1)[1])
    kept = {p: d for p, d in files.items() if p not in doomed}
    report = Cleaner(zrig.data, zrig.catalog).run(band_class="cold")
    assert report.zones_cleaned > 0
    moved = [
        f
        for f in zrig.fragments()
        if f.stripe_id in packed and (f.zone_id, f.zone_offset) != before[f.id]
    ]
    assert moved, "cleaning moved no fragment of a compressed stripe"
    check_accounting(zrig.catalog)
    assert check(zrig.catalog, zrig.ns.root_ino).clean
    for path, data in kept.items():
        assert sha(zrig.read_file(path)) == sha(data), path
    zrig.restart()
    for path, data in kept.items():
        assert sha(zrig.read_file(path)) == sha(data), path


def test_fsck_and_the_reader_refuse_wrong_compression_records(zrig):
    text = text_bytes(100 * KiB, 7)
    zrig.write_file("/logs/a.jsonl", text)
    to_cold(zrig)
    first = stripes_of(zrig, "/logs/a.jsonl")[0]
    assert first.compression == "zstd"

    def set_row(**values):
        zrig.catalog.run(
            lambda c: c.execute(update(STRIPES).where(STRIPES.c.id == first.id).values(**values))
        )
        zrig.data.invalidate_stripes([first.id])

    assert check(zrig.catalog, zrig.ns.root_ino).clean
    set_row(compression="lz4")
    problems = check(zrig.catalog, zrig.ns.root_ino).problems
    assert problems == [f"stripe {first.id}: unknown compression 'lz4', expected one of ('zstd',)"]
    with pytest.raises(errors.IOFailure, match="unknown compression 'lz4'"):
        zrig.read_file("/logs/a.jsonl")
    set_row(compression="zstd", stored_length=first.data_length)
    assert "below its" in check(zrig.catalog, zrig.ns.root_ino).problems[0]
    set_row(compression=None, stored_length=first.stored_length)
    assert "raw stripe" in check(zrig.catalog, zrig.ns.root_ino).problems[0]
    set_row(compression="zstd", stored_length=first.stored_length - 1)  # a cut frame
    with pytest.raises(errors.IOFailure, match=f"stripe {first.id}: zstd frame"):
        zrig.read_file("/logs/a.jsonl")
    set_row(stored_length=first.stored_length)
    assert sha(zrig.read_file("/logs/a.jsonl")) == sha(text)


def test_pack_keeps_raw_bytes_unless_they_shrink_enough():
    text = text_bytes(64 * KiB, 9)
    packed = compression.pack(text, "zstd", 3)
    assert packed.codec == "zstd" and packed.stored_length == len(packed.data) < len(text) // 4
    assert compression.unpack(packed.data, "zstd", len(text)) == text
    noise_ = noise(64 * KiB, 9)
    raw = compression.pack(noise_, "zstd", 19)
    assert (raw.codec, raw.stored_length, raw.data) == (None, None, noise_)
    assert compression.pack(text, None).codec is None


@pytest.mark.parametrize("level", [0, 20, "3", True])
def test_compression_level_is_checked_when_the_config_loads(level):
    with pytest.raises(errors.ConfigError, match="compression_level"):
        load_policies({"cold": {"compression_level": level}})
    assert load_policies({"cold": {"compression_level": 9}})["cold"].compression_level == 9
