"""Services and EndpointSlices in the fake API server's store: ClusterIP and NodePort allocation,
dual-stack families, upstream's defaults and messages, updates keeping allocations, the race for
one requested address, and allocations surviving a load."""

from __future__ import annotations

import ipaddress
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from flock.apiserver import ENDPOINTSLICES, SERVICES, ObjectStore, StatusError, load_objects
from flock.apiserver._selectors import FieldSelector

DUAL = "fd00:10:96::/112,192.0.2.192/27"


def service(name: str = "web", namespace: str = "shop", **spec: Any) -> dict[str, Any]:
    spec.setdefault("ports", [{"port": 80}])
    spec.setdefault("selector", {"app": name})
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def refused(store: ObjectStore, obj: dict[str, Any]) -> tuple[str, str]:
    """(field, message) of the 422 creating *obj* answers."""
    with pytest.raises(StatusError) as err:
        store.create(SERVICES, obj)
    assert err.value.code == 422 and err.value.reason == "Invalid", err.value.message
    assert err.value.details is not None
    cause = err.value.details["causes"][0]
    return cause["field"], cause["message"]


def test_defaults_and_a_random_cluster_ip_from_the_range() -> None:
    store = ObjectStore()
    created = store.create(SERVICES, service())
    spec = created["spec"]
    assert spec["type"] == "ClusterIP" and spec["sessionAffinity"] == "None"
    assert spec["internalTrafficPolicy"] == "Cluster" and "externalTrafficPolicy" not in spec
    assert spec["ipFamilyPolicy"] == "SingleStack" and spec["ipFamilies"] == ["IPv6"]
    assert spec["ports"] == [{"port": 80, "protocol": "TCP", "targetPort": 80}]
    ip = ipaddress.ip_address(spec["clusterIP"])
    assert spec["clusterIPs"] == [spec["clusterIP"]] and ip in ipaddress.ip_network("fd00:10:96::/112")
    # The dynamic band first: never the network address, and above the static band's 256.
    assert int(ip) - int(ipaddress.ip_address("fd00:10:96::")) > 256
    assert created["status"] == {"loadBalancer": {}}
    headless = store.create(SERVICES, service("db", clusterIP="None"))["spec"]
    assert headless["clusterIPs"] == ["None"] and headless["ipFamilies"] == ["IPv6"]
    named = store.create(SERVICES, service("dns", type="ExternalName", externalName="db.example.com", ports=[]))
    assert "clusterIP" not in named["spec"] and "ipFamilies" not in named["spec"]


def test_client_ip_affinity_defaults_and_bounds() -> None:
    store = ObjectStore()
    spec = store.create(SERVICES, service(sessionAffinity="ClientIP"))["spec"]
    assert spec["sessionAffinityConfig"] == {"clientIP": {"timeoutSeconds": 10800}}
    field, message = refused(
        store, service("b", sessionAffinity="ClientIP", sessionAffinityConfig={"clientIP": {"timeoutSeconds": 0}})
    )
    assert field == "spec.sessionAffinityConfig.clientIP.timeoutSeconds"
    assert message == "must be greater than 0 and less than 86400"


def test_requested_cluster_ips_are_checked() -> None:
    store = ObjectStore()
    store.create(SERVICES, service("a", clusterIP="fd00:10:96::10"))
    assert refused(store, service("b", clusterIP="fd00:10:96::10")) == (
        "spec.clusterIPs",
        "failed to allocate IP fd00:10:96::10: provided IP is already allocated",
    )
    assert refused(store, service("c", clusterIP="2001:db8::1")) == (
        "spec.clusterIPs",
        "failed to allocate IP 2001:db8::1: provided IP is not in the valid range. "
        "The range of valid IPs is fd00:10:96::/112",
    )
    assert refused(store, service("d", clusterIP="fd00:10:96::"))[1].endswith(
        "not in the valid range. The range of valid IPs is fd00:10:96::/112"
    )
    assert refused(store, service("e", clusterIP="192.0.2.200")) == (
        "spec.clusterIPs[0]",
        "IPv4 is not configured on this cluster",
    )
    assert refused(store, service("f", clusterIP="nope"))[1].startswith("must be a valid IP address")
    # Deleted, the address is free again.
    store.delete(SERVICES, "a", "shop")
    assert store.create(SERVICES, service("b", clusterIP="fd00:10:96::10"))["spec"]["clusterIP"] == "fd00:10:96::10"


