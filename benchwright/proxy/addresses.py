"""Which network addresses belong to the platform rather than to the internet: one rule for every outbound path.

The egress proxy (sandboxes' traffic) and Fetch (the worker downloading a user's dataset URL) both connect only to
addresses this module calls public, after resolving the name once and connecting to that very address, unless the
operator listed the exact ``host:port`` endpoint in ``egress_internal_allowed``. A user's host policy can open a
*name*; it can never open the platform's own network (the API, Temporal and its UI, the store, cloud metadata).

Classification folds addresses that carry an IPv4 address inside an IPv6 one (IPv4-mapped ``::ffff:a.b.c.d``,
IPv4-compatible ``::a.b.c.d``, NAT64 ``64:ff9b::/96``, 6to4 ``2002::/16``) to the IPv4 address they reach, so
``[::ffff:127.0.0.1]`` is loopback like ``127.0.0.1``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any

__all__ = ["Endpoint", "endpoint_allowed", "internal_reason", "parse_endpoints"]

Endpoint = tuple[str, int]
"""``(host or address, port)`` as the operator wrote it in ``egress_internal_allowed``."""

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_V4_COMPATIBLE = ipaddress.ip_network("::/96")


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address stands for on the wire, if it is one of the embedding forms."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64 or (ip in _V4_COMPATIBLE and int(ip) > 1):  # ::1 and :: are themselves loopback/unspecified
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def internal_reason(address: str | IPAddress) -> str | None:
    """Why ``address`` is inside the platform's network, or None when it is a public (globally routable) address.

    Args:
        address: An IP address as text (``127.0.0.1``, ``::1``, ``fe80::1%eth0``; a zone is ignored) or an
            ``ipaddress`` object.

    Returns:
        ``"loopback"``, ``"private"``, ``"link-local"`` (this includes the cloud metadata address
        169.254.169.254), ``"unspecified"``, ``"multicast"``, ``"reserved"``, or ``"not publicly routable"``
        (shared address space 100.64.0.0/10, documentation ranges, ...); None for a public address.

    Raises:
        ValueError: ``address`` is not an IP address.
    """
    ip = ipaddress.ip_address(address.split("%", 1)[0]) if isinstance(address, str) else address
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(ip)
        if embedded is not None:
            reason = internal_reason(embedded)
            return f"{reason} (as {embedded})" if reason else None
    for reason, hit in (("loopback", ip.is_loopback), ("unspecified", ip.is_unspecified),
                        ("link-local", ip.is_link_local), ("multicast", ip.is_multicast),
                        ("reserved", ip.is_reserved), ("private", ip.is_private)):
        if hit:
            return reason
    # Multicast is "global" to the ipaddress module, so it is checked above; everything else not global
    # (100.64.0.0/10, where some clouds put their metadata service; documentation ranges) is not ours to reach.
    return None if ip.is_global else "not publicly routable"


def parse_endpoints(entries: Iterable[str]) -> frozenset[Endpoint]:
    """``host:port`` strings (``127.0.0.1:8080``, ``mirror.internal:3141``, ``[::1]:8000``) as endpoints.

    Raises:
        ValueError: an entry has no port or a port that is not a number in 1-65535, naming the entry.
    """
    out: set[Endpoint] = set()
    for entry in entries:
        host, sep, port = entry.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ValueError(f"internal endpoint {entry!r} must be host:port (e.g. 127.0.0.1:8080)")
        out.add((host[1:-1] if host.startswith("[") and host.endswith("]") else host, int(port)))
    return frozenset(out)


def endpoint_allowed(allowed: frozenset[Endpoint], *, host: str, address: str, port: int) -> bool:
    """Whether the operator listed this endpoint, by the name asked for or by the address it resolved to."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return (address, port) in allowed or (bare, port) in allowed or (host, port) in allowed


def first_internal(infos: Iterable[tuple[Any, ...]]) -> tuple[str, str] | None:
    """The first address of a ``getaddrinfo`` answer that is inside the platform's network, with why; None when
    every address is public (one internal address is enough to refuse: the connect could pick it)."""
    for info in infos:
        address = str(info[4][0])
        why = internal_reason(address)
        if why is not None:
            return address, why
    return None
