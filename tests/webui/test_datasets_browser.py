"""The datasets page in Debian's chromium (Playwright): take a snapshot after its preview, see
its referenced and unique bytes, add, edit and delete a schedule, and roll back and delete a
snapshot only after a confirmation page that says what will happen."""

from __future__ import annotations

from engine.namespace import ROOT
from engine.snapshots.schedules import SnapshotScheduler
from engine.snapshots.service import Snapshots
from tests.webui.conftest import ADMIN, PASSWORD
from tests.webui.helpers import mkdirs
from tests.webui.test_browser import server  # noqa: F401 - fixtures


def _write(ns, path: str, data: bytes) -> None:
    parent, name = path.rsplit("/", 1)
    attr = ns.create(ROOT, ns.resolve(parent).ino, name, exclusive=False)
    ns.setattr(ROOT, attr.ino, size=0)
    ns.write(attr.ino, 0, data, stable=True)


def _read(ns, path: str) -> bytes:
    attr = ns.resolve(path)
    return bytes(ns.read(attr.ino, 0, attr.size))


def test_datasets_page_in_the_browser(server, page, live):  # noqa: F811
    ns = live.namespace
    mkdirs(ns, "/datasets/web")
    _write(ns, "/datasets/web/model", b"A" * 300_000)
    snaps = Snapshots(ns)

    page.goto(server + "/datasets")
    assert page.url.startswith(server + "/login")
    page.fill("input[name=username]", ADMIN)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(server + "/datasets")
    assert "No datasets yet" in page.inner_text("main")

    # the first snapshot of a directory: a preview first, then taken
    form = "#new-dataset-snapshot"
    page.fill(f"{form} input[name=path]", "/datasets/web")
    page.fill(f"{form} input[name=name]", "monday")
    page.click(f"{form} button[type=submit]")
    page.wait_for_selector("#confirm")
    assert "will hold 1 file (293.0 KiB)" in page.inner_text("#preview-summary")
    assert snaps.list("/datasets/web") == []  # not yet
    page.click("#confirm-yes")
    page.wait_for_selector("#snapshots tr[data-snapshot=monday]")
    assert "snapshot monday of /datasets/web taken" in page.inner_text(".flash")
    page.click("nav a:has-text('Datasets')")
    page.wait_for_selector("#datasets tr[data-dataset='/datasets/web']")
    page.click("#datasets tr[data-dataset='/datasets/web'] a:has-text('Open')")
    page.wait_for_selector("#snapshots")

    # the live file changes: the snapshot's old bytes become its own (unique)
    _write(ns, "/datasets/web/model", b"B" * 300_000)
    _write(ns, "/datasets/web/notes", b"n")
    page.reload()
    row = "#snapshots tr[data-snapshot=monday]"
    assert page.inner_text(f"{row} td.unique") == "0 B", "as counted at create: a load reads rows"
    snaps.recount_space("/datasets/web")  # what the daemon's snapshot-space job does
    page.reload()
    assert page.inner_text(f"{row} td.referenced") == "293.0 KiB"
    assert page.inner_text(f"{row} td.unique") == "293.0 KiB"
    assert page.inner_text(f"{row} td.shared") == "0 B"
    assert "UTC" in page.inner_text(row)

    # a schedule: refused with the field's error, then created, edited, deleted
    form = "#new-schedule"
    page.select_option(f"{form} select[name=frequency]", "daily")
    page.fill(f"{form} input[name=at]", "25:00")
    page.fill(f"{form} input[name=keep_last]", "7")
    page.click(f"{form} button[type=submit]")
    page.wait_for_load_state()
    assert "expected a UTC time HH:MM" in page.inner_text(f"{form} .form-error")
    assert SnapshotScheduler(ns).list_schedules() == []
    page.fill(f"{form} input[name=at]", "03:00")
    page.fill(f"{form} input[name=keep_for]", "30d")
    page.click(f"{form} button[type=submit]")
    page.wait_for_selector("#schedules tr[data-schedule]")
    [schedule] = SnapshotScheduler(ns).list_schedules()
    assert (schedule.keep_last, schedule.keep_for_s, schedule.at) == (7, 30 * 86400, "03:00")
    shown = page.inner_text(f"#schedules tr[data-schedule='{schedule.id}']")
    assert "daily at 03:00 UTC" in shown and "the newest 7 and those younger than 30 d" in shown
    page.click(f"#schedules tr[data-schedule='{schedule.id}'] a:has-text('Edit')")
    page.wait_for_selector("#edit-schedule")
    page.fill("#edit-schedule input[name=keep_last]", "3")
    page.click("#edit-schedule button[type=submit]")
    page.wait_for_selector("#schedules")
    assert SnapshotScheduler(ns).get(schedule.id).keep_last == 3
    page.click(f"#schedules tr[data-schedule='{schedule.id}'] a:has-text('Preview run')")
    page.wait_for_selector("#preview")
    assert "Nothing to do now" in page.inner_text("#preview")
    page.go_back()
    page.click(f"#schedules tr[data-schedule='{schedule.id}'] button:has-text('Delete')")
    page.wait_for_selector("#confirm")
    assert "the snapshots it took stay" in page.inner_text("#confirm")
    assert SnapshotScheduler(ns).list_schedules()  # not yet
    page.click("#confirm-yes")
    page.wait_for_selector("#snapshots")
    assert SnapshotScheduler(ns).list_schedules() == []

    # rollback: the confirmation lists what changes; cancelling changes nothing
    page.click(f"{row} button:has-text('Rollback')")
    page.wait_for_selector("#confirm")
    assert "Rolling /datasets/web back to snapshot monday" in page.inner_text("#preview-summary")
    paths = page.inner_text("#preview-paths")
    assert "notes" in paths and "removed (made since the snapshot)" in paths
    assert "model" in paths and "reverted" in paths
    page.click("#confirm-cancel")
    page.wait_for_selector("#snapshots")
    assert _read(ns, "/datasets/web/model") == b"B" * 300_000
    page.click(f"{row} button:has-text('Rollback')")
    page.wait_for_selector("#confirm")
    page.click("#confirm-yes")
    page.wait_for_selector(".flash")
    assert "rolled back to snapshot monday" in page.inner_text(".flash")
    assert _read(ns, "/datasets/web/model") == b"A" * 300_000
    assert "notes" not in [e.name for e in ns.readdir(ROOT, ns.resolve("/datasets/web").ino)[0]]

    # clone: a writable copy at a new path; a taken path is refused with a message
    page.fill(f"{row} input[name=new_path]", "/datasets/web-exp")
    page.click(f"{row} button:has-text('Clone')")
    page.wait_for_selector(".flash")
    assert "cloned to /datasets/web-exp" in page.inner_text(".flash")
    assert _read(ns, "/datasets/web-exp/model") == b"A" * 300_000
    page.fill(f"{row} input[name=new_path]", "/datasets/web-exp")
    page.click(f"{row} button:has-text('Clone')")
    page.wait_for_selector(".flash.error")
    assert "exists" in page.inner_text(".flash.error")

    # delete: the confirmation says what it frees; only "yes" deletes
    page.click(f"{row} button:has-text('Delete')")
    page.wait_for_selector("#confirm")
    assert "This cannot be undone" in page.inner_text("#preview-summary")
    assert page.inner_text("#preview-frees") == "0 B"  # after the rollback the live tree shares it
    assert [s.name for s in snaps.list("/datasets/web")] == ["monday"]  # not yet
    page.click("#confirm-yes")
    page.wait_for_selector(".flash")
    assert "snapshot monday of /datasets/web deleted" in page.inner_text(".flash")
    assert snaps.list("/datasets/web") == []
    assert "No snapshots of this dataset yet" in page.inner_text("main")
