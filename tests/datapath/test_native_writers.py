"""The compiled drive writers (engine/native/drivewriters.pyx): invariant 2 seen in the system
calls, queue order of calls behind appends, and a clean stop.

Their writes are made in C threads, so no Python patch can see them: the ordering test runs a
small workload under strace and reads the calls back."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from engine.native import driveio

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    driveio is None, reason="engine.native.drivewriters is not built (pip install -e .)"
)

WORKLOAD = textwrap.dedent(
    """
    import os, sys
    sys.path[:0] = [{repo!r}, {tests!r}]
    from dphelpers import Engine
    from engine.catalog.database import Catalog
    from engine.catalog.migrate import upgrade
    from engine.namespace import ROOT
    from engine.datapath import writers
    assert writers.driveio is not None
    url = "sqlite:///{tmp}/catalog.db"
    upgrade(url)
    engine = Engine(Catalog(url), {tmp!r} + "/drives")
    ns = engine.ns
    for i in range(4):
        ino = ns.create(ROOT, ns.root_ino, f"f{{i}}").ino
        data = os.urandom(8 * 64 * 1024 + 777 * i)
        for off in range(0, len(data), 100 * 1024):
            ns.write(ino, off, data[off : off + 100 * 1024])
        ns.commit(ino)
        assert ns.read(ino, 0, len(data)) == data
    engine.close()
    print("ok")
    """
)
# a batch: a queued call holds the writer until all three appends are queued behind it (the
# appends wait until the call runs, so the writer took the call alone and finds all three in
# its next batch); the ticket's completion shows in the trace as a lookup of a marker path
BATCH = textwrap.dedent(
    """
    import os, sys, threading
    sys.path[:0] = [{repo!r}]
    from engine.native import driveio
    from engine.datapath.writers import WriteTicket
    class Ticket(WriteTicket):
        __slots__ = ()
        def all_written(self):
            os.path.exists("/ticket-complete-marker")
            super().all_written()
    fd = os.open({zone!r}, os.O_RDWR | os.O_CREAT, 0o600)
    queue = driveio.DriveQueue(lambda *args: None)
    entered, gate = threading.Event(), threading.Event()
    def hold():
        entered.set()
        gate.wait()
    queue.call(hold)
    assert entered.wait(30)
    ticket = Ticket(3)
    for i in range(3):
        queue.append(fd, i * 65536, os.urandom(65536), ticket, 0)
    gate.set()
    assert ticket.written.wait(30)
    queue.stop()
    print("ok")
    """
)
CALL = re.compile(
    r"^(\d+)\s+(pwrite64|pwritev2|fdatasync|fsync|newfstatat|stat)\("
    r"(\d+<[^>]*>|AT_FDCWD(?:<[^>]*>)?, \"[^\"]*\"|\"[^\"]*\")(.*)$"
)
RESUMED = re.compile(
    r"^(\d+)\s+<\.\.\. (pwrite64|pwritev2|fdatasync|fsync|newfstatat|stat) resumed>(.*)$"
)


def strace(tmp_path: Path, script_text: str) -> list[tuple[str, str, str]]:
    script = tmp_path / "traced.py"
    script.write_text(script_text)
    log = tmp_path / "strace.log"
    proc = subprocess.run(
        [
            "strace",
            "-f",
            "-y",
            "-qq",
            "-e",
            "trace=pwrite64,pwritev2,fdatasync,fsync,newfstatat,stat",
            "-o",
            str(log),
            sys.executable,
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]
    return traced_calls(log.read_text())


def target(arg: str) -> str:
    """The path a traced call names: FD<path>, or "path" (after AT_FDCWD)."""
    if '"' in arg:
        return arg.split('"')[1]
    return arg[arg.index("<") + 1 : -1]


def traced_calls(log: str) -> list[tuple[str, str, str]]:
    """(call, path, rest) in order of completion; an unfinished call completes where it
    resumes."""
    pending: dict[tuple[str, str], tuple[str, str]] = {}
    calls = []
    for line in log.splitlines():
        m = CALL.match(line)
        if m:
            pid, name, arg, rest = m.groups()
            path = target(arg)
            if rest.endswith("<unfinished ...>"):
                pending[(pid, name)] = (path, rest)
            else:
                calls.append((name, path, rest))
            continue
        m = RESUMED.match(line)
        if m:
            pid, name, rest = m.groups()
            path, head = pending.pop((pid, name))
            calls.append((name, path, head + rest))
    return calls


@pytest.fixture(autouse=True)
def _strace_present():
    if shutil.which("strace") is None:
        pytest.fail("strace is missing (scripts/bootstrap.sh installs it)")


def test_every_fragment_is_durable_before_the_catalog_commit_after_it(tmp_path):
    calls = strace(
        tmp_path,
        WORKLOAD.format(repo=str(REPO), tests=str(REPO / "tests" / "datapath"), tmp=str(tmp_path)),
    )
    zone_writes = [c for c in calls if "/zone-" in c[1] and c[0].startswith("pwrite")]
    assert len(zone_writes) >= 4 * 10, "every stripe's ten fragments were written"
    wal_syncs = [c for c in calls if c[1].endswith("catalog.db-wal") and c[0] != "pwrite64"]
    assert len(wal_syncs) >= 4, "each file's commit synced the catalog's WAL"
    not_durable: dict[str, int] = {}  # zone file -> plain writes not yet covered by an fdatasync
    for name, path, rest in calls:
        if "/zone-" in path:
            if name == "pwritev2" and "RWF_DSYNC" in rest:
                continue  # durable when it returns
            if name == "pwrite64":
                not_durable[path] = not_durable.get(path, 0) + 1
            else:
                not_durable.pop(path, None)
        elif path.endswith("catalog.db-wal") and name in ("fsync", "fdatasync"):
            # a durable catalog commit: nothing written before it may still be volatile
            assert not not_durable, f"committed while {sorted(not_durable)} had unsynced writes"
    for path in (tmp_path / "drives").glob("*"):
        shutil.rmtree(path, ignore_errors=True)


def test_a_batch_of_appends_is_synced_before_its_ticket_completes(tmp_path):
    zone = str(tmp_path / "zone")
    calls = strace(tmp_path, BATCH.format(repo=str(REPO), zone=zone))
    mine = [c for c in calls if c[1] in (zone, "/ticket-complete-marker")]
    names = [c[0] if c[1] == zone else "marker" for c in mine]
    # three plain writes in one batch, one fdatasync for the zone file, then the completion
    assert names[:5] == ["pwrite64", "pwrite64", "pwrite64", "fdatasync", "marker"], names


def test_a_queued_call_runs_after_every_earlier_append_is_durable(tmp_path):
    from engine.datapath.writers import WriteTicket

    path = tmp_path / "zone"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    seen = []
    done = threading.Event()
    errors_seen = []
    queue = driveio.DriveQueue(lambda *args: errors_seen.append(args))
    try:
        ticket = WriteTicket(3)
        for i in range(3):
            queue.append(fd, i * 4096, bytes([i]) * 4096, ticket, 0)

        def after():
            seen.append((ticket.written.is_set(), os.fstat(fd).st_size))
            done.set()

        queue.call(after)
        assert done.wait(10)
        assert seen == [(True, 3 * 4096)]
        assert os.pread(fd, 3 * 4096, 0) == b"\0" * 4096 + b"\1" * 4096 + b"\2" * 4096
        counters = queue.counters()
        assert counters["appends"] == 3 and counters["bytes"] == 3 * 4096
        assert counters["syncs"] >= 1
        assert errors_seen == []
    finally:
        queue.stop()
        os.close(fd)


def test_a_failed_append_reports_its_error_before_its_ticket_completes(tmp_path):
    from engine.datapath.writers import WriteTicket

    path = tmp_path / "zone"
    path.write_bytes(b"")
    fd = os.open(path, os.O_RDONLY)  # a real error: pwrite on a read-only descriptor is EBADF
    order = []

    class Ticket(WriteTicket):
        __slots__ = ()

        def all_written(self):
            order.append(("written", self.error))
            super().all_written()

    def on_error(ticket, zone_idx, err, during):
        order.append(("error", zone_idx, err, during))
        ticket.fail(OSError(err, os.strerror(err)))

    queue = driveio.DriveQueue(on_error)
    try:
        ticket = Ticket(1)
        queue.append(fd, 0, b"x" * 512, ticket, 7)
        assert ticket.written.wait(10)
        assert order[0] == ("error", 7, 9, "write")  # EBADF
        assert order[1][0] == "written" and isinstance(order[1][1], OSError)
    finally:
        queue.stop()
        os.close(fd)


def test_stop_finishes_what_was_queued_and_refuses_more(tmp_path):
    from engine.datapath.writers import WriteTicket

    fd = os.open(tmp_path / "zone", os.O_RDWR | os.O_CREAT, 0o600)
    queue = driveio.DriveQueue(lambda *args: None)
    ticket = WriteTicket(50)
    for i in range(50):
        queue.append(fd, i * 65536, os.urandom(65536), ticket, 0)
    queue.stop()
    try:
        assert ticket.written.is_set() and ticket.remaining == 0
        assert os.fstat(fd).st_size == 50 * 65536
        with pytest.raises(RuntimeError):
            queue.append(fd, 0, b"late", WriteTicket(1), 0)
        queue.stop()  # idempotent
    finally:
        os.close(fd)
