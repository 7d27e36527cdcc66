"""What the policy watchers know, with a change signal and a change journal.

The cluster-wide watchers (NetworkPolicy, Namespace, Pod) write into one
:class:`PolicyInputs`.  The policy service reads it two ways: once whole (the
live tables, read without an await in between), then change by change
through an :class:`InputJournal` — the keys written since its last drain,
each with the value it had then — so a pod's change costs the service work
for that pod, never a copy of the cluster.  Writers never block and never see
the readers: a burst of changes wakes the reader once.

:meth:`PolicyInputs.snapshot` (a copy of everything) stays for the few
callers that want a whole view at one instant (tests, tools); the service's
hot path never takes one.
"""

from __future__ import annotations

import enum
import weakref
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Protocol

import attrs
import trio

from ._cluster import ClusterNetworkPolicy, PolicyNode
from ._model import Namespace, NetworkPolicy, PolicyPod


class Kind(enum.Enum):
    NETWORK_POLICY = "NetworkPolicy"
    NAMESPACE = "Namespace"
    POD = "Pod"
    CLUSTER_POLICY = "ClusterNetworkPolicy"
    NODE = "Node"


# What must be listed before a ruleset is applied.  Not Nodes: until they are listed (or when they cannot be),
# a ClusterNetworkPolicy's nodes peers fail closed (see flock.policy._compile), rather than every policy of the
# node and every ADD waiting on one list.
_REQUIRED = frozenset({Kind.NETWORK_POLICY, Kind.NAMESPACE, Kind.POD, Kind.CLUSTER_POLICY})


@attrs.frozen
class PolicySnapshot:
    """Everything the watchers know at one instant (a copy: for tests and tools, not per change).

    ``generation`` grows by one per change; ``synced`` lists the kinds whose
    first full list has arrived (the service applies only when all three are
    synced, so a restart never applies a ruleset from half a cluster).
    """

    generation: int = 0
    policies: Mapping[str, NetworkPolicy] = attrs.field(factory=dict, hash=False)  # "ns/name" →
    namespaces: Mapping[str, Namespace] = attrs.field(factory=dict, hash=False)  # name →
    pods: Mapping[str, PolicyPod] = attrs.field(factory=dict, hash=False)  # "ns/name" →
    synced: frozenset[Kind] = frozenset()
    cluster_policies: Mapping[str, ClusterNetworkPolicy] = attrs.field(factory=dict, hash=False)  # name →
    nodes: Mapping[str, PolicyNode] = attrs.field(factory=dict, hash=False)  # name →

    @property
    def complete(self) -> bool:
        return self.synced >= _REQUIRED

    @property
    def nodes_known(self) -> bool:
        return Kind.NODE in self.synced


def nodes_needed(cluster_policies: Mapping[str, ClusterNetworkPolicy]) -> bool:
    """Does some ClusterNetworkPolicy have a ``nodes`` peer (so Nodes must be watched)?"""
    return any(p.uses_nodes for p in cluster_policies.values())


@attrs.frozen
class InputChanges:
    """What was written since a journal's previous drain: per kind, key → the value it had then (None: absent).

    A key written and then written back is listed too, with a previous value
    equal to the current one: readers compare.
    """

    policies: Mapping[str, NetworkPolicy | None] = attrs.field(factory=dict)
    namespaces: Mapping[str, Namespace | None] = attrs.field(factory=dict)
    pods: Mapping[str, PolicyPod | None] = attrs.field(factory=dict)
    cluster_policies: Mapping[str, ClusterNetworkPolicy | None] = attrs.field(factory=dict)
    nodes: Mapping[str, PolicyNode | None] = attrs.field(factory=dict)

    def __bool__(self) -> bool:
        return bool(self.policies or self.namespaces or self.pods or self.cluster_policies or self.nodes)


