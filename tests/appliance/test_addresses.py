"""What `shingle serve` announces for a server bound to every address (nfs.host = "0.0.0.0"):
this machine's usable addresses, never the wildcard (appliance/host/addresses.py). The same
check through a real `shingle serve` in a network namespace: tests/cluster/test_mds_failover.py
(its heads listen on 0.0.0.0 and must announce their bed address)."""

from __future__ import annotations

import ipaddress
import socket

import psutil

from appliance.host.addresses import client_addresses, url_host, wildcard_note


def _up_addresses() -> set[str]:
    stats = psutil.net_if_stats()
    return {
        addr.address.split("%")[0]
        for name, addrs in psutil.net_if_addrs().items()
        if name not in stats or stats[name].isup
        for addr in addrs
        if addr.family in (socket.AF_INET, socket.AF_INET6)
    }


def test_a_wildcard_is_announced_as_this_hosts_addresses():
    shown = client_addresses("0.0.0.0")
    assert shown and "0.0.0.0" not in shown
    assert all(ipaddress.ip_address(a).version == 4 for a in shown)
    usable = {
        a for a in _up_addresses()
        if (ip := ipaddress.ip_address(a)).version == 4
        and not (ip.is_loopback or ip.is_link_local)
    }  # fmt: skip
    # every usable address of an interface that is up, or loopback when there is none
    assert set(shown) == (usable or {"127.0.0.1"})
    note = wildcard_note("0.0.0.0", shown)
    assert socket.gethostname() in note and "0.0.0.0" in note
    assert all(a in note for a in shown[1:])


def test_ipv6_wildcard_may_announce_ipv6_in_brackets():
    shown = client_addresses("::")
    assert "::" not in shown and set(client_addresses("0.0.0.0")) <= set(shown)
    assert all(url_host(a) == (f"[{a}]" if ":" in a else a) for a in shown)


def test_a_bound_address_is_announced_as_it_is():
    assert client_addresses("127.0.0.1") == ["127.0.0.1"]
    assert client_addresses("10.1.2.3") == ["10.1.2.3"]
    assert wildcard_note("10.1.2.3", ["10.1.2.3"]) == ""
