"""What the service proxy reads: every Service and EndpointSlice of the cluster, as values.

One :class:`ServiceInputs` is built by the composition root, written by the
service watcher (:class:`flock.watchers.ServiceWatcher`) and read by the
proxy (:class:`flock.services.ServiceProxy`)::

    # watcher, after each (re)list:  inputs.replace(SERVICES, {s.key: s for s in services})  (also marks listed)
    # watcher, per watch event:      inputs.set(SERVICES, key, value) / inputs.delete(SERVICES, key)
    # proxy:                         journal = inputs.journal(); read inputs.services / inputs.slices whole;
    #                                then per change: generation = await inputs.wait_generation(generation);
    #                                keys = journal.drain() (what was written since), read those keys

Setting an equal value is no change (no wake-up).  The proxy applies nothing
until both kinds are listed (:attr:`ServiceInputs.complete`): a table made
from half a view would refuse connections to Services whose slices are still
on their way.  When the composition root sets ``required`` to include
:data:`POOLS`, the allow-list (:class:`flock.services.AllowList`, the
LoadBalancerPools: :meth:`ServiceInputs.set_allow`) must be read too: a
restarted agent that applied its table before reading the pools would stop
translating every external address until they arrived.

A :class:`ServiceJournal` (:meth:`ServiceInputs.journal`) names the keys
written since its last drain, so a reader's work follows what changed, not
the size of the cluster; it holds a key once however often it was written.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

import attrs
import trio

from ._model import EndpointSlice, Service
from ._pools import AllowList

SERVICES = "Service"
ENDPOINT_SLICES = "EndpointSlice"
KINDS = (SERVICES, ENDPOINT_SLICES)
POOLS = "LoadBalancerPool"  # the allow-list: listed with set_allow


@attrs.frozen
class ServiceChanges:
    """The keys written since a journal's previous drain (a key written and written back is listed too)."""

    services: frozenset[str] = frozenset()
    slices: frozenset[str] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.services or self.slices)


@attrs.define(eq=False)
class ServiceJournal:
    """The keys written to one :class:`ServiceInputs` since the last :meth:`drain`; forgotten by the
    inputs once its reader drops it."""

    _keys: dict[str, set[str]] = attrs.field(init=False, factory=lambda: {k: set() for k in KINDS})

    def record(self, kind: str, key: str) -> None:
        self._keys[kind].add(key)

    def drain(self) -> ServiceChanges:
        keys = self._keys
        if not (keys[SERVICES] or keys[ENDPOINT_SLICES]):
            return ServiceChanges()
        self._keys = {k: set() for k in KINDS}
        return ServiceChanges(frozenset(keys[SERVICES]), frozenset(keys[ENDPOINT_SLICES]))


@attrs.define(eq=False)
class ServiceInputs:
    """Services and EndpointSlices by ``namespace/name``, with one change counter."""

    services: dict[str, Service] = attrs.field(factory=dict)
    slices: dict[str, EndpointSlice] = attrs.field(factory=dict)
    generation: int = 0
    allow: AllowList = attrs.field(factory=AllowList)  # the LoadBalancerPools, as the pool watcher read them
    required: frozenset[str] = frozenset(KINDS)  # what must be listed before the proxy applies anything
    _listed: set[str] = attrs.field(factory=set)
    _changed: trio.Event = attrs.field(factory=trio.Event)
    _journals: weakref.WeakSet[ServiceJournal] = attrs.field(init=False, factory=weakref.WeakSet)

    @property
    def complete(self) -> bool:
        """Every required kind has been listed."""
        return self._listed >= self.required

    def of(self, kind: str) -> Mapping[str, Any]:
        return self.services if kind == SERVICES else self.slices

    def set(self, kind: str, key: str, value: Service | EndpointSlice) -> None:
        table: dict[str, Any] = self.services if kind == SERVICES else self.slices
        if table.get(key) != value:
            table[key] = value
            self._note(kind, key)
            self._bump()

    def delete(self, kind: str, key: str) -> None:
        table: dict[str, Any] = self.services if kind == SERVICES else self.slices
        if table.pop(key, None) is not None:
            self._note(kind, key)
            self._bump()

    def replace(self, kind: str, values: Mapping[str, Service | EndpointSlice]) -> None:
        """What one full read found: the kind's values, and the kind marked listed.

        A value equal to the one held stays the one held, and only the keys that differ are journalled."""
        table: dict[str, Any] = self.services if kind == SERVICES else self.slices
        changed = kind not in self._listed
        for key, value in values.items():
            before = table.get(key)
            if before is None or (before is not value and before != value):
                table[key] = value
                self._note(kind, key)
                changed = True
        for key in [k for k in table if k not in values]:
            del table[key]
            self._note(kind, key)
            changed = True
        self._listed.add(kind)
        if changed:
            self._bump()

    def set_allow(self, allow: AllowList) -> None:
        """The allow-list as read now (marks :data:`POOLS` listed); a different one wakes the proxy."""
        changed = allow != self.allow or POOLS not in self._listed
        self.allow = allow
        self._listed.add(POOLS)
        if changed:
            self._bump()

    def journal(self) -> ServiceJournal:
        """A journal of the writes from now on (take it together with a whole read of the values)."""
        journal = ServiceJournal()
        self._journals.add(journal)
        return journal

    def unlisted(self, kind: str) -> None:
        """The kind is no longer watched: nothing may be applied from it until it is listed again."""
        if kind in self._listed:
            self._listed.discard(kind)
            self._bump()

    async def wait_generation(self, seen: int) -> int:
        """The generation, once it is past *seen*."""
        while self.generation <= seen:
            await self._changed.wait()
        return self.generation

    def _note(self, kind: str, key: str) -> None:
        for journal in self._journals:
            journal.record(kind, key)

    def _bump(self) -> None:
        self.generation += 1
        self._changed.set()
        self._changed = trio.Event()
