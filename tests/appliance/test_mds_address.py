"""The floating metadata server address: its config checks, its ARP frame, and its guard's
steps against a lease clock (tests/cluster/test_mds_failover.py moves it between two heads on
the test bed)."""

from __future__ import annotations

import ipaddress
import math
import time
import types

import pytest

from appliance import config, mds_address
from appliance.mds_address import LIFETIME_MARGIN_S, MdsAddress, arp_frame, parse_address
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
        (settings(mds_address="fd00::9/64", mds_interface="eth0"), "cluster.mds_address"),
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
