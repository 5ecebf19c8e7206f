"""The largest NFSv4.0 COMPOUND one record holds: GETATTRs of the root, as many as fit in
``--record`` bytes (the server's nfs.max_record_size). Prints the request and reply sizes,
how many results came back, the status and the best time of 3. Before the operation limit
and the 4.0 reply bound, the reply grew with the request (about 2.8x); now it stops at
nfs.max_compound_ops operations with NFS4ERR_RESOURCE.

    .venv/bin/python bench/compound_limit.py [--record 5MiB]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "nfs"))  # the raw client and the test stack

MiB = 1 << 20


def main() -> None:
    from nfs4_rawclient import RawClient
    from nfs4_support import Stack, add_export, start_server

    from appliance.config import parse_size
    from appliance.nfs.onc.limits import NetLimits
    from appliance.nfs.v4 import const as c

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", default="5MiB", help="the server's max record size")
    record = parse_size(parser.parse_args().record, "--record")

    tmp = Path(tempfile.mkdtemp(prefix="shingle-compound-"))
    stack = Stack(tmp, drive_size=24 * MiB, zone_size=2 * MiB, fragment_size=64 * 1024)
    add_export(stack.catalog)
    server = start_server(stack, limits=NetLimits(max_record_size=record))
    try:
        raw = RawClient(server.port, minor=0)
        first = (1 << c.FATTR4_TYPE) | (1 << c.FATTR4_CHANGE) | (1 << c.FATTR4_SIZE)
        bitmap = [first | (1 << c.FATTR4_FILEID), 1 << (c.FATTR4_MODE - 32), 0]
        count = (record - 200) // 20  # a GETATTR of a 3-word bitmap is 20 bytes
        body = raw.compound_bytes([(c.OP_PUTROOTFH, None)] + [(c.OP_GETATTR, bitmap)] * count)
        best = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            reply = raw.call_raw(1, body)
            best = min(best, time.perf_counter() - started)
        status, results = raw.parse(reply)
        print(
            f"request {len(body):,} bytes ({count + 1:,} operations) -> reply {len(reply):,} bytes "
            f"(x{len(reply) / len(body):.4f}), status {status}, {len(results):,} results, "
            f"best of 3 {best:.3f} s"
        )
        raw.close()
    finally:
        server.stop()
        stack.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
