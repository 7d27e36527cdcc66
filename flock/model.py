"""The values every layer shares: NodeConfig, PodInfo, Allocation.

Frozen attrs values with validators, built from Kubernetes objects in their
JSON (camelCase dict) form by named classmethods, so tests make them without
an API server.  Validation failures raise :class:`InvalidObject`, naming the
field and the value.
"""

from __future__ import annotations

import enum
import ipaddress
import re
from collections.abc import Mapping
from typing import Any

import attrs

ANNOTATION_PREFIX = "flock.fritzlab.net/"
IP_ALGO_ANNOTATION = ANNOTATION_PREFIX + "ip-algo"

IPv6Network = ipaddress.IPv6Network
IPv4Network = ipaddress.IPv4Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# BGP peer names become BIRD protocol symbols: the renderer's rule (flock.bird.render),
# checked here so a bad name fails the NodeConfig, naming the field, not every render.
_PEER_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,59}\Z")


class InvalidObject(ValueError):
    """A Kubernetes object whose field does not hold what flock needs."""

    def __init__(self, kind: str, name: str, field: str, value: Any, expected: str) -> None:
        self.kind, self.name, self.field, self.value, self.expected = kind, name, field, value, expected
        super().__init__(f"{kind} {name!r}: {field}={value!r}: expected {expected}")


def _get(obj: Mapping[str, Any], path: str, default: Any = None) -> Any:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            return default
        cur = cur[part]
    return cur


@attrs.frozen
class BgpPeer:
    name: str
    address: IPAddress
    asn: int


@attrs.frozen
class BgpConfig:
    asn: int
    router_id: ipaddress.IPv4Address
    peers: tuple[BgpPeer, ...] = ()


@attrs.frozen
class Families:
    ipv6: bool = True
    ipv4: bool = False


def _plain(value: Any) -> str:
    """Refuse IPv6 scope IDs: ``ipaddress`` accepts any text after ``%``, which
    would let a NodeConfig carry arbitrary text into rendered configs.  Refuse
    non-strings too: ``ipaddress`` reads an int (or a bool) as an address."""
    if not isinstance(value, str):
        raise TypeError("expected a string")
    if "%" in value:
        raise ValueError("scope IDs are not allowed")
    return value


def _block(kind: str, name: str, field: str, raw: Any, network: type, max_prefix: int, example: str) -> Any:
    """A node pod block: a CIDR of *network*'s family, no host bits, at most /max_prefix."""
    try:
        block = network(_plain(raw), strict=True)
    except (TypeError, ValueError):
        family = "IPv6" if network is ipaddress.IPv6Network else "IPv4"
        raise InvalidObject(kind, name, field, raw, f"an {family} CIDR such as {example}") from None
    if block.prefixlen > max_prefix:
        raise InvalidObject(kind, name, field, raw, f"a prefix of /{max_prefix} or shorter")
    return block


MAX_ANNOUNCE_RANGES = 64


