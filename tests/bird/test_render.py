"""flock.bird.render: golden files, canonical ordering, validation, and BIRD's own parser."""

from __future__ import annotations

import ipaddress
import pathlib
import random
import re
import subprocess
from typing import Any

import attrs
import hypothesis
import pytest
from hypothesis import strategies as st

from flock.bird import (
    SECRETS_FILE,
    BgpTimers,
    BirdInputs,
    RenderError,
    RenderSettings,
    ServiceRoutes,
    render,
    render_secrets,
)
from flock.model import Allocation, AllocationState, BgpConfig, BgpPeer, Communities, GracefulRestart, NodeConfig

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


def production() -> NodeConfig:
    """Every production feature at once: an eBGP ToR over BFD with a password, a
    loopback-peered ToR (multihop), a route reflector client, communities."""
    return NodeConfig.from_object(
        {
            "metadata": {"name": "host002"},
            "spec": {
                "cidr6": "2001:db8:0:2::/64",
                "cidr4": "198.51.100.64/26",
                "families": {"ipv6": True, "ipv4": True},
                "bgp": {
                    "asn": 64512,
                    "routerID": "192.0.2.12",
                    "routeReflectorClusterID": "192.0.2.250",
                    "gracefulRestart": {"restartTime": 300},
                    "communities": {
                        "nodeBlock": {"standard": ["64512:100"], "large": ["64512:1:100"]},
                        "anycast": {"standard": ["64512:200", "65535:65281"]},
                        "addresses": {"large": ["64512:3:300"]},
                    },
                    "peers": [
                        {
                            "name": "tor-a",
                            "address": "2001:db8:ffff::1",
                            "asn": 64500,
                            "bfd": {"minRxMs": 100, "minTxMs": 100, "multiplier": 3},
                            "password": {"secretKeyRef": {"name": "bgp-tor", "key": "tor-a"}},
                        },
                        {
                            "name": "tor-b",
                            "address": "192.0.2.254",
                            "asn": 64501,
                            "multihop": 2,
                            "sourceAddress": "192.0.2.12",
                            "bfd": {},
                            "password": {"secretKeyRef": {"name": "bgp-tor", "key": "tor-b"}},
                        },
                        {"name": "node3", "address": "2001:db8:ffff::103", "asn": 64512, "routeReflectorClient": True},
                    ],
                },
            },
        }
    )


PASSWORDS = {"tor-a": "lab secret 'a'", "tor-b": "b-secret"}


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
        (tmp_path / SECRETS_FILE).unlink(missing_ok=True)
        if (secrets := golden.with_suffix(".secrets")).exists():
            (tmp_path / SECRETS_FILE).write_text(secrets.read_text())
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


def test_production_features_match_golden() -> None:
    node = production()
    text = render(node, anycast=ANYCAST, addresses=EXTRA, passwords=PASSWORDS, settings=SETTINGS)
    check_golden("production_tor_rr.conf", text)
    check_golden("production_tor_rr.secrets", render_secrets(node, PASSWORDS))
    assert "lab secret" not in text and "b-secret" not in text
    assert f'include "{SECRETS_FILE}";' in text
    assert text.count("protocol bfd flock_bfd") == 1 and "protocol direct flock_direct" in text
    assert "rr client;" in text and "rr cluster id 192.0.2.250;" in text
    assert "bgp_community.add((65535, 65281));" in text and "bgp_large_community.add((64512, 3, 300));" in text


def test_production_golden_parses_with_bird_next_to_its_secrets(require_bird: None, tmp_path: pathlib.Path) -> None:
    (tmp_path / SECRETS_FILE).write_text((GOLDEN / "production_tor_rr.secrets").read_text())
    result = bird_parse(tmp_path, (GOLDEN / "production_tor_rr.conf").read_text())
    assert result.returncode == 0, result.stderr
    # Without its secrets file BIRD refuses the config: the check cannot pass vacuously.
    (tmp_path / SECRETS_FILE).unlink()
    assert bird_parse(tmp_path, (GOLDEN / "production_tor_rr.conf").read_text()).returncode != 0


def test_peer_without_its_password_is_disabled_never_unauthenticated(require_bird, tmp_path: pathlib.Path) -> None:
    node = production()
    text = render(node, passwords={"tor-b"}, settings=SETTINGS)
    tor_a = text[text.index("protocol bgp 'bgp_tor-a'") :].split("\n}\n")[0]
    tor_b = text[text.index("protocol bgp 'bgp_tor-b'") :].split("\n}\n")[0]
    assert "disabled;" in tor_a and "  password " not in tor_a
    assert "disabled;" not in tor_b and "password flock_password_1;" in tor_b
    secrets = render_secrets(node, {"tor-b": "b-secret"})
    assert "flock_password_0" not in secrets and 'define flock_password_1 = "b-secret";' in secrets
    (tmp_path / SECRETS_FILE).write_text(secrets)
    result = bird_parse(tmp_path, text)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("password", ['a"b', "a\\b", "", "x" * 81, "tab\there", "\u00e9t\u00e9", "line\nbreak"])
