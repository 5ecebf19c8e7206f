"""Kerberos A/B: sequential write and read under sys, krb5, krb5i and krb5p, shingle against
NFS-Ganesha in the same run (bench/compare.py --kerberos, or alone:
``.venv/bin/python bench/krb5ab.py [--mib 32] [--rounds 2]``).

A KDC of its own realm (tests/kdcserver.py) whose krb5.conf both servers read (KRB5_CONFIG,
inherited), one service key in a keytab both serve with (``nfs@shingle-test``): ``shingle
serve`` on a fresh ``shingle init`` folder and NFS-Ganesha 4.3 (VFS FSAL, NFS_KRB5 active,
SecType sys, krb5, krb5i, krb5p), each a child process, so each one's CPU is its own. The
client is the raw NFSv4.1 client of the tests (tests/nfs/gss_rawclient.py, python-gssapi over
MIT krb5) in this process, as user ``daemon``: OPEN (create), 1 MiB UNSTABLE WRITEs, COMMIT,
CLOSE, then OPEN and 1 MiB READs, one call at a time, the servers alternating which goes
first. The figures: MB/s, the ratio shingle / Ganesha per flavour and each flavour over sys on
the same server, and the server's CPU milliseconds per MiB moved."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
for extra in (REPO / "tests" / "nfs", REPO / "tests"):  # the raw clients and the KDC
    if str(extra) not in sys.path:
        sys.path.append(str(extra))

from bench.compare import ShingleServer, cpu_seconds, server_pid  # noqa: E402
from bench.ganesha import GaneshaServer  # noqa: E402

MiB = 1 << 20
FLAVORS = ("sys", "krb5", "krb5i", "krb5p")
USER = "daemon"  # uid 1 in every Debian's passwd


def _client(flavor: str, port: int, kdc):
    from gss_rawclient import SVC_INTEGRITY, SVC_NONE, SVC_PRIVACY, GssRawClient
    from kdcserver import SERVER_HOST
    from nfs4_rawclient import RawClient

    if flavor == "sys":
        return RawClient(port, uid=1, gid=1).setup()
    service = {"krb5": SVC_NONE, "krb5i": SVC_INTEGRITY, "krb5p": SVC_PRIVACY}[flavor]
    raw = GssRawClient(
        port, f"{USER}@{kdc.realm}", kdc.client_keytab, f"nfs@{SERVER_HOST}", service
    )
    raw.establish()
    return raw.setup()


def _open(raw, name: str, access: int, create: bool):
    from nfs4_rawclient import open_args

    from appliance.nfs.v4 import const as c

    st, res = raw.session(
        [
            (c.OP_PUTROOTFH, None),
            (c.OP_LOOKUP, "export"),
            (c.OP_OPEN, open_args(name, b"bench", raw.clientid, access=access, create=create)),
            (c.OP_GETFH, None),
        ]
    )
    if st != 0:
        raise RuntimeError(f"OPEN {name}: NFS4 status {st}")
    return res[-1][2], res[3][2].stateid


def _close(raw, fh: bytes, sid) -> None:
    from appliance.nfs.v4 import const as c
    from appliance.nfs.v4 import types as t

    raw.session([(c.OP_PUTFH, fh), (c.OP_CLOSE, t.ARGS[c.OP_CLOSE](0, sid))])


def _call(raw, ops):
    """One COMPOUND whose reply the session does not cache (1 MiB would not fit)."""
    return raw.compound([raw.sequence_op(cachethis=False), *ops])


def one_pass(server, raw, name: str, mib: int) -> dict:
    """Write then read ``mib`` MiB of ``name``: seconds and the server's CPU seconds of each."""
    from appliance.nfs.v4 import const as c
    from appliance.nfs.v4 import types as t

    pid = server_pid(server)
    block = os.urandom(MiB)
    out = {}
    fh, sid = _open(raw, name, c.OPEN4_SHARE_ACCESS_BOTH, True)
    cpu, wall = cpu_seconds(pid), time.perf_counter()
    for i in range(mib):
        st, res = _call(
            raw,
            [(c.OP_PUTFH, fh), (c.OP_WRITE, t.ARGS[c.OP_WRITE](sid, i * MiB, c.UNSTABLE4, block))],
        )
        if st != 0:
            raise RuntimeError(f"WRITE at {i} MiB: NFS4 status {st}")
    st, _ = raw.session([(c.OP_PUTFH, fh), (c.OP_COMMIT, t.ARGS[c.OP_COMMIT](0, 0))])
    if st != 0:
        raise RuntimeError(f"COMMIT: NFS4 status {st}")
    out["write_s"], out["write_cpu_s"] = time.perf_counter() - wall, cpu_seconds(pid) - cpu
    _close(raw, fh, sid)
    fh, sid = _open(raw, name, c.OPEN4_SHARE_ACCESS_READ, False)
    cpu, wall = cpu_seconds(pid), time.perf_counter()
    for i in range(mib):
        st, res = _call(raw, [(c.OP_PUTFH, fh), (c.OP_READ, t.ARGS[c.OP_READ](sid, i * MiB, MiB))])
        if st != 0 or len(res[-1][2].data) != MiB:
            raise RuntimeError(f"READ at {i} MiB: NFS4 status {st}")
    out["read_s"], out["read_cpu_s"] = time.perf_counter() - wall, cpu_seconds(pid) - cpu
    _close(raw, fh, sid)
    return out


