"""Render BIRD 2's configuration for one node: a pure function of typed values.

Nothing reaches the template as caller-supplied text. Every value is checked
for its type (``ipaddress`` objects, ``int``, names against a strict regex)
and turned into text here, so a pod annotation or a NodeConfig field cannot
inject BIRD syntax: anything else raises :class:`RenderError`, naming the
field and the value.

Ordering is canonical (peers by name, addresses by family then value, no
duplicates), so the same inputs in any order give byte-identical text, and
comparing with the file on disk tells whether BIRD needs reconfiguring.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Callable, Iterable
from typing import Any

import attrs
import jinja2

from flock.model import BgpPeer, IPAddress, NodeConfig

# Kubernetes object names (DNS-1123 subdomain); only ever placed in a comment.
_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?\Z")
# Peer names become quoted BIRD symbols ('bgp_<name>'); BIRD symbols hold at most 64 bytes.
_PEER_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,59}\Z")

# The text of an address or network as it may appear in the config. Python's
# ipaddress accepts IPv6 scope IDs of any text ("2001:db8::1%x; } ..."), so the
# type alone does not make a value safe: its text is checked too.
_ADDRESS_TEXT = re.compile(r"[0-9a-f.:]+\Z")
_NETWORK_TEXT = re.compile(r"[0-9a-f.:]+/[0-9]{1,3}\Z")

# Route preferences: BGP's default is 100. Routes flock put in the kernel (a
# local pod, a local anycast member) must beat the same prefix heard from a
# peer, or BIRD would export the peer's route into the kernel over our own.
KERNEL_PREFERENCE = 250


class RenderError(ValueError):
    """An input that cannot be placed in a BIRD config; names field and value."""

    def __init__(self, field: str, value: Any, expected: str) -> None:
        self.field, self.value, self.expected = field, value, expected
        super().__init__(f"{field}={value!r}: expected {expected}")


def _int_in(lo: int, hi: int) -> Callable[[Any, attrs.Attribute, Any], None]:
    def check(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise RenderError(attribute.name, value, f"an integer {lo}..{hi}")

    return check


@attrs.frozen
class BgpTimers:
    """Short BGP timers for labs and tests (BIRD's defaults take ~5 s to connect).

    Seconds; the names follow BIRD's options (``connect delay time`` …).
    """

    connect_delay: int = attrs.field(default=1, validator=_int_in(1, 65535))
    connect_retry: int = attrs.field(default=1, validator=_int_in(1, 65535))
    error_wait_min: int = attrs.field(default=1, validator=_int_in(1, 65535))
    error_wait_max: int = attrs.field(default=5, validator=_int_in(1, 65535))
    hold: int = attrs.field(default=3, validator=_int_in(3, 65535))
    keepalive: int = attrs.field(default=1, validator=_int_in(1, 65535))

    def __attrs_post_init__(self) -> None:
        if self.error_wait_max < self.error_wait_min:
            raise RenderError("error_wait_max", self.error_wait_max, f"at least error_wait_min ({self.error_wait_min})")
        if self.keepalive >= self.hold:
            raise RenderError("keepalive", self.keepalive, f"less than hold ({self.hold})")


def _route_protocol(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    # 0-4 are the kernel's own (unspec, redirect, kernel, boot, static), which
    # BIRD cannot learn selectively; 12 is BIRD's own, which it never learns.
    if isinstance(value, bool) or not isinstance(value, int) or not 5 <= value <= 255 or value == 12:
        raise RenderError(attribute.name, value, "a route protocol number 5..255 other than 12 (bird)")


@attrs.frozen
class RenderSettings:
    """Node-independent settings: flock's kernel route protocol number, lab timers."""

    route_protocol: int = attrs.field(validator=_route_protocol)
    bgp_timers: BgpTimers | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(BgpTimers))
    )


@attrs.frozen
class _PeerView:
    protocol: str
    address: str
    asn: str
    ipv6_channel: bool
    extended_next_hop: bool
    ibgp: bool


@attrs.frozen
class _FamilyView:
    version: int
    blocks: tuple[str, ...]
    anycast: tuple[str, ...]
    addresses: tuple[str, ...]


def _check_node_name(name: Any) -> str:
    if not isinstance(name, str) or not _NODE_NAME.match(name):
        raise RenderError("node.name", name, "a Kubernetes node name (lowercase letters, digits, '-', '.')")
    return name


