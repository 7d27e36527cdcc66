"""The compiled rulesets of a two-node cluster, run packet by packet, agree with the reference evaluator.

Policies are generated as Kubernetes objects (dicts) and go through
``from_object``; every construct of networking.k8s.io/v1 appears: policyTypes
given or defaulted, ingress/egress rules, podSelector / namespaceSelector /
both / ipBlock with except peers, matchLabels and all four operators, empty
selectors, TCP/UDP/SCTP, numeric, named and endPort ports.
"""

from __future__ import annotations

import functools
import ipaddress
import itertools
from collections.abc import Callable, Mapping

import attrs
import pytest
import trio
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st

from flock.fnv import fnv1a_32
from flock.policy import (
    Compiler,
    Endpoint,
    Kind,
    NamedPort,
    Namespace,
    Packet,
    PolicyEngine,
    PolicyInputs,
    PolicyPod,
    Protocol,
    compile_ruleset,
    evaluate,
    forward_verdict,
    input_verdict,
)
from flock.testing.policy import MemoryApplier
from flock.testing.policy_strategies import (
    EXTERNAL,
    NAMED,
    NODES,
    PORTS,
    clusters,
    dense_selectors,
    examples,
    labels,
    named_ports,
    policy_nodes,
    tiered,
    tiered_maybe_unlisted,
)

# The main suite runs each property with the examples given; .ci/run runs this file again after the main
# suite with FLOCK_PROPERTY_SCALE=4, four times as many (a deeper search than the main suite's time allows).
_examples = examples


# every rule with named ports, selectors that match often
NAMED_SMALL = clusters(("a", "b", "c", "d"), 3, dense_selectors(), named_ports())
NAMED_CLUSTERS = clusters(("a", "b", "c", "d", "e", "f"), 4, dense_selectors(), named_ports())


def _veth(pod: PolicyPod) -> str:
    return f"flock{fnv1a_32(pod.key):08x}"


def _simulated(rulesets: dict, src: Endpoint, dst: Endpoint, port: int, proto: Protocol) -> bool:
    src_node = src.pod.node if src.pod else src.node
    dst_node = dst.pod.node if dst.pod else dst.node
    pkt = Packet(src.address, dst.address, proto, port)
    if src_node is not None and src_node == dst_node:
        if src.pod is None:
            return True  # the node reaching its own pods: the output hook, never filtered
        if dst.pod is None:  # a pod reaching its own node: the input hook
            return input_verdict(rulesets[src_node], attrs.evolve(pkt, iif=_veth(src.pod)))
        return forward_verdict(rulesets[src_node], attrs.evolve(pkt, iif=_veth(src.pod), oif=_veth(dst.pod)))
    if src.pod is not None and not forward_verdict(rulesets[src_node], attrs.evolve(pkt, iif=_veth(src.pod))):
        return False
    return dst.pod is None or forward_verdict(rulesets[dst_node], attrs.evolve(pkt, oif=_veth(dst.pod)))


