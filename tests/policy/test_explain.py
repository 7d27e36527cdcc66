"""``flockctl policy explain``'s answers (flock.policy._explain): every kind of path, named back to the
policies and rules it went through, and, on random clusters, the reference evaluator's verdict."""

from __future__ import annotations

import ipaddress

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flock.fnv import fnv1a_32
from flock.policy import (
    AgentView,
    ClusterNetworkPolicy,
    Endpoint,
    Explanation,
    Kind,
    NamedPort,
    Namespace,
    NetworkPolicy,
    PolicyNode,
    PolicyPod,
    PolicySnapshot,
    Protocol,
    Query,
    Ruleset,
    Verdict,
    compile_ruleset,
    evaluate,
    explain,
    explanation_text,
)
from flock.policy._compile import FAMILIES
from flock.policy._reference import _peer_matches, _port_matches
from flock.testing.policy_strategies import EXTERNAL, NODES, PORTS, examples, tiered_maybe_unlisted

NODE = "host001"
LISTED = frozenset({Kind.NETWORK_POLICY, Kind.NAMESPACE, Kind.POD, Kind.CLUSTER_POLICY})


def ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text)


def pod(key: str, labels: dict, *addrs: str, node: str = NODE, ports: tuple = ()) -> PolicyPod:
    ns, name = key.split("/")
    return PolicyPod(ns, name, labels, tuple(map(ip, addrs)), ports, node=node)


def policy(ns: str, name: str, spec: dict, rv: str = "") -> NetworkPolicy:
    meta = {"namespace": ns, "name": name, "resourceVersion": rv}
    return NetworkPolicy.from_object({"metadata": meta, "spec": spec})


def cluster_policy(name: str, spec: dict, rv: str = "") -> ClusterNetworkPolicy:
    return ClusterNetworkPolicy.from_object({"metadata": {"name": name, "resourceVersion": rv}, "spec": spec})


CLIENT = pod("default/client", {"app": "client"}, "2001:db8:0:1::2", "198.51.100.2")
WEB = pod(
    "default/web", {"app": "web"}, "2001:db8:0:1::3", "198.51.100.3", ports=(NamedPort("http", Protocol.TCP, 8080),)
)
FAR = pod("other/far", {"app": "far"}, "2001:db8:0:2::3", node="host002")
HOST001 = PolicyNode(NODE, (("zone", "a"),), (ip("2001:db8:ffff::1"),))
HOST002 = PolicyNode("host002", (("zone", "b"),), (ip("2001:db8:ffff::2"),))
FROM_CLIENTS = {"from": [{"podSelector": {"matchLabels": {"app": "client"}}}]}
WEB_SELECTED = {"podSelector": {"matchLabels": {"app": "web"}}}


def view(
    pods: tuple[PolicyPod, ...] = (CLIENT, WEB, FAR),
    policies: tuple[NetworkPolicy, ...] = (),
    cnps: tuple[ClusterNetworkPolicy, ...] = (),
    nodes: tuple[PolicyNode, ...] | None = None,
    synced: frozenset[Kind] = LISTED,
    ruleset: Ruleset | None = None,
    apply_error: str | None = None,
) -> AgentView:
    """The agent on host001 with *pods* (its own attached), the ruleset in force compiled from the same
    inputs unless given; *nodes* None: Nodes not listed."""
    local = {p.key: attrs.evolve(p, host_veth=f"flock{fnv1a_32(p.key):08x}") for p in pods if p.node == NODE}
    namespaces = (Namespace("default"), Namespace("other", {"team": "far"}))
    snap = PolicySnapshot(
        42,
        {p.key: p for p in policies},
        {n.name: n for n in namespaces},
        {p.key: p for p in pods},
        synced | ({Kind.NODE} if nodes is not None else set()),
        {c.key: c for c in cnps},
        {n.name: n for n in nodes or ()},
    )
    if ruleset is None:
        ruleset = compile_ruleset(policies, namespaces, pods, local.values(), cnps, nodes or (), nodes is not None)
    return AgentView(NODE, snap, local, ruleset, 1200, 1190, apply_error)


