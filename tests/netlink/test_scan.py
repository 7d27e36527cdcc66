"""The start-up dumps (flock.netlink._scan) against the kernel, compared
with what ``ip`` and pyroute2's IPRoute read from the same namespace."""

import ipaddress
import socket

import pytest
import trio
from pyroute2 import IPRoute
from pyroute2.netlink.rtnl import RTM_GETLINK, RTM_GETROUTE

from flock.netlink import ROUTE_PROTOCOL, NetlinkWorker, _nsenter, host_ifname
from flock.netlink._scan import RTN_BLACKHOLE, Scanner, link_request, route_request
from flock.testing.netns import netns_pool

pytestmark = pytest.mark.usefixtures("require_root")
P = str(ROUTE_PROTOCOL)
net = ipaddress.ip_network


@pytest.fixture
def node():
    with netns_pool("fl-scan-") as pool:
        ns = pool.create("node")
        other = pool.create("other")
        for i in range(3):
            pool.veth(ns, host_ifname(f"c{i}"), other, f"p{i}")
            ns.ip("link", "set", host_ifname(f"c{i}"), "up")
            ns.ip("addr", "add", "fe80::1/64", "dev", host_ifname(f"c{i}"), "nodad")
        ns.ip("link", "set", host_ifname("c0"), "alias", "flock:c0")
        ns.ip("addr", "add", "192.0.2.1/24", "dev", host_ifname("c2"))
        ns.ip("route", "add", "2001:db8::a/128", "dev", host_ifname("c0"), "proto", P)
        ns.ip("route", "add", "198.51.100.10/32", "dev", host_ifname("c0"), "proto", P, "scope", "link")
        ns.ip("route", "add", "198.51.100.11/32", "via", "192.0.2.9", "dev", host_ifname("c2"), "proto", P)
        ns.ip(
            "route",
            "add",
            "203.0.113.9/32",
            "proto",
            P,
            "nexthop",
            "dev",
            host_ifname("c0"),
            "nexthop",
            "dev",
            host_ifname("c1"),
        )
        ns.ip(
            "-6",
            "route",
            "add",
            "2001:db8:aa::1/128",
            "proto",
            P,
            "nexthop",
            "via",
            "fe80::2",
            "dev",
            host_ifname("c0"),
            "nexthop",
            "via",
            "fe80::3",
            "dev",
            host_ifname("c1"),
        )
        ns.ip("route", "add", "blackhole", "198.51.100.0/24", "proto", P)
        ns.ip("route", "add", "blackhole", "2001:db8::/64", "proto", P)
        # Not flock's: another protocol, another table.
        ns.ip("route", "add", "203.0.113.50/32", "dev", host_ifname("c1"), "proto", "static")
        ns.ip("route", "add", "203.0.113.51/32", "dev", host_ifname("c1"), "proto", P, "table", "100")
        yield ns


def test_links_match_ip(node):
    with Scanner(node.path) as scanner:
        links = {link.name: link for link in scanner.links()}
    assert set(links) == {"lo", host_ifname("c0"), host_ifname("c1"), host_ifname("c2")}
    assert links[host_ifname("c0")].kind == "veth" and links[host_ifname("c0")].alias == "flock:c0"
    assert links[host_ifname("c1")].alias == "" and links["lo"].kind is None
    for name, link in links.items():
        assert f"{link.index}: {name}" in node.ip("-o", "link", "show", "dev", name)


def test_addresses_match_ip(node):
    with Scanner(node.path) as scanner:
        addresses = scanner.addresses()
        index = {link.name: link.index for link in scanner.links()}
    got = {(a.index, str(a.address), a.prefixlen) for a in addresses}
    assert (index[host_ifname("c2")], "192.0.2.1", 24) in got
    assert {(index[host_ifname(f"c{i}")], "fe80::1", 64) for i in range(3)} <= got


