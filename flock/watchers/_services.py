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

The watcher reports started at once: nothing else of the agent waits for
Services (pods get addresses and policy while the lists are on their way; the
proxy applies nothing until both kinds are listed).  A list the API server
refuses (403: RBAC without services or endpointslices; 404) is asked again
with backoff, logged, and named in :attr:`ServiceWatcher.refusals`; what was
listed before stays.
"""

from __future__ import annotations

import functools
import logging
import random
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import trio

from flock.model import InvalidObject
from flock.nursery import Backoff
from flock.services import EndpointSlice, Service
from flock.services._inputs import ENDPOINT_SLICES, KINDS, SERVICES, ServiceInputs

from ._errors import KubeApiError
from ._informer import Change, ChangeType, Informer, InformerSettings, ListWatchSource
from ._policy import namespaced_key
from ._values import refusal_or

log = logging.getLogger("flock.watchers")

REFUSED_BACKOFF = Backoff(initial=1.0, factor=2.0, cap=30.0, jitter=0.2)


def ignore_change(change: Change) -> None:
    """The informers' own callback: the feed follows them as a listener."""


@attrs.define(eq=False)
class _Feed:
    """One kind's informer stream → ``inputs`` (a :class:`ChangeListener`)."""

    kind: str
    inputs: ServiceInputs
    listed: Callable[[], None] = lambda: None  # after each full read
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
        self.listed()

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
    backoff: Backoff = REFUSED_BACKOFF
    rand: Callable[[], float] = random.random
    refusals: dict[str, str] = attrs.field(init=False, factory=dict)  # kind → the API server's last refusal
    _feeds: dict[str, _Feed] = attrs.field(init=False)
    _sources: dict[str, tuple[ListWatchSource, Callable[[Mapping[str, Any]], Any]]] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._feeds = {kind: _Feed(kind, self.inputs, functools.partial(self._listed, kind)) for kind in KINDS}
        self._sources = {
            SERVICES: (self.services, refusal_or(Service.from_object)),
            ENDPOINT_SLICES: (self.slices, refusal_or(EndpointSlice.from_object)),
        }

    def _listed(self, kind: str) -> None:
        self.refusals.pop(kind, None)

    @property
    def refused(self) -> dict[str, str]:
        """Objects left out because the model refused them: "Kind key" → why."""
        return {f"{kind} {key}": str(exc) for kind, feed in self._feeds.items() for key, exc in feed.refused.items()}

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run both informers (started at once: nothing else waits for them)."""
        try:
            async with trio.open_nursery() as nursery:
                for kind in self._feeds:
                    nursery.start_soon(self._follow, kind)
                task_status.started()
        finally:
            for kind in self._feeds:
                self.inputs.unlisted(kind)

    async def _follow(self, kind: str) -> None:
        source, transform = self._sources[kind]
        attempt = 0
        while True:
            informer = Informer(
                source,
                namespaced_key,
                ignore_change,
                self.settings,
                name=f"{kind} (cluster-wide)",
                listeners=(self._feeds[kind],),
                transform=transform,
            )
            try:
                await informer.run()
                continue  # (an informer runs until cancelled or refused)
            except KubeApiError as exc:
                if exc.status not in (403, 404):
                    raise
                if informer.ready:
                    attempt = 0
                delay = self.backoff.delay(attempt, self.rand())
                attempt += 1
                why = "not allowed to list them (RBAC)" if exc.status == 403 else "not served"
                self.refusals[kind] = f"{why}: {str(exc)[:200]}"
                log.warning(
                    "%ss refused (%s): the service proxy waits; retrying in %.1f s",
                    kind,
                    exc.status,
                    delay,
                    extra={"kind": kind, "error": str(exc)[:300], "retry_in": delay},
                )
            await trio.sleep(delay)
