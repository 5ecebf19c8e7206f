"""The metadata server's floating address: it moves to a live head when its head dies.

Every head with ``[cluster] mds_address`` campaigns for an etcd lease under its own key (the
election of engine/cluster/leader.py, the maintenance leader's code with another key and TTL).
The holder adds the address to ``[cluster] mds_interface`` (``ip addr``), announces it so
every host on the segment sends to its MAC at once (IPv4: gratuitous ARP, a raw AF_PACKET
frame; IPv6: an unsolicited Neighbour Advertisement with the override flag, RFC 4861 7.2.6, on
a raw ICMPv6 socket), and serves there: its NFS listener takes every local address
(``nfs.host`` 0.0.0.0, or :: for an IPv6 address), so clients of the address reach it as soon
as the address is up. An IPv6 address is added without duplicate address detection
(``nodad``): DAD would keep it tentative, taking no connections, for a second or more, and
the lease already makes sure no other head has it. With several heads over one catalog, only
the holder expires a dead head and takes its clients' records (``takes_over``, read by
appliance/nfs/state/heads.py), so the clients that follow the address reclaim where they land.

Two heads never answer on the address:
- The address is given a kernel lifetime (``valid_lft``) that ends at least ``LIFETIME_MARGIN_S``
  before the lease could end by etcd's count, and is refreshed only while keepalives succeed.
  A holder killed outright (kill -9) or stalled loses the address by the kernel's own clock,
  before etcd lets another head win the lease. The kernel checks lifetimes in whole seconds
  (an address of lifetime L goes between L and L + 1 s after it was set), hence the margin;
  an `ip` command that took so long that the margin is spent is repeated with a shorter one.
- When office ends (lease lost, or its end by the local clock passed; a clean stop resigns) the
  holder deletes the address and closes every connection made to it (``on_released``). While
  office lasts but a keepalive is late, the address is neither renewed nor deleted: the kernel
  deletes it when its lifetime ends, unless a keepalive comes back first (a loaded host whose
  keepalives take a second does not drop its clients' connections).
- At start a head deletes the address if its interface holds it (a previous instance's).

A head takes the address within the lease TTL of its holder's death plus a watch round trip
and an ``ip`` command (tests/cluster/test_mds_failover.py measures it).
"""

from __future__ import annotations

import ipaddress
import logging
import math
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable

from engine.base.ratelog import RateLimitedLog
from engine.cluster.etcd import EtcdClient
from engine.cluster.leader import FencedLeader

DEFAULT_KEY = "/shingle/mds-address"
LIFETIME_MARGIN_S = 1.2  # the kernel's whole-second lifetime check, plus the `ip` command
MIN_TTL_S = 4  # lifetimes of at least 1 s between keepalives (every TTL / 3)
GUARD_PERIOD_S = 0.1
GARP_REPEAT_S = (0.0, 1.1)  # a second frame past the neighbour tables' 1 s lock time
IP_TIMEOUT_S = 5.0
ETH_P_ARP = 0x0806
ETH_P_IP = 0x0800

log = logging.getLogger("shingle.cluster")
_trouble = RateLimitedLog(log)


Interface = ipaddress.IPv4Interface | ipaddress.IPv6Interface


def parse_address(text: str) -> Interface:
    """``ADDRESS/PREFIX`` (IPv4 or IPv6) as an interface; ValueError with the reason
    otherwise. An IPv6 link-local address is refused: it means nothing without its interface
    (a zone), and clients on other links cannot reach it."""
    text = str(text).strip()
    if "/" not in text:
        raise ValueError(f"{text!r}: expected ADDRESS/PREFIX (10.0.0.9/24 or fd00::9/64)")
    try:
        interface = ipaddress.ip_interface(text)
    except ValueError:
        raise ValueError(
            f"{text!r}: expected an IPv4 or IPv6 ADDRESS/PREFIX (10.0.0.9/24 or fd00::9/64)"
        ) from None
    ip = interface.ip
    if ip.is_unspecified or ip.is_loopback or ip.is_multicast:
        raise ValueError(f"{text!r}: not an address a host can take")
    if isinstance(ip, ipaddress.IPv6Address) and (ip.is_link_local or ip.ipv4_mapped):
        raise ValueError(f"{text!r}: not an IPv6 address that can move (link-local or mapped)")
    return interface


def arp_frame(mac: bytes, ip: ipaddress.IPv4Address) -> bytes:
    """A gratuitous ARP request: broadcast, sender and target address both ``ip``. Linux
    updates an existing neighbour entry from it at once (its lock time does not apply to
    gratuitous ARP)."""
    ethernet = b"\xff" * 6 + mac + struct.pack("!H", ETH_P_ARP)
    arp = struct.pack("!HHBBH", 1, ETH_P_IP, 6, 4, 1) + mac + ip.packed + b"\x00" * 6 + ip.packed
    return ethernet + arp


