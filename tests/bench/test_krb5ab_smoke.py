"""Smoke run of the Kerberos A/B (bench/compare.py --kerberos-only, bench/krb5ab.py) so the
harness cannot rot: a KDC, shingle and NFS-Ganesha serving with its key, a 2 MiB write and
read under sys, krb5, krb5i and krb5p on each. It checks the output contract, not speed:
``FLAVOUR.OP_MBps shingle ganesha ratio`` and ``FLAVOUR.OP.cpu_ms_per_MiB shingle ganesha
ratio`` for every flavour and operation, each server with a number."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("gssapi", reason="scripts/bootstrap.sh installs gssapi (pip) and libkrb5-dev")

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.ganesha import ensure_installed  # noqa: E402

LINE = re.compile(r"^(\S+) (\d+\.\d+) (\d+\.\d+) (nan|\d+\.\d+)$")


def test_kerberos_ab_prints_every_flavour_for_both_servers():
    ensure_installed()
    proc = subprocess.run(
        [
            sys.executable,
            "bench/compare.py",
            "--kerberos-only",
            "--kerberos-mib",
            "2",
            "--reps",
            "1",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    print(proc.stdout)
    print(proc.stderr[-4000:], file=sys.stderr)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout.strip().splitlines()
    marker = next(i for i, line in enumerate(out) if line.startswith("# kerberos:"))
    rows = {}
    for line in out[marker + 1 :]:
        m = LINE.match(line)
        assert m, f"not 'metric shingle ganesha ratio': {line!r}"
        rows[m.group(1)] = (float(m.group(2)), float(m.group(3)))
    flavors, ops = ("sys", "krb5", "krb5i", "krb5p"), ("write", "read")
    assert set(rows) == {f"{f}.{o}_MBps" for f in flavors for o in ops} | {
        f"{f}.{o}.cpu_ms_per_MiB" for f in flavors for o in ops
    }
    assert all(s > 0 and g > 0 for key, (s, g) in rows.items() if key.endswith("_MBps")), rows
    # the markdown table above the lines has a row per operation and flavour
    assert sum(line.startswith(("| write |", "| read |")) for line in out[:marker]) == 8
