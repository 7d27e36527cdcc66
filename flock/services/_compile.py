"""Services + EndpointSlices + this node → the services table as a value (pure).

The table is ``inet flock-services``, not a part of flock's policy table
``inet flock``: the policy applier replaces its whole table after a refused
increment and on every restart, and the two must not take each other's state
down with them; each table is one applier's, changed in transactions of its
own, deleted whole when the feature is turned off (or kube-proxy is found).
Its NAT chains hook prerouting and output at dstnat priority, so the
policy's forward and input chains (filter priority) see the backend's real
address after translation, as NetworkPolicy requires.

The shape is kube-proxy's nftables mode (KEP-3866).  A new connection is
looked up a constant number of times whatever the number of Services:

- ``services`` (from prerouting and output): ``daddr . l4proto . dport`` in
  the verdict map ``service-ips4``/``6`` (ClusterIPs → the internal chain;
  externalIPs and load-balancer addresses → the ``ext`` chain), then
  ``l4proto . dport`` in ``service-nodeports4``/``6`` for this node's
  addresses;
- per Service port and family: ``svc`` (cluster endpoints) and ``loc`` (this
  node's) chains masquerade ClusterIP traffic from outside the pod CIDRs,
  then pick an endpoint: an affinity hit first (ClientIP), else
  ``numgen random mod N`` over the endpoint chains; ``ext`` chains mark for
  masquerade (eTP Cluster) or keep the client address (eTP Local: pods and
  the node itself short-circuit to the cluster endpoints);
- per endpoint: ``ep`` chains masquerade hairpin traffic, record affinity and
  DNAT;
- filter hooks (input, forward, output), new connections only: the verdict
  maps ``no-endpoint-services`` / ``no-endpoint-nodeports`` reject (TCP reset,
  ICMP port unreachable) when a Service has no usable endpoint anywhere, or
  drop when it has some but none this node may use (Local policies); any other
  port of a ClusterIP is rejected;
- postrouting masquerades what was marked.

Only addresses inside ``config.external_pools`` are translated as externalIPs
or load-balancer addresses (CVE-2020-8554: a Service must not capture
arbitrary addresses); NodePorts answer on ``node.addresses``.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable, Mapping

import attrs

from . import _names, _nft
from ._model import EndpointSlice, Family, IPAddress, Service, ServicePort, TrafficPolicy, family_of
from ._select import Backend, backends, categorize, port_policy
from ._table import AffinitySet, CountedChain, HealthCheck, ServicesTable, Skeleton

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@attrs.frozen
class NodeView:
    """This node as the proxy needs it: its name (endpoints' nodeName) and the addresses NodePorts answer on."""

    name: str
    addresses: tuple[IPAddress, ...] = ()


@attrs.frozen
class ServicesConfig:
    pod_cidrs: tuple[IPNetwork, ...] = ()  # ClusterIP traffic from elsewhere (the node, a routed client) is masqueraded
    external_pools: tuple[IPNetwork, ...] = ()  # externalIPs / load-balancer addresses translated only inside these
    skeleton: Skeleton = attrs.field(factory=Skeleton)


def _in_pools(ip: IPAddress, pools: tuple[IPNetwork, ...]) -> bool:
    return any(ip.version == p.version and ip in p for p in pools)


@attrs.frozen(eq=False)
class ServicePiece:
    """What one Service adds to the table: its own chains and sets, its claims on keys of the shared
    maps (``(map, key, verdict)`` in the order made: the last claim of a key in a map holds), its
    members of the shared sets (ClusterIPs) and its health check (eTP Local with a healthCheckNodePort)."""

    chains: Mapping[str, tuple[str, ...]]
    sets: Mapping[str, AffinitySet]
    claims: tuple[tuple[str, str, str], ...]
    members: frozenset[tuple[str, str]]
    health: tuple[int, HealthCheck] | None
    counted: Mapping[str, CountedChain]

    @functools.cached_property
    def entries(self) -> dict[tuple[str, str], str]:
        """(map, key) → verdict, the last claim of each."""
        return {(name, key): verdict for name, key, verdict in self.claims}


def key_space(map_name: str) -> str:
    """The key space a map's keys live in: a service address and port (or a NodePort, per family) is one
    Service's, whether its packets are translated (``service-*``) or refused (``no-endpoint-*``)."""
    return ("nodeports" if "nodeports" in map_name else "ips") + map_name[-1]


def node_members(node: NodeView, config: ServicesConfig) -> list[tuple[str, str]]:
    """The skeleton's set elements that come from the node and the config: (set, element)."""
    members = [(_nft.per_family(_nft.NODE_IPS, family_of(ip)), _nft.address(ip)) for ip in node.addresses]
    for net in config.pod_cidrs:
        family = Family.IPV4 if net.version == 4 else Family.IPV6
        members.append((_nft.per_family(_nft.POD_CIDRS, family), _nft.network(net)))
    return members


@attrs.define
class _Builder:
    """compile_table's merge: pieces in Service order, each map key kept by its first claimant."""

    elements: dict[str, dict[str, str | None]] = attrs.field(factory=dict)
    owners: dict[tuple[str, str], str] = attrs.field(factory=dict)
    conflicts: list[str] = attrs.field(factory=list)

    def claim(self, owner: str, name: str, key: str, verdict: str) -> None:
        """Add a map element; a key another Service already holds stays that Service's (first by name wins)."""
        holder = self.owners.setdefault((key_space(name), key), owner)
        if holder != owner:
            self.conflicts.append(f"{owner}: {key} in {name} is {holder}'s")
            return
        self.elements[name][key] = verdict


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
    b = _Builder()
    for name in _nft.skeleton_names():  # every skeleton map and set is in the value, empty or not
        b.elements[name] = {}
    for name, member in node_members(node, config):
        b.elements[name][member] = None
    chains: dict[str, tuple[str, ...]] = {}
    sets: dict[str, AffinitySet] = {}
    counted: dict[str, CountedChain] = {}
    health: dict[int, HealthCheck] = {}
    for svc in sorted(services, key=lambda s: (s.namespace, s.name)):
        piece = compile_service(svc, by_service.get((svc.namespace, svc.name), ()), node, config)
        if piece is None:
            continue
        chains.update(piece.chains)
        sets.update(piece.sets)
        counted.update(piece.counted)
        for name, member in piece.members:
            b.elements[name][member] = None
        for name, key, verdict in piece.claims:
            b.claim(svc.key, name, key, verdict)
        if piece.health is not None:
            health[piece.health[0]] = piece.health[1]
    return ServicesTable(
        skeleton=config.skeleton,
        chains=chains,
        affinity_sets=sets,
        elements={name: frozenset(e.items()) for name, e in b.elements.items()},
        health_checks=health,
        conflicts=tuple(b.conflicts),
        counted=counted,
    )


def slice_owner(eps: EndpointSlice) -> tuple[str, str] | None:
    """The (namespace, name) of the Service a slice feeds; None: none (no label, or FQDN addresses)."""
    if eps.service is None or eps.family is None:
        return None
    return (eps.namespace, eps.service)


@attrs.define
class _PieceBuilder:
    chains: dict[str, tuple[str, ...]] = attrs.field(factory=dict)
    sets: dict[str, AffinitySet] = attrs.field(factory=dict)
    claims: list[tuple[str, str, str]] = attrs.field(factory=list)
    members: set[tuple[str, str]] = attrs.field(factory=set)
    counted: dict[str, CountedChain] = attrs.field(factory=dict)

    def element(self, base: str, family: Family, key: str, verdict: str | None = None) -> None:
        name = _nft.per_family(base, family)
        if verdict is None:
            self.members.add((name, key))
        else:
            self.claims.append((name, key, verdict))


def compile_service(
    svc: Service, slices: Iterable[EndpointSlice], node: NodeView, config: ServicesConfig
) -> ServicePiece | None:
    """One Service's piece, from its own EndpointSlices (None: nothing to translate)."""
    if not svc.proxied:
        return None
    slices = tuple(slices)
    b = _PieceBuilder()
    local_ready: set[tuple[IPAddress, int]] = set()
    for family in svc.ip_families:
        cluster_ip = svc.cluster_ip(family)
        if cluster_ip is None:
            continue
        for port in svc.ports:
            found = backends(svc, port, family, slices, node.name)
            local_ready.update((e.address, e.port) for e in found if e.local and e.ready)
            _service_port(b, svc, port, family, cluster_ip, found, config)
    health = None
    if svc.health_check_node_port is not None and svc.external_traffic_policy is TrafficPolicy.LOCAL:
        health = (svc.health_check_node_port, HealthCheck(svc.namespace, svc.name, len(local_ready)))
    return ServicePiece(b.chains, b.sets, tuple(b.claims), frozenset(b.members), health, b.counted)


def _service_port(
    b: _PieceBuilder,
    svc: Service,
    port: ServicePort,
    family: Family,
    cluster_ip: IPAddress,
    eps: tuple[Backend, ...],
    config: ServicesConfig,
) -> None:
    externals = sorted(
        {
            ip
            for ip in (*svc.external_ips, *svc.load_balancer_ips)
            if family_of(ip) is family and _in_pools(ip, config.external_pools)
        }
    )
    policy = port_policy(svc, port, external_addresses=bool(externals))
    cat = categorize(eps, policy)
    ns, name, protocol = svc.namespace, svc.name, port.protocol

    def chain_name(kind: str) -> str:
        return _names.port_chain(kind, family, ns, name, protocol, port.port)

    cluster_chain, local_chain, ext_chain = chain_name("svc"), chain_name("loc"), chain_name("ext")
    has_pods = any(net.version == family.version for net in config.pod_cidrs)
    label = port.name or str(port.port)

    internal_chain = local_chain if policy.internal_local else cluster_chain
    has_internal = bool(cat.local) if policy.internal_local else cat.has_any
    external_policy_chain = local_chain if policy.external_local else cluster_chain
    has_external = bool(cat.local) if policy.external_local else cat.has_any
    refused = ""
    if not has_internal or not has_external:
        # counted per Service port, then refused (no endpoint anywhere) or dropped (none this traffic may use)
        refused = chain_name("rej")
        b.chains[refused] = (_nft.counter(), _nft.goto(_nft.REJECT_CHAIN) if not cat.has_any else "drop")
        b.counted[refused] = CountedChain(ns, name, label, "rejected")

    b.element(_nft.CLUSTER_IPS, family, _nft.address(cluster_ip))
    key = _nft.service_key(cluster_ip, protocol, port.port)
    if has_internal:
        b.element(_nft.SERVICE_IPS, family, key, _nft.goto(internal_chain))
    else:
        b.element(_nft.NO_ENDPOINT_SERVICES, family, key, _nft.goto(refused))
    for ip in externals:
        key = _nft.service_key(ip, protocol, port.port)
        if cat.has_any:
            b.element(_nft.SERVICE_IPS, family, key, _nft.goto(ext_chain))
        if not has_external:
            b.element(_nft.NO_ENDPOINT_SERVICES, family, key, _nft.goto(refused))
    if port.node_port is not None:
        key = _nft.nodeport_key(protocol, port.node_port)
        if cat.has_any:
            b.element(_nft.SERVICE_NODEPORTS, family, key, _nft.goto(ext_chain))
        if not has_external:
            b.element(_nft.NO_ENDPOINT_NODEPORTS, family, key, _nft.goto(refused))

    ep_chain = {
        ep: _names.endpoint_chain(family, ns, name, protocol, port.port, ep.address, ep.port) for ep in cat.reachable
    }
    affinity = {
        ep: _names.affinity_set(chain, svc.affinity_timeout) for ep, chain in ep_chain.items() if svc.client_ip_affinity
    }

    def policy_chains(chain: str, pick: str, chosen: tuple[Backend, ...]) -> None:
        # The entry chain (what the maps name) keeps its counter while endpoints come and go: only
        # the pick chain is rewritten (a flush would zero the counter with the rule).
        rules = [_nft.counter()]
        if has_internal and chain == internal_chain and has_pods:
            rules.append(_nft.masquerade_unless_pod(family, cluster_ip))
        rules.append(_nft.goto(pick))
        b.chains[chain] = tuple(rules)
        b.counted[chain] = CountedChain(ns, name, label, "connections")
        picks = [_nft.affinity_goto(family, affinity[ep], ep_chain[ep]) for ep in chosen if ep in affinity]
        picks.append(_nft.spread(ep_chain[ep] for ep in chosen))
        b.chains[pick] = tuple(picks)

    if cat.cluster and policy.uses_cluster:
        policy_chains(cluster_chain, chain_name("pick"), cat.cluster)
    if cat.local and policy.uses_local:
        policy_chains(local_chain, chain_name("lpick"), cat.local)
    if cat.has_any and policy.externally_accessible:
        rules = []
        if not policy.external_local:
            rules.append(_nft.masquerade())  # the endpoint may be on another node: replies must come back here
        else:
            if has_pods:
                rules.append(_nft.pods_short_circuit(family, cluster_chain))
            rules.append(_nft.node_masquerade())
            rules.append(_nft.node_short_circuit(cluster_chain))
        if has_external:
            rules.append(_nft.goto(external_policy_chain))
        b.chains[ext_chain] = tuple(rules)
    for ep, chain in ep_chain.items():
        rules = [_nft.masquerade_from(family, ep.address)]
        if ep in affinity:
            b.sets[affinity[ep]] = AffinitySet(family, svc.affinity_timeout)
            rules.append(_nft.affinity_update(family, affinity[ep]))
        rules.append(_nft.dnat(family, protocol, ep.address, ep.port))
        b.chains[chain] = tuple(rules)
