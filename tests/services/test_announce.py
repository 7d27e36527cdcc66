"""Which Service addresses a node announces (issue 34's rules): only inside a pool the Service may use,
eTP Cluster while the Service has an endpoint anywhere (withdrawn everywhere without one, unless told
otherwise), eTP Local only where an endpoint is, a shared address while either Service wants it."""

from __future__ import annotations

import ipaddress
from typing import Any

from flock.model import Communities
from flock.policy import LabelSelector
from flock.services import AllowList, AnnouncePool, EndpointSlice, Service, announcements
from flock.services._announce import routes_by_pool
from flock.testing import services as objects

NET = ipaddress.ip_network
POOL = AnnouncePool("public", (NET("198.51.100.0/26"), NET("2001:db8:ee::/64")), Communities(((65000, 100),)), 200)
OTHER = AnnouncePool("other", (NET("198.51.100.64/26"),))
ALLOW = AllowList.build([POOL])
PORTS = [objects.slice_port("http", 8080)]


def svc(name: str, etp: str | None = None, **kw: Any) -> Service:
    return Service.from_object(
        objects.service(
            name,
            kw.pop("ips", ["203.0.113.10", "fd00:96::10"]),
            [objects.port("http", 80, target=8080, node_port=30080)],
            type="LoadBalancer",
            etp=etp,
            health_check_node_port=32000 if etp == "Local" else None,
            **kw,
        )
    )


def eps(name: str, *endpoints: dict[str, Any]) -> EndpointSlice:
    return EndpointSlice.from_object(objects.endpoint_slice(name, list(endpoints), PORTS))


def test_cluster_policy_announces_from_every_node_while_there_is_an_endpoint() -> None:
    web = svc("web", lb_ips=["198.51.100.7"])
    ready = [eps("web", objects.endpoint("192.0.2.1", "node-b"))]
    on_a = announcements([web], ready, "node-a", ALLOW)
    (route,) = on_a.routes
    assert (str(route.prefix), route.pool, route.services) == ("198.51.100.7/32", "public", ("default/web",))
    assert route.communities == Communities(((65000, 100),)) and route.local_preference == 200
    assert announcements([web], ready, "node-b", ALLOW).prefixes() == on_a.prefixes()  # any node that translates
    unready = [eps("web", objects.endpoint("192.0.2.1", "node-b", ready=False))]
    none = announcements([web], unready, "node-a", ALLOW)
    assert none.routes == () and "withdrawn on every node" in none.not_announced[0].why
    kept = announcements([web], unready, "node-a", ALLOW, withdraw_without_endpoints=False)
    assert kept.prefixes() == on_a.prefixes()
    terminating = [eps("web", objects.endpoint("192.0.2.1", "node-b", ready=False, serving=True, terminating=True))]
    assert announcements([web], terminating, "node-a", ALLOW).prefixes() == on_a.prefixes()  # KEP-1669


def test_local_policy_announces_only_where_an_endpoint_is() -> None:
    web = svc("web", etp="Local", lb_ips=["198.51.100.7"])
    slices = [eps("web", objects.endpoint("192.0.2.1", "node-b"))]
    assert str(next(iter(announcements([web], slices, "node-b", ALLOW).prefixes()))) == "198.51.100.7/32"
    away = announcements([web], slices, "node-a", ALLOW)
    assert away.routes == () and "no ready endpoint on this node" in away.not_announced[0].why
    # a serving and terminating endpoint counts while none is ready (a rolling restart's last pod)
    draining = [eps("web", objects.endpoint("192.0.2.1", "node-b", ready=False, serving=True, terminating=True))]
    assert announcements([web], draining, "node-b", ALLOW).prefixes()
    # ... and not once another is ready elsewhere: node-b withdraws (new flows go to node-c) while its
    # proxy still delivers what arrives meanwhile to the terminating pod
    moved = [
        eps(
            "web",
            objects.endpoint("192.0.2.1", "node-b", ready=False, serving=True, terminating=True),
            objects.endpoint("192.0.2.2", "node-c"),
        )
    ]
    assert not announcements([web], moved, "node-b", ALLOW).prefixes()
    assert announcements([web], moved, "node-c", ALLOW).prefixes()


