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

# spec.mtu bounds (the CRD says the same): IPv6 needs links of at least 1280
# bytes (RFC 8200); 9216 is the largest jumbo frame switches commonly carry.
MTU_MIN = 1280
MTU_MAX = 9216
# A pod's MTU when nothing better is known: no spec.mtu and no default route.
MTU_DEFAULT = 1500

# BGP peer names become BIRD protocol symbols: the renderer's rule (flock.bird.render),
# checked here so a bad name fails the NodeConfig, naming the field, not every render.
_PEER_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,59}\Z")


class InvalidObject(ValueError):
    """A Kubernetes object whose field does not hold what flock needs."""

    def __init__(self, kind: str, name: str, field: str, value: Any, expected: str) -> None:
        self.kind, self.name, self.field, self.value, self.expected = kind, name, field, value, expected
        shown = repr(value)  # a bounded prefix: the value may be anything an API object holds
        if len(shown) > 96:
            shown = shown[:93] + "..."
        super().__init__(f"{kind} {str(name)[:253]!r}: {str(field)[:200]}={shown}: expected {str(expected)[:200]}")


def _get(obj: Mapping[str, Any], path: str, default: Any = None) -> Any:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            return default
        cur = cur[part]
    return cur


@attrs.frozen
class Bfd:
    """BFD for one BGP peer (RFC 5880): detection time is about ``min_rx_ms * multiplier``."""

    min_rx_ms: int = 300
    min_tx_ms: int = 300
    multiplier: int = 3


@attrs.frozen
class SecretKeyRef:
    """One key of a Secret in the agent's own namespace (never the value itself)."""

    name: str
    key: str


@attrs.frozen
class BgpPeer:
    name: str
    address: IPAddress
    asn: int
    bfd: Bfd | None = None
    password: SecretKeyRef | None = None  # TCP MD5 (RFC 2385) key from a Secret
    route_reflector_client: bool = False  # this node reflects routes to the peer (iBGP only)
    multihop: int | None = None  # TTL for a peer that is not directly connected
    source_address: IPAddress | None = None


@attrs.frozen
class Communities:
    """BGP communities attached to one kind of route this node announces."""

    standard: tuple[tuple[int, int], ...] = ()
    large: tuple[tuple[int, int, int], ...] = ()


@attrs.frozen
class ServiceRoutes:
    """Service addresses this node announces from one pool (issue 34): exact /128 and /32 routes, or a
    ClusterIP range, with the pool's communities and local preference (iBGP).  BIRD holds them as
    static blackhole routes it never gives the kernel (nftables translates those addresses before
    routing); its export filters announce them."""

    pool: str
    nets: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]
    communities: Communities = attrs.field(factory=Communities)
    local_preference: int | None = None
    # of nets, those no other node announces (externalTrafficPolicy Local, endpoints only here): a leaving
    # node keeps them, with GRACEFUL_SHUTDOWN, rather than blackhole their traffic
    last_resort: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()


@attrs.frozen
class RouteCommunities:
    node_block: Communities = Communities()
    anycast: Communities = Communities()
    addresses: Communities = Communities()


@attrs.frozen
class GracefulRestart:
    """RFC 4724 on every session: peers keep this node's routes while it restarts."""

    enabled: bool = True
    restart_time: int = 120


@attrs.frozen
class BgpConfig:
    asn: int
    router_id: ipaddress.IPv4Address
    peers: tuple[BgpPeer, ...] = ()
    graceful_restart: GracefulRestart = GracefulRestart()
    communities: RouteCommunities = RouteCommunities()
    cluster_id: ipaddress.IPv4Address | None = None  # route reflector cluster ID (default: router ID)


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


