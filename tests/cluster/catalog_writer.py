"""A head's writers, run in a host of the cluster test bed: each creates files through the
shingle namespace on a PostgreSQL catalog and logs every outcome, one JSON line each, to OUT.

    python catalog_writer.py URL OUT [--writers N] [--prefix P]

Lines: {"ack": NAME, "writer": W, "t0": T0, "t": T} once the create (started at T0) returned
(acknowledged: it must be there afterwards); {"error": TEXT, "kind": CLASS, "name": NAME,
"t": T} once it raised (it may or may not be there: the commit may have happened before the
connection was lost); at the end {"done": true, "watch": BOOL}, BOOL telling whether the
catalog's change watch caught up after everything. T is time.monotonic(), the same clock as
the test's. Runs until stdin closes."""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

from engine.catalog import Catalog, CatalogUnavailable
from engine.namespace import ROOT, Namespace

RETRY_PAUSE_S = 0.1  # after a failed write: the catalog is failing over


class Log:
    def __init__(self, path: str):
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 - closed by close()
        self._lock = threading.Lock()

    def write(self, **record) -> None:
        with self._lock:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()

    def close(self) -> None:
        self._file.close()


def write_until(namespace: Namespace, log: Log, writer: int, prefix: str, stop: threading.Event):
    seq = 0
    while not stop.is_set():
        seq += 1
        name = f"{prefix}-{writer}-{seq}"
        started = time.monotonic()
        try:
            namespace.create(ROOT, namespace.root_ino, name)
        except CatalogUnavailable as exc:
            log.write(error=str(exc)[:200], kind=type(exc).__name__, name=name, t=time.monotonic())
            stop.wait(RETRY_PAUSE_S)
            continue
        except Exception as exc:  # noqa: BLE001 - anything else is a finding: logged, the test fails
            log.write(error=repr(exc)[:300], kind=type(exc).__name__, name=name, t=time.monotonic())
            stop.wait(RETRY_PAUSE_S)
            continue
        log.write(ack=name, writer=writer, t0=started, t=time.monotonic())


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("out")
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--prefix", default="w")
    args = parser.parse_args(argv)
    log = Log(args.out)
    catalog = Catalog(args.url)
    namespace = Namespace(catalog)
    catalog.epoch()  # starts the change watch, as a head's first cached lookup does
    stop = threading.Event()
    writers = [
        threading.Thread(target=write_until, args=(namespace, log, i, args.prefix, stop))
        for i in range(args.writers)
    ]
    for thread in writers:
        thread.start()
    log.write(started=True, t=time.monotonic())
    sys.stdin.read()  # until the test closes it
    stop.set()
    for thread in writers:
        thread.join()
    log.write(done=True, watch=catalog.catch_up(timeout=15.0), t=time.monotonic())
    catalog.close()
    log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