def send_gratuitous_arp(interface: str, ip: ipaddress.IPv4Address) -> None:
    """One gratuitous ARP frame out of ``interface`` (needs CAP_NET_RAW)."""
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ARP)) as sock:
        sock.bind((interface, 0))
        mac = sock.getsockname()[4]
        if len(mac) != 6:
            raise OSError(f"{interface} has no Ethernet address: no ARP there")
        sock.send(arp_frame(mac, ip))


def neighbour_advertisement(mac: bytes, ip: ipaddress.IPv6Address) -> bytes:
    """An unsolicited Neighbour Advertisement's ICMPv6 message (RFC 4861 4.4): type 136, the
    override flag (not solicited, not a router), target ``ip``, and the target link-layer
    address option naming ``mac``. The checksum is left 0: the kernel fills it in for raw
    ICMPv6 sockets. Linux replaces the link-layer address of an existing neighbour entry with
    it at once (the override flag)."""
    header = struct.pack("!BBHI", 136, 0, 0, 0x20000000) + ip.packed
    return header + struct.pack("!BB", 2, 1) + mac  # option 2, length 1 (8 bytes)


def interface_mac(interface: str) -> bytes:
    """The Ethernet address of ``interface``; OSError when it has none."""
    try:
        with open(f"/sys/class/net/{interface}/address") as f:
            mac = bytes.fromhex(f.read().strip().replace(":", ""))
    except ValueError:
        mac = b""
    if len(mac) != 6:
        raise OSError(f"{interface} has no Ethernet address: no neighbour advertisement there")
    return mac


def send_neighbour_advertisement(interface: str, ip: ipaddress.IPv6Address) -> None:
    """One unsolicited Neighbour Advertisement to all nodes (ff02::1) out of ``interface``
    (needs CAP_NET_RAW). Hop limit 255: a receiver drops neighbour discovery with any other
    (it proves the sender is on the link)."""
    message = neighbour_advertisement(interface_mac(interface), ip)
    index = socket.if_nametoindex(interface)
    with socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6) as sock:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_HOPS, 255)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_IF, index)
        sock.sendto(message, ("ff02::1", 0, 0, index))


