"""Per-export trash end to end on real catalogs (SQLite and PostgreSQL)."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from engine.admin.events import recent
from engine.admin.trash import PURGING_DIR, TRASH_DIR, XATTR_ORIGIN, Trash
from engine.base import errors
from engine.catalog.models import Export, Inode
from engine.namespace import ROOT

DAY = 86400 * 10**9


def make_file(ns, path, content_marker=None):
    parts = [p for p in path.split("/") if p]
    attr = ns.getattr(ns.root_ino)
    for part in parts[:-1]:
        try:
            attr = ns.lookup(ROOT, attr.ino, part)
        except errors.NotFound:
            attr = ns.mkdir(ROOT, attr.ino, part)
    made = ns.create(ROOT, attr.ino, parts[-1])
    if content_marker:
        ns.setxattr(ROOT, made.ino, "user.marker", content_marker.encode())
    return made


def exists(ns, path):
    try:
        ns.resolve(path, follow=False)
        return True
    except errors.NotFound:
        return False


def add_export(catalog, name, path, trash_days):
    table = Export.__table__
    catalog.run(
        lambda c: c.execute(table.insert().values(name=name, path=path, trash_days=trash_days))
    )


class Clock:
    def __init__(self, ns):
        self.now = ns.getattr(ns.root_ino).mtime_ns

    def __call__(self):
        return self.now


def test_trash_restore_roundtrip_keeps_the_inode_and_records_events(namespace, catalog):
    ns = namespace
    original = make_file(ns, "/proj/run1/model.pt", "weights")
    make_file(ns, "/proj/run1/sub/log.txt")
    trash = Trash(ns, catalog)
    entry = trash.move_to_trash("/proj/run1", actor="bob")
    assert not exists(ns, "/proj/run1")
    assert entry.trash_path.startswith(f"/{TRASH_DIR}/") and entry.trash_path.endswith("-run1")
    assert entry.original_path == "/proj/run1" and entry.is_dir and entry.actor == "bob"
    assert ns.getxattr(ROOT, entry.id, XATTR_ORIGIN) == b"/proj/run1"
    assert exists(ns, entry.trash_path + "/sub/log.txt")
    assert ns.getattr(ns.resolve(f"/{TRASH_DIR}").ino).mode & 0o777 == 0o700
    listed = trash.list()
    assert [(e.id, e.original_path) for e in listed] == [(entry.id, "/proj/run1")]

    # restore by original path recreates the removed parent
    ns.rmdir(ROOT, ns.resolve("/").ino, "proj")
    restored = trash.restore("/proj/run1", actor="alice")
    assert restored == "/proj/run1"
    moved = ns.resolve("/proj/run1/model.pt")
    assert moved.ino == original.ino and ns.getxattr(ROOT, moved.ino, "user.marker") == b"weights"
    assert XATTR_ORIGIN not in ns.listxattr(ROOT, ns.resolve("/proj/run1").ino)
    assert trash.list() == []
    kinds = [(e.kind, e.actor) for e in recent(catalog, kind_prefix="trash.")]
    assert kinds == [("trash.restore", "alice"), ("trash.move", "bob")]
    assert recent(catalog, kind_prefix="trash.restore")[0].details["created_parents"] == ["/proj"]


def test_restore_never_replaces_an_existing_entry(namespace, catalog):
    ns = namespace
    make_file(ns, "/a/f", "old")
    trash = Trash(ns, catalog)
    entry = trash.move_to_trash("/a/f")
    newer = make_file(ns, "/a/f", "new")
    with pytest.raises(errors.Exists, match="/a/f exists"):
        trash.restore(entry.id)
    assert ns.resolve("/a/f").ino == newer.ino and exists(ns, entry.trash_path)  # nothing lost
    assert trash.restore(str(entry.id), to="/a/f.restored") == "/a/f.restored"
    assert ns.getxattr(ROOT, ns.resolve("/a/f.restored").ino, "user.marker") == b"old"
    with pytest.raises(errors.NotFound, match="id 12345"):
        trash.restore(12345)
    with pytest.raises(errors.NotFound, match="nothing deleted from"):
        trash.restore("/never/there")


def test_bad_trash_requests_are_refused(namespace, catalog):
    ns = namespace
    add_export(catalog, "/data", "/data", 3)
    make_file(ns, "/data/x")
    trash = Trash(ns, catalog)
    for path, text in (
        ("/", "namespace root"),
        ("/data", "root of export"),
        ("data/x", "absolute"),
        ("/data/../x", "'..'"),
    ):
        with pytest.raises(errors.InvalidArgument, match=text):
            trash.move_to_trash(path)
    entry = trash.move_to_trash("/data/x")
    with pytest.raises(errors.InvalidArgument, match="in the trash already"):
        trash.move_to_trash(entry.trash_path)
    with pytest.raises(errors.NotFound):
        trash.move_to_trash("/data/missing")
    with pytest.raises(errors.InvalidArgument, match="older_than_s"):
        trash.purge(older_than_s=-1)


def test_per_export_trash_and_purge_by_trash_days(namespace, catalog):
    ns = namespace
    add_export(catalog, "/fast", "/fast", 1)
    add_export(catalog, "/slow", "/slow", 10)
    clock = Clock(ns)
    trash = Trash(ns, catalog, clock=clock)
    make_file(ns, "/fast/a")
    make_file(ns, "/slow/b")
    make_file(ns, "/elsewhere/c")
    same_name = [make_file(ns, "/fast/d1/same"), make_file(ns, "/fast/d2/same")]
    entries = {
        e.original_path: e
        for e in (
            trash.move_to_trash(p)
            for p in ("/fast/a", "/slow/b", "/elsewhere/c", "/fast/d1/same", "/fast/d2/same")
        )
    }
    assert entries["/fast/a"].trash_path.startswith("/fast/.trash/")
    assert entries["/slow/b"].trash_path.startswith("/slow/.trash/")
    assert entries["/elsewhere/c"].trash_path.startswith("/.trash/")
    # same name trashed in the same instant: two entries, nothing replaced
    assert entries["/fast/d1/same"].trash_path != entries["/fast/d2/same"].trash_path
    assert {e.id for e in trash.list()} >= {a.ino for a in same_name}

    clock.now += 2 * DAY
    purged = trash.purge(actor="cron")
    assert sorted(e.original_path for e in purged) == ["/fast/a", "/fast/d1/same", "/fast/d2/same"]
    assert sorted(e.original_path for e in trash.list()) == ["/elsewhere/c", "/slow/b"]
    clock.now += 6 * DAY  # 8 days: the root trash keeps 7
    assert [e.original_path for e in trash.purge()] == ["/elsewhere/c"]
    calls = []
    assert [
        e.original_path for e in trash.purge(older_than_s=0, progress=lambda *a: calls.append(a))
    ] == ["/slow/b"]
    assert calls[-1][:2] == (1, 1)
    assert trash.list() == []
    # the inodes are freed, not just unnamed
    table = Inode.__table__
    left = catalog.read(lambda c: c.execute(select(func.count()).select_from(table)).scalar_one())
    dirs = [
        "/",
        "/fast",
        "/slow",
        "/elsewhere",
        "/fast/d1",
        "/fast/d2",
        "/fast/.trash",
        "/slow/.trash",
        "/.trash",
        f"/fast/.trash/{PURGING_DIR}",
        f"/slow/.trash/{PURGING_DIR}",
        f"/.trash/{PURGING_DIR}",
    ]
    assert left == len(dirs)
    assert len(recent(catalog, kind_prefix="trash.purge")) == 5


def test_interrupted_purge_is_finished_by_the_next_one(namespace, catalog):
    ns = namespace
    make_file(ns, "/big/a/b/c/file1")
    make_file(ns, "/big/a/file2")
    trash = Trash(ns, catalog)
    trash.move_to_trash("/big/a")
    # what a crash after the staging rename leaves behind
    entry = trash.list()[0]
    trash_dir = ns.resolve(f"/{TRASH_DIR}")
    purging = ns.mkdir(ROOT, trash_dir.ino, PURGING_DIR, 0o700)
    ns.rename(ROOT, trash_dir.ino, entry.name, purging.ino, "leftover")
    assert trash.list() == []
    assert trash.purge(older_than_s=0) == []
    assert list(ns.readdir(ROOT, purging.ino)[0]) == []
    assert "interrupted" in recent(catalog, kind_prefix="trash.purge")[0].message


def test_delete_removes_subtree_for_good(namespace, catalog):
    ns = namespace
    for i in range(30):
        make_file(ns, f"/tree/d{i % 3}/sub{i % 2}/f{i}")
    trash = Trash(ns, catalog)
    table = Inode.__table__

    def count() -> int:
        return catalog.read(
            lambda c: c.execute(select(func.count()).select_from(table)).scalar_one()
        )

    before = count()
    removed = trash.delete("/tree", actor="admin")
    assert removed == 30 + 3 + 6 + 1
    assert not exists(ns, "/tree")
    assert count() == before - removed + 2  # .trash and .purging were created
    assert trash.list() == []
    with pytest.raises(errors.InvalidArgument):
        trash.delete("/")
