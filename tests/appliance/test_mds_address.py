"""The floating metadata server address: its config checks, its ARP frame and IPv6 Neighbour
Advertisement, its guard's steps against a lease clock, and an IPv6 address put on an
interface of a network namespace of this test's own (tests/cluster/test_mds_failover.py moves
an IPv4 one between two heads on the test bed)."""

from __future__ import annotations

import ipaddress
import math
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from appliance import config, mds_address
from appliance.mds_address import (
    LIFETIME_MARGIN_S,
    MdsAddress,
    arp_frame,
    neighbour_advertisement,
    parse_address,
)
from engine.base.errors import ConfigError

ETCD = "http://10.0.0.1:2379"
TTL_S = 4


def settings(**cluster) -> dict:
    return {"nfs": {"host": "0.0.0.0"}, "cluster": {"etcd_endpoints": ETCD, **cluster}}


def test_an_address_with_an_interface_and_etcd_is_accepted():
    values = config.from_dict(settings(mds_address="10.0.0.9/24", mds_interface="eth0"))
    assert values.get("cluster.mds_address") == "10.0.0.9/24"
    assert values.get("cluster.mds_lease_ttl_s") == 5.0


@pytest.mark.parametrize(
    ("document", "key"),
    [
        (settings(mds_address="10.0.0.9", mds_interface="eth0"), "cluster.mds_address"),
        (settings(mds_address="fd00::9/64", mds_interface="eth0"), "nfs.host"),
        (settings(mds_address="fe80::9/64", mds_interface="eth0"), "cluster.mds_address"),
        (settings(mds_address="127.0.0.9/8", mds_interface="eth0"), "cluster.mds_address"),
        (settings(mds_address="10.0.0.9/24"), "cluster.mds_interface"),
        (
            {"nfs": {"host": "0.0.0.0"}, "cluster": {"mds_address": "10.0.0.9/24",
                                                     "mds_interface": "eth0"}},
            "cluster.etcd_endpoints",
        ),
        (
            {**settings(mds_address="10.0.0.9/24", mds_interface="eth0"),
             "nfs": {"host": "127.0.0.1"}},
            "nfs.host",
        ),
        (settings(mds_address="10.0.0.9/24", mds_interface="eth0", mds_lease_ttl_s=2),
         "cluster.mds_lease_ttl_s"),
    ],
)  # fmt: skip
def test_a_config_the_address_cannot_work_with_is_refused_naming_the_key(document, key):
    with pytest.raises(ConfigError) as refused:
        config.from_dict(document)
    assert refused.value.key == key


def test_parse_address_keeps_the_prefix():
    assert parse_address(" 10.131.0.9/24 ").with_prefixlen == "10.131.0.9/24"
    assert parse_address("fd00:131::9/64").with_prefixlen == "fd00:131::9/64"


def test_an_ipv6_address_listens_on_every_ipv6_address():
    document = settings(mds_address="fd00::9/64", mds_interface="eth0")
    values = config.from_dict({**document, "nfs": {"host": "::"}})
    assert values.get("cluster.mds_address") == "fd00::9/64"


def test_the_gratuitous_arp_frame_names_the_address_as_sender_and_target():
    mac = bytes.fromhex("020000000001")
    ip = ipaddress.IPv4Address("10.131.0.9")
    frame = arp_frame(mac, ip)
    assert len(frame) == 42  # Ethernet header (14) and ARP for IPv4 over Ethernet (28)
    assert frame[:6] == b"\xff" * 6 and frame[6:12] == mac and frame[12:14] == b"\x08\x06"
    arp = frame[14:]
    assert arp[:8] == bytes.fromhex("0001080006040001")  # Ethernet, IPv4, 6, 4, request
    assert arp[8:14] == mac and arp[14:18] == ip.packed  # sender
    assert arp[18:24] == b"\0" * 6 and arp[24:28] == ip.packed  # target: itself


