"""Desired kernel state: pure, no root."""

import ipaddress

import hypothesis
import hypothesis.strategies as st
import pytest

from flock import errors
from flock.faults import AllocationUnusable
from flock.model import Allocation
from flock.netlink import (
    GATEWAY4,
    GATEWAY6,
    ROUTE_PROTOCOL,
    Address,
    DataplaneSettings,
    Nexthop,
    Route,
    Scope,
    Side,
    anycast_routes,
    blackhole_routes,
    fnv1a_32,
    host_ifname,
    is_host_ifname,
    pod_plan,
)
from flock.pods import cni_error

ip = ipaddress.ip_address
net = ipaddress.ip_network


def alloc(cid="c0ffee", ip6="2001:db8::5", ip4="198.51.100.5", anycast=(), addresses=(), if_name="eth0"):
    return Allocation(
        container_id=cid,
        namespace="prod",
        pod="web-0",
        pod_uid="u1",
        if_name=if_name,
        netns="/run/netns/x",
        ip6=ip(ip6) if ip6 else None,
        ip4=ip(ip4) if ip4 else None,
        anycast=tuple(ip(a) for a in anycast),
        addresses=tuple(ip(a) for a in addresses),
    )


def test_fnv1a_32_reference_vectors():
    # Published FNV-1a 32-bit test vectors.
    assert fnv1a_32("") == 0x811C9DC5
    assert fnv1a_32("a") == 0xE40C292C
    assert fnv1a_32("foobar") == 0xBF9CF968


def test_host_ifname_is_flock_plus_8_hex_and_fits_ifnamsiz():
    name = host_ifname("foobar")
    assert name == "flockbf9cf968"
    assert len(name) <= 15 and is_host_ifname(name)
    assert not is_host_ifname("flockbf9cf96") and not is_host_ifname("flockBF9CF968") and not is_host_ifname("eth0")


def test_dual_stack_plan_matches_design():
    plan = pod_plan(alloc())
    host, pod = plan.veth.host, plan.veth.pod
    assert (host, pod) == (host_ifname("c0ffee"), "eth0")
    assert plan.addresses == (
        Address(Side.HOST, host, GATEWAY6, 64, nodad=True),
        Address(Side.POD, "eth0", ip("2001:db8::5"), 128, nodad=True),
        Address(Side.POD, "eth0", ip("198.51.100.5"), 32, nodad=False),
    )
    assert {(s.key, s.value) for s in plan.sysctls} == {
        (f"net/ipv4/conf/{host}/proxy_arp", "1"),
        (f"net/ipv4/neigh/{host}/proxy_delay", "0"),
        (f"net/ipv4/conf/{host}/forwarding", "1"),
        (f"net/ipv6/conf/{host}/forwarding", "1"),
    }
    assert all(s.side is Side.HOST for s in plan.sysctls)
    p = ROUTE_PROTOCOL
    assert plan.routes_on(Side.POD) == (
        Route(Side.POD, net("::/0"), (Nexthop("eth0", GATEWAY6),), Scope.UNIVERSE, p),
        Route(Side.POD, net("169.254.1.1/32"), (Nexthop("eth0"),), Scope.LINK, p),
        Route(Side.POD, net("0.0.0.0/0"), (Nexthop("eth0", GATEWAY4),), Scope.UNIVERSE, p),
    )
    assert plan.routes_on(Side.HOST) == (
        Route(Side.HOST, net("2001:db8::5/128"), (Nexthop(host),), Scope.UNIVERSE, p),
        Route(Side.HOST, net("198.51.100.5/32"), (Nexthop(host),), Scope.LINK, p),
    )
    assert plan.anycast == ()


def test_v6_only_plan_has_no_v4_routes():
    plan = pod_plan(alloc(ip4=None))
    assert [str(r.dst) for r in plan.routes] == ["::/0", "2001:db8::5/128"]


def test_v4_only_plan_has_no_v6_default_but_keeps_host_fe80():
    plan = pod_plan(alloc(ip6=None))
    assert [str(r.dst) for r in plan.routes] == ["169.254.1.1/32", "0.0.0.0/0", "198.51.100.5/32"]


