"""Memory comes back after load: a record longer than the pooled receive buffers lives in
memory of its own, unmapped once the connection lets go of it (appliance/nfs/onc/connection.py),
and the daemon trims the heap once it is quiet (runtime.HeapTrim), never while requests keep
arriving (tune_malloc's reused buffers are what made writes fast)."""

from __future__ import annotations

import signal
import socket
import struct
import subprocess
import sys
import time

from pgserver import free_port
from test_cli_lifecycle import shingle

MiB = 1 << 20
CONNECTIONS = 40
RECORD = 4 * MiB  # announced by each connection's record mark
SENT = RECORD - 4096  # what each sends of it before closing: the record is never finished
# RSS after the connections closed may exceed RSS before them by this much: an eighth of the
# 160 MiB they held (pages partly in use stay, and the interpreter's own caches grow a little);
# without a trim 120 MB stayed
SLACK = 20 * MiB


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _unfinished_records(port: int, count: int, sent: int) -> list[socket.socket]:
    payload = bytes(sent)
    socks = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        sock.sendall(struct.pack(">I", 0x80000000 | RECORD) + payload)
        socks.append(sock)
    return socks


def test_heap_trim_waits_for_a_quiet_spell_and_trims_once_per_spell():
    from appliance.runtime import HeapTrim

    activity = [0]
    heap = HeapTrim(lambda: activity[0], quiet_s=0.3, min_free=0)
    end = time.monotonic() + 0.8
    while time.monotonic() < end:  # load: the counter moves at every tick
        activity[0] += 1
        assert heap.tick() is None
        time.sleep(0.05)
    assert heap.trims == 0
    time.sleep(0.35)
    assert heap.tick() is not None  # quiet long enough: one trim
    assert heap.tick() is None and heap.trims == 1  # and only one per quiet spell
    activity[0] += 1
    assert heap.tick() is None
    time.sleep(0.35)
    assert heap.tick() is not None and heap.trims == 2


def test_rss_comes_back_after_connections_holding_unfinished_records_close(tmp_path):
    """40 connections each announce a 4 MiB record and send all of it but 4 KiB, then close,
    against `shingle serve`: RSS rises by the 160 MiB they hold, and comes back to within
    SLACK of where it was (at once for the records' own memory; the heap's rest once the
    daemon has been quiet for HeapTrim.QUIET_S)."""
    home = tmp_path / "a"
    shingle("init", str(home), "--drive-size", "128MiB", "--zone-size", "8MiB")
    port = free_port()
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        daemon = subprocess.Popen(
            [sys.executable, "-m", "appliance.cli", "-c", str(home / "shingle.toml"), "serve"]
            + ["--nfs-port", str(port), "--no-web"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 90
        while True:
            assert daemon.poll() is None, log.read_text()[-3000:]
            try:
                socket.create_connection(("127.0.0.1", port), 1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the daemon does not listen"
                time.sleep(0.2)
        for sock in _unfinished_records(port, 2, 256 * 1024):  # the same code paths, warm
            sock.close()
        time.sleep(7.0)  # past a quiet spell: what warming up freed is trimmed too
        before = _rss(daemon.pid)
        socks = _unfinished_records(port, CONNECTIONS, SENT)
        deadline = time.monotonic() + 30
        while (peak := _rss(daemon.pid)) < before + CONNECTIONS * SENT * 3 // 4:
            assert time.monotonic() < deadline, (before, peak)  # the server holds the bytes
            time.sleep(0.1)
        time.sleep(0.5)
        peak = max(peak, _rss(daemon.pid))
        for sock in socks:
            sock.close()
        deadline = time.monotonic() + 20  # HeapTrim.QUIET_S and a tick, with room
        while (after := _rss(daemon.pid)) > before + SLACK:
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        mb = 1_000_000
        figures = f"RSS before {before // mb} MB, peak {peak // mb} MB, after {after // mb} MB"
        print(figures)  # the report's figures (pytest -s)
        assert after <= before + SLACK, figures
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(60)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
