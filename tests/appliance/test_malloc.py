"""The daemon keeps stripe-sized buffers in the heap (appliance.runtime.tune_malloc)."""

from __future__ import annotations

import json
import subprocess
import sys

# a fresh interpreter: glibc's threshold is dynamic, and this process's history moves it
PROBE = """
import ctypes, json, sys
sys.path.insert(0, {repo!r})
class Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
                 "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Mallinfo2
tuned = None
if {tune}:
    from appliance.runtime import tune_malloc
    tuned = tune_malloc()
mapped = []
for _ in range(3):
    buf = bytearray(8 << 20)  # a stripe
    mapped.append(libc.mallinfo2().hblkhd)
    del buf
print(json.dumps({{"tuned": tuned, "mapped": mapped}}))
"""


def probe(tune: bool) -> dict:
    from pathlib import Path

    repo = str(Path(__file__).resolve().parents[2])
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(repo=repo, tune=tune)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out)


def test_stripe_buffers_come_from_the_heap_once_tuned():
    untuned = probe(False)
    # glibc's default maps a first 8 MiB buffer of its own (this is what the daemon avoids)
    assert untuned["mapped"][0] >= 8 << 20
    tuned = probe(True)
    assert tuned["tuned"] is True
    assert max(tuned["mapped"]) < 8 << 20, tuned
