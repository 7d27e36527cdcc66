"""(policies, namespaces, pods, local pods) → the :class:`Ruleset` for this node.  Pure.

Sets are keyed by what selects their members, not by policy, so policies
sharing a selector share a set, and pod churn changes set elements, never
rules.  Named ports go into (address, protocol, port) sets, one per port
names, family and *scope*: the pods the destination can be.  A named port
resolves on the destination pod, so an ingress rule's set holds only this
node's pods (``"local"``: the chain's pod is the destination); an egress
rule's, for a pod/namespace-selector peer, only the pods that selector picks
(scope: the selector's key); for an ipBlock peer or a rule without peers,
every pod of the cluster declaring the name (scope None).  A rule's peer match
and that set together say "a peer, on the port it calls *name*".
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import TypeAlias

import attrs

from ._cluster import Action, ClusterNetworkPolicy, ClusterRule, PolicyNode, Tier
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
from ._ruleset import AddressSet, Chain, Denial, DenyLog, IPNetwork, Match, PortSet, Rule, Ruleset, ServiceSet

# flock's own host veth names (flock.netlink): the only pod-derived text in a chain name.
HOST_VETH = re.compile(r"flock[0-9a-f]{8}\Z")

FAMILIES = (6, 4)


class InvalidLocalPod(ValueError):
    """A local pod without a flock host veth name: a bug in the caller, not API input."""


@functools.lru_cache(maxsize=65536)
def _id(*parts: object) -> str:
    """A short stable name part for hashable *parts* (their repr: no enums in there, whose repr is slow)."""
    return hashlib.blake2b(repr(parts).encode(), digest_size=8).hexdigest()


def policy_chain(policy_key: str, direction: Direction) -> str:
    return ("pi-" if direction is Direction.INGRESS else "pe-") + _id("policy", policy_key)


def tier_chain(tier: Tier, direction: Direction, keys: tuple[str, ...], log: bool = False) -> str:
    """The chain of the ClusterNetworkPolicies *keys* (in precedence order) of *tier* in *direction*
    (*log*: the variant whose Deny rules are logged, for the pods of namespaces logging denied traffic)."""
    prefix = ("ta-" if tier is Tier.ADMIN else "tb-") + ("i-" if direction is Direction.INGRESS else "e-")
    parts: tuple[object, ...] = ("tier", tier.value, direction.value, keys)
    return prefix + _id(*((*parts, "log") if log else parts))


def node_set(selector: LabelSelector, family: int) -> str:
    """The set of the addresses of the nodes *selector* picks."""
    return f"h-{_id('nodes', selector)}-{family}"


def pod_chain(veth: str, direction: Direction) -> str:
    return ("in-" if direction is Direction.INGRESS else "eg-") + veth


def selector_set(
    scope: str | None, ns_selector: LabelSelector | None, pod_selector: LabelSelector | None, family: int
) -> str:
    """The set of the pods a peer selects (*scope*: the policy's namespace when it has no namespace selector)."""
    return f"p-{_id('pods', scope, ns_selector, pod_selector)}-{family}"


@attrs.frozen(cache_hash=True)
class PeerSelection:
    """The pods a pod/namespace-selector peer picks: those *pod_selector* picks (None: all) in *scope* (the
    policy's namespace, for a peer without a namespace selector) or in the namespaces *namespace_selector* picks."""

    scope: str | None
    namespace_selector: LabelSelector | None
    pod_selector: LabelSelector | None

    @property
    def parts(self) -> tuple[str | None, LabelSelector | None, LabelSelector | None]:
        """What set names hash: the tuple this was before it was a value (a running table's names stay)."""
        return (self.scope, self.namespace_selector, self.pod_selector)


# Whose named ports a named-port set holds: every pod's (None), this node's ("local"), or those of the pods a
# peer selector picks.
NamedScope: TypeAlias = str | PeerSelection | None
LOCAL = "local"


def service_set(named: tuple[tuple[str, Protocol], ...], family: int, scope: NamedScope = None) -> str:
    """The set of (address, protocol, port) of the pods of *scope* declaring one of the *named* ports."""
    ports = tuple((n, p.value) for n, p in named)
    if scope is None:
        return f"n-{_id('named', ports)}-{family}"
    where = scope.parts if isinstance(scope, PeerSelection) else scope
    return f"n-{_id('named', ports, where)}-{family}"


NamedEntries = dict[tuple[str, Protocol], list[tuple[IPAddress, Protocol, int]]]


def _named_ports(pods: Iterable[PolicyPod]) -> NamedEntries:
    """(port name, protocol) → (address, protocol, port) of the selectable *pods* declaring it."""
    out: NamedEntries = {}
    for pod in pods:
        if pod.selectable and pod.addresses:
            for np in pod.named_ports:
                out.setdefault((np.name, np.protocol), []).extend((a, np.protocol, np.port) for a in pod.addresses)
    return out


@attrs.frozen
class _Group:
    """Selectable pods sharing namespace and labels: selectors see them as one."""

    namespace: str
    labels: Labels
    addresses: tuple[IPAddress, ...]
    label_map: Mapping[str, str] = attrs.field(hash=False, eq=False)
    # (port name, protocol) → (address, protocol, port) of the group's pods declaring it
    named: NamedEntries = attrs.field(hash=False, eq=False)


class _Peers:
    """The cluster's selectable pods, indexed for selector matching."""

    def __init__(self, pods: Iterable[PolicyPod], namespaces: Mapping[str, Namespace]) -> None:
        grouped: dict[tuple[str, Labels], list[IPAddress]] = defaultdict(list)
        declaring: dict[tuple[str, Labels], list[PolicyPod]] = defaultdict(list)
        for pod in pods:
            if not pod.selectable or not pod.addresses:
                continue
            grouped[(pod.namespace, pod.labels)].extend(pod.addresses)
            if pod.named_ports:
                declaring[(pod.namespace, pod.labels)].append(pod)
        named_in = {key: _named_ports(members) for key, members in declaring.items()}
        self.named: NamedEntries = {}  # the whole cluster's
        for entries in named_in.values():
            for port, es in entries.items():
                self.named.setdefault(port, []).extend(es)
        # Families some pod has an address of: rules for a family no pod has would match nothing
        # (IPv6-only clusters, flock's default, get half the rules); the first IPv4 pod adds them.
        versions = {a.version for addrs in grouped.values() for a in addrs}
        self.families = tuple(f for f in FAMILIES if f in versions)
        self.groups = [
            _Group(ns, labels, tuple(addrs), dict(labels), named_in.get((ns, labels), {}))
            for (ns, labels), addrs in grouped.items()
        ]
        self.by_namespace: dict[str, list[_Group]] = defaultdict(list)
        self.by_label: dict[tuple[str, str], list[_Group]] = defaultdict(list)
        for g in self.groups:
            self.by_namespace[g.namespace].append(g)
            for pair in g.labels:
                self.by_label[pair].append(g)
        self.namespaces = namespaces
        self._ns_match: dict[LabelSelector, frozenset[str]] = {}

    def namespace_labels(self, name: str) -> Mapping[str, str]:
        ns = self.namespaces.get(name)
        return ns.label_map if ns is not None else {NAMESPACE_NAME_LABEL: name}

    def logs_denied(self, name: str) -> bool:
        ns = self.namespaces.get(name)
        return ns is not None and ns.log_denied

    def _namespaces_matching(self, selector: LabelSelector) -> frozenset[str]:
        """The namespaces with selectable pods whose labels *selector* matches."""
        hit = self._ns_match.get(selector)
        if hit is None:
            hit = self._ns_match[selector] = frozenset(
                n for n in self.by_namespace if selector.matches(self.namespace_labels(n))
            )
        return hit

    def select(
        self, namespace: str | None, ns_selector: LabelSelector | None, pod_selector: LabelSelector | None
    ) -> list[_Group]:
        """The groups of pods in *namespace* (or in namespaces *ns_selector* picks) matching *pod_selector*."""
        allowed = self._namespaces_matching(ns_selector) if ns_selector is not None else None
        candidates: list[_Group]
        if pod_selector is not None and pod_selector.match_labels:
            candidates = min((self.by_label.get(pair, []) for pair in pod_selector.match_labels), key=len)
        elif namespace is not None:
            candidates = self.by_namespace.get(namespace, [])
        elif allowed is not None:
            candidates = [g for n in allowed for g in self.by_namespace[n]]
        else:
            candidates = self.groups
        out: list[_Group] = []
        for g in candidates:
            if namespace is not None and g.namespace != namespace:
                continue
            if allowed is not None and g.namespace not in allowed:
                continue
            if pod_selector is not None and not pod_selector.matches(g.label_map):
                continue
            out.append(g)
        return out


@functools.lru_cache(maxsize=4096)
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


@functools.lru_cache(maxsize=4096)
def _block_set(block: IPBlock) -> AddressSet:
    name = f"b-{_id('block', block.cidr, block.except_)}"
    return AddressSet(name, block.cidr.version, True, frozenset(block_prefixes(block)))


@functools.lru_cache(maxsize=4096)
def _networks_set(family: int, networks: tuple[IPNetwork, ...]) -> AddressSet:
    """An interval set of *networks* (one family; overlapping ones merged, as an interval set needs)."""
    collapsed = tuple(ipaddress.collapse_addresses(networks))  # type: ignore[type-var]
    return AddressSet(f"b-{_id('networks', family, collapsed)}", family, True, frozenset(collapsed))


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


# What a dynamic set's elements are computed from, and its name.  Blocks, networks and port sets are static.


@attrs.frozen(cache_hash=True)
class PodsSpec:
    """The addresses of *family* of the pods *peer* picks."""

    peer: PeerSelection
    family: int

    @property
    def name(self) -> str:
        return selector_set(self.peer.scope, self.peer.namespace_selector, self.peer.pod_selector, self.family)


@attrs.frozen(cache_hash=True)
class NodesSpec:
    """The addresses of *family* of the nodes *selector* picks."""

    selector: LabelSelector
    family: int

    @property
    def name(self) -> str:
        return node_set(self.selector, self.family)


@attrs.frozen(cache_hash=True)
class NamedPortsSpec:
    """(address, protocol, port) of *family* of the pods of *scope* declaring one of *ports* (name, protocol)."""

    ports: tuple[tuple[str, Protocol], ...]
    family: int
    scope: NamedScope

    @property
    def name(self) -> str:
        return service_set(self.ports, self.family, self.scope)


SetSpec: TypeAlias = PodsSpec | NodesSpec | NamedPortsSpec


@attrs.define(eq=False)
class _PolicyChains:
    """Rules of one policy and direction, independent of pods: cacheable while the policy is unchanged."""

    chain: Chain | None  # None: the policy allows nothing in this direction
    specs: dict[str, SetSpec]  # dynamic sets the body references
    static: dict[str, AddressSet | PortSet]  # static sets it references


@attrs.define(eq=False)
class _RuleBuilder:
    families: tuple[int, ...]
    nodes_known: bool = True  # Nodes listed: else a nodes peer fails closed
    specs: dict[str, SetSpec] = attrs.field(factory=dict)
    static: dict[str, AddressSet | PortSet] = attrs.field(factory=dict)

    def selector_sets(self, policy: NetworkPolicy, peer: Peer) -> list[tuple[int, str, NamedScope]]:
        scope = policy.namespace if peer.namespace_selector is None else None
        selection = PeerSelection(scope, peer.namespace_selector, peer.pod_selector)
        names: list[tuple[int, str, NamedScope]] = []
        for family in self.families:
            spec = PodsSpec(selection, family)
            self.specs[spec.name] = spec
            names.append((family, spec.name, selection))
        return names

    def block_set(self, block: IPBlock) -> tuple[int, str, NamedScope]:
        aset = _block_set(block)
        self.static[aset.name] = aset
        return (block.cidr.version, aset.name, None)

    def service_set(self, named: tuple[tuple[str, Protocol], ...], family: int, scope: NamedScope) -> str:
        spec = NamedPortsSpec(named, family, scope)
        self.specs[spec.name] = spec
        return spec.name

    def port_match(self, plan: _PortPlan) -> Match:
        if len(plan.numeric) == 1:
            proto, lo, hi = plan.numeric[0]
            return Match(protocol=proto, ports=() if (lo, hi) == (0, 65535) else ((lo, hi),))
        name = f"q-{_id('ports', tuple((p.value, lo, hi) for p, lo, hi in plan.numeric))}"
        self.static.setdefault(name, PortSet(name, frozenset(plan.numeric)))
        return Match(portset=name)

    def rules(self, policy: NetworkPolicy, rule: PolicyRule, direction: Direction) -> list[Rule]:
        # (family, address set, whose named ports the destination's may be: the peer's pods if it selects pods)
        peers: list[tuple[int | None, str | None, NamedScope]]
        if not rule.peers:
            peers = [(None, None, None)]
        else:
            peers = []
            for peer in rule.peers:
                if peer.ip_block is not None:
                    peers.append(self.block_set(peer.ip_block))
                else:
                    peers.extend(self.selector_sets(policy, peer))
        plan = _port_plan(rule.ports)
        numeric = self.port_match(plan) if plan.numeric else None
        out: list[Rule] = []
        for family, addr_set, scope in peers:
            saddr, daddr = (addr_set, None) if direction is Direction.INGRESS else (None, addr_set)
            if direction is Direction.INGRESS:
                scope = LOCAL  # the destination: the local pod whose chain this is
            if plan.anything:
                out.append(Rule(Match(family, saddr, daddr), "accept"))
            if numeric is not None:
                out.append(Rule(attrs.evolve(numeric, family=family, saddr=saddr, daddr=daddr), "accept"))
            if plan.named:
                for fam in (family,) if family is not None else self.families:
                    service = self.service_set(plan.named, fam, scope)
                    out.append(Rule(Match(fam, saddr, daddr, service=service), "accept"))
        return out

    def cluster_rules(self, rule: ClusterRule, direction: Direction) -> list[Rule]:
        """The nft rules of one ClusterNetworkPolicy rule, each ending in the rule's action."""
        verdict = _VERDICT[rule.action]
        if rule.unreadable:
            # Fails closed (the CRD's words): an Accept rule matches nothing, a Deny or Pass rule denies all.
            return [] if rule.action is Action.ACCEPT else [Rule(Match(), "drop")]
        # (family (None: both), address set (None: any address), whose named ports a destination's may be
        # (_NO_PODS for nodes), the verdict)
        targets: list[tuple[int | None, str | None, NamedScope | object, str]] = []
        for peer in rule.peers:
            selector = peer.selector
            if selector is not None:
                ns_sel, pod_sel = selector
                selection = PeerSelection(None, ns_sel, pod_sel)
                for f in self.families:
                    pods = PodsSpec(selection, f)
                    self.specs[pods.name] = pods
                    targets.append((f, pods.name, selection, verdict))
            elif peer.nodes is not None and not self.nodes_known:
                # Nodes not listed (yet, or not allowed): any address may be a selected node's. Failing
                # closed, an Accept matches nothing here and a Deny or Pass denies every address.
                if rule.action is not Action.ACCEPT:
                    targets.append((None, None, _NO_PODS, "drop"))
            elif peer.nodes is not None:
                for f in FAMILIES:
                    nodes = NodesSpec(peer.nodes, f)
                    self.specs[nodes.name] = nodes
                    targets.append((f, nodes.name, _NO_PODS, verdict))
            else:
                for f in FAMILIES:
                    nets = tuple(n for n in peer.networks if n.version == f)
                    if nets:
                        aset = _networks_set(f, nets)
                        self.static[aset.name] = aset
                        targets.append((f, aset.name, None, verdict))
        numeric: dict[Protocol, list[tuple[int, int]]] = {}
        names: set[str] = set()
        for cp in rule.protocols:
            if cp.named is not None:
                names.add(cp.named)
            else:
                assert cp.protocol is not None
                numeric.setdefault(cp.protocol, []).append((cp.first, cp.last))
        flat = tuple((proto, lo, hi) for proto in Protocol for lo, hi in _merge_ranges(numeric.get(proto, ())))
        port_match = self.port_match(_PortPlan(flat)) if flat else None
        # a named port, whatever protocol the destination declares it with
        named = tuple((n, proto) for n in sorted(names) for proto in Protocol)
        out: list[Rule] = []
        for family, addr_set, scope, action in targets:
            saddr, daddr = (addr_set, None) if direction is Direction.INGRESS else (None, addr_set)
            if not rule.protocols:
                out.append(Rule(Match(family, saddr, daddr), action))
            if port_match is not None:
                out.append(Rule(attrs.evolve(port_match, family=family, saddr=saddr, daddr=daddr), action))
            if named and scope is not _NO_PODS:
                assert family is not None
                where: NamedScope = LOCAL if direction is Direction.INGRESS else scope  # type: ignore[assignment]
                out.append(Rule(Match(family, saddr, daddr, service=self.service_set(named, family, where)), action))
        return out


_VERDICT = {Action.ACCEPT: "accept", Action.DENY: "drop", Action.PASS: "return"}
_NO_PODS = object()  # a nodes peer: no pod there declares a named port


@attrs.define(eq=False)
class _TierChain:
    """The inlined rules of a sequence of ClusterNetworkPolicies of one tier and direction."""

    chain: Chain | None  # None: no rule
    specs: dict[str, SetSpec]
    static: dict[str, AddressSet | PortSet]
    owners: tuple[tuple[str, str], ...]  # per rule: (policy, rule name or "egress[1]")
    denials: dict[str, Denial] = attrs.field(factory=dict)  # the logging variant's: prefix → its Deny rule


def _tier_chain(
    policies: tuple[ClusterNetworkPolicy, ...],
    tier: Tier,
    direction: Direction,
    families: tuple[int, ...],
    nodes_known: bool = True,
    log: bool = False,
) -> _TierChain:
    """The tier chain; with *log*, each drop is logged as ``<chain>#<i>``, *i* its index among the chain's
    counted rules (the index the per-rule counters and ``owners`` use)."""
    builder = _RuleBuilder(families, nodes_known)
    name = tier_chain(tier, direction, tuple(c.key for c in policies), log)
    body: list[Rule] = []
    owners: list[tuple[str, str]] = []
    denials: dict[str, Denial] = {}
    for cnp in policies:
        rules_ = cnp.ingress if direction is Direction.INGRESS else cnp.egress
        for rule, label in zip(rules_, rule_labels(cnp, direction), strict=True):
            rules = builder.cluster_rules(rule, direction)
            if log:
                for j, r in enumerate(rules):
                    if r.verdict == "drop":
                        prefix = f"{name}#{len(owners) + j}"
                        rules[j] = attrs.evolve(r, log=DenyLog(prefix, direction))
                        denials[prefix] = Denial(tier.value, direction, (cnp.name,), label)
            body += rules
            owners += [(cnp.name, label)] * len(rules)
    chain = Chain(name, tuple(body)) if body else None
    return _TierChain(chain, builder.specs, builder.static, tuple(owners), denials)


def rule_labels(cnp: ClusterNetworkPolicy, direction: Direction) -> list[str]:
    """What names each of *cnp*'s rules of *direction* in tier_rules, counters and logs: its name; unnamed,
    or a name the policy gives twice, its place too ("egress[2]", "allow-dns (egress[2])")."""
    rules = cnp.ingress if direction is Direction.INGRESS else cnp.egress
    names = [r.name for r in rules if r.name]
    out = []
    for i, rule in enumerate(rules):
        label = f"{direction.value.lower()}[{i}]"
        if rule.name:
            label = rule.name if names.count(rule.name) == 1 else f"{rule.name} ({label})"
        out.append(label)
    return out


def _policy_chains(policy: NetworkPolicy, direction: Direction, families: tuple[int, ...], name: str) -> _PolicyChains:
    builder = _RuleBuilder(families)
    rules = policy.ingress if direction is Direction.INGRESS else policy.egress
    body = tuple(r for rule in rules for r in builder.rules(policy, rule, direction))
    return _PolicyChains(Chain(name, body) if body else None, builder.specs, builder.static)


def check_local(pods: Iterable[PolicyPod]) -> list[PolicyPod]:
    """*pods* by key, each with a flock host veth (else :class:`InvalidLocalPod`)."""
    out = sorted(pods, key=lambda p: p.key)
    for p in out:
        if p.host_veth is None or not HOST_VETH.match(p.host_veth):
            raise InvalidLocalPod(
                f"local pod {p.key}: host_veth={str(p.host_veth)[:32]!r}: expected flock + 8 hex digits"
            )
    return out


@attrs.define(eq=False)
class Compiler:
    """:func:`compile_ruleset` with memory: the same result, faster on the next, similar input.

    Caches are keyed by the input values they derive from (a policy's rules
    by the policy value and the families in use; a pod's selecting policies
    by its namespace and labels, dropped whenever the policies change), so a
    reused compiler returns exactly what a fresh one would.  Pod churn then
    costs the set memberships, not the rules.
    """

    # (policy key, direction) → (the policy, families, its chain): checked by identity, then equality
    _chains: dict[tuple[str, Direction], tuple[NetworkPolicy, tuple[int, ...], _PolicyChains]] = attrs.field(
        init=False, factory=dict
    )
    _pod_chains: dict[tuple[str, tuple[str, ...], bool, bool], Chain] = attrs.field(init=False, factory=dict)
    _policies: tuple[NetworkPolicy, ...] = attrs.field(init=False, default=())
    # (namespace, direction) → (policies whose pod selector has no matchLabels, {label pair: policies indexed by
    # their selector's first matchLabels pair}): a pod need only try the policies one of its labels can satisfy
    _index: dict[tuple[str, Direction], tuple[list[NetworkPolicy], dict[tuple[str, str], list[NetworkPolicy]]]] = (
        attrs.field(init=False, factory=dict)
    )
    _selection: dict[tuple[str, Labels, Direction], tuple[NetworkPolicy, ...]] = attrs.field(init=False, factory=dict)
    # ClusterNetworkPolicies by tier, in precedence order; which select a pod (by namespace and labels: cleared
    # when they or a namespace's labels change); tier chains by (tier, direction, keys) → (policies, families, it)
    _cluster: dict[Tier, tuple[ClusterNetworkPolicy, ...]] = attrs.field(
        init=False, factory=lambda: {t: () for t in Tier}
    )
    # (namespace, direction, tier) → the policies with rules in *direction* whose namespace selector picks it
    _tier_selection: dict[tuple[str, Direction, Tier], tuple[ClusterNetworkPolicy, ...]] = attrs.field(
        init=False, factory=dict
    )
    _tier_chains: dict[
        tuple[Tier, Direction, tuple[str, ...], bool],
        tuple[tuple[ClusterNetworkPolicy, ...], tuple[int, ...], _TierChain],
    ] = attrs.field(init=False, factory=dict)

    _nodes_known: bool = attrs.field(init=False, default=True)

    @property
    def policies(self) -> tuple[NetworkPolicy, ...]:
        """The policies last given, by key."""
        return self._policies

    @property
    def active(self) -> bool:
        """Is there any policy (NetworkPolicy or ClusterNetworkPolicy) at all?"""
        return bool(self._policies or self._cluster[Tier.ADMIN] or self._cluster[Tier.BASELINE])

    def set_cluster_policies(self, policies: Iterable[ClusterNetworkPolicy], nodes_known: bool = True) -> None:
        """Compile for these ClusterNetworkPolicies from now on (*nodes_known*: Nodes are listed; else the
        policies' nodes peers fail closed)."""
        by_tier = {t: tuple(sorted((p for p in policies if p.tier is t), key=lambda p: p.order)) for t in Tier}
        if nodes_known != self._nodes_known:
            self._nodes_known = nodes_known
            self._tier_chains = {}
        if by_tier == self._cluster:
            return
        self._cluster = by_tier
        self._tier_selection.clear()
        used = {(t, p.key) for t, ps in by_tier.items() for p in ps}
        self._tier_chains = {k: v for k, v in self._tier_chains.items() if all((k[0], key) in used for key in k[2])}

    def namespaces_changed(self) -> None:
        """A namespace's labels changed: which ClusterNetworkPolicies select a pod is read anew."""
        self._tier_selection.clear()

    def _tier_selecting(
        self, pod: PolicyPod, direction: Direction, tier: Tier, ns_labels: Callable[[str], Mapping[str, str]]
    ) -> tuple[ClusterNetworkPolicy, ...]:
        candidates = self._cluster[tier]
        if not candidates:
            return ()
        # Pods rarely share their label set (pod-template-hash, a StatefulSet's pod name): the namespace's
        # verdicts are what is worth keeping; a pod selector, if any, is checked per pod.
        key = (pod.namespace, direction, tier)
        in_namespace = self._tier_selection.get(key)
        if in_namespace is None:
            labels = ns_labels(pod.namespace)
            in_namespace = self._tier_selection[key] = tuple(
                p
                for p in candidates
                if (p.ingress if direction is Direction.INGRESS else p.egress) and p.subject_namespaces.matches(labels)
            )
        if not in_namespace or not pod.selectable:
            return ()
        pod_labels = pod.label_map
        return tuple(p for p in in_namespace if p.subject_pods is None or p.subject_pods.matches(pod_labels))

    def _tier_chain(
        self,
        policies: tuple[ClusterNetworkPolicy, ...],
        tier: Tier,
        direction: Direction,
        families: tuple[int, ...],
        log: bool = False,
    ) -> _TierChain:
        key = (tier, direction, tuple(p.key for p in policies), log)
        hit = self._tier_chains.get(key)
        if (
            hit is not None
            and hit[1] == families
            and all(a is b or a == b for a, b in zip(hit[0], policies, strict=True))
        ):
            return hit[2]
        tc = _tier_chain(policies, tier, direction, families, self._nodes_known, log)
        self._tier_chains[key] = (policies, families, tc)
        return tc

    def set_policies(self, policies: Iterable[NetworkPolicy]) -> None:
        """Compile for *policies* from now on (what :meth:`compile` does first)."""
        self._set_policies(policies)

    def _set_policies(self, policies: Iterable[NetworkPolicy]) -> None:
        ordered = tuple(sorted(policies, key=lambda p: p.key))
        if ordered == self._policies:
            return
        self._policies = ordered
        self._selection.clear()
        self._index = {}
        for pol in ordered:
            for direction in pol.policy_types:
                plain, by_pair = self._index.setdefault((pol.namespace, direction), ([], defaultdict(list)))
                if pol.pod_selector.match_labels:
                    by_pair[pol.pod_selector.match_labels[0]].append(pol)
                else:
                    plain.append(pol)
        keys = {p.key for p in ordered}
        self._chains = {k: v for k, v in self._chains.items() if k[0] in keys}

    def _policy_chains(self, pol: NetworkPolicy, direction: Direction, families: tuple[int, ...]) -> _PolicyChains:
        hit = self._chains.get((pol.key, direction))
        if hit is not None and (hit[0] is pol or hit[0] == pol) and hit[1] == families:
            return hit[2]
        pc = _policy_chains(pol, direction, families, policy_chain(pol.key, direction))
        self._chains[(pol.key, direction)] = (pol, families, pc)
        return pc

    def _selecting(self, pod: PolicyPod, direction: Direction) -> tuple[NetworkPolicy, ...]:
        key = (pod.namespace, pod.labels, direction)
        hit = self._selection.get(key)
        if hit is None:
            labels = pod.label_map
            plain, by_pair = self._index.get((pod.namespace, direction), ((), {}))
            candidates = [*plain, *(p for pair in pod.labels for p in by_pair.get(pair, ()))]
            candidates.sort(key=lambda p: p.key)  # the order of the jumps: by policy key
            hit = self._selection[key] = tuple(p for p in candidates if p.pod_selector.matches(labels))
        return hit

    def compile(
        self,
        policies: Iterable[NetworkPolicy],
        namespaces: Iterable[Namespace],
        pods: Iterable[PolicyPod],
        local_pods: Iterable[PolicyPod],
        cluster_policies: Iterable[ClusterNetworkPolicy] = (),
        nodes: Iterable[PolicyNode] = (),
        nodes_known: bool = True,
    ) -> Ruleset:
        locals_ = check_local(local_pods)
        self._set_policies(policies)
        self.set_cluster_policies(cluster_policies, nodes_known)
        self.namespaces_changed()  # a pure function of its arguments: nothing of the last call's namespaces
        if not self.active:
            # Nothing selects any pod: no chains, no sets (what the full pass below finds, without
            # indexing every pod of the cluster as a peer — a node of a cluster without
            # NetworkPolicies does no work per pod change).
            return Ruleset()
        everyone = {p.key: p for p in pods}
        everyone.update((p.key, p) for p in locals_)
        peers = _Peers(everyone.values(), {ns.name: ns for ns in namespaces})
        layout = self.layout(locals_, peers.families, peers.namespace_labels, peers.logs_denied)
        node_list = list(nodes)
        service_sets: dict[str, ServiceSet] = {}
        address_sets = dict(layout.address_sets)
        selected: dict[PeerSelection, list[_Group]] = {}

        def select(peer: PeerSelection) -> list[_Group]:
            members = selected.get(peer)
            if members is None:
                members = selected[peer] = peers.select(peer.scope, peer.namespace_selector, peer.pod_selector)
            return members

        local_named = _named_ports(locals_)
        for name, spec in layout.specs.items():
            family = spec.family
            if isinstance(spec, PodsSpec):
                addresses = (a for g in select(spec.peer) for a in g.addresses if a.version == family)
                address_sets[name] = AddressSet(name, family, False, frozenset(addresses))
                continue
            if isinstance(spec, NodesSpec):
                selector = spec.selector
                found = (
                    a for n in node_list if selector.matches(n.label_map) for a in n.addresses if a.version == family
                )
                address_sets[name] = AddressSet(name, family, False, frozenset(found))
                continue
            named, where = spec.ports, spec.scope
            entries: Iterable[Iterable[tuple[IPAddress, Protocol, int]]]
            if where is None:
                entries = (peers.named.get(key, ()) for key in named)
            elif isinstance(where, PeerSelection):
                entries = (g.named.get(key, ()) for g in select(where) for key in named)
            else:
                assert where == LOCAL
                entries = (local_named.get(key, ()) for key in named)
            elements = frozenset(m for es in entries for m in es if m[0].version == family)
            service_sets[name] = ServiceSet(name, family, elements)
        return layout.ruleset(address_sets, service_sets)

    def needed_specs(
        self,
        pods: Iterable[PolicyPod],
        families: tuple[int, ...] = FAMILIES,
        namespace_labels: Callable[[str], Mapping[str, str]] | None = None,
    ) -> dict[str, SetSpec]:
        """The sets pods and nodes fill that :meth:`layout` would give for *pods* as a node's pods: the peers
        that node needs to know (flock-controller's address groups), found by the same selection as
        :meth:`layout` without building chains (no ``host_veth`` needed)."""
        ns_labels = namespace_labels if namespace_labels is not None else _bare_namespace
        specs: dict[str, SetSpec] = {}
        for pod in pods:
            for direction in (Direction.EGRESS, Direction.INGRESS):
                admin = self._tier_selecting(pod, direction, Tier.ADMIN, ns_labels)
                if admin:
                    tc = self._tier_chain(admin, Tier.ADMIN, direction, families)
                    if tc.chain is not None:
                        specs.update(tc.specs)
                selecting = self._selecting(pod, direction)
                if not selecting:
                    baseline = self._tier_selecting(pod, direction, Tier.BASELINE, ns_labels)
                    if baseline:
                        tc = self._tier_chain(baseline, Tier.BASELINE, direction, families)
                        if tc.chain is not None:
                            specs.update(tc.specs)
                for pol in selecting:
                    pc = self._policy_chains(pol, direction, families)
                    if pc.chain is not None:
                        specs.update(pc.specs)
        return specs

    def layout(
        self,
        locals_: list[PolicyPod],
        families: tuple[int, ...],
        namespace_labels: Callable[[str], Mapping[str, str]] | None = None,
        logs_denied: Callable[[str], bool] | None = None,
    ) -> Layout:
        """This node's chains, maps and sets for *locals_* (checked, by key) under the policies last set.

        *namespace_labels* reads a namespace's labels (for ClusterNetworkPolicy subjects), *logs_denied*
        whether a namespace logs its pods' denied traffic (None: none does).  Sets filled by pods and
        nodes are left as specs: the caller fills them."""
        ns_labels = namespace_labels if namespace_labels is not None else _bare_namespace
        chains: dict[str, Chain] = {}
        policy_chains: dict[str, str] = {}
        tier_rules: dict[str, tuple[tuple[str, str], ...]] = {}
        egress_map: dict[str, str] = {}
        ingress_map: dict[str, str] = {}
        node_map: dict[str, str] = {}
        specs: dict[str, SetSpec] = {}
        static: dict[str, AddressSet | PortSet] = {}
        used: dict[tuple[str, tuple[str, ...], bool, bool], Chain] = {}
        denials: dict[str, Denial] = {}

        def tier(
            policies: tuple[ClusterNetworkPolicy, ...], which: Tier, direction: Direction, log: bool
        ) -> str | None:
            if not policies:
                return None
            tc = self._tier_chain(policies, which, direction, families, log)
            if tc.chain is None:
                return None
            name = tc.chain.name
            if name not in chains:
                chains[name] = tc.chain
                tier_rules[name] = tc.owners
                specs.update(tc.specs)
                static.update(tc.static)
                denials.update(tc.denials)
            return name

        for pod in locals_:
            assert pod.host_veth is not None
            log = logs_denied is not None and logs_denied(pod.namespace)
            for direction, vmap in ((Direction.EGRESS, egress_map), (Direction.INGRESS, ingress_map)):
                admin = tier(self._tier_selecting(pod, direction, Tier.ADMIN, ns_labels), Tier.ADMIN, direction, log)
                selecting = self._selecting(pod, direction)
                baseline = None
                if not selecting:  # NetworkPolicy decides for the pods it isolates: Baseline for the others
                    baseline = tier(
                        self._tier_selecting(pod, direction, Tier.BASELINE, ns_labels), Tier.BASELINE, direction, log
                    )
                if admin is not None and direction is Direction.EGRESS:
                    node_map[pod.host_veth] = admin
                if not selecting and admin is None and baseline is None:
                    continue  # no policy of any tier for this pod and direction
                targets: list[str] = [admin] if admin is not None else []
                for pol in selecting:
                    pc = self._policy_chains(pol, direction, families)
                    if pc.chain is None:
                        continue  # a policy allowing nothing needs no chain: the pod's drop does it
                    name = pc.chain.name
                    targets.append(name)
                    if name not in chains:
                        chains[name] = pc.chain
                        policy_chains[name] = pol.key
                        specs.update(pc.specs)
                        static.update(pc.static)
                if baseline is not None:
                    targets.append(baseline)
                chain = pod_chain(pod.host_veth, direction)
                logged = log and bool(selecting)
                jump_key = (chain, tuple(targets), bool(selecting), logged)
                cached = self._pod_chains.get(jump_key)
                if cached is None:
                    jumps = [Rule(Match(), f"jump {t}", counter=False) for t in targets]
                    # isolated by a NetworkPolicy: what none of them allowed is dropped
                    drop = Rule(Match(), "drop", log=DenyLog(chain, direction) if logged else None)
                    cached = Chain(chain, (*jumps, drop) if selecting else tuple(jumps))
                used[jump_key] = chains[chain] = cached
                vmap[pod.host_veth] = chain
                if logged:
                    # every policy isolating the pod, those allowing nothing (no chain of their own) too
                    denials[chain] = Denial("NetworkPolicy", direction, tuple(p.key for p in selecting))
        self._pod_chains = used  # the chains of pods gone from this node go too
        return Layout(
            chains=dict(sorted(chains.items())),
            address_sets={n: s for n, s in static.items() if isinstance(s, AddressSet)},
            port_sets=dict(sorted((n, s) for n, s in static.items() if isinstance(s, PortSet))),
            specs=specs,
            egress_map=egress_map,
            ingress_map=ingress_map,
            policy_chains=policy_chains,
            node_map=node_map,
            tier_rules=dict(sorted(tier_rules.items())),
            denials=dict(sorted(denials.items())),
        )


def _bare_namespace(name: str) -> Mapping[str, str]:
    return {NAMESPACE_NAME_LABEL: name}


@attrs.frozen
class Layout:
    """A ruleset but for the elements of the sets pods fill: those are ``specs`` (set name → what fills it)."""

    chains: dict[str, Chain]
    address_sets: dict[str, AddressSet]  # the static ones (ipBlocks)
    port_sets: dict[str, PortSet]
    specs: dict[str, SetSpec]
    egress_map: dict[str, str]
    ingress_map: dict[str, str]
    policy_chains: dict[str, str]
    node_map: dict[str, str] = attrs.field(factory=dict)
    tier_rules: dict[str, tuple[tuple[str, str], ...]] = attrs.field(factory=dict)
    denials: dict[str, Denial] = attrs.field(factory=dict)

    def ruleset(self, address_sets: Mapping[str, AddressSet], service_sets: Mapping[str, ServiceSet]) -> Ruleset:
        """The ruleset with *address_sets* (static and filled) and *service_sets*."""
        return Ruleset(
            chains=self.chains,
            address_sets=dict(sorted(address_sets.items())),
            service_sets=dict(sorted(service_sets.items())),
            port_sets=self.port_sets,
            egress_map=self.egress_map,
            ingress_map=self.ingress_map,
            node_map=self.node_map,
            policy_chains=self.policy_chains,
            tier_rules=self.tier_rules,
            denials=self.denials,
        )


def compile_ruleset(
    policies: Iterable[NetworkPolicy],
    namespaces: Iterable[Namespace],
    pods: Iterable[PolicyPod],
    local_pods: Iterable[PolicyPod],
    cluster_policies: Iterable[ClusterNetworkPolicy] = (),
    nodes: Iterable[PolicyNode] = (),
    nodes_known: bool = True,
) -> Ruleset:
    """The ruleset enforcing *policies* for *local_pods* (each with ``host_veth``).

    *pods* are every pod known cluster-wide (peers); a local pod replaces the
    entry with its key.  Raises :class:`InvalidLocalPod` for a local pod whose
    ``host_veth`` is not a flock veth name.  (:class:`Compiler` computes the
    same, reusing what did not change since its last call.)
    """
    return Compiler().compile(policies, namespaces, pods, local_pods, cluster_policies, nodes, nodes_known)
