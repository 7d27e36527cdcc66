"""The lab's policy commands: namespaces and nodes and their labels, ``apply``
(NetworkPolicy, ClusterNetworkPolicy, Namespace), ``delete``, and ``policy wait``.

``policy wait`` asks the API server for its newest resourceVersion R (one
revision counter for every kind, as etcd's), then every agent's ``/metrics``
until its gauge ``flock_policy_applied_resource_version`` — the version
through which the agent's kernel ruleset reflects every NetworkPolicy,
ClusterNetworkPolicy, Namespace, Node and Pod (see :mod:`flock.watchers._policy`)
— is at least R.  The lab's API server sends BOOKMARKs every 0.2 s, so an
agent whose watches saw no change still moves past R within that.  R counts
every kind's writes (a node's labels too), so nothing else is needed for
ClusterNetworkPolicies and Nodes: the agents' gauge covers their feeds.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import trio
import yaml

from flock.apiserver import CLUSTERNETWORKPOLICIES, NAMESPACES, NETWORKPOLICIES, NODES, Resource, namespace_object
from flock.lab._api import ApiError
from flock.lab._lifecycle import api_client
from flock.lab._nsio import http_in
from flock.lab._plan import HEALTH_ADDRESS, LabPlan, NodePlan
from flock.lab._state import LabError

APPLIED_METRIC = "flock_policy_applied_resource_version"
POLICY_WAIT_S = 30.0
POLL_S = 0.02
_KINDS: dict[tuple[str, str], Resource] = {
    ("networking.k8s.io/v1", "NetworkPolicy"): NETWORKPOLICIES,
    ("policy.networking.k8s.io/v1alpha2", "ClusterNetworkPolicy"): CLUSTERNETWORKPOLICIES,
    ("v1", "Namespace"): NAMESPACES,
}
APPLIES = "networking.k8s.io/v1 NetworkPolicy, policy.networking.k8s.io/v1alpha2 ClusterNetworkPolicy and v1 Namespace"
_DELETABLE = {
    "networkpolicy": NETWORKPOLICIES,
    "networkpolicies": NETWORKPOLICIES,
    "netpol": NETWORKPOLICIES,
    "clusternetworkpolicy": CLUSTERNETWORKPOLICIES,
    "clusternetworkpolicies": CLUSTERNETWORKPOLICIES,
    "cnp": CLUSTERNETWORKPOLICIES,
    "namespace": NAMESPACES,
    "namespaces": NAMESPACES,
    "ns": NAMESPACES,
}
_METRIC_LINE = re.compile(rf"^{APPLIED_METRIC}(?:{{[^}}]*}})?\s+(\S+)", re.MULTILINE)


def _pairs(pairs: Iterable[str], what: str) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise LabError(f"{what} {pair!r}: expected KEY=VALUE")
        out[key] = value
    return out


def parse_label_args(pairs: Sequence[str]) -> dict[str, str]:
    return _pairs(pairs, "label")


def _api_failure(exc: ApiError, what: str) -> LabError:
    return LabError(f"{what}: {exc}")


async def ns_add(plan: LabPlan, name: str, labels: Mapping[str, str]) -> tuple[dict[str, Any], bool]:
    """Create the Namespace with *labels*; one that exists (``pod add`` makes them too)
    gets *labels* set on it.  Returns (object, created)."""
    api = api_client(plan)
    try:
        return await api.create(NAMESPACES, namespace_object(name, labels)), True
    except ApiError as exc:
        if exc.status != 409:
            raise _api_failure(exc, f"ns add {name}") from None
    try:
        return await api.patch(NAMESPACES, name, {"metadata": {"labels": dict(labels)}}), False
    except ApiError as exc:
        raise _api_failure(exc, f"ns add {name}") from None


async def ns_label(plan: LabPlan, name: str, labels: Mapping[str, str], remove: Sequence[str]) -> dict[str, Any]:
    if not labels and not remove:
        raise LabError(f"ns label {name}: nothing to change (give KEY=VALUE pairs or --remove KEY)")
    patch: dict[str, Any] = {**{k: None for k in remove}, **dict(labels)}
    try:
        return await api_client(plan).patch(NAMESPACES, name, {"metadata": {"labels": patch}})
    except ApiError as exc:
        raise _api_failure(exc, f"ns label {name}") from None


async def node_label(plan: LabPlan, name: str, labels: Mapping[str, str], remove: Sequence[str]) -> dict[str, Any]:
    """Set and remove labels of a lab node's Node object."""
    if not labels and not remove:
        raise LabError(f"node label {name}: nothing to change (give KEY=VALUE pairs or --remove KEY)")
    if name not in {n.name for n in plan.nodes}:
        raise LabError(f"node label {name}: no such node (nodes: {', '.join(n.name for n in plan.nodes)})")
    patch: dict[str, Any] = {**{k: None for k in remove}, **dict(labels)}
    try:
        return await api_client(plan).patch(NODES, name, {"metadata": {"labels": patch}})
    except ApiError as exc:
        raise _api_failure(exc, f"node label {name}") from None


