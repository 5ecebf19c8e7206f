"""SIGKILL aimed inside each of snapshot create, the live tree's changes right after it, snapshot
delete, the background reclaim of deleted snapshots, dataset clone and the first write into a
dataset clone (its lazy copy), on SQLite and PostgreSQL: each is all or nothing, and every
acknowledged byte is there. (test_snapshot_crash.py kills a like loop at random times.)

A forked child loops over: write the dataset's ``gen`` file (the next snapshot's name), snapshot the
dataset, change the live tree (overwrite ``gen``, truncate and rewrite a file, rename a file away
and back, unlink ``churn`` and make it again), clone its big file into a new file, clone the
snapshot into a new dataset (`shingle dataset clone`) and write a file into that clone (which copies
the clone's root folder from the snapshot first), delete the older snapshots, every other iteration
reclaim the deleted ones. Each round aims its kill inside one of those operations: the child counts
the catalog statements and commits of the operation's first run (through SQLite's trace callback and
psycopg's cursor factory, so the hot paths' plain cursors count too), then kills itself at a random
one of them in a later run: no sleep decides where it lands. After each kill, every snapshot listed
holds the whole dataset as it was at its create (``gen`` holds its own name, the changed files their
old contents), every file clone is empty or whole, every dataset clone is there whole or not at all,
every write the child acknowledged (after its call returned) reads back byte for byte, in a clone
also once its origin is deleted and reclaimed, and fsck and the accounting are clean, before and
after the pending deletions are reclaimed."""

from __future__ import annotations

import faulthandler
import os
import random
import select
import signal
import sqlite3
import threading
import time
from functools import partial

from dphelpers import check_accounting
from snapshot_churn import (
    BIG,
    CHURN,
    FILES,
    GEN_SIZE,
    POLICIES,
    change_live_tree,
    gen,
    restore_live_tree,
    small,
)
from sqlalchemy import event

from engine.admin import fsck
from engine.catalog import Catalog
from engine.coding.erasure import load_policies
from engine.datapath import DataPath
from engine.drives import format_emulated
from engine.namespace import ROOT, Namespace
from engine.snapshots import service as snapshots_module
from engine.snapshots.service import Snapshots

OPERATIONS = ("create", "change", "delete", "reclaim", "clone", "clone-write")
ROUNDS = len(OPERATIONS)  # one kill inside each; the seed picks where
RNG = random.Random(77)
CHILD_TIMEOUT_S = 120


def written(label: str) -> bytes:
    return random.Random(label).randbytes(20_000)


def open_engine(url: str, listen=None):
    catalog = Catalog(url)
    if listen is not None:  # before the first connection: a connection keeps the listeners it met
        listen(catalog)
    data = DataPath(catalog, load_policies(POLICIES), reserve_zones=1)
    return catalog, data, Namespace(catalog, data=data)


class KillPoints:
    """Counts the catalog statements (every one, the hot paths' plain DB-API cursors too) and
    commits this thread sends while an operation runs; when armed, the Nth of them kills the
    process before it reaches the catalog."""

    def __init__(self, out: int):
        self.thread = threading.get_ident()
        self.out = out
        self.counting: str | None = None
        self.seen = 0
        self.kill_at = 0

    def listen(self, catalog: Catalog) -> None:
        event.listen(catalog.engine, "connect", self.connected)
        event.listen(catalog.engine, "commit", self.point)

    def connected(self, dbapi_conn, _record) -> None:
        if isinstance(dbapi_conn, sqlite3.Connection):
            dbapi_conn.set_trace_callback(self.point)  # called as each statement starts
            return
        point, base = self.point, dbapi_conn.cursor_factory

        class Counted(base):  # psycopg: every cursor of this connection
            def execute(self, *args, **kwargs):
                point()
                return super().execute(*args, **kwargs)

            def executemany(self, *args, **kwargs):
                point()
                return super().executemany(*args, **kwargs)

        dbapi_conn.cursor_factory = Counted

    def point(self, *_args) -> None:
        if self.counting is None or threading.get_ident() != self.thread:
            return
        self.seen += 1
        if self.seen == self.kill_at:
            os.write(self.out, f"KILL {self.counting} {self.seen}\n".encode())
            os.kill(os.getpid(), signal.SIGKILL)

    def run(self, name: str, work, kill_at: int = 0):
        self.counting, self.seen, self.kill_at = name, 0, kill_at
        try:
            return work()
        finally:
            self.counting = None


