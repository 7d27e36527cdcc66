"""The incremental engine: what a change costs (the elements it moves, nothing else), the inputs' journal,
and long random walks on clusters big enough for large groups, shared addresses and set buckets."""

from __future__ import annotations

import ipaddress
import random

import attrs
import pytest
import trio

from flock.fnv import fnv1a_32
from flock.policy import (
    InputChanges,
    Kind,
    NamedPort,
    Namespace,
    NetworkPolicy,
    PolicyEngine,
    PolicyInputs,
    PolicyPod,
    Protocol,
    RulesetChange,
    compile_ruleset,
)
from flock.policy._nft import render_change
from flock.policy._peers import Peers
from flock.testing.policy import InexactChange, MemoryApplier

NODE = "n1"


def ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text)


def policy(ns: str, name: str, spec: dict) -> NetworkPolicy:
    return NetworkPolicy.from_object({"metadata": {"namespace": ns, "name": name}, "spec": spec})


def local_pods(inputs: PolicyInputs) -> list[PolicyPod]:
    return [
        attrs.evolve(p, host_veth=f"flock{fnv1a_32(p.key):08x}", selectable=True)
        for p in inputs.pods.values()
        if p.node == NODE and p.addresses
    ]


def fresh(inputs: PolicyInputs):
    return compile_ruleset(
        inputs.policies.values(), inputs.namespaces.values(), inputs.pods.values(), local_pods(inputs)
    )


@attrs.define
class Node:
    """An engine following *inputs*, its changes applied to a strict in-memory table."""

    inputs: PolicyInputs
    engine: PolicyEngine = attrs.field(init=False)
    journal: object = attrs.field(init=False)
    applier: MemoryApplier = attrs.field(init=False, factory=MemoryApplier)

    def __attrs_post_init__(self) -> None:
        self.journal = self.inputs.journal()
        self.engine = PolicyEngine(self.inputs)
        self.engine.load(local_pods(self.inputs))
        trio.run(self.applier.apply_change, self.engine.change())

    def update(self) -> None:
        self.engine.update(self.journal.drain(), local_pods(self.inputs))  # type: ignore[attr-defined]

    def step(self) -> RulesetChange:
        self.update()
        change = self.engine.change()
        trio.run(self.applier.apply_change, change)
        want = fresh(self.inputs)
        assert self.engine.ruleset() == want
        assert self.applier.applied == want
        return change


WEB = PolicyPod("x", "web", {"app": "web"}, (ip("2001:db8:1::1"),), (NamedPort("http", Protocol.TCP, 80),), node=NODE)
CLIENT = PolicyPod("y", "client", {"app": "client"}, (ip("2001:db8:2::1"),), node="n2")
OTHER = PolicyPod("z", "other", {"app": "other"}, (ip("2001:db8:3::1"),), node="n3")
FROM_CLIENTS = policy(
    "x",
    "web",
    {
        "podSelector": {"matchLabels": {"app": "web"}},
        "ingress": [
            {
                "from": [
                    {
                        "namespaceSelector": {"matchLabels": {"team": "a"}},
                        "podSelector": {"matchLabels": {"app": "client"}},
                    }
                ]
            },
            {"from": [{"namespaceSelector": {}}], "ports": [{"port": "http"}]},
        ],
    },
)


def cluster(*pods: PolicyPod, policies=(FROM_CLIENTS,), namespaces=None) -> PolicyInputs:
    inputs = PolicyInputs()
    inputs.replace(Kind.NETWORK_POLICY, {p.key: p for p in policies})
    spaces = namespaces or [Namespace("x"), Namespace("y", {"team": "a"}), Namespace("z", {"team": "b"})]
    inputs.replace(Kind.NAMESPACE, {n.name: n for n in spaces})
    inputs.replace(Kind.POD, {p.key: p for p in pods})
    return inputs


