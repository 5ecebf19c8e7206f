"""Where clients reach a server of this host: what `shingle serve` announces when it is bound to
every address (``nfs.host = "0.0.0.0"``), instead of the wildcard, which no client can use."""

from __future__ import annotations

import ipaddress
import socket

import psutil

WILDCARDS = frozenset({"", "0.0.0.0", "::"})
# a documentation address (RFC 5737): connecting a UDP socket to it sends nothing, and the
# kernel picks the source address of the default route
_PROBE = "192.0.2.1"


def _default_route_source() -> str | None:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((_PROBE, 9))
            return probe.getsockname()[0]
    except OSError:  # no default route (a network namespace, an isolated host)
        return None


def _usable(address: str, ipv6: bool) -> bool:
    ip = ipaddress.ip_address(address.split("%")[0])
    if ip.version == 6 and not ipv6:
        return False
    return not (ip.is_loopback or ip.is_link_local or ip.is_unspecified or ip.is_multicast)


def client_addresses(bind_host: str) -> list[str]:
    """The addresses a client can use for a server bound to ``bind_host``: that address itself,
    or for a wildcard this host's addresses on interfaces that are up (IPv6 ones only for
    ``::``), the default route's first; loopback and link-local ones only when there is no
    other (then 127.0.0.1)."""
    if bind_host not in WILDCARDS:
        return [bind_host]
    ipv6 = bind_host == "::"
    families = {socket.AF_INET, socket.AF_INET6} if ipv6 else {socket.AF_INET}
    stats = psutil.net_if_stats()
    found: list[str] = []
    for name, addrs in psutil.net_if_addrs().items():
        if name in stats and not stats[name].isup:
            continue
        for addr in addrs:
            if addr.family in families and _usable(addr.address, ipv6):
                found.append(addr.address.split("%")[0])
    preferred = _default_route_source()
    found.sort(key=lambda a: (a != preferred, ":" in a, a))
    return list(dict.fromkeys(found)) or ["127.0.0.1"]


def listening_socket(host: str, port: int, backlog: int = 256) -> socket.socket:
    """A TCP socket bound to ``host`` and listening (non-blocking). ``::`` takes IPv4 clients
    too (as mapped addresses): asyncio's own IPv6 listeners are IPv6 only, so a server on
    ``::`` would refuse every IPv4 client."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, int(host != "::"))
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def url_host(address: str) -> str:
    """``address`` as the host part of a URL or a mount source (IPv6 in brackets)."""
    return f"[{address}]" if ":" in address else address


def wildcard_note(bind_host: str, addresses: list[str]) -> str:
    """What to add after an announced URL of a server bound to ``bind_host``: for a wildcard,
    the other addresses and the host name ('' otherwise)."""
    if bind_host not in WILDCARDS:
        return ""
    others = ", ".join(addresses[1:])
    also = f"; also {others}" if others else ""
    return f"   (listening on {bind_host or '0.0.0.0'}{also}; host name {socket.gethostname()})"
