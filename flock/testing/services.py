"""Service and EndpointSlice objects in their JSON form, for the service proxy's tests and benchmarks.

Each builder returns the dict the API server would send (camelCase), so tests
go through the models' ``from_object`` exactly as the watchers will.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from typing import Any


def port(
    name: str = "",
    port: int = 80,
    *,
    protocol: str = "TCP",
    target: int | str | None = None,
    node_port: int | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {"port": port, "protocol": protocol, "targetPort": target if target is not None else port}
    if name:
        out["name"] = name
    if node_port is not None:
        out["nodePort"] = node_port
    return out


def service(
    name: str,
    cluster_ips: Sequence[str],
    ports: Iterable[dict[str, Any]],
    *,
    namespace: str = "default",
    type: str = "ClusterIP",
    external_ips: Sequence[str] = (),
    lb_ips: Sequence[str] = (),
    etp: str | None = None,
    itp: str | None = None,
    affinity_timeout: int | None = None,
    health_check_node_port: int | None = None,
) -> dict[str, Any]:
    families = ["IPv6" if ":" in ip else "IPv4" for ip in cluster_ips if ip != "None"]
    spec: dict[str, Any] = {
        "type": type,
        "clusterIP": cluster_ips[0] if cluster_ips else None,
        "clusterIPs": list(cluster_ips),
        "ipFamilies": families,
        "ports": list(ports),
        "selector": {"app": name},
    }
    if external_ips:
        spec["externalIPs"] = list(external_ips)
    if etp:
        spec["externalTrafficPolicy"] = etp
    if itp:
        spec["internalTrafficPolicy"] = itp
    if affinity_timeout is not None:
        spec["sessionAffinity"] = "ClientIP"
        spec["sessionAffinityConfig"] = {"clientIP": {"timeoutSeconds": affinity_timeout}}
    if health_check_node_port is not None:
        spec["healthCheckNodePort"] = health_check_node_port
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "Service", "metadata": {"namespace": namespace, "name": name}}
    obj["spec"] = spec
    if lb_ips:
        obj["status"] = {"loadBalancer": {"ingress": [{"ip": ip} for ip in lb_ips]}}
    return obj


def endpoint(
    address: str,
    node: str | None = "node-a",
    *,
    ready: bool | None = True,
    serving: bool | None = None,
    terminating: bool | None = None,
    pod: str | None = None,
) -> dict[str, Any]:
    conditions = {
        k: v for k, v in (("ready", ready), ("serving", serving), ("terminating", terminating)) if v is not None
    }
    out: dict[str, Any] = {"addresses": [address], "conditions": conditions}
    if node is not None:
        out["nodeName"] = node
    if pod is not None:
        out["targetRef"] = {"kind": "Pod", "namespace": "default", "name": pod}
    return out


def endpoint_slice(
    service_name: str,
    endpoints: Iterable[dict[str, Any]],
    ports: Iterable[dict[str, Any]],
    *,
    name: str | None = None,
    namespace: str = "default",
    address_type: str | None = None,
) -> dict[str, Any]:
    endpoints = list(endpoints)
    if address_type is None:
        first = endpoints[0]["addresses"][0] if endpoints else ""
        address_type = "IPv6" if ":" in first else "IPv4"
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "namespace": namespace,
            "name": name or f"{service_name}-{address_type.lower()}",
            "labels": {"kubernetes.io/service-name": service_name},
        },
        "addressType": address_type,
        "endpoints": endpoints,
        "ports": list(ports),
    }


def slice_port(name: str = "", port: int = 80, protocol: str = "TCP") -> dict[str, Any]:
    return {"name": name, "port": port, "protocol": protocol}


def random_cluster(rng: random.Random, *, max_services: int = 5) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A few dual-stack Services (affinity, Local policies, NodePorts, a shared externalIP at times) and
    their EndpointSlices with random conditions and nodes: for properties over pairs of states."""
    services, slices = [], []
    for i in range(rng.randint(0, max_services)):
        kw: dict[str, Any] = {}
        if rng.random() < 0.3:
            kw["affinity_timeout"] = rng.choice([60, 600])
        if rng.random() < 0.3:
            kw["etp"] = "Local"
        if rng.random() < 0.2:
            kw["itp"] = "Local"
        node_port = 30000 + i if rng.random() < 0.5 else None
        services.append(
            service(
                f"s{i}",
                [f"fd00:96::{i + 1}", f"203.0.113.{i + 1}"],
                [port("http", 80, target=8080, node_port=node_port), port("dns", 53, protocol="UDP")],
                type="NodePort" if node_port else "ClusterIP",
                external_ips=["198.51.100.7"] if rng.random() < 0.2 else (),
                **kw,
            )
        )
        for family, fmt in (("IPv6", "2001:db8:10::{}"), ("IPv4", "192.0.2.{}")):
            endpoints = [
                endpoint(
                    fmt.format(j + 1),
                    rng.choice(["node-a", "node-b"]),
                    ready=rng.random() < 0.7,
                    serving=rng.choice([None, True, False]),
                    terminating=rng.choice([None, True]),
                )
                for j in range(rng.randint(0, 3))
            ]
            ports = [slice_port("http", 8080), slice_port("dns", 5353, "UDP")]
            slices.append(endpoint_slice(f"s{i}", endpoints, ports, address_type=family))
    return services, slices
