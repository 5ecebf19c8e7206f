"""Sequential write and read under krb5, krb5i and krb5p against sec=sys, same server, same run.

A KDC of its own realm (tests/kdcserver.py), the NFS server in this process (10 emulated
drives, as the NFS tests), and the raw NFSv4.1 test client (tests/nfs/gss_rawclient.py): one
call at a time, 1 MiB WRITEs (UNSTABLE, then COMMIT) and 1 MiB READs of one file. The client's
own GSS work (MICs, wrapping) runs in the same process as the server's, so the CPU figure is
both sides' per MiB; the figure is each flavour's throughput over sys's, in the same run. The
Linux client in the VM rig runs under TCG (2-6 MB/s), too slow to measure this.

    .venv/bin/python bench/gss.py [--mib 32] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path[:0] = [str(HERE.parent / "tests" / "nfs"), str(HERE.parent / "tests"), str(HERE.parent)]

from gss_rawclient import SVC_INTEGRITY, SVC_NONE, SVC_PRIVACY, GssRawClient  # noqa: E402
from kdcserver import SERVER_HOST, KdcServer  # noqa: E402
from nfs4_rawclient import RawClient, stateid  # noqa: E402
from nfs4_support import Stack, add_export, start_server  # noqa: E402

from appliance.nfs.v4 import const as c  # noqa: E402
from appliance.nfs.v4 import types as t  # noqa: E402
from engine.namespace import ROOT  # noqa: E402

MiB = 1 << 20
FLAVORS = {"sys": None, "krb5": SVC_NONE, "krb5i": SVC_INTEGRITY, "krb5p": SVC_PRIVACY}
ANON = stateid(0, b"\0" * 12)


def connect(flavor: str, port: int, kdc: KdcServer):
    service = FLAVORS[flavor]
    if service is None:
        return RawClient(port, uid=1, gid=1).setup()
    raw = GssRawClient(
        port, f"daemon@{kdc.realm}", kdc.client_keytab, f"nfs@{SERVER_HOST}", service
    )
    raw.establish()
    return raw.setup()


def call(raw, ops):
    """One COMPOUND on slot 0 whose reply the session does not cache (a 1 MiB READ would not fit
    the cache)."""
    return raw.compound([raw.sequence_op(cachethis=False), *ops])


def one_pass(raw, name: str, mib: int) -> tuple[float, float, float, float]:
    """(write s, write CPU s, read s, read CPU s) of ``mib`` MiB through ``raw``."""
    st, res = raw.session(
        [(c.OP_PUTROOTFH, None), (c.OP_LOOKUP, "export"), (c.OP_LOOKUP, name), (c.OP_GETFH, None)]
    )
    assert st == 0, res
    fh = res[-1][2]
    block = os.urandom(MiB)
    cpu, wall = time.process_time(), time.perf_counter()
    for i in range(mib):
        st, res = call(
            raw,
            [(c.OP_PUTFH, fh), (c.OP_WRITE, t.ARGS[c.OP_WRITE](ANON, i * MiB, c.UNSTABLE4, block))],
        )
        assert st == 0, res
    st, res = raw.session([(c.OP_PUTFH, fh), (c.OP_COMMIT, t.ARGS[c.OP_COMMIT](0, 0))])
    assert st == 0, res
    write = (time.perf_counter() - wall, time.process_time() - cpu)
    cpu, wall = time.process_time(), time.perf_counter()
    for i in range(mib):
        st, res = call(raw, [(c.OP_PUTFH, fh), (c.OP_READ, t.ARGS[c.OP_READ](ANON, i * MiB, MiB))])
        assert st == 0 and len(res[-1][2].data) == MiB, res
    read = (time.perf_counter() - wall, time.process_time() - cpu)
    return write[0], write[1], read[0], read[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=32, help="file size per pass (MiB)")
    parser.add_argument("--rounds", type=int, default=2, help="passes per flavour (median)")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="shingle-bench-gss-"))
    kdc = KdcServer().start()
    stack = Stack(
        folder, drive_size=max(64, args.mib * 2) * MiB, zone_size=4 * MiB, fragment_size=256 * 1024
    )
    server = None
    try:
        kdc.add_user("daemon")
        add_export(stack.catalog, sec="krb5p:krb5i:krb5:sys")
        ns = stack.namespace
        for flavor in FLAVORS:
            f = ns.create(ROOT, ns.root_ino, f"bench-{flavor}", 0o666)
            ns.setattr(ROOT, f.ino, uid=1, gid=1)
        server = start_server(stack, krb5_keytab=str(kdc.server_keytab))
        results: dict[str, list] = {flavor: [] for flavor in FLAVORS}
        order = list(FLAVORS)
        for rnd in range(args.rounds):
            for flavor in order if rnd % 2 == 0 else order[::-1]:
                raw = connect(flavor, server.port, kdc)
                try:
                    results[flavor].append(one_pass(raw, f"bench-{flavor}", args.mib))
                finally:
                    raw.close()
        base = {k: statistics.median(r[k] for r in results["sys"]) for k in (0, 2)}
        print(
            f"{'flavour':<7} {'write MB/s':>10} {'ratio':>6} {'CPU s/GiB':>9} "
            f"{'read MB/s':>10} {'ratio':>6} {'CPU s/GiB':>9}"
        )
        for flavor, runs in results.items():
            w, wc, r, rc = (statistics.median(x[k] for x in runs) for k in range(4))
            size = args.mib * MiB
            print(
                f"{flavor:<7} {size / w / 1e6:>10.1f} {base[0] / w:>6.2f} "
                f"{wc * 1024 / args.mib:>9.2f} {size / r / 1e6:>10.1f} {base[2] / r:>6.2f} "
                f"{rc * 1024 / args.mib:>9.2f}"
            )
    finally:
        if server is not None:
            server.stop()
        stack.close()
        kdc.stop()
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
