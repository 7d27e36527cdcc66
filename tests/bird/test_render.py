"""flock.bird.render: golden files, canonical ordering, validation, and BIRD's own parser."""

from __future__ import annotations

import ipaddress
import pathlib
import random
import re
import subprocess

import attrs
import hypothesis
import pytest
from hypothesis import strategies as st

from flock.bird import BgpTimers, BirdInputs, RenderError, RenderSettings, render
from flock.model import Allocation, AllocationState, BgpConfig, BgpPeer, NodeConfig

GOLDEN = pathlib.Path(__file__).parent / "golden"
SETTINGS = RenderSettings(route_protocol=252)

ANYCAST = [ipaddress.ip_address(a) for a in ("2001:db8:aaaa::53", "2001:db8:aaaa::1", "203.0.113.53")]
EXTRA = [ipaddress.ip_address(a) for a in ("2001:db8:bbbb::7", "198.51.100.200")]


def host001(peers_reversed: bool = False) -> NodeConfig:
    peers = [
        {"name": "tor-a", "address": "2001:db8:ffff::1", "asn": 64500},
        {"name": "tor-b", "address": "192.0.2.1", "asn": 64501},
    ]
    if peers_reversed:
        peers.reverse()
    return NodeConfig.from_object(
        {
            "metadata": {"name": "host001"},
            "spec": {
                "cidr6": "2001:db8:0:1::/64",
                "cidr4": "198.51.100.0/24",
                "families": {"ipv6": True, "ipv4": True},
                "bgp": {"asn": 64512, "routerID": "192.0.2.11", "peers": peers},
            },
        }
    )


def lab_node() -> NodeConfig:
    """IPv6 only, one iBGP peer, as a lab would run it."""
    return NodeConfig.from_object(
        {
            "metadata": {"name": "lab-1.example"},
            "spec": {
                "cidr6": "2001:db8:0:2::/64",
                "bgp": {
                    "asn": 64512,
                    "routerID": "192.0.2.12",
                    "peers": [{"name": "rr_1", "address": "2001:db8:ffff::9", "asn": 64512}],
                },
            },
        }
    )


def check_golden(name: str, text: str) -> None:
    assert text == (GOLDEN / name).read_text(), f"render differs from tests/bird/golden/{name}"


def bird_parse(tmp_path: pathlib.Path, text: str) -> subprocess.CompletedProcess:
    conf = tmp_path / "bird.conf"
    conf.write_text(text)
    return subprocess.run(["bird", "-p", "-c", str(conf)], capture_output=True, text=True)


def test_dual_stack_node_with_two_peers_matches_golden() -> None:
    check_golden("dualstack_two_peers.conf", render(host001(), settings=SETTINGS))


def test_anycast_and_extra_addresses_are_injected() -> None:
    text = render(host001(), anycast=ANYCAST, addresses=EXTRA, settings=SETTINGS)
    check_golden("dualstack_anycast.conf", text)
    assert "2001:db8:aaaa::1/128" in text and "203.0.113.53/32" in text and "198.51.100.200/32" in text


def test_same_input_in_another_order_is_byte_identical() -> None:
    shuffled_anycast = list(reversed(ANYCAST)) + ANYCAST[:1]  # and a duplicate
    shuffled_extra = list(reversed(EXTRA))
    random.Random(5).shuffle(shuffled_anycast)
    text = render(
        host001(peers_reversed=True), anycast=shuffled_anycast, addresses=set(shuffled_extra), settings=SETTINGS
    )
    check_golden("dualstack_anycast.conf", text)


def test_lab_timers_and_ibgp_match_golden() -> None:
    settings = RenderSettings(route_protocol=252, bgp_timers=BgpTimers())
    check_golden("v6only_ibgp_lab_timers.conf", render(lab_node(), settings=settings))


def test_node_without_bgp_renders_kernel_and_static_only() -> None:
    node = attrs.evolve(lab_node(), bgp=None)
    text = render(node, settings=SETTINGS)
    assert "router id" not in text and "protocol bgp" not in text
    assert "route 2001:db8:0:2::/64 blackhole;" in text


def test_golden_files_parse_with_bird(require_bird: None, tmp_path: pathlib.Path) -> None:
    for golden in sorted(GOLDEN.glob("*.conf")):
        result = bird_parse(tmp_path, golden.read_text())
        assert result.returncode == 0, f"{golden.name}: {result.stderr}"


def test_bird_rejects_what_it_should(require_bird: None, tmp_path: pathlib.Path) -> None:
    # The parse check above could only pass vacuously if `bird -p` accepted anything.
    result = bird_parse(tmp_path, render(host001(), settings=SETTINGS) + "\nprotocol bogus {}\n")
    assert result.returncode != 0 and "bird.conf" in result.stderr