def test_ipv4_range_never_gives_network_or_broadcast() -> None:
    store = ObjectStore(service_cluster_ip_range="192.0.2.192/30")  # two usable addresses
    got = {store.create(SERVICES, service(f"s{i}"))["spec"]["clusterIP"] for i in range(2)}
    assert got == {"192.0.2.193", "192.0.2.194"}
    with pytest.raises(StatusError) as err:
        store.create(SERVICES, service("s3"))
    assert err.value.code == 500 and "failed to allocate a serviceIP: range is full" in err.value.message
    assert "The range of valid IPs is 192.0.2.192/30" in refused(store, service("s4", clusterIP="192.0.2.195"))[1]


def test_dual_stack_policies() -> None:
    store = ObjectStore(service_cluster_ip_range=DUAL)
    single = store.create(SERVICES, service("single"))["spec"]
    assert single["ipFamilies"] == ["IPv6"] and len(single["clusterIPs"]) == 1
    prefer = store.create(SERVICES, service("prefer", ipFamilyPolicy="PreferDualStack"))["spec"]
    assert prefer["ipFamilies"] == ["IPv6", "IPv4"]
    assert ipaddress.ip_address(prefer["clusterIPs"][1]) in ipaddress.ip_network("192.0.2.192/27")
    v4 = store.create(SERVICES, service("v4", ipFamilyPolicy="RequireDualStack", ipFamilies=["IPv4"]))["spec"]
    assert v4["ipFamilies"] == ["IPv4", "IPv6"] and v4["clusterIP"].startswith("192.0.2.")
    only4 = store.create(SERVICES, service("only4", ipFamilies=["IPv4"]))["spec"]
    assert only4["ipFamilies"] == ["IPv4"] and only4["ipFamilyPolicy"] == "SingleStack"
    assert refused(store, service("bad", ipFamilies=["IPv6", "IPv4"])) == (
        "spec.ipFamilyPolicy",
        "must be 'RequireDualStack' or 'PreferDualStack' when multiple IP families are specified",
    )
    assert refused(store, service("bad", ipFamilyPolicy="Sometimes"))[1] == (
        'Unsupported value: "Sometimes": supported values: "PreferDualStack", "RequireDualStack", "SingleStack"'
    )
    assert refused(store, service("bad", clusterIP="192.0.2.200", ipFamilies=["IPv6"])) == (
        "spec.clusterIPs[0]",
        "expected an IPv6 value as indicated by `ipFamilies[0]`",
    )
    # Headless without a selector: dual-stack by default.
    headless = store.create(SERVICES, service("hl", clusterIP="None", selector=None))["spec"]
    assert headless["ipFamilyPolicy"] == "RequireDualStack" and headless["ipFamilies"] == ["IPv6", "IPv4"]
    # A single-stack cluster refuses RequireDualStack and keeps PreferDualStack single.
    one = ObjectStore()
    assert refused(one, service("x", ipFamilyPolicy="RequireDualStack")) == (
        "spec.ipFamilyPolicy",
        "this cluster is not configured for dual-stack services",
    )
    assert one.create(SERVICES, service("y", ipFamilyPolicy="PreferDualStack"))["spec"]["ipFamilies"] == ["IPv6"]
    assert refused(one, service("z", ipFamilies=["IPv4"])) == ("spec.ipFamilies[0]", "not configured on this cluster")


