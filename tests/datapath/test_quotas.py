"""Quotas over the engine: limits refused whole, counters after every kind of change, a
recount that agrees (also after SIGKILL mid-write), snapshots, and the soft alert."""

from __future__ import annotations

import errno
import os
import random
import signal
import threading
import time

import pytest
from dphelpers import SMALL, Engine

from engine.admin.alerts import AlertSettings, QuotaLimit
from engine.admin.quota_service import QuotaService
from engine.base import errors
from engine.catalog import Catalog
from engine.catalog.database import sql
from engine.coding.erasure import load_policies
from engine.datapath import DataPath
from engine.namespace import ROOT, Namespace
from engine.snapshots.service import Snapshots

KiB = 1024


def mkdirs(ns, *names):
    inos = []
    parent = ns.root_ino
    for name in names:
        parent = ns.mkdir(ROOT, parent, name).ino
        inos.append(parent)
    return inos


def usage(service, path):
    info = service.get(path)
    return info.used_bytes, info.used_files


def assert_recount_agrees(service):
    assert service.recount(fix=False) == []


def test_counters_follow_create_write_truncate_remove(engine):
    ns = engine.ns
    service = QuotaService(ns)
    team, sub = mkdirs(ns, "team", "sub")
    f0 = ns.create(ROOT, team, "before").ino
    ns.write(f0, 0, b"x" * 1000, stable=True)
    service.set("/team", bytes_limit=10 * KiB)
    service.set("/team/sub", files_limit=100)
    assert usage(service, "/team") == (1000, 2)  # sub and before; the root itself does not count
    assert usage(service, "/team/sub") == (0, 0)

    f1 = ns.create(ROOT, sub, "a").ino
    ns.write(f1, 0, b"a" * 3000)
    assert usage(service, "/team") == (1000, 3)  # buffered bytes count once committed
    ns.commit(f1)
    assert usage(service, "/team") == (4000, 3)
    assert usage(service, "/team/sub") == (3000, 1)
    ns.write(f1, 1000, b"b" * 500, stable=True)  # an overwrite inside the file: no growth
    assert usage(service, "/team/sub") == (3000, 1)
    ns.setattr(ROOT, f1, size=100)
    assert usage(service, "/team") == (1100, 3)
    ns.setattr(ROOT, f1, size=2000)  # a sparse extension counts at its logical size
    assert usage(service, "/team/sub") == (2000, 1)
    ns.symlink(ROOT, sub, "link", "a")
    ns.mkdir(ROOT, sub, "d")
    assert usage(service, "/team/sub") == (2000, 3)
    ns.unlink(ROOT, sub, "a")
    ns.unlink(ROOT, sub, "link")
    ns.rmdir(ROOT, sub, "d")
    assert usage(service, "/team/sub") == (0, 0)
    assert usage(service, "/team") == (1000, 2)
    assert_recount_agrees(service)


def test_a_write_past_the_hard_limit_fails_whole(engine):
    ns = engine.ns
    service = QuotaService(ns)
    (team,) = mkdirs(ns, "team")
    service.set("/team", bytes_limit=64 * KiB)
    a = ns.create(ROOT, team, "a").ino
    ns.write(a, 0, b"1" * (40 * KiB))  # buffered, not committed yet
    b = ns.create(ROOT, team, "b").ino
    # buffered bytes of another file are admitted already: 40 + 30 KiB would pass 64 KiB
    with pytest.raises(errors.QuotaExceeded) as raised:
        ns.write(b, 0, b"2" * (30 * KiB))
    assert raised.value.errno == errno.EDQUOT
    assert ns.getattr(b).size == 0
    ns.write(b, 0, b"2" * (24 * KiB), stable=True)  # exactly to the limit
    ns.commit(a)
    assert usage(service, "/team") == (64 * KiB, 2)
    with pytest.raises(errors.QuotaExceeded):
        ns.write(a, 40 * KiB, b"3")
    with pytest.raises(errors.QuotaExceeded):
        ns.setattr(ROOT, a, size=41 * KiB)
    ns.write(a, 0, b"4" * (40 * KiB), stable=True)  # rewriting what is there grows nothing
    assert ns.read(a, 0, 40 * KiB) == b"4" * (40 * KiB)
    assert ns.getattr(a).size == 40 * KiB and ns.getattr(b).size == 24 * KiB
    ns.setattr(ROOT, b, size=0)  # shrinking makes room again
    ns.write(a, 40 * KiB, b"5" * KiB, stable=True)
    assert usage(service, "/team") == (41 * KiB, 2)
    service.set("/team", bytes_limit=0)  # 0: no limit
    ns.write(a, 41 * KiB, b"6" * (100 * KiB), stable=True)
    assert_recount_agrees(service)