def _announce_ranges(kind: str, name: str, raw: Any) -> tuple[Any, ...]:
    """spec.announceRanges: at most 64 unicast CIDRs without host bits (the CRD's CEL rules say the same)."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) > MAX_ANNOUNCE_RANGES:
        raise InvalidObject(kind, name, "spec.announceRanges", raw, f"a list of at most {MAX_ANNOUNCE_RANGES} CIDRs")
    out: list[Any] = []
    for i, item in enumerate(raw):
        field = f"spec.announceRanges[{i}]"
        try:
            if "/" not in _plain(item):
                raise ValueError("no prefix length")
            net = ipaddress.ip_network(item, strict=True)
        except (TypeError, ValueError):
            raise InvalidObject(kind, name, field, item, "a CIDR such as 2001:db8:53::/48") from None
        first = net.network_address
        if first.is_multicast or first.is_loopback or first.is_link_local or net.prefixlen == 0:
            raise InvalidObject(kind, name, field, item, "a unicast range (not multicast, loopback, link-local or all)")
        out.append(net)
    return tuple(out)


def _asn(kind: str, name: str, field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 4294967295:
        raise InvalidObject(kind, name, field, value, "an AS number 1..4294967295")
    return value


@attrs.frozen
class NodeConfig:
    """This node's pod blocks, BGP settings and pod defaults (CRD v1alpha1)."""

    name: str
    cidr6: IPv6Network
    cidr4: IPv4Network | None = None
    families: Families = Families()
    bgp: BgpConfig | None = None
    ip_algo: str | None = None  # raw node-level annotation; validated by flock.ipam
    resource_version: str = ""
    # spec.announceRanges: where pods' anycast/addresses may come from besides the node blocks.
    announce_ranges: tuple[IPv6Network | IPv4Network, ...] = ()

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> NodeConfig:
        kind = "NodeConfig"
        name = _get(obj, "metadata.name")
        if not isinstance(name, str) or not name:
            raise InvalidObject(kind, str(name), "metadata.name", name, "a non-empty name")
        spec = _get(obj, "spec", {})
        if not isinstance(spec, Mapping):
            raise InvalidObject(kind, name, "spec", spec, "an object")

        cidr6 = _block(kind, name, "spec.cidr6", spec.get("cidr6"), ipaddress.IPv6Network, 120, "2001:db8:0:1::/64")
        raw4 = spec.get("cidr4")
        cidr4 = (
            None
            if raw4 is None
            else _block(kind, name, "spec.cidr4", raw4, ipaddress.IPv4Network, 30, "198.51.100.0/24")
        )

        fam = spec.get("families") or {}
        if not isinstance(fam, Mapping):
            raise InvalidObject(kind, name, "spec.families", fam, "an object {ipv6: bool, ipv4: bool}")
        flags = {}
        for key, default in (("ipv6", True), ("ipv4", False)):
            value = fam.get(key, default)
            if not isinstance(value, bool):
                raise InvalidObject(kind, name, f"spec.families.{key}", value, "true or false")
            flags[key] = value
        families = Families(**flags)
        if families.ipv4 and cidr4 is None:
            raise InvalidObject(
                kind, name, "spec.families.ipv4", True, "spec.cidr4 to be set when ipv4 is on by default"
            )

        bgp = None
        raw_bgp = spec.get("bgp")
        if raw_bgp is not None:
            if not isinstance(raw_bgp, Mapping):
                raise InvalidObject(kind, name, "spec.bgp", raw_bgp, "an object")
            asn = _asn(kind, name, "spec.bgp.asn", raw_bgp.get("asn"))
            rid = raw_bgp.get("routerID")
            try:
                router_id = ipaddress.IPv4Address(_plain(rid))
            except (TypeError, ValueError):
                raise InvalidObject(kind, name, "spec.bgp.routerID", rid, "an IPv4 address") from None
            peers = []
            raw_peers = raw_bgp.get("peers") or []
            if not isinstance(raw_peers, list):
                raise InvalidObject(kind, name, "spec.bgp.peers", raw_peers, "a list")
            seen = set()
            for i, p in enumerate(raw_peers):
                field = f"spec.bgp.peers[{i}]"
                if not isinstance(p, Mapping):
                    raise InvalidObject(kind, name, field, p, "an object {name, address, asn}")
                pname = p.get("name")
                if not isinstance(pname, str) or not _PEER_NAME.match(pname):
                    raise InvalidObject(
                        kind,
                        name,
                        field + ".name",
                        pname,
                        "a name of at most 60 ASCII letters, digits, '-' and '_' starting with a letter",
                    )
                if pname in seen:
                    raise InvalidObject(kind, name, field + ".name", pname, "a name unique among peers")
                seen.add(pname)
                try:
                    addr = ipaddress.ip_address(_plain(p.get("address")))
                except (TypeError, ValueError):
                    raise InvalidObject(kind, name, field + ".address", p.get("address"), "an IP address") from None
                peers.append(BgpPeer(pname, addr, _asn(kind, name, field + ".asn", p.get("asn"))))
            bgp = BgpConfig(asn, router_id, tuple(peers))

        announce_ranges = _announce_ranges(kind, name, spec.get("announceRanges"))

        annotations = _get(obj, "metadata.annotations") or {}
        if not isinstance(annotations, Mapping):
            raise InvalidObject(kind, name, "metadata.annotations", annotations, "an object of strings")
        ip_algo = annotations.get(IP_ALGO_ANNOTATION)
        if ip_algo is not None and not isinstance(ip_algo, str):
            raise InvalidObject(kind, name, f"metadata.annotations[{IP_ALGO_ANNOTATION}]", ip_algo, "a string")
        return cls(
            name=name,
            cidr6=cidr6,
            cidr4=cidr4,
            families=families,
            bgp=bgp,
            ip_algo=ip_algo,
            resource_version=str(_get(obj, "metadata.resourceVersion", "")),
            announce_ranges=announce_ranges,
        )


@attrs.frozen
class OwnerRef:
    kind: str
    name: str
    controller: bool = False


@attrs.frozen
class PodInfo:
    """What flock needs of a Pod: identity, annotations, owners, first image."""

    namespace: str
    name: str
    uid: str = ""
    node_name: str = ""
    annotations: Mapping[str, str] = attrs.field(factory=dict, converter=lambda d: dict(d or {}), hash=False)
    labels: Mapping[str, str] = attrs.field(factory=dict, converter=lambda d: dict(d or {}), hash=False)
    owners: tuple[OwnerRef, ...] = ()
    first_image: str | None = None
    resource_version: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> PodInfo:
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        containers = spec.get("containers") or []
        owners = tuple(
            OwnerRef(str(o.get("kind", "")), str(o.get("name", "")), bool(o.get("controller", False)))
            for o in meta.get("ownerReferences") or []
        )
        return cls(
            namespace=str(meta.get("namespace") or "default"),
            name=str(meta.get("name", "")),
            uid=str(meta.get("uid", "")),
            node_name=str(spec.get("nodeName") or ""),
            annotations={str(k): str(v) for k, v in (meta.get("annotations") or {}).items()},
            labels={str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
            owners=owners,
            first_image=(containers[0].get("image") if containers and containers[0].get("image") else None),
            resource_version=str(meta.get("resourceVersion", "")),
        )


class AllocationState(enum.Enum):
    PENDING = "pending"
    COMMITTED = "committed"


@attrs.frozen
class Allocation:
    """One pod interface's addresses, keyed by container ID (DESIGN: state on the node)."""

    container_id: str
    namespace: str
    pod: str
    pod_uid: str
    if_name: str
    netns: str
    ip6: ipaddress.IPv6Address | None = None
    ip4: ipaddress.IPv4Address | None = None
    anycast: tuple[IPAddress, ...] = ()
    addresses: tuple[IPAddress, ...] = ()
    state: AllocationState = AllocationState.PENDING
    created: float = 0.0
    updated: float = 0.0

    @property
    def all_addresses(self) -> tuple[IPAddress, ...]:
        own = tuple(a for a in (self.ip6, self.ip4) if a is not None)
        return own + self.addresses + self.anycast