class LeaseClock:
    """The election as the guard sees it: office held until ``until`` (0: not held)."""

    name = "head0"

    def __init__(self):
        self.until = 0.0

    def held_until(self) -> float:
        return self.until

    def step_down(self, reason: str) -> None:
        self.until = 0.0


class KernelAddress:
    """The address on an interface, by a kernel that deletes it when its lifetime ends (at
    the latest a second after: the kernel counts whole seconds)."""

    interface = "eth0"
    address = ipaddress.IPv4Interface("10.0.0.9/24")
    ip = "10.0.0.9"

    def __init__(self, clock: list[float], lease: LeaseClock):
        self.clock, self.lease = clock, lease
        self.gone_by = 0.0  # the latest moment the kernel keeps it
        self.removed = 0

    def put(self, lifetime_s: int) -> None:
        # the kernel's deletion must come before the lease could pass to another head
        assert self.clock[0] + lifetime_s + 1 <= self.lease.held_until()
        self.gone_by = self.clock[0] + lifetime_s + 1

    def remove(self) -> bool:
        self.removed += 1
        present, self.gone_by = self.gone_by > self.clock[0], 0.0
        return present


def test_a_late_keepalive_lets_the_address_lapse_and_only_a_lost_lease_closes_connections(
    monkeypatch,
):
    clock = [1000.0]
    monkeypatch.setattr(mds_address, "time", types.SimpleNamespace(
        monotonic=lambda: clock[0], time=time.time))  # fmt: skip
    monkeypatch.setattr(mds_address, "send_gratuitous_arp", lambda *_: None)
    lease = LeaseClock()
    released: list[str] = []
    guard = MdsAddress(
        mds_address.EtcdClient([ETCD]), KernelAddress(clock, lease), ttl_s=TTL_S,
        on_released=released.append,
    )  # fmt: skip
    guard.leader = lease  # type: ignore[assignment]  # the election, by hand
    address = guard.address
    assert isinstance(address, KernelAddress)

    lease.until = clock[0] + TTL_S  # office taken
    guard._step()
    assert address.gone_by == clock[0] + math.floor(TTL_S - LIFETIME_MARGIN_S) + 1
    # the next keepalive is late: too little lease left for a new lifetime, but office holds
    clock[0] = lease.until - LIFETIME_MARGIN_S - 0.5
    guard._step()
    assert not released and not address.removed, "a late keepalive closed the connections"
    # it comes back: the address is renewed, its clients' connections never closed
    clock[0] += 0.3
    lease.until = clock[0] + TTL_S
    guard._step()
    assert address.gone_by > clock[0] + 1 and not released and not address.removed
    # no keepalive answers any more: the kernel's lifetime ends first, then office
    clock[0] = lease.until - 0.01
    guard._step()
    assert address.gone_by < lease.until and not released
    clock[0] = lease.until
    guard._step()
    assert released == ["10.0.0.9"] and address.removed == 1


def test_the_neighbour_advertisement_overrides_and_names_the_address_and_mac():
    mac = bytes.fromhex("020000000001")
    ip = ipaddress.IPv6Address("fd00:131::9")
    message = neighbour_advertisement(mac, ip)
    assert len(message) == 32  # header (8), target (16), link-layer address option (8)
    assert message[:4] == bytes([136, 0, 0, 0])  # type, code, checksum (the kernel's)
    assert message[4:8] == bytes.fromhex("20000000")  # override; not solicited, not a router
    assert message[8:24] == ip.packed
    assert message[24:] == b"\x02\x01" + mac  # target link-layer address, 8 bytes


HOLDER = """
import ipaddress, socket, sys
from appliance.mds_address import FloatingAddress, announce, parse_address
server = socket.create_server(("::", 20499), family=socket.AF_INET6, dualstack_ipv6=True)
address = FloatingAddress(parse_address(sys.argv[1]), "eth0")
address.put(5)
announce("eth0", address.address.ip)
print("up" if address.present() else "absent", flush=True)
server.settimeout(20)
conn, _ = server.accept()
conn.sendall(b"served")
conn.close()
print("removed" if address.remove() and not address.present() else "left", flush=True)
"""