def test_longest_peer_name_parses(require_bird: None, tmp_path: pathlib.Path) -> None:
    name = "t" + "o-r_9" * 11 + "abcd"  # 60 characters: 'bgp_' + name is BIRD's 64-byte symbol limit
    assert len(name) == 60
    result = bird_parse(tmp_path, render(with_peers(peer(name)), settings=SETTINGS))
    assert result.returncode == 0, result.stderr
    with pytest.raises(RenderError):
        render(with_peers(peer(name + "x")), settings=SETTINGS)


def peer(name: object = "tor1", address: object = None, asn: object = 64500) -> BgpPeer:
    return BgpPeer(name, ipaddress.ip_address("2001:db8:ffff::1") if address is None else address, asn)  # type: ignore[arg-type]


def with_peers(*peers: BgpPeer) -> NodeConfig:
    node = host001()
    return attrs.evolve(node, bgp=attrs.evolve(node.bgp, peers=peers))


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (
            lambda: render(
                with_peers(peer("x'; } protocol static evil { ipv6; route ::/0 blackhole; } protocol bgp 'y")),
                settings=SETTINGS,
            ),
            "node.bgp.peers[0].name",
        ),
        (lambda: render(with_peers(peer("tor1\nrouter id 1.1.1.1;")), settings=SETTINGS), "node.bgp.peers[0].name"),
        (lambda: render(with_peers(peer("1tor")), settings=SETTINGS), "node.bgp.peers[0].name"),
        (
            lambda: render(with_peers(peer(address="2001:db8::1 as 1; import all")), settings=SETTINGS),
            "node.bgp.peers[0].address",
        ),
        (
            lambda: render(with_peers(peer(address=ipaddress.ip_address("fe80::1"))), settings=SETTINGS),
            "node.bgp.peers[0].address",
        ),
        (lambda: render(with_peers(peer(asn="64500; import all")), settings=SETTINGS), "node.bgp.peers[0].asn"),
        (lambda: render(with_peers(peer(asn=True)), settings=SETTINGS), "node.bgp.peers[0].asn"),
        (lambda: render(with_peers(peer(asn=0)), settings=SETTINGS), "node.bgp.peers[0].asn"),
        (
            lambda: render(
                with_peers(peer("tor1"), peer("tor1", ipaddress.ip_address("192.0.2.9"))), settings=SETTINGS
            ),
            "node.bgp.peers",
        ),
        (
            lambda: render(host001(), anycast=["2001:db8::1/128 ] then accept; if net ~ [ ::/0"], settings=SETTINGS),
            "anycast",
        ),
        # ipaddress takes any text as an IPv6 scope ID: the type is right, the text is not.
        (
            lambda: render(
                host001(),
                anycast=[ipaddress.ip_address("2001:db8::1%] then accept; if net ~ [ ::1")],
                settings=SETTINGS,
            ),
            "anycast",
        ),
        (lambda: render(host001(), addresses=[ipaddress.ip_address("2001:db8::1%x")], settings=SETTINGS), "addresses"),
        (
            lambda: render(
                with_peers(peer(address=ipaddress.ip_address("2001:db8::1%x as 1; import all; #"))), settings=SETTINGS
            ),
            "node.bgp.peers[0].address",
        ),
        (
            lambda: render(
                attrs.evolve(host001(), cidr6=ipaddress.IPv6Network("2001:db8::%x blackhole; } #/64")),
                settings=SETTINGS,
            ),
            "node.cidr6",
        ),
        (lambda: render(host001(), anycast="2001:db8::1", settings=SETTINGS), "anycast"),
        (lambda: render(host001(), anycast=[ipaddress.ip_network("::/0")], settings=SETTINGS), "anycast"),
        (lambda: render(host001(), addresses=[b"\x00"], settings=SETTINGS), "addresses"),
        (lambda: render(attrs.evolve(host001(), name="host001\nprotocol static x {}"), settings=SETTINGS), "node.name"),
        (
            lambda: render(attrs.evolve(host001(), cidr6="2001:db8::/64 blackhole; route ::/0"), settings=SETTINGS),
            "node.cidr6",
        ),
        (
            lambda: render(attrs.evolve(host001(), cidr4=ipaddress.ip_network("2001:db8::/64")), settings=SETTINGS),
            "node.cidr4",
        ),
        (
            lambda: render(
                attrs.evolve(host001(), bgp=BgpConfig(64512, "192.0.2.1; router id 1.2.3.4")), settings=SETTINGS
            ),
            "node.bgp.router_id",
        ),  # type: ignore[arg-type]
        (
            lambda: render(
                attrs.evolve(host001(), bgp=BgpConfig(2**32, ipaddress.IPv4Address("192.0.2.1"))), settings=SETTINGS
            ),
            "node.bgp.asn",
        ),
        (lambda: RenderSettings(route_protocol=12), "route_protocol"),
        (lambda: RenderSettings(route_protocol="252; }"), "route_protocol"),  # type: ignore[arg-type]
        (lambda: RenderSettings(route_protocol=256), "route_protocol"),
        (lambda: BgpTimers(hold=2), "hold"),
        (lambda: BgpTimers(hold=3, keepalive=3), "keepalive"),
        (lambda: BgpTimers(connect_delay="1; import all"), "connect_delay"),  # type: ignore[arg-type]
    ],
)
def test_values_that_could_inject_bird_syntax_are_rejected(build, field: str) -> None:
    with pytest.raises(RenderError) as info:
        build()
    assert info.value.field == field
    assert field in str(info.value)


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(name=st.text(min_size=1, max_size=70))
def test_any_peer_name_is_rejected_or_a_plain_symbol(name: str) -> None:
    try:
        text = render(with_peers(peer(name)), settings=SETTINGS)
    except RenderError as exc:
        assert exc.field == "node.bgp.peers[0].name"
        return
    assert re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", name)
    assert text.count("protocol bgp ") == 1 and f"protocol bgp 'bgp_{name}' {{" in text


