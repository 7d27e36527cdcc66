"""(policies, namespaces, pods, local pods) → the :class:`Ruleset` for this node.  Pure.

Sets are keyed by what selects their members, not by policy, so policies
sharing a selector share a set, and pod churn changes set elements, never
rules.  Named ports go into one (address, protocol, port) set per port name,
protocol and family over every pod that declares the name: a rule's peer match
and that set together say "a peer, on the port it calls *name*".
"""

from __future__ import annotations

import hashlib
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping

import attrs

from ._model import (
    NAMESPACE_NAME_LABEL,
    Direction,
    IPAddress,
    IPBlock,
    Labels,
    LabelSelector,
    Namespace,
    NetworkPolicy,
    Peer,
    PolicyPod,
    PolicyPort,
    PolicyRule,
    Protocol,
)
from ._ruleset import AddressSet, Chain, IPNetwork, Match, PortSet, Rule, Ruleset, ServiceSet

# flock's own host veth names (flock.netlink): the only pod-derived text in a chain name.
HOST_VETH = re.compile(r"flock[0-9a-f]{8}\Z")

FAMILIES = (6, 4)


class InvalidLocalPod(ValueError):
    """A local pod without a flock host veth name: a bug in the caller, not API input."""


def _id(*parts: object) -> str:
    return hashlib.blake2b(repr(parts).encode(), digest_size=8).hexdigest()


def policy_chain(policy_key: str, direction: Direction) -> str:
    return ("pi-" if direction is Direction.INGRESS else "pe-") + _id("policy", policy_key)


def pod_chain(veth: str, direction: Direction) -> str:
    return ("in-" if direction is Direction.INGRESS else "eg-") + veth


@attrs.frozen
class _Group:
    """Selectable pods sharing namespace and labels: selectors see them as one."""

    namespace: str
    labels: Labels
    addresses: tuple[IPAddress, ...]
    label_map: Mapping[str, str] = attrs.field(hash=False, eq=False)


class _Peers:
    """The cluster's selectable pods, indexed for selector matching."""

    def __init__(self, pods: Iterable[PolicyPod], namespaces: Mapping[str, Namespace]) -> None:
        grouped: dict[tuple[str, Labels], list[IPAddress]] = defaultdict(list)
        self.named: dict[tuple[str, Protocol], list[tuple[IPAddress, Protocol, int]]] = defaultdict(list)
        for pod in pods:
            if not pod.selectable or not pod.addresses:
                continue
            grouped[(pod.namespace, pod.labels)].extend(pod.addresses)
            for np in pod.named_ports:
                self.named[(np.name, np.protocol)].extend((a, np.protocol, np.port) for a in pod.addresses)
        self.groups = [_Group(ns, labels, tuple(addrs), dict(labels)) for (ns, labels), addrs in grouped.items()]
        self.by_namespace: dict[str, list[_Group]] = defaultdict(list)
        self.by_label: dict[tuple[str, str], list[_Group]] = defaultdict(list)
        for g in self.groups:
            self.by_namespace[g.namespace].append(g)
            for pair in g.labels:
                self.by_label[pair].append(g)
        self.namespaces = namespaces
        self._ns_match: dict[tuple[LabelSelector, str], bool] = {}

    def namespace_labels(self, name: str) -> Mapping[str, str]:
        ns = self.namespaces.get(name)
        return ns.label_map if ns is not None else {NAMESPACE_NAME_LABEL: name}

    def _namespace_matches(self, selector: LabelSelector, name: str) -> bool:
        key = (selector, name)
        hit = self._ns_match.get(key)
        if hit is None:
            hit = self._ns_match[key] = selector.matches(self.namespace_labels(name))
        return hit

    def select(
        self, namespace: str | None, ns_selector: LabelSelector | None, pod_selector: LabelSelector | None
    ) -> list[IPAddress]:
        """Addresses of pods in *namespace* (or in namespaces *ns_selector* picks) matching *pod_selector*."""
        candidates: list[_Group]
        if pod_selector is not None and pod_selector.match_labels:
            candidates = min((self.by_label.get(pair, []) for pair in pod_selector.match_labels), key=len)
        elif namespace is not None:
            candidates = self.by_namespace.get(namespace, [])
        else:
            candidates = self.groups
        out: list[IPAddress] = []
        for g in candidates:
            if namespace is not None and g.namespace != namespace:
                continue
            if ns_selector is not None and not self._namespace_matches(ns_selector, g.namespace):
                continue
            if pod_selector is not None and not pod_selector.matches(g.label_map):
                continue
            out.extend(g.addresses)
        return out


