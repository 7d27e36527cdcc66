"""The semantics of NetworkPolicy, written straight from the Kubernetes documentation.

Deliberately naive (no sets, no indexes, no nftables): the property tests hold
the compiler to it, and the lab's e2e tests can compute expected truth tables
with it.  https://kubernetes.io/docs/concepts/services-networking/network-policies/

- A pod is isolated for a direction when some policy in its namespace selects
  it (spec.podSelector) and lists the direction in policyTypes.
- A connection is allowed iff the source's egress allows it (or the source is
  not isolated for egress) and the destination's ingress allows it (or …).
- Rules of all selecting policies are OR-ed.  A rule allows when one of its
  peers matches (no peers: everyone) and one of its ports matches (no ports:
  every port and protocol).
- A node and its own pods may always talk (kubelet probes).
Choices where the documentation is not precise (also in the README):
- ipBlock matches by address alone, pod addresses included (as Calico).
- A named port matches only a destination that is a known pod declaring a
  containerPort of that name and protocol, on that port number.
- hostNetwork pods and pods in phase Succeeded/Failed are never selected as peers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

from ._model import (
    NAMESPACE_NAME_LABEL,
    Direction,
    IPAddress,
    Namespace,
    NetworkPolicy,
    Peer,
    PolicyPod,
    PolicyPort,
    Protocol,
)


@attrs.frozen
class Endpoint:
    """One end of a connection: an address, the pod owning it, or the node owning it."""

    address: IPAddress
    pod: PolicyPod | None = None
    node: str | None = None  # set when *address* is that node's own


def _ns_labels(namespaces: Mapping[str, Namespace], name: str) -> Mapping[str, str]:
    ns = namespaces.get(name)
    return ns.label_map if ns is not None else {NAMESPACE_NAME_LABEL: name}


def _peer_matches(peer: Peer, policy: NetworkPolicy, other: Endpoint, namespaces: Mapping[str, Namespace]) -> bool:
    if peer.ip_block is not None:
        return peer.ip_block.contains(other.address)
    pod = other.pod
    if pod is None or not pod.selectable:
        return False
    if peer.namespace_selector is None:
        if pod.namespace != policy.namespace:
            return False
    elif not peer.namespace_selector.matches(_ns_labels(namespaces, pod.namespace)):
        return False
    return peer.pod_selector is None or peer.pod_selector.matches(pod.label_map)


def _port_matches(policy_port: PolicyPort, dst: Endpoint, port: int, protocol: Protocol) -> bool:
    if policy_port.protocol is not protocol:
        return False
    if policy_port.port is None:
        return True
    if isinstance(policy_port.port, str):
        return dst.pod is not None and dst.pod.resolve(policy_port.port, protocol) == port
    return policy_port.port <= port <= (policy_port.end_port or policy_port.port)


def _direction_allows(
    policies: Iterable[NetworkPolicy],
    namespaces: Mapping[str, Namespace],
    subject: PolicyPod,
    other: Endpoint,
    dst: Endpoint,
    port: int,
    protocol: Protocol,
    direction: Direction,
) -> bool:
    selecting = [
        p
        for p in policies
        if p.namespace == subject.namespace
        and direction in p.policy_types
        and p.pod_selector.matches(subject.label_map)
    ]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy.ingress if direction is Direction.INGRESS else policy.egress:
            peer_ok = not rule.peers or any(_peer_matches(pr, policy, other, namespaces) for pr in rule.peers)
            port_ok = not rule.ports or any(_port_matches(pp, dst, port, protocol) for pp in rule.ports)
            if peer_ok and port_ok:
                return True
    return False


def evaluate(
    policies: Iterable[NetworkPolicy],
    namespaces: Iterable[Namespace],
    src: Endpoint,
    dst: Endpoint,
    port: int,
    protocol: Protocol,
) -> bool:
    """May *src* open a connection to *dst* on *port*/*protocol*?"""
    policies = list(policies)
    ns = {n.name: n for n in namespaces}
    # hostNetwork and finished pods are no pods to policy: their addresses are just addresses
    if src.pod is not None and not src.pod.selectable:
        src = attrs.evolve(src, pod=None)
    if dst.pod is not None and not dst.pod.selectable:
        dst = attrs.evolve(dst, pod=None)
    if src.node is not None and dst.pod is not None and dst.pod.node == src.node:
        return True
    if dst.node is not None and src.pod is not None and src.pod.node == dst.node:
        return True
    if src.pod is not None and not _direction_allows(policies, ns, src.pod, dst, dst, port, protocol, Direction.EGRESS):
        return False
    return dst.pod is None or _direction_allows(policies, ns, dst.pod, src, dst, port, protocol, Direction.INGRESS)