def test_a_remote_pods_new_address_moves_its_elements_and_nothing_else() -> None:
    node = Node(cluster(WEB, CLIENT, OTHER))
    before = node.engine.structure
    node.inputs.set_pod(attrs.evolve(CLIENT, addresses=(ip("2001:db8:2::2"),)))
    change = node.step()
    assert change.structure is before  # no chain, set or map touched
    # the client selector's set and the cluster-wide one, each: the old address out, the new one in
    assert sorted(map(sorted, change.added.values())) == [[ip("2001:db8:2::2")]] * 2
    assert sorted(map(sorted, change.removed.values())) == [[ip("2001:db8:2::1")]] * 2
    lines = render_change(before, change).splitlines()  # deletes, then adds: elements only
    assert set(lines[:2]) == {f"delete element inet flock {n} {{ 2001:db8:2::1 }}" for n in change.removed}
    assert set(lines[2:]) == {f"add element inet flock {n} {{ 2001:db8:2::2 }}" for n in change.added}
    # a pod no maintained selector reads changes nothing at all
    node.inputs.set_pod(attrs.evolve(OTHER, labels={"app": "else"}))
    change = node.step()
    assert change.structure is before and not change.added and not change.removed


def test_an_address_two_pods_hold_stays_until_the_last_one_lets_go() -> None:
    twin = attrs.evolve(CLIENT, name="twin")  # a stale pod still listed with a reused address
    node = Node(cluster(WEB, CLIENT, twin, OTHER))
    node.inputs.delete(Kind.POD, CLIENT.key)
    assert not node.step().removed
    node.inputs.delete(Kind.POD, twin.key)
    assert node.step().removed


def test_a_namespace_relabelling_moves_the_pods_of_that_namespace() -> None:
    node = Node(cluster(WEB, CLIENT, OTHER, attrs.evolve(OTHER, name="client", labels={"app": "client"})))
    node.inputs.set_namespace(Namespace("z", {"team": "a"}))  # z's client joins "team a's clients"
    change = node.step()
    assert [sorted(e) for e in change.added.values()] == [[ip("2001:db8:3::1")]] and not change.removed
    node.inputs.set_namespace(Namespace("y", {"team": "c"}))
    assert [sorted(e) for e in node.step().removed.values()] == [[ip("2001:db8:2::1")]]


def test_a_new_policy_adds_its_sets_whole_and_a_deleted_one_takes_them_away() -> None:
    node = Node(cluster(WEB, CLIENT, OTHER, policies=()))
    assert node.engine.structure.empty
    node.inputs.set_policy(FROM_CLIENTS)
    change = node.step()
    assert set(change.added) == set(change.structure.address_sets) | set(change.structure.service_sets)
    node.inputs.delete(Kind.NETWORK_POLICY, FROM_CLIENTS.key)
    assert node.step().structure.empty


HTTP = (NamedPort("http", Protocol.TCP, 8080),)
WEB_OUT = policy(
    "x",
    "web-out",
    {
        "podSelector": {"matchLabels": {"app": "web"}},
        "policyTypes": ["Egress"],
        "egress": [
            {
                "to": [
                    {
                        "namespaceSelector": {"matchLabels": {"team": "a"}},
                        "podSelector": {"matchLabels": {"app": "api"}},
                    }
                ],
                "ports": [{"port": "http"}],
            },
            {"to": [{"ipBlock": {"cidr": "2001:db8::/32"}}], "ports": [{"port": "http"}]},
        ],
    },
)


def test_an_ingress_named_port_set_holds_this_nodes_pods_only() -> None:
    """A named port resolves on the destination: for an ingress rule, a pod of this node."""
    client = attrs.evolve(CLIENT, named_ports=HTTP)  # declares http too, but is no destination here
    node = Node(cluster(WEB, client, attrs.evolve(OTHER, named_ports=HTTP)))
    assert [s.elements for s in node.engine.ruleset().service_sets.values()] == [
        {(ip("2001:db8:1::1"), Protocol.TCP, 80)}
    ]
    # so a remote pod declaring it moves only the peer sets it is in (here the cluster-wide one)
    node.inputs.set_pod(attrs.evolve(client, addresses=(ip("2001:db8:2::2"),)))
    change = node.step()
    assert change.added and set(change.added) <= set(change.structure.address_sets)
    assert set(change.removed) == set(change.added)
    # a pod moving here (the same value to selectors but for its veth) joins it
    web2 = attrs.evolve(WEB, name="web2", addresses=(ip("2001:db8:2::9"),), node="n2")
    node.inputs.set_pod(web2)
    node.step()
    node.inputs.set_pod(attrs.evolve(web2, node=NODE))
    change = node.step()
    assert {e for n, es in change.added.items() if n in change.structure.service_sets for e in es} == {
        (ip("2001:db8:2::9"), Protocol.TCP, 80)
    }