def test_concurrent_appenders_never_pass_the_limit(sqlite_engine):
    ns = sqlite_engine.ns
    service = QuotaService(ns)
    (team,) = mkdirs(ns, "team")
    limit = 300 * KiB
    service.set("/team", bytes_limit=limit)
    files = [ns.create(ROOT, team, f"w{i}").ino for i in range(4)]
    refused = []

    def append(ino):
        rng = random.Random(ino)
        size = 0
        while True:
            try:
                ns.write(ino, size, b"w" * rng.randint(1, 12 * KiB), stable=rng.random() < 0.3)
            except errors.QuotaExceeded:
                refused.append(ino)
                return
            size = ns.getattr(ino).size
            if rng.random() < 0.2:
                ns.commit(ino)

    threads = [threading.Thread(target=append, args=(ino,)) for ino in files]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for ino in files:
        ns.commit(ino)
    total = sum(ns.getattr(ino).size for ino in files)
    assert sorted(refused) == sorted(files)
    assert total <= limit and total > limit - 4 * 12 * KiB
    assert usage(service, "/team") == (total, 4)
    assert_recount_agrees(service)


def test_files_limit_and_nested_trees(engine):
    ns = engine.ns
    service = QuotaService(ns)
    outer, inner = mkdirs(ns, "outer", "inner")
    service.set("/outer", files_limit=3)
    service.set("/outer/inner", bytes_limit=10 * KiB)
    ns.create(ROOT, inner, "one")
    ns.mkdir(ROOT, outer, "two")
    with pytest.raises(errors.QuotaExceeded):
        ns.create(ROOT, inner, "three")  # the outer tree's limit holds inside the inner one
    with pytest.raises(errors.QuotaExceeded):
        ns.symlink(ROOT, outer, "three", "x")
    assert usage(service, "/outer") == (0, 3)
    service.set("/outer", files_limit=None, soft_files=2)  # None keeps a field as it was
    assert service.get("/outer").files_limit == 3
    service.set("/outer", files_limit=0)
    ns.create(ROOT, inner, "three")
    assert usage(service, "/outer") == (0, 4) and usage(service, "/outer/inner") == (0, 2)
    assert_recount_agrees(service)


def test_rename_and_link_across_quota_trees(engine):
    ns = engine.ns
    service = QuotaService(ns)
    a, b = ns.mkdir(ROOT, ns.root_ino, "a").ino, ns.mkdir(ROOT, ns.root_ino, "b").ino
    service.set("/a", bytes_limit=100 * KiB)
    service.set("/b", bytes_limit=20 * KiB, files_limit=10)
    tree = ns.mkdir(ROOT, a, "tree").ino
    for i in range(3):
        f = ns.create(ROOT, tree, f"f{i}").ino
        ns.write(f, 0, bytes([i]) * (5 * KiB), stable=True)
    big = ns.create(ROOT, a, "big").ino
    ns.write(big, 0, b"B" * (30 * KiB), stable=True)
    assert usage(service, "/a") == (45 * KiB, 5)

    ns.rename(ROOT, a, "tree", b, "tree")  # 15 KiB, 4 inodes move
    assert usage(service, "/a") == (30 * KiB, 1)
    assert usage(service, "/b") == (15 * KiB, 4)
    with pytest.raises(errors.QuotaExceeded):
        ns.rename(ROOT, a, "big", b, "big")  # 30 KiB do not fit into b
    assert ns.lookup(ROOT, a, "big").ino == big
    ns.rename(ROOT, a, "big", ns.root_ino, "big")  # out of every quota tree
    assert usage(service, "/a") == (0, 0)
    with pytest.raises(errors.CrossDevice):
        ns.link(ROOT, big, b, "big-link")
    ns.link(ROOT, big, ns.root_ino, "big-link")  # the same set of trees (none)
    with pytest.raises(errors.CrossDevice):
        ns.rename(ROOT, ns.root_ino, "big", a, "big")  # it has another link outside
    ns.unlink(ROOT, ns.root_ino, "big-link")
    ns.rename(ROOT, ns.root_ino, "big", a, "big")
    assert usage(service, "/a") == (30 * KiB, 1)
    # renaming over a file frees the victim's count in its trees
    ns.rename(ROOT, b, "tree", a, "tree")
    ns.rename(ROOT, ns.lookup(ROOT, a, "tree").ino, "f0", a, "big")
    assert usage(service, "/a") == (15 * KiB, 4)
    assert usage(service, "/b") == (0, 0)
    # the quota of a removed directory goes with it
    ns.rmdir(ROOT, ns.root_ino, "b")
    assert [q.path for q in service.list()] == ["/a"]
    assert_recount_agrees(service)


def test_unlinked_open_file_and_recount_fixes(engine):
    ns = engine.ns
    service = QuotaService(ns)
    (team,) = mkdirs(ns, "team")
    service.set("/team", bytes_limit=50 * KiB)
    f = ns.create(ROOT, team, "open").ino
    ns.open_ref(f)
    ns.write(f, 0, b"o" * (20 * KiB), stable=True)
    ns.unlink(ROOT, team, "open")
    assert usage(service, "/team") == (0, 0)  # gone from the tree at once, though still open
    ns.write(f, 20 * KiB, b"p" * (60 * KiB), stable=True)  # counts nowhere now
    assert usage(service, "/team") == (0, 0)
    ns.close_ref(f)

    g = ns.create(ROOT, team, "g").ino
    ns.write(g, 0, b"g" * 777, stable=True)
    engine.catalog.run(lambda conn: sql(conn, "UPDATE quotas SET used_bytes = 5").close())
    ns.quotas.forget()
    wrong = service.recount(fix=False)
    assert [(m.path, m.counted_bytes, m.recorded_bytes) for m in wrong] == [("/team", 777, 5)]
    assert service.recount() == wrong
    assert_recount_agrees(service)