def _announce_ranges(kind: str, name: str, raw: Any, where: str = "spec.announceRanges") -> tuple[Any, ...]:
    """spec.announceRanges (or clusterRanges): at most 64 unicast CIDRs without host bits (the CRD's CEL rules say
    the same)."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) > MAX_ANNOUNCE_RANGES:
        raise InvalidObject(kind, name, where, raw, f"a list of at most {MAX_ANNOUNCE_RANGES} CIDRs")
    out: list[Any] = []
    for i, item in enumerate(raw):
        field = f"{where}[{i}]"
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


_SECRET_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?\Z")
_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]{1,253}\Z")
# Decimal 0..65535 and 0..4294967295 without leading zeros, as the CRD's patterns spell them.
_U16 = r"(0|[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-4]|65535)"
_U32 = (
    r"(0|[1-9][0-9]{0,8}|[1-3][0-9]{9}|4[0-1][0-9]{8}|42[0-8][0-9]{7}|429[0-3][0-9]{6}|4294[0-8][0-9]{5}"
    r"|42949[0-5][0-9]{4}|429496[0-6][0-9]{3}|4294967[0-1][0-9]{2}|42949672[0-8][0-9]|429496729[0-4]|4294967295)"
)
_STANDARD_COMMUNITY = re.compile(f"{_U16}:{_U16}\\Z")
_LARGE_COMMUNITY = re.compile(f"{_U32}:{_U32}:{_U32}\\Z")
MAX_COMMUNITIES = 16
# Route kinds that carry communities: the key in spec.bgp.communities → RouteCommunities field.
COMMUNITY_KINDS = {"nodeBlock": "node_block", "anycast": "anycast", "addresses": "addresses"}


def _int_field(kind: str, name: str, field: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InvalidObject(kind, name, field, value, f"an integer {lo}..{hi}")
    return value


def _mapping(kind: str, name: str, field: str, value: Any, expected: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidObject(kind, name, field, value, expected)
    return value


def _address(kind: str, name: str, field: str, value: Any) -> IPAddress:
    try:
        return ipaddress.ip_address(_plain(value))
    except (TypeError, ValueError):
        raise InvalidObject(kind, name, field, value, "an IP address") from None


def _bfd(kind: str, name: str, field: str, raw: Any) -> Bfd:
    raw = _mapping(kind, name, field, raw, "an object {minRxMs, minTxMs, multiplier}")
    return Bfd(
        min_rx_ms=_int_field(kind, name, field + ".minRxMs", raw.get("minRxMs", 300), 10, 10000),
        min_tx_ms=_int_field(kind, name, field + ".minTxMs", raw.get("minTxMs", 300), 10, 10000),
        multiplier=_int_field(kind, name, field + ".multiplier", raw.get("multiplier", 3), 1, 255),
    )


def _secret_ref(kind: str, name: str, field: str, raw: Any) -> SecretKeyRef:
    raw = _mapping(kind, name, field, raw, "an object {secretKeyRef: {name, key}}")
    ref = _mapping(kind, name, field + ".secretKeyRef", raw.get("secretKeyRef"), "an object {name, key}")
    secret, key = ref.get("name"), ref.get("key")
    if not isinstance(secret, str) or not _SECRET_NAME.match(secret):
        raise InvalidObject(kind, name, field + ".secretKeyRef.name", secret, "a Secret name (DNS-1123 subdomain)")
    if not isinstance(key, str) or not _SECRET_KEY.match(key):
        raise InvalidObject(kind, name, field + ".secretKeyRef.key", key, "a Secret key (letters, digits, '-._')")
    return SecretKeyRef(secret, key)


def _peer(kind: str, name: str, field: str, p: Any, local_asn: int) -> BgpPeer:
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
    addr = _address(kind, name, field + ".address", p.get("address"))
    asn = _asn(kind, name, field + ".asn", p.get("asn"))
    bfd = None if p.get("bfd") is None else _bfd(kind, name, field + ".bfd", p.get("bfd"))
    password = None if p.get("password") is None else _secret_ref(kind, name, field + ".password", p.get("password"))
    rr_client = p.get("routeReflectorClient", False)
    if not isinstance(rr_client, bool):
        raise InvalidObject(kind, name, field + ".routeReflectorClient", rr_client, "true or false")
    if rr_client and asn != local_asn:
        raise InvalidObject(
            kind, name, field + ".routeReflectorClient", rr_client, f"an iBGP peer (asn {local_asn}) to reflect to"
        )
    raw_hops = p.get("multihop")
    multihop = None if raw_hops is None else _int_field(kind, name, field + ".multihop", raw_hops, 1, 255)
    raw_source = p.get("sourceAddress")
    source = None if raw_source is None else _address(kind, name, field + ".sourceAddress", raw_source)
    if source is not None and source.version != addr.version:
        raise InvalidObject(kind, name, field + ".sourceAddress", raw_source, f"an IPv{addr.version} address")
    if bfd is not None and multihop is not None and source is None:
        # BIRD: a multihop BFD session needs a fixed local address.
        raise InvalidObject(kind, name, field + ".sourceAddress", None, "an address when bfd and multihop are set")
    return BgpPeer(pname, addr, asn, bfd, password, rr_client, multihop, source)


def _communities(kind: str, name: str, field: str, raw: Any) -> Communities:
    raw = _mapping(kind, name, field, raw, "an object {standard: [...], large: [...]}")
    out: dict[str, tuple[tuple[int, ...], ...]] = {}
    for key, pattern, example in (
        ("standard", _STANDARD_COMMUNITY, "64512:100"),
        ("large", _LARGE_COMMUNITY, "64512:1:100"),
    ):
        values = raw.get(key) or []
        if not isinstance(values, list) or len(values) > MAX_COMMUNITIES:
            raise InvalidObject(kind, name, f"{field}.{key}", values, f"a list of at most {MAX_COMMUNITIES}")
        parsed = []
        for i, text in enumerate(values):
            m = pattern.match(text) if isinstance(text, str) else None
            if m is None:
                raise InvalidObject(kind, name, f"{field}.{key}[{i}]", text, f"a community such as {example}")
            parsed.append(tuple(int(part) for part in m.groups()))
        out[key] = tuple(dict.fromkeys(parsed))  # duplicates dropped, order kept
    return Communities(standard=out["standard"], large=out["large"])  # type: ignore[arg-type]


def community_list(kind: str, name: str, field: str, raw: Any) -> Communities:
    """A flat list of community strings, standard ("64512:100") and large ("64512:1:100") mixed, as a
    LoadBalancerPool's ``spec.communities`` spells them; at most :data:`MAX_COMMUNITIES` of each."""
    if raw is None:
        return Communities()
    if not isinstance(raw, list) or len(raw) > 2 * MAX_COMMUNITIES:
        raise InvalidObject(kind, name, field, raw, f"a list of at most {2 * MAX_COMMUNITIES} communities")
    standard: list[tuple[int, int]] = []
    large: list[tuple[int, int, int]] = []
    for i, text in enumerate(raw):
        m = _STANDARD_COMMUNITY.match(text) if isinstance(text, str) else None
        if m is not None:
            standard.append((int(m[1]), int(m[2])))
            continue
        m = _LARGE_COMMUNITY.match(text) if isinstance(text, str) else None
        if m is None:
            raise InvalidObject(kind, name, f"{field}[{i}]", text, "a community such as 64512:100 or 64512:1:100")
        large.append((int(m[1]), int(m[2]), int(m[3])))
    if len(standard) > MAX_COMMUNITIES or len(large) > MAX_COMMUNITIES:
        raise InvalidObject(kind, name, field, raw, f"at most {MAX_COMMUNITIES} standard and {MAX_COMMUNITIES} large")
    return Communities(tuple(dict.fromkeys(standard)), tuple(dict.fromkeys(large)))