def ask(v: AgentView, src: str, dst: str, port: int = 80, proto: Protocol = Protocol.TCP, family=None) -> Explanation:
    got = explain(v, Query(src, dst, port, proto, family))
    assert explanation_text(got.to_json()) == got.text() and got.text()
    return got


def steps(direction) -> list[tuple]:
    """A direction's path as (tier, action, policy, rule, rule index), the parts a test names."""
    return [(s.tier, s.action, s.policy, s.rule, s.rule_index) for s in direction.path]


# ---- every kind of path -----------------------------------------------------------------------------


def test_without_policies_nothing_is_isolated_and_no_policy_is_named() -> None:
    got = ask(view(), "default/client", "default/web")
    assert got.verdict is Verdict.ALLOWED and got.exit_code == 0 and got.why == ""
    assert (got.egress.decided_by, got.ingress.decided_by) == ("no-policy", "no-policy")
    assert got.egress.trace.chain is None and got.egress.hook == "forward"
    assert (got.egress.applied, got.ingress.applied, got.reference) == (True, True, True)
    assert got.family == 6 and str(got.source.address) == "2001:db8:0:1::2" and got.source.pod.key == CLIENT.key
    doc = got.to_json()
    assert doc["from"] == {
        "query": "default/client",
        "kind": "pod",
        "pod": "default/client",
        "node": NODE,
        "address": "2001:db8:0:1::2",
    }
    assert doc["inputs"]["generation"] == 42 and doc["inputs"]["resource_version"] == 1200
    assert "no policy of any tier selects default/client for egress" in got.text()


def test_a_network_policy_rule_that_allows_is_named_with_its_index() -> None:
    web_allow = policy(
        "default",
        "web-allow",
        {
            **WEB_SELECTED,
            "ingress": [
                {"from": [{"ipBlock": {"cidr": "2001:db8:ff::/48"}}]},
                {**FROM_CLIENTS, "ports": [{"port": 80}, {"port": 443}]},
            ],
        },
        rv="20",
    )
    v = view(policies=(web_allow,))
    for family in FAMILIES:  # both families' sets: the rule's place is the same
        got = ask(v, "default/client", "default/web", family=family)
        assert got.verdict is Verdict.ALLOWED, got.text()
        assert got.ingress.decided_by == "NetworkPolicy"
        assert steps(got.ingress) == [("NetworkPolicy", "Allow", "default/web-allow", "", 1)]
        assert got.ingress.path[0].resource_version == "20"
        assert [(s.chain[:3], s.verdict.split()[0]) for s in got.ingress.trace.steps] == [
            ("in-", "jump"),
            ("pi-", "accept"),
        ]
    assert "NetworkPolicy default/web-allow (rv 20): ingress[1] allows" in got.text()
    got = ask(v, "2001:db8:ff::9", "default/web", port=5)
    assert got.verdict is Verdict.ALLOWED and steps(got.ingress)[0][4] == 0
    assert got.source.kind == "address" and got.egress.decided_by == "not-a-pod"


def test_an_isolated_pod_names_every_policy_that_isolates_it() -> None:
    deny_all = policy("default", "deny-all", {"podSelector": {}, "policyTypes": ["Ingress"]})
    web_allow = policy("default", "web-allow", {**WEB_SELECTED, "ingress": [{**FROM_CLIENTS, "ports": [{"port": 80}]}]})
    got = ask(view(policies=(deny_all, web_allow)), "default/client", "default/web", 81)
    assert got.verdict is Verdict.DENIED and got.exit_code == 1
    assert got.ingress.decided_by == "NetworkPolicy" and not got.ingress.allowed
    assert steps(got.ingress) == [
        ("NetworkPolicy", "NoMatch", "default/web-allow", "", None),  # deny-all allows nothing: it has no chain
        ("NetworkPolicy", "Deny", "", "", None),
    ]
    assert got.ingress.path[-1].isolated_by == ("default/deny-all", "default/web-allow")
    assert got.egress.allowed and got.egress.decided_by == "no-policy"
    assert "isolated by default/deny-all, default/web-allow: no rule allows it" in got.text()
    assert got.to_json()["ingress"]["verdict"] == "denied" and "ingress  DENIED" in got.text()