def test_upgrade_and_downgrade_between_single_and_dual_stack() -> None:
    store = ObjectStore(service_cluster_ip_range=DUAL)
    created = store.create(SERVICES, service())
    primary = created["spec"]["clusterIP"]
    up = store.patch(SERVICES, "web", {"spec": {"ipFamilyPolicy": "RequireDualStack"}}, "shop")
    assert up["spec"]["clusterIPs"][0] == primary and len(up["spec"]["clusterIPs"]) == 2
    with pytest.raises(StatusError) as err:
        store.patch(SERVICES, "web", {"spec": {"ipFamilyPolicy": "PreferDualStack", "clusterIPs": [primary]}}, "shop")
    assert "must be 'SingleStack' to release the secondary" in err.value.message or "SingleStack" in err.value.message
    down = store.patch(SERVICES, "web", {"spec": {"ipFamilyPolicy": "SingleStack"}}, "shop")
    assert down["spec"]["clusterIPs"] == [primary] and down["spec"]["ipFamilies"] == ["IPv6"]
    # The released secondary can be asked for again.
    secondary = up["spec"]["clusterIPs"][1]
    again = store.create(SERVICES, service("again", clusterIPs=[secondary], clusterIP=secondary, ipFamilies=["IPv4"]))
    assert again["spec"]["clusterIP"] == secondary


def test_node_ports_allocated_checked_kept_and_released() -> None:
    store = ObjectStore()
    ports = [{"name": "http", "port": 80}, {"name": "dns", "port": 53, "protocol": "UDP"}]
    created = store.create(SERVICES, service(type="NodePort", ports=ports))["spec"]
    allocated = [p["nodePort"] for p in created["ports"]]
    assert all(30000 <= p <= 32767 for p in allocated) and len(set(allocated)) == 2
    assert created["externalTrafficPolicy"] == "Cluster"
    taken = allocated[0]
    assert refused(store, service("b", type="NodePort", ports=[{"port": 80, "nodePort": taken}])) == (
        "spec.ports[0].nodePort",
        "provided port is already allocated",
    )
    assert refused(store, service("c", type="NodePort", ports=[{"port": 80, "nodePort": 8080}])) == (
        "spec.ports[0].nodePort",
        "provided port is not in the valid range. The range of valid ports is 30000-32767",
    )
    # An update that omits the nodePorts (kubectl apply, a PUT of the file) keeps them.
    current = store.get(SERVICES, "web", "shop")
    current["spec"]["ports"] = [{"name": "http", "port": 80}, {"name": "dns", "port": 53, "protocol": "UDP"}]
    updated = store.update(SERVICES, current)["spec"]
    assert [p["nodePort"] for p in updated["ports"]] == allocated
    # Back to ClusterIP: the nodePorts go and are free for others.
    store.patch(SERVICES, "web", {"spec": {"type": "ClusterIP"}}, "shop")
    assert "nodePort" not in store.get(SERVICES, "web", "shop")["spec"]["ports"][0]
    assert store.create(SERVICES, service("d", type="NodePort", ports=[{"port": 80, "nodePort": taken}]))
    assert refused(store, service("e", ports=[{"port": 80, "nodePort": 30555}])) == (
        "spec.ports[0].nodePort",
        "Forbidden: may not be used when `type` is 'ClusterIP'",
    )


def test_cluster_ip_may_not_change() -> None:
    store = ObjectStore()
    created = store.create(SERVICES, service())
    with pytest.raises(StatusError) as err:
        store.patch(SERVICES, "web", {"spec": {"clusterIP": "fd00:10:96::99"}}, "shop")
    assert err.value.details is not None
    assert err.value.details["causes"][0] == {"field": "spec.clusterIPs[0]", "message": "may not change once set"}
    # Omitted on update: kept.
    current = store.get(SERVICES, "web", "shop")
    del current["spec"]["clusterIP"], current["spec"]["clusterIPs"]
    assert store.update(SERVICES, current)["spec"]["clusterIP"] == created["spec"]["clusterIP"]