def test_unusable_password_is_refused_without_showing_it(password: str) -> None:
    with pytest.raises(RenderError) as info:
        render_secrets(production(), {"tor-a": password})
    assert info.value.field == "password of peer tor-a"
    if password:
        assert password not in str(info.value) and password not in repr(info.value.value)


def test_bfd_protocol_only_when_a_peer_uses_it() -> None:
    plain = render(host001(), settings=SETTINGS)
    assert "bfd" not in plain and "protocol direct" not in plain and "include" not in plain
    assert "graceful restart on;" in plain and "graceful restart time 120;" in plain


def test_graceful_restart_off_keeps_helper_mode() -> None:
    node = host001()
    assert node.bgp is not None
    off = attrs.evolve(node, bgp=attrs.evolve(node.bgp, graceful_restart=GracefulRestart(enabled=False)))
    text = render(off, settings=SETTINGS)
    assert "graceful restart on" not in text and text.count("graceful restart aware;") == 2


def test_route_reflector_exports_what_it_learned_to_clients_only() -> None:
    text = render(production(), passwords=PASSWORDS, settings=SETTINGS)
    node3 = text[text.index("protocol bgp 'bgp_node3'") :]
    assert "export filter flock_bgp_reflect6;" in node3 and "export filter flock_bgp_reflect4;" in node3
    reflect = text[text.index("filter flock_bgp_reflect6") :].split("\n}\n")[0]
    assert "if source = RTS_BGP then accept;" in reflect
    tor = text[text.index("protocol bgp 'bgp_tor-a'") :].split("\n}\n")[0]
    assert "flock_bgp_export6;" in tor and "reflect" not in tor


SERVICE_ROUTES = (
    ServiceRoutes(
        "public",
        (ipaddress.ip_network("198.51.100.7/32"), ipaddress.ip_network("2001:db8:ee::7/128")),
        Communities(standard=((64512, 300),), large=((64512, 1, 300),)),
        local_preference=150,
    ),
    ServiceRoutes("cluster-ips", (ipaddress.ip_network("fd00:10:96::/112"),)),
)


def test_service_routes_are_held_static_and_announced_with_their_pools_attributes(
    require_bird: None, tmp_path: pathlib.Path
) -> None:
    text = render(host001(), services=reversed(SERVICE_ROUTES), settings=SETTINGS)
    assert text == render(host001(), services=SERVICE_ROUTES, settings=SETTINGS)  # canonical: by pool
    assert "protocol static flock_services4 {\n  ipv4;\n  route 198.51.100.7/32 blackhole;\n}" in text
    assert "route 2001:db8:ee::7/128 blackhole;" in text and "route fd00:10:96::/112 blackhole;" in text
    v4 = text[text.index("filter flock_bgp_export4") :]
    block = v4[v4.index("# Service addresses, pool public") :]
    assert "198.51.100.7/32" in block.split("then")[0]
    assert "bgp_community.add((64512, 300));" in block and "bgp_large_community.add((64512, 1, 300));" in block
    assert "bgp_local_pref = 150;" in block.split("}")[0]
    # never given to the kernel: its export filter takes BGP routes only (unchanged)
    assert "filter flock_kernel_export {\n  if source = RTS_BGP then accept;\n  reject;\n}" in text
    result = bird_parse(tmp_path, text)
    assert result.returncode == 0, result.stderr
    assert "flock_services" not in render(host001(), settings=SETTINGS)  # none: nothing rendered


def test_a_leaving_node_announces_its_service_routes_for_graceful_shutdown(
    require_bird: None, tmp_path: pathlib.Path
) -> None:
    text = render(host001(), services=SERVICE_ROUTES, leaving=True, settings=SETTINGS)
    v4 = text[text.index("filter flock_bgp_export4") :]
    block = v4[v4.index("# Service addresses, pool public") :].split("}")[0]
    assert "bgp_community.add((65535, 0));" in block and "bgp_local_pref = 0;" in block  # RFC 8326
    assert "bgp_local_pref = 150;" not in block
    pod_routes = text[text.index("filter flock_bgp_export6") :].split("# Service addresses")[0]
    assert "(65535, 0)" not in pod_routes  # only the Service routes: pods' own routes leave with the node
    assert bird_parse(tmp_path, text).returncode == 0


@pytest.mark.parametrize(
    "routes",
    [
        (ServiceRoutes("evil }; protocol", (ipaddress.ip_network("198.51.100.7/32"),)),),
        (ServiceRoutes("ok", ("198.51.100.7/32",)),),  # type: ignore[arg-type]
        (ServiceRoutes("ok", (ipaddress.ip_network("198.51.100.7/32"),), local_preference=-1),),
        "public",
    ],
)
def test_service_routes_that_could_inject_bird_syntax_are_refused(routes: Any) -> None:
    with pytest.raises(RenderError) as refused:
        render(host001(), services=routes, settings=SETTINGS)
    assert refused.value.field.startswith("services")
