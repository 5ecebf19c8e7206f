"""Engine process for the crash test: 8 writers append deterministic streams and report each commit.

``run`` writes ``C <name> <length>`` lines to a file descriptor after every committed flush, then
keeps the process alive until it is killed. The crash test forks into it (imports already done);
``python crash_child.py CATALOG_URL ROUND`` runs it by hand with stdout."""

from __future__ import annotations

import os
import random
import sys
import threading

from engine.catalog import Catalog
from engine.coding.erasure import load_policies
from engine.datapath import DataPath
from engine.namespace import ROOT, Namespace

WRITERS = 8
STREAM = 1024 * 1024  # long enough that most kills land mid-write as the engine gets faster
POLICIES = {
    "warm": {"fragment_size": 4096},
    "cold": {"fragment_size": 4096},
    "hot": {"fragment_size": 4096},
}


def stream(round_no: int, writer: int) -> bytes:
    return random.Random(f"{round_no}-{writer}").randbytes(STREAM)


def run(url: str, round_no: int, out: int) -> None:
    def say(line: str) -> None:
        os.write(out, (line + "\n").encode())

    catalog = Catalog(url)
    data = DataPath(catalog, load_policies(POLICIES), reserve_zones=1)
    ns = Namespace(catalog, data=data)
    lock = threading.Lock()

    def writer(i):
        name = f"r{round_no}-w{i}"
        ino = ns.create(ROOT, ns.root_ino, name).ino
        content = stream(round_no, i)
        rng = random.Random(i)
        pos = 0
        while pos < len(content):
            n = min(rng.randint(1, 40_000), len(content) - pos)
            ns.write(ino, pos, content[pos : pos + n], stable=rng.random() < 0.2)
            pos += n
            if rng.random() < 0.3:
                ns.commit(ino)
                with lock:
                    say(f"C {name} {pos}")
        ns.commit(ino)
        with lock:
            say(f"C {name} {pos}")

    say("READY")
    threads = [threading.Thread(target=writer, args=(i,)) for i in range(WRITERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    say("DONE")
    threading.Event().wait()  # stay alive until killed, like a running server


if __name__ == "__main__":
    run(sys.argv[1], int(sys.argv[2]), sys.stdout.fileno())