def test_flock_routes_are_read_as_pyroute2_reads_them(node):
    with Scanner(node.path) as scanner:
        names = {link.index: link.name for link in scanner.links()}
        routes = {str(r.dst): r for r in scanner.routes(ROUTE_PROTOCOL)}
        blackholes = scanner.routes(ROUTE_PROTOCOL, RTN_BLACKHOLE)
    assert set(routes) == {
        "2001:db8::a/128",
        "198.51.100.10/32",
        "198.51.100.11/32",
        "203.0.113.9/32",
        "2001:db8:aa::1/128",
        "198.51.100.0/24",
        "2001:db8::/64",
    }
    assert sorted(str(r.dst) for r in blackholes) == ["198.51.100.0/24", "2001:db8::/64"]
    assert all(r.type == RTN_BLACKHOLE and r.hops == () for r in blackholes)
    assert str(routes["198.51.100.10/32"].route(names)) == f"198.51.100.10/32 dev {host_ifname('c0')} scope link"
    assert routes["198.51.100.11/32"].hops[0][1] == ipaddress.ip_address("192.0.2.9")
    assert {names[oif] for oif, _ in routes["203.0.113.9/32"].hops} == {host_ifname("c0"), host_ifname("c1")}
    v6 = routes["2001:db8:aa::1/128"].route(names)
    assert {(h.ifname, str(h.gateway)) for h in v6.nexthops} == {
        (host_ifname("c0"), "fe80::2"),
        (host_ifname("c1"), "fe80::3"),
    }
    # The same routes as pyroute2 decodes them.
    fd = _nsenter.run_in_netns(node.path, lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, 0).detach())
    with IPRoute(fileno=fd) as ipr:
        theirs = {
            f"{m.get('RTA_DST') or ('::' if m['family'] == socket.AF_INET6 else '0.0.0.0')}/{m['dst_len']}"
            for m in ipr.route("dump", table=254, proto=ROUTE_PROTOCOL)
        }
    assert theirs == set(routes)


def test_the_kernel_leaves_out_statistics_and_filters_routes(node):
    with Scanner(node.path) as scanner:
        links = scanner.dump(RTM_GETLINK, link_request)
        routes = scanner.dump(RTM_GETROUTE, lambda: route_request(socket.AF_INET, ROUTE_PROTOCOL, RTN_BLACKHOLE))
    assert len(links) == 4 and all(m.get_attr("IFLA_IFNAME") for m in links)
    # IFLA_EXT_MASK: without the per-interface IPv6 statistics (two thirds of a link message).
    inet6 = [m.get_attr("IFLA_AF_SPEC").get_attr("AF_INET6") for m in links]
    assert all(i.get_attr("IFLA_INET6_CONF") for i in inet6)
    assert not any(i.get_attr("IFLA_INET6_STATS") or i.get_attr("IFLA_INET6_ICMP6STATS") for i in inet6)
    # Strict checking: the kernel sent only the one v4 blackhole of flock's, in the main table.
    assert [(m.get_attr("RTA_DST"), m["proto"], m["type"], m["table"]) for m in routes] == [
        ("198.51.100.0", ROUTE_PROTOCOL, RTN_BLACKHOLE, 254)
    ]


async def test_cleanup_reads_cheaply_and_still_finds_a_lone_stale_route(node):
    with trio.fail_after(20):
        w = NetlinkWorker(host_netns=node.path)
        explained = ["c0", "c1", "c2"]
        node.ip("link", "set", host_ifname("c1"), "alias", "flock:c1")
        assert (await w.cleanup(explained)).interfaces == ()
        assert "198.51.100.11" in node.ip("route")  # via c2: explained, kept
        # A flock route through an interface no row explains, and no orphan veth.
        node.ip("link", "set", "lo", "up")
        node.ip("route", "add", "198.51.100.12/32", "dev", "lo", "proto", P)
        report = await w.cleanup(explained)
        assert report.interfaces == () and any("198.51.100.12" in r for r in report.routes)
        assert "198.51.100.12" not in node.ip("route")
        assert await w.cleanup(explained) == type(report)()
        assert await w.node_addresses() >= {ipaddress.ip_address("192.0.2.1"), ipaddress.ip_address("fe80::1")}
