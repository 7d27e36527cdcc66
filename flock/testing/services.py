"""Service and EndpointSlice objects in their JSON form, for the service proxy's tests and benchmarks.

Each builder returns the dict the API server would send (camelCase), so tests
go through the models' ``from_object`` exactly as the watchers will.
"""

from __future__ import annotations

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
