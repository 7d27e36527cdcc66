"""Schema-complete Kubernetes objects for tests and the lab."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def pod_object(
    namespace: str,
    name: str,
    node: str = "",
    *,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    image: str = "registry.example/app:1",
    ports: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """A Pod as a client would POST it (``spec.containers`` filled in, as the API requires).

    *ports* are the container's ``ports`` (``{"name": "http", "containerPort": 80, "protocol": "TCP"}``).
    """
    container: dict[str, Any] = {"name": "app", "image": image}
    if ports:
        container["ports"] = [dict(p) for p in ports]
    spec: dict[str, Any] = {"containers": [container]}
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "namespace": namespace,
            "name": name,
            "annotations": dict(annotations or {}),
            "labels": dict(labels or {}),
        },
        "spec": spec,
    }


def nodeconfig_object(name: str, cidr6: str = "2001:db8:0:1::/64", **spec: Any) -> dict[str, Any]:
    """A NodeConfig for node *name*; extra keyword arguments go into ``spec`` as they are."""
    return {
        "apiVersion": "flock.fritzlab.net/v1alpha1",
        "kind": "NodeConfig",
        "metadata": {"name": name},
        "spec": {"cidr6": cidr6, **spec},
    }


def namespace_object(name: str, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A Namespace; the API server adds the ``kubernetes.io/metadata.name`` label."""
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": dict(labels or {})}}


def network_policy_object(namespace: str, name: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    """A networking.k8s.io/v1 NetworkPolicy with *spec* as it is."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"namespace": namespace, "name": name},
        "spec": dict(spec),
    }


def cluster_network_policy_object(name: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    """A policy.networking.k8s.io/v1alpha2 ClusterNetworkPolicy with *spec* as it is."""
    return {
        "apiVersion": "policy.networking.k8s.io/v1alpha2",
        "kind": "ClusterNetworkPolicy",
        "metadata": {"name": name},
        "spec": dict(spec),
    }


def node_object(
    name: str, labels: Mapping[str, str] | None = None, addresses: Sequence[tuple[str, str]] = ()
) -> dict[str, Any]:
    """A Node with *labels* and ``status.addresses`` (``("InternalIP", "2001:db8::1")`` …)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": dict(labels or {})},
        "spec": {},
        "status": {"addresses": [{"type": kind, "address": address} for kind, address in addresses]},
    }


def secret_object(namespace: str, name: str, data: Mapping[str, str]) -> dict[str, Any]:
    """An Opaque Secret with *data* given as plain strings (``stringData``, as kubectl sends it)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"namespace": namespace, "name": name},
        "type": "Opaque",
        "stringData": dict(data),
    }
