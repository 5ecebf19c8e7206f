"""Micro-benchmark of the XDR codec: encode and decode of typical NFSv4.1 COMPOUND pieces,
microseconds per operation, with the compiled codec (appliance/nfs/onc/xdrcodec.pyx) and
with the Python one (``SHINGLE_NATIVE_XDR=0``), each in its own process, alternated
(A B A B ...: the machine may be shared).

Cases: a SEQUENCE+PUTFH+GETATTR request (the client's encoding, the server's decoding as
compound.py does it: the head, then each opnum and its arguments); the reply to it through
compound.emit_result with a fattr4 of 15 attributes made by attrs.encode; an OPEN's
arguments (create, UNCHECKED4); a READ4res of 4 KiB (a big chunk on encode, a memoryview on
decode); the RPC call header with AUTH_SYS credentials (rpc.parse_call).

    .venv/bin/python bench/xdr.py [--pairs 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GETATTR_BITS = (
    "TYPE CHANGE SIZE FSID FILEID MODE NUMLINKS OWNER OWNER_GROUP RAWDEV SPACE_USED "
    "TIME_ACCESS TIME_METADATA TIME_MODIFY MOUNTED_ON_FILEID"
).split()


def cases() -> dict:
    """name -> (encode, decode): callables of no argument, each one operation."""
    from appliance.nfs.onc import rpc
    from appliance.nfs.onc.xdr import Packer, UInt
    from appliance.nfs.v4 import attrs as fattr
    from appliance.nfs.v4 import const as c
    from appliance.nfs.v4 import types as t
    from appliance.nfs.v4.compound import emit_result

    fh = bytes(range(40))
    sessionid = b"s" * 16
    words = fattr.to_bitmap([getattr(c, f"FATTR4_{name}") for name in GETATTR_BITS])

    def compound_args(ops) -> bytes:
        p = Packer()
        t.COMPOUND4args_head.pack(p, (b"", 1))
        UInt.pack(p, len(ops))
        for opnum, args in ops:
            UInt.pack(p, opnum)
            t.ARGS[opnum].pack(p, args)
        return p.getvalue()

    def decode_compound(record: bytes) -> list:
        _head, pos = t.COMPOUND4args_head.unpack(record, 0)
        count, pos = UInt.unpack(record, pos)
        ops = []
        for _ in range(count):
            opnum, pos = UInt.unpack(record, pos)
            args, pos = t.ARGS[opnum].unpack(record, pos)
            ops.append((opnum, args))
        return ops

    getattr_ops = [
        (c.OP_SEQUENCE, t.ARGS[c.OP_SEQUENCE].cls(sessionid, 7, 0, 7, False)),
        (c.OP_PUTFH, fh),
        (c.OP_GETATTR, words),
    ]
    getattr_record = compound_args(getattr_ops)

    attr = SimpleNamespace(
        type=2,  # a directory: its space_used needs no namespace
        change=1234567,
        size=4096,
        ino=987654,
        mode=0o40755,
        nlink=3,
        uid=1000,
        gid=1000,
        rdev=0,
        atime_ns=1_700_000_000_123_456_789,
        ctime_ns=1_700_000_000_123_456_789,
        mtime_ns=1_700_000_000_123_456_789,
    )
    subject = fattr.AttrSubject(attr, fh, (1, 2), 987654, None)  # type: ignore[arg-type]
    seq_ok = t.RESULTS[c.OP_SEQUENCE].arms[c.NFS4_OK].cls(sessionid, 7, 0, 63, 63, 0)
    getattr_type = t.RESULTS[c.OP_GETATTR]

    def getattr_reply() -> list:
        p = Packer()
        emit_result(p, c.OP_SEQUENCE, 0, seq_ok)
        emit_result(p, c.OP_PUTFH, 0, None)
        emit_result(p, c.OP_GETATTR, 0, fattr.encode(words, subject))
        return p.result()

    reply = b"".join(getattr_reply())
    getattr_bytes = getattr_type.encode((0, fattr.encode(words, subject)))

    def decode_getattr_reply():
        pos = 0
        values = []
        for _ in range(3):
            opnum, pos = UInt.unpack(reply, pos)
            value, pos = t.RESULTS.get(opnum, t.STATUS_ONLY).unpack(reply, pos)
            values.append(value)
        return values

    open_type = t.ARGS[c.OP_OPEN]
    open_value = open_type.cls(
        0,
        c.OPEN4_SHARE_ACCESS_BOTH,
        0,
        t.state_owner4.cls(0x1234567890, b"open-owner-17"),
        (
            c.OPEN4_CREATE,
            (c.UNCHECKED4, t.fattr4.cls(fattr.to_bitmap([c.FATTR4_MODE]), b"\0\0\1\xa4")),
        ),
        (c.CLAIM_NULL, "file-000123.dat"),
    )
    open_bytes = open_type.encode(open_value)

    read_type = t.RESULTS[c.OP_READ]
    read_value = (0, read_type.arms[c.NFS4_OK].cls(False, os.urandom(4096)))
    read_bytes = read_type.encode(read_value)

    def read_encode():
        p = Packer()
        read_type.pack(p, read_value)
        return p.result()

    creds = rpc.authsys_parms.encode((12345, "client.example", 1000, 1000, [1000, 27, 100]))
    call = rpc.call_body.encode((0x1234, 0, 2, 100003, 4, 1, (rpc.AUTH_SYS, creds), (0, b"")))
    call_record = call + getattr_record

    return {
        "SEQUENCE+PUTFH+GETATTR args": (
            lambda: compound_args(getattr_ops),
            lambda: decode_compound(getattr_record),
        ),
        "SEQUENCE+PUTFH+GETATTR reply (fattr4)": (getattr_reply, decode_getattr_reply),
        "GETATTR result alone (fattr4)": (
            lambda: getattr_type.encode((0, fattr.encode(words, subject))),
            lambda: getattr_type.decode(getattr_bytes),
        ),
        "OPEN args (create)": (
            lambda: open_type.encode(open_value),
            lambda: open_type.decode(open_bytes),
        ),
        "READ result 4 KiB": (read_encode, lambda: read_type.decode(read_bytes)),
        "RPC call header + AUTH_SYS": (
            lambda: rpc.call_body.encode((0x1234, 0, 2, 100003, 4, 1, (1, creds), (0, b""))),
            lambda: rpc.parse_call(call_record),
        ),
    }


def measure(fn, seconds: float = 0.25) -> float:
    """Microseconds per call: the best of 5 runs of about ``seconds`` each."""
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        took = time.perf_counter() - t0
        if took > 0.02:
            break
        n *= 2
    n = max(1, int(n * seconds / took))
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e6


def run_one() -> dict:
    from appliance.nfs.onc import xdr

    out = {"implementation": xdr.IMPLEMENTATION, "cases": {}}
    for name, (encode, decode) in cases().items():
        out["cases"][name] = {"encode": measure(encode), "decode": measure(decode)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=2, help="A B pairs, alternated")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--one", action="store_true", help="measure this process's codec only")
    a = ap.parse_args()
    if a.one:
        print(json.dumps(run_one()))
        return
    runs: dict[str, list[dict]] = {"compiled": [], "python": []}
    loads = []
    for i in range(a.pairs):
        order = ("compiled", "python") if i % 2 == 0 else ("python", "compiled")
        for impl in order:
            env = {**os.environ, "PYTHONPATH": str(ROOT), "SHINGLE_NATIVE_XDR": "1"}
            if impl == "python":
                env["SHINGLE_NATIVE_XDR"] = "0"
            out = subprocess.run(
                [sys.executable, __file__, "--one"], env=env, capture_output=True, text=True
            )
            if out.returncode:
                sys.exit(out.stderr)
            result = json.loads(out.stdout)
            if result["implementation"] != impl:
                sys.exit(f"asked for {impl}, ran {result['implementation']} (not built?)")
            runs[impl].append(result["cases"])
            loads.append(os.getloadavg()[0])
    table = {}
    for name in runs["compiled"][0]:
        row = {}
        for impl in runs:
            for way in ("encode", "decode"):
                row[f"{impl} {way}"] = statistics.median(r[name][way] for r in runs[impl])
        table[name] = row
    if a.json:
        print(json.dumps({"table": table, "runs": runs, "load": loads}, indent=1))
        return
    print(f"us per operation, median of {a.pairs} runs each; load average {loads}")
    print(f"{'case':40} {'py enc':>8} {'C enc':>8} {'x':>5} {'py dec':>8} {'C dec':>8} {'x':>5}")
    for name, row in table.items():
        pe, ce = row["python encode"], row["compiled encode"]
        pd, cd = row["python decode"], row["compiled decode"]
        print(f"{name:40} {pe:8.2f} {ce:8.2f} {pe / ce:5.1f} {pd:8.2f} {cd:8.2f} {pd / cd:5.1f}")


if __name__ == "__main__":
    main()
