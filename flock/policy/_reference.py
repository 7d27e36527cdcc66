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
Choices where the documentation is not precise (also in docs/policy.md):
- ipBlock matches by address alone, pod addresses included (as Calico).
- A named port matches only a destination that is a known pod declaring a
  containerPort of that name and protocol, on that port number.
- hostNetwork pods and pods in phase Succeeded/Failed are never selected as peers.

ClusterNetworkPolicy (policy.networking.k8s.io/v1alpha2, the CRD's documentation),
per direction: the Admin tier's policies by ascending priority, each one's
rules in written order — the first rule that matches decides: Accept allows,
Deny denies, Pass skips the rest of the tier; then NetworkPolicy, which decides
whenever it isolates the pod; then the Baseline tier the same way; then allow.
flock's choices where the CRD leaves room (also in docs/policy.md):
- Equal priorities within a tier: by name.
- A rule flock cannot read fails closed: Accept matches nothing, Deny and Pass deny everything.
- A node reaching its own pods is always allowed (kubelet probes, as for
  NetworkPolicy); a pod reaching its own node meets the Admin tier only (the
  NetworkPolicy tier allows node <-> own pods, so the Baseline tier is never reached).
- A ``nodes`` peer matches the addresses of the selected nodes' status.addresses;
  ``destinationNamedPort`` matches a destination pod declaring that container
  port name, for the protocol it declares it with.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

from ._cluster import Action, ClusterNetworkPolicy, ClusterPeer, ClusterPort, ClusterRule, PolicyNode, Tier
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


def _network_policies_allow(
    policies: Iterable[NetworkPolicy],
    namespaces: Mapping[str, Namespace],
    subject: PolicyPod,
    other: Endpoint,
    dst: Endpoint,
    port: int,
    protocol: Protocol,
    direction: Direction,
) -> bool | None:
    """The NetworkPolicy tier's verdict; None when no policy isolates *subject* in *direction*."""
    selecting = [
        p
        for p in policies
        if p.namespace == subject.namespace
        and direction in p.policy_types
        and p.pod_selector.matches(subject.label_map)
    ]
    if not selecting:
        return None
    for policy in selecting:
        for rule in policy.ingress if direction is Direction.INGRESS else policy.egress:
            peer_ok = not rule.peers or any(_peer_matches(pr, policy, other, namespaces) for pr in rule.peers)
            port_ok = not rule.ports or any(_port_matches(pp, dst, port, protocol) for pp in rule.ports)
            if peer_ok and port_ok:
                return True
    return False


def _cluster_peer_matches(
    peer: ClusterPeer, other: Endpoint, namespaces: Mapping[str, Namespace], nodes: Iterable[PolicyNode]
) -> bool:
    if peer.networks:
        return any(other.address in net for net in peer.networks if net.version == other.address.version)
    if peer.nodes is not None:
        selector = peer.nodes
        return any(other.address in n.addresses for n in nodes if selector.matches(n.label_map))
    assert peer.selector is not None
    ns_sel, pod_sel = peer.selector
    pod = other.pod
    if pod is None or not pod.selectable:
        return False
    return ns_sel.matches(_ns_labels(namespaces, pod.namespace)) and (pod_sel is None or pod_sel.matches(pod.label_map))


def _cluster_port_matches(cp: ClusterPort, dst: Endpoint, port: int, protocol: Protocol) -> bool:
    if cp.named is not None:
        return dst.pod is not None and dst.pod.resolve(cp.named, protocol) == port
    return cp.protocol is protocol and cp.first <= port <= cp.last


def _rule_action(
    rule: ClusterRule,
    other: Endpoint,
    dst: Endpoint,
    port: int,
    protocol: Protocol,
    namespaces: Mapping[str, Namespace],
    nodes: Iterable[PolicyNode] | None,
) -> Action | None:
    """What *rule* does with the connection (None: it does not match).  *nodes* None: not listed."""
    if rule.unreadable:  # fails closed: Accept matches nothing, Deny and Pass deny everything
        return None if rule.action is Action.ACCEPT else Action.DENY
    for peer in rule.peers:  # in written order: the first peer that matches decides
        if peer.nodes is not None and nodes is None:
            # Nodes not listed: any address may be a selected node's (fail closed, as for what flock cannot
            # read): an Accept matches nothing here, a Deny or Pass denies; named ports never name a node
            if rule.action is not Action.ACCEPT and (
                not rule.protocols
                or any(cp.named is None and _cluster_port_matches(cp, dst, port, protocol) for cp in rule.protocols)
            ):
                return Action.DENY
            continue
        if _cluster_peer_matches(peer, other, namespaces, nodes or ()) and (
            not rule.protocols or any(_cluster_port_matches(cp, dst, port, protocol) for cp in rule.protocols)
        ):
            return rule.action
    return None


def tier_action(
    cluster_policies: Iterable[ClusterNetworkPolicy],
    tier: Tier,
    namespaces: Mapping[str, Namespace],
    nodes: Iterable[PolicyNode] | None,
    subject: PolicyPod,
    other: Endpoint,
    dst: Endpoint,
    port: int,
    protocol: Protocol,
    direction: Direction,
) -> Action | None:
    """The action of the first rule of *tier* that matches (None: no rule does; *nodes* None: not listed)."""
    nodes = list(nodes) if nodes is not None else None
    ns_labels = _ns_labels(namespaces, subject.namespace)
    for cnp in sorted((c for c in cluster_policies if c.tier is tier), key=lambda c: c.order):
        if not cnp.selects(subject, ns_labels):
            continue
        for rule in cnp.ingress if direction is Direction.INGRESS else cnp.egress:
            action = _rule_action(rule, other, dst, port, protocol, namespaces, nodes)
            if action is not None:
                return action
    return None


def _direction_allows(
    policies: Iterable[NetworkPolicy],
    cluster_policies: Iterable[ClusterNetworkPolicy],
    namespaces: Mapping[str, Namespace],
    nodes: Iterable[PolicyNode] | None,
    subject: PolicyPod,
    other: Endpoint,
    dst: Endpoint,
    port: int,
    protocol: Protocol,
    direction: Direction,
) -> bool:
    """Admin tier, then NetworkPolicy, then Baseline tier, then allow."""
    args = (namespaces, nodes, subject, other, dst, port, protocol, direction)
    admin = tier_action(cluster_policies, Tier.ADMIN, *args)
    if admin is Action.ACCEPT or admin is Action.DENY:
        return admin is Action.ACCEPT
    verdict = _network_policies_allow(policies, namespaces, subject, other, dst, port, protocol, direction)
    if verdict is not None:
        return verdict
    return tier_action(cluster_policies, Tier.BASELINE, *args) is not Action.DENY


def evaluate(
    policies: Iterable[NetworkPolicy],
    namespaces: Iterable[Namespace],
    src: Endpoint,
    dst: Endpoint,
    port: int,
    protocol: Protocol,
    cluster_policies: Iterable[ClusterNetworkPolicy] = (),
    nodes: Iterable[PolicyNode] | None = (),
) -> bool:
    """May *src* open a connection to *dst* on *port*/*protocol*?  (*nodes* None: Nodes not listed.)"""
    policies = list(policies)
    cluster_policies = list(cluster_policies)
    nodes = list(nodes) if nodes is not None else None
    ns = {n.name: n for n in namespaces}
    # hostNetwork and finished pods are no pods to policy: their addresses are just addresses
    if src.pod is not None and not src.pod.selectable:
        src = attrs.evolve(src, pod=None)
    if dst.pod is not None and not dst.pod.selectable:
        dst = attrs.evolve(dst, pod=None)
    if src.node is not None and dst.pod is not None and dst.pod.node == src.node:
        return True  # the node reaching its own pod (kubelet probes)
    if dst.node is not None and src.pod is not None and src.pod.node == dst.node:
        # a pod reaching its own node: the Admin tier alone (NetworkPolicy allows it, so Baseline is never reached)
        action = tier_action(
            cluster_policies, Tier.ADMIN, ns, nodes, src.pod, dst, dst, port, protocol, Direction.EGRESS
        )
        return action is not Action.DENY
    if src.pod is not None and not _direction_allows(
        policies, cluster_policies, ns, nodes, src.pod, dst, dst, port, protocol, Direction.EGRESS
    ):
        return False
    return dst.pod is None or _direction_allows(
        policies, cluster_policies, ns, nodes, dst.pod, src, dst, port, protocol, Direction.INGRESS
    )
