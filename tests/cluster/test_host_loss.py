"""Hosts lost during 8 checkpoint writers, on the test bed.

12 drive agents, each in a host (network namespace) of its own on the bed's bridge, one small
drive each; a head (catalog on SQLite, DataPath and Namespace of this process) whose every
socket is opened by threads inside a host of its own (``Bed.call``: threads started there stay
there), so every byte between head and agents crosses the bed's veth pairs. The head runs the
engine's namespace API, not NFS: `shingle init` gives a head at least 10 local drives of its own
(the bands' k+m), which placement would count as one more host beside the agents
(test_host_loss_nfs.py runs the NFS server in the test process over agents only instead).

8 writers each write a 2 MiB checkpoint to a temporary name, commit it (the fsync of a
checkpoint) and rename it into place, in a loop. During the writes one agent is killed with
SIGKILL, then a second, then a third host's link is cut (the bridge's end of its veth down: no
RST, nothing answers). Checked:

- every write+commit+rename either returned (acknowledged) or raised a clean EIO, and none
  took longer than a bound (the request time limit plus margin): no hang, no other error;
- writes go on after each loss (over the remaining hosts);
- with three hosts lost every acknowledged file reads back byte-identical or raises EIO (never
  wrong bytes), and the third host is chosen so that some stripe has lost three fragments;
- with its link back (two hosts lost) every acknowledged file reads back byte-identical;
- with the killed agents restarted on their drives, every acknowledged file under its final
  name (its sha256), no final name of a failed write, and fsck clean.

The request time limit of the head's agent connections is 5 s here (30 s by default) so that a
cut link costs seconds, not half a minute; keepalive and the limit are tested on their own in
test_host_link.py and test_agents.py."""

from __future__ import annotations

import errno
import hashlib
import os
import sys
import threading
import time
from dataclasses import dataclass, field

from agenthelpers import REPO, SERVING, AgentHead, MiB
from test_agents import hosts_of_stripes

from engine.admin import fsck
from engine.base import errors
from engine.drives.remote import CONNECT_TIMEOUT_S
from engine.namespace import ROOT

AGENTS = 12
WRITERS = 8
PORT = 7400
FILE_SIZE = 2 * MiB
CHUNK = 512 * 1024  # a checkpoint is written in pieces
REQUEST_LIMIT_S = 5.0
# the writers never stop between phases: room for a slow machine's longer phases (sparse files,
# so the disk holds only what is written)
DRIVE_SIZE = "128MiB"
# one write+commit+rename, however the losses fall on it: a request's limit, then one connect
# to the cut host (no SYN answered), and a margin for a loaded machine
WRITE_BOUND_S = REQUEST_LIMIT_S + CONNECT_TIMEOUT_S + 11
PHASE_TIMEOUT_S = 60.0