def test_an_admin_deny_wins_over_a_network_policy_that_allows() -> None:
    admin = cluster_policy(
        "no-clients",
        {
            "tier": "Admin",
            "priority": 5,
            "subject": {"namespaces": {}},
            "ingress": [
                {"action": "Accept", "from": [{"namespaces": {"matchLabels": {"team": "far"}}}]},
                {
                    "name": "block-clients",
                    "action": "Deny",
                    "from": [{"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "client"}}}}],
                    "protocols": [{"tcp": {"destinationPort": {"number": 80}}}],
                },
            ],
        },
        rv="31",
    )
    web_allow = policy("default", "web-allow", {**WEB_SELECTED, "ingress": [FROM_CLIENTS]})
    got = ask(view(policies=(web_allow,), cnps=(admin,)), "default/client", "default/web")
    assert got.verdict is Verdict.DENIED
    assert got.ingress.decided_by == "Admin"
    assert steps(got.ingress) == [("Admin", "Deny", "no-clients", "block-clients", 1)]
    assert (got.ingress.path[0].priority, got.ingress.path[0].resource_version) == (5, "31")
    assert "Admin tier: ClusterNetworkPolicy no-clients (priority 5, rv 31) rule block-clients: Deny" in got.text()
    # The unnamed rule: named by its place.
    got = ask(view(policies=(web_allow,), cnps=(admin,)), "other/far", "default/web")
    assert got.verdict is Verdict.ALLOWED and steps(got.ingress) == [("Admin", "Accept", "no-clients", "ingress[0]", 0)]
    assert any("host002" in note for note in got.notes)  # far's egress is its own node's agent's


def test_an_admin_pass_hands_over_to_network_policy() -> None:
    passing = cluster_policy(
        "pass-clients",
        {
            "tier": "Admin",
            "priority": 1,
            "subject": {"namespaces": {}},
            "ingress": [{"name": "to-np", "action": "Pass", "from": [{"namespaces": {}}]}],
        },
    )
    web_allow = policy("default", "web-allow", {**WEB_SELECTED, "ingress": [{**FROM_CLIENTS, "ports": [{"port": 80}]}]})
    v = view(policies=(web_allow,), cnps=(passing,))
    got = ask(v, "default/client", "default/web", 80)
    assert got.verdict is Verdict.ALLOWED and got.ingress.decided_by == "NetworkPolicy"
    assert steps(got.ingress) == [
        ("Admin", "Pass", "pass-clients", "to-np", 0),
        ("NetworkPolicy", "Allow", "default/web-allow", "", 0),
    ]
    assert [s.verdict.split()[0] for s in got.ingress.trace.steps] == ["jump", "return", "jump", "accept"]
    got = ask(v, "default/client", "default/web", 81)
    assert got.verdict is Verdict.DENIED
    assert [s[:2] for s in steps(got.ingress)] == [
        ("Admin", "Pass"),
        ("NetworkPolicy", "NoMatch"),
        ("NetworkPolicy", "Deny"),
    ]


def test_the_baseline_tier_decides_for_pods_no_network_policy_isolates() -> None:
    baseline = cluster_policy(
        "default-deny",
        {
            "tier": "Baseline",
            "priority": 10,
            "subject": {"namespaces": {}},
            "ingress": [{"name": "deny-all", "action": "Deny", "from": [{"namespaces": {}}]}],
        },
    )
    got = ask(view(cnps=(baseline,)), "default/client", "default/web")
    assert got.verdict is Verdict.DENIED and got.ingress.decided_by == "Baseline"
    assert steps(got.ingress) == [
        ("NetworkPolicy", "NotIsolated", "", "", None),
        ("Baseline", "Deny", "default-deny", "deny-all", 0),
    ]
    assert "no NetworkPolicy selects default/web for ingress: not isolated" in got.text()
    # A NetworkPolicy isolating web decides instead: the Baseline tier is never reached.
    web_allow = policy("default", "web-allow", {**WEB_SELECTED, "ingress": [FROM_CLIENTS]})
    got = ask(view(policies=(web_allow,), cnps=(baseline,)), "default/client", "default/web")
    assert got.verdict is Verdict.ALLOWED and [s[0] for s in steps(got.ingress)] == ["NetworkPolicy"]


def test_networks_and_nodes_peers() -> None:
    egress = cluster_policy(
        "egress-guard",
        {
            "tier": "Admin",
            "priority": 3,
            "subject": {"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "client"}}}},
            "egress": [
                {"name": "no-lab", "action": "Deny", "to": [{"networks": ["2001:db8:ff::/48"]}]},
                {"name": "zone-b", "action": "Pass", "to": [{"nodes": {"matchLabels": {"zone": "b"}}}]},
            ],
        },
    )
    listed = view(cnps=(egress,), nodes=(HOST001, HOST002))
    got = ask(listed, "default/client", "2001:db8:ff::5")
    assert got.verdict is Verdict.DENIED and steps(got.egress) == [("Admin", "Deny", "egress-guard", "no-lab", 0)]
    assert got.ingress.decided_by == "not-a-pod" and got.destination.kind == "address"
    got = ask(listed, "default/client", "2001:db8:ff00::5")
    assert got.verdict is Verdict.ALLOWED and [s[:2] for s in steps(got.egress)] == [
        ("Admin", "NoMatch"),
        ("NetworkPolicy", "NotIsolated"),
        ("none", "Allow"),
    ]
    got = ask(listed, "default/client", "host002")  # by name: its address
    assert got.destination.kind == "node" and str(got.destination.address) == "2001:db8:ffff::2"
    assert got.verdict is Verdict.ALLOWED and steps(got.egress)[0] == ("Admin", "Pass", "egress-guard", "zone-b", 1)
    # Nodes not listed: the nodes peer fails closed, its Pass denies every address.
    unlisted = view(cnps=(egress,))
    got = ask(unlisted, "default/client", "2001:db8:ffff::2")
    assert got.verdict is Verdict.DENIED and steps(got.egress) == [("Admin", "Deny", "egress-guard", "zone-b", 1)]
    assert got.egress.path[0].detail.startswith("fails closed")
    assert got.notes == (
        "if 2001:db8:ffff::2 is default/client's own node's, the Admin tier alone decides (input hook)",
    )
    assert ask(unlisted, "default/client", "host002").verdict is Verdict.UNKNOWN  # its address is unknown


def test_named_ports_resolve_on_the_destination() -> None:
    http = policy("default", "web-http", {**WEB_SELECTED, "ingress": [{"ports": [{"port": "http"}]}]})
    got = ask(view(policies=(http,)), "default/client", "default/web", 8080)
    assert got.verdict is Verdict.ALLOWED and steps(got.ingress) == [
        ("NetworkPolicy", "Allow", "default/web-http", "", 0)
    ]
    assert ask(view(policies=(http,)), "default/client", "default/web", 80).verdict is Verdict.DENIED
    assert ask(view(policies=(http,)), "default/client", "default/web", 8080, Protocol.UDP).verdict is Verdict.DENIED


def test_a_pod_reaching_its_own_node_meets_the_admin_tier_alone() -> None:
    deny_egress = policy("default", "client-quiet", {"podSelector": {}, "policyTypes": ["Egress"]})
    v = view(policies=(deny_egress,), nodes=(HOST001, HOST002))
    got = ask(v, "default/client", NODE)
    assert got.verdict is Verdict.ALLOWED, got.text()
    assert (got.egress.hook, got.egress.decided_by, got.ingress.decided_by) == ("input", "own-node", "own-node")
    assert steps(got.egress)[-1][:2] == ("NetworkPolicy", "Allow") and got.egress.applied is True
    assert ask(v, "default/client", "host002").verdict is Verdict.DENIED  # another node: the forward hook
    guard = cluster_policy(
        "no-node",
        {
            "tier": "Admin",
            "priority": 0,
            "subject": {"namespaces": {}},
            "egress": [{"name": "kubelet-only", "action": "Deny", "to": [{"nodes": {}}]}],
        },
    )
    got = ask(view(policies=(deny_egress,), cnps=(guard,), nodes=(HOST001,)), "default/client", "2001:db8:ffff::1")
    assert got.verdict is Verdict.DENIED and got.egress.hook == "input" and got.egress.decided_by == "Admin"
    assert steps(got.egress) == [("Admin", "Deny", "no-node", "kubelet-only", 0)]


def test_a_node_reaching_its_own_pods_and_a_pod_itself_are_never_filtered() -> None:
    deny_all = policy("default", "deny-all", {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]})
    v = view(policies=(deny_all,), nodes=(HOST001, HOST002))
    got = ask(v, NODE, "default/web")
    assert got.verdict is Verdict.ALLOWED and (got.egress.decided_by, got.ingress.decided_by) == ("own-node",) * 2
    assert got.source.kind == "node" and got.egress.hook is None
    assert ask(v, "host002", "default/web").verdict is Verdict.DENIED
    got = ask(v, "default/web", "2001:db8:0:1::3")
    assert got.verdict is Verdict.ALLOWED and got.egress.decided_by == "same-pod" and got.reference is None
    assert ask(v, "default/client", "default/web").verdict is Verdict.DENIED


def test_this_nodes_own_addresses_are_this_node_without_node_objects() -> None:
    """Nodes are listed only while a ClusterNetworkPolicy has a nodes peer: the agent knows its own node's
    addresses from the kernel all the same (the lab's e2e found a pod → own node answered by the forward hook)."""
    deny_all = policy("default", "deny-all", {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]})
    own = frozenset({ip("2001:db8:ffff::1"), ip("192.0.2.11"), ip("fe80::1")})
    v = attrs.evolve(view(policies=(deny_all,)), own_addresses=own)
    for dst in ("2001:db8:ffff::1", NODE):  # by address, or by name
        got = ask(v, "default/client", dst)
        assert got.verdict is Verdict.ALLOWED and got.egress.hook == "input", got.text()
        assert got.destination.kind == "node" and got.destination.node == NODE
    got = ask(v, "2001:db8:ffff::1", "default/web")  # the node reaching its own pod: never filtered
    assert got.verdict is Verdict.ALLOWED and got.ingress.decided_by == "own-node", got.text()
    # without them (as before): an address no pod or node is known to have, through the forward hook
    assert ask(view(policies=(deny_all,)), "default/client", "2001:db8:ffff::1").verdict is Verdict.DENIED
    assert ask(v, "default/client", "2001:db8:ffff::2").verdict is Verdict.DENIED  # another node's: forward


# ---- what cannot be told ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "src, dst, family, why",
    [
        ("default/nope", "default/web", None, "pod default/nope is unknown to the agent"),
        (
            "default/client",
            "2001:db8:0:1::9",
            None,
            "is ambiguous: the address of 2 pods (default/twin-a, default/twin-b)",
        ),
        ("default/client", "other/far", 4, "other/far has no IPv4 address"),
        ("default/client", "default/host", None, "hostNetwork or has finished"),
        ("default/client", "nowhere", None, "nowhere: no such pod (NS/POD), node, or address"),
        ("default/client", "host002", None, "the addresses of node host002 are unknown"),
        ("2001:db8::1", "198.51.100.2", None, "addresses of different families"),
    ],
)
def test_what_cannot_be_told_says_why(src, dst, family, why) -> None:
    twins = (pod("default/twin-a", {}, "2001:db8:0:1::9"), pod("default/twin-b", {}, "2001:db8:0:1::9", node="host002"))
    host = attrs.evolve(pod("default/host", {}, "2001:db8:ffff::1"), selectable=False)
    got = ask(view((CLIENT, WEB, FAR, *twins, host)), src, dst, family=family)
    assert got.verdict is Verdict.UNKNOWN and got.exit_code == 2 and why in got.why, got.why
    assert got.egress is None and f"verdict  CANNOT TELL: {got.why}" in got.text()


