"""Services + EndpointSlices + this node → the services table as a value (pure).

The table is ``inet flock-services``, not a part of flock's policy table
``inet flock``: the policy applier replaces its whole table after a refused
increment and on every restart, and the two must not take each other's state
down with them; each table is one applier's, changed in transactions of its
own, deleted whole when the feature is turned off (or kube-proxy is found).
Its NAT chains hook prerouting and output at dstnat priority, so the
policy's forward and input chains (filter priority) see the backend's real
address after translation, as NetworkPolicy requires.

The shape follows kube-proxy's nftables mode (KEP-3866: verdict maps, one
table, partial syncs), with one difference: a Service is elements of shared
maps, not chains of its own (nftables 1.0.6 reads every chain of the table,
and its rules, before each transaction: see :mod:`._nft`).  A new connection
is looked up a constant number of times whatever the number of Services:

- ``services`` (from prerouting and output): ClusterIP traffic from outside
  the pod CIDRs is marked for masquerade; ``daddr . l4proto . dport`` in the
  counted verdict map ``service-ips4``/``6`` (a ClusterIP → ``pick``;
  externalIPs and load-balancer addresses → ``xpick``, which marks for
  masquerade first), then ``l4proto . dport`` in ``service-nodeports4``/``6``
  for this node's addresses (→ ``nppick``, marked);
- ``pick`` looks the same key up in ``spread``: the shared chain for the
  number of endpoints to choose from (``rand6-10``), which DNATs to
  ``numgen random mod 10``'s element of the protocol's ``endpoints`` map
  (one endpoint: the ``one-endpoint`` map); ``nppick`` does the same with
  the NodePort maps, keyed by each node address;
- ClientIP affinity keeps kube-proxy's chains (``svc``/``loc`` choosing an
  ``ep`` chain per endpoint, which records the client and DNATs), and
  ``externalTrafficPolicy: Local`` external addresses and NodePorts go to an
  ``ext`` chain: pods and the node itself to any endpoint (the node
  masqueraded), everyone else to this node's, keeping the client address;
- filter hooks (input, forward, output), new connections only: the counted
  verdict maps ``no-endpoint-services`` / ``no-endpoint-nodeports`` reject
  (TCP reset, ICMP port unreachable) when a Service has no usable endpoint
  anywhere, or drop when it has some but none this node may use (Local
  policies); any other port of a ClusterIP is rejected;
- postrouting masquerades what was marked, and hairpin traffic (``ct status
  dnat`` and ``saddr . daddr`` in ``hairpin``: an endpoint reaching itself).

An endpoint change is element writes only (the ``spread`` element names the
chain for the new number, the ``endpoints`` elements are renumbered); the
shared ``rand`` chains come and go with the numbers in use.

Only addresses inside a pool of ``config.allow`` the Service may use are
translated as externalIPs or load-balancer addresses (CVE-2020-8554: a Service
must not capture arbitrary addresses; :mod:`._pools`); NodePorts answer on
``node.addresses``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

import attrs

from flock.policy import Protocol

from . import _names, _nft
from ._conntrack import UdpTarget
from ._model import EndpointSlice, Family, IPAddress, Service, ServicePort, TrafficPolicy, family_of
from ._pools import AllowList
from ._select import Backend, Categorized, PortPolicy, backends, categorize, port_policy
from ._table import AffinitySet, Counted, HealthCheck, ServicesTable, Skeleton

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@attrs.frozen
class NodeView:
    """This node as the proxy needs it: its name (endpoints' nodeName) and the addresses NodePorts answer on."""

    name: str
    addresses: tuple[IPAddress, ...] = ()


@attrs.frozen
class ServicesConfig:
    pod_cidrs: tuple[IPNetwork, ...] = ()  # ClusterIP traffic from elsewhere (the node, a routed client) is masqueraded
    allow: AllowList = attrs.field(factory=AllowList)  # externalIPs / load-balancer addresses translated only inside
    skeleton: Skeleton = attrs.field(factory=Skeleton)


Space = tuple[str, str]  # (kind, key): what two Services may both claim — an address and port, or a NodePort
Element = tuple[str, str]  # (map, key)


@attrs.define(eq=False)
class Claim:
    """What one Service puts in the maps for one key space: a few *entries*, and the endpoints it numbers
    under keys of an endpoints map, kept as addresses and ports (``(map, key, (address, port, address,
    port, …))``): their elements' text is made when needed, so a claim costs a few bytes an endpoint."""

    entries: dict[Element, str] = attrs.field(factory=dict)
    numbered: tuple[tuple[str, str, tuple[IPAddress | int, ...]], ...] = ()

    def elements(self) -> dict[Element, str]:
        """Every element of the claim: (map, key) → value."""
        found = dict(self.entries)
        for name, key, flat in self.numbered:
            for i in range(0, len(flat), 2):
                address, port = flat[i], flat[i + 1]
                assert not isinstance(address, int) and isinstance(port, int)
                found[(name, _nft.endpoint_key(key, i // 2))] = _nft.endpoint_value(address, port)
        return found

    def __len__(self) -> int:
        return len(self.entries) + sum(len(flat) // 2 for _, _, flat in self.numbered)


@attrs.frozen(eq=False)
class ServicePiece:
    """What one Service adds to the table: its own chains and sets, the shared chains it uses, its
    claims on key spaces (``space → Claim``: an address and port, or a NodePort, and
    every element of the shared maps that goes with it; a space is one Service's, the first by
    namespace/name), its members of the shared sets (ClusterIPs, hairpin pairs), its health check
    (eTP Local with a healthCheckNodePort) and the counted elements among its claims."""

    chains: Mapping[str, tuple[str, ...]]
    shared: Mapping[str, tuple[str, ...]]
    sets: Mapping[str, AffinitySet]
    claims: Mapping[Space, Claim]
    members: tuple[tuple[str, str], ...]
    health: tuple[int, HealthCheck] | None
    counted: Mapping[tuple[str, str], Counted]
    udp: frozenset[UdpTarget] = frozenset()  # where its UDP flows may be translated to (stale ones are forgotten)


def node_members(node: NodeView, config: ServicesConfig) -> list[tuple[str, str]]:
    """The skeleton's set elements that come from the node and the config: (set, element)."""
    members = [(_nft.per_family(_nft.NODE_IPS, family_of(ip)), _nft.address(ip)) for ip in node.addresses]
    for family in Family:
        # collapsed: an interval set refuses overlapping elements (a node's block inside a cluster range)
        same = [net for net in config.pod_cidrs if net.version == family.version]
        for net in ipaddress.collapse_addresses(same):  # type: ignore[type-var]
            members.append((_nft.per_family(_nft.POD_CIDRS, family), _nft.network(net)))
    return members


def conflict(owner: str, space: Space, holder: str) -> str:
    kind, key = space
    what = "NodePort" if kind.startswith("nodeports") else "address"
    return f"{owner}: {what} {key} is {holder}'s"


def compile_table(
    services: Iterable[Service],
    slices: Iterable[EndpointSlice],
    node: NodeView,
    config: ServicesConfig | None = None,
) -> ServicesTable:
    """The whole table from the whole cluster: the reference :class:`flock.services.ServicesEngine` is held to."""
    config = config if config is not None else ServicesConfig()
    by_service: dict[tuple[str, str], list[EndpointSlice]] = {}
    for eps in slices:
        owner = slice_owner(eps)
        if owner is not None:
            by_service.setdefault(owner, []).append(eps)
    elements: dict[str, dict[str, str | None]] = {name: {} for name in _nft.skeleton_names()}
    for name, member in node_members(node, config):
        elements[name][member] = None
    chains: dict[str, tuple[str, ...]] = {}
    sets: dict[str, AffinitySet] = {}
    counted: dict[tuple[str, str], Counted] = {}
    health: dict[int, HealthCheck] = {}
    owners: dict[Space, str] = {}
    conflicts: list[str] = []
    for svc in sorted(services, key=lambda s: (s.namespace, s.name)):
        piece = compile_service(svc, by_service.get((svc.namespace, svc.name), ()), node, config)
        if piece is None:
            continue
        chains.update(piece.chains)
        chains.update(piece.shared)
        sets.update(piece.sets)
        for name, member in piece.members:
            elements[name][member] = None
        for space, claim in piece.claims.items():
            holder = owners.setdefault(space, svc.key)
            if holder != svc.key:  # the first by namespace/name keeps it
                conflicts.append(conflict(svc.key, space, holder))
                continue
            for (name, key), value in claim.elements().items():
                elements[name][key] = value
                if (name, key) in piece.counted:
                    counted[(name, key)] = piece.counted[(name, key)]
        if piece.health is not None:
            health[piece.health[0]] = piece.health[1]
    return ServicesTable(
        skeleton=config.skeleton,
        chains=chains,
        affinity_sets=sets,
        elements={name: frozenset(e.items()) for name, e in elements.items()},
        health_checks=health,
        conflicts=tuple(conflicts),
        counted=counted,
    )


def slice_owner(eps: EndpointSlice) -> tuple[str, str] | None:
    """The (namespace, name) of the Service a slice feeds; None: none (no label, or FQDN addresses)."""
    if eps.service is None or eps.family is None:
        return None
    return (eps.namespace, eps.service)


@attrs.define
class _PieceBuilder:
    family: Family = Family.IPV6
    chains: dict[str, tuple[str, ...]] = attrs.field(factory=dict)
    shared: dict[str, tuple[str, ...]] = attrs.field(factory=dict)
    sets: dict[str, AffinitySet] = attrs.field(factory=dict)
    claims: dict[Space, Claim] = attrs.field(factory=dict)
    members: set[tuple[str, str]] = attrs.field(factory=set)
    counted: dict[tuple[str, str], Counted] = attrs.field(factory=dict)
    udp: set[UdpTarget] = attrs.field(factory=set)

    def member(self, base: str, key: str) -> None:
        self.members.add((_nft.per_family(base, self.family), key))

    def claim(self, space: Space, base: str, key: str, value: str, counted: Counted | None = None) -> None:
        name = _nft.per_family(base, self.family)
        self.claims.setdefault(space, Claim()).entries[(name, key)] = value
        if counted is not None:
            self.counted[(name, key)] = counted

    def spread(
        self, space: Space, key: str, protocol: Protocol, chosen: tuple[Backend, ...], *, nodeport: bool = False
    ) -> None:
        """*key*'s connections to one of *chosen* at random: its element in the spread map names the
        shared chain for their number, and its elements in the endpoints map number them."""
        family, n = self.family, len(chosen)
        rand = _nft.rand_chain(family, n, nodeport=nodeport)
        self.shared[rand] = _nft.rand_rules(family, n, nodeport=nodeport)
        self.claim(space, _nft.NODEPORT_SPREAD if nodeport else _nft.SPREAD, key, _nft.goto(rand))
        if n == 1:
            one = _nft.NODEPORT_ONE_ENDPOINT if nodeport else _nft.ONE_ENDPOINT
            self.claim(space, one, key, _nft.endpoint_value(chosen[0].address, chosen[0].port))
            return
        flat = tuple(x for ep in chosen for x in (ep.address, ep.port))
        claim = self.claims[space]
        claim.numbered = (*claim.numbered, (_nft.endpoints_map(family, protocol, nodeport=nodeport), key, flat))


def compile_service(
    svc: Service, slices: Iterable[EndpointSlice], node: NodeView, config: ServicesConfig
) -> ServicePiece | None:
    """One Service's piece, from its own EndpointSlices (None: nothing to translate)."""
    if not svc.proxied:
        return None
    slices = tuple(slices)
    pieces = _PieceBuilder()
    local_ready: set[tuple[IPAddress, int]] = set()
    for family in svc.ip_families:
        cluster_ip = svc.cluster_ip(family)
        if cluster_ip is None:
            continue
        pieces.family = family
        for port in svc.ports:
            found = backends(svc, port, family, slices, node.name)
            local_ready.update((e.address, e.port) for e in found if e.local and e.ready)
            _service_port(pieces, svc, port, cluster_ip, found, node, config)
    health = None
    if svc.health_check_node_port is not None and svc.external_traffic_policy is TrafficPolicy.LOCAL:
        health = (svc.health_check_node_port, HealthCheck(svc.namespace, svc.name, len(local_ready)))
    b = pieces
    return ServicePiece(
        b.chains or _NONE,
        b.shared or _NONE,
        b.sets or _NONE,
        b.claims,
        tuple(sorted(b.members)),
        health,
        b.counted or _NONE,
        frozenset(b.udp) if b.udp else _NO_UDP,
    )


_NO_UDP: frozenset[UdpTarget] = frozenset()
_NONE: Mapping[Any, Any] = MappingProxyType({})  # one empty mapping for every piece without chains, sets…


def _service_port(
    b: _PieceBuilder,
    svc: Service,
    port: ServicePort,
    cluster_ip: IPAddress,
    eps: tuple[Backend, ...],
    node: NodeView,
    config: ServicesConfig,
) -> None:
    family = b.family
    externals = sorted(
        {
            ip
            for ip in (*svc.external_ips, *svc.load_balancer_ips)
            if family_of(ip) is family and config.allow.admits(svc, ip)
        }
    )
    policy = port_policy(svc, port, external_addresses=bool(externals))
    cat = categorize(eps, policy)
    ns, name, protocol = svc.namespace, svc.name, port.protocol
    label = port.name or str(port.port)
    internal = cat.local if policy.internal_local else cat.cluster
    external = cat.local if policy.external_local else cat.cluster
    connections = Counted(ns, name, label, "connections")
    # made only when some traffic of the port may be refused or dropped (one object fewer per Service port)
    rejected = Counted(ns, name, label, "rejected") if not (internal and external) else connections
    # no endpoint anywhere: refused at once; some, but none this traffic may use (Local policies): dropped
    refused = _nft.goto(_nft.REJECT_CHAIN) if not cat.has_any else "drop"
    version = str(family.version)

    def chain_name(kind: str) -> str:
        return _names.port_chain(kind, family, ns, name, protocol, port.port)

    b.member(_nft.CLUSTER_IPS, _nft.address(cluster_ip))
    for ip in externals:  # any other port of these addresses: refused (never routed back to the fabric)
        b.member(_nft.EXTERNAL_IPS, _nft.address(ip))
    for ep in cat.reachable:
        if ep.maybe_local:  # only a pod on this node can reach itself through this node
            b.member(_nft.HAIRPIN, _nft.hairpin_member(ep.address))
    affinity = svc.client_ip_affinity
    ext_chain = chain_name("ext") if cat.has_any and policy.externally_accessible else None
    if affinity:
        internal_way, ext_rules = _affinity_chains(b, svc, port, cat, policy, chain_name)
        if ext_chain is not None:
            b.chains[ext_chain] = ext_rules
    else:
        internal_way = _pick(family)
        if ext_chain is not None and policy.external_local:
            b.chains[ext_chain] = _external_local_rules(family, protocol, cat)

    key = _nft.service_key(cluster_ip, protocol, port.port)
    space = ("ips" + version, key)
    if internal:
        b.claim(space, _nft.SERVICE_IPS, key, internal_way, connections)
        if not affinity:
            b.spread(space, key, protocol, internal)
    else:
        b.claim(space, _nft.NO_ENDPOINT_SERVICES, key, refused, rejected)
    # externalIPs and load-balancer addresses, then the NodePort on every node address
    simple = not affinity and not policy.external_local
    for ip in externals:
        key = _nft.service_key(ip, protocol, port.port)
        space = ("ips" + version, key)
        if ext_chain is not None:
            way = _nft.goto(_nft.per_family(_nft.EXT_PICK_CHAIN, family)) if simple else _nft.goto(ext_chain)
            b.claim(space, _nft.SERVICE_IPS, key, way, connections)
            if simple:
                b.spread(space, key, protocol, external)
        if not external:
            b.claim(space, _nft.NO_ENDPOINT_SERVICES, key, refused, rejected)
    if protocol is Protocol.UDP:
        b.udp.update((cluster_ip, port.port, ep.address) for ep in internal)
        b.udp.update((ip, port.port, ep.address) for ip in externals for ep in external)
        if port.node_port is not None:
            b.udp.update((None, port.node_port, ep.address) for ep in external)
    if port.node_port is not None:
        key = _nft.nodeport_key(protocol, port.node_port)
        space = ("nodeports" + version, key)
        if ext_chain is not None:
            way = _nft.goto(_nft.per_family(_nft.NODEPORT_PICK_CHAIN, family)) if simple else _nft.goto(ext_chain)
            b.claim(space, _nft.SERVICE_NODEPORTS, key, way, connections)
            if simple:
                for ip in node.addresses:
                    if family_of(ip) is family:
                        b.spread(
                            space, _nft.service_key(ip, protocol, port.node_port), protocol, external, nodeport=True
                        )
        if not external:
            b.claim(space, _nft.NO_ENDPOINT_NODEPORTS, key, refused, rejected)


def _pick(family: Family) -> str:
    return _nft.goto(_nft.per_family(_nft.PICK_CHAIN, family))


def _external_local_rules(family: Family, protocol: Protocol, cat: Categorized) -> tuple[str, ...]:
    """externalTrafficPolicy Local, external addresses and NodePorts: pods and the node itself go to any
    endpoint (the node masqueraded), everyone else to this node's, keeping their address."""
    if not cat.cluster:
        return ()
    cluster = _nft.dnat_spread(family, protocol, ((ep.address, ep.port) for ep in cat.cluster))
    rules = [f"{_nft.from_pods(family)} {cluster}", _nft.node_masquerade(), f"{_nft.from_node()} {cluster}"]
    if cat.local:
        rules.append(_nft.dnat_spread(family, protocol, ((ep.address, ep.port) for ep in cat.local)))
    return tuple(rules)


def _affinity_chains(
    b: _PieceBuilder,
    svc: Service,
    port: ServicePort,
    cat: Categorized,
    policy: PortPolicy,
    chain_name: Callable[[str], str],
) -> tuple[str, tuple[str, ...]]:
    """ClientIP affinity: a chain per endpoint (recording the client, then DNAT), and per policy a chain
    choosing the client's endpoint while its entry lasts, else one at random.  The way in for the
    ClusterIP, and the rules of the external chain."""
    family, ns, name, protocol = b.family, svc.namespace, svc.name, port.protocol
    ep_chain = {
        ep: _names.endpoint_chain(family, ns, name, protocol, port.port, ep.address, ep.port) for ep in cat.reachable
    }
    affinity = {ep: _names.affinity_set(chain, svc.affinity_timeout) for ep, chain in ep_chain.items()}
    cluster_chain, local_chain = chain_name("svc"), chain_name("loc")

    def policy_chain(chain: str, chosen: tuple[Backend, ...]) -> None:
        picks = [_nft.affinity_goto(family, affinity[ep], ep_chain[ep]) for ep in chosen]
        picks.append(_nft.spread(ep_chain[ep] for ep in chosen))
        b.chains[chain] = tuple(picks)

    if cat.cluster and policy.uses_cluster:
        policy_chain(cluster_chain, cat.cluster)
    if cat.local and policy.uses_local:
        policy_chain(local_chain, cat.local)
    for ep, chain in ep_chain.items():
        b.sets[affinity[ep]] = AffinitySet(family, svc.affinity_timeout)
        b.chains[chain] = (_nft.affinity_update(family, affinity[ep]), _nft.dnat(family, protocol, ep.address, ep.port))
    ext: list[str] = []
    if not policy.external_local:
        ext = [_nft.masquerade(), _nft.goto(cluster_chain)]  # the endpoint may be on another node
    elif cat.cluster:
        ext = [
            _nft.pods_short_circuit(family, cluster_chain),
            _nft.node_masquerade(),
            _nft.node_short_circuit(cluster_chain),
        ]
        if cat.local:
            ext.append(_nft.goto(local_chain))
    return _nft.goto(local_chain if policy.internal_local else cluster_chain), tuple(ext)
