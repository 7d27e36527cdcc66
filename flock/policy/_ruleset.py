"""The desired nftables state for one node, as values.

The compiler (:mod:`._compile`) makes a :class:`Ruleset`; the renderer
(:mod:`._nft`) turns it into nft syntax; the simulator (:mod:`._simulate`)
runs a packet through it in Python.  Every name in here is made by flock
(``pe-<hash>``, ``in-flock1a2b3c4d``, ``p-<hash>-6``); the only other things
a Ruleset holds are addresses, protocols and port numbers.

Layout in the kernel (``table inet flock``)::

    chain egress   hook forward priority filter      ct established,related accept; iifname vmap @egress-pods
    chain ingress  hook forward priority filter + 1  ct established,related accept; oifname vmap @ingress-pods
    chain eg-<veth> / in-<veth>    one per isolated local pod: jump to each selecting policy's chain, then drop
    chain pe-<id> / pi-<id>        one per policy and direction: "<peer> <ports> counter accept" rules

An ``accept`` ends the current base chain only: a packet accepted by the
egress chain of its source pod still meets the ingress chain of its
destination pod.  Traffic between the node and its own pods never passes the
forward hook, so it is always allowed (kubelet probes).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

import attrs

from ._model import IPAddress, Protocol

EGRESS_MAP = "egress-pods"
INGRESS_MAP = "ingress-pods"

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
class Rule:
    match: Match
    verdict: str  # "accept", "drop", or "jump <chain>"
    counter: bool = True


@attrs.frozen
class Chain:
    name: str
    rules: tuple[Rule, ...] = ()


@attrs.frozen
class Ruleset:
    """Everything in ``table inet flock`` except the two fixed base chains."""

    chains: Mapping[str, Chain] = attrs.field(factory=dict)
    address_sets: Mapping[str, AddressSet] = attrs.field(factory=dict)
    service_sets: Mapping[str, ServiceSet] = attrs.field(factory=dict)
    port_sets: Mapping[str, PortSet] = attrs.field(factory=dict)
    egress_map: Mapping[str, str] = attrs.field(factory=dict)  # host veth → chain
    ingress_map: Mapping[str, str] = attrs.field(factory=dict)
    # for counters and logs only, never rendered: policy chain → "ns/name"
    policy_chains: Mapping[str, str] = attrs.field(factory=dict)

    def structure(self) -> tuple[object, ...]:
        """What a set-element update cannot change: chains and set declarations."""
        return (
            self.chains,
            self.port_sets,
            {n: s.declaration for n, s in self.address_sets.items()},
            {n: s.declaration for n, s in self.service_sets.items()},
        )

    @property
    def rule_count(self) -> int:
        return sum(len(c.rules) for c in self.chains.values())

    @property
    def set_count(self) -> int:
        return len(self.address_sets) + len(self.service_sets) + len(self.port_sets) + 2