def test_an_ipv6_address_serves_at_once_and_its_advertisement_moves_the_neighbour(tmp_path):
    """An IPv6 floating address put in a namespace of this test's own (a veth pair to a
    client namespace): the client's stale neighbour entry for it (another MAC, as after the
    address moved) takes the holder's MAC from the unsolicited advertisement, and a client
    connects at once (nodad: no tentative second); removed, it is gone."""
    ns = [f"shv6-{os.getpid()}-{side}" for side in ("holder", "client")]
    address, client = "fd00:131::9/64", "fd00:131::2/64"

    def ip(*args: str) -> str:
        return subprocess.run(["ip", *args], check=True, capture_output=True, text=True).stdout

    try:
        for name in ns:
            ip("netns", "add", name)
        ip("-n", ns[0], "link", "add", "eth0", "type", "veth", "peer", "eth0", "netns", ns[1])
        for name in ns:
            ip("-n", name, "link", "set", "eth0", "up")
        ip("-n", ns[1], "addr", "add", client, "dev", "eth0", "nodad")
        # as a client that knew the address at another head's MAC
        ip("-n", ns[1], "neigh", "add", "fd00:131::9", "lladdr", "02:00:00:00:00:99",
           "dev", "eth0", "nud", "stale")  # fmt: skip
        mac = ip("-n", ns[0], "-o", "link", "show", "eth0").split("link/ether ")[1].split()[0]
        holder = subprocess.Popen(
            ["ip", "netns", "exec", ns[0], sys.executable, "-c", HOLDER, address],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            cwd=Path(__file__).resolve().parents[2],
        )  # fmt: skip
        try:
            assert holder.stdout is not None
            line = holder.stdout.readline().strip()
            if line != "up":
                holder.kill()
                pytest.fail(f"the holder said {line!r}: {holder.communicate()[1][-2000:]}")
            neighbour = ip("-n", ns[1], "-6", "neigh", "show", "fd00:131::9", "dev", "eth0")
            assert f"lladdr {mac}" in neighbour, (mac, neighbour)
            started = time.monotonic()
            got = subprocess.run(
                ["ip", "netns", "exec", ns[1], sys.executable, "-c",
                 "import socket; s = socket.create_connection(('fd00:131::9', 20499), 10); "
                 "print(s.recv(16).decode())"],
                capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            assert got.stdout.strip() == "served", got.stderr
            assert time.monotonic() - started < 5
            assert holder.stdout.readline().strip() == "removed"
        finally:
            holder.kill()
            holder.wait(10)
    finally:
        for name in ns:
            subprocess.run(["ip", "netns", "delete", name], capture_output=True)


def test_a_data_server_never_campaigns_and_leaves_dead_heads_to_the_holder():
    """A pNFS data server cannot answer as the metadata server: given the cluster's address it
    starts no campaign (no etcd request, no interface touched: the interface named here does
    not exist) and never expires a dead head, whose clients reclaim at the holder."""
    from appliance.runtime import Daemon

    values = config.from_dict(
        {
            "nfs": {"host": "0.0.0.0"},
            "cluster": {"etcd_endpoints": "http://127.0.0.1:9", "mds_address": "10.0.0.9/24",
                        "mds_interface": "shingle-none0"},
            "pnfs": {"role": "ds", "address": "10.0.0.5:2049"},
        }
    )  # fmt: skip
    heads = types.SimpleNamespace(takes_over=None)
    state = types.SimpleNamespace(heads=heads)
    daemon = types.SimpleNamespace(
        config=values, server=types.SimpleNamespace(server=types.SimpleNamespace(state=state))
    )
    assert Daemon.start_mds_address(daemon) is None  # type: ignore[arg-type]
    assert heads.takes_over is not None and heads.takes_over() is False
