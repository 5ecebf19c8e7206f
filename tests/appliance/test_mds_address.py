"""The floating metadata server address: its config checks and its ARP frame
(tests/cluster/test_mds_failover.py moves it between two heads on the test bed)."""

from __future__ import annotations

import ipaddress

import pytest

from appliance import config
from appliance.mds_address import arp_frame, parse_address
from engine.base.errors import ConfigError

ETCD = "http://10.0.0.1:2379"


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