def _bgp(kind: str, name: str, raw_bgp: Any) -> BgpConfig | None:
    if raw_bgp is None:
        return None
    raw_bgp = _mapping(kind, name, "spec.bgp", raw_bgp, "an object")
    asn = _asn(kind, name, "spec.bgp.asn", raw_bgp.get("asn"))
    rid = raw_bgp.get("routerID")
    try:
        router_id = ipaddress.IPv4Address(_plain(rid))
    except (TypeError, ValueError):
        raise InvalidObject(kind, name, "spec.bgp.routerID", rid, "an IPv4 address") from None
    raw_peers = raw_bgp.get("peers") or []
    if not isinstance(raw_peers, list):
        raise InvalidObject(kind, name, "spec.bgp.peers", raw_peers, "a list")
    peers: list[BgpPeer] = []
    for i, p in enumerate(raw_peers):
        peer = _peer(kind, name, f"spec.bgp.peers[{i}]", p, asn)
        if any(q.name == peer.name for q in peers):
            raise InvalidObject(kind, name, f"spec.bgp.peers[{i}].name", peer.name, "a name unique among peers")
        peers.append(peer)

    raw_gr = _mapping(kind, name, "spec.bgp.gracefulRestart", raw_bgp.get("gracefulRestart") or {}, "an object")
    enabled = raw_gr.get("enabled", True)
    if not isinstance(enabled, bool):
        raise InvalidObject(kind, name, "spec.bgp.gracefulRestart.enabled", enabled, "true or false")
    restart_time = _int_field(
        kind, name, "spec.bgp.gracefulRestart.restartTime", raw_gr.get("restartTime", 120), 1, 4095
    )

    raw_comm = _mapping(kind, name, "spec.bgp.communities", raw_bgp.get("communities") or {}, "an object")
    unknown = sorted(set(raw_comm) - set(COMMUNITY_KINDS))
    if unknown:
        raise InvalidObject(kind, name, "spec.bgp.communities", unknown[0], f"one of {sorted(COMMUNITY_KINDS)}")
    communities = RouteCommunities(
        **{
            attr: _communities(kind, name, f"spec.bgp.communities.{key}", raw_comm.get(key) or {})
            for key, attr in COMMUNITY_KINDS.items()
        }
    )

    raw_cluster = raw_bgp.get("routeReflectorClusterID")
    cluster_id = None
    if raw_cluster is not None:
        try:
            cluster_id = ipaddress.IPv4Address(_plain(raw_cluster))
        except (TypeError, ValueError):
            raise InvalidObject(
                kind, name, "spec.bgp.routeReflectorClusterID", raw_cluster, "an IPv4 address"
            ) from None
    return BgpConfig(asn, router_id, tuple(peers), GracefulRestart(enabled, restart_time), communities, cluster_id)


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
    # spec.mtu: both veth ends of new pods (None: the uplink's, see flock.state.PodMtu).
    mtu: int | None = None
    # spec.clusterRanges: destinations inside the cluster besides this node's blocks and announceRanges (the
    # other nodes' pod blocks, the nodes' own addresses): natOutgoing never applies to traffic to them.
    cluster_ranges: tuple[IPv6Network | IPv4Network, ...] = ()
    nat_outgoing: NatOutgoing = attrs.field(factory=lambda: NatOutgoing())

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

        bgp = _bgp(kind, name, spec.get("bgp"))

        announce_ranges = _announce_ranges(kind, name, spec.get("announceRanges"))
        cluster_ranges = _announce_ranges(kind, name, spec.get("clusterRanges"), "spec.clusterRanges")
        nat_outgoing = NatOutgoing.from_spec(kind, name, spec.get("natOutgoing"))

        raw_mtu = spec.get("mtu")
        mtu = None if raw_mtu is None else _int_field(kind, name, "spec.mtu", raw_mtu, MTU_MIN, MTU_MAX)

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
            mtu=mtu,
            cluster_ranges=cluster_ranges,
            nat_outgoing=nat_outgoing,
        )


