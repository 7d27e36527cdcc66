"""Pod annotations → a frozen :class:`PodRequest` with effective CIDRs.

Pure: no logging, no state.  Every rejection is an :class:`AnnotationError`
naming the annotation and its value.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import TypeVar

import attrs

from flock.ipam._claims import MAX_CLAIMS_PER_POD, allowed_ranges, claim_refusal
from flock.ipam._errors import AnnotationError
from flock.ipam._layout import Layout, LayoutError, parse_layout
from flock.model import ANNOTATION_PREFIX, IPAddress, NodeConfig

IPV6 = ANNOTATION_PREFIX + "ipv6"
IPV4 = ANNOTATION_PREFIX + "ipv4"
CIDR6 = ANNOTATION_PREFIX + "cidr6"
CIDR4 = ANNOTATION_PREFIX + "cidr4"
IP_ALGO = ANNOTATION_PREFIX + "ip-algo"
ANYCAST = ANNOTATION_PREFIX + "anycast"
ADDRESSES = ANNOTATION_PREFIX + "addresses"

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
# One family's network type, the same throughout one call.
N = TypeVar("N", ipaddress.IPv4Network, ipaddress.IPv6Network)


@attrs.frozen
class PodRequest:
    """What one pod asks of the IPAM.

    ``cidr6``/``cidr4`` are the effective CIDRs (None: family not wanted);
    ``layout`` is the resolved ip-algo (pod beats node; None: random).
    """

    cidr6: ipaddress.IPv6Network | None
    cidr4: ipaddress.IPv4Network | None
    layout: Layout | None = None
    anycast: tuple[IPAddress, ...] = ()
    addresses: tuple[IPAddress, ...] = ()


def effective_cidr(block: N, candidates: tuple[N, ...], annotation: str, raw: str) -> N:
    """The first candidate that intersects *block* decides: equal or supernet →
    *block*, subnet → the candidate.  No candidate → *block*; all disjoint → error."""
    if not candidates:
        return block
    for cidr in candidates:
        if block.subnet_of(cidr):
            return block
        if cidr.subnet_of(block):
            return cidr
    raise AnnotationError(annotation, raw, f"a CIDR that overlaps this node's block {block}")


def parse_request(
    annotations: Mapping[str, str],
    node: NodeConfig,
    node_layout: Layout | None,
    node_addresses: frozenset[IPAddress] = frozenset(),
) -> PodRequest:
    """Resolve a pod's annotations against its node.

    *node_layout* is the node-level ip-algo already validated by the caller
    (an invalid node value is the caller's to log and drop).
    """
    want6 = _flag(annotations, IPV6, node.families.ipv6)
    want4 = _flag(annotations, IPV4, node.families.ipv4)
    if not want6 and not want4:
        key = IPV6 if IPV6 in annotations else IPV4
        raise AnnotationError(
            key,
            annotations.get(key, "false"),
            "at least one family: both ipv6 and ipv4 are off (annotation or node default)",
        )

    cidr6 = cidr4 = None
    cands6 = _cidrs(annotations, CIDR6, ipaddress.IPv6Network)
    if cands6 and not want6:
        raise AnnotationError(CIDR6, annotations[CIDR6], f'no cidr6 when IPv6 is off (set {IPV6}: "true")')
    if want6:
        cidr6 = effective_cidr(node.cidr6, cands6, CIDR6, annotations.get(CIDR6, ""))
    cands4 = _cidrs(annotations, CIDR4, ipaddress.IPv4Network)
    if cands4 and not want4:
        raise AnnotationError(CIDR4, annotations[CIDR4], f'no cidr4 when IPv4 is off (set {IPV4}: "true")')
    if want4:
        if node.cidr4 is None:
            raise AnnotationError(
                IPV4 if IPV4 in annotations else CIDR4,
                annotations.get(IPV4, annotations.get(CIDR4, "")),
                f"IPv4 on a node without an IPv4 block (NodeConfig {node.name} has no spec.cidr4)",
            )
        cidr4 = effective_cidr(node.cidr4, cands4, CIDR4, annotations.get(CIDR4, ""))

    layout = node_layout
    if IP_ALGO in annotations:
        try:
            layout = parse_layout(annotations[IP_ALGO])
        except LayoutError as exc:
            raise AnnotationError(IP_ALGO, exc.value, exc.reason) from None
    if layout is not None and cidr6 is not None:
        host_bits = 128 - cidr6.prefixlen
        if layout.bits > host_bits:
            key = IP_ALGO if IP_ALGO in annotations else CIDR6
            raise AnnotationError(
                key,
                annotations.get(key, ""),
                f"ip-algo {layout.text!r} needs {layout.bits} bits but {cidr6} has {host_bits} host bits",
            )

    # Counted before anything is parsed: 5,000 addresses are refused at once.
    claims = sum(annotations.get(key, "").count(",") + 1 for key in (ANYCAST, ADDRESSES) if annotations.get(key))
    if claims > MAX_CLAIMS_PER_POD:
        key = ANYCAST if ANYCAST in annotations else ADDRESSES
        raise AnnotationError(
            key, annotations[key], f"at most {MAX_CLAIMS_PER_POD} addresses in {ANYCAST} and {ADDRESSES} together"
        )
    anycast = _addresses(annotations, ANYCAST, node, node_addresses)
    addresses = _addresses(annotations, ADDRESSES, node, node_addresses)
    both = set(anycast) & set(addresses)
    if both:
        raise AnnotationError(ADDRESSES, annotations[ADDRESSES], f"{sorted(map(str, both))[0]} is also in {ANYCAST}")
    v6_anycast = next((a for a in anycast if a.version == 6), None)
    if v6_anycast is not None and cidr6 is None and not any(a.version == 6 for a in addresses):
        # Linux takes no device-only IPv6 multipath nexthop: the route's gateway is one of the pod's own IPv6 addresses.
        raise AnnotationError(
            ANYCAST,
            annotations[ANYCAST],
            f"{str(v6_anycast)!r} is IPv6 but the pod has no IPv6 address of its own (IPv6 is off for it)",
        )
    return PodRequest(cidr6=cidr6, cidr4=cidr4, layout=layout, anycast=anycast, addresses=addresses)


def _flag(annotations: Mapping[str, str], key: str, default: bool) -> bool:
    if key not in annotations:
        return default
    raw = annotations[key]
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise AnnotationError(key, raw, '"true" or "false"')
    return value == "true"


def _items(annotations: Mapping[str, str], key: str) -> list[str]:
    raw = annotations.get(key)
    if raw is None:
        return []
    items = [item.strip() for item in raw.split(",")]
    if not all(items):
        raise AnnotationError(key, raw, "a comma-separated list without empty items")
    return items


def _cidrs(annotations: Mapping[str, str], key: str, family: type[N]) -> tuple[N, ...]:
    raw = annotations.get(key, "")
    version = 6 if family is ipaddress.IPv6Network else 4
    out: list[N] = []
    for item in _items(annotations, key):
        try:
            cidr = ipaddress.ip_network(_plain(item), strict=True)
        except ValueError:
            raise AnnotationError(
                key, raw, f"{item!r} is not a CIDR with zero host bits, e.g. 2001:db8::/64 or 198.51.100.0/24"
            ) from None
        if not isinstance(cidr, family):
            raise AnnotationError(key, raw, f"{item!r} is IPv{cidr.version}; {key} takes IPv{version} CIDRs")
        if version == 4 and cidr.prefixlen > 30:
            raise AnnotationError(key, raw, f"{item!r}: /31 and /32 leave no usable address (use /30 or shorter)")
        if version == 6 and cidr.prefixlen > 127:
            raise AnnotationError(key, raw, f"{item!r}: a /128 has only the all-zero identifier (use /127 or shorter)")
        if cidr in out:
            raise AnnotationError(key, raw, f"{item!r} appears twice")
        out.append(cidr)
    return tuple(out)


def _plain(item: str) -> str:
    """Refuse IPv6 scope IDs: ``ipaddress`` takes any text after ``%`` and keeps
    it in the value (and its str), so it would reach the kernel and BIRD."""
    if "%" in item:
        raise ValueError(item)
    return item


def _addresses(
    annotations: Mapping[str, str], key: str, node: NodeConfig, node_addresses: frozenset[IPAddress]
) -> tuple[IPAddress, ...]:
    raw = annotations.get(key, "")
    out: list[IPAddress] = []
    seen: set[IPAddress] = set()
    specials = _special_addresses(node) if key in annotations else {}
    for item in _items(annotations, key):
        try:
            addr = ipaddress.ip_address(_plain(item))
        except ValueError:
            raise AnnotationError(key, raw, f"{item!r} is not an IP address without a scope ID") from None
        if getattr(addr, "ipv4_mapped", None) is not None:
            # ::ffff:a.b.c.d is the IPv4 address in IPv6 sockets, never a route of its own.
            raise AnnotationError(key, raw, f"{item!r} is an IPv4-mapped IPv6 address; write the IPv4 address")
        if addr.is_unspecified or addr.is_multicast or addr.is_loopback or addr.is_link_local:
            raise AnnotationError(key, raw, f"{item!r} is not a unicast address a pod can own")
        if addr in seen:
            raise AnnotationError(key, raw, f"{item!r} appears twice")
        seen.add(addr)
        special = specials.get(addr)
        if special:
            raise AnnotationError(key, raw, f"{item!r} is the {special}, which no pod may own")
        refusal = claim_refusal(addr, node, node_addresses)
        if refusal is not None:
            raise AnnotationError(
                key,
                raw,
                f"{item!r} is {refusal}; a pod may claim global unicast addresses in {', '.join(allowed_ranges(node))}"
                " (not the node's own addresses, router ID or BGP peers)",
            )
        out.append(addr)
    return tuple(out)


def _special_addresses(node: NodeConfig) -> dict[IPAddress, str]:
    """Addresses of the node blocks no pod may own, with what they are."""
    out: dict[IPAddress, str] = {
        node.cidr6.network_address: f"subnet-router anycast address of this node's block {node.cidr6}"
    }
    if node.cidr4 is not None:
        out[node.cidr4.network_address] = f"network address of this node's block {node.cidr4}"
        out[node.cidr4.broadcast_address] = f"broadcast address of this node's block {node.cidr4}"
    return out
