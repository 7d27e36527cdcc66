"""The LoadBalancer controller following the cluster by watches: a pass per change, not per second.

Three informers (:mod:`flock.watchers`: list, then watch, relist on 410) keep Services, Namespaces and
LoadBalancerPools as the API server holds them; any change wakes the loop, which waits
:data:`DEBOUNCE_S` for the rest of a burst and runs one :func:`reconcile` pass over the caches
(:class:`CachedApi`: reads from the caches, writes to the API server).  A periodic pass
(:attr:`WatchingController.resync_seconds`) is the safety net.

Read-your-writes: before a pass, the caches must hold every object this writer wrote (its
resourceVersion, :meth:`Informer.wait_synced`).  Planned from a cache that has not seen the last
pass's writes, a pass would find an address free that it just gave, and give it again to another
Service: the resourceVersion check would refuse only the first Service's write, not the second's.

The pools' list answering 404 (the CRD not installed) or 403 counts as no pool, tried again every
:data:`REFUSED_RETRY_S`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

import attrs
import trio

from flock.watchers import Change, Informer, InformerSettings, KubeApiError, ListWatchSource

from ._api import NAMESPACES, POOLS, SERVICES, Kind, ObjectApi
from ._ipam import Plan
from ._loop import counted_pass
from ._reconcile import Fence

log = logging.getLogger("flock.controller.ipam")

DEBOUNCE_S = 0.05  # a burst of changes (kubectl apply -f of many Services) is one pass
RESYNC_S = 300.0
REFUSED_RETRY_S = 60.0
SETTINGS = InformerSettings(watch_seconds=300)


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or ''}/{meta.get('name', '')}"


@attrs.define(eq=False)
class CachedApi:
    """An :class:`ObjectApi` reading from informers' caches and writing through *api*; remembers the
    newest resourceVersion it wrote per kind, for :meth:`synced`."""

    api: ObjectApi
    informers: Mapping[str, Informer]  # by Kind.plural
    written: dict[str, int] = attrs.field(factory=dict)

    async def list(self, kind: Kind) -> list[dict[str, Any]]:
        return list(self.informers[kind.plural].objects.values())

    async def get(self, kind: Kind, name: str, namespace: str | None = None) -> dict[str, Any]:
        return await self.api.get(kind, name, namespace)

    async def create(self, kind: Kind, obj: dict[str, Any]) -> dict[str, Any]:
        return await self.api.create(kind, obj)

    async def replace(self, kind: Kind, obj: dict[str, Any], *, status: bool = False) -> dict[str, Any]:
        got = await self.api.replace(kind, obj, status=status)
        version = int((got.get("metadata") or {}).get("resourceVersion") or 0)
        if kind.plural in self.informers and version > self.written.get(kind.plural, 0):
            self.written[kind.plural] = version
        return got

    async def delete(self, kind: Kind, name: str, namespace: str | None = None) -> dict[str, Any]:
        return await self.api.delete(kind, name, namespace)

    async def synced(self) -> None:
        """Until every cache holds what this writer wrote."""
        for plural, version in self.written.items():
            await self.informers[plural].wait_synced(str(version))


@attrs.define(eq=False)
class _Wake:
    """Set by any informer's change; renewed before each pass."""

    event: trio.Event = attrs.field(factory=trio.Event)

    def poke(self, change: Change) -> None:
        self.event.set()

    def renew(self) -> None:
        self.event = trio.Event()


class ControllerSources(Protocol):
    """Where the informers read (a :class:`flock.watchers.KubeClient`; an in-memory store in tests)."""

    def services(self) -> ListWatchSource: ...

    def namespaces(self) -> ListWatchSource: ...

    def load_balancer_pools(self) -> ListWatchSource: ...


@attrs.define(eq=False)
class WatchingController:
    """Runs while its elector leads (the elector's *work*); returns when fenced off."""

    api: ObjectApi
    kube: ControllerSources
    fence: Fence
    identity: str = "flock-controller"
    resync_seconds: float = RESYNC_S
    error_retry_seconds: float = 2.0
    settings: InformerSettings = SETTINGS
    passes: int = attrs.field(default=0, init=False)
    conflicts: int = attrs.field(default=0, init=False)
    failures: int = attrs.field(default=0, init=False)
    last_plan: Plan | None = attrs.field(default=None, init=False)  # what the last complete pass planned

    async def run(self) -> None:
        wake = _Wake()
        sources: dict[str, tuple[ListWatchSource, InformerSettings]] = {
            SERVICES.plural: (self.kube.services(), self.settings),
            NAMESPACES.plural: (self.kube.namespaces(), self.settings),
            # a custom resource: the client's custom-object calls have no sendInitialEvents
            POOLS.plural: (self.kube.load_balancer_pools(), attrs.evolve(self.settings, watch_list=False)),
        }
        informers = {
            plural: Informer(source, _key, wake.poke, settings, name=f"{plural} (controller)")
            for plural, (source, settings) in sources.items()
        }
        async with trio.open_nursery() as nursery:
            listed = [trio.Event() for _ in informers]
            for (plural, informer), done in zip(informers.items(), listed, strict=True):
                nursery.start_soon(self._keep, plural, informer, done)
            for done in listed:
                await done.wait()
            await self._follow(CachedApi(self.api, informers), wake)
            nursery.cancel_scope.cancel()

    async def _follow(self, cached: CachedApi, wake: _Wake) -> None:
        while True:
            with trio.move_on_after(10.0):
                await cached.synced()
            wake.renew()  # changes from here on wake the next pass
            done = await counted_pass(self, cached)
            if done is None:
                return
            if not done:
                continue
            with trio.move_on_after(self.resync_seconds):
                await wake.event.wait()
            await trio.sleep(DEBOUNCE_S)

    async def _keep(self, plural: str, informer: Informer, listed: trio.Event) -> None:
        """Run *informer*; a refused pools list counts as listed with nothing, asked again later."""

        async def mark() -> None:
            await informer.wait_ready()
            listed.set()

        while True:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(mark)
                try:
                    await informer.run()
                except KubeApiError as exc:
                    if plural != POOLS.plural or exc.status not in (403, 404):
                        raise
                    log.warning(
                        "LoadBalancerPools refused (%s): no pool; asking again in %.0f s",
                        exc.status,
                        REFUSED_RETRY_S,
                        extra={"error": str(exc)[:300]},
                    )
                nursery.cancel_scope.cancel()
            listed.set()
            await trio.sleep(REFUSED_RETRY_S)
