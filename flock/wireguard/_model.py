"""The values a WireGuard device is configured with: an endpoint and a peer."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

import attrs

from flock.wireguard._keys import PublicKey

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def network_order(net: IPNetwork) -> tuple[int, int, int]:
    """IPv6 after IPv4, then by address and prefix: the order allowed IPs are written and compared in."""
    return (net.version, int(net.network_address), net.prefixlen)


@attrs.frozen(order=True)
class Endpoint:
    """Where a peer's UDP packets go: ``192.0.2.1:51820`` or ``[2001:db8::1]:51820``, as ``wg`` writes it."""

    address: IPAddress
    port: int = attrs.field(validator=attrs.validators.and_(attrs.validators.ge(1), attrs.validators.le(65535)))

    @classmethod
    def parse(cls, text: str) -> Endpoint:
        host, sep, port = text.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"endpoint {text!r}: expected ADDRESS:PORT")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        return cls(ipaddress.ip_address(host), int(port))

    def __str__(self) -> str:
        if self.address.version == 6:
            return f"[{self.address}]:{self.port}"
        return f"{self.address}:{self.port}"


def _networks(items: Iterable[IPNetwork]) -> frozenset[IPNetwork]:
    return frozenset(items)


@attrs.frozen
class Peer:
    """One peer as flock configures it: the other node's key, where to send, which addresses are its.

    *endpoint* None: no opinion (a peer added without one only answers; an existing endpoint is kept).
    *persistent_keepalive* None: off."""

    public_key: PublicKey
    endpoint: Endpoint | None
    allowed_ips: frozenset[IPNetwork] = attrs.field(converter=_networks)
    persistent_keepalive: int | None = None

    @property
    def sorted_allowed_ips(self) -> list[IPNetwork]:
        return sorted(self.allowed_ips, key=network_order)
