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


# the heap keeps what the daemon freed (tune_malloc) until runtime.HeapTrim gives it back
TRIM_PROBE = """
import json, sys
sys.path.insert(0, {repo!r})
from appliance.runtime import HeapTrim, tune_malloc
def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) << 10 for l in f if l.startswith("VmRSS:"))
assert tune_malloc()
base = rss()
buffers, small = [], []
for _ in range(48):  # 192 MiB of 4 MiB buffers written through, small objects between them
    buffers.append(bytearray(b"x") * (4 << 20))
    small.append(bytearray(100))
loaded = rss()
del buffers
freed = rss()
heap = HeapTrim(lambda: 0, quiet_s=0.0)
trimmed_bytes = heap.tick()
print(json.dumps({{"base": base, "loaded": loaded, "freed": freed, "trimmed": rss(),
                   "trimmed_bytes": trimmed_bytes, "again": heap.tick()}}))
"""


def test_heap_trim_gives_back_what_the_tuned_heap_kept():
    from pathlib import Path

    repo = str(Path(__file__).resolve().parents[2])
    out = subprocess.run(
        [sys.executable, "-c", TRIM_PROBE.format(repo=repo)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    rss = json.loads(out)
    mib = 1 << 20
    assert rss["loaded"] - rss["base"] >= 180 * mib, rss  # the buffers were resident
    assert rss["freed"] - rss["base"] >= 180 * mib, rss  # freed, yet kept (trim threshold)
    assert rss["trimmed_bytes"] >= 180 * mib, rss
    assert rss["trimmed"] - rss["base"] < 16 * mib, rss  # given back
    assert rss["again"] is None, rss  # once per quiet spell
