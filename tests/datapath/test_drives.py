"""Zoned drives: emulated formatting, the blkzoned ioctl structures, the SMR cost model."""

from __future__ import annotations

import os
import subprocess
import threading

import pytest
from sqlalchemy import func, select

from engine.base.errors import ConfigError
from engine.catalog.models import Drive, Zone
from engine.drives import SmrModel, ZoneFileDrive, blkzoned, format_emulated
from engine.drives.zoned import EMPTY, EXPLICIT_OPEN, FULL, IMPLICIT_OPEN, ZoneError

KiB, MiB = 1 << 10, 1 << 20


def test_format_emulated_makes_folders_zone_files_and_rows(catalog, tmp_path):
    ids = format_emulated(catalog, tmp_path / "d", 3, 8 * MiB, MiB)
    assert len(ids) == 3
    folders = sorted(p.name for p in (tmp_path / "d").iterdir())
    assert folders == ["drive-000", "drive-001", "drive-002"]
    assert len(list((tmp_path / "d" / "drive-001").glob("zone-*"))) == 8
    rows = catalog.read(
        lambda c: c.execute(select(func.count()).select_from(Zone.__table__)).scalar()
    )
    assert rows == 24
    drive = catalog.read(
        lambda c: c.execute(select(Drive.__table__).where(Drive.__table__.c.id == ids[0])).first()
    )
    assert (drive.backend, drive.state, drive.zone_size, drive.zone_count) == (
        "zonefile",
        "online",
        MiB,
        8,
    )
    more = format_emulated(
        catalog, tmp_path / "d", 1, 8 * MiB, MiB
    )  # adding drives later continues numbering
    assert (tmp_path / "d" / "drive-003").is_dir() and len(more) == 1


@pytest.mark.parametrize(
    "count, drive_size, zone_size, key",
    [
        (0, 8 * MiB, MiB, "drives.count"),
        (2, 8 * MiB, MiB + 1, "drives.zone_size"),
        (2, 8 * MiB, 0, "drives.zone_size"),
        (2, 3 * MiB, MiB, "drives.drive_size"),
    ],
)
def test_format_emulated_refuses_bad_geometry(tmp_path, count, drive_size, zone_size, key):
    with pytest.raises(ConfigError) as info:
        format_emulated(None, tmp_path / "d", count, drive_size, zone_size)
    assert info.value.key == key
    assert not (tmp_path / "d").exists()  # nothing half-made


def test_zone_conditions_and_max_open_zones(tmp_path):
    drive = ZoneFileDrive.format(tmp_path / "z", 64 * KiB, 4, "u", max_open_zones=2)
    assert [z.condition for z in drive.report()] == [EMPTY] * 4
    drive.append(0, 0, b"x")
    drive.open_zone(1)
    assert drive.condition(0) == IMPLICIT_OPEN and drive.condition(1) == EXPLICIT_OPEN
    with pytest.raises(ZoneError, match="exceed 2 open zones"):
        drive.append(2, 0, b"y")
    drive.close_zone(1)
    drive.append(2, 0, b"y")
    drive.finish_zone(2)
    assert drive.condition(2) == FULL
    info = drive.report()[0]
    assert (info.start, info.capacity, info.write_pointer) == (0, 64 * KiB, 1)
    drive.close()
    reopened = ZoneFileDrive(tmp_path / "z", 64 * KiB, 4, uuid="u")
    assert reopened.write_pointer(0) == 1  # the write pointer is the file's length
    with pytest.raises(Exception, match="holds drive"):
        ZoneFileDrive(tmp_path / "z", 64 * KiB, 4, uuid="other")


C_LAYOUT = r"""
#include <stdio.h>
#include <stddef.h>
#include <linux/blkzoned.h>
int main(void) {
    printf("%zu %zu %zu\n", sizeof(struct blk_zone), sizeof(struct blk_zone_report),
           sizeof(struct blk_zone_range));
    printf("%zu %zu %zu %zu %zu %zu\n", offsetof(struct blk_zone, wp),
           offsetof(struct blk_zone, type),
           offsetof(struct blk_zone, cond), offsetof(struct blk_zone, capacity),
           offsetof(struct blk_zone_report, nr_zones), offsetof(struct blk_zone_report, flags));
    printf("%lu %lu %lu %lu %lu %lu %lu\n", (unsigned long)BLKREPORTZONE,
           (unsigned long)BLKRESETZONE,
           (unsigned long)BLKGETZONESZ, (unsigned long)BLKGETNRZONES, (unsigned long)BLKOPENZONE,
           (unsigned long)BLKCLOSEZONE, (unsigned long)BLKFINISHZONE);
    return 0;
}
"""


