"""Retention rules end to end on real catalogs (SQLite and PostgreSQL)."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from engine.admin.events import recent
from engine.admin.trash import Trash
from engine.base import errors
from engine.catalog.models import Inode, RetentionPolicy
from engine.namespace import ROOT
from engine.snapshots.retention import RetentionService, natural_key

T0 = 1_700_000_000 * 10**9


def make_path(ns, path, *, mtime_ns=None, directory=False):
    """Create ``path`` (parents as directories) and return its Attr."""
    parts = [p for p in path.split("/") if p]
    attr = ns.getattr(ns.root_ino)
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        try:
            attr = ns.lookup(ROOT, attr.ino, part)
        except errors.NotFound:
            attr = (
                ns.mkdir(ROOT, attr.ino, part)
                if (directory or not last)
                else ns.create(ROOT, attr.ino, part)
            )
    if mtime_ns is not None:
        attr = ns.setattr(ROOT, attr.ino, mtime_ns=mtime_ns)
    return attr


def checkpoint(ns, path, mtime_ns, files=("model.pt", "optim.pt")):
    for name in files:
        make_path(ns, f"{path}/shard/{name}")
    return make_path(ns, path, mtime_ns=mtime_ns, directory=True)


def exists(ns, path):
    try:
        ns.resolve(path, follow=False)
        return True
    except errors.NotFound:
        return False


def inode_count(catalog):
    return catalog.read(
        lambda c: c.execute(select(func.count()).select_from(Inode.__table__)).scalar_one()
    )


def test_invalid_rules_are_refused_with_clear_errors_and_nothing_stored(namespace, catalog):
    service = RetentionService(namespace, catalog)
    cases = [
        (dict(pattern="", keep=3), "non-empty"),
        (dict(pattern="   ", keep=3), "non-empty"),
        (dict(pattern="checkpoints/*", keep=3), "absolute"),
        (dict(pattern="/checkpoints/../etc", keep=3), "'..'"),
        (dict(pattern="/", keep=3), "root itself"),
        (dict(pattern="/ckpt/*", keep=0), "keep 0"),
        (dict(pattern="/ckpt/*", keep=-2), "keep -2"),
        (dict(pattern="/ckpt/*", keep=True), "keep True"),
        (dict(pattern="/ckpt/*", keep="three"), "keep 'three'"),
        (dict(pattern="/ckpt/*", keep=3, action="shred"), "delete, cold, trash"),
        (dict(pattern="/ckpt/*", keep=3, order_by="size"), "mtime, name"),
    ]
    for kwargs, text in cases:
        with pytest.raises(errors.InvalidArgument) as info:
            service.add_rule(**kwargs)
        assert text in str(info.value), (kwargs, str(info.value))
    assert service.list_rules() == []
    rule_id = service.add_rule("/ckpt/*/", "4", action="trash", order_by="name")
    rule = service.list_rules()[0]
    assert (rule.id, rule.pattern, rule.keep, rule.action, rule.order_by, rule.enabled) == (
        rule_id,
        "/ckpt/*",
        4,
        "trash",
        "name",
        True,
    )
    with pytest.raises(errors.InvalidArgument, match="keep 0"):
        service.update_rule(rule_id, keep=0)
    with pytest.raises(errors.InvalidArgument, match="'colour'"):
        service.update_rule(rule_id, colour="red")
    with pytest.raises(errors.NotFound, match="id 999"):
        service.update_rule(999, keep=2)
    assert service.list_rules()[0].keep == 4  # failed updates changed nothing
    assert service.update_rule(rule_id, keep=2, enabled=False, actor="alice").keep == 2
    service.delete_rule(rule_id, actor="alice")
    with pytest.raises(errors.NotFound):
        service.delete_rule(rule_id)
    kinds = [(e.kind, e.actor) for e in recent(catalog, kind_prefix="retention.rule")]
    assert kinds == [
        ("retention.rule.delete", "alice"),
        ("retention.rule.update", "alice"),
        ("retention.rule.add", "system"),
    ]


def test_keep_last_n_by_mtime_per_run_deletes_whole_subtrees(namespace, catalog):
    ns = namespace
    # run1: steps written in order; run2: step-3 got an older mtime than step-1 (copied in later)
    for step in range(1, 6):
        checkpoint(ns, f"/checkpoints/run1/step-{step}", T0 + step * 10**9)
    for step, age in ((1, 5), (2, 6), (3, 1), (4, 7)):
        checkpoint(ns, f"/checkpoints/run2/step-{step}", T0 + age * 10**9)
    make_path(ns, "/checkpoints/run1/notes.txt", mtime_ns=T0)  # does not match step-*
    make_path(ns, "/checkpoints/run1/.step-0.tmp", mtime_ns=T0)  # hidden: never a candidate
    service = RetentionService(ns, catalog)
    rule_id = service.add_rule("/checkpoints/*/step-*", keep=2)
    preview = service.preview()
    assert [(p.path, p.action, p.rule_id) for p in preview] == [
        ("/checkpoints/run1/step-1", "delete", rule_id),
        ("/checkpoints/run1/step-2", "delete", rule_id),
        ("/checkpoints/run1/step-3", "delete", rule_id),
        ("/checkpoints/run2/step-1", "delete", rule_id),
        ("/checkpoints/run2/step-3", "delete", rule_id),
    ]
    assert preview[0].mtime_ns == T0 + 10**9 and preview[0].is_dir
    assert "keeps 2" in preview[0].reason and "/checkpoints/run1" in preview[0].reason
    before = inode_count(catalog)
    assert exists(ns, "/checkpoints/run1/step-1/shard/model.pt")  # preview changed nothing

    calls = []
    results = service.run(actor="cron", progress=lambda d, t, m: calls.append((d, t)))
    assert [r.outcome for r in results] == ["done"] * 5
    assert calls[0] == (0, 5) and calls[-1] == (5, 5)
    for path in (
        "/checkpoints/run1/step-4",
        "/checkpoints/run1/step-5",
        "/checkpoints/run2/step-2",
        "/checkpoints/run2/step-4",
        "/checkpoints/run1/notes.txt",
        "/checkpoints/run1/.step-0.tmp",
    ):
        assert exists(ns, path), path
    for item in preview:
        assert not exists(ns, item.path), item.path
    # each checkpoint is 4 inodes (step dir, shard dir, 2 files): all freed, none left staged
    assert inode_count(catalog) == before - 5 * 4 + 2  # + the trash dir and its .purging dir
    assert service.preview() == []
    events = recent(catalog, kind_prefix="retention.")
    deletes = [e for e in events if e.kind == "retention.delete"]
    assert sorted(e.details["path"] for e in deletes) == [p.path for p in preview]
    assert all(e.actor == "cron" and e.details["rule_id"] == rule_id for e in deletes)
    assert events[0].kind == "retention.run" and events[0].details["counts"] == {"delete": 5}
    assert service.list_rules()[0].last_run_ns is not None


def test_natural_sort_of_names(namespace, catalog):
    for step in (2, 9, 10, 100, 11):
        make_path(
            namespace, f"/ckpt/step-{step}", mtime_ns=T0 + (200 - step) * 10**9
        )  # mtimes reversed
    service = RetentionService(namespace, catalog)
    rule_id = service.add_rule("/ckpt/step-*", keep=2, order_by="name")
    assert [p.path for p in service.preview(rule_id)] == [
        "/ckpt/step-2",
        "/ckpt/step-9",
        "/ckpt/step-10",
    ]
    assert sorted(["step-10", "step-9", "Step-10a", "step-100"], key=natural_key) == [
        "step-9",
        "step-10",
        "Step-10a",
        "step-100",
    ]


def test_entries_open_for_writing_are_never_touched(namespace, catalog):
    ns = namespace
    for step in range(1, 5):
        checkpoint(ns, f"/ckpt/step-{step}", T0 + step * 10**9)
    held = ns.resolve("/ckpt/step-1/shard/optim.pt")
    ns.open_ref(held.ino)
    service = RetentionService(ns, catalog)
    service.add_rule("/ckpt/step-*", keep=1, action="trash")
    preview = {p.path: p for p in service.preview()}
    assert preview["/ckpt/step-1"].action == "skip"
    assert "open for writing" in preview["/ckpt/step-1"].reason
    assert [preview[f"/ckpt/step-{s}"].action for s in (2, 3)] == ["trash", "trash"]
    results = {r.path: r for r in service.run()}
    assert results["/ckpt/step-1"].outcome.startswith("skipped: open for writing")
    assert exists(ns, "/ckpt/step-1/shard/optim.pt") and not exists(ns, "/ckpt/step-2")
    skip = recent(catalog, kind_prefix="retention.skip")[0]
    assert skip.severity == "warning" and skip.details["path"] == "/ckpt/step-1"
    ns.close_ref(held.ino)
    assert [(r.path, r.outcome) for r in service.run()] == [("/ckpt/step-1", "done")]
    trashed = {e.original_path for e in Trash(ns, catalog).list()}
    assert trashed == {"/ckpt/step-1", "/ckpt/step-2", "/ckpt/step-3"}


def test_settle_time_skips_recent_changes(namespace, catalog):
    for step in range(1, 4):
        make_path(namespace, f"/ckpt/step-{step}")  # mtime: now
    clock = [namespace.resolve("/ckpt/step-3").mtime_ns + 5 * 10**9]
    service = RetentionService(namespace, catalog, settle_s=60, clock=lambda: clock[0])
    service.add_rule("/ckpt/step-*", keep=1)
    assert {p.action for p in service.preview()} == {"skip"}
    assert "settle time" in service.preview()[0].reason
    clock[0] += 120 * 10**9
    assert {p.action for p in service.preview()} == {"delete"}


def test_cold_action_pins_subtree_once(namespace, catalog):
    ns = namespace
    for step in range(1, 4):
        checkpoint(ns, f"/runs/a/step-{step}", T0 + step * 10**9)
    service = RetentionService(ns, catalog)
    service.add_rule("/runs/*/step-*", keep=1, action="cold")
    assert [p.path for p in service.preview()] == ["/runs/a/step-1", "/runs/a/step-2"]
    assert [r.outcome for r in service.run()] == ["done", "done"]
    table = Inode.__table__
    classes = catalog.read(lambda c: dict(c.execute(select(table.c.ino, table.c.band_class)).all()))
    for step, want in ((1, "cold"), (2, "cold"), (3, None)):
        for sub in ("", "/shard", "/shard/model.pt"):
            assert classes[ns.resolve(f"/runs/a/step-{step}{sub}").ino] == want, (step, sub)
    assert service.preview() == []  # already cold: nothing would happen
    event = recent(catalog, kind_prefix="retention.cold")[0]
    assert event.details["inodes"] == 4


def test_wildcards_do_not_follow_symlinks_or_hidden_names(namespace, catalog):
    ns = namespace
    for step in range(1, 4):
        make_path(ns, f"/data/real/step-{step}", mtime_ns=T0 + step)
    links = make_path(ns, "/data/links", directory=True)
    ns.symlink(ROOT, links.ino, "alias", "/data/real")
    make_path(ns, "/data/.hidden/step-1", mtime_ns=T0)
    make_path(ns, "/data/.hidden/step-2", mtime_ns=T0 + 1)
    service = RetentionService(ns, catalog)
    rule_id = service.add_rule("/data/*/*", keep=1)
    paths = [p.path for p in service.preview()]
    assert paths == ["/data/real/step-1", "/data/real/step-2"]  # links/alias is a lone entry; kept
    service.update_rule(rule_id, pattern="/data/links/alias/*")
    assert service.preview() == []


def test_disabled_rules_run_only_on_demand_and_changes_between_plan_and_apply(namespace, catalog):
    for step in range(1, 4):
        make_path(namespace, f"/c/step-{step}", mtime_ns=T0 + step)
    service = RetentionService(namespace, catalog)
    rule_id = service.add_rule("/c/step-*", keep=2, enabled=False)
    assert service.preview() == [] and service.run() == []
    planned = service.preview(rule_id)
    assert [p.path for p in planned] == ["/c/step-1"]
    # the entry is replaced by another file of the same name after planning
    namespace.unlink(ROOT, namespace.resolve("/c").ino, "step-1")
    make_path(namespace, "/c/step-1", mtime_ns=T0)
    outcome = service._apply(planned[0], "test")
    assert outcome.outcome.startswith("skipped: gone or replaced")
    assert exists(namespace, "/c/step-1")
    assert [r.outcome for r in service.run(rule_id)] == ["done"]


def test_rule_rows_are_plain_catalog_rows(namespace, catalog):
    service = RetentionService(namespace, catalog)
    rule_id = service.add_rule("/x/*", keep=3, action="cold")
    table = RetentionPolicy.__table__
    row = catalog.read(lambda c: c.execute(select(table).where(table.c.id == rule_id)).one())
    assert (row.pattern, row.keep, row.action, row.order_by, bool(row.enabled)) == (
        "/x/*",
        3,
        "cold",
        "mtime",
        True,
    )
