"""from_object: Kubernetes objects → policy values, defaulted and validated as the API server does."""

from __future__ import annotations

import ipaddress

import pytest
import trio
import trio.testing

from flock.model import InvalidObject
from flock.policy import (
    Direction,
    IPBlock,
    Kind,
    LabelSelector,
    NamedPort,
    Namespace,
    NetworkPolicy,
    Operator,
    PolicyInputs,
    PolicyPod,
    PolicyPort,
    Protocol,
    Requirement,
)


def _np(spec: dict, ns: str = "x", name: str = "p") -> NetworkPolicy:
    return NetworkPolicy.from_object({"metadata": {"namespace": ns, "name": name}, "spec": spec})


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        ({"podSelector": {}}, {Direction.INGRESS}),
        ({"podSelector": {}, "ingress": [{}]}, {Direction.INGRESS}),
        ({"podSelector": {}, "egress": [{}]}, {Direction.INGRESS, Direction.EGRESS}),
        ({"podSelector": {}, "egress": []}, {Direction.INGRESS}),  # an empty list is no egress section
        ({"podSelector": {}, "policyTypes": ["Egress"]}, {Direction.EGRESS}),
        ({"podSelector": {}, "policyTypes": ["Egress"], "ingress": [{}]}, {Direction.EGRESS}),
        ({"podSelector": {}, "policyTypes": []}, {Direction.INGRESS}),
    ],
)
def test_policy_types_default_as_the_api_server_does(spec: dict, want: set) -> None:
    assert _np(spec).policy_types == want


def test_a_full_policy_normalizes() -> None:
    p = _np(
        {
            "podSelector": {"matchLabels": {"app": "web"}},
            "ingress": [
                {
                    "from": [
                        {
                            "podSelector": {
                                "matchExpressions": [{"key": "role", "operator": "In", "values": ["b", "a"]}]
                            }
                        },
                        {"namespaceSelector": {}, "podSelector": {"matchLabels": {"x": "y"}}},
                        {"ipBlock": {"cidr": "2001:db8::/32", "except": ["2001:db8:1::/48"]}},
                    ],
                    "ports": [{"port": 80}, {"protocol": "UDP", "port": "dns"}, {"port": 1000, "endPort": 2000}],
                }
            ],
        }
    )
    assert p.key == "x/p"
    assert p.pod_selector == LabelSelector((("app", "web"),))
    rule = p.ingress[0]
    assert rule.peers[0].pod_selector == LabelSelector((), (Requirement("role", Operator.IN, ("a", "b")),))
    assert rule.peers[0].namespace_selector is None
    assert rule.peers[1].namespace_selector == LabelSelector()
    assert rule.peers[2].ip_block == IPBlock(
        ipaddress.ip_network("2001:db8::/32"), (ipaddress.ip_network("2001:db8:1::/48"),)
    )
    assert rule.ports == (
        PolicyPort(Protocol.TCP, 80),
        PolicyPort(Protocol.UDP, "dns"),
        PolicyPort(Protocol.TCP, 1000, 2000),
    )


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"podSelector": {"matchLabels": "app"}}, "spec.podSelector.matchLabels"),
        ({"podSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}, "values"),
        ({"podSelector": {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}}, "values"),
        ({"podSelector": {"matchExpressions": [{"key": "a", "operator": "Near"}]}}, "operator"),
        ({"ingress": [{"from": [{}]}]}, "spec.ingress[0].from[0]"),
        ({"ingress": [{"from": [{"ipBlock": {"cidr": "2001:db8::/32"}, "podSelector": {}}]}]}, "from[0]"),
        ({"ingress": [{"from": [{"ipBlock": {"cidr": "2001:db8::"}}]}]}, "ipBlock.cidr"),
        ({"ingress": [{"from": [{"ipBlock": {"cidr": "fe80::%eth0/64"}}]}]}, "ipBlock.cidr"),
        ({"ingress": [{"from": [{"ipBlock": {"cidr": "2001:db8::/32", "except": ["10.0.0.0/8"]}}]}]}, "except[0]"),
        ({"ingress": [{"from": [{"ipBlock": {"cidr": "2001:db8::/32", "except": ["2001:db9::/48"]}}]}]}, "except[0]"),
        ({"ingress": [{"from": [{"ipBlock": {"cidr": "2001:db8::/32", "except": ["2001:db8::/32"]}}]}]}, "except[0]"),
        ({"ingress": [{"ports": [{"protocol": "ICMP"}]}]}, "protocol"),
        ({"ingress": [{"ports": [{"port": 0}]}]}, "port"),
        ({"ingress": [{"ports": [{"port": 65536}]}]}, "port"),
        ({"ingress": [{"ports": [{"port": True}]}]}, "port"),
        ({"ingress": [{"ports": [{"port": "Bad_Name"}]}]}, "port"),
        ({"ingress": [{"ports": [{"port": "; drop"}]}]}, "port"),
        ({"ingress": [{"ports": [{"port": "http", "endPort": 90}]}]}, "endPort"),
        ({"ingress": [{"ports": [{"port": 90, "endPort": 80}]}]}, "endPort"),
        ({"ingress": [{"ports": [{"endPort": 80}]}]}, "endPort"),
        ({"ingress": {"from": []}}, "spec.ingress"),
        ({"policyTypes": ["Sideways"]}, "policyTypes[0]"),
    ],
)
def test_invalid_policies_name_the_field(spec: dict, field: str) -> None:
    with pytest.raises(InvalidObject) as err:
        _np(spec)
    assert field in err.value.field
    assert "x/p" in str(err.value)