def announce(interface: str, ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> None:
    """Tell the segment that ``ip`` is at this host's ``interface`` now."""
    if isinstance(ip, ipaddress.IPv6Address):
        send_neighbour_advertisement(interface, ip)
    else:
        send_gratuitous_arp(interface, ip)


class FloatingAddress:
    """The address on this host's interface, through iproute2's ``ip``."""

    def __init__(self, address: Interface, interface: str):
        self.address = address
        self.interface = interface
        self.family = "-6" if address.version == 6 else "-4"

    @property
    def ip(self) -> str:
        return str(self.address.ip)

    def _ip(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S, check=False
        )

    def check_interface(self) -> None:
        """OSError naming the interface when this host has none of that name."""
        done = self._ip("link", "show", "dev", self.interface)
        if done.returncode != 0:
            raise OSError(f"interface {self.interface!r}: {done.stderr.strip() or 'not found'}")

    def present(self) -> bool:
        done = self._ip("-o", self.family, "addr", "show", "dev", self.interface)
        return done.returncode == 0 and f" {self.address.with_prefixlen} " in done.stdout

    def put(self, lifetime_s: int) -> None:
        """Add the address, or renew its lifetime: the kernel deletes it ``lifetime_s`` (to
        ``lifetime_s`` + 1) seconds from now unless renewed."""
        life = str(max(1, int(lifetime_s)))
        # IPv6: no duplicate address detection, which would keep it tentative (taking no
        # connections) for a second or more; the lease makes sure no other head has it
        nodad = ("nodad",) if self.address.version == 6 else ()
        done = self._ip(
            "addr", "replace", self.address.with_prefixlen, "dev", self.interface,
            "valid_lft", life, "preferred_lft", life, *nodad,
        )  # fmt: skip
        if done.returncode != 0:
            raise OSError(f"ip addr replace {self.address} dev {self.interface}: "
                          f"{done.stderr.strip()}")  # fmt: skip

    def remove(self) -> bool:
        """Delete the address; True when it was there."""
        done = self._ip("addr", "del", self.address.with_prefixlen, "dev", self.interface)
        if done.returncode == 0:
            return True
        if self.present():
            raise OSError(f"ip addr del {self.address} dev {self.interface}: "
                          f"{done.stderr.strip()}")  # fmt: skip
        return False


class MdsAddress:
    """This head's campaign for the floating address (see the module docstring)."""

    def __init__(
        self,
        client: EtcdClient,
        address: FloatingAddress,
        name: str | None = None,
        *,
        ttl_s: float = 5.0,
        key: str = DEFAULT_KEY,
        on_released: Callable[[str], object] | None = None,
    ):
        if ttl_s < MIN_TTL_S:
            raise ValueError(f"metadata server address lease {ttl_s} s: at least {MIN_TTL_S} s")
        self.address = address
        self.on_released = on_released
        self.leader = FencedLeader(
            client, name, ttl_s=ttl_s, key=key, role="metadata server address holder"
        )
        self._wake = threading.Event()
        self.leader.on_lost = lambda _reason: self._wake.set()
        self._expires = 0.0  # monotonic: the kernel deletes the address no earlier than this
        self._since: float | None = None  # time.time() the address came up here
        self._garp_due: list[float] = []
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self.moves = 0  # how many times this head took the address

    @property
    def holding(self) -> bool:
        """Whether this head has the address up and the lease to keep it."""
        return self._expires > 0 and self.leader.held_until() > time.monotonic()

    def state(self) -> dict:
        election = self.leader.state()
        return {
            "address": str(self.address.address),
            "interface": self.address.interface,
            "holding": self.holding,
            "holder": election.leader_name,
            "since": self._since if self.holding else None,
        }

    # -- life -------------------------------------------------------------------------------------
    def start(self) -> MdsAddress:
        self.address.check_interface()
        if self.address.remove():
            log.warning(
                "cluster: %s was on %s from an earlier instance: deleted before campaigning",
                self.address.address, self.address.interface,
            )  # fmt: skip
        self._thread = threading.Thread(target=self._guard, name="mds-address", daemon=True)
        self._thread.start()
        self.leader.start()
        return self

    def stop(self) -> None:
        """The address deleted first, then the lease resigned: a successor takes it at once."""
        self._stopped.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(10)
        self._release("this head stops")
        self.leader.stop(resign=True)

    # -- the guard thread -----------------------------------------------------------------------
    def _guard(self) -> None:
        while not self._stopped.is_set():
            try:
                self._step()
            except Exception:  # the guard must outlive any one failure
                log.exception("cluster: the metadata server address guard failed")
                self._release("the guard failed")
            self._wake.wait(GUARD_PERIOD_S)
            self._wake.clear()

    def _step(self) -> None:
        now = time.monotonic()
        left = self.leader.held_until() - now
        lifetime = math.floor(left - LIFETIME_MARGIN_S)
        if lifetime < 1:
            # Office lost: the address goes now. Office still held but too close to its end
            # for a new lifetime (a keepalive slow to come back, as on a loaded host): the
            # lifetime set last ends before the lease can, so the kernel deletes the address
            # in time by itself, and a keepalive that comes back first renews it without the
            # clients' connections being closed.
            if self._expires and left <= 0:
                self._release("its lease is lost")
            return
        if self._expires and now + lifetime < self._expires + 1:
            self._send_garp_due(now)
            return  # the lifetime set last still ends within a second of what it could
        first = not self._expires
        try:
            lifetime = self._put_before(lifetime, now + left)
        except (OSError, subprocess.SubprocessError) as exc:
            _trouble.error("put", "cluster: cannot take %s: %s", self.address.address, exc)
            self.leader.step_down(f"the address could not be set: {exc}")
            self._expires = self._expires or now  # (deleted below, also when just added)
            self._release("it could not be set")
            return
        if lifetime < 1:
            self._expires = self._expires or now
            self._release("setting it took too long for its lease")
            return
        self._expires = now + lifetime
        if first:
            self.moves += 1
            self._since = time.time()
            self._garp_due = [now + delay for delay in GARP_REPEAT_S]
            log.warning(
                "cluster: %s serves the metadata server address %s on %s",
                self.leader.name, self.address.address, self.address.interface,
            )  # fmt: skip
        self._send_garp_due(now)

    def _put_before(self, lifetime: int, deadline: float) -> int:
        """Set the address with ``lifetime``, shorter when the command was slow: the kernel
        started counting somewhere during it, so the address must lapse (by lifetime + 1 s
        after the command returned at the latest) before ``deadline``. 0: no lifetime fits."""
        while lifetime >= 1:
            self.address.put(lifetime)
            if time.monotonic() + lifetime + 1 <= deadline:
                return lifetime
            lifetime -= 1
        return 0

    def _send_garp_due(self, now: float) -> None:
        due = [when for when in self._garp_due if when <= now]
        if not due:
            return
        self._garp_due = [when for when in self._garp_due if when > now]
        try:
            announce(self.address.interface, self.address.address.ip)
        except OSError as exc:  # clients then find the new holder when their entry ages
            _trouble.warning("garp", "cluster: announcing %s failed: %s",
                             self.address.address, exc)  # fmt: skip

    def _release(self, why: str) -> None:
        if not self._expires:
            return
        self._expires = 0.0
        self._since = None
        self._garp_due = []
        try:
            self.address.remove()
        except (OSError, subprocess.SubprocessError) as exc:
            # its lifetime ends it anyway, before the lease can pass to another head
            log.error("cluster: cannot delete %s: %s", self.address.address, exc)
        log.warning(
            "cluster: %s no longer serves %s: %s", self.leader.name, self.address.address, why
        )
        if self.on_released is not None:
            try:
                self.on_released(self.address.ip)
            except Exception:  # the address is gone whatever the callback does
                log.exception("cluster: closing the connections to %s failed", self.address.ip)