def _check_asn(field: str, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 4294967295:
        raise RenderError(field, value, "an AS number 1..4294967295")
    return str(value)


def _check_network(field: str, value: Any, kind: type) -> str:
    if not isinstance(value, kind) or not _NETWORK_TEXT.match(str(value)):
        raise RenderError(field, value, f"an {kind.__name__} without a %scope")
    return str(value)


def _check_address(field: str, value: Any) -> IPAddress:
    if not isinstance(value, (ipaddress.IPv4Address, ipaddress.IPv6Address)) or not _ADDRESS_TEXT.match(str(value)):
        raise RenderError(field, value, "an IPv4Address or IPv6Address without a %scope")
    return value


def _check_addresses(field: str, values: Iterable[Any]) -> tuple[IPAddress, ...]:
    if isinstance(values, (str, bytes)):
        raise RenderError(field, values, "a collection of IPv4Address/IPv6Address values")
    out = {_check_address(field, value) for value in values}
    return tuple(sorted(out, key=lambda a: (a.version, int(a))))


def _peer_view(i: int, peer: Any, local_asn: int) -> _PeerView:
    field = f"node.bgp.peers[{i}]"
    if not isinstance(peer, BgpPeer):
        raise RenderError(field, peer, "a BgpPeer")
    if not isinstance(peer.name, str) or not _PEER_NAME.match(peer.name):
        raise RenderError(
            field + ".name", peer.name, "letters, digits, '-' and '_', starting with a letter, at most 60"
        )
    address = _check_address(field + ".address", peer.address)
    if address.is_link_local or address.is_multicast or address.is_unspecified or address.is_loopback:
        raise RenderError(field + ".address", address, "a unicast, non-link-local peer address")
    asn = _check_asn(field + ".asn", peer.asn)
    is_v6 = address.version == 6
    return _PeerView(
        protocol=f"bgp_{peer.name}",
        address=str(address),
        asn=asn,
        ipv6_channel=is_v6,
        extended_next_hop=is_v6,
        ibgp=peer.asn == local_asn,
    )


@functools.cache  # templates are package data: load and compile them once
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("flock.bird", "templates"),
        autoescape=False,  # BIRD syntax, not HTML: values are made safe by type checks instead
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def render(
    node: NodeConfig,
    *,
    anycast: Iterable[IPAddress] = (),
    addresses: Iterable[IPAddress] = (),
    settings: RenderSettings,
) -> str:
    """The complete ``bird.conf`` for ``node``.

    ``anycast`` and ``addresses`` are the anycast and extra pod addresses in
    use on this node (any order, duplicates allowed); they are announced as
    /128 or /32 while BIRD learns a matching route from the kernel (put there
    by flock with ``settings.route_protocol``). Raises :class:`RenderError`
    for any value that is not of the expected type and shape.
    """
    if not isinstance(node, NodeConfig):
        raise RenderError("node", node, "a NodeConfig")
    if not isinstance(settings, RenderSettings):
        raise RenderError("settings", settings, "a RenderSettings")
    node_name = _check_node_name(node.name)
    block6 = _check_network("node.cidr6", node.cidr6, ipaddress.IPv6Network)
    block4 = None if node.cidr4 is None else _check_network("node.cidr4", node.cidr4, ipaddress.IPv4Network)
    any_addrs = _check_addresses("anycast", anycast)
    extra_addrs = _check_addresses("addresses", addresses)

    router_id, local_asn, peers = None, None, []
    if node.bgp is not None:
        if not isinstance(node.bgp.router_id, ipaddress.IPv4Address):
            raise RenderError("node.bgp.router_id", node.bgp.router_id, "an IPv4Address")
        router_id = str(_check_address("node.bgp.router_id", node.bgp.router_id))
        local_asn = _check_asn("node.bgp.asn", node.bgp.asn)
        peers = [_peer_view(i, p, node.bgp.asn) for i, p in enumerate(node.bgp.peers)]
        protocols = [p.protocol for p in peers]
        if len(set(protocols)) != len(protocols):
            raise RenderError("node.bgp.peers", [p.name for p in node.bgp.peers], "unique peer names")
        peers.sort(key=lambda p: p.protocol)

    def family(version: int, blocks: tuple[str, ...]) -> _FamilyView:
        host = 128 if version == 6 else 32
        return _FamilyView(
            version=version,
            blocks=blocks,
            anycast=tuple(f"{a}/{host}" for a in any_addrs if a.version == version),
            addresses=tuple(f"{a}/{host}" for a in extra_addrs if a.version == version),
        )

    return (
        _environment()
        .get_template("bird.conf.j2")
        .render(
            node_name=node_name,
            router_id=router_id,
            local_asn=local_asn,
            route_protocol=str(settings.route_protocol),
            kernel_preference=str(KERNEL_PREFERENCE),
            families=[family(6, (block6,)), family(4, () if block4 is None else (block4,))],
            peers=peers,
            timers=settings.bgp_timers,
        )
    )
