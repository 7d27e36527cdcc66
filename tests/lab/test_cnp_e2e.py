"""ClusterNetworkPolicy end to end: upstream's conformance scenarios on the x/y/z model.

kubernetes-sigs/network-policy-api v0.2.0's conformance tests (``conformance/
tests``, ``conformance/base``: the houses gryffindor, slytherin … and their
server pods) translated to the model of test_netpol_e2e.py: namespaces x, y, z
(labelled ns=<name>) with pods a, b, c (labelled pod=<name>; a and c on node1,
b on node2), every pod serving 80 and 81 over TCP and UDP on IPv6 and IPv4
(named serve-80-tcp …), and every node serving the same ports on its own
addresses (the InternalIPs of its Node object).  Each case applies
ClusterNetworkPolicies (and NetworkPolicies) with ``flock-lab apply``, waits
with ``flock-lab policy wait``, measures with ``flock-lab matrix --json``
(``--to node1 --to node2`` for the nodes) and compares with a truth table
written by hand.  The lab is the netpol stage's one (tests/lab/conftest.py);
each case's policies and labels are undone after it.

What is decided per direction: the Admin tier by ascending priority (equal
priorities by name; a policy's rules in written order), then NetworkPolicy
(when one selects the pod for that direction), then the Baseline tier, then
allow.  Accept and Deny end it; Pass skips the rest of its tier.  A node
always reaches its own pods; a pod reaching its own node is decided by the
Admin tier alone.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from typing import Any

import pytest
import yaml

from flock.testing.netpol import MODEL, NODES, Lab, Peer, Reachability

pytestmark = pytest.mark.netpol


# ---- objects ------------------------------------------------------------------------------


def cnp(
    name: str,
    tier: str,
    priority: int,
    subject: dict[str, Any],
    ingress: Sequence[dict[str, Any]] = (),
    egress: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    spec: dict[str, Any] = {"tier": tier, "priority": priority, "subject": subject}
    if ingress:
        spec["ingress"] = list(ingress)
    if egress:
        spec["egress"] = list(egress)
    return {
        "apiVersion": "policy.networking.k8s.io/v1alpha2",
        "kind": "ClusterNetworkPolicy",
        "metadata": {"name": name},
        "spec": spec,
    }


def selector(**labels: str) -> dict[str, Any]:
    return {"matchLabels": dict(labels)} if labels else {}


def namespaces(ns: str | None = None) -> dict[str, Any]:
    """A subject or peer: every pod of namespace *ns* (None: of every namespace)."""
    return {"namespaces": selector() if ns is None else selector(ns=ns)}


def pods(ns: str | None = None, pod: str | None = None) -> dict[str, Any]:
    """A subject or peer: pods labelled pod=*pod* in namespace *ns* (None: any)."""
    return {
        "pods": {
            "namespaceSelector": selector() if ns is None else selector(ns=ns),
            "podSelector": selector() if pod is None else selector(pod=pod),
        }
    }


def nodes(**labels: str) -> dict[str, Any]:
    return {"nodes": selector(**labels)}


def networks(*cidrs: str) -> dict[str, Any]:
    return {"networks": list(cidrs)}


def ingress(action: str, *peers: dict[str, Any], protocols: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    rule: dict[str, Any] = {"action": action, "from": list(peers)}
    if protocols:
        rule["protocols"] = list(protocols)
    return rule


def egress(action: str, *peers: dict[str, Any], protocols: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    rule: dict[str, Any] = {"action": action, "to": list(peers)}
    if protocols:
        rule["protocols"] = list(protocols)
    return rule


def tcp(port: int) -> dict[str, Any]:
    return {"tcp": {"destinationPort": {"number": port}}}


def udp(port: int) -> dict[str, Any]:
    return {"udp": {"destinationPort": {"number": port}}}


def tcp_range(start: int, end: int) -> dict[str, Any]:
    return {"tcp": {"destinationPort": {"range": {"start": start, "end": end}}}}


def named(port: str) -> dict[str, Any]:
    return {"destinationNamedPort": port}


def netpol(namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"namespace": namespace, "name": name},
        "spec": spec,
    }


def from_namespaces(*names: str) -> dict[str, Any]:
    """A NetworkPolicy peer: every pod of the namespaces *names*."""
    return {"namespaceSelector": {"matchExpressions": [{"key": "ns", "operator": "In", "values": list(names)}]}}


# ---- tables -------------------------------------------------------------------------------


def everything(connected: bool = True) -> Reachability:
    return Reachability(MODEL.pods, connected)


def to_nodes(connected: bool = True) -> Reachability:
    """Every pod (rows) to every node's own address (columns)."""
    return Reachability(MODEL.pods, connected, targets=NODES)


