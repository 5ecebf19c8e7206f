"""Soak: writers, overwrites, deletes, retention, tiering, cleaning and scrub all at once.

Runs SHINGLE_SOAK_S seconds (60 by default), then checks every surviving file's
sha256 (also after a restart) and that each zone's live bytes match a recount."""

from __future__ import annotations

import os
import random
import threading
import time

from engine.base import errors
from engine.catalog.models import Inode
from engine.lifecycle.cleaning import Cleaner
from engine.lifecycle.scrub import Scrubber
from engine.lifecycle.tiering import Tiering, TieringPolicy
from engine.namespace import ROOT
from engine.snapshots.retention import RetentionService

from .conftest import KiB, check_accounting, flip_bits, random_bytes, sha

SOAK_S = float(os.environ.get("SHINGLE_SOAK_S", "60"))
GONE = (errors.NotFound, errors.StaleHandle)


class Soak:
    def __init__(self, rig):
        self.rig = rig
        self.ns = rig.ns
        self.expected: dict[str, str] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.failures: list[str] = []
        self.counts: dict[str, int] = {}
        self.busy_paths: set[str] = set()

    def count(self, what: str, n: int = 1) -> None:
        with self.lock:
            self.counts[what] = self.counts.get(what, 0) + n

    def mkdirs(self, path: str):
        attr = self.ns.getattr(self.ns.root_ino)
        for part in [p for p in path.split("/") if p]:
            try:
                attr = self.ns.lookup(ROOT, attr.ino, part)
            except errors.NotFound:
                try:
                    attr = self.ns.mkdir(ROOT, attr.ino, part)
                except errors.Exists:
                    attr = self.ns.lookup(ROOT, attr.ino, part)
        return attr

    def write(
        self,
        path: str,
        data: bytes,
        *,
        chunk: int = 64 * KiB,
        band_class: str | None = None,
        unpin: bool = True,
    ) -> bool:
        parent, name = path.rsplit("/", 1)
        with self.lock:
            if path in self.busy_paths:
                return False  # the deleter is removing it: a name it unlinks must not be expected
            self.busy_paths.add(path)
        d = self.mkdirs(parent)
        made = self.ns.create(ROOT, d.ino, name, exclusive=False)
        self.ns.open_ref(made.ino)
        try:
            if band_class:
                table = Inode.__table__
                self.rig.catalog.run(
                    lambda c: c.execute(
                        table.update().where(table.c.ino == made.ino).values(band_class=band_class)
                    )
                )
            if made.size:
                self.ns.setattr(ROOT, made.ino, size=0)  # a rewrite: the old tail must go
            for pos in range(0, len(data), chunk):
                self.ns.write(made.ino, pos, data[pos : pos + chunk])
            self.ns.commit(made.ino)
            if band_class and unpin:
                table = Inode.__table__
                self.rig.catalog.run(
                    lambda c: c.execute(
                        table.update().where(table.c.ino == made.ino).values(band_class=None)
                    )
                )
        except errors.NoSpace:
            self.count("nospace")
            self.ns.close_ref(made.ino)
            with self.lock:
                # a rewrite truncated the old contents before it ran out of space, and the name
                # goes below: what was expected of it before is gone
                self.expected.pop(path, None)
                self.busy_paths.discard(path)
            try:
                self.ns.unlink(ROOT, d.ino, name)
                if path.startswith("/ckpt/"):
                    # the step directory goes too: retention counts step directories, and an empty
                    # one would take the place of a checkpoint the final check expects to be kept
                    grand, step = parent.rsplit("/", 1)
                    self.ns.rmdir(ROOT, self.ns.resolve(grand).ino, step)
            except GONE + (errors.NotEmpty,):
                pass
            time.sleep(0.2)  # let cleaning and retention free space
            return False
        with self.lock:
            self.expected[path] = sha(data)
            self.busy_paths.discard(path)
        self.ns.close_ref(made.ino)
        return True

    # -- actors ------------------------------------------------------------------
    def guard(self, name, fn):
        def loop():
            try:
                while not self.stop.is_set():
                    fn()
            except Exception as exc:  # noqa: BLE001 - reported by the test
                import traceback

                self.failures.append(f"{name}: {exc!r}\n{traceback.format_exc()}")
                self.stop.set()

        return threading.Thread(target=loop, name=f"soak-{name}", daemon=True)

    def checkpoint_writer(self, run: int):
        state = {"step": 0}

        def once():
            state["step"] += 1
            size = random.randint(60, 260) * KiB
            if self.write(
                f"/ckpt/run{run}/step-{state['step']}/model.pt",
                random_bytes(size, run * 100000 + state["step"]),
            ):
                self.count("checkpoints")

        return once

    def small_writer(self):
        state = {"n": 0}

        def once():
            state["n"] += 1
            data = random_bytes(random.randint(1, 40) * KiB, 500000 + state["n"])
            if self.write(f"/small/f{state['n'] % 40}", data, chunk=8 * KiB, band_class="hot"):
                self.count("small")

        return once

    def deleter(self):
        with self.lock:
            victims = [
                p for p in self.expected if p.startswith("/small/") and p not in self.busy_paths
            ]
        if victims:
            path = random.choice(victims)
            parent, name = path.rsplit("/", 1)
            with self.lock:
                if path in self.busy_paths:  # a writer took it since: it stays
                    return
                # busy while unlinking, so a writer cannot start on this name meanwhile
                self.busy_paths.add(path)
                self.expected.pop(path, None)
            try:
                self.ns.unlink(ROOT, self.ns.resolve(parent).ino, name)
                self.count("deletes")
            except GONE:
                pass
            finally:
                with self.lock:
                    self.busy_paths.discard(path)
        time.sleep(0.05)

    def reader(self):
        with self.lock:
            items = [(p, h) for p, h in self.expected.items() if p not in self.busy_paths]
        if not items:
            time.sleep(0.05)
            return
        path, digest = random.choice(items)
        try:
            attr = self.ns.resolve(path)
            data = self.ns.read(attr.ino, 0, attr.size)
        except GONE:
            return
        with self.lock:
            still = self.expected.get(path)
        if still == digest and sha(data) != digest:
            # it may have been rewritten in between: read the expectation again
            with self.lock:
                if self.expected.get(path) == digest and path not in self.busy_paths:
                    raise AssertionError(f"{path} read back wrong during the soak")
        self.count("reads")

    def every(self, seconds, fn):
        def once():
            fn()
            self.stop.wait(seconds)

        return once


