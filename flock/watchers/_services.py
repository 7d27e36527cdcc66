"""Services and EndpointSlices of the whole cluster, as values in one :class:`flock.services.ServiceInputs`.

A node proxies every Service (a pod anywhere may be a client) to endpoints
anywhere, so both kinds are watched cluster-wide::

    inputs = ServiceInputs()
    watcher = ServiceWatcher(kube.services(), kube.endpoint_slices(), inputs)
    ...supervisor child: watcher.run

Only what the proxy reads is kept (:meth:`Service.from_object`,
:meth:`EndpointSlice.from_object`: no raw object outlives its page or event).
An object the model refuses is logged with the field that made it so, left
out, and listed in :attr:`ServiceWatcher.refused` until it changes or goes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import attrs
import trio

from flock.model import InvalidObject
from flock.services import EndpointSlice, Service
from flock.services._inputs import ENDPOINT_SLICES, SERVICES, ServiceInputs

from ._informer import Change, ChangeType, Informer, InformerSettings, ListWatchSource
from ._policy import namespaced_key
from ._values import refusal_or

log = logging.getLogger("flock.watchers")


def _ignore(change: Change) -> None:
    """The informers' own callback: the feed follows them as a listener."""


@attrs.define(eq=False)
class _Feed:
    """One kind's informer stream → ``inputs`` (a :class:`ChangeListener`)."""

    kind: str
    inputs: ServiceInputs
    refused: dict[str, InvalidObject] = attrs.field(factory=dict)

    def on_change(self, change: Change) -> None:
        if change.type is ChangeType.DELETED:
            self.refused.pop(change.key, None)
            self.inputs.delete(self.kind, change.key)
        elif isinstance(change.object, InvalidObject):
            self._refuse(change.key, change.object)
            self.inputs.delete(self.kind, change.key)
        else:
            self.refused.pop(change.key, None)
            self.inputs.set(self.kind, change.key, change.object)

    def on_listed(self, objects: Mapping[str, Any]) -> None:
        fresh = {}
        for key, value in objects.items():
            if isinstance(value, InvalidObject):
                if key not in self.refused:
                    self._refuse(key, value)
            else:
                self.refused.pop(key, None)
                fresh[key] = value
        for key in [k for k in self.refused if k not in objects]:
            del self.refused[key]
        self.inputs.replace(self.kind, fresh)

    def on_progress(self, resource_version: str) -> None:
        pass

    def _refuse(self, key: str, exc: InvalidObject) -> None:
        self.refused[key] = exc
        log.error(
            "%s %s refused: %s", self.kind, key, exc, extra={"kind": self.kind, "object": key, "field": exc.field}
        )


@attrs.define(eq=False)
class ServiceWatcher:
    """Supervised service keeping *inputs* equal to the cluster's Services and EndpointSlices."""

    services: ListWatchSource
    slices: ListWatchSource
    inputs: ServiceInputs
    settings: InformerSettings = attrs.Factory(InformerSettings)
    _feeds: dict[str, _Feed] = attrs.field(init=False)
    _informers: list[Informer] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._feeds = {kind: _Feed(kind, self.inputs) for kind in (SERVICES, ENDPOINT_SLICES)}
        self._informers = [
            Informer(
                source,
                namespaced_key,
                _ignore,
                self.settings,
                name=f"{kind} (cluster-wide)",
                listeners=(self._feeds[kind],),
                transform=refusal_or(model.from_object),
            )
            for kind, source, model in (
                (SERVICES, self.services, Service),
                (ENDPOINT_SLICES, self.slices, EndpointSlice),
            )
        ]

    @property
    def refused(self) -> dict[str, str]:
        """Objects left out because the model refused them: "Kind key" → why."""
        return {f"{kind} {key}": str(exc) for kind, feed in self._feeds.items() for key, exc in feed.refused.items()}

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run both informers; started() once each has listed."""
        try:
            async with trio.open_nursery() as nursery:
                for informer in self._informers:
                    await nursery.start(informer.run)
                task_status.started()
        finally:
            for kind in self._feeds:
                self.inputs.unlisted(kind)