def test_blkzoned_packing_matches_linux_header(tmp_path):
    source = tmp_path / "layout.c"
    source.write_text(C_LAYOUT)
    subprocess.run(
        ["gcc", "-o", str(tmp_path / "layout"), str(source)], check=True, capture_output=True
    )
    sizes, offsets, requests = (
        line.split()
        for line in subprocess.run(
            [str(tmp_path / "layout")], check=True, capture_output=True, text=True
        ).stdout.splitlines()
    )
    assert [int(x) for x in sizes] == [
        blkzoned.BLK_ZONE.size,
        blkzoned.BLK_ZONE_REPORT.size,
        blkzoned.BLK_ZONE_RANGE.size,
    ]
    assert [int(x) for x in offsets] == [16, 24, 25, 32, 8, 12]
    assert [int(x) for x in requests] == [
        blkzoned.BLKREPORTZONE,
        blkzoned.BLKRESETZONE,
        blkzoned.BLKGETZONESZ,
        blkzoned.BLKGETNRZONES,
        blkzoned.BLKOPENZONE,
        blkzoned.BLKCLOSEZONE,
        blkzoned.BLKFINISHZONE,
    ]
    # a report as the kernel fills it: two zones, capacity flag set
    buf = blkzoned.pack_report_request(0, 2)
    blkzoned.BLK_ZONE_REPORT.pack_into(buf, 0, 0, 2, blkzoned.BLK_ZONE_REP_CAPACITY)
    blkzoned.BLK_ZONE.pack_into(buf, 16, 0, 524288, 1000, 2, 0x2, 0, 0, 500000)
    blkzoned.BLK_ZONE.pack_into(buf, 80, 524288, 524288, 524288, 2, 0x1, 0, 0, 500000)
    flags, zones = blkzoned.unpack_report(buf)
    assert flags == 1 and zones[0]["wp"] == 1000 and zones[0]["capacity"] == 500000
    assert (
        blkzoned.CONDITIONS[zones[0]["cond"]] == IMPLICIT_OPEN
        and blkzoned.CONDITIONS[zones[1]["cond"]] == EMPTY
    )
    assert blkzoned.pack_range(524288, 524288) == (524288).to_bytes(8, "little") * 2


def test_host_managed_device_when_present():
    devices = blkzoned.host_managed_devices()
    if not devices:
        # this machine has none (no zoned devices, no null_blk): the ioctl path is
        # covered by packing above
        assert blkzoned.is_host_managed("/dev/null") is False
        return
    drive = blkzoned.ZonedBlockDrive(devices[0])
    zones = drive.report()
    assert zones and all(z.capacity <= drive.zone_size for z in zones)


def test_smr_model_sequential_appends_cost_no_amplification():
    model = SmrModel(band_size=MiB)
    for i in range(8):
        model.on_write("d", i * 128 * KiB, 128 * KiB)
    report = model.report()
    assert report["write_amplification"] == 1.0 and report["sequential_append_share"] == 1.0
    assert report["seeks"] == 1  # only the first positioning
    assert report["busy_s"] == pytest.approx(0.0122 + MiB / (235 * MiB))


def test_smr_model_drive_managed_random_write_rewrites_the_band():
    model = SmrModel(band_size=MiB, drive_managed=True)
    model.prefill("d", 0, 4 * MiB)
    model.on_write("d", 2 * MiB + 4096, 4096)
    model.on_write("d", 4 * MiB, 4096)  # an append at band 4's pointer: no cliff
    report = model.report()
    assert report["band_rewrites"] == 1
    assert report["media_write_bytes"] == MiB + 4096
    assert report["sequential_append_share"] == 0.5
    again = SmrModel(band_size=MiB, drive_managed=True)
    again.prefill("d", 0, 4 * MiB)
    again.on_write("d", 2 * MiB + 4096, 4096)
    again.on_write("d", 4 * MiB, 4096)
    assert again.report() == report  # deterministic


def test_datapath_writes_are_sequential_appends_on_the_smr_model(sqlite_catalog, tmp_path):
    catalog = sqlite_catalog
    from dphelpers import Engine

    from engine.namespace import ROOT

    model = SmrModel(band_size=MiB, drive_managed=True)
    eng = Engine(catalog, tmp_path / "drives", smr_model=model)
    try:
        ns = eng.ns
        inos = [ns.create(ROOT, ns.root_ino, f"c{i}").ino for i in range(4)]
        chunk = os.urandom(100 * KiB)
        for step in range(20):
            for ino in inos:
                ns.write(ino, step * len(chunk), chunk)
        for ino in inos:
            ns.commit(ino)
        report = model.report()
        assert report["sequential_append_share"] == 1.0
        assert report["max_drive_write_amplification"] == 1.0
        assert report["band_rewrites"] == 0
    finally:
        eng.close()


def test_a_zone_opened_while_the_loop_reads_it_is_not_cached_yet(tmp_path, monkeypatch):
    """The event loop's read_cached looks for a zone's fd without the lock while a worker opens
    the zone: it finds either no fd or the fd with its pointer, never the fd alone (a data
    server's first READ of a zone another head wrote failed with a KeyError: SERVERFAULT)."""
    drive = ZoneFileDrive.format(tmp_path / "z", 64 * KiB, 4, "u")
    drive.append(1, 0, b"written by another head")
    drive.close()
    drive = ZoneFileDrive(tmp_path / "z", 64 * KiB, 4, uuid="u")  # knows no zone yet
    opening, go_on = threading.Event(), threading.Event()
    real_fstat = os.fstat
    opener = threading.Thread(target=drive.write_pointer, args=(1,), name="opener")

    def held_fstat(fd):
        if threading.current_thread() is opener:
            opening.set()
            go_on.wait(10)
        return real_fstat(fd)

    monkeypatch.setattr(os, "fstat", held_fstat)
    opener.start()
    try:
        assert opening.wait(10)
        assert drive.read_cached(1, 0, 7) is None  # not opened yet: a worker reads it
    finally:
        go_on.set()
        opener.join(10)
    monkeypatch.setattr(os, "fstat", real_fstat)
    got = drive.read_cached(1, 0, 7)
    assert got is None or bytes(got) == b"written"  # (None: not in the page cache)
    assert drive.write_pointer(1) == len(b"written by another head")
    drive.close()