addresses6 = st.integers(min_value=0, max_value=2**64 - 1).map(
    lambda i: ipaddress.IPv6Address((0x20010DB8AAAA << 80) | i)
)
addresses4 = st.integers(min_value=0, max_value=255).map(lambda i: ipaddress.IPv4Address((203 << 24) | (113 << 8) | i))


# require_bird holds no state, so sharing it across examples is sound.
@hypothesis.settings(
    max_examples=15, deadline=None, suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture]
)
@hypothesis.given(
    anycast=st.lists(st.one_of(addresses6, addresses4), max_size=6),
    extra=st.lists(st.one_of(addresses6, addresses4), max_size=4),
    seed=st.integers(0, 1000),
)
def test_any_anycast_set_renders_canonically_and_parses(
    anycast, extra, seed: int, require_bird: None, tmp_path_factory
) -> None:
    text = render(host001(), anycast=anycast, addresses=extra, settings=SETTINGS)
    shuffled = list(anycast)
    random.Random(seed).shuffle(shuffled)
    assert (
        render(host001(peers_reversed=True), anycast=shuffled, addresses=tuple(reversed(extra)), settings=SETTINGS)
        == text
    )
    result = bird_parse(tmp_path_factory.mktemp("bird"), text)
    assert result.returncode == 0, result.stderr


def test_inputs_collect_anycast_and_extra_addresses_of_every_allocation() -> None:
    ip = ipaddress.ip_address

    def alloc(cid: str, state: AllocationState, anycast: tuple[str, ...], addresses: tuple[str, ...]) -> Allocation:
        return Allocation(
            cid,
            "default",
            cid,
            "uid",
            "eth0",
            "/run/netns/x",
            ip("2001:db8:0:1::" + cid),
            None,
            tuple(ip(a) for a in anycast),
            tuple(ip(a) for a in addresses),
            state,
        )

    inputs = BirdInputs.collect(
        host001(),
        [
            alloc("a", AllocationState.COMMITTED, ("2001:db8:aaaa::1",), ("198.51.100.200",)),
            alloc("b", AllocationState.PENDING, ("2001:db8:aaaa::1", "203.0.113.53"), ()),
            alloc("c", AllocationState.COMMITTED, (), ()),
        ],
    )
    assert inputs == BirdInputs(host001(), {ip("2001:db8:aaaa::1"), ip("203.0.113.53")}, {ip("198.51.100.200")})


def test_inputs_announce_pods_left_outside_a_changed_node_block() -> None:
    ip = ipaddress.ip_address
    old = Allocation("old", "default", "old", "uid", "eth0", "/run/netns/x", ip("2001:db8:0:9::5"), ip("203.0.113.9"))
    inside = Allocation("in", "default", "in", "uid", "eth0", "/run/netns/y", ip("2001:db8:0:1::5"))
    inputs = BirdInputs.collect(host001(), [old, inside])
    assert inputs.addresses == {ip("2001:db8:0:9::5"), ip("203.0.113.9")}
    assert "2001:db8:0:9::5/128" in render(
        inputs.node, anycast=inputs.anycast, addresses=inputs.addresses, settings=SETTINGS
    )