def test_only_addresses_inside_a_pool_the_service_may_use() -> None:
    hijack = svc("hijack", external_ips=["203.0.113.99", "198.51.100.70"], lb_ips=["198.51.100.8"])
    slices = [eps("hijack", objects.endpoint("192.0.2.1"))]
    # "other" serves only Services labelled tier=internal; hijack is not
    other = AnnouncePool(OTHER.name, OTHER.cidrs, service_selector=LabelSelector((("tier", "internal"),)))
    result = announcements([hijack], slices, "node-a", AllowList.build([POOL, other]))
    assert [str(r.prefix) for r in result.routes] == ["198.51.100.8/32"]
    assert {(str(n.address), n.why) for n in result.not_announced} == {
        ("203.0.113.99", "in no pool this Service may use"),  # CVE-2020-8554: never announced
        ("198.51.100.70", "in no pool this Service may use"),  # in a pool, but not one it may use
    }


def test_a_shared_address_is_announced_while_either_service_wants_it() -> None:
    a = svc("a", lb_ips=["198.51.100.9"])
    b = svc("b", ips=["203.0.113.11", "fd00:96::11"], lb_ips=["198.51.100.9"])
    slices = [eps("a", objects.endpoint("192.0.2.1", ready=False)), eps("b", objects.endpoint("192.0.2.2"))]
    result = announcements([a, b], slices, "node-a", ALLOW)
    (route,) = result.routes
    assert route.services == ("default/b",) and result.not_announced == ()  # a's "no endpoint" is moot


def test_families_and_the_cluster_ip_range() -> None:
    dual = svc("dual", lb_ips=["198.51.100.7", "2001:db8:ee::7"])
    v6only = svc("six", ips=["fd00:96::12"], lb_ips=["198.51.100.12"])
    slices = [eps("dual", objects.endpoint("192.0.2.1")), eps("six", objects.endpoint("192.0.2.3"))]
    clusters = [(NET("fd00:10:96::/112"), POOL)]
    result = announcements([dual, v6only], slices, "node-a", ALLOW, cluster_ip_ranges=clusters)
    # dual has no IPv6 endpoint: its IPv6 address is not announced; six has no IPv4 ClusterIP
    assert [str(r.prefix) for r in result.routes] == ["198.51.100.7/32", "fd00:10:96::/112"]
    whys = {str(n.address): n.why for n in result.not_announced}
    assert "withdrawn" in whys["2001:db8:ee::7"] and whys["198.51.100.12"] == "the Service has no IPv4 ClusterIP"
    assert routes_by_pool(result, [POOL]) == [(POOL, (NET("198.51.100.7/32"), NET("fd00:10:96::/112")))]


def test_a_local_address_whose_every_endpoint_is_here_is_the_nodes_alone() -> None:
    """What a leaving node keeps (flock.agent._leave): withdrawn, its traffic would have nowhere to go."""
    local = svc("loc", etp="Local", lb_ips=["198.51.100.7"])
    cluster = svc("web", lb_ips=["198.51.100.8"])
    here = objects.endpoint("192.0.2.1", "node-b")
    there = objects.endpoint("192.0.2.2", "node-c")
    only_here = announcements([local, cluster], [eps("loc", here), eps("web", here)], "node-b", ALLOW)
    assert {str(r.prefix): r.alone for r in only_here.routes} == {"198.51.100.7/32": True, "198.51.100.8/32": False}
    both = announcements([local], [eps("loc", here, there)], "node-b", ALLOW)
    assert [r.alone for r in both.routes] == [False]
    # node-c's endpoint only serving while terminating, node-b's ready: node-c withdraws, so node-b is alone
    leaving = objects.endpoint("192.0.2.2", "node-c", ready=False, serving=True, terminating=True)
    assert [r.alone for r in announcements([local], [eps("loc", here, leaving)], "node-b", ALLOW).routes] == [True]