def test_load_balancer_health_check_and_status() -> None:
    store = ObjectStore()
    spec = store.create(SERVICES, service(type="LoadBalancer", externalTrafficPolicy="Local"))["spec"]
    assert spec["allocateLoadBalancerNodePorts"] is True and 30000 <= spec["healthCheckNodePort"] <= 32767
    assert spec["healthCheckNodePort"] != spec["ports"][0]["nodePort"]
    no_ports = store.create(SERVICES, service("np", type="LoadBalancer", allocateLoadBalancerNodePorts=False))
    assert "nodePort" not in no_ports["spec"]["ports"][0]
    status = store.set_status(SERVICES, "web", {"loadBalancer": {"ingress": [{"ip": "198.51.100.7"}]}}, "shop")
    assert status["status"]["loadBalancer"]["ingress"] == [{"ip": "198.51.100.7", "ipMode": "VIP"}]
    with pytest.raises(StatusError) as err:
        store.set_status(SERVICES, "web", {"loadBalancer": {"ingress": [{"ip": "x", "ipMode": "VIP"}]}}, "shop")
    assert (
        err.value.details is not None and err.value.details["causes"][0]["field"] == "status.loadBalancer.ingress[0].ip"
    )
    with pytest.raises(StatusError) as err:
        store.set_status(
            SERVICES, "web", {"loadBalancer": {"ingress": [{"ip": "198.51.100.7", "ipMode": "Fast"}]}}, "shop"
        )
    assert err.value.details is not None
    assert err.value.details["causes"][0]["message"] == 'Unsupported value: "Fast": supported values: "Proxy", "VIP"'
    # A write of the main resource keeps the status; moving off LoadBalancer clears it.
    patched = store.patch(SERVICES, "web", {"metadata": {"labels": {"a": "b"}}, "status": {}}, "shop")
    assert patched["status"]["loadBalancer"]["ingress"][0]["ip"] == "198.51.100.7"
    assert store.patch(SERVICES, "web", {"spec": {"type": "ClusterIP"}}, "shop")["status"] == {"loadBalancer": {}}
    with pytest.raises(StatusError) as err:
        store.set_status(SERVICES, "web", {"loadBalancer": {"ingress": [{"ip": "198.51.100.7"}]}}, "shop")
    assert err.value.details is not None
    assert err.value.details["causes"][0]["message"] == "Forbidden: may only be used when `spec.type` is 'LoadBalancer'"


