"""A maintenance leader as a process of its own, for the test bed (tests/cluster/bed.py): it
campaigns through etcd, raises the catalog's fence when it takes office, then writes a row every
50 ms inside ``catalog.fenced(token)`` until its stdin closes, one JSON line per attempt:

    {"following": HOLDER, "t": ...}  (once, when a campaign lost to HOLDER: this one is up)
    {"elected": TOKEN, "t": ...}  {"ok": SEQ, "t0": ...}  {"fenced": SEQ, "t0": ..., "why": ...}
    {"error": KIND, "t0": ..., "why": ...}

``t0`` is the wall clock when the attempt started. ``--ignore-lease`` writes as a leader that
has not noticed its lease is gone (paused, its clock wrong): only the catalog's fence stops it.
The election's own log lines (each campaign's outcome) go to stderr.

    python leader_writer.py ENDPOINTS NAME CATALOG_URL OUT [--ttl 4] [--ignore-lease]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time

from sqlalchemy import text

from engine.catalog import Catalog
from engine.catalog import fence as leader_fence
from engine.catalog.fence import LeaderFenced
from engine.cluster.etcd import EtcdClient
from engine.cluster.leader import FencedLeader


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("endpoints")
    parser.add_argument("name")
    parser.add_argument("url")
    parser.add_argument("out")
    parser.add_argument("--ttl", type=float, default=4.0)
    parser.add_argument("--ignore-lease", action="store_true")
    args = parser.parse_args()
    # the election's own lines (campaign, office taken or refused) on stderr, for a failing test
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(created).3f %(name)s %(message)s"
    )
    logging.getLogger("shingle.cluster").setLevel(logging.DEBUG)  # each campaign's outcome
    catalog = Catalog(args.url)
    out = open(args.out, "a", buffering=1)
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()

    def note(record: dict) -> None:
        out.write(json.dumps(record) + "\n")

    def take_office(token: int) -> bool:
        logging.info("won the leader key (token %d): raising the fence", token)
        return leader_fence.advance(catalog, token, args.name)

    leader = FencedLeader(
        EtcdClient(args.endpoints.split(","), timeout_s=1.0),
        args.name,
        ttl_s=args.ttl,
        on_elected=take_office,
    ).start()
    token = None
    following = None
    while token is None and not stop.is_set():
        token = leader.wait_elected(0.5)
        holder = leader.state().leader_name
        if token is None and following is None and holder not in (None, args.name):
            following = holder  # campaigning, and lost to the holder: the test may go on
            note({"following": holder, "t": time.time()})
    if token is None:
        return 0
    note({"elected": token, "t": time.time()})
    term = token

    def still_leader() -> bool:
        return args.ignore_lease or leader.token == term

    seq = 0
    while not stop.wait(0.05):
        seq += 1
        started = time.time()
        try:
            with catalog.fenced(term, still_leader):
                catalog.run(
                    lambda conn, n=seq: conn.execute(
                        text("INSERT INTO leader_writes (holder, seq) VALUES (:h, :s)"),
                        {"h": args.name, "s": n},
                    )
                )
            note({"ok": seq, "t0": started})
        except LeaderFenced as exc:
            note({"fenced": seq, "t0": started, "why": str(exc)})
        except Exception as exc:  # noqa: BLE001 - reported: the test tells what it expects
            note({"error": type(exc).__name__, "t0": started, "why": str(exc)[:300]})
    leader.stop(resign=False)
    catalog.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