def test_inputs_not_listed_yet_cannot_tell() -> None:
    got = ask(view(synced=LISTED - {Kind.POD, Kind.CLUSTER_POLICY}), "default/client", "default/web")
    assert got.verdict is Verdict.UNKNOWN
    assert got.why == "the policy inputs are not listed yet (waiting for ClusterNetworkPolicy, Pod)"
    assert got.to_json()["inputs"]["complete"] is False and got.source.kind is None


def test_a_ruleset_in_force_that_disagrees_cannot_tell() -> None:
    deny_all = policy("default", "deny-all", {"podSelector": {}, "policyTypes": ["Ingress"]})
    got = ask(view(policies=(deny_all,), ruleset=Ruleset()), "default/client", "default/web")
    assert got.verdict is Verdict.UNKNOWN and got.ingress.applied is True and not got.ingress.allowed
    assert got.why.startswith("ingress: the ruleset in force on host001 says allowed")
    assert got.notes[0] == "computed: denied" and "the ruleset in force on host001 says allowed" in got.text()
    # Another node's pods: its agent's ruleset, not checked here.
    got = ask(view(policies=(deny_all,), ruleset=Ruleset()), "default/client", "other/far")
    assert got.verdict is Verdict.ALLOWED and got.ingress.applied is None
    # nftables refused the last ruleset: the kernel holds an older one.
    got = ask(view(apply_error="Error: Could not process rule"), "default/client", "default/web")
    assert got.verdict is Verdict.UNKNOWN and "nftables refused the last ruleset" in got.why


