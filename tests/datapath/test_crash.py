"""SIGKILL at a random moment while 8 writers write; after each restart every
committed byte is there."""

from __future__ import annotations

import os
import random
import signal
import time

from crash_child import POLICIES, run, stream
from dphelpers import check_accounting
from migrated import migrate_sqlite

from engine.catalog import Catalog
from engine.coding.erasure import load_policies
from engine.datapath import DataPath
from engine.drives import format_emulated
from engine.namespace import ROOT, Namespace

ROUNDS = 20
RNG = random.Random(1234)


def fork_child(url: str, round_no: int) -> str:
    """Run the engine in a forked child (imports already paid), SIGKILL it at a random moment,
    and return what it reported."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the engine process
        try:
            os.close(read_end)
            run(url, round_no, write_end)
        finally:
            os._exit(1)
    os.close(write_end)
    reader = os.fdopen(read_end, "rb")
    first = reader.readline()
    assert first.strip() == b"READY", first
    time.sleep(RNG.uniform(0.02, 0.35))
    os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
    rest = reader.read().decode()
    reader.close()
    return rest


def test_sigkill_at_random_moments_loses_no_committed_byte(tmp_path):
    url = f"sqlite:///{tmp_path}/catalog.db"
    migrate_sqlite(url)
    catalog = Catalog(url)
    format_emulated(catalog, tmp_path / "drives", 10, 32 << 20, 1 << 20)
    committed: dict[str, int] = {}
    kills_mid_write = 0
    policies = load_policies(POLICIES)
    for round_no in range(ROUNDS):
        out = fork_child(url, round_no)
        lines = out.splitlines()
        kills_mid_write += "DONE" not in lines
        for line in lines:
            if line.startswith("C "):
                _, name, length = line.split()
                committed[name] = max(committed.get(name, 0), int(length))

        data = DataPath(catalog, policies, reserve_zones=1)
        try:
            ns = Namespace(catalog, data=data)
            for entry in ns.readdir(ROOT, ns.root_ino, limit=10_000)[0]:
                r, w = entry.name[1:].split("-w")
                expected = stream(int(r), int(w))
                size = entry.attr.size
                assert size >= committed.get(entry.name, 0), f"{entry.name}: committed bytes lost"
                assert size <= len(expected)
                got = ns.read(entry.attr.ino, 0, size)
                # every byte is one that was written there: the file is a prefix of its stream
                assert got == expected[:size], (
                    f"{entry.name}: {size} bytes differ from what was written"
                )
            for name in committed:
                ns.lookup(ROOT, ns.root_ino, name)
            check_accounting(catalog)
        finally:
            data.close()
    assert kills_mid_write >= ROUNDS // 2, (
        f"only {kills_mid_write} of {ROUNDS} kills landed while writers were busy"
    )
    catalog.close()
