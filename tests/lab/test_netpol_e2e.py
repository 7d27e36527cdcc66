"""NetworkPolicy end to end: the upstream Kubernetes e2e model on a two-node flock lab.

Namespaces x, y, z (labelled ns=<name>) with pods a, b, c (labelled pod=<name>;
a and c on node1, b on node2), every pod serving 80 and 81 over TCP and UDP on
IPv6 and IPv4.  Each case applies policies with ``flock-lab apply``, waits with
``flock-lab policy wait``, measures with ``flock-lab matrix --json`` and
compares with a truth table written by hand (flock.testing.netpol), as the
upstream tests do.  Everything goes through the lab's command line, in this
process (``flock.lab.cli.main``) or as ``flock-lab`` itself for exit codes
(:class:`flock.testing.netpol.Lab`; the lab is the netpol stage's one, shared
with test_cnp_e2e.py: tests/lab/conftest.py).

Slow (one lab, nine pods, ~30 matrices): marked ``netpol``, run by .ci/run
after the main suite.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from flock.testing.netpol import MODEL, NS_LABEL, Lab, Peer, Reachability

pytestmark = pytest.mark.netpol


def policy(namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"namespace": namespace, "name": name},
        "spec": spec,
    }


def pods_labelled(pod: str) -> dict[str, Any]:
    return {"matchLabels": {"pod": pod}}


def everything(connected: bool = True) -> Reachability:
    return Reachability(MODEL.pods, connected)


# ---- no policy ----------------------------------------------------------------


def test_without_policies_everything_connects_on_every_port_and_family(model: Lab) -> None:
    ports = ("80/TCP", "81/TCP", "80/UDP", "81/UDP")
    results = model.matrix(ports)
    assert len(results) == 324  # 9 × 9 pairs × 4 ports, themselves included
    assert set(results[0]) == {"from", "to", "port", "family", "connected"}
    for p in ports:
        assert not everything().mismatches(results, p, 6)
    model.check(everything(), ("80/TCP", "81/UDP"), family=4)


# ---- default deny and pod/namespace selectors ----------------------------------


def test_default_deny_ingress_isolates_one_namespace_on_both_families(model: Lab) -> None:
    model.apply(policy("x", "deny-ingress", {"podSelector": {}}))
    want = everything()
    want.expect_peer(Peer(), Peer("x"), False)
    model.check(want, ("80/TCP", "81/UDP"))
    model.check(want, ("80/TCP", "81/UDP"), family=4)


def test_default_deny_all_blocks_both_directions(model: Lab) -> None:
    model.apply(policy("x", "deny-all", {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}))
    want = everything()
    want.expect_peer(Peer(), Peer("x"), False)
    want.expect_peer(Peer("x"), Peer(), False)
    model.check(want)


def test_pod_selector_allows_one_pod_of_the_namespace(model: Lab) -> None:
    model.apply(
        policy(
            "x",
            "a-from-b",
            {"podSelector": pods_labelled("a"), "ingress": [{"from": [{"podSelector": pods_labelled("b")}]}]},
        )
    )
    want = everything()
    want.expect_all_ingress("x/a", False)
    want.expect("x/b", "x/a", True)
    model.check(want)


def test_empty_selectors_in_a_peer_allow_every_pod_of_every_namespace(model: Lab) -> None:
    model.apply(
        policy("x", "deny", {"podSelector": {}}),
        policy(
            "x",
            "all-to-a",
            {"podSelector": pods_labelled("a"), "ingress": [{"from": [{"podSelector": {}, "namespaceSelector": {}}]}]},
        ),
    )
    want = everything()
    want.expect_all_ingress("x/b", False)
    want.expect_all_ingress("x/c", False)
    model.check(want)


def test_namespace_selector_match_labels(model: Lab) -> None:
    model.apply(
        policy(
            "x",
            "a-from-y",
            {
                "podSelector": pods_labelled("a"),
                "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]}],
            },
        )
    )
    want = everything()
    want.expect_all_ingress("x/a", False)
    want.expect_peer(Peer("y"), Peer("x", "a"), True)
    model.check(want)


def test_pod_selector_match_expressions_in(model: Lab) -> None:
    selector = {"matchExpressions": [{"key": "pod", "operator": "In", "values": ["b", "c"]}]}
    model.apply(
        policy(
            "x", "a-from-b-c", {"podSelector": pods_labelled("a"), "ingress": [{"from": [{"podSelector": selector}]}]}
        )
    )
    want = everything()
    want.expect_all_ingress("x/a", False)
    want.expect("x/b", "x/a", True)
    want.expect("x/c", "x/a", True)
    model.check(want)


def test_namespace_selector_not_in_on_the_name_label_or_a_pod_selector(model: Lab) -> None:
    not_x = {"matchExpressions": [{"key": NS_LABEL, "operator": "NotIn", "values": ["x"]}]}
    model.apply(
        policy(
            "x",
            "a-from-others-or-b",
            {
                "podSelector": pods_labelled("a"),
                "ingress": [{"from": [{"namespaceSelector": not_x}, {"podSelector": pods_labelled("b")}]}],
            },
        )
    )
    want = everything()
    want.expect("x/c", "x/a", False)
    model.check(want)


def test_pod_and_namespace_selector_in_one_peer_are_anded(model: Lab) -> None:
    not_x = {"matchExpressions": [{"key": NS_LABEL, "operator": "NotIn", "values": ["x"]}]}
    model.apply(
        policy(
            "x",
            "a-from-b-elsewhere",
            {
                "podSelector": pods_labelled("a"),
                "ingress": [{"from": [{"namespaceSelector": not_x, "podSelector": pods_labelled("b")}]}],
            },
        )
    )
    want = everything()
    want.expect_all_ingress("x/a", False)
    want.expect("y/b", "x/a", True)
    want.expect("z/b", "x/a", True)
    model.check(want)


def test_exists_and_does_not_exist(model: Lab) -> None:
    targets = {"matchExpressions": [{"key": "pod", "operator": "Exists"}, {"key": "role", "operator": "DoesNotExist"}]}
    sources = {"matchExpressions": [{"key": "pod", "operator": "NotIn", "values": ["a"]}]}
    model.apply(policy("z", "z-from-b-c", {"podSelector": targets, "ingress": [{"from": [{"podSelector": sources}]}]}))
    want = everything()
    want.expect_peer(Peer(), Peer("z"), False)
    want.expect_peer(Peer("z", "b"), Peer("z"), True)
    want.expect_peer(Peer("z", "c"), Peer("z"), True)
    model.check(want)


def test_several_policies_are_ored(model: Lab) -> None:
    model.apply(
        policy(
            "x",
            "a-from-b",
            {"podSelector": pods_labelled("a"), "ingress": [{"from": [{"podSelector": pods_labelled("b")}]}]},
        ),
        policy(
            "x",
            "a-from-z",
            {
                "podSelector": pods_labelled("a"),
                "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "z"}}}]}],
            },
        ),
    )
    want = everything()
    want.expect_all_ingress("x/a", False)
    want.expect("x/b", "x/a", True)
    want.expect_peer(Peer("z"), Peer("x", "a"), True)
    model.check(want)


# ---- ports -------------------------------------------------------------------------


def test_a_rule_with_ports_and_no_peers_allows_only_those_ports(model: Lab) -> None:
    model.apply(policy("x", "a-on-81", {"podSelector": pods_labelled("a"), "ingress": [{"ports": [{"port": 81}]}]}))
    blocked = everything()
    blocked.expect_all_ingress("x/a", False)
    model.check(blocked, ("80/TCP", "80/UDP", "81/UDP"))
    model.check(everything(), ("81/TCP",))


def test_named_port_resolves_on_the_destination_pod(model: Lab) -> None:
    model.apply(
        policy(
            "x",
            "a-on-name",
            {"podSelector": pods_labelled("a"), "ingress": [{"ports": [{"port": "serve-81-udp", "protocol": "UDP"}]}]},
        )
    )
    blocked = everything()
    blocked.expect_all_ingress("x/a", False)
    model.check(everything(), ("81/UDP",))
    model.check(blocked, ("80/UDP", "81/TCP"))


def test_end_port_range(model: Lab) -> None:
    model.apply(
        policy(
            "x",
            "a-range",
            {
                "podSelector": pods_labelled("a"),
                "ingress": [
                    {
                        "from": [{"podSelector": pods_labelled("b")}],
                        "ports": [{"port": 80, "endPort": 81, "protocol": "TCP"}],
                    }
                ],
            },
        )
    )
    want = everything()
    want.expect_all_ingress("x/a", False)
    want.expect("x/b", "x/a", True)
    model.check(want, ("80/TCP", "81/TCP"))
    udp = everything()
    udp.expect_all_ingress("x/a", False)
    model.check(udp, ("80/UDP",))


def test_protocol_without_port_means_every_port_of_it(model: Lab) -> None:
    model.apply(
        policy("x", "a-udp", {"podSelector": pods_labelled("a"), "ingress": [{"ports": [{"protocol": "UDP"}]}]})
    )
    tcp = everything()
    tcp.expect_all_ingress("x/a", False)
    model.check(everything(), ("80/UDP", "81/UDP"))
    model.check(tcp, ("80/TCP",))


# ---- egress, ipBlock, both directions ------------------------------------------


def test_egress_to_a_pod_in_another_namespace(model: Lab) -> None:
    to = {"namespaceSelector": {"matchLabels": {"ns": "y"}}, "podSelector": pods_labelled("b")}
    model.apply(
        policy(
            "x", "a-to-y-b", {"podSelector": pods_labelled("a"), "policyTypes": ["Egress"], "egress": [{"to": [to]}]}
        )
    )
    want = everything()
    want.expect_all_egress("x/a", False)
    want.expect("x/a", "y/b", True)
    model.check(want, ("80/TCP", "81/UDP"))


def test_egress_only_policy_denies_egress_and_replies_still_pass(model: Lab) -> None:
    # y's pods may not start connections, but answer the ones others start (conntrack).
    model.apply(policy("y", "no-egress", {"podSelector": {}, "policyTypes": ["Egress"]}))
    want = everything()
    want.expect_peer(Peer("y"), Peer(), False)
    model.check(want, ("80/TCP", "80/UDP"))


def test_egress_ip_block_with_except_ipv6(model: Lab) -> None:
    node2_pods = str(model.plan.node("node2").cidr6)
    block = {"cidr": node2_pods, "except": [model.address("y/b", 6) + "/128"]}
    model.apply(
        policy(
            "x",
            "a-to-node2",
            {"podSelector": pods_labelled("a"), "policyTypes": ["Egress"], "egress": [{"to": [{"ipBlock": block}]}]},
        )
    )
    want = everything()
    want.expect_all_egress("x/a", False)
    want.expect("x/a", "x/b", True)
    want.expect("x/a", "z/b", True)
    model.check(want)


def test_ingress_ip_block_with_except_ipv4(model: Lab) -> None:
    node1_pods = str(model.plan.node("node1").cidr4)
    block = {"cidr": node1_pods, "except": [model.address("z/c", 4) + "/32"]}
    model.apply(
        policy("x", "a-from-node1", {"podSelector": pods_labelled("a"), "ingress": [{"from": [{"ipBlock": block}]}]})
    )
    want = everything()
    want.expect_all_ingress("x/a", False)
    for ns in MODEL.namespaces:
        for pod in ("a", "c"):
            if f"{ns}/{pod}" != "z/c":
                want.expect(f"{ns}/{pod}", "x/a", True)
    model.check(want, ("80/TCP",), family=4)
    # The IPv4 block says nothing about IPv6 sources: x/a takes none.
    v6 = everything()
    v6.expect_all_ingress("x/a", False)
    model.check(v6, ("80/TCP",), family=6)


def test_a_connection_needs_the_source_egress_and_the_destination_ingress(model: Lab) -> None:
    model.apply(
        policy(
            "x",
            "a-from-b",
            {"podSelector": pods_labelled("a"), "ingress": [{"from": [{"podSelector": pods_labelled("b")}]}]},
        ),
        policy("x", "b-no-egress", {"podSelector": pods_labelled("b"), "policyTypes": ["Egress"]}),
    )
    want = everything()
    want.expect_all_ingress("x/a", False)
    want.expect_all_egress("x/b", False)
    model.check(want)


# ---- nodes ---------------------------------------------------------------------------


def test_node_to_own_pods_is_always_allowed_under_default_deny(model: Lab) -> None:
    model.apply(policy("x", "deny-all", {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}))
    for family in ("6", "4"):
        for source, target, connected in (
            ("node1", "x/a", True),  # its own pod (kubelet probes)
            ("node2", "x/b", True),
            ("node1", "x/b", False),  # another node is no exception
            ("node2", "x/c", False),
        ):
            proc = model.cli("probe", source, target, "80/TCP", "--family", family, "--json")
            assert proc.returncode == (0 if connected else 1), (source, target, family, proc.stdout, proc.stderr)
            assert json.loads(proc.stdout)["connected"] is connected
    # Between pods the policy holds: the probe says blocked (exit 1), not an error (exit 2).
    proc = model.cli("probe", "x/a", "x/b", "80/TCP")
    assert proc.returncode == 1, proc.stdout


# ---- updates --------------------------------------------------------------------------


def test_policy_replaced(model: Lab) -> None:
    spec = {"podSelector": pods_labelled("a"), "ingress": [{"from": [{"podSelector": pods_labelled("b")}]}]}
    model.apply(policy("x", "a-from", spec))
    want = everything()
    want.expect_all_ingress("x/a", False)
    want.expect("x/b", "x/a", True)
    model.check(want)
    spec["ingress"][0]["from"][0]["podSelector"] = pods_labelled("c")
    model.apply(policy("x", "a-from", spec))
    want.expect("x/b", "x/a", False)
    want.expect("x/c", "x/a", True)
    model.check(want)


def test_pod_labels_changed(model: Lab) -> None:
    model.apply(
        policy(
            "x",
            "a-from-b",
            {"podSelector": pods_labelled("a"), "ingress": [{"from": [{"podSelector": pods_labelled("b")}]}]},
        )
    )
    model.ok("pod", "label", "x/c", "pod=b")  # x/c becomes an allowed peer
    model.wait()
    want = everything()
    want.expect_all_ingress("x/a", False)
    want.expect("x/b", "x/a", True)
    want.expect("x/c", "x/a", True)
    model.check(want)
    model.ok("pod", "label", "x/a", "--remove", "pod")  # x/a is selected by nothing any more
    model.wait()
    model.check(everything())


def test_namespace_labels_changed(model: Lab) -> None:
    model.apply(
        policy(
            "x",
            "a-from-blue",
            {
                "podSelector": pods_labelled("a"),
                "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "blue"}}}]}],
            },
        )
    )
    want = everything()
    want.expect_all_ingress("x/a", False)
    model.check(want)
    model.ok("ns", "label", "z", "team=blue")
    model.wait()
    want.expect_peer(Peer("z"), Peer("x", "a"), True)
    model.check(want)
    model.ok("ns", "label", "z", "--remove", "team")
    model.wait()
    want.expect_peer(Peer("z"), Peer("x", "a"), False)
    model.check(want)


def test_policy_deleted(model: Lab) -> None:
    model.apply(policy("x", "deny", {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}))
    want = everything()
    want.expect_peer(Peer(), Peer("x"), False)
    want.expect_peer(Peer("x"), Peer(), False)
    model.check(want, ("81/UDP",))
    model.delete("x", "deny")
    model.check(everything(), ("81/UDP",))


def test_a_new_pod_is_allowed_by_the_time_its_add_returns(model: Lab) -> None:
    model.apply(
        policy(
            "x",
            "a-from-new",
            {"podSelector": pods_labelled("a"), "ingress": [{"from": [{"podSelector": pods_labelled("new")}]}]},
        )
    )
    ports = [arg for port in MODEL.port_args() for arg in ("--port", port)]
    model.ok("pod", "add", "node1", "x/d", "--label", "pod=new", *ports)
    try:
        # No policy wait: ADD returns once this node's rules and sets hold the new pod.
        assert model.cli("probe", "x/d", "x/a", "80/TCP").returncode == 0
        assert model.cli("probe", "x/b", "x/a", "80/TCP").returncode == 1
    finally:
        model.ok("pod", "del", "x/d")


# ---- SCTP ------------------------------------------------------------------------------


def _ruleset(lab: Lab, node: str) -> str:
    """flock's table on *node* ("" when there is none: nothing on the node is isolated)."""

    def nft(*args: str) -> str:
        netns = lab.plan.node(node).netns
        return subprocess.run(
            ["ip", "netns", "exec", netns, "nft", *args], capture_output=True, text=True, check=True
        ).stdout

    if "table inet flock" not in nft("list", "tables").splitlines():
        return ""
    return nft("list", "table", "inet", "flock")


def test_sctp_rules_are_loaded_in_the_kernel(model: Lab) -> None:
    # This kernel has no SCTP sockets to probe with: the rules themselves are checked.
    before = _ruleset(model, "node1")
    assert "sctp" not in before
    model.apply(
        policy(
            "x",
            "a-sctp",
            {"podSelector": pods_labelled("a"), "ingress": [{"ports": [{"port": 9732, "protocol": "SCTP"}]}]},
        )
    )
    after = _ruleset(model, "node1")
    assert "sctp" in after and "9732" in after, after
    assert "9732" not in _ruleset(model, "node2")  # x/a lives on node1
    blocked = everything()
    blocked.expect_all_ingress("x/a", False)
    model.check(blocked, ("80/TCP",))
    model.delete("x", "a-sctp")
    assert "9732" not in _ruleset(model, "node1")