def test_snapshots_do_not_count_clones_and_rollbacks_do(engine):
    ns = engine.ns
    service = QuotaService(ns)
    snaps = Snapshots(ns)
    (data,) = mkdirs(ns, "data")
    service.set("/data", bytes_limit=1 << 20)
    f = ns.create(ROOT, data, "f").ino
    ns.write(f, 0, b"s" * (10 * KiB), stable=True)
    snaps.create("/data", "one")
    assert usage(service, "/data") == (10 * KiB, 1)  # .snapshots and the frozen tree: not counted
    ns.write(f, 10 * KiB, b"t" * (10 * KiB), stable=True)
    ns.create(ROOT, data, "g")
    assert usage(service, "/data") == (20 * KiB, 2)
    snaps.rollback("/data", "one")
    assert usage(service, "/data") == (10 * KiB, 1)
    snaps.clone("/data", "one", "/data/copy")  # a writable tree: counted at logical size
    assert usage(service, "/data") == (20 * KiB, 3)
    assert_recount_agrees(service)


def test_soft_limit_raises_an_alert(engine):
    ns = engine.ns
    service = QuotaService(ns)
    (team,) = mkdirs(ns, "team")
    quota = service.set("/team", soft_bytes=4 * KiB, files_limit=2)
    source = QuotaLimit()
    assert source.find(engine.catalog, AlertSettings()) == []
    f = ns.create(ROOT, team, "f").ino
    ns.write(f, 0, b"x" * (5 * KiB), stable=True)
    ns.create(ROOT, team, "g")
    found = {x.key: x for x in source.find(engine.catalog, AlertSettings())}
    assert set(found) == {f"quota:{quota.id}:bytes", f"quota:{quota.id}:files"}
    assert found[f"quota:{quota.id}:bytes"].severity == "warning"
    assert "soft limit" in found[f"quota:{quota.id}:bytes"].message
    assert found[f"quota:{quota.id}:files"].severity == "critical"


def test_quota_on_a_file_or_missing_path_is_refused(engine):
    ns = engine.ns
    service = QuotaService(ns)
    ns.create(ROOT, ns.root_ino, "file")
    with pytest.raises(errors.NotADirectory):
        service.set("/file", bytes_limit=1)
    with pytest.raises(errors.NotFound):
        service.set("/nope", bytes_limit=1)
    with pytest.raises(errors.InvalidArgument):
        service.set("/", bytes_limit=-1)
    with pytest.raises(errors.NotFound):
        service.remove("/")


# -- SIGKILL while writing: the counters committed match a recount ------------------------------
def _quota_writer(url: str, out: int) -> None:
    catalog = Catalog(url)
    ns = Namespace(catalog, data=DataPath(catalog, load_policies(SMALL), reserve_zones=2))
    rng = random.Random(os.getpid())
    team = ns.resolve("/team").ino
    other = ns.resolve("/other").ino
    os.write(out, b"READY\n")
    for i in range(100_000):
        name = f"f{i}"
        ino = ns.create(ROOT, team, name).ino
        for _ in range(rng.randint(1, 4)):
            ns.write(ino, ns.getattr(ino).size, os.urandom(rng.randint(1, 20_000)))
        if rng.random() < 0.5:
            ns.commit(ino)
        if rng.random() < 0.3:
            ns.setattr(ROOT, ino, size=rng.randint(0, 30_000))
        if rng.random() < 0.3:
            ns.rename(ROOT, team, name, other, name)
        elif rng.random() < 0.3:
            ns.unlink(ROOT, team, name)


def test_counters_match_a_recount_after_sigkill(sqlite_catalog, tmp_path):
    engine = Engine(sqlite_catalog, tmp_path / "drives")
    ns = engine.ns
    mkdirs(ns, "team")
    mkdirs(ns, "other")
    service = QuotaService(ns)
    service.set("/team", bytes_limit=1 << 30)
    service.set("/other", files_limit=1 << 20)
    engine.close()
    url = sqlite_catalog.url
    for round_no in range(4):
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(read_end)
                _quota_writer(url, write_end)
            finally:
                os._exit(1)
        os.close(write_end)
        with os.fdopen(read_end, "rb") as reader:
            assert reader.readline().strip() == b"READY"
            time.sleep(0.3 + 0.2 * round_no)
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        engine.start()  # recovery, as a restarted daemon
        engine.ns.reclaim_orphans()
        assert QuotaService(engine.ns).recount(fix=False) == []
        assert service.get("/team").used_files > 0
        engine.close()