@pytest.mark.parametrize(
    ("spec", "field", "message"),
    [
        ({"ports": []}, "spec.ports", "Required value"),
        ({"ports": [{"port": 80}, {"port": 81}]}, "spec.ports[0].name", "Required value"),
        ({"ports": [{"name": "a", "port": 80}, {"name": "a", "port": 81}]}, "spec.ports[1].name", "Duplicate value"),
        ({"ports": [{"name": "a", "port": 80}, {"name": "b", "port": 80}]}, "spec.ports[1]", "Duplicate value"),
        ({"ports": [{"port": 0}]}, "spec.ports[0].port", "must be between 1 and 65535, inclusive"),
        ({"ports": [{"port": 70000}]}, "spec.ports[0].port", "must be between 1 and 65535, inclusive"),
        ({"ports": [{"port": 80, "protocol": "ICMP"}]}, "spec.ports[0].protocol",
         'Unsupported value: "ICMP": supported values: "SCTP", "TCP", "UDP"'),
        ({"ports": [{"port": 80, "targetPort": 70000}]}, "spec.ports[0].targetPort",
         "must be between 1 and 65535, inclusive"),
        ({"type": "Magic"}, "spec.type",
         'Unsupported value: "Magic": supported values: "ClusterIP", "ExternalName", "LoadBalancer", "NodePort"'),
        ({"selector": {"bad key": "x"}}, "spec.selector", None),
        ({"externalIPs": ["nope"]}, "spec.externalIPs[0]", "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"),
        ({"externalIPs": ["127.0.0.1"]}, "spec.externalIPs[0]", "may not be in the loopback range (127.0.0.0/8, ::1/128)"),
        ({"type": "NodePort", "clusterIP": "None"}, "spec.clusterIPs[0]", "may not be set to 'None' for NodePort services"),
        ({"type": "ExternalName", "ports": []}, "spec.externalName", "Required value"),
        ({"loadBalancerClass": "example.com/lb"}, "spec.loadBalancerClass",
         "Forbidden: may only be used when service type is 'LoadBalancer'"),
        ({"externalTrafficPolicy": "Local"}, "spec.externalTrafficPolicy", "may only be set for externally-accessible services"),
        ({"type": "NodePort", "externalTrafficPolicy": "Sometimes"}, "spec.externalTrafficPolicy",
         'Unsupported value: "Sometimes": supported values: "Cluster", "Local"'),
        ({"sessionAffinity": "Sticky"}, "spec.sessionAffinity",
         'Unsupported value: "Sticky": supported values: "ClientIP", "None"'),
        ({"healthCheckNodePort": 30100}, "spec.healthCheckNodePort",
         "may only be set when `type` is 'LoadBalancer' and `externalTrafficPolicy` is 'Local'"),
    ],
)  # fmt: skip
def test_validation_messages(spec: dict[str, Any], field: str, message: str | None) -> None:
    got_field, got_message = refused(ObjectStore(), service(**spec))
    assert got_field == field
    if message is not None:
        assert got_message == message


def test_racing_creates_for_one_address_one_wins() -> None:
    store = ObjectStore()
    results: list[str] = []
    start = threading.Barrier(8)

    def create(i: int) -> None:
        start.wait()
        try:
            store.create(SERVICES, service(f"s{i}", clusterIP="fd00:10:96::77"))
            results.append("created")
        except StatusError as err:
            assert err.code == 422 and "provided IP is already allocated" in err.message
            results.append("refused")

    threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(results) == ["created"] + ["refused"] * 7


def test_allocations_survive_a_load(tmp_path: Path) -> None:
    path = tmp_path / "objects.json"
    objects = [
        service("a", clusterIP="fd00:10:96::5", type="NodePort", ports=[{"port": 80, "nodePort": 30080}]),
        service("b"),
    ]
    path.write_text(json.dumps({"kind": "List", "items": objects}))
    store = ObjectStore()
    assert load_objects(store, path) == 2
    loaded = {s["metadata"]["name"]: s for s in store.list(SERVICES)[0]}
    assert loaded["b"]["spec"]["clusterIP"].startswith("fd00:10:96::")
    assert refused(store, service("c", clusterIP="fd00:10:96::5"))[1].endswith("provided IP is already allocated")
    assert refused(store, service("d", type="NodePort", ports=[{"port": 80, "nodePort": 30080}]))[1] == (
        "provided port is already allocated"
    )
    duplicate = tmp_path / "bad.json"
    duplicate.write_text(json.dumps([service("x", clusterIP="fd00:10:96::9"), service("y", clusterIP="fd00:10:96::9")]))
    with pytest.raises(SystemExit, match="provided IP is already allocated"):
        load_objects(ObjectStore(), duplicate)


def test_field_selectors() -> None:
    store = ObjectStore()
    store.create(SERVICES, service("a", type="NodePort"))
    store.create(SERVICES, service("b", clusterIP="None"))
    names = [
        s["metadata"]["name"]
        for s in store.list(SERVICES, None, FieldSelector.parse("spec.type=NodePort", "Service"))[0]
    ]
    assert names == ["a"]
    headful = store.list(SERVICES, None, FieldSelector.parse("spec.clusterIP!=None", "Service"))[0]
    assert [s["metadata"]["name"] for s in headful] == ["a"]