def content(name: str) -> bytes:
    seed = hashlib.sha256(name.encode()).digest()
    block = b"".join(hashlib.sha256(seed + i.to_bytes(4, "big")).digest() for i in range(32))
    return (block * (FILE_SIZE // len(block) + 1))[:FILE_SIZE]


@dataclass
class BedAgent:
    """`shingle agent` in a bed host of its own, listening on the host's bed address."""

    bed: object
    name: str
    proc: object = None

    @property
    def host(self):
        return self.bed.hosts[self.name]

    @property
    def address(self) -> str:
        return f"{self.host.address}:{PORT}"

    @property
    def log(self):
        return self.host.folder / "agent.log"

    def start(self) -> BedAgent:
        self.log_from = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as out:
            self.proc = self.bed.run(
                self.name,
                [sys.executable, "-m", "appliance.cli", "agent", "--listen", self.address,
                 "--host", self.name, "--format", "--drive-size", DRIVE_SIZE, "--zone-size",
                 "1MiB", "--no-preallocate", "--drives", str(self.host.folder / "d0")],
                env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=out, stderr=out, cwd=REPO,
            )  # fmt: skip
        return self

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while SERVING not in self.log.read_bytes()[self.log_from :].decode(errors="replace"):
            assert self.proc.poll() is None, self.log.read_text()[-2000:]
            assert time.monotonic() < deadline, f"agent {self.name} not serving"
            time.sleep(0.1)

    def kill(self) -> None:
        """kill -9 (the process `ip netns exec` became)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@dataclass
class Writer:
    index: int
    acked: dict[str, tuple[float, float]] = field(default_factory=dict)  # name -> (began, done)
    failed: dict[str, tuple[float, float, int]] = field(default_factory=dict)  # + errno
    wrong: list[str] = field(default_factory=list)  # anything but a clean EIO

    def finished_after(self, moment: float) -> int:
        return sum(
            1 for began, *_ in [*self.acked.values(), *self.failed.values()] if began > moment
        )

    def acked_after(self, moment: float) -> int:
        return sum(1 for began, _ in self.acked.values() if began > moment)

    def run(self, head: AgentHead, stop: threading.Event) -> None:
        ns, seq = head.ns, 0
        while not stop.is_set():
            seq += 1
            name = f"ckpt-{self.index}-{seq}"
            data = content(name)
            began = time.monotonic()
            try:
                ino = ns.create(ROOT, ns.root_ino, name + ".tmp").ino
                for at in range(0, FILE_SIZE, CHUNK):
                    ns.write(ino, at, data[at : at + CHUNK])
                ns.commit(ino)
                ns.rename(ROOT, ns.root_ino, name + ".tmp", ns.root_ino, name)
            except errors.FsError as exc:
                self.failed[name] = (began, time.monotonic(), exc.errno)
                if exc.errno != errno.EIO:
                    self.wrong.append(f"{name}: {exc!r}")
                continue
            except Exception as exc:  # noqa: BLE001 - reported by the test
                self.failed[name] = (began, time.monotonic(), -1)
                self.wrong.append(f"{name}: {exc!r}")
                continue
            self.acked[name] = (began, time.monotonic())


def wait_until(ready, writers: list[Writer], what: str) -> float:
    started = time.monotonic()
    while not ready():
        assert not [w.wrong for w in writers if w.wrong], [w.wrong for w in writers]
        assert time.monotonic() - started < PHASE_TIMEOUT_S, what
        time.sleep(0.05)
    return time.monotonic() - started


def read_or_eio(head: AgentHead, name: str) -> bytes | None:
    """The file's bytes, or None for a clean EIO."""
    ns = head.ns
    try:
        ino = ns.lookup(ROOT, ns.root_ino, name).ino
        return bytes(ns.read(ino, 0, FILE_SIZE + 1))
    except errors.FsError as exc:
        assert exc.errno == errno.EIO, f"{name}: {exc!r}"
        return None


def third_host(catalog, lost: set[str], candidates: list[str]) -> str:
    """A host holding a fragment of a stripe that has fragments on both lost hosts."""
    for per_host in hosts_of_stripes(catalog).values():
        if lost <= set(per_host):
            for name in candidates:
                if name in per_host:
                    return name
    raise AssertionError("no stripe spans both lost hosts")


def test_hosts_killed_and_cut_during_eight_checkpoint_writers(
    healed_bed, sqlite_catalog, monkeypatch
):
    from engine.drives import remote

    monkeypatch.setattr(remote, "REQUEST_TIMEOUT_S", REQUEST_LIMIT_S)
    bed = healed_bed
    head_host = "hlhead"
    bed.add_host(head_host)
    agents = [BedAgent(bed, f"hlagent{i:02d}") for i in range(AGENTS)]
    for agent in agents:
        bed.add_host(agent.name)
    head: AgentHead | None = None
    writers = [Writer(k) for k in range(WRITERS)]
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        at = time.monotonic()
        for agent in agents:
            agent.start()
        for agent in agents:
            agent.wait_ready()
        print(f"\n12 agents serving after {time.monotonic() - at:.1f} s")
        head = bed.call(head_host, lambda: AgentHead(sqlite_catalog, agents))

        def start_writers() -> list[threading.Thread]:  # in the head's namespace: they stay there
            started = [threading.Thread(target=w.run, args=(head, stop)) for w in writers]
            for thread in started:
                thread.start()
            return started

        began = time.monotonic()
        threads = bed.call(head_host, start_writers)
        timeline = {
            "warm_up_s": wait_until(
                lambda: all(w.acked for w in writers), writers, "every writer acknowledged once"
            )
        }
        killed_a, killed_b = agents[2], agents[7]
        moments = {}
        for label, lose in (("first_killed", killed_a.kill), ("second_killed", killed_b.kill)):
            moments[label] = time.monotonic()
            lose()
            timeline[label + "_then_one_each_s"] = wait_until(
                lambda m=moments[label]: all(w.finished_after(m) for w in writers),
                writers, f"every writer finished a write after: {label}",
            )  # fmt: skip
        cut = third_host(
            sqlite_catalog, {killed_a.name, killed_b.name},
            [a.name for a in agents if a not in (killed_a, killed_b)],
        )  # fmt: skip
        moments["link_cut"] = time.monotonic()
        bed.cut_link(cut)
        timeline["link_cut_then_one_each_s"] = wait_until(
            lambda: all(w.finished_after(moments["link_cut"]) for w in writers),
            writers, "every writer finished a write after the link cut",
        )  # fmt: skip
        timeline["after_cut_acked_s"] = wait_until(
            lambda: sum(w.acked_after(moments["link_cut"]) for w in writers) >= WRITERS,
            writers, "writes go on over the remaining nine hosts",
        )  # fmt: skip
        stop.set()
        for thread in threads:
            thread.join(PHASE_TIMEOUT_S)
        assert not [t for t in threads if t.is_alive()], "a writer hangs"
        timeline["writes_s"] = time.monotonic() - began
        assert not [w.wrong for w in writers if w.wrong], [w.wrong for w in writers]
        durations = [done - start for w in writers for start, done, *_ in
                     [*w.acked.values(), *w.failed.values()]]  # fmt: skip
        assert max(durations) < WRITE_BOUND_S, f"a write took {max(durations):.1f} s"
        for label, moment in moments.items():
            assert sum(w.acked_after(moment) for w in writers) > 0, f"no write went on: {label}"
        acked = {name for w in writers for name in w.acked}
        failed = {name for w in writers for name in w.failed}

        # three hosts lost: the right bytes or a clean EIO, and some stripe lost three fragments
        def read_all() -> dict[str, bytes | None]:
            head.data.reader.drop_cache()
            return {name: read_or_eio(head, name) for name in sorted(acked)}

        at = time.monotonic()
        three_lost = bed.call(head_host, read_all)
        timeline["read_three_lost_s"] = time.monotonic() - at
        wrong = [n for n, got in three_lost.items() if got is not None and got != content(n)]
        assert not wrong, f"wrong bytes with three hosts lost: {wrong}"
        eio = [n for n, got in three_lost.items() if got is None]
        assert eio, "no read met the third loss"

        # two hosts lost (the link back): every acknowledged byte decodes
        bed.restore_link(cut)

        def all_but_killed_online() -> bool:
            head.data.check_drives()
            return sum(d.state == "online" for d in head.data.space.drives.values()) >= 10

        deadline = time.monotonic() + 60
        while not bed.call(head_host, all_but_killed_online):
            assert time.monotonic() < deadline, "the cut host's drive not back"
            time.sleep(0.5)
        at = time.monotonic()
        two_lost = bed.call(head_host, read_all)
        timeline["read_two_lost_s"] = time.monotonic() - at
        wrong = [n for n, got in two_lost.items() if got != content(n)]
        assert not wrong, f"{len(wrong)} acknowledged files unreadable with two hosts lost"

        # the killed agents back on their drives: every byte, every rename, fsck clean
        at = time.monotonic()
        for agent in (killed_a, killed_b):
            agent.start()
        for agent in (killed_a, killed_b):
            agent.wait_ready()
        deadline = time.monotonic() + 60

        def all_online() -> bool:
            head.data.check_drives()
            return all(d.state == "online" for d in head.data.space.drives.values())

        while not bed.call(head_host, all_online):
            assert time.monotonic() < deadline, "the killed agents' drives not back"
            time.sleep(0.5)

        def names() -> set[str]:
            entries, complete = head.ns.readdir(ROOT, head.ns.root_ino, limit=100_000)
            assert complete
            return {entry.name for entry in entries}

        timeline["agents_back_s"] = time.monotonic() - at
        whole = bed.call(head_host, read_all)
        assert {n for n, got in whole.items() if got != content(n)} == set()
        listed = bed.call(head_host, names)
        assert acked <= listed and not (failed & listed), "a rename lost or a failed one shown"
        report = fsck.check(sqlite_catalog, head.ns.root_ino)
        assert report.clean, report.problems[:10]
        rounded = {k: round(v, 1) for k, v in timeline.items()}
        print(
            f"\n12 hosts, 8 writers of {FILE_SIZE // MiB} MiB checkpoints: {len(acked)} "
            f"acknowledged, {len(failed)} failed with EIO, longest write "
            f"{max(durations):.1f} s, {len(eio)} of {len(acked)} reads EIO with three hosts "
            f"lost; {rounded}"
        )
    finally:
        stop.set()
        for thread in threads:
            thread.join(PHASE_TIMEOUT_S)
        if head is not None:
            head.close()
        for agent in agents:
            agent.kill()
