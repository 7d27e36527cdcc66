"""The compiler's shape: shared sets, per-pod chains, churn as set elements, and the nft text it becomes."""

from __future__ import annotations

import ipaddress
import itertools

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flock.policy import (
    Compiler,
    InvalidLocalPod,
    IPBlock,
    Match,
    NamedPort,
    Namespace,
    NetworkPolicy,
    PolicyPod,
    Protocol,
    Rule,
    Ruleset,
    block_prefixes,
    compile_ruleset,
    pod_chain,
    policy_chain,
)
from flock.policy._compile import LOCAL, NamedPortsSpec, NodesSpec, PeerSelection, PodsSpec, _RuleBuilder
from flock.policy._model import Direction, LabelSelector
from flock.policy._nft import RenderError, render_full, render_rule, render_update


def ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text)


def pod(key: str, labels: dict, addr: str, veth: str | None = None, ports: tuple = (), node: str = "n1") -> PolicyPod:
    ns, name = key.split("/")
    return PolicyPod(ns, name, labels, (ip(addr),), ports, node=node, host_veth=veth)


def policy(ns: str, name: str, spec: dict) -> NetworkPolicy:
    return NetworkPolicy.from_object({"metadata": {"namespace": ns, "name": name}, "spec": spec})


WEB = pod("x/web", {"app": "web"}, "2001:db8:1::1", "flock00000001", (NamedPort("http", Protocol.TCP, 8080),))
DB = pod("x/db", {"app": "db"}, "2001:db8:1::2", "flock00000002")
CLIENT = pod("y/client", {"app": "client"}, "2001:db8:2::3", node="n2")
FROM_CLIENTS = {"from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "client"}}}]}


def test_isolation_is_per_direction_and_only_for_selected_pods() -> None:
    p = policy("x", "web-in", {"podSelector": {"matchLabels": {"app": "web"}}, "ingress": [FROM_CLIENTS]})
    rs = compile_ruleset([p], [], [CLIENT], [WEB, DB])
    assert rs.ingress_map == {"flock00000001": "in-flock00000001"}
    assert rs.egress_map == {}
    chain = rs.chains["in-flock00000001"]
    assert chain.rules == (
        Rule(Match(), f"jump {policy_chain('x/web-in', Direction.INGRESS)}", counter=False),
        Rule(Match(), "drop"),
    )
    assert rs.policy_chains == {policy_chain("x/web-in", Direction.INGRESS): "x/web-in"}


def test_without_policies_nothing_is_isolated_and_a_reused_compiler_agrees() -> None:
    p = policy("x", "web-in", {"podSelector": {"matchLabels": {"app": "web"}}, "ingress": [FROM_CLIENTS]})
    compiler = Compiler()
    assert compiler.compile([], [Namespace("x")], [CLIENT], [WEB, DB]) == Ruleset()
    isolated = compiler.compile([p], [Namespace("x")], [CLIENT], [WEB, DB])
    assert isolated == compile_ruleset([p], [Namespace("x")], [CLIENT], [WEB, DB])
    assert isolated.ingress_map == {"flock00000001": "in-flock00000001"}
    # the policy goes, then comes back: the same compiler gives what a fresh one does
    assert compiler.compile([], [Namespace("x")], [CLIENT], [WEB, DB]) == Ruleset()
    assert compiler.compile([p], [Namespace("x")], [CLIENT], [WEB, DB]) == isolated


def test_a_policy_allowing_nothing_is_just_the_drop() -> None:
    deny = policy("x", "deny", {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]})
    rs = compile_ruleset([deny], [], [], [WEB, DB])
    assert set(rs.chains) == {pod_chain(v, d) for v in ("flock00000001", "flock00000002") for d in Direction}
    assert all(c.rules == (Rule(Match(), "drop"),) for c in rs.chains.values())


def test_policies_sharing_a_selector_share_its_sets() -> None:
    p1 = policy("x", "a", {"podSelector": {"matchLabels": {"app": "web"}}, "ingress": [FROM_CLIENTS]})
    p2 = policy("x", "b", {"podSelector": {"matchLabels": {"app": "db"}}, "ingress": [FROM_CLIENTS]})
    rs = compile_ruleset([p1, p2], [], [CLIENT], [WEB, DB])
    assert len(rs.address_sets) == 1  # one selector; IPv6 only: no pod has an IPv4 address
    six = next(s for s in rs.address_sets.values() if s.family == 6)
    assert six.elements == {ip("2001:db8:2::3")}
    assert {r.match.family for c in rs.chains.values() for r in c.rules} == {None, 6}
    v4 = pod("z/v4", {}, "192.0.2.9", node="n2")
    dual = compile_ruleset([p1, p2], [], [CLIENT, v4], [WEB, DB])
    assert len(dual.address_sets) == 2
    assert {r.match.family for c in dual.chains.values() for r in c.rules} == {None, 4, 6}


