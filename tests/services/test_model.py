"""Service and EndpointSlice values: what the API sends → what the proxy keeps, or InvalidObject naming the field."""

from __future__ import annotations

import copy
import ipaddress
from typing import Any

import pytest

from flock.model import InvalidObject
from flock.policy import Protocol
from flock.services import EndpointSlice, Family, Service, ServiceType, TrafficPolicy
from flock.testing import services as objects


def web(**kw: Any) -> dict[str, Any]:
    return objects.service(
        "web",
        ["fd00:96::10", "203.0.113.10"],
        [objects.port("http", 80, target="http", node_port=30080), objects.port("dns", 53, protocol="UDP")],
        type="NodePort",
        **kw,
    )


def test_a_dual_stack_service() -> None:
    svc = Service.from_object(web(etp="Local", health_check_node_port=32000, external_ips=["198.51.100.7"]))
    assert svc.key == "default/web" and svc.type is ServiceType.NODE_PORT and svc.proxied
    assert svc.cluster_ips == (ipaddress.ip_address("fd00:96::10"), ipaddress.ip_address("203.0.113.10"))
    assert svc.ip_families == (Family.IPV6, Family.IPV4)
    assert svc.cluster_ip(Family.IPV4) == ipaddress.ip_address("203.0.113.10")
    http, dns = svc.ports
    assert (http.name, http.protocol, http.port, http.target_port, http.node_port) == (
        "http", Protocol.TCP, 80, "http", 30080,
    )  # fmt: skip
    assert (dns.protocol, dns.target_port, dns.node_port) == (Protocol.UDP, 53, None)
    assert svc.external_traffic_policy is TrafficPolicy.LOCAL
    assert svc.internal_traffic_policy is TrafficPolicy.CLUSTER
    assert svc.health_check_node_port == 32000
    assert svc.external_ips == (ipaddress.ip_address("198.51.100.7"),)
    assert not svc.client_ip_affinity and svc.affinity_timeout == 10800 and svc.has_selector
    hash(svc)


def test_defaults_and_affinity() -> None:
    raw = web(affinity_timeout=60)
    svc = Service.from_object(raw)
    assert svc.client_ip_affinity and svc.affinity_timeout == 60
    del raw["spec"]["sessionAffinityConfig"]
    assert Service.from_object(raw).affinity_timeout == 10800
    bare = {"metadata": {"namespace": "ns", "name": "x"}, "spec": {"clusterIP": "203.0.113.1", "ports": [{"port": 1}]}}
    svc = Service.from_object(bare)
    assert svc.type is ServiceType.CLUSTER_IP and svc.ip_families == (Family.IPV4,)
    assert svc.ports[0].protocol is Protocol.TCP and svc.ports[0].target_port == 1 and not svc.has_selector


def test_headless_and_external_name_are_not_proxied() -> None:
    headless = objects.service("h", ["None"], [objects.port("", 80)])
    assert not Service.from_object(headless).proxied
    ext = {"metadata": {"namespace": "ns", "name": "e"}, "spec": {"type": "ExternalName", "externalName": "x.test"}}
    assert not Service.from_object(ext).proxied


def test_load_balancer_ingress_keeps_vip_addresses_only() -> None:
    raw = web(lb_ips=["203.0.113.50"])
    raw["status"]["loadBalancer"]["ingress"] += [{"hostname": "lb.test"}, {"ip": "203.0.113.51", "ipMode": "Proxy"}]
    assert Service.from_object(raw).load_balancer_ips == (ipaddress.ip_address("203.0.113.50"),)