def read_documents(path: str) -> list[dict[str, Any]]:
    """The objects of a YAML file ('-': standard input): one or more documents, a ``List`` unrolled."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as exc:
        raise LabError(f"apply: cannot read {path}: {exc.strerror}") from None
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        raise LabError(f"apply: {path} is not YAML: {exc}") from None
    objects: list[dict[str, Any]] = []
    for i, doc in enumerate(docs):
        if doc is None:
            continue
        if not isinstance(doc, dict):
            raise LabError(f"apply: document {i + 1} of {path} is not an object")
        if doc.get("kind") == "List" and isinstance(doc.get("items"), list):
            objects += doc["items"]
        else:
            objects.append(doc)
    if not objects:
        raise LabError(f"apply: {path} holds no object")
    return objects


def _resource_of(obj: Any, where: str) -> Resource:
    if not isinstance(obj, dict):
        raise LabError(f"apply: {where} is not an object")
    kind = (str(obj.get("apiVersion")), str(obj.get("kind")))
    if kind not in _KINDS:
        raise LabError(f"apply: {where} is {kind[0]} {kind[1]}: the lab applies {APPLIES}")
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
        raise LabError(f"apply: {where} has no metadata.name")
    return _KINDS[kind]


def _display(res: Resource, obj: Mapping[str, Any]) -> str:
    meta = obj["metadata"]
    name = f"{meta.get('namespace') or 'default'}/{meta['name']}" if res.namespaced else meta["name"]
    group = f"{res.kind.lower()}.{res.group}" if res.group else res.kind.lower()
    return f"{group}/{name}"


async def apply(plan: LabPlan, path: str) -> list[dict[str, str]]:
    """``flock-lab apply FILE``: :func:`apply_objects` of the file's documents."""
    return await apply_objects(plan, read_documents(path))


async def apply_objects(plan: LabPlan, objects: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    """Create each object, or replace the one of that name (as ``kubectl apply`` ends up).

    Every object is checked before anything is written.  Returns
    ``[{"object": "networkpolicy.networking.k8s.io/x/deny", "action": "created"}, …]``
    (a ClusterNetworkPolicy: ``clusternetworkpolicy.policy.networking.k8s.io/NAME``).
    """
    resources = [_resource_of(obj, f"document {i + 1}") for i, obj in enumerate(objects)]
    api = api_client(plan)
    done = []
    for res, obj in zip(resources, objects, strict=True):
        obj = dict(obj)
        meta = dict(obj["metadata"])
        if res.namespaced:
            meta.setdefault("namespace", "default")
        meta.pop("resourceVersion", None)
        obj["metadata"] = meta
        shown = _display(res, obj)
        try:
            try:
                await api.create(res, obj)
                action = "created"
            except ApiError as exc:
                if exc.status != 409:
                    raise
                current = await api.get(res, meta["name"], meta.get("namespace"))
                replaced = await api.replace(
                    res, {**obj, "metadata": {**meta, "resourceVersion": current["metadata"]["resourceVersion"]}}
                )
                same = replaced["metadata"]["resourceVersion"] == current["metadata"]["resourceVersion"]
                action = "unchanged" if same else "configured"
        except ApiError as exc:
            raise _api_failure(exc, f"apply {shown}") from None
        done.append({"object": shown, "action": action})
    return done


async def delete(plan: LabPlan, kind: str, key: str) -> str:
    res = _DELETABLE.get(kind.lower())
    if res is None:
        raise LabError(
            f"delete {kind}: the lab deletes networkpolicy NS/NAME, clusternetworkpolicy NAME (or namespace NAME)"
        )
    if res.namespaced:
        namespace, sep, name = key.partition("/")
        if not sep or not namespace or not name:
            raise LabError(f"delete {kind} {key!r}: expected NS/NAME")
    else:
        namespace, name = "", key
        if not name or "/" in name:
            raise LabError(f"delete {kind} {key!r}: expected NAME (it is cluster-scoped)")
    try:
        gone = await api_client(plan).delete(res, name, namespace or None)
    except ApiError as exc:
        raise _api_failure(exc, f"delete {kind} {key}") from None
    return _display(res, gone)


async def applied_version(node: NodePlan) -> int | None:
    """The agent's ``flock_policy_applied_resource_version``; None when it does not say."""
    host, port = HEALTH_ADDRESS.rsplit(":", 1)
    status, body = await trio.to_thread.run_sync(http_in, node.netns, host, int(port), "GET", "/metrics", None, 2.0)
    if status != 200:
        return None
    m = _METRIC_LINE.search(body.decode(errors="replace"))
    return None if m is None else int(float(m.group(1)))


async def server_version(plan: LabPlan) -> int:
    """The API server's newest resourceVersion (any list answers with it)."""
    try:
        _, rv = await api_client(plan).list_with_version(NAMESPACES)
    except ApiError as exc:
        raise _api_failure(exc, "policy wait") from None
    return rv


async def wait_applied(plan: LabPlan, target: int, applied: dict[str, int | None]) -> None:
    """Until every agent's applied version is at least *target*; *applied* shows the
    progress (node → version, None while an agent does not say).  The caller owns the deadline."""
    for node in plan.nodes:
        applied.setdefault(node.name, None)
    while True:
        for node in plan.nodes:
            if (applied[node.name] or 0) < target:
                try:
                    applied[node.name] = await applied_version(node)
                except OSError:
                    applied[node.name] = None  # the agent is restarting: ask again
        if all(v is not None and v >= target for v in applied.values()):
            return
        await trio.sleep(POLL_S)