@settings(max_examples=_examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_compiled_rulesets_agree_with_the_reference(cluster) -> None:
    _agree_with_the_reference(cluster)


@settings(max_examples=_examples(350), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(NAMED_SMALL)
def test_named_ports_agree_with_the_reference(cluster) -> None:
    """Every rule with named ports (ingress: this node's pods' ports; egress: a selector peer's pods', an
    ipBlock's or anyone's), selectors that match often: where a named port decides, it decides right."""
    _agree_with_the_reference(cluster)


def _named_rules(cluster, direction: str, peers: str) -> bool:
    """Has *cluster* a policy with a *direction* rule with named ports whose peers are of kind *peers*?"""
    for pol in cluster[0]:
        for rule in pol.ingress if direction == "ingress" else pol.egress:
            if not any(isinstance(p.port, str) for p in rule.ports):
                continue
            kinds = {"block" if p.ip_block is not None else "selector" for p in rule.peers}
            if {"none": not kinds, "selector": "selector" in kinds, "block": "block" in kinds}[peers]:
                return True
    return False


@pytest.mark.parametrize(
    "direction, peers", [("ingress", "selector"), ("egress", "selector"), ("egress", "block"), ("egress", "none")]
)
@pytest.mark.parametrize("strategy", ["reference", "engine"])
def test_the_clusters_have_named_ports_in_both_directions_with_every_kind_of_peer(strategy, direction, peers) -> None:
    """What the named-port tests (against the reference, and the engine's) would not notice if never drawn."""
    drawn = NAMED_SMALL if strategy == "reference" else NAMED_CLUSTERS
    predicate = functools.partial(_named_rules, direction=direction, peers=peers)
    find(drawn, predicate, settings=settings(database=None, max_examples=200, phases=[Phase.generate]))


def _agree_with_the_reference(cluster, cnps=(), nodes=()) -> None:
    """(*nodes* None: Nodes not listed, the nodes peers failing closed.)"""
    pols, namespaces, pods = cluster
    rulesets = {}
    for node in NODES:
        local = [_with_veth(p) for p in pods if p.node == node]
        rulesets[node] = compile_ruleset(pols, namespaces, pods, local, cnps, nodes or (), nodes is not None)
    endpoints = [Endpoint(a, pod=p) for p in pods for a in p.addresses]
    endpoints += [Endpoint(ipaddress.ip_address(a), node=n) for n, addrs in NODES.items() for a in addrs]
    endpoints += [Endpoint(ipaddress.ip_address(a)) for a in EXTERNAL]
    for src, dst in itertools.product(endpoints, endpoints):
        if src.address.version != dst.address.version or src.address == dst.address:
            continue
        if src.pod is None and dst.pod is None:
            continue
        for port, proto in PORTS:
            want = evaluate(pols, namespaces, src, dst, port, proto, cnps, nodes)
            got = _simulated(rulesets, src, dst, port, proto)
            assert got == want, (src, dst, port, proto, pols, cnps)


def _with_veth(pod: PolicyPod) -> PolicyPod:
    return attrs.evolve(pod, host_veth=_veth(pod))


@settings(max_examples=_examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), clusters())
def test_a_reused_compiler_returns_what_a_fresh_one_does(one, two) -> None:
    compiler = Compiler()
    mixes = [one, two, (one[0], one[1], two[2]), (two[0], one[1], one[2]), one]
    for pols, namespaces, pods in mixes:
        for node in NODES:
            local = [_with_veth(p) for p in pods if p.node == node]
            assert compiler.compile(pols, namespaces, pods, local) == compile_ruleset(pols, namespaces, pods, local)


# ---- the engine: change by change, the same ruleset --------------------------------------------

LOCAL = "n1"
BIGGER = ("a", "b", "c", "d", "e", "f")


def _local_pods(pods: Mapping[str, PolicyPod]) -> list[PolicyPod]:
    """This node's pods as the service makes them: selectable, with the allocation's addresses and a veth."""
    out = []
    for p in pods.values():
        if p.node == LOCAL:
            addresses = p.addresses or (ipaddress.ip_address(f"2001:db8:1::{fnv1a_32(p.key) % 0xFFFF:x}"),)
            out.append(attrs.evolve(p, host_veth=_veth(p), selectable=True, addresses=addresses))
    return out


@st.composite
def mutations(draw: st.DrawFn, pod: PolicyPod) -> PolicyPod:
    """Another value of *pod*: relabelled, readdressed, moved, finished, its named ports changed."""
    change = draw(st.sampled_from(["labels", "addresses", "node", "unselectable", "no-address", "ports"]))
    if change == "labels":
        return attrs.evolve(pod, labels=draw(labels))
    if change == "ports":
        declared = draw(st.lists(st.sampled_from(NAMED), max_size=2, unique_by=lambda t: t[0]))
        return attrs.evolve(pod, named_ports=tuple(NamedPort(n, Protocol(p), num) for n, num, p in declared))
    if change == "addresses":
        n = draw(st.integers(1, 0xFF))
        extra = (ipaddress.ip_address(f"192.0.2.{n}"),) if draw(st.booleans()) else ()
        return attrs.evolve(pod, addresses=(ipaddress.ip_address(f"2001:db8:3::{n:x}"), *extra))
    if change == "node":
        return attrs.evolve(pod, node="n2" if pod.node == LOCAL else LOCAL)
    if change == "unselectable":
        return attrs.evolve(pod, selectable=False)
    return attrs.evolve(pod, addresses=())


@settings(max_examples=_examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(BIGGER, 6, dense_selectors()), clusters(BIGGER, 6, dense_selectors()), st.data())
def test_an_engine_following_changes_ends_where_a_fresh_compile_does(one, two, data) -> None:
    """From cluster *one* to *two* by single writes (some detours first), applied in batches of any size:
    after each batch the engine's ruleset is a fresh compile's, and its changes, applied in
    memory (strictly: no element deleted that is not there, none added that is), give that ruleset."""
    _follow(one, two, data)


@settings(max_examples=_examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(NAMED_CLUSTERS, NAMED_CLUSTERS, st.data())
def test_an_engine_following_changes_keeps_the_named_port_sets_of_a_fresh_compile(one, two, data) -> None:
    """The same, every rule with named ports: this node's pods' sets follow local pods coming, going and
    changing; an egress rule's set follows its selector's pods (relabelled, their namespace relabelled)."""
    _follow(one, two, data)


def _follow(one, two, data, tiers=((), ()), nodes=((), ())) -> None:
    inputs = PolicyInputs()
    pols, namespaces, pods = one
    inputs.replace(Kind.NETWORK_POLICY, {p.key: p for p in pols})
    inputs.replace(Kind.NAMESPACE, {n.name: n for n in namespaces})
    inputs.replace(Kind.POD, {p.key: p for p in pods})
    inputs.replace(Kind.CLUSTER_POLICY, {p.key: p for p in tiers[0]})
    inputs.replace(Kind.NODE, {n.name: n for n in nodes[0]})
    journal = inputs.journal()
    engine = PolicyEngine(inputs)
    engine.load(_local_pods(inputs.pods))
    applier = MemoryApplier()

    def applied_and_checked() -> None:
        trio.run(applier.apply_change, engine.change())
        want = compile_ruleset(
            inputs.policies.values(),
            inputs.namespaces.values(),
            inputs.pods.values(),
            local,
            inputs.cluster_policies.values(),
            inputs.nodes.values(),
            inputs.nodes_known,
        )
        assert engine.ruleset() == want
        assert applier.applied == want

    local = _local_pods(inputs.pods)
    applied_and_checked()

    writes: list[Callable[[], None]] = []
    everyone = {p.key: p for p in [*pods, *two[2]]}
    for key in data.draw(st.lists(st.sampled_from(sorted(everyone)), max_size=12)) if everyone else ():
        writes.append(functools.partial(inputs.set_pod, data.draw(mutations(everyone[key]))))
    for ns in data.draw(st.lists(st.sampled_from(["x", "y", "z"]), max_size=2)):
        writes.append(functools.partial(inputs.set_namespace, Namespace(ns, data.draw(labels))))
    if nodes[0] or nodes[1]:
        for name in data.draw(st.lists(st.sampled_from(sorted(NODES)), max_size=2)):
            writes.append(functools.partial(inputs.set_node, data.draw(policy_nodes(name))))
        if data.draw(st.booleans()):  # Nodes no longer listed (their nodes peers fail closed), then listed again
            writes.append(functools.partial(inputs.mark_unsynced, Kind.NODE))
            writes.append(functools.partial(inputs.replace, Kind.NODE, {n.name: n for n in nodes[0]}))
    final: list[Callable[[], None]] = []
    for kind, before, after in (
        (Kind.CLUSTER_POLICY, {p.key: p for p in tiers[0]}, {p.key: p for p in tiers[1]}),
        (Kind.NODE, {n.name: n for n in nodes[0]}, {n.name: n for n in nodes[1]}),
        (Kind.NETWORK_POLICY, {p.key: p for p in pols}, {p.key: p for p in two[0]}),
        # (every namespace: one the detours labelled goes too, if two does not know it)
        (Kind.NAMESPACE, {n: None for n in ("x", "y", "z")}, {n.name: n for n in two[1]}),
        (Kind.POD, {p.key: p for p in pods}, {p.key: p for p in two[2]}),
    ):
        final += [functools.partial(inputs.delete, kind, key) for key in before.keys() - after.keys()]
        setter = {
            Kind.NETWORK_POLICY: inputs.set_policy,
            Kind.NAMESPACE: inputs.set_namespace,
            Kind.POD: inputs.set_pod,
            Kind.CLUSTER_POLICY: inputs.set_cluster_policy,
            Kind.NODE: inputs.set_node,
        }
        final += [functools.partial(setter[kind], value) for value in after.values()]
    writes += data.draw(st.permutations(final))
    for i, write in enumerate(writes):
        write()
        if i == len(writes) - 1 or data.draw(st.booleans()):
            local = _local_pods(inputs.pods)
            engine.update(journal.drain(), local)
            applied_and_checked()
    assert engine.ruleset() == compile_ruleset(*two, _local_pods({p.key: p for p in two[2]}), tiers[1], nodes[1])


# ---- ClusterNetworkPolicy: the Admin and Baseline tiers around NetworkPolicy -------------------


@settings(max_examples=_examples(250), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiered_maybe_unlisted())
def test_tiers_agree_with_the_reference(drawn) -> None:
    """Admin → NetworkPolicy → Baseline → allow, Accept/Deny/Pass, priorities and rule order, every peer
    kind (nodes and networks too), ports, ranges and named ports, rules that fail closed: packet by packet
    through both nodes' rulesets (the input hook for a pod reaching its own node), as the reference says."""
    cluster, cnps, nodes = drawn
    _agree_with_the_reference(cluster, cnps, nodes)


def _has(drawn, predicate) -> bool:
    return any(predicate(c, r) for c in drawn[1] for r in (*c.ingress, *c.egress))


@pytest.mark.parametrize(
    "what",
    ["pass", "unreadable-deny", "unreadable-accept", "nodes", "networks", "named", "baseline-and-np", "tie"],
)
def test_the_tiered_clusters_draw_every_construct(what) -> None:
    """What the tier tests would not notice if never drawn."""
    predicates = {
        "pass": lambda d: _has(d, lambda c, r: r.action.value == "Pass" and not r.unreadable),
        "unreadable-deny": lambda d: _has(d, lambda c, r: r.unreadable and r.action.value != "Accept"),
        "unreadable-accept": lambda d: _has(d, lambda c, r: r.unreadable and r.action.value == "Accept"),
        "nodes": lambda d: _has(d, lambda c, r: any(p.nodes is not None for p in r.peers)),
        "networks": lambda d: _has(d, lambda c, r: any(p.networks for p in r.peers)),
        "named": lambda d: _has(d, lambda c, r: any(cp.named for cp in r.protocols)),
        "baseline-and-np": lambda d: bool(d[0][0]) and any(c.tier.value == "Baseline" for c in d[1]),
        "tie": lambda d: len({(c.tier, c.priority) for c in d[1]}) < len(d[1]),
    }
    find(tiered(), predicates[what], settings=settings(database=None, max_examples=500, phases=[Phase.generate]))


@settings(max_examples=_examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiered(BIGGER, 4, 4), tiered(BIGGER, 4, 4), st.data())
def test_an_engine_following_changes_keeps_the_tiers_of_a_fresh_compile(one, two, data) -> None:
    """ClusterNetworkPolicies coming, going and changing, nodes relabelled, namespaces relabelled (which moves
    ClusterNetworkPolicy subjects), pods changing: the engine's ruleset is a fresh compile's after each batch."""
    _follow(one[0], two[0], data, (one[1], two[1]), (one[2], two[2]))
