"""Address groups (flock-controller's planner): a node that knows only its own pods and the members of the
groups it needs compiles exactly the ruleset it compiles knowing every pod; followed change by change, the
planner stays equal to one built afresh."""

from __future__ import annotations

import ipaddress
import random

import attrs
import pytest

from flock.fnv import fnv1a_32
from flock.policy import (
    ClusterNetworkPolicy,
    Kind,
    NamedPort,
    Namespace,
    NetworkPolicy,
    PolicyInputs,
    PolicyPod,
    Protocol,
    compile_ruleset,
)
from flock.policy._groups import GroupPlanner, NamedSelection, group_name

NODES = ("n1", "n2", "n3")
SPACES = ("x", "y", "z")


def ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text)


def netpol(ns: str, name: str, spec: dict) -> NetworkPolicy:
    return NetworkPolicy.from_object({"metadata": {"namespace": ns, "name": name}, "spec": spec})


def cnp(name: str, tier: str, priority: int, subject: dict, **rules: list[dict]) -> ClusterNetworkPolicy:
    spec = {"tier": tier, "priority": priority, "subject": subject, **rules}
    return ClusterNetworkPolicy.from_object({"metadata": {"name": name}, "spec": spec})


POLICIES: list[NetworkPolicy | ClusterNetworkPolicy] = [
    netpol("x", "isolate", {"podSelector": {}}),
    netpol(
        "x",
        "db-from-web",
        {
            "podSelector": {"matchLabels": {"app": "db"}},
            "ingress": [
                {"from": [{"podSelector": {"matchLabels": {"app": "web"}}}]},
                {"from": [{"namespaceSelector": {"matchLabels": {"team": "t1"}}}], "ports": [{"port": "sql"}]},
            ],
        },
    ),
    netpol(
        "y",
        "egress",
        {
            "podSelector": {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["db"]}]},
            "policyTypes": ["Egress"],
            "egress": [
                {"to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "dns"}}}]},
                {"ports": [{"port": "sql"}]},  # a named port, no peer: every pod declaring it
                {"to": [{"podSelector": {"matchLabels": {"app": "web"}}}], "ports": [{"port": "http"}]},
            ],
        },
    ),
    netpol(
        "z",
        "pinned",
        {
            "podSelector": {"matchLabels": {"app": "web"}},
            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "x"}}}]}],
        },
    ),
    netpol(
        "z",
        "not-db-nor-tiered",
        {
            "podSelector": {},
            "ingress": [
                {
                    "from": [
                        {
                            "namespaceSelector": {},
                            "podSelector": {
                                "matchExpressions": [
                                    {"key": "tier", "operator": "DoesNotExist"},
                                    {"key": "app", "operator": "NotIn", "values": ["db"]},
                                ]
                            },
                        }
                    ]
                }
            ],
        },
    ),
    cnp(
        "admin",
        "Admin",
        10,
        {"namespaces": {"matchLabels": {"team": "t2"}}},
        ingress=[
            {
                "action": "Deny",
                "from": [{"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "web"}}}}],
            }
        ],
    ),
    cnp(
        "baseline",
        "Baseline",
        1,
        {"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "db"}}}},
        egress=[{"action": "Deny", "to": [{"namespaces": {"matchLabels": {"team": "t1"}}}]}],
    ),
]
LABELS = ({"app": "web"}, {"app": "db"}, {"app": "dns"}, {"app": "web", "tier": "a"}, {})
PORTS = ((), (NamedPort("sql", Protocol.TCP, 5432),), (NamedPort("http", Protocol.TCP, 80),))


def walk_pod(rnd: random.Random, ns: str, name: str) -> PolicyPod:
    """A pod; some carry labels no selector reads (``version``): groups list them without."""
    n = rnd.randrange(80)
    addresses: tuple = (ip(f"2001:db8:{n % 3}::{n:x}"),)
    if rnd.random() < 0.2:
        addresses += (ip(f"192.0.2.{n}"),)
    return PolicyPod(
        ns,
        name,
        {**rnd.choice(LABELS), **({"version": f"v{n % 4}"} if rnd.random() < 0.5 else {})},
        () if rnd.random() < 0.1 else addresses,
        rnd.choice(PORTS),
        node=rnd.choice(NODES) if rnd.random() > 0.05 else "",
        selectable=rnd.random() > 0.05,
    )


def attached(pod: PolicyPod) -> PolicyPod:
    return attrs.evolve(pod, host_veth=f"flock{fnv1a_32(pod.key):08x}", selectable=True)


def local_pods(inputs: PolicyInputs, node: str) -> list[PolicyPod]:
    return [attached(p) for p in inputs.pods.values() if p.node == node and p.addresses and p.selectable]


def compile_for(inputs: PolicyInputs, node: str, pods: list[PolicyPod]):
    return compile_ruleset(
        inputs.policies.values(),
        inputs.namespaces.values(),
        pods,
        local_pods(inputs, node),
        inputs.cluster_policies.values(),
    )


def agents_view(inputs: PolicyInputs, planner: GroupPlanner, node: str) -> list[PolicyPod]:
    """What an agent on *node* knows: its own pods (watched by spec.nodeName) and its groups' members."""
    known = {p.key: p for p in inputs.pods.values() if p.node == node}
    for name in planner.needs.get(node, ()):
        group = planner.group(name)
        assert group is not None, f"{node} needs {name}, which is not maintained"
        for key, member in group.members.items():
            known.setdefault(key, member)
    return list(known.values())


def check(inputs: PolicyInputs, planner: GroupPlanner) -> None:
    fresh = GroupPlanner(inputs)
    fresh.load()
    assert dict(planner.needs) == dict(fresh.needs)
    assert planner.groups.keys() == fresh.groups.keys()
    for name, group in fresh.groups.items():
        assert planner.groups[name].members == group.members, name
        assert planner.groups[name].users == group.users
    for node in NODES:
        assert compile_for(inputs, node, agents_view(inputs, planner, node)) == compile_for(
            inputs, node, list(inputs.pods.values())
        ), node


def cluster(rnd: random.Random) -> PolicyInputs:
    inputs = PolicyInputs()
    inputs.replace(Kind.NETWORK_POLICY, {p.key: p for p in POLICIES[:2] if isinstance(p, NetworkPolicy)})
    inputs.replace(Kind.CLUSTER_POLICY, {})
    inputs.replace(Kind.NAMESPACE, {n: Namespace(n, {"team": rnd.choice(["t1", "t2"])}) for n in SPACES})
    pods = [walk_pod(rnd, rnd.choice(SPACES), f"p{i}") for i in range(90)]
    inputs.replace(Kind.POD, {p.key: p for p in pods})
    return inputs


@pytest.mark.parametrize("seed", range(5))
def test_a_random_walk_keeps_every_agents_view_enough_and_the_planner_fresh(seed: int) -> None:
    rnd = random.Random(seed)
    inputs = cluster(rnd)
    journal = inputs.journal()
    planner = GroupPlanner(inputs)
    planner.load()
    planner.drain()
    check(inputs, planner)
    for _ in range(80):
        for _ in range(rnd.choice([1, 1, 3, 10])):
            what = rnd.random()
            if what < 0.75:
                key = f"{rnd.choice(SPACES)}/p{rnd.randrange(100)}"
                if rnd.random() < 0.1:
                    inputs.delete(Kind.POD, key)
                else:
                    inputs.set_pod(walk_pod(rnd, *key.split("/")))
            elif what < 0.88:
                name = rnd.choice(SPACES)
                if rnd.random() < 0.1:
                    inputs.delete(Kind.NAMESPACE, name)
                else:
                    inputs.set_namespace(Namespace(name, {"team": rnd.choice(["t1", "t2"])}))
            else:
                pol = rnd.choice(POLICIES)
                kind = Kind.NETWORK_POLICY if isinstance(pol, NetworkPolicy) else Kind.CLUSTER_POLICY
                table = inputs.policies if kind is Kind.NETWORK_POLICY else inputs.cluster_policies
                if pol.key in table and rnd.random() < 0.5:
                    inputs.delete(kind, pol.key)
                elif kind is Kind.NETWORK_POLICY:
                    inputs.set_policy(pol)  # type: ignore[arg-type]
                else:
                    inputs.set_cluster_policy(pol)  # type: ignore[arg-type]
        planner.update(journal.drain())
        planner.drain()
        check(inputs, planner)


def test_drain_hands_over_members_that_moved_and_nodes_whose_needs_changed() -> None:
    inputs = PolicyInputs()
    inputs.replace(Kind.NETWORK_POLICY, {p.key: p for p in POLICIES[:2] if isinstance(p, NetworkPolicy)})
    inputs.replace(Kind.CLUSTER_POLICY, {})
    inputs.replace(Kind.NAMESPACE, {"x": Namespace("x", {"team": "t1"})})
    db = PolicyPod("x", "db", {"app": "db"}, (ip("2001:db8::d"),), node="n1")
    web = PolicyPod("x", "web", {"app": "web"}, (ip("2001:db8::1"),), node="n2")
    inputs.replace(Kind.POD, {p.key: p for p in (db, web)})
    journal = inputs.journal()
    planner = GroupPlanner(inputs)
    planner.load()
    first = planner.drain()
    web_group = next(n for n, g in planner.groups.items() if "x/web" in g.members and "x/db" not in g.members)
    assert web_group in first.created and web_group in planner.needs["n1"]
    # n2's web pod is isolated with no peer at all: it needs no group
    assert first.nodes == {"n1": planner.needs["n1"]} and "n2" not in planner.needs

    # A status-only change (same labels, addresses, ports): nothing moves anywhere.
    inputs.set_pod(attrs.evolve(web, resource_version="9"))
    planner.update(journal.drain())
    assert not planner.drain()

    # A new address: one member of the groups listing the pod, no node's needs.
    moved = attrs.evolve(web, addresses=(ip("2001:db8::2"),))
    inputs.set_pod(moved)
    planner.update(journal.drain())
    change = planner.drain()
    assert change.members[web_group] == {"x/web": moved} and not change.nodes and not change.created

    # The db pod goes: n1 needs nothing more, its groups are dropped.
    inputs.delete(Kind.POD, "x/db")
    planner.update(journal.drain())
    change = planner.drain()
    assert change.nodes["n1"] == frozenset() and web_group in change.dropped and "n1" not in planner.needs


def test_group_names_are_stable_and_short() -> None:
    pol = POLICIES[1]
    assert isinstance(pol, NetworkPolicy)
    inputs = PolicyInputs()
    inputs.replace(Kind.NETWORK_POLICY, {pol.key: pol})
    inputs.replace(Kind.CLUSTER_POLICY, {})
    inputs.replace(Kind.NAMESPACE, {})
    inputs.replace(Kind.POD, {"x/db": PolicyPod("x", "db", {"app": "db"}, (ip("2001:db8::d"),), node="n1")})
    planner = GroupPlanner(inputs)
    planner.load()
    names = sorted(planner.needs["n1"])
    again = GroupPlanner(inputs)
    again.load()
    assert sorted(again.needs["n1"]) == names and all(len(n) <= 19 for n in names)
    assert group_name(NamedSelection((("sql", Protocol.TCP),))).startswith("n-")


def test_a_label_no_selector_reads_moves_nothing_until_a_policy_reads_it() -> None:
    pol = POLICIES[1]  # db-from-web: peers app=web (namespace x) and team=t1's namespaces
    assert isinstance(pol, NetworkPolicy)
    inputs = PolicyInputs()
    inputs.replace(Kind.NETWORK_POLICY, {pol.key: pol})
    inputs.replace(Kind.CLUSTER_POLICY, {})
    inputs.replace(Kind.NAMESPACE, {"x": Namespace("x", {"team": "t2"})})
    db = PolicyPod("x", "db", {"app": "db"}, (ip("2001:db8::d"),), node="n1")
    web = PolicyPod("x", "web", {"app": "web", "version": "v1"}, (ip("2001:db8::1"),), node="n2")
    inputs.replace(Kind.POD, {p.key: p for p in (db, web)})
    journal = inputs.journal()
    planner = GroupPlanner(inputs)
    planner.load()
    planner.drain()
    (name,) = [n for n, g in planner.groups.items() if "x/web" in g.members]
    assert planner.groups[name].members["x/web"].label_map == {"app": "web"}  # carried without "version"
    inputs.set_pod(attrs.evolve(web, labels={"app": "web", "version": "v2"}))
    planner.update(journal.drain())
    assert not planner.drain()  # a rollout's label: no member moved, no slice to write
    reads_version = netpol(
        "x",
        "v2-only",
        {"podSelector": {}, "ingress": [{"from": [{"podSelector": {"matchLabels": {"version": "v2"}}}]}]},
    )
    inputs.set_policy(reads_version)
    planner.update(journal.drain())
    change = planner.drain()
    assert change.members[name]["x/web"].label_map == {"app": "web", "version": "v2"}  # re-carried, whole
