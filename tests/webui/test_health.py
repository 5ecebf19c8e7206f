"""SMART parsing of the three smartctl shapes, through the fake smartctl executable."""

from __future__ import annotations

import json
import os
import stat

from engine.admin import health
from tests.webui.conftest import FAKE_SMARTCTL, FIXTURES


def test_ata_smr_drive_key_attributes():
    report = health.read_smart("/dev/sda", str(FAKE_SMARTCTL))
    assert report.available and report.protocol == "ATA" and report.overall == "PASSED"
    assert report.model == "ST8000DM004-2CX188" and report.serial == "ZCT1A2B3"
    assert (report.reallocated_sectors, report.pending_sectors, report.offline_uncorrectable) == (
        8,
        2,
        0,
    )
    assert report.power_on_hours == 17890 and report.temperature_c == 38
    assert report.capacity_bytes == 8001563222016 and report.rotation_rate == 5425
    assert {a.id for a in report.attributes} >= {5, 9, 194, 197, 198}
    assert report.self_test == "completed without error"


def test_sas_drive_maps_grown_defects_and_uncorrected_errors():
    report = health.read_smart("/dev/sdb", str(FAKE_SMARTCTL))
    assert report.available and report.protocol == "SCSI" and report.passed is True
    assert report.model == "SEAGATE ST4000NM0025" and report.firmware == "N004"
    assert report.reallocated_sectors == 3  # grown defect list
    assert report.offline_uncorrectable == 1  # read 0 + write 1 + verify 0
    assert report.power_on_hours == 31012 and report.temperature_c == 31
    assert report.exit_status == 4  # a warning bit: data still shown


def test_nvme_drive_health_log():
    report = health.read_smart("/dev/nvme0", str(FAKE_SMARTCTL))
    assert report.available and report.protocol == "NVMe" and report.overall == "PASSED"
    assert (report.media_errors, report.percentage_used, report.available_spare) == (0, 3, 100)
    assert report.power_on_hours == 5120 and report.temperature_c == 41
    assert report.capacity_bytes == 1000204886016 and report.attributes == []


def test_failing_ata_drive_and_nvme_critical_warning():
    data = json.loads((FIXTURES / "ata_smr.json").read_text())
    data["smart_status"] = {"passed": False}
    data["ata_smart_attributes"]["table"][2]["when_failed"] = "now"
    report = health.parse_smart(data)
    assert report.overall == "FAILED" and report.attributes[2].failed == "now"
    nvme = json.loads((FIXTURES / "nvme.json").read_text())
    del nvme["smart_status"]
    nvme["nvme_smart_health_information_log"]["critical_warning"] = 4
    assert health.parse_smart(nvme).overall == "FAILED"


def test_drives_without_smart_say_so_instead_of_failing(tmp_path):
    emulated = health.read_smart(None, str(FAKE_SMARTCTL))
    assert (
        not emulated.available
        and emulated.overall == "no SMART data"
        and "emulated" in emulated.reason
    )
    unknown = health.read_smart("/dev/sdz", str(FAKE_SMARTCTL))
    assert not unknown.available and "/dev/sdz failed: No such device" in unknown.reason
    missing = health.read_smart("/dev/sda", str(tmp_path / "no-smartctl"))
    assert (
        not missing.available and "not found" in missing.reason and "no-smartctl" in missing.reason
    )
    garbage = tmp_path / "garbage-smartctl"
    garbage.write_text("#!/bin/sh\necho 'not json'; exit 1\n")
    garbage.chmod(garbage.stat().st_mode | stat.S_IEXEC)
    broken = health.read_smart("/dev/sda", str(garbage))
    assert (
        not broken.available
        and "without JSON output" in broken.reason
        and "not json" in broken.reason
    )
    assert health.parse_smart(["not", "an", "object"]).available is False


def test_reading_smart_never_wakes_a_sleeping_drive(tmp_path, monkeypatch):
    log = tmp_path / "calls"
    monkeypatch.setenv("FAKE_SMARTCTL_LOG", str(log))
    health.read_smart("/dev/nvme0", str(FAKE_SMARTCTL))
    assert log.read_text().splitlines() == ["--json -x -n standby /dev/nvme0"]
    standby = {
        "smartctl": {
            "exit_status": 2,
            "messages": [{"string": "Device is in STANDBY mode, exit(2)"}],
        },
        "device": {"name": "/dev/sda", "protocol": "ATA"},
    }
    report = health.parse_smart(standby)
    assert not report.available and report.reason == "Device is in STANDBY mode, exit(2)"


def test_self_test_start_and_refusals(tmp_path, monkeypatch):
    log = tmp_path / "calls"
    monkeypatch.setenv("FAKE_SMARTCTL_LOG", str(log))
    message = health.start_self_test("/dev/sda", str(FAKE_SMARTCTL), "short")
    assert "in progress" in message
    assert log.read_text().splitlines() == ["--json -t short /dev/sda"]
    for device, kind, expected in (
        (None, "short", "emulated drive"),
        ("/dev/sda", "offline", "expected one of"),
        ("/dev/sdz", "short", "No such device"),
    ):
        try:
            health.start_self_test(device, str(FAKE_SMARTCTL), kind)
        except ValueError as exc:
            assert expected in str(exc)
        else:
            raise AssertionError(f"self-test on {device} ({kind}) was not refused")


def test_io_counters_for_the_disk_under_a_folder(tmp_path):
    name = health.block_device_of(str(tmp_path))
    counters = health.io_counters(str(tmp_path))
    if (
        name is None
    ):  # an overlay or tmpfs root has no block device: reported as unknown, not invented
        assert counters is None
    else:
        assert (
            counters["disk"] == name and counters["read_bytes"] >= 0 and "write_count" in counters
        )
    assert health.io_counters(None) is None
    assert health.io_counters(str(tmp_path / "absent")) is None
    assert os.path.exists(FAKE_SMARTCTL)


def test_the_drives_page_reads_smart_in_parallel_and_caches_it(app, tmp_path, monkeypatch):
    """smartctl runs for the drives overlap (a 24-bay chassis is one smartctl's time, not 24), and a
    second view within the cache time runs none."""
    log = tmp_path / "runs"
    slow = tmp_path / "slow_smartctl"
    slow.write_text(
        f"#!/bin/sh\necho start $$ >> {log}\nsleep 0.8\necho end $$ >> {log}\n"
        f'exec {FAKE_SMARTCTL} "$@"\n'
    )
    slow.chmod(0o755)
    from webui import drives

    monkeypatch.setattr(app.extensions["shingle"], "smartctl", str(slow))
    with app.app_context():
        rows = drives.drive_rows()
        runs = log.read_text().splitlines()
        drives.drive_rows()
    assert [r["smart"]["overall"] for r in rows] == ["PASSED", "PASSED", "PASSED", "no SMART data"]
    assert len(runs) == 6  # three devices; the emulated drive needs no smartctl
    assert runs[:2] == [
        "start " + runs[0].split()[1],
        "start " + runs[1].split()[1],
    ]  # 2nd began before 1st ended
    assert log.read_text().splitlines() == runs  # cached: no smartctl on the second view