def block_node(want: Reachability, source: Peer, node: str, connected: bool = False) -> None:
    for pod in MODEL.pods:
        if source.matches(pod):
            want.expect(pod, node, connected)


# ---- the tiers around NetworkPolicy (upstream CNPAdminTierIntegration) -------------------


def test_admin_deny_overrides_a_network_policy_allow(model: Lab) -> None:
    model.apply(
        netpol("x", "from-y-z", {"podSelector": {}, "ingress": [{"from": [from_namespaces("y", "z")]}]}),
        cnp("deny-from-y", "Admin", 10, namespaces("x"), ingress=[ingress("Deny", namespaces("y"))]),
    )
    want = everything()
    want.expect_peer(Peer("x"), Peer("x"), False)  # the NetworkPolicy
    want.expect_peer(Peer("y"), Peer("x"), False)  # the Admin tier, over the NetworkPolicy's allow
    model.check(want, ("80/TCP", "81/UDP"))
    model.check(want, ("80/TCP",), family=4)


def test_admin_accept_overrides_a_network_policy_deny(model: Lab) -> None:
    model.apply(
        netpol("x", "deny", {"podSelector": {}}),
        cnp("accept-y-b", "Admin", 10, namespaces("x"), ingress=[ingress("Accept", pods("y", "b"))]),
    )
    want = everything()
    want.expect_peer(Peer(), Peer("x"), False)
    want.expect_peer(Peer("y", "b"), Peer("x"), True)
    model.check(want, ("80/TCP", "81/UDP"))


def test_admin_pass_hands_the_decision_to_network_policy(model: Lab) -> None:
    gate = cnp("gate", "Admin", 10, namespaces("x"), ingress=[ingress("Deny", namespaces("y"))])
    model.apply(
        gate,
        # Later in the tier: skipped by the gate's Pass.
        cnp("deny-y", "Admin", 20, namespaces("x"), ingress=[ingress("Deny", namespaces("y"))]),
        netpol("x", "from-y", {"podSelector": {}, "ingress": [{"from": [from_namespaces("y")]}]}),
    )
    want = everything()
    want.expect_peer(Peer(), Peer("x"), False)
    model.check(want)
    gate["spec"]["ingress"][0]["action"] = "Pass"  # as upstream: the policy updated in place
    model.apply(gate)
    want.expect_peer(Peer("y"), Peer("x"), True)  # the NetworkPolicy allows y
    model.check(want, ("80/TCP", "81/UDP"))


def test_admin_pass_hands_the_decision_to_baseline_without_network_policy(model: Lab) -> None:
    model.apply(
        cnp("pass-y", "Admin", 10, namespaces("x"), egress=[egress("Pass", namespaces("y"))]),
        cnp("deny-y", "Admin", 20, namespaces("x"), egress=[egress("Deny", namespaces("y"))]),
        cnp("baseline", "Baseline", 10, namespaces("x"), egress=[egress("Deny", pods("y", "b"))]),
    )
    want = everything()
    want.expect_peer(Peer("x"), Peer("y", "b"), False)  # Baseline; y/a and y/c: no tier decides → allowed
    model.check(want, ("80/TCP", "81/UDP"))
    model.check(want, ("80/TCP",), family=4)