def _set(obj: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    *parents, last = path.split(".")
    cur: Any = obj
    for p in parents:
        cur = cur[int(p)] if p.isdigit() else cur[p]
    if isinstance(cur, list):
        cur[int(last)] = value
    else:
        cur[last] = value
    return obj


BAD_SERVICES = [
    ("metadata.name", "Web!", "metadata.name"),
    ("metadata.namespace", "a/b", "metadata.namespace"),
    ("spec.type", "Magic", "spec.type"),
    ("spec.clusterIPs", ["fd00::1%eth0"], "spec.clusterIPs[0]"),
    ("spec.clusterIPs", ["fd00::1", "fd00::2"], "spec.clusterIPs"),
    ("spec.clusterIPs", [7], "spec.clusterIPs[0]"),
    ("spec.ipFamilies", ["IPv5"], "spec.ipFamilies[0]"),
    ("spec.ports", "80", "spec.ports"),
    ("spec.ports.0.port", 0, "spec.ports[0].port"),
    ("spec.ports.0.port", True, "spec.ports[0].port"),
    ("spec.ports.0.protocol", "ICMP", "spec.ports[0].protocol"),
    ("spec.ports.0.targetPort", "Not_A_Name", "spec.ports[0].targetPort"),
    ("spec.ports.0.nodePort", 70000, "spec.ports[0].nodePort"),
    ("spec.ports.0.name", "dns", "spec.ports[1].name"),
    ("spec.ports.1.name", "", "spec.ports[1].name"),
    ("spec.ports.0.name", "x; flush ruleset", "spec.ports[0].name"),
    ("spec.externalIPs", ["not-an-ip"], "spec.externalIPs[0]"),
    ("spec.externalTrafficPolicy", "Nearby", "spec.externalTrafficPolicy"),
    ("spec.internalTrafficPolicy", "Nearby", "spec.internalTrafficPolicy"),
    ("spec.sessionAffinity", "Cookie", "spec.sessionAffinity"),
    ("spec.healthCheckNodePort", "32000", "spec.healthCheckNodePort"),
    ("spec.selector", ["app"], "spec.selector"),
]


@pytest.mark.parametrize(("path", "value", "field"), BAD_SERVICES)
def test_a_bad_service_names_the_field(path: str, value: Any, field: str) -> None:
    with pytest.raises(InvalidObject) as info:
        Service.from_object(_set(web(), path, value))
    assert info.value.field == field
    assert info.value.kind == "Service"


def test_affinity_timeout_bounds() -> None:
    with pytest.raises(InvalidObject, match="timeoutSeconds"):
        Service.from_object(web(affinity_timeout=86401))


def test_the_error_shows_a_bounded_prefix_of_a_huge_value() -> None:
    with pytest.raises(InvalidObject) as info:
        Service.from_object(_set(web(), "spec.ports.0.targetPort", "x" * 100_000))
    assert len(str(info.value)) < 600


def test_too_many_ports_is_refused_without_reading_them() -> None:
    raw = _set(web(), "spec.ports", [objects.port(f"p{i}", i + 1) for i in range(5000)])
    with pytest.raises(InvalidObject) as info:
        Service.from_object(raw)
    assert info.value.field == "spec.ports"


def test_not_an_object() -> None:
    for raw in (None, [], "svc", {"metadata": "x"}, {"metadata": {"name": "a", "namespace": "b"}}):
        with pytest.raises(InvalidObject):
            Service.from_object(raw)


def slice6(**kw: Any) -> dict[str, Any]:
    return objects.endpoint_slice(
        "web",
        [
            objects.endpoint("2001:db8:10::1", "node-a", pod="a"),
            {"addresses": ["2001:db8:10::2"], "conditions": {"ready": None, "terminating": True}},
        ],
        [objects.slice_port("http", 8080), {"name": "all", "port": None}],
        **kw,
    )


def test_an_endpoint_slice_with_nil_conditions() -> None:
    eps = EndpointSlice.from_object(slice6())
    assert eps.key == "default/web-ipv6" and eps.service_key == "default/web" and eps.family is Family.IPV6
    a, b = eps.endpoints
    assert (a.ready, a.serving, a.terminating, a.node_name) == (True, True, False, "node-a")
    # ready nil → true, serving nil → ready, terminating as given
    assert (b.ready, b.serving, b.terminating, b.node_name) == (True, True, True, None)
    assert [(p.name, p.protocol, p.port) for p in eps.ports] == [("http", Protocol.TCP, 8080)]  # nil port skipped
    hash(eps)


def test_serving_follows_ready_when_nil() -> None:
    raw = slice6()
    raw["endpoints"][0]["conditions"] = {"ready": False}
    assert EndpointSlice.from_object(raw).endpoints[0].serving is False


def test_fqdn_slices_and_unlabelled_slices() -> None:
    raw = slice6(address_type="FQDN")
    raw["endpoints"] = [{"addresses": ["web.test"]}]
    eps = EndpointSlice.from_object(raw)
    assert eps.family is None and eps.endpoints == ()
    raw = slice6()
    del raw["metadata"]["labels"]
    assert EndpointSlice.from_object(raw).service is None


BAD_SLICES = [
    ("addressType", "IPv7", "addressType"),
    ("endpoints.0.addresses", ["192.0.2.1"], "endpoints[0].addresses[0]"),
    ("endpoints.0.addresses", [], "endpoints[0].addresses"),
    ("endpoints.0.conditions", {"ready": "yes"}, "endpoints[0].conditions.ready"),
    ("endpoints.0.nodeName", "Node_A", "endpoints[0].nodeName"),
    ("ports.0.port", 65536, "ports[0].port"),
    ("ports.0.protocol", "GRE", "ports[0].protocol"),
    ("ports.0.name", "HTTP", "ports[0].name"),
    ("metadata.labels", {"kubernetes.io/service-name": "bad name"}, "metadata.labels.kubernetes.io/service-name"),
]


@pytest.mark.parametrize(("path", "value", "field"), BAD_SLICES)
def test_a_bad_slice_names_the_field(path: str, value: Any, field: str) -> None:
    with pytest.raises(InvalidObject) as info:
        EndpointSlice.from_object(_set(slice6(), path, value))
    assert info.value.field == field
    assert info.value.kind == "EndpointSlice"
