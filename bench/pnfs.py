"""Aggregate throughput through pNFS (a metadata server and two data servers, three `shingle
serve` heads over one catalog and one set of drives: docs/pnfs.md) against the same work
through one head, in the same run, rounds alternated.

The client is the project's raw NFSv4.1 client (tests/nfs/nfs4_rawclient.py), one process per
writer, one request in flight per connection, doing what the Linux files-layout client does:
- pnfs: OPEN and LAYOUTGET on the metadata server, GETDEVICEINFO, then each 1 MiB WRITE
  (UNSTABLE, answered FILE_SYNC) to the data server its stripe unit maps to, no COMMIT; with
  --data-server-writes unstable the data servers answer UNSTABLE and the client COMMITs to
  each and sends LAYOUTCOMMIT at the end; the read back (warm: the heads' page cache) from
  the same data servers;
- one head: OPEN, 1 MiB UNSTABLE WRITEs and a COMMIT at the end, through the metadata server
  alone (a client without pNFS), the read back from it.
Printed per layout: MB/s of all writers together, and the heads' CPU seconds per MiB (every
head's, idle ones included).

    .venv/bin/python bench/pnfs.py [--writers 4] [--mib 32] [--rounds 3]
        [--data-server-writes file_sync|unstable] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "nfs"))

from nfs4_rawclient import RawClient  # noqa: E402

from appliance.nfs.v4 import const as c  # noqa: E402
from appliance.nfs.v4 import types as t  # noqa: E402
from bench.serveheads import (  # noqa: E402
    HeadProcesses,
    alternated,
    free_port,
    init_head,
    medians,
    set_options,
)

MiB = 1 << 20
ALL = c.NFS4_UINT64_MAX


class Heads(HeadProcesses):
    """A metadata server and ``count`` data servers on 127.0.0.1 over one catalog."""

    def __init__(self, folder: Path, count: int = 2, data_server_writes: str = "file_sync"):
        super().__init__(
            [folder / "mds"] + [folder / f"ds{i}" for i in range(count)],
            [free_port() for _ in range(count + 1)],
        )
        mds = self.homes[0]
        init_head(
            mds, "--drive-size", "512MiB", "--zone-size", "16MiB", "--nfs-port", str(self.ports[0])
        )
        listed = ",".join(f"127.0.0.1:{p}" for p in self.ports[1:])
        text = (mds / "shingle.toml").read_text()
        text = set_options(text, "nfs", 'grace_seconds = 0\nportmap = "off"\n')
        text = set_options(text, "heads", f"count = {count + 1}\nindex = 0\n")
        text = set_options(text, "pnfs", f'role = "mds"\ndata_servers = "{listed}"\n')
        (mds / "shingle.toml").write_text(text)
        catalog = (mds / "catalog.db").resolve()
        for index, (home, port) in enumerate(
            zip(self.homes[1:], self.ports[1:], strict=True), start=1
        ):
            home.mkdir()
            (home / "shingle.toml").write_text(
                f'[catalog]\nurl = "sqlite:///{catalog}"\n[nfs]\nport = {port}\n'
                f'grace_seconds = 0\nportmap = "off"\n[heads]\ncount = {count + 1}\n'
                f'index = {index}\n[pnfs]\nrole = "ds"\naddress = "127.0.0.1:{port}"\n'
                f'data_server_writes = "{data_server_writes}"\n'
            )


def _layout(mds: RawClient, fh: bytes, sid) -> tuple:
    """(stripe unit, first stripe index, the data servers' ports, the layout stateid) of a
    file's layout."""
    args = t.ARGS[c.OP_LAYOUTGET](False, 1, c.LAYOUTIOMODE4_RW, 0, ALL, 0, sid, 4096)
    st, res = mds.session([(c.OP_PUTFH, fh), (c.OP_LAYOUTGET, args)])
    assert st == 0, st
    stateid = res[-1][2].stateid
    files = t.nfsv4_1_file_layout4.decode(res[-1][2].layout[0].content.body)
    args = t.ARGS[c.OP_GETDEVICEINFO](bytes(files.deviceid), 1, 4096, [])
    st, res = mds.session([(c.OP_GETDEVICEINFO, args)])
    assert st == 0, st
    device = t.nfsv4_1_file_layout_ds_addr4.decode(res[-1][2].device_addr.body)
    ports = []
    for (addr,) in device.multipath_ds_list:
        *_, hi, lo = addr.addr.split(".")
        ports.append(int(hi) * 256 + int(lo))
    unit = files.util & c.NFL4_UFLG_STRIPE_UNIT_SIZE_MASK
    return unit, files.first_stripe_index, ports, stateid


def _call(client: RawClient, ops: list):
    """A COMPOUND in the session, its reply not cached (a 1 MiB READ's is too big for a slot)."""
    return client.compound([client.sequence_op(cachethis=False), *ops])


def writer(mode: str, mds_port: int, name: str, mib: int, out, unstable: bool) -> None:
    data = os.urandom(MiB)
    mds = RawClient(mds_port).setup()
    fh, sid = mds.open_new(name)
    targets = {}
    if mode == "pnfs":
        unit, first, ports, layout_sid = _layout(mds, fh, sid)
        clients = {port: RawClient(port).setup() for port in set(ports)}
        targets = {i: clients[ports[(i * MiB // unit + first) % len(ports)]] for i in range(mib)}
    started = time.perf_counter()
    for i in range(mib):
        client = targets.get(i, mds)
        args = t.ARGS[c.OP_WRITE](sid, i * MiB, c.UNSTABLE4, data)
        st, _ = _call(client, [(c.OP_PUTFH, fh), (c.OP_WRITE, args)])
        assert st == 0, st
    if mode != "pnfs":
        st, _ = mds.session([(c.OP_PUTFH, fh), (c.OP_COMMIT, t.ARGS[c.OP_COMMIT](0, 0))])
        assert st == 0, st
    elif unstable:  # as the Linux client after UNSTABLE answers: COMMIT each, LAYOUTCOMMIT
        for client in set(targets.values()):
            st, _ = _call(client, [(c.OP_PUTFH, fh), (c.OP_COMMIT, t.ARGS[c.OP_COMMIT](0, 0))])
            assert st == 0, st
        commit = t.ARGS[c.OP_LAYOUTCOMMIT](
            0, ALL, False, layout_sid, (True, mib * MiB - 1), (False, None), (1, b"")
        )
        st, _ = _call(mds, [(c.OP_PUTFH, fh), (c.OP_LAYOUTCOMMIT, commit)])
        assert st == 0, st
    wrote = time.perf_counter() - started
    started = time.perf_counter()
    for i in range(mib):
        client = targets.get(i, mds)
        st, res = _call(
            client, [(c.OP_PUTFH, fh), (c.OP_READ, t.ARGS[c.OP_READ](sid, i * MiB, MiB))]
        )
        assert st == 0 and len(res[-1][2].data) == MiB, st
    out.put((wrote, time.perf_counter() - started))


def run(heads: Heads, mode: str, writers: int, mib: int, tag: str, unstable: bool) -> dict:
    queue: multiprocessing.Queue = multiprocessing.Queue()
    procs = [
        multiprocessing.Process(
            target=writer,
            args=(mode, heads.ports[0], f"{tag}-{mode}-{i}", mib, queue, unstable),
        )
        for i in range(writers)
    ]
    cpu0, started = heads.cpu(), time.perf_counter()
    for proc in procs:
        proc.start()
    times = []
    while len(times) < len(procs):
        try:
            times.append(queue.get(timeout=5))
        except Exception:  # noqa: BLE001 - queue.Empty: check the writers are alive
            if any(p.exitcode not in (None, 0) for p in procs):
                raise SystemExit(f"a {mode} writer failed") from None
    for proc in procs:
        proc.join()
    wall = time.perf_counter() - started
    cpu = heads.cpu() - cpu0
    total = writers * mib
    write_s = max(w for w, _ in times)
    read_s = max(r for _, r in times)
    return {
        "write_mb_s": total * MiB / write_s / 1e6,
        "read_mb_s": total * MiB / read_s / 1e6,
        "cpu_ms_per_mib": cpu * 1000 / (2 * total),  # written and read: 2 x total MiB
        "wall_s": wall,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--mib", type=int, default=32, help="MiB per writer")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--data-server-writes",
        choices=("file_sync", "unstable"),
        default="file_sync",
        help="[pnfs] data_server_writes of the data servers (unstable: the client COMMITs "
        "to each and sends LAYOUTCOMMIT)",
    )
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="shingle-bench-pnfs-"))
    heads = Heads(folder, data_server_writes=args.data_server_writes)
    unstable = args.data_server_writes == "unstable"
    try:
        heads.start()
        results = alternated(
            ["pnfs", "one head"],
            args.rounds,
            lambda mode, round_: run(heads, mode, args.writers, args.mib, f"r{round_}", unstable),
        )
    finally:
        heads.stop()
        shutil.rmtree(folder, ignore_errors=True)
    print(f"# {args.writers} writers x {args.mib} MiB, median of {args.rounds} rounds")
    summary = medians(results)
    ratio = summary["pnfs"]["write_mb_s"] / summary["one head"]["write_mb_s"]
    print(
        f"pnfs / one head: write {ratio:.2f}x, "
        f"read {summary['pnfs']['read_mb_s'] / summary['one head']['read_mb_s']:.2f}x"
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": results, "median": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
