"""The cluster test bed keeps its promises: the machine's own network untouched, a cut link
drops everything both ways until restored, and what a killed run left behind is removed."""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from bed import PREFIX, BedUnavailable, check_netns, netns_pids, remove_leftovers, root_network

PORT = 7000


def test_the_machines_own_links_addresses_routes_and_rules_are_untouched(bed):
    assert bed.root_network_before
    assert root_network() == bed.root_network_before


def connects(bed, host: str, address: str, timeout: float = 1.0) -> bool:
    def attempt() -> bool:
        with socket.socket() as sock:
            sock.settimeout(timeout)
            try:
                sock.connect((address, PORT))
            except OSError:
                return False
            return True

    return bed.call(host, attempt)


def test_a_cut_link_drops_traffic_both_ways_until_restored(bed):
    for name in ("cuta", "cutb"):
        if name not in bed.hosts:
            bed.add_host(name)
    a, b = bed.hosts["cuta"], bed.hosts["cutb"]

    def listen(address: str) -> socket.socket:
        server = socket.socket()
        server.bind((address, PORT))
        server.listen(8)
        return server

    # made in each host's namespace, the listening sockets stay there
    servers = [
        bed.call("cuta", lambda: listen(a.address)),
        bed.call("cutb", lambda: listen(b.address)),
    ]
    try:
        assert connects(bed, "cuta", b.address) and connects(bed, "cutb", a.address)
        bed.cut_link("cuta")
        assert not connects(bed, "cuta", b.address), "out of a cut host"
        assert not connects(bed, "cutb", a.address), "into a cut host"
        assert connects(bed, "cuta", a.address), "a cut host still reaches itself"
        bed.restore_link("cuta")
        # back at once, or after a neighbour entry that failed during the cut is resolved again
        deadline = time.monotonic() + 10
        while not (connects(bed, "cuta", b.address) and connects(bed, "cutb", a.address)):
            assert time.monotonic() < deadline, "the restored link carries nothing"
    finally:
        if a.cut:
            bed.restore_link("cuta")
        for server in servers:
            server.close()


def test_what_a_killed_run_left_is_removed():
    try:
        check_netns()
    except BedUnavailable as exc:
        pytest.skip(f"cluster test bed: {exc}")
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid whose run has ended: its bed's clean-up never ran
    netns = f"{PREFIX}{gone.pid}-left"
    folder = Path(tempfile.gettempdir()) / f"{PREFIX}{gone.pid}"
    subprocess.run(["ip", "netns", "add", netns], check=True)
    folder.mkdir()
    sleeper = subprocess.Popen(["ip", "netns", "exec", netns, "sleep", "300"])
    try:
        for _ in range(100):  # until ip netns exec has joined the namespace
            if netns_pids(netns):
                break
            time.sleep(0.05)
        assert netns_pids(netns) == [sleeper.pid]
        ours = f"{PREFIX}{os.getpid()}-"
        removed = remove_leftovers()
        assert netns in removed and str(folder) in removed
        assert not any(name.startswith(ours) for name in removed), "a live run's names"
        assert not Path(f"/proc/{sleeper.pid}").exists(), "killed and reaped"
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert netns not in listed
        assert not folder.exists()
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()
        subprocess.run(["ip", "netns", "del", netns], capture_output=True)
        if folder.exists():
            folder.rmdir()