def test_peer_churn_changes_elements_only() -> None:
    p = policy("x", "a", {"podSelector": {}, "ingress": [FROM_CLIENTS], "egress": [{"to": [{"podSelector": {}}]}]})
    before = compile_ruleset([p], [], [CLIENT], [WEB, DB])
    more = pod("y/client2", {"app": "client"}, "2001:db8:3::7", node="n3")
    relabelled = attrs.evolve(CLIENT, labels={"app": "other"})
    after = compile_ruleset([p], [], [relabelled, more], [WEB, DB])
    assert after.structure() == before.structure()
    text = render_update(before, after)
    lines = text.splitlines()
    assert all(line.startswith(("add element", "delete element")) for line in lines), text
    assert any("2001:db8:3::7" in line and line.startswith("add element") for line in lines)
    assert any("2001:db8:2::3" in line and line.startswith("delete element") for line in lines)
    assert render_update(after, after) == ""
    # the first IPv4 address in the cluster adds the IPv4 rules: a structure change, once
    first_v4 = compile_ruleset([p], [], [relabelled, more, pod("y/v4", {}, "192.0.2.7", node="n3")], [WEB, DB])
    assert first_v4.structure() != after.structure()


def test_a_new_local_pod_adds_its_chain_and_map_element_incrementally() -> None:
    p = policy("x", "a", {"podSelector": {}, "ingress": [FROM_CLIENTS]})
    before = compile_ruleset([p], [], [CLIENT], [WEB])
    after = compile_ruleset([p], [], [CLIENT], [WEB, DB])
    lines = render_update(before, after).splitlines()
    assert lines[0] == "add chain inet flock in-flock00000002"
    assert 'add element inet flock ingress-pods { "flock00000002" : jump in-flock00000002 }' in lines
    assert not any(line.startswith(("flush", "delete")) for line in lines)
    back = render_update(after, before).splitlines()
    assert back[-2:] == ["flush chain inet flock in-flock00000002", "delete chain inet flock in-flock00000002"]
    assert 'delete element inet flock ingress-pods { "flock00000002" }' in back


def test_named_ports_resolve_per_destination_pod() -> None:
    other_web = pod("x/web2", {"app": "web"}, "2001:db8:1::9", "flock00000009", (NamedPort("http", Protocol.TCP, 80),))
    p = policy("x", "a", {"podSelector": {"matchLabels": {"app": "web"}}, "ingress": [{"ports": [{"port": "http"}]}]})
    rs = compile_ruleset([p], [], [], [WEB, other_web])
    six = [s for s in rs.service_sets.values() if s.family == 6]
    assert len(six) == 1
    assert six[0].elements == {(ip("2001:db8:1::1"), Protocol.TCP, 8080), (ip("2001:db8:1::9"), Protocol.TCP, 80)}
    rules = rs.chains[policy_chain("x/a", Direction.INGRESS)].rules
    assert {r.match.family for r in rules} == {6} and all(r.match.service for r in rules)


def test_ports_group_by_protocol_and_merge() -> None:
    p = policy(
        "x",
        "a",
        {
            "podSelector": {},
            "ingress": [
                {
                    "ports": [
                        {"port": 80},
                        {"port": 81, "endPort": 85},
                        {"protocol": "UDP", "port": 53},
                        {"protocol": "SCTP"},
                        {"protocol": "UDP"},
                    ]
                }
            ],
        },
    )
    rs = compile_ruleset([p], [], [], [WEB])
    rules = rs.chains[policy_chain("x/a", Direction.INGRESS)].rules
    assert len(rules) == 1 and rules[0].match.portset is not None
    assert rs.port_sets[rules[0].match.portset].elements == {
        (Protocol.TCP, 80, 85),
        (Protocol.UDP, 0, 65535),
        (Protocol.SCTP, 0, 65535),
    }
    text = render_full(rs)
    assert f"set {rules[0].match.portset} {{ type inet_proto . inet_service; flags interval; elements = {{ " in text
    assert "sctp . 0-65535, tcp . 80-85, udp . 0-65535" in text
    single = policy("x", "b", {"podSelector": {}, "ingress": [{"ports": [{"port": 80, "endPort": 85}, {"port": 82}]}]})
    rule = compile_ruleset([single], [], [], [WEB]).chains[policy_chain("x/b", Direction.INGRESS)].rules[0]
    assert render_rule(rule) == "meta l4proto tcp th dport 80-85 counter accept"


def test_local_pods_need_flock_veth_names() -> None:
    for veth in (None, "eth0", 'flock0000000"', "flock0000000G"):
        with pytest.raises(InvalidLocalPod):
            compile_ruleset([], [], [], [attrs.evolve(WEB, host_veth=veth)])