@attrs.frozen
class NatOutgoing:
    """spec.natOutgoing: per family, masquerade this node's pods' traffic leaving the cluster to the node's address.

    Default: on for IPv4 (pod blocks are usually private space no router outside routes back), off for IPv6
    (pod blocks are global addresses the fabric routes: the pods keep theirs)."""

    ipv4: bool = True
    ipv6: bool = False

    def enabled(self, family: int) -> bool:
        return self.ipv4 if family == 4 else self.ipv6

    @classmethod
    def from_spec(cls, kind: str, name: str, raw: Any) -> NatOutgoing:
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            raise InvalidObject(kind, name, "spec.natOutgoing", raw, "an object {ipv4: bool, ipv6: bool}")
        values = {}
        for key in ("ipv4", "ipv6"):
            value = raw.get(key)
            if value is not None and not isinstance(value, bool):
                raise InvalidObject(kind, name, f"spec.natOutgoing.{key}", value, "true or false")
            values[key] = value
        default = cls()
        return cls(
            ipv4=default.ipv4 if values["ipv4"] is None else values["ipv4"],
            ipv6=default.ipv6 if values["ipv6"] is None else values["ipv6"],
        )


@attrs.frozen
class UplinkMtu:
    """What the node's uplink carries: the MTU of the interface(s) holding
    the node's default route (IPv6 first, else IPv4), as flock.netlink reads it.

    ``interface`` is "" when the node has no default route (then ``mtu`` is
    :data:`MTU_DEFAULT`); several names (comma-separated) for a multipath
    default route, whose smallest MTU counts.  ``family`` is 6 or 4 (0: no route)."""

    mtu: int = MTU_DEFAULT
    interface: str = ""
    family: int = 0

    def describe(self) -> str:
        """Where the value came from, for flockctl and logs."""
        if not self.interface:
            return "default (the node has no default route)"
        return f"detected from {self.interface}'s IPv{self.family} default route"


@attrs.frozen
class OwnerRef:
    kind: str
    name: str
    controller: bool = False


def _str_map(value: Mapping[str, str] | None) -> dict[str, str]:
    return dict(value or {})