def test_port_details() -> None:
    assert PolicyPort.from_object({"port": "8080"}) == PolicyPort(Protocol.TCP, 8080)  # intstr "8080"
    assert PolicyPort.from_object({"port": 80, "endPort": 80}) == PolicyPort(Protocol.TCP, 80)
    assert PolicyPort.from_object({"protocol": "SCTP"}) == PolicyPort(Protocol.SCTP, None)


def test_ipblock_masks_host_bits_and_matches_by_family() -> None:
    b = IPBlock.from_object({"cidr": "192.0.2.7/24", "except": ["192.0.2.128/25"]})
    assert str(b.cidr) == "192.0.2.0/24"
    assert b.contains(ipaddress.ip_address("192.0.2.1"))
    assert not b.contains(ipaddress.ip_address("192.0.2.200"))
    assert not b.contains(ipaddress.ip_address("2001:db8::1"))


@pytest.mark.parametrize(
    ("op", "values", "labels", "want"),
    [
        ("In", ["a", "b"], {"k": "a"}, True),
        ("In", ["a"], {"k": "c"}, False),
        ("In", ["a"], {}, False),
        ("NotIn", ["a"], {"k": "c"}, True),
        ("NotIn", ["a"], {}, True),
        ("NotIn", ["a"], {"k": "a"}, False),
        ("Exists", [], {"k": ""}, True),
        ("Exists", [], {}, False),
        ("DoesNotExist", [], {}, True),
        ("DoesNotExist", [], {"k": "a"}, False),
    ],
)
def test_selector_operators(op: str, values: list, labels: dict, want: bool) -> None:
    expr: dict = {"key": "k", "operator": op}
    if values:
        expr["values"] = values
    sel = LabelSelector.from_object({"matchExpressions": [expr]})
    assert sel.matches(labels) is want


