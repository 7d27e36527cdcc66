"""What the service proxy reads: every Service and EndpointSlice of the cluster, as values.

One :class:`ServiceInputs` is built by the composition root, written by the
service watcher (:class:`flock.watchers.ServiceWatcher`) and read by the
proxy (:class:`flock.services.ServiceProxy`)::

    # watcher, after each (re)list:  inputs.replace(SERVICES, {s.key: s for s in services})  (also marks listed)
    # watcher, per watch event:      inputs.set(SERVICES, key, value) / inputs.delete(SERVICES, key)
    # proxy:                         generation = inputs.generation; read inputs.services / inputs.slices;
    #                                then generation = await inputs.wait_generation(generation)

Setting an equal value is no change (no wake-up).  The proxy applies nothing
until both kinds are listed (:attr:`ServiceInputs.complete`): a table made
from half a view would refuse connections to Services whose slices are still
on their way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import trio

from ._model import EndpointSlice, Service

SERVICES = "Service"
ENDPOINT_SLICES = "EndpointSlice"
KINDS = (SERVICES, ENDPOINT_SLICES)


@attrs.define(eq=False)
class ServiceInputs:
    """Services and EndpointSlices by ``namespace/name``, with one change counter."""

    services: dict[str, Service] = attrs.field(factory=dict)
    slices: dict[str, EndpointSlice] = attrs.field(factory=dict)
    generation: int = 0
    _listed: set[str] = attrs.field(factory=set)
    _changed: trio.Event = attrs.field(factory=trio.Event)

    @property
    def complete(self) -> bool:
        """Both kinds have been listed."""
        return self._listed >= set(KINDS)

    def of(self, kind: str) -> Mapping[str, Any]:
        return self.services if kind == SERVICES else self.slices

    def set(self, kind: str, key: str, value: Service | EndpointSlice) -> None:
        table: dict[str, Any] = self.services if kind == SERVICES else self.slices
        if table.get(key) != value:
            table[key] = value
            self._bump()

    def delete(self, kind: str, key: str) -> None:
        table: dict[str, Any] = self.services if kind == SERVICES else self.slices
        if table.pop(key, None) is not None:
            self._bump()

    def replace(self, kind: str, values: Mapping[str, Service | EndpointSlice]) -> None:
        """What one full read found: the kind's values, and the kind marked listed."""
        table: dict[str, Any] = self.services if kind == SERVICES else self.slices
        if table != values or kind not in self._listed:
            table.clear()
            table.update(values)
            self._listed.add(kind)
            self._bump()

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

    def _bump(self) -> None:
        self.generation += 1
        self._changed.set()
        self._changed = trio.Event()