def child(url: str, round_no: int, target: str, out: int) -> None:
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # where it hangs, if it does
    snapshots_module.DELETE_CHUNK_INODES = 16  # a reclaim has many chunks to land between
    points = KillPoints(out)
    catalog, data, ns = open_engine(url, points.listen)
    snaps = Snapshots(ns)
    rng = random.Random(f"{target}-{round_no}")
    clones = ns.resolve("/clones").ino
    big = ns.resolve("/ds/big").ino
    ds = ns.resolve("/ds").ino
    os.write(out, b"READY\n")
    counted = 0  # the points of the target's last whole run

    def step(name: str, work):
        nonlocal counted
        if name != target:
            return work()
        kill_at = rng.randint(1, counted) if counted else 0
        result = points.run(name, work, kill_at)
        counted = points.seen  # it ran to its end: its count aims the next run
        return result

    def write_into_clone(label: str) -> None:
        root = ns.resolve(f"/dsclones/{label}").ino
        ino = ns.create(ROOT, root, "written").ino  # copies the clone's root folder first
        ns.write(ino, 0, written(label), stable=True)

    def delete_all(infos) -> None:
        for info in infos:
            snaps.delete("/ds", info.name)

    i = 0
    while True:
        label = f"r{round_no}-{i}"
        ns.write(ns.lookup(ROOT, ds, "gen").ino, 0, gen(label))
        ns.data.flush_all()
        step("create", partial(snaps.create, "/ds", label))
        step("change", partial(change_live_tree, ns, ds, i))
        target_ino = ns.create(ROOT, clones, f"c-{label}").ino
        ns.clone_range(ROOT, big, 0, target_ino, 0, 0)
        os.write(out, f"ACK c-{label}\n".encode())
        step("clone", partial(snaps.clone, "/ds", label, f"/dsclones/{label}"))
        step("clone-write", partial(write_into_clone, label))
        os.write(out, f"ACK {label}\n".encode())
        old = snaps.list("/ds")[:-2]
        if old:
            step("delete", partial(delete_all, old))
        if i % 2 and snaps.pending():  # and leaves deletions pending on the other rounds
            step("reclaim", partial(snaps.reclaim, inodes_per_s=0))
        i += 1