@attrs.define(eq=False)
class InputJournal:
    """The keys written to one :class:`PolicyInputs` since the last :meth:`drain`, with their values then.

    Made by :meth:`PolicyInputs.journal`; forgotten by the inputs once its
    reader drops it.  It holds one entry per key written (not per write):
    a reader that falls behind costs at most one entry per object.
    """

    _before: dict[Kind, dict[str, Any]] = attrs.field(init=False, factory=lambda: {k: {} for k in Kind})

    def record(self, kind: Kind, key: str, before: object) -> None:
        self._before[kind].setdefault(key, before)

    def drain(self) -> InputChanges:
        """What was written since the previous drain (or the journal's making); starts afresh."""
        before = self._before
        if not any(before.values()):
            return InputChanges()
        self._before = {k: {} for k in Kind}
        return InputChanges(
            before[Kind.NETWORK_POLICY],
            before[Kind.NAMESPACE],
            before[Kind.POD],
            before[Kind.CLUSTER_POLICY],
            before[Kind.NODE],
        )


class PolicySource(Protocol):
    """What the policy service needs of the watchers."""

    @property
    def generation(self) -> int:
        """Grows by one per change."""
        ...

    @property
    def complete(self) -> bool:
        """Every kind has been listed once."""
        ...

    @property
    def policies(self) -> Mapping[str, NetworkPolicy]:
        """The live table ("ns/name" →): read it without an await in between."""
        ...

    @property
    def namespaces(self) -> Mapping[str, Namespace]: ...

    @property
    def pods(self) -> Mapping[str, PolicyPod]: ...

    @property
    def cluster_policies(self) -> Mapping[str, ClusterNetworkPolicy]: ...

    @property
    def nodes(self) -> Mapping[str, PolicyNode]: ...

    @property
    def nodes_known(self) -> bool:
        """Nodes are listed (until then a ClusterNetworkPolicy's nodes peers fail closed)."""
        ...

    def journal(self) -> InputJournal:
        """A journal of the writes from now on (take it together with a whole read of the tables)."""
        ...

    def snapshot(self) -> PolicySnapshot: ...

    async def wait_generation(self, generation: int) -> int:
        """The current generation once it is greater than *generation* (no snapshot is built)."""
        ...