def test_extra_and_anycast_addresses_go_on_the_pod_and_are_routed():
    plan = pod_plan(alloc(addresses=["2001:db8:ff::1"], anycast=["2001:db8:aa::1", "203.0.113.9"]))
    pod_addrs = [str(a) for a in plan.addresses_on(Side.POD)]
    assert pod_addrs == [
        "2001:db8::5/128",
        "198.51.100.5/32",
        "2001:db8:ff::1/128",
        "2001:db8:aa::1/128",
        "203.0.113.9/32",
    ]
    assert net("2001:db8:ff::1/128") in {r.dst for r in plan.routes_on(Side.HOST)}
    host = plan.veth.host
    # Linux needs a gateway on IPv6 multipath nexthops: the pod's own /128.
    assert [(str(m.address), m.nexthop) for m in plan.anycast] == [
        ("2001:db8:aa::1", Nexthop(host, ip("2001:db8::5"))),
        ("203.0.113.9", Nexthop(host)),
    ]


def test_anycast_on_two_pods_is_one_multipath_route_independent_of_order():
    a = pod_plan(alloc("a", "2001:db8::a", None, anycast=["2001:db8:aa::1"]))
    b = pod_plan(alloc("b", "2001:db8::b", None, anycast=["2001:db8:aa::1"]))
    (route,) = anycast_routes([a, b])
    assert route == anycast_routes([b, a])[0]
    assert route.dst == net("2001:db8:aa::1/128") and route.protocol == ROUTE_PROTOCOL
    assert set(route.nexthops) == {Nexthop(a.veth.host, ip("2001:db8::a")), Nexthop(b.veth.host, ip("2001:db8::b"))}


def test_blackholes_for_node_blocks_sorted_and_deduplicated():
    routes = blackhole_routes([net("2001:db8:0:1::/64"), None, net("198.51.100.0/24"), net("2001:db8:0:1::/64")])
    assert [(str(r.dst), r.blackhole, r.protocol) for r in routes] == [
        ("198.51.100.0/24", True, ROUTE_PROTOCOL),
        ("2001:db8:0:1::/64", True, ROUTE_PROTOCOL),
    ]


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"if_name": ""}, "ifName"),
        ({"if_name": "a-very-long-ifname"}, "ifName"),
        ({"if_name": "a/b"}, "ifName"),
        ({"ip6": None, "ip4": None}, "ip6/ip4"),
        ({"anycast": ["2001:db8::5"]}, "anycast"),
        ({"ip6": None, "anycast": ["2001:db8:aa::1"]}, "anycast"),
    ],
)
def test_bad_allocations_are_typed_errors_naming_the_field(kwargs, field):
    with pytest.raises(AllocationUnusable) as info:
        pod_plan(alloc(**kwargs))
    assert cni_error(info.value).code == errors.INVALID_CONFIG
    assert f"{field}=" in info.value.details


def test_settings_validate():
    with pytest.raises(ValueError, match="protocol"):
        DataplaneSettings(protocol=2)
    with pytest.raises(ValueError, match="host_prefix"):
        DataplaneSettings(host_prefix="toolongprefix")
    assert pod_plan(alloc(), DataplaneSettings(host_prefix="fl")).veth.host.startswith("fl")


@hypothesis.settings(max_examples=50, deadline=None)
@hypothesis.given(st.text(min_size=1, max_size=80))
def test_any_container_id_gives_a_valid_unique_looking_name(cid):
    name = host_ifname(cid)
    assert is_host_ifname(name) and len(name) == 13
    assert name == host_ifname(cid)


def test_anycast_via_a_pod_address_is_onlink_so_bird_accepts_it():
    from flock.netlink._conn import RTNH_F_ONLINK, route_kwargs
    from flock.netlink.desired import Nexthop, anycast_route

    anycast = ipaddress.ip_address("2001:db8:ffff::80")
    one = anycast_route(anycast, [Nexthop("flock0001", ipaddress.ip_address("2001:db8:0:1::a"))])
    two = anycast_route(
        anycast,
        [
            Nexthop("flock0001", ipaddress.ip_address("2001:db8:0:1::a")),
            Nexthop("flock0002", ipaddress.ip_address("2001:db8:0:1::b")),
        ],
    )
    index = {"flock0001": 11, "flock0002": 12}
    assert route_kwargs(one, index)["flags"] == RTNH_F_ONLINK
    assert [hop["flags"] for hop in route_kwargs(two, index)["multipath"]] == [RTNH_F_ONLINK] * 2
    link_local = anycast_route(anycast, [Nexthop("flock0001", ipaddress.ip_address("fe80::1"))])
    assert "flags" not in route_kwargs(link_local, index)
