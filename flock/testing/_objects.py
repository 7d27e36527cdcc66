"""Schema-complete Kubernetes objects for tests and the lab."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def pod_object(
    namespace: str,
    name: str,
    node: str = "",
    *,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    image: str = "registry.example/app:1",
) -> dict[str, Any]:
    """A Pod as a client would POST it (``spec.containers`` filled in, as the API requires)."""
    spec: dict[str, Any] = {"containers": [{"name": "app", "image": image}]}
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


def secret_object(namespace: str, name: str, data: Mapping[str, str]) -> dict[str, Any]:
    """An Opaque Secret with *data* given as plain strings (``stringData``, as kubectl sends it)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"namespace": namespace, "name": name},
        "type": "Opaque",
        "stringData": dict(data),
    }