def test_baseline_deny_is_overridden_by_a_network_policy_allow(model: Lab) -> None:
    model.apply(cnp("default", "Baseline", 10, namespaces("x"), ingress=[ingress("Deny", namespaces("y"))]))
    want = everything()
    want.expect_peer(Peer("y"), Peer("x"), False)
    model.check(want)
    model.apply(
        netpol(
            "x",
            "a-from-y",
            {"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"from": [from_namespaces("y")]}]},
        )
    )
    want.expect_all_ingress("x/a", False)  # x/a is the NetworkPolicy's now: only y
    want.expect_peer(Peer("y"), Peer("x", "a"), True)
    model.check(want, ("80/TCP", "81/UDP"))


def test_accepting_egress_does_not_decide_the_destinations_ingress(model: Lab) -> None:
    model.apply(
        cnp("x-out", "Admin", 10, namespaces("x"), egress=[egress("Accept", namespaces("y"))]),
        cnp("y-in", "Admin", 20, namespaces("y"), ingress=[ingress("Deny", namespaces("x"))]),
    )
    want = everything()
    want.expect_peer(Peer("x"), Peer("y"), False)
    model.check(want)


# ---- precedence in a tier (upstream CNPPriorityField) ----------------------------------


def test_a_lower_priority_number_wins_and_changing_it_flips_the_outcome(model: Lab) -> None:
    deny = cnp("deny-y", "Admin", 20, namespaces("x"), ingress=[ingress("Deny", namespaces("y"))])
    model.apply(cnp("accept-y", "Admin", 10, namespaces("x"), ingress=[ingress("Accept", namespaces("y"))]), deny)
    model.check(everything(), ("80/TCP", "81/UDP"))
    deny["spec"]["priority"] = 5
    model.apply(deny)
    want = everything()
    want.expect_peer(Peer("y"), Peer("x"), False)
    model.check(want, ("80/TCP", "81/UDP"))


def test_upstream_priority_field_a_pass_moved_above_a_deny(model: Lab) -> None:
    subject = pods("x", "a")
    moved = cnp(
        "old-priority-60-new-priority-40",
        "Admin",
        60,
        subject,
        ingress=[ingress("Pass", pods("y", "b"))],
        egress=[egress("Pass", pods("y", "b"))],
    )
    model.apply(
        cnp(
            "priority-50",
            "Admin",
            50,
            subject,
            ingress=[ingress("Deny", pods("y", "b"))],
            egress=[egress("Deny", pods("y", "b"))],
        ),
        moved,
        cnp(
            "default",
            "Baseline",
            10,
            subject,
            ingress=[ingress("Accept", pods("y", "b"))],
            egress=[egress("Accept", pods("y", "b"))],
        ),
    )
    want = everything()
    want.expect("y/b", "x/a", False)
    want.expect("x/a", "y/b", False)
    model.check(want)
    moved["spec"]["priority"] = 40
    model.apply(moved)
    model.check(everything())


def test_equal_priorities_are_ordered_by_name(model: Lab) -> None:
    model.apply(
        cnp("a-accept", "Admin", 10, namespaces("x"), ingress=[ingress("Accept", namespaces("y"))]),
        cnp("b-deny", "Admin", 10, namespaces("x"), ingress=[ingress("Deny", namespaces("y"))]),
    )
    model.check(everything())
    model.delete_cluster("a-accept")
    model.apply(cnp("c-accept", "Admin", 10, namespaces("x"), ingress=[ingress("Accept", namespaces("y"))]))
    want = everything()
    want.expect_peer(Peer("y"), Peer("x"), False)  # b-deny comes first now
    model.check(want)


def test_rules_of_one_policy_apply_in_written_order(model: Lab) -> None:
    first_accept = [ingress("Accept", pods("y", "b")), ingress("Deny", namespaces("y"))]
    model.apply(cnp("order", "Admin", 10, namespaces("x"), ingress=first_accept))
    want = everything()
    want.expect_peer(Peer("y"), Peer("x"), False)
    want.expect_peer(Peer("y", "b"), Peer("x"), True)
    model.check(want)
    model.apply(cnp("order", "Admin", 10, namespaces("x"), ingress=first_accept[::-1]))
    want.expect_peer(Peer("y", "b"), Peer("x"), False)  # the Deny of all y comes first
    model.check(want)


# ---- subjects and peers ----------------------------------------------------------------


def test_namespaces_subject_and_pods_subject(model: Lab) -> None:
    model.apply(
        cnp("into-y", "Admin", 10, namespaces("y"), ingress=[ingress("Deny", namespaces("x"))]),
        cnp("into-z-b", "Admin", 11, pods("z", "b"), ingress=[ingress("Deny", namespaces("x"))]),
        # Empty namespace selectors: pod c of every namespace, to pod a of every namespace.
        cnp("c-to-a", "Admin", 12, pods(None, "c"), egress=[egress("Deny", pods(None, "a"))]),
    )
    want = everything()
    want.expect_peer(Peer("x"), Peer("y"), False)
    want.expect_peer(Peer("x"), Peer("z", "b"), False)
    want.expect_peer(Peer(None, "c"), Peer(None, "a"), False)
    model.check(want, ("80/TCP", "81/UDP"))
    model.check(want, ("80/TCP",), family=4)


def test_label_changes_move_subjects_and_peers(model: Lab) -> None:
    model.apply(
        cnp(
            "blue-from-clients",
            "Admin",
            10,
            {"namespaces": selector(team="blue")},
            ingress=[ingress("Deny", {"pods": {"namespaceSelector": {}, "podSelector": selector(role="client")}})],
        )
    )
    model.check(everything())
    model.ok("ns", "label", "y", "team=blue")
    model.ok("pod", "label", "x/a", "role=client")
    model.wait()
    want = everything()
    want.expect_peer(Peer("x", "a"), Peer("y"), False)
    model.check(want)
    model.ok("pod", "label", "x/a", "--remove", "role")
    model.wait()
    model.check(everything())


# ---- ports ---------------------------------------------------------------------------------


def test_destination_named_port(model: Lab) -> None:
    model.apply(
        cnp(
            "no-80-tcp-to-y",
            "Admin",
            10,
            namespaces("x"),
            egress=[egress("Deny", namespaces("y"), protocols=[named("serve-80-tcp")])],
        ),
        cnp(
            "no-81-udp-into-z-a",
            "Admin",
            11,
            pods("z", "a"),
            ingress=[ingress("Deny", namespaces(), protocols=[named("serve-81-udp")])],
        ),
    )
    tcp80 = everything()
    tcp80.expect_peer(Peer("x"), Peer("y"), False)
    model.check(tcp80, ("80/TCP",))
    udp81 = everything()
    udp81.expect_all_ingress("z/a", False)
    model.check(udp81, ("81/UDP",))
    model.check(everything(), ("81/TCP", "80/UDP"))


def test_port_number_and_range(model: Lab) -> None:
    model.apply(
        cnp(
            "ports",
            "Admin",
            10,
            namespaces("y"),
            ingress=[ingress("Deny", namespaces("x"), protocols=[tcp_range(80, 81), udp(81)])],
        )
    )
    want = everything()
    want.expect_peer(Peer("x"), Peer("y"), False)
    model.check(want, ("80/TCP", "81/TCP", "81/UDP"))
    model.check(everything(), ("80/UDP",))
    model.check(want, ("81/TCP",), family=4)


# ---- networks and nodes (upstream's experimental egress peers) -------------------------


def test_networks_peer_with_ipv6_and_ipv4_cidrs(model: Lab) -> None:
    node2_pods4 = str(model.plan.node("node2").cidr4)
    model.apply(
        cnp(
            "x-a-cidrs",
            "Admin",
            10,
            pods("x", "a"),
            egress=[egress("Deny", networks(model.address("y/b", 6) + "/128", model.address("z/c", 4) + "/32"))],
        ),
        cnp("y-c-node2", "Admin", 11, pods("y", "c"), egress=[egress("Deny", networks(node2_pods4))]),
    )
    v6 = everything()
    v6.expect("x/a", "y/b", False)  # the /32 says nothing about IPv6, node2's IPv4 block neither
    model.check(v6, ("80/TCP", "81/UDP"))
    v4 = everything()
    v4.expect("x/a", "z/c", False)
    v4.expect_peer(Peer("y", "c"), Peer(None, "b"), False)
    model.check(v4, ("80/TCP", "81/UDP"), family=4)


def test_networks_peer_covering_node_addresses(model: Lab) -> None:
    model.apply(
        cnp(
            "no-node-addresses",
            "Admin",
            10,
            namespaces("x"),
            egress=[
                egress(
                    "Deny",
                    networks(model.node_address("node2", 6) + "/128", model.node_address("node1", 4) + "/32"),
                )
            ],
        )
    )
    v6 = to_nodes()
    block_node(v6, Peer("x"), "node2")
    model.check(v6, ("80/TCP", "81/UDP"))
    v4 = to_nodes()
    block_node(v4, Peer("x"), "node1")  # x/a and x/c too: their own node, denied by the Admin tier
    model.check(v4, ("80/TCP", "81/UDP"), family=4)
    model.check(everything(), ("80/TCP",))  # pods are not those addresses
    # A node reaches its own pods whatever the policies say (kubelet probes).
    assert model.cli("probe", "node1", "x/a", "80/TCP", "--family", "4").returncode == 0


def test_nodes_peer_by_label_then_the_node_relabelled(model: Lab) -> None:
    model.label_node("node2", "zone=restricted")
    model.apply(
        cnp("no-restricted-nodes", "Admin", 10, namespaces("x"), egress=[egress("Deny", nodes(zone="restricted"))])
    )
    want = to_nodes()
    block_node(want, Peer("x"), "node2")
    for family in (6, 4):
        model.check(want, ("80/TCP", "81/UDP"), family=family)
    model.check(everything(), ("80/TCP",))  # pod to pod: untouched
    model.label_node("node2", "zone=open")
    model.check(to_nodes(), ("80/TCP", "81/UDP"))
    model.label_node("node1", "zone=restricted")
    want = to_nodes()
    block_node(want, Peer("x"), "node1")  # x/a and x/c: their own node
    model.check(want, ("80/TCP",))
    model.check(want, ("80/TCP",), family=4)


def test_nodes_peer_rules_with_ports_in_written_order(model: Lab) -> None:
    linux = nodes(**{"kubernetes.io/os": "linux"})
    model.apply(
        cnp(
            "node-and-cidr-as-peers",
            "Admin",
            75,
            namespaces("x"),
            egress=[
                egress("Accept", linux, protocols=[tcp(80)]),
                egress("Pass", linux, protocols=[udp(80)]),
                egress("Deny", pods("y", "b"), linux),
            ],
        )
    )
    model.check(to_nodes(), ("80/TCP", "80/UDP"))  # accepted; passed, and no tier after denies
    blocked = to_nodes()
    block_node(blocked, Peer("x"), "node1")
    block_node(blocked, Peer("x"), "node2")
    model.check(blocked, ("81/TCP", "81/UDP"))
    pods_want = everything()
    pods_want.expect_peer(Peer("x"), Peer("y", "b"), False)
    model.check(pods_want, ("80/TCP",))


def test_a_pods_own_node_is_decided_by_the_admin_tier_alone(model: Lab) -> None:
    model.apply(netpol("x", "no-egress", {"podSelector": {}, "policyTypes": ["Egress"]}))
    want = to_nodes()
    # The NetworkPolicy blocks x's egress to another node; its own node is not its to decide.
    for pod, node in (("x/a", "node2"), ("x/b", "node1"), ("x/c", "node2")):
        want.expect(pod, node, False)
    model.check(want, ("80/TCP", "81/TCP"))
    model.apply(
        cnp("no-80-to-nodes", "Admin", 10, namespaces("x"), egress=[egress("Deny", nodes(), protocols=[tcp(80)])])
    )
    block_node(want, Peer("x"), "node1")
    block_node(want, Peer("x"), "node2")
    model.check(want, ("80/TCP",))
    model.check(want, ("80/TCP",), family=4)


# ---- updates -----------------------------------------------------------------------------


def test_tier_changed_between_admin_and_baseline(model: Lab) -> None:
    policy = cnp("deny-y", "Admin", 10, namespaces("x"), ingress=[ingress("Deny", namespaces("y"))])
    model.apply(
        netpol("x", "from-y", {"podSelector": {}, "ingress": [{"from": [from_namespaces("y")]}]}),
        policy,
    )
    admin = everything()
    admin.expect_peer(Peer(), Peer("x"), False)
    model.check(admin)
    policy["spec"]["tier"] = "Baseline"
    model.apply(policy)
    baseline = everything()
    baseline.expect_peer(Peer(), Peer("x"), False)
    baseline.expect_peer(Peer("y"), Peer("x"), True)  # the NetworkPolicy decides before the Baseline tier
    model.check(baseline)
    model.check(baseline, ("80/TCP",), family=4)
    policy["spec"]["tier"] = "Admin"
    model.apply(policy)
    model.check(admin)


def test_deleted_policies_leave_everything_allowed(model: Lab) -> None:
    model.apply(
        cnp("deny-into-x", "Admin", 10, namespaces("x"), ingress=[ingress("Deny", namespaces())]),
        cnp("z-no-egress", "Baseline", 10, namespaces("z"), egress=[egress("Deny", pods())]),
    )
    want = everything()
    want.expect_peer(Peer(), Peer("x"), False)
    want.expect_peer(Peer("z"), Peer(), False)
    model.check(want, ("80/TCP", "81/UDP"))
    assert model.cli("probe", "node1", "x/a", "80/TCP").returncode == 0  # a node reaches its own pods
    model.delete_cluster("deny-into-x")
    want = everything()
    want.expect_peer(Peer("z"), Peer(), False)
    model.check(want, ("81/UDP",))
    model.delete_cluster("z-no-egress")
    model.check(everything(), ("80/TCP", "81/UDP"))
    model.check(everything(), ("80/TCP",), family=4)


# ---- the command line -------------------------------------------------------------------


def test_an_invalid_policy_is_refused_with_the_api_servers_message(model: Lab) -> None:
    bad = cnp("too-high", "Admin", 1001, namespaces("x"), ingress=[ingress("Deny", namespaces("y"))])
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(bad, f)
    try:
        proc = model.cli("apply", f.name)
    finally:
        os.unlink(f.name)
    assert proc.returncode == 1, proc
    assert "422" in proc.stderr and "spec.priority" in proc.stderr, proc.stderr
    listed = json.loads(model.cli("delete", "cnp", "too-high", "--json").stdout or "{}")
    assert "error" in listed  # nothing was stored
