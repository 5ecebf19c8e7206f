"""Adding and replacing drives on a running data path, then rebuilding onto them."""

from __future__ import annotations

from engine.lifecycle import drives as drive_states
from engine.lifecycle.jobs import runners
from engine.lifecycle.scrub import Scrubber

from .conftest import KiB, check_accounting, random_bytes, sha


def every_byte_checked(rig, files: dict) -> None:
    """Every file reads back as written, and every fragment on a drive passes its checksum."""
    for path, data in files.items():
        assert sha(rig.read_file(path)) == sha(data), path
    report = Scrubber(rig.data, rig.catalog).run()
    assert report.fragments_checked == len(rig.fragments()) and report.bad == 0
    check_accounting(rig.catalog)


def test_too_few_drives_warn_then_an_added_drive_restores_full_redundancy(rig_factory, tmp_path):
    rig = rig_factory(drives=6)  # exactly the width of a 4+2 stripe
    jobs = runners(rig.ns, rig.data, rig.catalog)
    files = {f"/d/f{i}": random_bytes(120 * KiB + 333 * i, 40 + i) for i in range(8)}
    for path, data in files.items():
        rig.write_file(path, data)
    failed = rig.drive_ids[1]
    drive_states.fail_drive(rig.catalog, failed, actor="admin")
    result = jobs["rebuild"]({}, lambda *a: None, "admin")
    [warning] = result["warnings"]
    assert result["status"]["reduced"] > 0 and result["unplaced"] > 0
    assert warning.startswith(f"{result['status']['reduced']} stripes still under-protected")
    assert "only 5 drives take writes" in warning and "needs 6" in warning

    # the running data path takes the new drive (no restart) and rebuilds onto it
    added = jobs["drive-add"](
        {"path": str(tmp_path / "new-drive"), "preallocate": False}, lambda *a: None, "admin"
    )
    assert added["warnings"] == [] and added["status"]["reduced"] == 0
    new = added["drive"]
    assert new in rig.data.space.drives and drive_states.get_drive(rig.catalog, new).fragments > 0
    assert not any(f.drive_id == failed for f in rig.fragments())
    every_byte_checked(rig, files)
    rig.restart()
    every_byte_checked(rig, files)


def test_replace_drains_a_readable_drive_and_removes_it(rig, tmp_path):
    jobs = runners(rig.ns, rig.data, rig.catalog)
    files = {f"/r/f{i}": random_bytes(200 * KiB + 17 * i, 70 + i) for i in range(6)}
    for path, data in files.items():
        rig.write_file(path, data)
    old = rig.drive_ids[3]
    held = len([f for f in rig.fragments() if f.drive_id == old])
    assert held > 0
    result = jobs["drive-replace"](
        {"old": old, "path": str(tmp_path / "spare-3")}, lambda *a: None, "admin"
    )
    assert result["warnings"] == [] and result["replaced"] == old
    assert result["fragments_moved"] == held and result["replaced_state"] == "removed"
    assert drive_states.get_drive(rig.catalog, old).state == "removed"
    assert drive_states.get_drive(rig.catalog, result["drive"]).fragments > 0
    every_byte_checked(rig, files)


def test_replace_a_missing_drive_rebuilds_it_from_redundancy(rig, tmp_path):
    import shutil

    jobs = runners(rig.ns, rig.data, rig.catalog)
    files = {f"/m/f{i}": random_bytes(150 * KiB + i, 90 + i) for i in range(5)}
    for path, data in files.items():
        rig.write_file(path, data)
    old = rig.drive_ids[0]
    shutil.rmtree(rig.data.space.drives[old].path)
    rig.data.check_drives()
    assert drive_states.get_drive(rig.catalog, old).state == "missing"
    result = jobs["drive-replace"](
        {"old": str(old), "path": str(tmp_path / "spare-0")}, lambda *a: None, "admin"
    )
    assert result["warnings"] == [] and result["fragments_rebuilt"] > 0
    assert drive_states.get_drive(rig.catalog, old).state == "removed"
    every_byte_checked(rig, files)
