"""What the informers keep of each object: values, not objects.

A Pod as the API server sends it is 4–6 KiB of JSON (managedFields, env,
probes, volumes); as Python dicts several times that.  An agent watches every
pod of the cluster, so each informer turns an object into the few fields flock
reads the moment it is decoded (its *transform*) and drops the rest:

- every pod: a :class:`flock.policy.PolicyPod` (namespace, name, labels,
  addresses, named container ports, node, whether it can be selected:
  phase and hostNetwork);
- a pod bound to this node: also its :class:`flock.model.PodInfo`
  (annotations, owners, first image, readiness: what ADD, anycast health and
  flockctl read);
- NetworkPolicies, Namespaces and ClusterNetworkPolicies: their policy values;
- Nodes (watched only while a ClusterNetworkPolicy has a ``nodes`` peer): a
  :class:`flock.policy.PolicyNode` (labels, addresses).

Strings and tuples that repeat across pods and nodes (namespaces, node names, label sets,
named-port sets) are shared: one object for every pod that has an equal one
(:class:`Shared`).  An object the model refuses becomes its
:class:`flock.model.InvalidObject`, so the watcher can say why it left it out.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Hashable, Mapping
from typing import Any, TypeVar

import attrs

from flock.model import InvalidObject, PodInfo
from flock.policy import ClusterNetworkPolicy, Namespace, NetworkPolicy, PolicyNode, PolicyPod

log = logging.getLogger("flock.watchers")

T = TypeVar("T", bound=Hashable)


def _refcounts(table: dict[Any, Any]) -> list[tuple[Any, int]]:
    """Each key of *table* with its reference count as seen from here (the one code path
    both the baseline and :meth:`Shared.prune` read counts through)."""
    return [(value, sys.getrefcount(value)) for value in list(table)]


def _refcount_of_unshared() -> int:
    """What :func:`_refcounts` reports for an entry nothing but its table holds."""
    table: dict[object, object] = {}
    probe = object()
    table[probe] = probe
    del probe
    ((_, count),) = _refcounts(table)
    return count


class Shared:
    """One object for every equal hashable value handed to it (label sets, port sets).

    Entries that only the table still holds are dropped whenever the table has
    doubled since the last prune, so values that leave the cluster (an old
    ReplicaSet's pod-template-hash) do not pile up.
    """

    _UNSHARED = _refcount_of_unshared()

    def __init__(self, *, prune_from: int = 4096) -> None:
        self._table: dict[Any, Any] = {}
        self._prune_from = prune_from
        self._prune_at = prune_from

    def __len__(self) -> int:
        return len(self._table)

    def __call__(self, value: T) -> T:
        got = self._table.setdefault(value, value)
        if len(self._table) >= self._prune_at:
            self.prune()
        return got

    def prune(self) -> int:
        """Drop the entries no one else holds; returns how many."""
        dead = [value for value, count in _refcounts(self._table) if count <= self._UNSHARED]
        for value in dead:
            del self._table[value]
        self._prune_at = max(self._prune_from, 2 * len(self._table))
        return len(dead)


def _share_strings(meta: Mapping[str, Any], spec: Any) -> None:
    """Intern a raw pod's namespace and node name in place, before it is read (its label
    strings need not be: the whole label set is shared after it)."""
    if isinstance(meta, dict) and isinstance(ns := meta.get("namespace"), str):
        meta["namespace"] = sys.intern(ns)
    if isinstance(spec, dict) and isinstance(node := spec.get("nodeName"), str):
        spec["nodeName"] = sys.intern(node)


@attrs.frozen(slots=True)
class PodRecord:
    """What an agent keeps of one pod.

    ``policy``: the pod as a NetworkPolicy peer or target, or why the policy
    model refused it.  ``local``: only for a pod bound to this node, what ADD
    and anycast read (None elsewhere, or when it could not be read).
    """

    policy: PolicyPod | InvalidObject
    local: PodInfo | None = None


@attrs.define(eq=False)
class PodTransform:
    """Raw Pod → :class:`PodRecord` for an agent on *node* ("" : no node of its own)."""

    node: str = ""
    shared: Shared = attrs.field(factory=Shared)

    def __call__(self, obj: Mapping[str, Any]) -> PodRecord:
        meta, spec = obj.get("metadata"), obj.get("spec")
        _share_strings(meta or {}, spec)
        policy: PolicyPod | InvalidObject
        try:
            policy = PolicyPod.from_object(obj)
        except InvalidObject as exc:
            exc.__traceback__ = None  # kept: no frames with it
            policy = exc
        else:
            # The label set and the named ports are shared with every pod that has the same;
            # the resourceVersion is not kept (nothing reads it, and without it a status update
            # that changes nothing flock reads is no change at all).
            labels, ports = self.shared(policy.labels), self.shared(policy.named_ports)
            if labels is not policy.labels:
                object.__setattr__(policy, "labels", labels)
            if ports is not policy.named_ports:
                object.__setattr__(policy, "named_ports", ports)
            if policy.resource_version:
                object.__setattr__(policy, "resource_version", "")
        local = None
        if self.node and isinstance(spec, Mapping) and spec.get("nodeName") == self.node:
            try:
                local = PodInfo.from_object(obj)
            except (ValueError, TypeError, AttributeError) as exc:
                key = f"{(meta or {}).get('namespace') or 'default'}/{(meta or {}).get('name', '')}"
                log.error("pod %s: cannot read it: %s", key, exc, extra={"pod": key})
        return PodRecord(policy, local)


def refusal_or(read: Callable[[Mapping[str, Any]], T]) -> Callable[[Mapping[str, Any]], T | InvalidObject]:
    """A transform: *read*'s value, or the InvalidObject it raised."""

    def transform(obj: Mapping[str, Any]) -> T | InvalidObject:
        try:
            return read(obj)
        except InvalidObject as exc:
            exc.__traceback__ = None
            return exc

    return transform


network_policy_value = refusal_or(NetworkPolicy.from_object)
namespace_value = refusal_or(Namespace.from_object)
cluster_policy_value = refusal_or(ClusterNetworkPolicy.read)


@attrs.define(eq=False)
class NodeTransform:
    """Raw Node → :class:`flock.policy.PolicyNode` (or why it was refused), its label set shared."""

    shared: Shared = attrs.field(factory=Shared)

    def __call__(self, obj: Mapping[str, Any]) -> PolicyNode | InvalidObject:
        try:
            node = PolicyNode.read(obj)
        except InvalidObject as exc:
            exc.__traceback__ = None
            return exc
        labels = self.shared(node.labels)
        if labels is not node.labels:
            object.__setattr__(node, "labels", labels)
        return node
