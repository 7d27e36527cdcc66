"""Desired peers from every node's key, addresses and pod blocks (pure), with refusals named."""

from __future__ import annotations

import ipaddress

import hypothesis.strategies as st
from hypothesis import given, settings

from flock.wireguard import DEFAULT_KEEPALIVE_S, Endpoint, NodeWireGuard, PrivateKey, RefusalReason, desired_peers

KEYS = [PrivateKey.generate().public_key for _ in range(8)]
net = ipaddress.ip_network
addr = ipaddress.ip_address


def node(name: str, key: int | None, addresses: tuple[str, ...], blocks: tuple[str, ...]) -> NodeWireGuard:
    return NodeWireGuard(
        name,
        KEYS[key] if key is not None else None,
        tuple(addr(a) for a in addresses),
        tuple(net(b) for b in blocks),
    )


A = node("a", 0, ("2001:db8::1", "192.0.2.1"), ("2001:db8:1::/64", "198.51.100.0/26"))
B = node("b", 1, ("192.0.2.2", "2001:db8::2"), ("2001:db8:2::/64", "198.51.100.64/26"))
C = node("c", 2, ("2001:db8::3",), ("2001:db8:3::/64",))


def test_one_peer_per_other_node_both_families() -> None:
    plan = desired_peers("a", [A, B, C], fabric_family=6, listen_port=51820)
    assert plan.refusals == ()
    assert [name for name, _ in plan.peers] == ["b", "c"]
    b = plan.peers[0][1]
    assert b.public_key == KEYS[1]
    assert b.endpoint == Endpoint(addr("2001:db8::2"), 51820)  # the fabric's family, not the first address
    assert b.allowed_ips == {net("2001:db8:2::/64"), net("198.51.100.64/26")}
    assert b.persistent_keepalive == DEFAULT_KEEPALIVE_S
    v4 = desired_peers("a", [A, B, C], fabric_family=4, listen_port=7, persistent_keepalive=None)
    assert v4.peers[0][1].endpoint == Endpoint(addr("192.0.2.2"), 7) and v4.peers[0][1].persistent_keepalive is None
    assert [(r.node, r.reason) for r in v4.refusals] == [("c", RefusalReason.NO_ENDPOINT)]


def test_refusals_are_named() -> None:
    keyless = node("d", None, ("2001:db8::4",), ("2001:db8:4::/64",))
    own = node("e", 0, ("2001:db8::5",), ("2001:db8:5::/64",))
    twin1 = node("f", 5, ("2001:db8::6",), ("2001:db8:6::/64",))
    twin2 = node("g", 5, ("2001:db8::7",), ("2001:db8:7::/64",))
    looped = node("h", 6, ("2001:db8:1::99",), ("2001:db8:8::/64",))  # its address is in a's pod block
    plan = desired_peers("a", [A, B, keyless, own, twin1, twin2, looped], fabric_family=6, listen_port=1)
    assert [name for name, _ in plan.peers] == ["b"]
    reasons = {(r.node, r.reason) for r in plan.refusals}
    assert reasons == {
        ("d", RefusalReason.NO_KEY),
        ("e", RefusalReason.OWN_KEY),
        ("f", RefusalReason.DUPLICATE_KEY),
        ("g", RefusalReason.DUPLICATE_KEY),
        ("h", RefusalReason.NO_ENDPOINT),
    }
    assert "lies in pod block 2001:db8:1::/64" in next(str(r) for r in plan.refusals if r.node == "h")
    assert "f, g" in next(str(r) for r in plan.refusals if r.node == "g")


def test_a_block_claimed_twice_goes_to_no_one() -> None:
    # c claims b's IPv6 block too, and a /80 inside a's own block; d (no key yet) claims c's block
    c = node("c", 2, ("2001:db8::3",), ("2001:db8:3::/64", "2001:db8:2::/64", "2001:db8:1:0:1::/80"))
    d = node("d", None, ("2001:db8::4",), ("2001:db8:3::/64",))
    plan = desired_peers("a", [A, B, c, d], fabric_family=6, listen_port=1)
    peers = dict(plan.peers)
    assert peers["b"].allowed_ips == {net("198.51.100.64/26")}
    assert peers["c"].allowed_ips == set()
    conflicts = sorted((r.node, r.detail) for r in plan.refusals if r.reason == RefusalReason.BLOCK_CONFLICT)
    assert conflicts == [
        ("b", "pod block 2001:db8:2::/64 overlaps c's: given to no peer"),
        ("c", "pod block 2001:db8:1:0:1::/80 overlaps a's: given to no peer"),
        ("c", "pod block 2001:db8:2::/64 overlaps b's: given to no peer"),
        ("c", "pod block 2001:db8:3::/64 overlaps d's: given to no peer"),
        ("d", "pod block 2001:db8:3::/64 overlaps c's: given to no peer"),
    ]


def test_a_node_may_hold_nested_blocks_of_its_own() -> None:
    b = node("b", 1, ("2001:db8::2",), ("2001:db8:2::/64", "2001:db8:2::/80"))
    plan = desired_peers("a", [A, b], fabric_family=6, listen_port=1)
    assert plan.refusals == () and plan.peers[0][1].allowed_ips == {net("2001:db8:2::/64"), net("2001:db8:2::/80")}


prefix6 = st.builds(
    lambda n, length: net(f"2001:db8:{n:x}::/{length}", strict=False), st.integers(0, 7), st.sampled_from([48, 62, 64])
)
prefix4 = st.builds(
    lambda n, length: net(f"198.51.100.{n * 32}/{length}", strict=False),
    st.integers(0, 7),
    st.sampled_from([24, 26, 27]),
)
nodes = st.lists(
    st.builds(
        lambda i, key, blocks: node(f"n{i}", key, (f"2001:db8::{i + 1:x}",), tuple(str(b) for b in blocks)),
        st.integers(0, 5),
        st.one_of(st.none(), st.integers(0, 7)),
        st.lists(st.one_of(prefix6, prefix4), max_size=3),
    ),
    max_size=6,
)


@settings(max_examples=200, deadline=None)
@given(nodes)
def test_property_no_address_given_to_two_peers_or_to_a_non_owner(cluster: list[NodeWireGuard]) -> None:
    by_name = {n.name: n for n in cluster}
    plan = desired_peers("n0", cluster, fabric_family=6, listen_port=1)
    given_blocks = [(name, block) for name, peer in plan.peers for block in peer.allowed_ips]
    mine = by_name["n0"].pod_blocks if "n0" in by_name else ()
    for i, (name, block) in enumerate(given_blocks):
        assert block in by_name[name].pod_blocks
        for other_name, other in given_blocks[i + 1 :]:
            if other_name != name and other.version == block.version:
                assert not block.overlaps(other)
        assert not any(block.overlaps(m) for m in mine if m.version == block.version)
    assert len({peer.public_key for _, peer in plan.peers}) == len(plan.peers)
    assert "n0" not in dict(plan.peers)
    for name in by_name:
        if name != "n0" and name not in dict(plan.peers):
            assert any(r.node == name for r in plan.refusals)
