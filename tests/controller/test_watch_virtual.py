"""flock-controller's watch loop in virtual time (autojump_clock): the informers read the API server
fake's store directly (flock.testing.StoreSource) and the controller writes to it through the same
store, so the debounce, the passes and the periodic resync happen at exact virtual times."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio

from flock.apiserver import LOADBALANCERPOOLS, NAMESPACES, SERVICES, ObjectStore, namespace_object
from flock.apiserver._resources import Resource
from flock.apiserver._status import StatusError
from flock.controller import Kind
from flock.controller._api import SERVICES as SERVICES_KIND
from flock.controller._api import ApiRefused, Conflict, NotFound
from flock.controller._watch import DEBOUNCE_S, WatchingController
from flock.testing import StoreSource

from .test_race import ingress, lb_service, pool

RESOURCES = {"services": SERVICES, "namespaces": NAMESPACES, "loadbalancerpools": LOADBALANCERPOOLS}


@attrs.define(eq=False)
class StoreApi:
    """An ObjectApi over the store, without HTTP; records when each Service's status was written."""

    store: ObjectStore
    written: list[tuple[float, str]] = attrs.field(factory=list)

    def _call(self, fn: Any, *args: Any, **kw: Any) -> dict[str, Any]:
        try:
            answer: dict[str, Any] = fn(*args, **kw)
        except StatusError as exc:
            error = {409: Conflict, 404: NotFound}.get(exc.code, ApiRefused)
            raise error(fn.__name__, "", exc.code, str(exc)) from None
        return answer

    def _resource(self, kind: Kind) -> Resource:
        return RESOURCES[kind.plural]

    async def list(self, kind: Kind) -> list[dict[str, Any]]:
        await trio.lowlevel.checkpoint()
        return self.store.list(self._resource(kind))[0]

    async def get(self, kind: Kind, name: str, namespace: str | None = None) -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        return self._call(self.store.get, self._resource(kind), name, namespace)

    async def create(self, kind: Kind, obj: dict[str, Any]) -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        if kind.plural == "events":
            return obj  # the store-backed tests do not look at Events
        return self._call(self.store.create, self._resource(kind), obj)

    async def replace(self, kind: Kind, obj: dict[str, Any], *, status: bool = False) -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        meta = obj["metadata"]
        if kind == SERVICES_KIND:
            self.written.append((trio.current_time(), meta["name"]))
        if status:
            return self._call(
                self.store.set_status,
                self._resource(kind),
                meta["name"],
                obj["status"],
                meta.get("namespace"),
                meta["resourceVersion"],
            )
        return self._call(self.store.update, self._resource(kind), obj)


@attrs.frozen
class StoreSources:
    store: ObjectStore

    def services(self) -> StoreSource:
        return StoreSource(self.store, SERVICES)

    def namespaces(self) -> StoreSource:
        return StoreSource(self.store, NAMESPACES)

    def load_balancer_pools(self) -> StoreSource:
        return StoreSource(self.store, LOADBALANCERPOOLS)


async def always() -> bool:
    return True


@asynccontextmanager
async def running(store: ObjectStore, within: float) -> AsyncIterator[tuple[StoreApi, WatchingController]]:
    """A WatchingController over *store* (resync every 300 s), settled: listed, first pass done."""
    api = StoreApi(store)
    controller = WatchingController(api, StoreSources(store), always, resync_seconds=300)
    with trio.fail_after(within):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(controller.run)
            await trio.sleep(1.0)
            yield api, controller
            nursery.cancel_scope.cancel()


@pytest.fixture
def store() -> ObjectStore:
    store = ObjectStore(service_cluster_ip_range="fd00:10:96::/112,192.0.2.192/27")
    store.create(NAMESPACES, namespace_object("default"))
    store.create(LOADBALANCERPOOLS, pool("lab", "2001:db8:ee::/120", "192.0.2.224/27"))
    return store


async def test_a_burst_is_written_one_debounce_after_its_first_change(
    store: ObjectStore, autojump_clock: trio.abc.Clock
) -> None:
    async with running(store, 60) as (api, controller):  # listed, the first pass and its echo done, idle
        assert (controller.passes, api.written) == (2, [])
        start = trio.current_time()
        for i in range(5):  # five Services 10 ms apart: kubectl apply -f of a directory
            store.create(SERVICES, lb_service(f"web-{i}"))
            await trio.sleep(0.01)
        await trio.sleep(1.0)
        # one pass for the burst, DEBOUNCE_S after its first change, every Service in it
        assert sorted(api.written) == [(start + DEBOUNCE_S, f"web-{i}") for i in range(5)]
        given = [a for s in store.list(SERVICES)[0] for a in ingress(s)]
        assert len(given) == len(set(given)) == 10
        # then one more pass, woken by its own writes coming back, that writes nothing
        assert controller.passes == 4


async def test_the_periodic_resync_is_the_safety_net(store: ObjectStore, autojump_clock: trio.abc.Clock) -> None:
    async with running(store, 2000) as (_, controller):
        assert controller.passes == 2  # the first, and the echo of its pool status write at DEBOUNCE_S
        last = DEBOUNCE_S  # when that echo pass ran
        for n in (3, 4, 5):
            await trio.sleep_until(last + 299.0)
            assert controller.passes == n - 1  # nothing changed: no pass
            while controller.passes < n:  # noqa: ASYNC110 (a virtual-time probe of when it runs)
                await trio.sleep(0.001)
            assert trio.current_time() - last == pytest.approx(300.0 + DEBOUNCE_S, abs=0.002)
            last = trio.current_time()


async def test_a_pool_change_reaches_the_services(store: ObjectStore, autojump_clock: trio.abc.Clock) -> None:
    """A Service with no pool waits (NoPool); the pool appearing wakes a pass that gives it its address."""
    store.delete(LOADBALANCERPOOLS, "lab")
    store.create(SERVICES, lb_service("web"))
    async with running(store, 60) as (api, _):
        assert ingress(store.get(SERVICES, "web", "default")) == []
        created = trio.current_time()
        store.create(LOADBALANCERPOOLS, pool("lab", "2001:db8:ee::/120", "192.0.2.224/27"))
        await trio.sleep(1.0)
        assert ingress(store.get(SERVICES, "web", "default")) == ["2001:db8:ee::", "192.0.2.224"]
        assert api.written[-1] == (created + DEBOUNCE_S, "web")