@attrs.define(eq=False)
class PolicyInputs:
    """The watchers' shared cache (implements :class:`PolicySource`).

    Writers: ``set_*``/``delete`` per object, ``replace(kind, objects)`` after
    a (re)list, ``mark_synced(kind)``.  Each call that changes something bumps
    the generation, notes the keys in every open journal and wakes the
    readers; a call that changes nothing does none of that.  Values are kept
    as given (the watchers' objects, shared, never copied).
    """

    _policies: dict[str, NetworkPolicy] = attrs.field(init=False, factory=dict)
    _namespaces: dict[str, Namespace] = attrs.field(init=False, factory=dict)
    _pods: dict[str, PolicyPod] = attrs.field(init=False, factory=dict)
    _cluster_policies: dict[str, ClusterNetworkPolicy] = attrs.field(init=False, factory=dict)
    _nodes: dict[str, PolicyNode] = attrs.field(init=False, factory=dict)
    _synced: set[Kind] = attrs.field(init=False, factory=set)
    _generation: int = attrs.field(init=False, default=0)
    _snapshot: PolicySnapshot | None = attrs.field(init=False, default=None)
    _changed: trio.Event = attrs.field(init=False, factory=trio.Event)
    _journals: weakref.WeakSet[InputJournal] = attrs.field(init=False, factory=weakref.WeakSet)
    _nodes_needed: tuple[int, bool] = attrs.field(init=False, default=(-1, False))

    def _bump(self) -> None:
        self._generation += 1
        self._snapshot = None
        self._changed.set()
        self._changed = trio.Event()

    def _table(self, kind: Kind) -> dict[str, Any]:
        if kind is Kind.NETWORK_POLICY:
            return self._policies
        if kind is Kind.NAMESPACE:
            return self._namespaces
        if kind is Kind.CLUSTER_POLICY:
            return self._cluster_policies
        if kind is Kind.NODE:
            return self._nodes
        return self._pods

    def _note(self, kind: Kind, key: str, before: object) -> None:
        for journal in self._journals:
            journal.record(kind, key, before)

    def _put(self, kind: Kind, key: str, value: object) -> None:
        table = self._table(kind)
        before = table.get(key)
        if before is not value and before != value:
            self._note(kind, key, before)
            table[key] = value
            self._bump()

    def set_policy(self, policy: NetworkPolicy) -> None:
        self._put(Kind.NETWORK_POLICY, policy.key, policy)

    def set_namespace(self, namespace: Namespace) -> None:
        self._put(Kind.NAMESPACE, namespace.name, namespace)

    def set_pod(self, pod: PolicyPod) -> None:
        self._put(Kind.POD, pod.key, pod)

    def set_cluster_policy(self, policy: ClusterNetworkPolicy) -> None:
        self._put(Kind.CLUSTER_POLICY, policy.key, policy)

    def set_node(self, node: PolicyNode) -> None:
        self._put(Kind.NODE, node.name, node)

    def set(self, kind: Kind, key: str, value: object) -> None:
        """Set the object *key* of *kind* (the watchers' generic path)."""
        self._put(kind, key, value)

    def delete(self, kind: Kind, key: str) -> None:
        """Forget the object *key* ("ns/name", or the name for a Namespace); absent is fine."""
        before = self._table(kind).pop(key, None)
        if before is not None:
            self._note(kind, key, before)
            self._bump()

    def replace(self, kind: Kind, objects: Mapping[str, Any]) -> None:
        """Replace everything of *kind* (after a list), keyed as above; marks *kind* synced.

        A value equal to the one held stays the one held (readers may know it by identity)."""
        table = self._table(kind)
        changed = kind not in self._synced
        fresh: dict[str, Any] = {}
        for key, after in objects.items():
            before = table.get(key)
            if before is not None and (before is after or before == after):
                fresh[key] = before
            else:
                self._note(kind, key, before)
                fresh[key] = after
                changed = True
        for key in table.keys() - objects.keys():
            self._note(kind, key, table[key])
            changed = True
        table.clear()
        table.update(fresh)
        self._synced.add(kind)
        if changed:
            self._bump()

    def mark_synced(self, kind: Kind) -> None:
        if kind not in self._synced:
            self._synced.add(kind)
            self._bump()

    def mark_unsynced(self, kind: Kind) -> None:
        """*kind* is no longer watched (Nodes, once no ClusterNetworkPolicy needs them): forget its objects."""
        table = self._table(kind)
        for key, before in table.items():
            self._note(kind, key, before)
        changed = bool(table) or kind in self._synced
        table.clear()
        self._synced.discard(kind)
        if changed:
            self._bump()

    def journal(self) -> InputJournal:
        journal = InputJournal()
        self._journals.add(journal)
        return journal

    @property
    def policies(self) -> Mapping[str, NetworkPolicy]:
        return MappingProxyType(self._policies)

    @property
    def namespaces(self) -> Mapping[str, Namespace]:
        return MappingProxyType(self._namespaces)

    @property
    def pods(self) -> Mapping[str, PolicyPod]:
        return MappingProxyType(self._pods)

    @property
    def cluster_policies(self) -> Mapping[str, ClusterNetworkPolicy]:
        return MappingProxyType(self._cluster_policies)

    @property
    def nodes(self) -> Mapping[str, PolicyNode]:
        return MappingProxyType(self._nodes)

    @property
    def nodes_needed(self) -> bool:
        # read on every watermark check: computed once per generation
        if self._nodes_needed[0] != self._generation:
            self._nodes_needed = (self._generation, nodes_needed(self._cluster_policies))
        return self._nodes_needed[1]

    @property
    def nodes_known(self) -> bool:
        return Kind.NODE in self._synced

    @property
    def synced(self) -> frozenset[Kind]:
        return frozenset(self._synced)

    @property
    def complete(self) -> bool:
        return self._synced >= _REQUIRED

    def snapshot(self) -> PolicySnapshot:
        """A copy of everything (O(cluster)): for tests and tools, never per change."""
        if self._snapshot is None:
            self._snapshot = PolicySnapshot(
                self._generation,
                dict(self._policies),
                dict(self._namespaces),
                dict(self._pods),
                frozenset(self._synced),
                dict(self._cluster_policies),
                dict(self._nodes),
            )
        return self._snapshot

    @property
    def generation(self) -> int:
        return self._generation

    async def wait_changed(self, generation: int) -> PolicySnapshot:
        await self.wait_generation(generation)
        return self.snapshot()

    async def wait_generation(self, generation: int) -> int:
        while self._generation <= generation:
            await self._changed.wait()
        return self._generation