def test_nothing_from_the_api_reaches_nft_text() -> None:
    hostile = "x; flush ruleset; #"
    p = policy(
        "x",
        "evil-name",
        {
            "podSelector": {"matchLabels": {"app": hostile}},
            "ingress": [{"from": [{"podSelector": {"matchExpressions": [{"key": hostile, "operator": "Exists"}]}}]}],
        },
    )
    target = attrs.evolve(WEB, labels={"app": hostile})
    peer = pod("x/peer", {hostile: "v"}, "2001:db8:1::7")
    text = render_full(compile_ruleset([p], [Namespace("x", {"a": hostile})], [peer], [target]))
    assert "flush ruleset" not in text and "evil" not in text and "2001:db8:1::7" in text
    with pytest.raises(RenderError):
        render_rule(Rule(Match(saddr="x; drop"), "accept"))
    with pytest.raises(RenderError):
        render_rule(Rule(Match(), "queue"))


@given(
    st.integers(0, 2**32 - 1), st.integers(16, 30), st.lists(st.tuples(st.integers(0, 2**32 - 1), st.integers(16, 32)))
)
def test_block_prefixes_are_the_cidr_minus_excepts(base: int, plen: int, excepts: list) -> None:
    cidr = ipaddress.ip_network((base, plen), strict=False)
    exc = []
    for a, p in excepts:
        net = ipaddress.ip_network((a, p), strict=False)
        if net.subnet_of(cidr):
            exc.append(net)
    block = IPBlock(cidr, tuple(exc))
    prefixes = block_prefixes(block)
    excluded = sum(n.num_addresses for n in ipaddress.collapse_addresses(exc))
    assert sum(n.num_addresses for n in prefixes) == cidr.num_addresses - excluded
    edges = [int(e.network_address) + d for e in exc for d in (-1, 0)] + [
        int(e.broadcast_address) + d for e in exc for d in (0, 1)
    ]
    for point in [cidr.network_address, cidr.broadcast_address] + [
        ipaddress.ip_address(x) for x in edges if 0 <= x < 2**32
    ]:
        if point in cidr:
            assert any(point in n for n in prefixes) == block.contains(point)
    for a, b in itertools.pairwise(prefixes):
        assert not a.overlaps(b)


# ---- set specs: what fills a dynamic set, as values the engine keys its maintained sets by ---------

WEB_SELECTOR = LabelSelector((("app", "web"),))
PROD = LabelSelector((("env", "prod"),))
HTTP = (("http", Protocol.TCP),)


def test_set_specs_are_frozen_hashable_values_named_as_before() -> None:
    """Equal specs are one dict key; a spec cannot change under the key; and a spec's set name is what the
    positional tuples it replaced gave (a running table's sets keep their names across an upgrade)."""
    shop_web = PeerSelection("shop", None, WEB_SELECTOR)
    prod_web = PeerSelection(None, PROD, WEB_SELECTOR)
    specs = {
        PodsSpec(shop_web, 6): "p-8bd3be5c9a9ea14f-6",
        PodsSpec(prod_web, 4): "p-9952093ab0876953-4",
        NodesSpec(LabelSelector((("zone", "a"),)), 6): "h-d1855963e9be9436-6",
        NamedPortsSpec(HTTP, 6, None): "n-8e0969e9b822489f-6",
        NamedPortsSpec(HTTP, 6, LOCAL): "n-80504701eb9e1881-6",
        NamedPortsSpec(HTTP, 4, prod_web): "n-3dd4c7f046b80c66-4",
    }
    assert {spec.name: name for spec, name in specs.items()} == {name: name for name in specs.values()}
    assert PodsSpec(PeerSelection("shop", None, LabelSelector((("app", "web"),))), 6) in specs
    assert NamedPortsSpec(HTTP, 4, PeerSelection(None, PROD, WEB_SELECTOR)) in specs
    assert NamedPortsSpec(HTTP, 4, prod_web) != NamedPortsSpec(HTTP, 6, prod_web)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        PodsSpec(shop_web, 6).family = 4  # type: ignore[misc]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        shop_web.scope = "other"  # type: ignore[misc]


def test_a_rule_leaves_specs_under_their_own_names() -> None:
    """An egress rule to a selector peer on a named port: the peer's address sets and its named-port sets
    (restricted to the peer's pods), each a spec under the name the rule matches on."""
    policy = NetworkPolicy.from_object(
        {
            "metadata": {"namespace": "shop", "name": "to-web"},
            "spec": {
                "podSelector": {},
                "policyTypes": ["Egress"],
                "egress": [{"to": [{"podSelector": {"matchLabels": {"app": "web"}}}], "ports": [{"port": "http"}]}],
            },
        }
    )
    builder = _RuleBuilder((6, 4))
    rules = builder.rules(policy, policy.egress[0], Direction.EGRESS)
    peer = PeerSelection("shop", None, WEB_SELECTOR)
    assert set(builder.specs.values()) == {
        PodsSpec(peer, 6),
        PodsSpec(peer, 4),
        NamedPortsSpec(HTTP, 6, peer),
        NamedPortsSpec(HTTP, 4, peer),
    }
    assert all(name == spec.name for name, spec in builder.specs.items())
    assert {(r.match.daddr, r.match.service) for r in rules} == {
        (PodsSpec(peer, f).name, NamedPortsSpec(HTTP, f, peer).name) for f in (6, 4)
    }