def test_selector_and_of_labels_and_expressions() -> None:
    sel = LabelSelector.from_object(
        {"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}
    )
    assert sel.matches({"app": "web"})
    assert not sel.matches({"app": "web", "tier": "x"})
    assert not sel.matches({"tier": "x"})
    assert LabelSelector.from_object({}).matches({}) and LabelSelector.from_object(None).is_empty


def test_namespace_gets_its_name_label() -> None:
    ns = Namespace.from_object({"metadata": {"name": "shop", "labels": {"team": "a"}}})
    assert ns.label_map == {"team": "a", "kubernetes.io/metadata.name": "shop"}
    with pytest.raises(InvalidObject):
        Namespace.from_object({"metadata": {"name": "shop", "labels": {"team": 3}}})


def test_pod_from_object() -> None:
    pod = PolicyPod.from_object(
        {
            "metadata": {"namespace": "x", "name": "a", "labels": {"app": "a"}, "resourceVersion": "7"},
            "spec": {
                "nodeName": "n1",
                "containers": [
                    {"name": "c", "ports": [{"name": "http", "containerPort": 80}, {"containerPort": 81}]},
                    {"name": "d", "ports": [{"name": "dns", "containerPort": 53, "protocol": "UDP"}]},
                ],
            },
            "status": {"podIPs": [{"ip": "2001:db8:1::5"}, {"ip": "192.0.2.5"}, {"ip": "fe80::1%eth0"}]},
        }
    )
    assert pod.key == "x/a" and pod.node == "n1" and pod.host_veth is None and pod.selectable
    assert [str(a) for a in pod.addresses] == ["2001:db8:1::5", "192.0.2.5"]
    assert pod.named_ports == (NamedPort("http", Protocol.TCP, 80), NamedPort("dns", Protocol.UDP, 53))
    assert pod.resolve("dns", Protocol.UDP) == 53 and pod.resolve("dns", Protocol.TCP) is None
    host = PolicyPod.from_object({"metadata": {"name": "h"}, "spec": {"hostNetwork": True}})
    done = PolicyPod.from_object({"metadata": {"name": "d"}, "status": {"phase": "Succeeded", "podIP": "192.0.2.9"}})
    assert not host.selectable and not done.selectable and done.addresses == (ipaddress.ip_address("192.0.2.9"),)


async def test_inputs_wake_readers_once_per_burst_and_skip_no_ops() -> None:
    inputs = PolicyInputs()
    assert not inputs.snapshot().complete
    seen: list[int] = []

    async def reader() -> None:
        snap = await inputs.wait_changed(0)
        seen.append(snap.generation)

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            await trio.testing.wait_all_tasks_blocked()
            inputs.set_namespace(Namespace("x"))
            inputs.set_namespace(Namespace("y"))
    assert seen == [2]
    inputs.set_namespace(Namespace("x"))  # equal: no change
    assert inputs.snapshot().generation == 2
    for kind in Kind:
        inputs.replace(kind, {})
    assert inputs.snapshot().complete
    assert set(inputs.snapshot().namespaces) == set()
    inputs.set_pod(PolicyPod("x", "a"))
    inputs.delete(Kind.POD, "x/a")
    inputs.delete(Kind.POD, "x/a")
    assert inputs.snapshot().pods == {}


# ---- ClusterNetworkPolicy ------------------------------------------------------------------------


def _cnp_doc(**spec: object) -> dict:
    base: dict = {"tier": "Admin", "priority": 10, "subject": {"namespaces": {}}}
    return {"metadata": {"name": "c", "resourceVersion": "7"}, "spec": {**base, **spec}}


def test_a_cluster_network_policy_is_read_with_every_peer_and_protocol() -> None:
    from flock.policy import Action, ClusterNetworkPolicy, ClusterPort, Tier

    cnp = ClusterNetworkPolicy.from_object(
        _cnp_doc(
            tier="Baseline",
            subject={"pods": {"namespaceSelector": {"matchLabels": {"t": "x"}}, "podSelector": {}}},
            ingress=[{"name": "in", "action": "Pass", "from": [{"namespaces": {}}, {"pods": {"podSelector": {}}}]}],
            egress=[
                {
                    "action": "Deny",
                    "to": [{"networks": ["2001:db8::1/32", "192.0.2.0/24", "2001:db8::/32"]}, {"nodes": {}}],
                    "protocols": [
                        {"tcp": {"destinationPort": {"number": 80}}},
                        {"udp": {"destinationPort": {"range": {"start": 53, "end": 54}}}},
                        {"destinationNamedPort": "http"},
                    ],
                }
            ],
        )
    )
    assert cnp.tier is Tier.BASELINE and cnp.priority == 10 and cnp.resource_version == "7"
    assert cnp.subject_pods is not None and cnp.uses_nodes and cnp.unreadable_rules() == []
    assert [str(n) for n in cnp.egress[0].peers[0].networks] == ["192.0.2.0/24", "2001:db8::/32"]  # masked, once
    assert cnp.egress[0].protocols == (
        ClusterPort(Protocol.TCP, 80, 80),
        ClusterPort(Protocol.UDP, 53, 54),
        ClusterPort(named="http"),
    )
    assert cnp.ingress[0].action is Action.PASS and cnp.ingress[0].name == "in"


@pytest.mark.parametrize(
    "spec, field",
    [
        ({"tier": "Tenant"}, "spec.tier"),
        ({"tier": "x" * 100_000}, "spec.tier"),
        ({"priority": 1001}, "spec.priority"),
        ({"priority": True}, "spec.priority"),
        ({"priority": "5"}, "spec.priority"),
        ({"subject": {"namespaces": {}, "pods": {"podSelector": {}}}}, "spec.subject"),
        ({"subject": {"services": {}}}, "spec.subject"),
        ({"subject": {"namespaces": {"matchExpressions": [{"key": "k", "operator": "Near"}]}}}, "spec.subject"),
        ({"ingress": [{"action": "Deny", "from": [{"namespaces": {}}]}] * 26}, "spec.ingress"),
    ],
)
def test_a_cluster_network_policy_flock_cannot_place_is_refused_naming_the_field(spec, field) -> None:
    from flock.policy import ClusterNetworkPolicy

    with pytest.raises(InvalidObject) as err:
        ClusterNetworkPolicy.from_object(_cnp_doc(**spec))
    assert err.value.field.startswith(field) and len(str(err.value)) < 400


@pytest.mark.parametrize(
    "rule, why",
    [
        ({"action": "Deny", "to": [{"services": {"name": "x"}}]}, "'services' is no egress peer"),
        ({"action": "Deny", "to": [{"networks": ["::/0"], "nodes": {}}]}, "exactly one field expected"),
        ({"action": "Accept", "to": [{"domainNames": ["example.org"]}]}, "does not implement domain name"),
        ({"action": "Pass", "to": [{"nodes": {}}], "protocols": [{"tcp": {}}]}, "expected destinationPort"),
        ({"action": "Deny", "to": [{"nodes": {}}], "protocols": [{"icmp": {"type": 8}}]}, "no protocol match"),
        (
            {"action": "Deny", "to": [{"nodes": {}}], "protocols": [{"tcp": {"destinationPort": {"range": {"start": 9, "end": 9}}}}]},
            "start < end",
        ),
        ({"action": "Deny", "to": [{"networks": ["2001:db8::/129"]}]}, "is not a CIDR"),
        ({"action": "Deny", "to": [{"networks": ["x" * 5000]}]}, "is not a CIDR"),
        ({"action": "Log", "to": [{"nodes": {}}]}, "action 'Log' unknown"),
        ({"action": "Deny", "to": []}, "1-25 peers"),
    ],
)  # fmt: skip
def test_a_rule_flock_cannot_read_fails_closed_and_says_why(rule, why) -> None:
    from flock.policy import Action, ClusterNetworkPolicy

    cnp = ClusterNetworkPolicy.from_object(_cnp_doc(egress=[rule, {"action": "Accept", "to": [{"nodes": {}}]}]))
    first, second = cnp.egress
    assert why in first.unreadable and len(first.unreadable) < 300
    assert first.action is (Action.DENY if rule["action"] == "Log" else Action(rule["action"]))
    assert not second.unreadable  # the rest of the policy is read and applied
    assert cnp.unreadable_rules() == [f"spec.egress[0]: {first.unreadable}"]


def test_a_node_keeps_its_labels_and_ip_addresses_only() -> None:
    from flock.policy import PolicyNode

    node = PolicyNode.from_object(
        {
            "metadata": {"name": "n1", "labels": {"zone": "a"}},
            "status": {
                "addresses": [
                    {"type": "Hostname", "address": "n1"},
                    {"type": "InternalIP", "address": "2001:db8::10"},
                    {"type": "ExternalIP", "address": "192.0.2.1"},
                    {"type": "InternalIP", "address": "2001:db8::10"},
                    "junk",
                ],
                "conditions": [{"type": "Ready"}],
            },
        }
    )
    assert node.label_map == {"zone": "a"}
    assert [str(a) for a in node.addresses] == ["192.0.2.1", "2001:db8::10"]
