"""How long a recall takes across heads (docs/delegations.md, "Across heads"): two `shingle
serve` heads over one SQLite catalog (or PostgreSQL, `--catalog postgresql`: a server the
bench starts). Per file, a raw NFSv4.1 client with a backchannel takes
a read delegation, another client OPENs the file for writing (NFS4ERR_DELAY), the holder
returns the delegation as soon as its CB_RECALL arrives, and the writer retries every 10 ms
until its OPEN is granted. Two layouts, alternated file by file over the same two heads:

- same head: holder and writer both through head 1 (the recall is sent at the conflict);
- across heads: holder through head 0, writer through head 1 (head 1 writes a recall request
  and wakes head 0: a notification on PostgreSQL, a datagram on SQLite; head 0 recalls).

Printed per layout: the median and 90th percentile of the time from the writer's first OPEN
to the holder's CB_RECALL, and to the writer's granted OPEN, and of the holder's OPEN that got
the delegation (on PostgreSQL it waits for the other head's answer to the grant's fence); and
the two heads' CPU while idle
(a delegation held, nothing asked: the cost of each head's poll for recall requests).

    .venv/bin/python bench/heads_delegations.py [--files 40] [--catalog postgresql] [--json F]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "nfs"))
sys.path.insert(0, str(REPO / "tests"))  # pgserver

from test_delegations import CallbackClient, make_file, read_delegation  # noqa: E402

from appliance.nfs.v4 import const as c  # noqa: E402
from appliance.nfs.v4 import types as t  # noqa: E402
from bench.heads_locks import Heads  # noqa: E402


def _recall(
    holder: CallbackClient, writer: CallbackClient, name: str
) -> tuple[float, float, float]:
    """(seconds to the CB_RECALL, seconds to the writer's granted OPEN, seconds the holder's
    OPEN that got the delegation took) for file ``name``."""
    opened = time.monotonic()
    st, res = holder.open_file(name, c.OPEN4_SHARE_ACCESS_READ)
    open_s = time.monotonic() - opened
    assert st == 0 and res[2][2].delegation[0] == c.OPEN_DELEGATE_READ, (st, res)
    fh, open_sid = res[3][2], res[2][2].stateid
    dsid = res[2][2].delegation[1].stateid
    close = (c.OP_CLOSE, t.ARGS[c.OP_CLOSE](0, open_sid))
    assert holder.session([(c.OP_PUTFH, fh), close])[0] == 0
    holder.callbacks.clear()
    began = time.monotonic()
    assert writer.open_file(name, c.OPEN4_SHARE_ACCESS_WRITE, owner=b"w")[0] == c.NFS4ERR_DELAY
    while not holder.recalls():
        holder.session([])  # callbacks arrive among the replies
        time.sleep(0.002)
        assert time.monotonic() - began < 30, "no recall"
    recalled = time.monotonic() - began
    assert holder.session([(c.OP_PUTFH, fh), (c.OP_DELEGRETURN, dsid)])[0] == 0
    while (st := writer.open_file(name, c.OPEN4_SHARE_ACCESS_WRITE, owner=b"w")[0]) != 0:
        assert st == c.NFS4ERR_DELAY, st
        time.sleep(0.01)
    return recalled, time.monotonic() - began, open_s


def _summary(samples: list[tuple[float, float, float]]) -> dict:
    def pct(values, q):
        values = sorted(values)
        return values[min(len(values) - 1, int(q * len(values)))]

    recall = [s[0] * 1000 for s in samples]
    through = [s[1] * 1000 for s in samples]
    grant = [s[2] * 1000 for s in samples]
    return {
        "recall_ms_p50": round(statistics.median(recall), 1),
        "recall_ms_p90": round(pct(recall, 0.9), 1),
        "granted_ms_p50": round(statistics.median(through), 1),
        "granted_ms_p90": round(pct(through, 0.9), 1),
        "grant_open_ms_p50": round(statistics.median(grant), 2),
        "grant_open_ms_p90": round(pct(grant, 0.9), 2),
        "files": len(samples),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=40, help="per layout")
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of idle CPU measured")
    parser.add_argument("--catalog", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="shingle-bench-heads-deleg-"))
    pg = None
    if args.catalog == "postgresql":
        from pgserver import PostgresServer

        pg = PostgresServer().start()
    heads = Heads(folder, 2, pg.create_database() if pg is not None else None)
    clients: list[CallbackClient] = []
    try:
        heads.start()
        for i in range(2 * args.files):
            make_file(heads.ports[1], f"f{i}")
        make_file(heads.ports[1], "f-idle")
        across_holder = CallbackClient(heads.ports[0]).setup()
        same_holder = CallbackClient(heads.ports[1]).setup()
        writer = CallbackClient(heads.ports[1], back_channel=False).setup()
        clients = [across_holder, same_holder, writer]
        samples: dict[str, list] = {"same head": [], "across heads": []}
        for i in range(2 * args.files):
            layout = "across heads" if i % 2 else "same head"
            holder = across_holder if i % 2 else same_holder
            samples[layout].append(_recall(holder, writer, f"f{i}"))
        # what the polling costs while nothing happens (delegations held, no request)
        read_delegation(across_holder, "f-idle")
        cpu0 = heads.cpu()
        time.sleep(args.idle)
        idle_cpu = (heads.cpu() - cpu0) / args.idle
    finally:
        for raw in clients:
            raw.close()
        heads.stop()
        if pg is not None:
            pg.stop()
        shutil.rmtree(folder, ignore_errors=True)
    summary = {layout: _summary(s) for layout, s in samples.items()}
    for layout, row in summary.items():
        print(
            f"{layout:13} CB_RECALL after {row['recall_ms_p50']} ms (p90 {row['recall_ms_p90']}), "
            f"writer's OPEN granted after {row['granted_ms_p50']} ms "
            f"(p90 {row['granted_ms_p90']}), holder's granting OPEN {row['grant_open_ms_p50']} ms "
            f"(p90 {row['grant_open_ms_p90']}), {row['files']} files"
        )
    print(f"idle: both heads together {idle_cpu * 1000:.1f} ms of CPU per second")
    if args.json:
        out = {"samples": samples, "summary": summary, "idle_cpu_s_per_s": idle_cpu}
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
