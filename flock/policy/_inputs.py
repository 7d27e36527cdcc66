"""What the policy watchers know, as one snapshot value with a change signal.

The cluster-wide watchers (NetworkPolicy, Namespace, Pod) write into one
:class:`PolicyInputs`; the policy service reads :meth:`PolicyInputs.snapshot`
and sleeps in :meth:`PolicyInputs.wait_changed`.  Writers never block and
never see the readers: a burst of changes wakes the reader once.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, Protocol

import attrs
import trio

from ._model import Namespace, NetworkPolicy, PolicyPod


class Kind(enum.Enum):
    NETWORK_POLICY = "NetworkPolicy"
    NAMESPACE = "Namespace"
    POD = "Pod"


_EVERY_KIND = frozenset(Kind)


@attrs.frozen
class PolicySnapshot:
    """Everything the watchers know at one instant.

    ``generation`` grows by one per change; ``synced`` lists the kinds whose
    first full list has arrived (the service applies only when all three are
    synced, so a restart never applies a ruleset from half a cluster).
    """

    generation: int = 0
    policies: Mapping[str, NetworkPolicy] = attrs.field(factory=dict, hash=False)  # "ns/name" →
    namespaces: Mapping[str, Namespace] = attrs.field(factory=dict, hash=False)  # name →
    pods: Mapping[str, PolicyPod] = attrs.field(factory=dict, hash=False)  # "ns/name" →
    synced: frozenset[Kind] = frozenset()

    @property
    def complete(self) -> bool:
        return self.synced == _EVERY_KIND


class PolicySource(Protocol):
    """What the policy service needs of the watchers."""

    def snapshot(self) -> PolicySnapshot: ...

    @property
    def generation(self) -> int:
        """The generation the next snapshot will have (no snapshot is built to read it)."""
        ...

    async def wait_changed(self, generation: int) -> PolicySnapshot:
        """Return the first snapshot whose generation is greater than *generation*."""
        ...

    async def wait_generation(self, generation: int) -> int:
        """The current generation once it is greater than *generation* (no snapshot is built)."""
        ...


@attrs.define(eq=False)
class PolicyInputs:
    """The watchers' shared cache (implements :class:`PolicySource`).

    Writers: ``set_*``/``delete_*`` per object, ``replace(kind, objects)`` after
    a (re)list, ``mark_synced(kind)``.  Each call that changes something bumps
    the generation and wakes the readers; a call that changes nothing does not.
    """

    _policies: dict[str, NetworkPolicy] = attrs.field(init=False, factory=dict)
    _namespaces: dict[str, Namespace] = attrs.field(init=False, factory=dict)
    _pods: dict[str, PolicyPod] = attrs.field(init=False, factory=dict)
    _synced: set[Kind] = attrs.field(init=False, factory=set)
    _generation: int = attrs.field(init=False, default=0)
    _snapshot: PolicySnapshot | None = attrs.field(init=False, default=None)
    _changed: trio.Event = attrs.field(init=False, factory=trio.Event)

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
        return self._pods

    def _put(self, kind: Kind, key: str, value: object) -> None:
        table = self._table(kind)
        if table.get(key) != value:
            table[key] = value
            self._bump()

    def set_policy(self, policy: NetworkPolicy) -> None:
        self._put(Kind.NETWORK_POLICY, policy.key, policy)

    def set_namespace(self, namespace: Namespace) -> None:
        self._put(Kind.NAMESPACE, namespace.name, namespace)

    def set_pod(self, pod: PolicyPod) -> None:
        self._put(Kind.POD, pod.key, pod)

    def delete(self, kind: Kind, key: str) -> None:
        """Forget the object *key* ("ns/name", or the name for a Namespace); absent is fine."""
        if self._table(kind).pop(key, None) is not None:
            self._bump()

    def replace(self, kind: Kind, objects: Mapping[str, NetworkPolicy | Namespace | PolicyPod]) -> None:
        """Replace everything of *kind* (after a list), keyed as above; marks *kind* synced."""
        table = self._table(kind)
        changed = table != dict(objects) or kind not in self._synced
        table.clear()
        table.update(objects)
        self._synced.add(kind)
        if changed:
            self._bump()

    def mark_synced(self, kind: Kind) -> None:
        if kind not in self._synced:
            self._synced.add(kind)
            self._bump()

    def snapshot(self) -> PolicySnapshot:
        if self._snapshot is None:
            self._snapshot = PolicySnapshot(
                self._generation,
                dict(self._policies),
                dict(self._namespaces),
                dict(self._pods),
                frozenset(self._synced),
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