def block_prefixes(block: IPBlock) -> tuple[IPNetwork, ...]:
    """*block*'s cidr minus its excepts, as disjoint prefixes."""
    nets: list[IPNetwork] = [block.cidr]
    for exc in block.except_:
        nxt: list[IPNetwork] = []
        for net in nets:
            if net.subnet_of(exc):  # type: ignore[arg-type]
                continue
            if exc.subnet_of(net):  # type: ignore[arg-type]
                nxt.extend(net.address_exclude(exc))  # type: ignore[arg-type]
            else:
                nxt.append(net)
        nets = nxt
    return tuple(sorted(nets, key=lambda n: (n.network_address, n.prefixlen)))


@attrs.frozen
class _PortPlan:
    """A rule's ports: numeric alternatives (inline when one range, else a port set) and named ones."""

    numeric: tuple[tuple[Protocol, int, int], ...] = ()
    named: tuple[tuple[str, Protocol], ...] = ()
    anything: bool = False


def _port_plan(ports: tuple[PolicyPort, ...]) -> _PortPlan:
    if not ports:
        return _PortPlan(anything=True)
    numeric: dict[Protocol, list[tuple[int, int]]] = {}
    whole: set[Protocol] = set()
    named: set[tuple[str, Protocol]] = set()
    for p in ports:
        if isinstance(p.port, str):
            named.add((p.port, p.protocol))
        elif p.port is None:
            whole.add(p.protocol)
        else:
            numeric.setdefault(p.protocol, []).append((p.port, p.end_port or p.port))
    flat: list[tuple[Protocol, int, int]] = []
    for proto in Protocol:
        if proto in whole:
            flat.append((proto, 0, 65535))
        elif proto in numeric:
            flat.extend((proto, lo, hi) for lo, hi in _merge_ranges(numeric[proto]))
    return _PortPlan(tuple(flat), tuple(sorted(named, key=lambda t: (t[0], t[1].value))))