def test_queries_are_checked() -> None:
    assert Query.parse("a/b", "2001:db8::1", 80, "udp", 6) == Query("a/b", "2001:db8::1", 80, Protocol.UDP, 6)
    for bad in (("", "x", 80, "TCP"), ("x", "y", 0, "TCP"), ("x", "y", True, "TCP"), ("x", "y", 80, "ICMP")):
        with pytest.raises(ValueError, match="expected"):
            Query.parse(*bad)
    with pytest.raises(ValueError, match="expected 6 or 4"):
        Query.parse("x", "y", 80, "TCP", 5)


# ---- the property: explain's verdict is the reference evaluator's --------------------------------


def _view_of(cluster, cnps, nodes, node: str = "n1") -> AgentView:
    """The agent on *node* of a generated cluster: its pods attached (a veth each), the ruleset in force
    compiled from the same inputs (as the policy service would have it)."""
    pols, namespaces, pods = cluster
    local = {p.key: attrs.evolve(p, host_veth=f"flock{fnv1a_32(p.key):08x}") for p in pods if p.node == node}
    snap = PolicySnapshot(
        1,
        {p.key: p for p in pols},
        {n.name: n for n in namespaces},
        {p.key: p for p in pods},
        LISTED | ({Kind.NODE} if nodes is not None else set()),
        {c.key: c for c in cnps},
        {n.name: n for n in nodes or ()},
    )
    ruleset = compile_ruleset(pols, namespaces, pods, local.values(), cnps, nodes or (), nodes is not None)
    return AgentView(node, snap, local, ruleset)