def test_bad_service_range_is_refused() -> None:
    for text in ("", "fd00::/112,fd01::/112", "10.0.0.1/24", "a,b,c"):
        with pytest.raises(ValueError, match="service cluster IP range"):
            ObjectStore(service_cluster_ip_range=text)


# ---- EndpointSlices ---------------------------------------------------------------------


def endpoint_slice(name: str = "web-abc", **fields: Any) -> dict[str, Any]:
    obj = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "shop", "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv6",
        "endpoints": [{"addresses": ["2001:db8::5"], "conditions": {"ready": True}, "nodeName": "node1"}],
        "ports": [{"name": "http", "port": 8080}],
    }
    obj.update(fields)
    return obj


def test_endpoint_slice_defaults_and_immutable_address_type() -> None:
    store = ObjectStore()
    created = store.create(ENDPOINTSLICES, endpoint_slice())
    assert created["ports"] == [{"name": "http", "port": 8080, "protocol": "TCP"}]
    with pytest.raises(StatusError) as err:
        store.patch(
            ENDPOINTSLICES, "web-abc", {"addressType": "IPv4", "endpoints": [{"addresses": ["192.0.2.1"]}]}, "shop"
        )
    assert err.value.details is not None
    assert err.value.details["causes"][0] == {"field": "addressType", "message": "field is immutable"}
    moved = store.patch(ENDPOINTSLICES, "web-abc", {"endpoints": [{"addresses": ["2001:db8::6"]}]}, "shop")
    assert moved["metadata"]["generation"] == 2


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"addressType": None}, "addressType", "Required value"),
        ({"addressType": "IP"}, "addressType", 'Unsupported value: "IP": supported values: "FQDN", "IPv4", "IPv6"'),
        ({"endpoints": [{"addresses": []}]}, "endpoints[0].addresses", "Required value: must contain at least 1 address"),
        ({"endpoints": [{"addresses": ["192.0.2.1"]}]}, "endpoints[0].addresses[0]", "must be a valid IPv6 address"),
        ({"endpoints": [{"addresses": ["::1"]}]}, "endpoints[0].addresses[0]",
         "may not be in the loopback range (127.0.0.0/8, ::1/128)"),
        ({"endpoints": [{"addresses": [f"2001:db8::{i:x}" for i in range(101)]}]}, "endpoints[0].addresses",
         "Too many: must have at most 100 items"),
        ({"endpoints": [{"addresses": ["2001:db8::1"]}] * 1001}, "endpoints", "Too many: must have at most 1000 items"),
        ({"endpoints": [{"addresses": ["2001:db8::1"], "conditions": {"ready": "yes"}}]}, "endpoints[0].conditions.ready",
         "must be a boolean"),
        ({"endpoints": [{"addresses": ["2001:db8::1"], "nodeName": "Node_1"}]}, "endpoints[0].nodeName", None),
        ({"ports": [{"name": "a", "port": 1}, {"name": "a", "port": 2}]}, "ports[1].name", "Duplicate value"),
        ({"ports": [{"name": "a", "protocol": "ICMP"}]}, "ports[0].protocol",
         'Unsupported value: "ICMP": supported values: "SCTP", "TCP", "UDP"'),
        ({"addressType": "FQDN", "endpoints": [{"addresses": ["localhost"]}]}, "endpoints[0].addresses[0]",
         "should be a domain with at least two segments separated by dots"),
    ],
)  # fmt: skip
def test_endpoint_slice_validation(fields: dict[str, Any], field: str, message: str | None) -> None:
    with pytest.raises(StatusError) as err:
        ObjectStore().create(ENDPOINTSLICES, endpoint_slice(**fields))
    assert err.value.code == 422 and err.value.details is not None
    cause = err.value.details["causes"][0]
    assert cause["field"] == field
    if message is not None:
        assert cause["message"] == message
