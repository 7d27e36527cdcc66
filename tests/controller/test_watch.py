"""flock-controller by watches (kubernetes-asyncio through a kubeconfig, over HTTP to the API server
fake): a change is allocated for within a second, a burst of Services gets distinct addresses (the
caches hold every write before the next pass plans), and a missing pool CRD counts as no pool."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from flock.apiserver import LOADBALANCERPOOLS, NAMESPACES, SERVICES, ApiServer, namespace_object
from flock.controller import KubeApi
from flock.controller._watch import WatchingController
from flock.watchers import open_kube_client

from .test_race import lb_service, pool


@pytest.fixture
def api() -> Iterator[ApiServer]:
    with ApiServer(service_cluster_ip_range="fd00:10:96::/112,192.0.2.192/27") as server:
        server.store.create(NAMESPACES, namespace_object("default"))
        yield server


def ingress(obj: dict[str, Any]) -> list[str]:
    return [i["ip"] for i in ((obj.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []]


async def always() -> bool:
    return True


async def until(condition: Callable[[], bool], within: float, poll: float = 0.02) -> None:
    """Poll the API server's store (another thread's) until *condition* holds."""
    with trio.fail_after(within):
        while not condition():  # noqa: ASYNC110
            await trio.sleep(poll)


async def test_changes_are_allocated_for_by_watches_without_duplicates(api: ApiServer, tmp_path: Path) -> None:
    api.store.create(LOADBALANCERPOOLS, pool("lab", "2001:db8:ee::/120", "192.0.2.224/27"))
    async with open_kube_client(api.write_kubeconfig(tmp_path / "kubeconfig")) as kube:
        controller = WatchingController(KubeApi(kube), kube, always, resync_seconds=600)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(controller.run)
            api.store.create(SERVICES, lb_service("first"))
            start = trio.current_time()
            await until(lambda: len(ingress(api.store.get(SERVICES, "first", "default"))) == 2, 5)
            took = trio.current_time() - start
            print(f"a new Service's addresses written {took * 1000:.0f} ms after it was created")
            for i in range(20):  # a burst, as kubectl apply -f of many
                api.store.create(SERVICES, lb_service(f"burst-{i}"))
            await until(lambda: all(len(ingress(s)) == 2 for s in api.store.list(SERVICES)[0]), 10)
            given = [ip for s in api.store.list(SERVICES)[0] for ip in ingress(s)]
            assert len(given) == len(set(given)) == 42  # never one address to two Services
            assert all(ipaddress.ip_address(a) in ipaddress.ip_network("2001:db8:ee::/120") for a in given if ":" in a)
            nursery.cancel_scope.cancel()
    assert controller.passes >= 1  # (the pass that wrote the burst may still be writing pool status)


async def test_without_the_pool_crd_nothing_is_given_and_nothing_breaks(api: ApiServer, tmp_path: Path) -> None:
    api.store.uninstall(LOADBALANCERPOOLS)
    async with open_kube_client(api.write_kubeconfig(tmp_path / "kubeconfig")) as kube:
        controller = WatchingController(KubeApi(kube), kube, always, resync_seconds=600)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(controller.run)
            api.store.create(SERVICES, lb_service("web"))
            await until(lambda: "conditions" in (api.store.get(SERVICES, "web", "default").get("status") or {}), 5)
            (cond,) = api.store.get(SERVICES, "web", "default")["status"]["conditions"]
            assert (cond["status"], cond["reason"]) == ("False", "NoPool")
            nursery.cancel_scope.cancel()