@st.composite
def _ends(draw: st.DrawFn, cluster, nodes, family: int) -> tuple[str, Endpoint]:
    """One end with an address of *family*: a pod by name or address, a node by name or address, another address."""
    pods = [p for p in cluster[2] if any(a.version == family for a in p.addresses)]
    kind = draw(st.sampled_from(["pod", "pod", "pod-address", "node", "external"]))
    if kind.startswith("pod") and pods:
        chosen = draw(st.sampled_from(pods))
        address = next(a for a in chosen.addresses if a.version == family)
        return (chosen.key if kind == "pod" else str(address)), Endpoint(address, pod=chosen)
    if kind == "node":
        name = draw(st.sampled_from(sorted(NODES)))
        address = next(a for a in map(ip, NODES[name]) if a.version == family)
        if nodes is None:  # not listed: the agent knows no node's address, it is just an address
            return str(address), Endpoint(address)
        return (name if draw(st.booleans()) else str(address)), Endpoint(address, node=name)
    address = draw(st.sampled_from([a for a in map(ip, EXTERNAL) if a.version == family]))
    return str(address), Endpoint(address)


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiered_maybe_unlisted(), st.data())
def test_explain_agrees_with_the_reference_on_random_clusters(drawn, data) -> None:
    """Random clusters with both tiers (Nodes listed or not), ends of every kind asked by name or by
    address, from the agent on n1: the verdict is the reference evaluator's, and n1's own pods' directions
    agree with n1's ruleset in force (else explain would say it cannot tell)."""
    cluster, cnps, nodes = drawn
    v = _view_of(cluster, cnps, nodes)
    pols, namespaces, _ = cluster
    for _ in range(6):
        family = data.draw(st.sampled_from(FAMILIES))
        (src, src_end), (dst, dst_end) = (
            data.draw(_ends(cluster, nodes, family)),
            data.draw(_ends(cluster, nodes, family)),
        )
        if src_end.address == dst_end.address:
            continue  # the same pod or node: nothing between them to filter
        port, proto = data.draw(st.sampled_from(PORTS))
        got = explain(v, Query(src, dst, port, proto, family))
        want = evaluate(pols, namespaces, src_end, dst_end, port, proto, cnps, nodes)
        assert got.verdict is (Verdict.ALLOWED if want else Verdict.DENIED), got.text()
        assert got.to_json()["verdict"] == got.verdict.value and got.text()
        ns = {n.name: n for n in namespaces}
        for direction, other in ((got.egress, dst_end), (got.ingress, src_end)):
            _named_rightly(direction, v.inputs, ns, other, dst_end, port, proto)


