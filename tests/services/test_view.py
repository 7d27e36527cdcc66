"""flockctl services' view: for each port and family, the endpoints chosen and why, in kube-proxy's terms."""

from __future__ import annotations

import ipaddress

from flock.services import AllowList, EndpointSlice, NodeView, Service, ServicesConfig
from flock.services._view import services_view, view_text
from flock.testing.services import endpoint, endpoint_slice, port, service, slice_port

NODE = NodeView("node-a", (ipaddress.ip_address("2001:db8:ffff::101"),))
POOLS = ServicesConfig(allow=AllowList.of_cidrs((ipaddress.ip_network("2001:db8:53::/64"),)))


def web(**kw) -> Service:
    return Service.from_object(service("web", ["fd00:10:96::a"], [port("http", 80, node_port=30080)], **kw))


def slices(*eps) -> dict[str, EndpointSlice]:
    s = EndpointSlice.from_object(endpoint_slice("web", list(eps), [slice_port("http", 8080)]))
    return {s.key: s}


def the_family(view, family="IPv6"):
    return view["ports"][0]["families"][family]


def test_ready_endpoints_are_chosen_and_the_others_say_why():
    eps = slices(
        endpoint("2001:db8:0:1::1", "node-a"),
        endpoint("2001:db8:0:2::1", "node-b", ready=False),
        endpoint("2001:db8:0:2::2", "node-b", ready=False, serving=True, terminating=True),
    )
    [view] = services_view({"default/web": web(type="NodePort")}, eps, NODE, POOLS)
    fam = the_family(view)
    assert fam["outcome"] == "ClusterIP forwarded to 1; external forwarded to 1"
    assert [(e["address"], e["chosen"], e["why"]) for e in fam["endpoints"]] == [
        ("2001:db8:0:1::1", True, "ready"),
        ("2001:db8:0:2::1", False, "not ready"),
        ("2001:db8:0:2::2", False, "a ready endpoint is preferred"),
    ]
    text = view_text(view)
    assert "port http 80/TCP nodePort 30080" in text and "→ [2001:db8:0:1::1]:8080 (local) ready" in text


def test_serving_terminating_endpoints_take_over_when_none_is_ready():
    eps = slices(endpoint("2001:db8:0:2::2", "node-b", ready=False, serving=True, terminating=True))
    fam = the_family(services_view({"default/web": web()}, eps, NODE, POOLS)[0])
    assert [(e["chosen"], e["why"]) for e in fam["endpoints"]] == [
        (True, "serving and terminating (no endpoint is ready)")
    ]


def test_no_endpoint_is_refused_and_local_policies_say_where_traffic_goes():
    [view] = services_view({"default/web": web()}, {}, NODE, POOLS)
    assert the_family(view)["outcome"].startswith("refused")
    eps = slices(endpoint("2001:db8:0:2::1", "node-b"))
    internal_only = Service.from_object(service("web", ["fd00:10:96::a"], [port("http", 80)], itp="Local"))
    fam = the_family(services_view({"default/web": internal_only}, eps, NODE, POOLS)[0])
    assert fam["outcome"] == "ClusterIP dropped here (internalTrafficPolicy: Local, no endpoint on this node)"
    assert fam["endpoints"][0] == {
        **fam["endpoints"][0],
        "chosen": False,
        "why": "on another node (internalTrafficPolicy: Local)",
    }
    fam = the_family(services_view({"default/web": web(type="NodePort", etp="Local")}, eps, NODE, POOLS)[0])
    assert fam["outcome"] == (
        "ClusterIP forwarded to 1; external dropped here (externalTrafficPolicy: Local, no endpoint on this node)"
    )


def test_external_addresses_outside_every_pool_are_named_untranslated():
    svc = Service.from_object(
        service(
            "web",
            ["fd00:10:96::a"],
            [port("http", 80, node_port=30080)],
            type="LoadBalancer",
            external_ips=["2001:db8:53::1", "2001:db8:dead::1"],
            etp="Local",
            health_check_node_port=31000,
        )
    )
    [view] = services_view({"default/web": svc}, {}, NODE, POOLS)
    assert view["external_addresses"] == ["2001:db8:53::1"] and view["untranslated"] == ["2001:db8:dead::1"]
    assert view["health_check_node_port"] == 31000
    assert "not translated (in no pool, CVE-2020-8554): 2001:db8:dead::1" in view_text(view)


def test_headless_is_not_translated_and_one_service_can_be_asked_for():
    headless = Service.from_object(service("db", ["None"], [port("pg", 5432)]))
    views = services_view({"default/db": headless, "default/web": web()}, {}, NODE, POOLS, only="default/db")
    assert [v["name"] for v in views] == ["db"] and views[0]["why_not"] == "headless: DNS only"
    assert services_view({"default/web": web()}, {}, NODE, POOLS, only="default/nope") == []


def test_what_the_node_announces_of_a_service_and_why_not():
    from flock.model import Communities
    from flock.services import AllowList, AnnouncePool, announcements
    from flock.services._view import bgp_view

    svc = Service.from_object(
        service(
            "web",
            ["fd00:10:96::a"],
            [port("http", 80, node_port=30080)],
            type="LoadBalancer",
            external_ips=["2001:db8:53::1", "2001:db8:dead::1"],
        )
    )
    pool = AnnouncePool("public", (ipaddress.ip_network("2001:db8:53::/64"),), Communities(((64512, 7),)), 150)
    eps = EndpointSlice.from_object(endpoint_slice("web", [endpoint("2001:db8:0:1::1")], [slice_port("http", 8080)]))
    result = announcements([svc], [eps], NODE.name, AllowList.build([pool]))
    [view] = services_view({"default/web": svc}, {}, NODE, POOLS)
    view["bgp"] = bgp_view("default/web", result)
    text = view_text(view)
    assert (
        "BGP: announces 2001:db8:53::1/128 (pool public, communities 64512:7, local preference 150): "
        "externalTrafficPolicy Cluster: the Service has an endpoint" in text
    )
    assert "BGP: does not announce 2001:db8:dead::1: in no pool this Service may use" in text
    assert bgp_view("default/other", result) == {"announced": [], "not_announced": []}