def test_an_egress_named_port_set_follows_its_selectors_pods() -> None:
    """For an egress rule with a selector peer, the named-port set holds the pods that selector picks; with an
    ipBlock peer, every pod declaring the name."""
    api_y = PolicyPod("y", "api", {"app": "api"}, (ip("2001:db8:2::1"),), HTTP, node="n2")
    api_z = PolicyPod("z", "api", {"app": "api"}, (ip("2001:db8:3::1"),), HTTP, node="n3")
    node = Node(cluster(WEB, api_y, api_z, policies=(FROM_CLIENTS, WEB_OUT)))
    restricted = next(
        r.match.service
        for r in node.engine.structure.chains[
            next(c for c in node.engine.structure.chains if c.startswith("pe-"))
        ].rules
        if r.match.daddr is not None and r.match.daddr.startswith("p-")
    )
    whole = node.engine.ruleset().service_sets
    assert whole[restricted].elements == {(ip("2001:db8:2::1"), Protocol.TCP, 8080)}
    everyone = {
        (ip("2001:db8:1::1"), Protocol.TCP, 80),
        *((a, Protocol.TCP, 8080) for a in (api_y.addresses[0], api_z.addresses[0])),
    }
    assert any(s.elements == everyone for s in whole.values())  # the ipBlock rule's
    node.inputs.set_namespace(Namespace("z", {"team": "a"}))  # z's api joins the selector: its port too
    assert node.step().added[restricted] == {(ip("2001:db8:3::1"), Protocol.TCP, 8080)}
    node.inputs.set_pod(attrs.evolve(api_y, labels={"app": "other"}))  # y's leaves
    assert node.step().removed[restricted] == {(ip("2001:db8:2::1"), Protocol.TCP, 8080)}
    node.inputs.set_pod(attrs.evolve(api_z, named_ports=()))  # z's declares it no more
    change = node.step()
    assert change.removed[restricted] == {(ip("2001:db8:3::1"), Protocol.TCP, 8080)}
    assert node.engine.ruleset().service_sets[restricted].elements == frozenset()


def test_the_memory_applier_refuses_an_inexact_change() -> None:
    node = Node(cluster(WEB, CLIENT, OTHER))
    name = next(iter(node.engine.structure.address_sets))
    bogus = RulesetChange(
        node.engine.structure, removed={name: frozenset({ip("2001:db8:9::9")})}, base=node.engine.change().base
    )
    with pytest.raises(InexactChange):
        trio.run(node.applier.apply_change, attrs.evolve(bogus, base=node.applier._token))


def test_the_journal_lists_each_key_once_with_its_value_before() -> None:
    inputs = PolicyInputs()
    journal = inputs.journal()
    first = PolicyPod("x", "a", {"v": "1"})
    inputs.set_pod(first)
    inputs.set_pod(attrs.evolve(first, labels={"v": "2"}))
    inputs.set_namespace(Namespace("x"))
    assert journal.drain() == InputChanges(namespaces={"x": None}, pods={"x/a": None})
    assert not journal.drain()
    inputs.set_pod(attrs.evolve(first, labels={"v": "2"}))  # equal: no change, no entry
    assert not journal.drain()
    held = inputs.pods["x/a"]
    inputs.replace(Kind.POD, {"x/a": attrs.evolve(held), "x/b": PolicyPod("x", "b")})
    assert inputs.pods["x/a"] is held  # an equal value from a relist: the one held stays
    assert journal.drain() == InputChanges(pods={"x/b": None})
    inputs.delete(Kind.POD, "x/a")
    assert journal.drain().pods == {"x/a": held}
    del journal
    inputs.set_pod(first)  # a dropped journal is forgotten (nothing accumulates for it)
    assert len(inputs._journals) == 0


def test_the_indices_empty_when_the_pods_go() -> None:
    peers = Peers()
    peers.index_label_keys(frozenset({"app"}))
    rnd = random.Random(5)
    # 100 groups (one hash each) over 3 apps: app buckets of ~33 groups; 8 addresses: ~25 holders each
    pods = [
        PolicyPod("x", f"p{i}", {"app": f"a{i % 3}", "hash": f"h{i // 2}"}, (ip(f"2001:db8::{rnd.randrange(8):x}"),))
        for i in range(200)
    ]
    pods += [PolicyPod("y", f"q{i}", {"app": "big"}, (ip(f"2001:db8:1::{i:x}"),)) for i in range(40)]  # one group
    for p in pods:
        peers.add(p.key, p)
    assert peers.families == (6,)
    rnd.shuffle(pods)
    for p in pods:
        peers.remove(p.key, p)
    assert peers.families == () and not peers._groups and not peers._by_pair and not peers._holders


