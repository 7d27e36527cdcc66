"""The WireGuard service's pure parts: NodeConfig and Node read, the dataplane planned, the guard's nft
transaction, the device routes' plan."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest

from flock.wireguard import PrivateKey, RefusalReason
from flock.wireguard._cluster import (
    UNKEYED,
    EncryptionSettings,
    NodeAddresses,
    NodeConfigWireGuard,
    peers_changed,
    plan_dataplane,
)
from flock.wireguard._guard import COUNTER, TABLE, parse_counter, render_guard, render_remove
from flock.wireguard._routes import (
    ROUTE_PROTOCOL,
    ROUTE_TABLE,
    RULE_PRIORITY,
    RoutePlan,
    batch_lines,
    parse_routes,
    parse_rules,
    plan_routes,
)

net = ipaddress.ip_network
addr = ipaddress.ip_address
KEYS = [PrivateKey.generate() for _ in range(4)]


def nodeconfig(name: str, cidr6: str | None, cidr4: str | None = None, key: str | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {"metadata": {"name": name}, "spec": {}}
    if cidr6 is not None:
        obj["spec"]["cidr6"] = cidr6
    if cidr4 is not None:
        obj["spec"]["cidr4"] = cidr4
    if key is not None:
        obj["status"] = {"wireguard": {"publicKey": key}}
    return obj


def node(name: str, *addresses: tuple[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"addresses": [{"type": t, "address": a} for t, a in addresses]}}


def cluster() -> tuple[list[NodeConfigWireGuard], dict[str, NodeAddresses]]:
    configs = [
        NodeConfigWireGuard.read(nodeconfig("a", "2001:db8:1::/64", "10.1.0.0/24", KEYS[0].public_key.base64)),
        NodeConfigWireGuard.read(nodeconfig("b", "2001:db8:2::/64", "10.2.0.0/24", KEYS[1].public_key.base64)),
        NodeConfigWireGuard.read(nodeconfig("c", "2001:db8:3::/64", None, None)),  # no key yet
    ]
    nodes = {
        n: NodeAddresses.read(
            node(n, ("Hostname", n), ("ExternalIP", f"192.0.2.{i}"), ("InternalIP", f"2001:db8::{i}"))
        )
        for i, n in enumerate("abc", 1)
    }
    return configs, nodes


def test_nodeconfig_read_blocks_and_key() -> None:
    read = NodeConfigWireGuard.read(nodeconfig("a", "2001:db8:1::/64", "10.1.0.0/24", KEYS[0].public_key.base64))
    assert read.pod_blocks == (net("2001:db8:1::/64"), net("10.1.0.0/24"))
    assert read.public_key == KEYS[0].public_key and read.problems == ()
    assert NodeConfigWireGuard.read({"metadata": {"name": "x"}}) == NodeConfigWireGuard("x")


def test_a_key_that_is_no_key_and_a_block_that_is_no_cidr_are_named_never_raised() -> None:
    secretish = "not-a-key-" + "x" * 40
    read = NodeConfigWireGuard.read(nodeconfig("a", "2001:db8:1::1/64", "10.1.0.0/33", secretish))
    assert read.public_key is None and read.pod_blocks == ()
    reasons = [r for r, _ in read.problems]
    assert reasons == [RefusalReason.INVALID_BLOCK, RefusalReason.INVALID_BLOCK, RefusalReason.INVALID_KEY]
    assert all(secretish not in detail for _, detail in read.problems)  # the bad key is not echoed
    # the wrong family, and garbage of every type
    assert NodeConfigWireGuard.read(nodeconfig("a", "10.0.0.0/8")).problems[0][0] == RefusalReason.INVALID_BLOCK
    weird = NodeConfigWireGuard.read({"metadata": [], "spec": "x", "status": {"wireguard": 7}})
    assert weird == NodeConfigWireGuard("")
    configs, nodes = cluster()
    plan = plan_dataplane(
        "b", [*configs, NodeConfigWireGuard.read(nodeconfig("d", "zz", None, "!!"))], nodes, EncryptionSettings()
    )
    assert {(r.node, r.reason) for r in plan.refusals} >= {
        ("d", RefusalReason.INVALID_BLOCK),
        ("d", RefusalReason.INVALID_KEY),
    }


def test_node_addresses_internal_first_names_skipped() -> None:
    read = NodeAddresses.read(
        node("a", ("ExternalIP", "192.0.2.1"), ("Hostname", "a"), ("InternalIP", "2001:db8::1"), ("InternalIP", "junk"))
    )
    assert read.addresses == (addr("2001:db8::1"), addr("192.0.2.1"))
    assert NodeAddresses.read({"metadata": {"name": "z"}, "status": {"addresses": "x"}}).addresses == ()


def test_plan_peers_routes_and_guard() -> None:
    configs, nodes = cluster()
    plan = plan_dataplane("a", configs, nodes, EncryptionSettings(listen_port=51821))
    assert [name for name, _ in plan.peers] == ["b"]
    b = plan.peers[0][1]
    assert str(b.endpoint) == "[2001:db8::2]:51821" and b.allowed_ips == {net("2001:db8:2::/64"), net("10.2.0.0/24")}
    assert plan.routes == b.allowed_ips  # the tunnel's routes: pod blocks only, never a node address
    assert plan.local == {net("2001:db8:1::/64"), net("10.1.0.0/24")}
    # c has no key: no peer, no route, but its block is guarded (pod traffic to it waits, never in the clear)
    assert plan.guarded == {net("2001:db8:2::/64"), net("10.2.0.0/24"), net("2001:db8:3::/64")}
    assert [(r.node, r.reason) for r in plan.refusals] == [("c", RefusalReason.NO_KEY)]


def test_allow_plaintext_to_leaves_a_node_unguarded() -> None:
    configs, nodes = cluster()
    plan = plan_dataplane("a", configs, nodes, EncryptionSettings(allow_plaintext_to=frozenset({"c"})))
    assert net("2001:db8:3::/64") not in plan.guarded and net("2001:db8:2::/64") in plan.guarded


def test_allow_plaintext_to_unkeyed_leaves_only_nodes_without_a_key_unguarded() -> None:
    """'*' (a cluster switching encryption on node by node): c has published no key — not guarded; b
    has — guarded; d published a key that is no key — it says it encrypts: guarded, and refused."""
    configs, nodes = cluster()
    configs.append(NodeConfigWireGuard.read(nodeconfig("d", "2001:db8:4::/64", None, "not a key")))
    plan = plan_dataplane("a", configs, nodes, EncryptionSettings(allow_plaintext_to=frozenset({UNKEYED})))
    assert plan.guarded == {net("2001:db8:2::/64"), net("10.2.0.0/24"), net("2001:db8:4::/64")}
    assert ("d", RefusalReason.INVALID_KEY) in [(r.node, r.reason) for r in plan.refusals]
    # c publishes its key: peered, and guarded from then on
    configs[2] = NodeConfigWireGuard.read(nodeconfig("c", "2001:db8:3::/64", None, KEYS[2].public_key.base64))
    plan = plan_dataplane("a", configs, nodes, EncryptionSettings(allow_plaintext_to=frozenset({UNKEYED})))
    assert net("2001:db8:3::/64") in plan.guarded and "c" in dict(plan.peers)


def test_a_remote_block_overlapping_ours_is_refused_not_guarded() -> None:
    configs, nodes = cluster()
    rogue = NodeConfigWireGuard.read(nodeconfig("d", "2001:db8:1:0:1::/80", None, KEYS[3].public_key.base64))
    plan = plan_dataplane("a", [*configs, rogue], nodes, EncryptionSettings())
    assert net("2001:db8:1:0:1::/80") not in plan.guarded and net("2001:db8:1:0:1::/80") not in plan.routes
    assert ("d", RefusalReason.BLOCK_CONFLICT) in {(r.node, r.reason) for r in plan.refusals}
    assert ("d", RefusalReason.NO_ENDPOINT) in {(r.node, r.reason) for r in plan.refusals}  # no Node object


def test_peers_changed_names_one_node() -> None:
    configs, nodes = cluster()
    before = dict(plan_dataplane("a", configs, nodes, EncryptionSettings()).peers)
    configs[2] = NodeConfigWireGuard.read(nodeconfig("c", "2001:db8:3::/64", None, KEYS[2].public_key.base64))
    after = dict(plan_dataplane("a", configs, nodes, EncryptionSettings()).peers)
    assert peers_changed(before, after) == ["c"]
    assert peers_changed(after, after) == []


def test_guard_transaction() -> None:
    script = render_guard("flock-wg", [net("2001:db8:1::/64")], [net("2001:db8:2::/64"), net("10.2.0.0/24")])
    assert script.startswith(f"add table inet {TABLE}\nadd counter inet {TABLE} {COUNTER}\n")
    assert "delete" not in script  # the counter survives updates
    assert f"flush set inet {TABLE} guarded6\nadd element inet {TABLE} guarded6 {{ 2001:db8:2::/64 }}" in script
    assert "add element inet flock-wireguard local4" not in script  # an empty set gets no element statement
    assert 'ip6 saddr @local6 ip6 daddr @guarded6 oifname != "flock-wg" counter name "plaintext-dropped" drop' in script
    assert "hook postrouting" in script
    with pytest.raises(ValueError, match="interface name"):
        render_guard('x" accept; #', [], [])
    with pytest.raises(ValueError, match="not a network"):
        render_guard("wg", ["2001:db8::/64"], [])  # type: ignore[list-item]
    assert render_remove() == f"add table inet {TABLE}\ndelete table inet {TABLE}\n"
    assert parse_counter("table inet x {\n counter c {\n  packets 12 bytes 1008\n }\n}") == (12, 1008)


def test_route_plan() -> None:
    """Routes in table 71, rules from this node's pod blocks to it: deletions first (rules before their
    routes), additions last (routes before the rules that reach them), one family per ``ip -batch``."""
    live = [net("2001:db8:2::/64"), net("10.9.0.0/24")]
    rules = [net("10.1.0.0/24")]
    plan = plan_routes(live, [net("2001:db8:2::/64"), net("10.2.0.0/24")], rules, [net("2001:db8:1::/64")])
    assert plan == RoutePlan(
        (net("10.2.0.0/24"),), (net("10.9.0.0/24"),), (net("2001:db8:1::/64"),), (net("10.1.0.0/24"),)
    )
    assert not plan_routes(live, live, rules, rules)
    route = f"dev wg0 proto {ROUTE_PROTOCOL} table {ROUTE_TABLE}"
    rule = f"lookup {ROUTE_TABLE} priority {RULE_PRIORITY} protocol {ROUTE_PROTOCOL}"
    assert batch_lines("wg0", plan, 4) == [
        f"rule del from 10.1.0.0/24 {rule}",
        f"route del 10.9.0.0/24 {route}",
        f"route replace 10.2.0.0/24 {route}",
    ]
    assert batch_lines("wg0", plan, 6) == [f"rule add from 2001:db8:1::/64 {rule}"]
    assert batch_lines("wg0", plan, 6, 200, 50) == [
        f"rule add from 2001:db8:1::/64 lookup 200 priority 50 protocol {ROUTE_PROTOCOL}"
    ]
    # only flock's rules (table 71, protocol 71) are read back: another's rule to table 71 is not ours
    shown = (
        '[{"priority":0,"src":"all","table":"local"},'
        '{"priority":99,"src":"2001:db8:1::","srclen":64,"table":"71","protocol":"71"},'
        '{"priority":99,"src":"10.1.0.0","srclen":24,"table":"71","protocol":"71"},'
        '{"priority":50,"src":"10.7.0.0","srclen":24,"table":"71"},'
        '{"priority":99,"src":"all","table":"71","protocol":"71"}]'
    )
    assert parse_rules(shown) == [net("2001:db8:1::/64"), net("10.1.0.0/24")]
    assert parse_rules(shown, 200) == []
    assert parse_routes('[{"dst":"2001:db8:2::/64"},{"dst":"10.0.0.1"},{"dst":"default"}]') == [
        net("2001:db8:2::/64"),
        net("10.0.0.1/32"),
    ]