def _merge_ranges(ranges: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
        else:
            merged.append((lo, hi))
    return tuple(merged)


@attrs.define(eq=False)
class _Builder:
    peers: _Peers
    address_sets: dict[str, AddressSet] = attrs.field(factory=dict)
    service_sets: dict[str, ServiceSet] = attrs.field(factory=dict)
    port_sets: dict[str, PortSet] = attrs.field(factory=dict)
    _plans: dict[tuple[PolicyPort, ...], _PortPlan] = attrs.field(factory=dict)

    def selector_sets(self, policy: NetworkPolicy, peer: Peer) -> list[tuple[int, str]]:
        scope = policy.namespace if peer.namespace_selector is None else None
        key = _id("pods", scope, peer.namespace_selector, peer.pod_selector)
        names = [(f, f"p-{key}-{f}") for f in FAMILIES]
        if names[0][1] not in self.address_sets:
            members = self.peers.select(scope, peer.namespace_selector, peer.pod_selector)
            for family, name in names:
                self.address_sets[name] = AddressSet(
                    name, family, False, frozenset(a for a in members if a.version == family)
                )
        return names

    def block_set(self, block: IPBlock) -> tuple[int, str]:
        name = f"b-{_id('block', block.cidr, block.except_)}"
        if name not in self.address_sets:
            self.address_sets[name] = AddressSet(name, block.cidr.version, True, frozenset(block_prefixes(block)))
        return (block.cidr.version, name)

    def service_set(self, named: tuple[tuple[str, Protocol], ...], family: int) -> str:
        name = f"n-{_id('named', named)}-{family}"
        if name not in self.service_sets:
            members = (m for key in named for m in self.peers.named.get(key, ()) if m[0].version == family)
            self.service_sets[name] = ServiceSet(name, family, frozenset(members))
        return name

    def port_match(self, plan: _PortPlan) -> Match:
        if len(plan.numeric) == 1:
            proto, lo, hi = plan.numeric[0]
            return Match(protocol=proto, ports=() if (lo, hi) == (0, 65535) else ((lo, hi),))
        name = f"q-{_id('ports', plan.numeric)}"
        self.port_sets.setdefault(name, PortSet(name, frozenset(plan.numeric)))
        return Match(portset=name)

    def rules(self, policy: NetworkPolicy, rule: PolicyRule, direction: Direction) -> list[Rule]:
        peers: list[tuple[int | None, str | None]]
        if not rule.peers:
            peers = [(None, None)]
        else:
            peers = []
            for peer in rule.peers:
                if peer.ip_block is not None:
                    peers.append(self.block_set(peer.ip_block))
                else:
                    peers.extend(self.selector_sets(policy, peer))
        plan = self._plans.get(rule.ports)
        if plan is None:
            plan = self._plans[rule.ports] = _port_plan(rule.ports)
        numeric = self.port_match(plan) if plan.numeric else None
        out: list[Rule] = []
        for family, addr_set in peers:
            saddr, daddr = (addr_set, None) if direction is Direction.INGRESS else (None, addr_set)
            if plan.anything:
                out.append(Rule(Match(family, saddr, daddr), "accept"))
            if numeric is not None:
                out.append(Rule(attrs.evolve(numeric, family=family, saddr=saddr, daddr=daddr), "accept"))
            if plan.named:
                for fam in (family,) if family is not None else FAMILIES:
                    out.append(Rule(Match(fam, saddr, daddr, service=self.service_set(plan.named, fam)), "accept"))
        return out


def _selects(policy: NetworkPolicy, pod: PolicyPod, direction: Direction) -> bool:
    return (
        direction in policy.policy_types
        and policy.namespace == pod.namespace
        and policy.pod_selector.matches(pod.label_map)
    )


def compile_ruleset(
    policies: Iterable[NetworkPolicy],
    namespaces: Iterable[Namespace],
    pods: Iterable[PolicyPod],
    local_pods: Iterable[PolicyPod],
) -> Ruleset:
    """The ruleset enforcing *policies* for *local_pods* (each with ``host_veth``).

    *pods* are every pod known cluster-wide (peers); a local pod replaces the
    entry with its key.  Raises :class:`InvalidLocalPod` for a local pod whose
    ``host_veth`` is not a flock veth name.
    """
    locals_ = sorted(local_pods, key=lambda p: p.key)
    for p in locals_:
        if p.host_veth is None or not HOST_VETH.match(p.host_veth):
            raise InvalidLocalPod(
                f"local pod {p.key}: host_veth={str(p.host_veth)[:32]!r}: expected flock + 8 hex digits"
            )
    everyone = {p.key: p for p in pods}
    everyone.update((p.key, p) for p in locals_)
    peers = _Peers(everyone.values(), {ns.name: ns for ns in namespaces})
    builder = _Builder(peers)
    by_namespace: dict[str, list[NetworkPolicy]] = defaultdict(list)
    for pol in sorted(policies, key=lambda p: p.key):
        by_namespace[pol.namespace].append(pol)

    chains: dict[str, Chain] = {}
    policy_chains: dict[str, str] = {}
    egress_map: dict[str, str] = {}
    ingress_map: dict[str, str] = {}
    compiled: set[tuple[str, Direction]] = set()

    for pod in locals_:
        assert pod.host_veth is not None
        for direction, vmap in ((Direction.EGRESS, egress_map), (Direction.INGRESS, ingress_map)):
            selecting = [p for p in by_namespace.get(pod.namespace, ()) if _selects(p, pod, direction)]
            if not selecting:
                continue  # not isolated in this direction
            jumps: list[Rule] = []
            for pol in selecting:
                name = policy_chain(pol.key, direction)
                if (pol.key, direction) not in compiled:
                    compiled.add((pol.key, direction))
                    rules = pol.ingress if direction is Direction.INGRESS else pol.egress
                    body = tuple(r for rule in rules for r in builder.rules(pol, rule, direction))
                    if body:  # a policy allowing nothing needs no chain: the pod chain's drop does it
                        chains[name] = Chain(name, body)
                        policy_chains[name] = pol.key
                if name in chains:
                    jumps.append(Rule(Match(), f"jump {name}", counter=False))
            chain = pod_chain(pod.host_veth, direction)
            chains[chain] = Chain(chain, (*jumps, Rule(Match(), "drop")))
            vmap[pod.host_veth] = chain

    return Ruleset(
        chains=dict(sorted(chains.items())),
        address_sets=dict(sorted(builder.address_sets.items())),
        service_sets=dict(sorted(builder.service_sets.items())),
        port_sets=dict(sorted(builder.port_sets.items())),
        egress_map=egress_map,
        ingress_map=ingress_map,
        policy_chains=policy_chains,
    )