def _named_rightly(direction, snap, namespaces, other, dst, port, proto) -> None:
    """Every rule a path names is there, and, by the reference's reading, matches the connection."""
    for step in direction.path:
        if step.tier == "NetworkPolicy" and step.action == "Allow" and step.policy:
            pol = snap.policies[step.policy]
            rule = (pol.ingress if direction.direction == "ingress" else pol.egress)[step.rule_index]
            assert not rule.peers or any(_peer_matches(p, pol, other, namespaces) for p in rule.peers), step
            assert not rule.ports or any(_port_matches(pp, dst, port, proto) for pp in rule.ports), step
        elif step.tier in ("Admin", "Baseline") and step.action != "NoMatch":
            cnp = snap.cluster_policies[step.policy]
            rule = (cnp.ingress if direction.direction == "ingress" else cnp.egress)[step.rule_index]
            assert step.rule in (rule.name, f"{direction.direction}[{step.rule_index}]") or step.rule.startswith(
                f"{rule.name} ("
            ), step
            assert rule.action.value == step.action or step.detail.startswith("fails closed"), step


def test_a_rule_named_like_a_place_is_named_by_its_own_place() -> None:
    """Rule names are free text: "block-ingress[0]" at place 1 is rule 1 (review: the label was parsed)."""
    cnp = cluster_policy(
        "odd-names",
        {
            "tier": "Admin",
            "priority": 1,
            "subject": {"namespaces": {}},
            "ingress": [
                {"name": "from-far", "action": "Accept", "from": [{"namespaces": {"matchLabels": {"team": "far"}}}]},
                {"name": "block-ingress[0]", "action": "Deny", "from": [{"namespaces": {}}]},
            ],
        },
    )  # fmt: skip
    got = ask(view(cnps=(cnp,)), "default/client", "default/web", 81)
    assert got.verdict is Verdict.DENIED, got.text()
    assert steps(got.ingress)[0] == ("Admin", "Deny", "odd-names", "block-ingress[0]", 1)
    assert "fails closed" not in got.text()
