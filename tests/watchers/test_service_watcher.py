"""The service watcher (virtual time, over the fake API server's store): every Service and
EndpointSlice as values in ServiceInputs, listed before anything counts, changes followed,
refused objects named and left out, and the inputs unlisted when the watcher stops."""

from __future__ import annotations

import logging

import trio

from flock.apiserver import ObjectStore, Resource
from flock.nursery import Backoff
from flock.services import ENDPOINT_SLICES, SERVICES, ServiceInputs
from flock.testing import StoreSource
from flock.testing.services import endpoint, endpoint_slice, port, service, slice_port
from flock.watchers import InformerSettings, ServiceWatcher

SETTINGS = InformerSettings(
    watch_seconds=60, request_seconds=5, relist_seconds=600, backoff=Backoff(jitter=0.0), watch_list=False
)
# Stand-ins for the kinds (the store keeps any resource it is given).
SVC = Resource(group="", version="v1", plural="services", kind="Service", namespaced=True)
EPS = Resource(
    group="discovery.k8s.io", version="v1", plural="endpointslices", kind="EndpointSlice", namespaced=True,
    requires_spec=False,
)  # fmt: skip


def watcher(store: ObjectStore, inputs: ServiceInputs) -> ServiceWatcher:
    return ServiceWatcher(StoreSource(store, SVC), StoreSource(store, EPS), inputs, SETTINGS)


async def listed(inputs: ServiceInputs, within: float = 10) -> None:
    with trio.fail_after(within):
        while not inputs.complete:
            await inputs.wait_generation(inputs.generation)


async def test_services_and_slices_are_followed_as_values(autojump_clock):
    store, inputs = ObjectStore(), ServiceInputs()
    store.create(SVC, service("web", ["fd00:10:96::a"], [port("http", 80)]))
    store.create(EPS, endpoint_slice("web", [endpoint("2001:db8:0:1::1")], [slice_port("http", 8080)]))
    async with trio.open_nursery() as nursery:
        await nursery.start(watcher(store, inputs).run)
        await listed(inputs)
        assert set(inputs.services) == {"default/web"} and set(inputs.slices) == {"default/web-ipv6"}
        assert inputs.services["default/web"].cluster_ips[0].compressed == "fd00:10:96::a"
        target = inputs.generation + 2
        store.create(EPS, endpoint_slice("web", [endpoint("198.51.100.2")], [slice_port("http", 8080)]))
        store.delete(SVC, "web", "default")
        with trio.fail_after(10):
            while inputs.generation < target:
                await inputs.wait_generation(inputs.generation)
        assert inputs.services == {} and set(inputs.slices) == {"default/web-ipv6", "default/web-ipv4"}
        nursery.cancel_scope.cancel()
    assert not inputs.complete  # stopped: nothing may be applied from what it last saw


async def test_a_refused_object_is_named_left_out_and_taken_back_once_fixed(autojump_clock, caplog):
    store, inputs = ObjectStore(), ServiceInputs()
    bad = service("web", ["fd00:10:96::a"], [port("http", 80)])
    bad["spec"]["ports"][0]["port"] = 70000
    store.create(SVC, bad)
    w = watcher(store, inputs)
    with caplog.at_level(logging.ERROR, logger="flock.watchers"):
        async with trio.open_nursery() as nursery:
            await nursery.start(w.run)
            await listed(inputs)
            assert inputs.services == {}
            assert list(w.refused) == ["Service default/web"] and "ports[0].port" in w.refused["Service default/web"]
            good = service("web", ["fd00:10:96::a"], [port("http", 80)])
            good["metadata"]["resourceVersion"] = store.get(SVC, "web", "default")["metadata"]["resourceVersion"]
            store.update(SVC, good)
            with trio.fail_after(10):
                await inputs.wait_generation(inputs.generation)
            assert set(inputs.services) == {"default/web"} and w.refused == {}
            nursery.cancel_scope.cancel()
    refusals = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 1 and getattr(refusals[0], "field", "").endswith("port")
    assert {SERVICES, ENDPOINT_SLICES} == {"Service", "EndpointSlice"}


async def test_a_kind_not_served_or_not_allowed_is_asked_again_and_nothing_waits_for_it(autojump_clock):
    store, inputs = ObjectStore(), ServiceInputs()
    store.uninstall(EPS)  # the API server answers 404 (as 403 without RBAC on endpointslices)
    store.create(SVC, service("web", ["fd00:10:96::a"], [port("http", 80)]))
    w = watcher(store, inputs)
    async with trio.open_nursery() as nursery:
        with trio.fail_after(1):
            await nursery.start(w.run)  # at once: nothing else of the agent waits for Services
        await trio.sleep(60)
        assert not inputs.complete and set(inputs.services) == {"default/web"}
        assert list(w.refusals) == ["EndpointSlice"] and w.refusals["EndpointSlice"].startswith("not served")
        store.install(EPS)
        await listed(inputs, within=30 * 1.2 + 1)  # asked again with backoff (≤ 30 s ± 20 % apart)
        assert w.refusals == {}
        nursery.cancel_scope.cancel()