def run(workdir: Path, mib: int = 32, rounds: int = 2, log=print) -> dict:
    """Start a KDC and both servers with its key, measure every flavour on both, stop them."""
    from kdcserver import SERVER_HOST, KdcServer

    workdir.mkdir(parents=True, exist_ok=True)
    kdc = KdcServer().start()
    servers: dict = {}
    samples: dict = {(s, f): [] for s in ("shingle", "ganesha") for f in FLAVORS}
    try:
        kdc.add_user(USER)
        keytab = str(kdc.server_keytab)
        os.chmod(kdc.dir, 0o755)
        servers["shingle"] = ShingleServer(
            workdir / "shingle-krb5",
            drive_size=max(64, rounds * mib) * MiB,  # every pass's file stays (4 flavours, 8+2)
            zone_size=16 * MiB,
            nfs_options=f'krb5_keytab = "{keytab}"\nkrb5_principal = "nfs@{SERVER_HOST}"\n',
            sec="sys:krb5:krb5i:krb5p",
        )
        servers["ganesha"] = GaneshaServer(
            workdir / "ganesha-krb5", krb5=(keytab, f"nfs@{SERVER_HOST}")
        )
        for name, server in servers.items():
            server.workdir.mkdir(parents=True, exist_ok=True)
            server.start()
            log(f"kerberos: {name} listening on 127.0.0.1:{server.port}")
        # the user writes into the export's root (shingle's is 1777 already)
        os.chmod(servers["ganesha"].backing_dir, 0o1777)
        for rnd in range(rounds):
            order = list(servers) if rnd % 2 == 0 else list(servers)[::-1]
            for flavor in FLAVORS:
                for name in order:
                    raw = _client(flavor, servers[name].port, kdc)
                    try:
                        samples[(name, flavor)].append(
                            one_pass(servers[name], raw, f"krb5ab-{flavor}-{rnd}", mib)
                        )
                    finally:
                        raw.close()
                    log(f"kerberos: {name} {flavor} round {rnd + 1}: {samples[(name, flavor)][-1]}")
    finally:
        for server in servers.values():
            server.stop()
        kdc.stop()
        for server in servers.values():
            shutil.rmtree(server.workdir, ignore_errors=True)
    return summarize(samples, mib)


def summarize(samples: dict, mib: int) -> dict:
    """Per flavour and operation: each server's MB/s (median), its ratio to the same server's
    sys, the shingle / Ganesha ratio, and each server's CPU ms per MiB."""
    rows = []
    for op in ("write", "read"):
        for flavor in FLAVORS:
            row: dict = {"flavor": flavor, "op": op}
            for name in ("shingle", "ganesha"):
                runs = samples[(name, flavor)]
                sys_runs = samples[(name, "sys")]
                if not runs or not sys_runs:
                    continue
                secs = statistics.median(r[f"{op}_s"] for r in runs)
                cpu = statistics.median(r[f"{op}_cpu_s"] for r in runs)
                base = statistics.median(r[f"{op}_s"] for r in sys_runs)
                row[name] = {
                    "MBps": mib * MiB / secs / 1e6,
                    "vs_sys": base / secs,
                    "cpu_ms_per_MiB": cpu * 1000 / mib,
                }
            if "shingle" in row and "ganesha" in row:
                row["ratio"] = row["shingle"]["MBps"] / row["ganesha"]["MBps"]
                row["cpu_ratio"] = (
                    row["shingle"]["cpu_ms_per_MiB"] / row["ganesha"]["cpu_ms_per_MiB"]
                    if row["ganesha"]["cpu_ms_per_MiB"]
                    else None
                )
            rows.append(row)
    return {"mib": mib, "rows": rows, "samples": {f"{s}.{f}": v for (s, f), v in samples.items()}}


def table_lines(result: dict) -> list[str]:
    """A markdown table of ``summarize``'s rows."""
    lines = [
        "| op | flavour | shingle MB/s | vs sys | CPU ms/MiB | Ganesha MB/s | vs sys | CPU ms/MiB "
        "| shingle / Ganesha | CPU ratio |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in result["rows"]:
        s, g = row.get("shingle"), row.get("ganesha")
        cells = [row["op"], row["flavor"]]
        for side in (s, g):
            cells += (
                [f"{side['MBps']:.1f}", f"{side['vs_sys']:.2f}", f"{side['cpu_ms_per_MiB']:.1f}"]
                if side
                else ["-", "-", "-"]
            )
        cells.append(f"{row['ratio']:.2f}" if "ratio" in row else "-")
        cells.append(f"{row['cpu_ratio']:.2f}" if row.get("cpu_ratio") else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def metric_lines(result: dict) -> list[str]:
    """``FLAVOUR.OP_MBps shingle ganesha ratio`` and ``FLAVOUR.OP.cpu_ms_per_MiB ...`` lines."""
    out = []
    for row in result["rows"]:
        s, g = row.get("shingle"), row.get("ganesha")
        if s and g:
            out.append(
                f"{row['flavor']}.{row['op']}_MBps {s['MBps']:.1f} {g['MBps']:.1f} "
                f"{row['ratio']:.3f}"
            )
            cpu_ratio = f"{row['cpu_ratio']:.3f}" if row.get("cpu_ratio") else "nan"
            out.append(
                f"{row['flavor']}.{row['op']}.cpu_ms_per_MiB {s['cpu_ms_per_MiB']:.2f} "
                f"{g['cpu_ms_per_MiB']:.2f} {cpu_ratio}"
            )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=32, help="file size per pass (MiB)")
    parser.add_argument("--rounds", type=int, default=2, help="passes per flavour and server")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="shingle-krb5ab-", dir="/var/tmp"))
    try:
        result = run(workdir, args.mib, args.rounds, log=lambda m: print(m, file=sys.stderr))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print("\n".join(table_lines(result)))
    print("# metric shingle ganesha ratio")
    print("\n".join(metric_lines(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