def test_soak_everything_at_once(rig_factory):
    rig = rig_factory(drives=8, zones=48)
    soak = Soak(rig)
    retention = RetentionService(rig.ns, rig.catalog)
    retention.add_rule("/ckpt/*/step-*", keep=3, action="delete")
    tiering = Tiering(
        rig.ns, rig.data, rig.catalog, TieringPolicy(hot_to_warm_after_s=1, warm_to_cold_after_s=4)
    )
    cleaner = Cleaner(rig.data, rig.catalog)
    scrubber = Scrubber(rig.data, rig.catalog, bytes_per_s=20e6)

    # something for scrub to find: bits flipped in two fragments of a file nobody rewrites
    keep = random_bytes(300 * KiB, 77)
    soak.write("/keep/forever", keep, band_class="warm", unpin=False)  # pinned: tiering leaves it
    victims = rig.fragments()[:2]
    for fragment in victims:
        flip_bits(rig, fragment)

    def run_retention():
        for item in retention.run(actor="soak"):
            if item.outcome == "done":
                with soak.lock:
                    for path in [p for p in soak.expected if p.startswith(item.path + "/")]:
                        del soak.expected[path]
                soak.count("retention")

    def run_tiering():
        soak.count("tiered", tiering.run().files_moved)

    def run_cleaning():
        report = cleaner.run(max_zones=6)
        soak.count("cleaned", report.zones_cleaned)
        soak.count("repaired", report.fragments_rebuilt)  # cleaning met a flipped fragment first

    def run_scrub():
        soak.count("repaired", scrubber.run().repaired)

    threads = [
        soak.guard("ckpt0", soak.checkpoint_writer(0)),
        soak.guard("ckpt1", soak.checkpoint_writer(1)),
        soak.guard("small", soak.small_writer()),
        soak.guard("delete", soak.deleter),
        soak.guard("read", soak.reader),
        soak.guard("retention", soak.every(0.5, run_retention)),
        soak.guard("tier", soak.every(0.5, run_tiering)),
        soak.guard("clean", soak.every(0.3, run_cleaning)),
        soak.guard("scrub", soak.every(1.0, run_scrub)),
    ]
    for t in threads:
        t.start()
    soak.stop.wait(SOAK_S)
    soak.stop.set()
    for t in threads:
        t.join(120)
    assert not soak.failures, "\n".join(soak.failures)
    assert not [t.name for t in threads if t.is_alive()]
    print("soak counts:", soak.counts)
    for what in ("checkpoints", "small", "deletes", "retention", "tiered", "cleaned", "reads"):
        assert soak.counts.get(what, 0) > 0, (what, soak.counts)
    # the flipped fragments were repaired (by scrub, by cleaning, or by a read
    # that tripped over them)
    now = {f.id: f for f in rig.fragments()}
    for victim in victims:
        assert (now[victim.id].zone_id, now[victim.id].zone_offset) != (
            victim.zone_id,
            victim.zone_offset,
        )

    # quiet now: every file reads back, accounting matches a recount, also after a restart
    rig.data.flush_all()
    check_accounting(rig.catalog)
    for path, digest in soak.expected.items():
        assert sha(rig.read_file(path)) == digest, path
    assert Scrubber(rig.data, rig.catalog).run().bad == 0
    rig.restart()
    for path, digest in soak.expected.items():
        assert sha(rig.read_file(path)) == digest, path
    check_accounting(rig.catalog)
    # a last retention round leaves the newest 3 checkpoints of each run
    run_retention()
    for run in (0, 1):
        steps = [e.name for e in rig.ns.readdir(ROOT, rig.ns.resolve(f"/ckpt/run{run}").ino)[0]]
        newest = sorted(
            (p for p in soak.expected if p.startswith(f"/ckpt/run{run}/")),
            key=lambda p: int(p.split("step-")[1].split("/")[0]),
        )[-3:]
        assert sorted(steps) == sorted(p.split("/")[3] for p in newest)
    for path, digest in soak.expected.items():
        assert sha(rig.read_file(path)) == digest, path
    check_accounting(rig.catalog)