# ---- random walks --------------------------------------------------------------------------------

LABELS = ({"app": "a"}, {"app": "b"}, {"app": "a", "tier": "web"}, {"tier": "web"}, {})
WALK_POLICIES = [
    policy("x", "deny", {"podSelector": {}}),
    policy(
        "x",
        "a-from",
        {
            "podSelector": {"matchLabels": {"app": "a"}},
            "ingress": [
                {"from": [{"podSelector": {"matchLabels": {"tier": "web"}}}]},
                {"from": [{"namespaceSelector": {"matchLabels": {"team": "t1"}}}], "ports": [{"port": "http"}]},
            ],
        },
    ),
    policy(
        "y",
        "all",
        {
            "podSelector": {},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "b"}}}]}],
            "egress": [{"to": [{"namespaceSelector": {}}], "ports": [{"port": "dns", "protocol": "UDP"}]}],
        },
    ),
    policy(
        "x",
        "out",
        {
            "podSelector": {"matchLabels": {"tier": "web"}},
            "policyTypes": ["Egress"],
            "egress": [
                {"to": [{"namespaceSelector": {"matchLabels": {"team": "t1"}}}], "ports": [{"port": "http"}]},
                {"to": [{"podSelector": {"matchLabels": {"app": "a"}}}], "ports": [{"port": "dns", "protocol": "UDP"}]},
                {"to": [{"ipBlock": {"cidr": "2001:db8:1::/64"}}], "ports": [{"port": "http"}]},
            ],
        },
    ),
    policy(
        "z",
        "pinned",
        {
            "podSelector": {"matchLabels": {"tier": "web"}},
            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "x"}}}]}],
        },
    ),
]
PORTS = (
    (),
    (NamedPort("http", Protocol.TCP, 80),),
    (NamedPort("http", Protocol.TCP, 8080), NamedPort("dns", Protocol.UDP, 53)),
)


def walk_pod(rnd: random.Random, ns: str, name: str) -> PolicyPod:
    n = rnd.randrange(60)  # 60 addresses for up to 120 pods: some are held twice
    addresses: tuple = (ip(f"2001:db8:{n % 3}::{n:x}"),)
    if rnd.random() < 0.2:
        addresses += (ip(f"192.0.2.{n}"),)
    return PolicyPod(
        ns,
        name,
        rnd.choice(LABELS),
        () if rnd.random() < 0.05 else addresses,
        rnd.choice(PORTS),
        node=NODE if rnd.random() < 0.15 else "n2",
        selectable=rnd.random() > 0.05,
    )


@pytest.mark.parametrize("seed", range(6))
def test_a_long_random_walk_stays_equal_to_a_fresh_compile(seed: int) -> None:
    rnd = random.Random(seed)
    spaces = ("x", "y", "z")
    inputs = cluster(
        *(walk_pod(rnd, rnd.choice(spaces), f"p{i}") for i in range(120)),
        policies=WALK_POLICIES[:2],
        namespaces=[Namespace(n, {"team": rnd.choice(["t1", "t2"])}) for n in spaces],
    )
    node = Node(inputs)
    for _ in range(150):
        for _ in range(rnd.choice([1, 1, 2, 5, 20])):
            what = rnd.random()
            if what < 0.75:
                key = f"{rnd.choice(spaces)}/p{rnd.randrange(130)}"
                if rnd.random() < 0.1:
                    inputs.delete(Kind.POD, key)
                else:
                    inputs.set_pod(walk_pod(rnd, *key.split("/")))
            elif what < 0.9:
                name = rnd.choice(spaces)
                if rnd.random() < 0.1:
                    inputs.delete(Kind.NAMESPACE, name)
                else:
                    inputs.set_namespace(Namespace(name, {"team": rnd.choice(["t1", "t2"])}))
            else:
                pol = rnd.choice(WALK_POLICIES)
                if pol.key in inputs.policies and rnd.random() < 0.5:
                    inputs.delete(Kind.NETWORK_POLICY, pol.key)
                else:
                    inputs.set_policy(pol)
            if rnd.random() < 0.2:
                node.update()  # several updates before a change is handed over
        node.step()