def run_child_until_killed(url: str, round_no: int, target: str) -> tuple[set[str], str]:
    """Fork the child, read what it acknowledged until it dies; returns the acknowledged labels
    and where the kill landed."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            child(url, round_no, target, write_end)
        finally:
            os._exit(1)
    os.close(write_end)
    acked: set[str] = set()
    killed = ""
    with os.fdopen(read_end, "rb") as reader:
        while True:
            ready, _, _ = select.select([reader], [], [], CHILD_TIMEOUT_S)
            if not ready:
                os.kill(pid, signal.SIGUSR1)
                time.sleep(2)
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise AssertionError(f"round {round_no}: the kill in {target} never came")
            line = reader.readline().decode()
            if not line:
                break
            kind, _, what = line.strip().partition(" ")
            if kind == "ACK":
                acked.add(what)
            elif kind == "KILL":
                killed = what
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
    assert killed.startswith(target + " "), (target, killed)
    return acked, killed


def check_after_kill(catalog, ns, acked: set[str]) -> None:
    report = fsck.check(catalog, ns.root_ino)  # a deletion cut short is no problem
    assert report.clean, report.problems
    snaps = Snapshots(ns)
    check_accounting(catalog)  # pending deletions' rows still count in their stripes
    snaps.finish_deletions()  # a reclaim cut short resumes where its last chunk ended
    assert snaps.pending() == []
    # figures never counted (a lazy view returns them so at create): counted now, through it
    snaps.recount_space("/ds", older_than_s=10**9)
    for info in snaps.list("/ds"):
        view = ns.resolve(f"/ds/.snapshots/{info.name}").ino
        entries, _ = ns.readdir(ROOT, view, limit=10_000)
        assert len(entries) == FILES + 3, info.name
        k = int(info.name.rpartition("-")[2]) % FILES  # changed after this create
        for i in {k, (k + 1) % FILES, *RNG.sample(range(FILES), 10)}:
            f = ns.lookup(ROOT, view, f"f{i:03d}")
            assert ns.read(f.ino, 0, f.size) == small(i), (info.name, i)
        for name, body in (("gen", gen(info.name)), ("churn", CHURN)):
            f = ns.lookup(ROOT, view, name)
            assert ns.read(f.ino, 0, f.size) == body, (info.name, name)
        assert (
            info.referenced_bytes
            == len(BIG) + sum(len(small(i)) for i in range(FILES)) + len(CHURN) + GEN_SIZE
        )
    file_clones = {e.name: e for e in ns.readdir(ROOT, ns.resolve("/clones").ino, limit=10_000)[0]}
    for name, entry in file_clones.items():
        size = entry.attr.size
        assert size in (0, len(BIG)), name
        if size or name in acked:
            assert ns.read(entry.attr.ino, 0, size) == BIG, name
    dataset_clones = ns.readdir(ROOT, ns.resolve("/dsclones").ino, limit=10_000)[0]
    # every acknowledged clone is there, and reads what was written into it, though its
    # origin snapshot is deleted and reclaimed by now
    assert {a for a in acked if not a.startswith("c-")} <= {e.name for e in dataset_clones}
    assert {a for a in acked if a.startswith("c-")} <= set(file_clones)
    for entry in dataset_clones:
        names = {e.name for e in ns.readdir(ROOT, entry.attr.ino, limit=10_000)[0]}
        dataset = {f"f{i:03d}" for i in range(FILES)} | {"big", "gen", "churn"}
        assert names - {"written"} == dataset, entry.name
        assert "written" in names or entry.name not in acked, entry.name
        if "written" in names:  # one stable write: all of it or (unacknowledged) nothing
            f = ns.lookup(ROOT, entry.attr.ino, "written")
            got = ns.read(f.ino, 0, f.size)
            assert got == written(entry.name) or (not got and entry.name not in acked)
        for i in RNG.sample(range(FILES), 3):
            f = ns.lookup(ROOT, entry.attr.ino, f"f{i:03d}")
            assert ns.read(f.ino, 0, f.size) == small(i), entry.name
    check_accounting(catalog)
    report = fsck.check(catalog, ns.root_ino)
    assert report.clean, report.problems


def test_a_kill_aimed_inside_each_snapshot_operation_is_all_or_nothing(tmp_path, catalog_url):
    url = catalog_url  # SQLite and PostgreSQL (upgraded by the fixture)
    catalog = Catalog(url)
    format_emulated(catalog, tmp_path / "drives", 10, 64 << 20, 1 << 20)
    setup, data, ns = open_engine(url)
    ds = ns.mkdir(ROOT, ns.root_ino, "ds").ino
    ns.mkdir(ROOT, ns.root_ino, "clones")
    ns.mkdir(ROOT, ns.root_ino, "dsclones")
    for i in range(FILES):
        ns.write(ns.create(ROOT, ds, f"f{i:03d}").ino, 0, small(i))
    ns.write(ns.create(ROOT, ds, "big").ino, 0, BIG)
    ns.write(ns.create(ROOT, ds, "gen").ino, 0, gen("none"))
    ns.write(ns.create(ROOT, ds, "churn").ino, 0, CHURN)
    data.close()
    setup.close()
    acked: set[str] = set()
    kills = []
    for round_no in range(ROUNDS):
        target = OPERATIONS[round_no % len(OPERATIONS)]
        acked_now, killed = run_child_until_killed(url, round_no, target)
        acked |= acked_now
        kills.append(killed)
        engine_catalog, data, ns = open_engine(url)
        try:
            check_after_kill(catalog, ns, acked)
            restore_live_tree(ns)
        finally:
            data.close()
            engine_catalog.close()
    print("killed at (operation, catalog statement or commit):", kills)
    assert sum(1 for a in acked if not a.startswith("c-")) >= ROUNDS  # clones were written
    catalog.close()
