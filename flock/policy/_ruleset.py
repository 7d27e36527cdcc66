"""The desired nftables state for one node, as values.

The compiler (:mod:`._compile`) makes a :class:`Ruleset`; the renderer
(:mod:`._nft`) turns it into nft syntax; the simulator (:mod:`._simulate`)
runs a packet through it in Python.  Every name in here is made by flock
(``pe-<hash>``, ``in-flock1a2b3c4d``, ``p-<hash>-6``); the only other things
a Ruleset holds are addresses, protocols and port numbers.

Layout in the kernel (``table inet flock``)::

    chain egress   hook forward priority filter      ct established,related accept; iifname vmap @egress-pods
    chain ingress  hook forward priority filter + 1  ct established,related accept; oifname vmap @ingress-pods
    chain input    hook input priority filter    ct established,related accept; link-local, multicast and
                                                 broadcast accept; iifname vmap @node-pods
    chain eg-<veth> / in-<veth>    one per local pod some policy selects, the tiers in order:
                                   jump ta-<id> (Admin), then either jump pe-/pi-<id> per selecting
                                   NetworkPolicy and drop, or (no NetworkPolicy selects it) jump tb-<id> (Baseline)
    chain ta-<id> / tb-<id>        one per sequence of ClusterNetworkPolicies (Admin / Baseline tier) selecting
                                   a local pod in a direction: their rules inlined in precedence order,
                                   Accept: accept, Deny: drop, Pass: return (on to the next tier)
    chain pe-<id> / pi-<id>        one per policy and direction: "<peer> <ports> counter accept" rules

An ``accept`` ends the current base chain only: a packet accepted by the
egress chain of its source pod still meets the ingress chain of its
destination pod.  Traffic between the node and its own pods never passes the
forward hook: the node reaching its pods is always allowed (kubelet probes);
a pod reaching its own node meets the Admin tier alone, in the input hook
(``node-pods`` maps a pod's veth to its Admin egress chain): NetworkPolicy
allows node <-> own pods, so nothing after the Admin tier can deny it.

Denied traffic, logged: for the pods of a Namespace that asks for it, each
``drop`` (a pod chain's, a Deny rule's in the tier chains those pods jump to:
tier chains come in a logging and a silent variant) carries a
:class:`DenyLog`.  It renders as one more rule before the drop, sending the
packet to nflog group :data:`flock.policy._nft.DENY_LOG_GROUP` with the
drop's prefix, at most so often per pod (a meter keyed by the pod's veth);
:attr:`Ruleset.denials` maps the prefix to the policy and rule that deny.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping

import attrs

from ._model import Direction, IPAddress, Protocol

EGRESS_MAP = "egress-pods"
INGRESS_MAP = "ingress-pods"
NODE_MAP = "node-pods"

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@attrs.frozen
class AddressSet:
    """A named set of addresses of one family; ``interval`` sets hold prefixes."""

    name: str
    family: int  # 4 or 6
    interval: bool = False
    elements: frozenset[IPAddress | IPNetwork] = frozenset()

    @property
    def declaration(self) -> tuple[str, int, bool]:
        return (self.name, self.family, self.interval)


@attrs.frozen
class ServiceSet:
    """Named-port resolutions: (destination address, protocol, port) of every pod with that port name."""

    name: str
    family: int
    elements: frozenset[tuple[IPAddress, Protocol, int]] = frozenset()

    @property
    def declaration(self) -> tuple[str, int]:
        return (self.name, self.family)


@attrs.frozen
class PortSet:
    """(protocol, first port, last port) alternatives of one rule; the name encodes the content."""

    name: str
    elements: frozenset[tuple[Protocol, int, int]] = frozenset()


@attrs.frozen
class Match:
    """A conjunction; None / () fields match anything.

    ``saddr``/``daddr`` name an :class:`AddressSet` of ``family``; ``protocol``
    with ``ports`` (inclusive ranges, () = every port); ``portset`` names a
    :class:`PortSet` matched on (protocol, dport); ``service`` names a
    :class:`ServiceSet` matched on (daddr, protocol, dport).
    """

    family: int | None = None
    saddr: str | None = None
    daddr: str | None = None
    protocol: Protocol | None = None
    ports: tuple[tuple[int, int], ...] = ()
    portset: str | None = None
    service: str | None = None


@attrs.frozen
class DenyLog:
    """A drop that is logged too: before it, a rule sends the packet to nflog (rate-limited per pod).

    ``prefix`` names the drop (a key of :attr:`Ruleset.denials`; the nft log prefix); ``direction`` says
    whose budget the packet spends: its source pod's (Egress, by the veth it came in on) or its
    destination's (Ingress, by the veth it goes out on).
    """

    prefix: str
    direction: Direction


@attrs.frozen
class Denial:
    """Who denies what a :class:`DenyLog` logs: what the agent's log line and counters name.

    ``tier``: "Admin" or "Baseline" (a ClusterNetworkPolicy's Deny rule, ``policies`` its one name and
    ``rule`` the rule's name or place, "ingress[2]"), or "NetworkPolicy" (the pod is isolated and no rule
    allowed: ``policies`` the "ns/name" of every NetworkPolicy isolating it in ``direction``, ``rule`` "").
    """

    tier: str
    direction: Direction
    policies: tuple[str, ...]
    rule: str = ""


@attrs.frozen
class Rule:
    match: Match
    verdict: str  # "accept", "drop", "return", or "jump <chain>"
    counter: bool = True
    log: DenyLog | None = None  # a drop also logged; the log is no verdict (the simulator ignores it)


@attrs.frozen
class Chain:
    name: str
    rules: tuple[Rule, ...] = ()


@attrs.frozen
class NatFamily:
    """natOutgoing for one family: traffic from *sources* (this node's pod block) to anywhere but *exempt*
    (the node's blocks, announceRanges, clusterRanges) leaves masqueraded to the node's address."""

    family: int
    sources: tuple[IPNetwork, ...]
    exempt: tuple[IPNetwork, ...]


@attrs.frozen
class HostPort:
    """One hostPort mapping: *protocol* traffic to this node's *host_ip* (None: any of its addresses of
    *pod_ip*'s family) on *host_port* goes to *pod_ip*:*pod_port* (DNAT; a pod reaching itself so is
    masqueraded, or its reply would never find the way back)."""

    host_port: int
    protocol: Protocol
    pod_ip: IPAddress
    pod_port: int
    host_ip: IPAddress | None = None

    def sort_key(self) -> tuple[object, ...]:
        """The order of a ruleset's mappings (addresses of both families among them)."""
        host = (self.host_ip.version, self.host_ip.packed) if self.host_ip is not None else (0, b"")
        return (self.host_port, self.protocol.value, self.pod_ip.version, self.pod_ip.packed, self.pod_port, host)


@attrs.frozen
class Ruleset:
    """Everything in ``table inet flock`` except the two fixed base chains."""

    chains: Mapping[str, Chain] = attrs.field(factory=dict)
    address_sets: Mapping[str, AddressSet] = attrs.field(factory=dict)
    service_sets: Mapping[str, ServiceSet] = attrs.field(factory=dict)
    port_sets: Mapping[str, PortSet] = attrs.field(factory=dict)
    egress_map: Mapping[str, str] = attrs.field(factory=dict)  # host veth → chain
    ingress_map: Mapping[str, str] = attrs.field(factory=dict)
    node_map: Mapping[str, str] = attrs.field(factory=dict)  # host veth → its Admin egress chain (input hook)
    # for counters and logs only, never rendered: policy chain → "ns/name"
    policy_chains: Mapping[str, str] = attrs.field(factory=dict)
    # tier chain → per rule, the (ClusterNetworkPolicy, rule) it comes from (the rule's name, or "ingress[2]")
    tier_rules: Mapping[str, tuple[tuple[str, str], ...]] = attrs.field(factory=dict)
    nat: tuple[NatFamily, ...] = ()  # natOutgoing, per family enabled (the nat chain's rules)
    hostports: tuple[HostPort, ...] = ()  # this node's pods' hostPort mappings, sorted
    # for logs and counters only, never rendered: a logged drop's prefix (its rule's DenyLog) → who denies
    denials: Mapping[str, Denial] = attrs.field(factory=dict)

    def structure(self) -> tuple[object, ...]:
        """What a set-element update cannot change: chains and set declarations."""
        return (
            self.chains,
            self.port_sets,
            {n: s.declaration for n, s in self.address_sets.items()},
            {n: s.declaration for n, s in self.service_sets.items()},
            self.nat,
            self.hostports,
        )

    @property
    def rule_count(self) -> int:
        """The nft rules of the chains (a logged drop is two: the log rule and the drop)."""
        return sum(len(c.rules) + sum(1 for r in c.rules if r.log is not None) for c in self.chains.values())

    @property
    def set_count(self) -> int:
        return len(self.address_sets) + len(self.service_sets) + len(self.port_sets) + 3

    @property
    def empty(self) -> bool:
        """Nothing isolated: no table at all (a node without policies loads no nftables rules)."""
        return (
            not self.chains
            and not self.egress_map
            and not self.ingress_map
            and not self.node_map
            and not self.nat
            and not self.hostports
        )


def _elements(ruleset: Ruleset, name: str) -> frozenset[object]:
    s = ruleset.address_sets.get(name) or ruleset.service_sets.get(name)
    return s.elements if s is not None else frozenset()


@attrs.frozen(eq=False)
class RulesetChange:
    """A ruleset as the policy service hands it to the applier: cheap to make per change.

    ``structure`` is the new ruleset whole but for the elements of the sets
    pods fill (their declarations are there, elements may be left out): it is
    small (this node's chains, maps, set declarations, ipBlock and port sets)
    and shared between changes that leave it alone.  ``added`` / ``removed``
    say how the elements of sets present in both the previous and this
    ruleset moved (set name → elements); for a set new here, ``added`` holds
    the elements the structure leaves out.  They are relative to the change
    whose ``token`` is ``base``: an applier that last applied that one may
    apply them; any other (a fresh one, one whose last transaction nft
    refused) replaces the table with :meth:`whole`.
    """

    structure: Ruleset
    added: Mapping[str, frozenset[object]] = attrs.field(factory=dict)
    removed: Mapping[str, frozenset[object]] = attrs.field(factory=dict)
    base: object | None = None
    token: object = attrs.Factory(object)
    # The complete ruleset, elements included, built on demand (O(elements)): valid until the next change is made.
    materialize: Callable[[], Ruleset] | None = None

    def whole(self) -> Ruleset:
        return self.materialize() if self.materialize is not None else self.structure

    def elements(self, name: str) -> frozenset[object]:
        """Every element of *name*, a set new in this change (its structure's and its added ones)."""
        extra = self.added.get(name)
        have = _elements(self.structure, name)
        return have | extra if extra else have

    @classmethod
    def of(cls, ruleset: Ruleset, previous: Ruleset | None = None, base: object | None = None) -> RulesetChange:
        """*ruleset* whole; with *previous* (applied as *base*), its elements as changes from that one's."""
        if previous is None or base is None:
            return cls(ruleset)
        added: dict[str, frozenset[object]] = {}
        removed: dict[str, frozenset[object]] = {}
        for sets in (ruleset.address_sets, ruleset.service_sets):
            for name, s in sets.items():
                before = _elements(previous, name)
                if s.elements is before:
                    continue
                plus, minus = s.elements - before, before - s.elements
                if plus:
                    added[name] = plus
                if minus:
                    removed[name] = minus
        return cls(ruleset, added, removed, base)