@attrs.frozen
class PodInfo:
    """What flock needs of a Pod: identity, annotations, owners, first image."""

    namespace: str
    name: str
    uid: str = ""
    node_name: str = ""
    annotations: Mapping[str, str] = attrs.field(factory=dict, converter=_str_map, hash=False)
    labels: Mapping[str, str] = attrs.field(factory=dict, converter=_str_map, hash=False)
    owners: tuple[OwnerRef, ...] = ()
    first_image: str | None = None
    resource_version: str = ""
    #: The pod's Ready condition: True/False, or None for a pod without any
    #: status conditions (not run by a kubelet: tests, labs, bare runtimes).
    #: A pod with conditions but no Ready condition is not ready.
    ready: bool | None = None

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
            ready=_pod_ready(obj.get("status")),
        )


def _pod_ready(status: Any) -> bool | None:
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    if not isinstance(conditions, list) or not conditions:
        return None
    return any(isinstance(c, Mapping) and c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


class AllocationState(enum.Enum):
    PENDING = "pending"
    COMMITTED = "committed"


# The network name (the conflist's "name") flock-install-cni writes by default; rows stored before
# schema v2 recorded none and take this one (flock.store's migration says so in its log line).
DEFAULT_NETWORK = "flock"
# portMappings protocols, as the CNI capability convention spells them (lower case).
PORT_PROTOCOLS = ("tcp", "udp", "sctp")


@attrs.frozen
class PortMapping:
    """One hostPort: *protocol* traffic to the node (its *host_ip* only, when set) on *host_port*
    goes to the pod's *container_port* (CNI's ``runtimeConfig.portMappings`` entry).

    *host_ip* is None for "any address of the node"; an unspecified address (``0.0.0.0``, ``::``)
    means any address of that family only, as the reference portmap plugin and docker read it
    (``-p 0.0.0.0:8080:80`` publishes on IPv4 alone)."""

    host_port: int
    container_port: int
    protocol: str = "tcp"
    host_ip: IPAddress | None = None

    def families(self, pod_families: tuple[int, ...]) -> tuple[int, ...]:
        """The address families this mapping applies to, for a pod with addresses of *pod_families*."""
        if self.host_ip is None:
            return pod_families
        return (self.host_ip.version,) if self.host_ip.version in pod_families else ()

    @property
    def any_host(self) -> bool:
        """Any address of the node (of the family of *host_ip* when that is unspecified)."""
        return self.host_ip is None or self.host_ip.is_unspecified

    def describe(self) -> str:
        host = (
            "" if self.host_ip is None else (f"[{self.host_ip}]:" if self.host_ip.version == 6 else f"{self.host_ip}:")
        )
        return f"{host}{self.host_port}/{self.protocol} → {self.container_port}"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "hostPort": self.host_port,
            "containerPort": self.container_port,
            "protocol": self.protocol,
        }
        if self.host_ip is not None:
            out["hostIP"] = str(self.host_ip)
        return out

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> PortMapping:
        """A stored mapping (written by :meth:`to_json`; ValueError/TypeError if it is not one)."""
        host_ip = obj.get("hostIP")
        if host_ip is not None and "%" in str(host_ip):
            raise ValueError(f"a hostIP with a zone in {dict(obj)!r}")
        mapping = cls(
            host_port=int(obj["hostPort"]),
            container_port=int(obj["containerPort"]),
            protocol=str(obj["protocol"]),
            host_ip=None if host_ip is None else ipaddress.ip_address(host_ip),
        )
        if not (0 < mapping.host_port < 65536 and 0 < mapping.container_port < 65536):
            raise ValueError(f"port out of range in {dict(obj)!r}")
        if mapping.protocol not in PORT_PROTOCOLS:
            raise ValueError(f"unknown protocol in {dict(obj)!r}")
        return mapping


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
    # The network (the conflist's "name") the attachment was made through: GC concerns only its own.
    network: str = DEFAULT_NETWORK
    port_mappings: tuple[PortMapping, ...] = ()  # hostPorts, as ADD's runtimeConfig gave them (deduplicated)

    @property
    def families(self) -> tuple[int, ...]:
        """The families of the pod's own addresses (the ones hostPorts lead to): 6, 4 or both."""
        return tuple(f for f, a in ((6, self.ip6), (4, self.ip4)) if a is not None)

    @property
    def all_addresses(self) -> tuple[IPAddress, ...]:
        own = tuple(a for a in (self.ip6, self.ip4) if a is not None)
        return own + self.addresses + self.anycast
