"""Two writers against the real fake API server over HTTP, both believing they lead: no address is
ever held by two Services (checked at every revision the server recorded), and each Service gets one.
Each writer's writes come a few tens of ms after its reads, and new Services sort first, so plans made
from older reads differ: with the fence replaced by ``True`` this test finds a duplicate (tried: the
per-Service resourceVersion alone cannot stop two writers giving one address to two Services; the
Lease renewed before every write does).
Also a single writer end to end: pools' status, a request outside every pool, a type change."""

from __future__ import annotations

import ipaddress
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from flock.apiserver import LOADBALANCERPOOLS, NAMESPACES, SERVICES, ApiServer, namespace_object
from flock.apiserver._selectors import FieldSelector
from flock.controller import (
    CONDITION_TYPE,
    Elector,
    HttpApi,
    Kind,
    KubeApi,
    LeaseSettings,
    LoadBalancerController,
    ObjectApi,
    reconcile,
)
from flock.watchers import open_kube_client


@pytest.fixture
def api() -> Iterator[ApiServer]:
    with ApiServer(service_cluster_ip_range="fd00:10:96::/112,192.0.2.192/27") as server:
        server.store.create(NAMESPACES, namespace_object("default"))
        yield server


@attrs.frozen
class SlowWrites:
    """The real HTTP client, with a pause between a pass's reads and each of its writes: the window
    in which the other writer reads, plans and writes from what it saw."""

    http: HttpApi
    pause: float

    async def list(self, kind: Kind) -> list[dict[str, Any]]:
        return await self.http.list(kind)

    async def get(self, kind: Kind, name: str, namespace: str | None = None) -> dict[str, Any]:
        return await self.http.get(kind, name, namespace)

    async def create(self, kind: Kind, obj: dict[str, Any]) -> dict[str, Any]:
        return await self.http.create(kind, obj)

    async def replace(self, kind: Kind, obj: dict[str, Any], *, status: bool = False) -> dict[str, Any]:
        await trio.sleep(self.pause)
        return await self.http.replace(kind, obj, status=status)


def pool(name: str, *cidrs: str) -> dict[str, Any]:
    return {
        "apiVersion": "flock.fritzlab.net/v1alpha1",
        "kind": "LoadBalancerPool",
        "metadata": {"name": name},
        "spec": {"blocks": [{"cidr": c} for c in cidrs]},
    }


def lb_service(name: str, port: int = 80, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": "default", "annotations": annotations or {}},
        "spec": {
            "type": "LoadBalancer",
            "ipFamilyPolicy": "PreferDualStack",
            "selector": {"app": name},
            "ports": [{"port": port, "protocol": "TCP"}],
        },
    }


def ingress(obj: dict[str, Any]) -> list[str]:
    return [i["ip"] for i in ((obj.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []]


def holders_at_every_revision(api: ApiServer) -> list[dict[str, list[str]]]:
    """Each revision's address → Services holding it, replayed from the server's history."""
    events: list[Any] = []
    sub = api.store.watch(SERVICES, None, FieldSelector(), events.append, since=api.store.oldest_resource_version)
    sub.close()
    now: dict[str, list[str]] = {}
    seen: list[dict[str, list[str]]] = []
    for event in events:
        body = event.decode()
        obj = body["object"]
        key = f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
        now[key] = [] if body["type"] == "DELETED" else ingress(obj)
        held: dict[str, list[str]] = {}
        for service, addresses in now.items():
            for a in addresses:
                held.setdefault(a, []).append(service)
        seen.append(held)
    return seen


async def test_two_writers_believing_they_lead_never_give_one_address_twice(api: ApiServer) -> None:
    http = HttpApi(api.url)
    await http.create(LOADBALANCERPOOLS_KIND, pool("lab", "2001:db8:ee::/123", "192.0.2.224/27"))
    fast = LeaseSettings(lease_seconds=1.0, renew_seconds=0.8, retry_seconds=0.2)
    writers = [
        LoadBalancerController(SlowWrites(http, pause), Elector(http, name, fast).confirm, resync_seconds=0.01)
        for name, pause in (("writer-a", 0.03), ("writer-b", 0.05))
    ]
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:

            async def believe(writer: LoadBalancerController) -> None:
                while True:  # fenced off: it believes again, and tries again
                    await writer.run()
                    await trio.sleep(0.05)

            for w in writers:
                nursery.start_soon(believe, w)
            for i in range(20):
                # Each new Service sorts first: plans made from older reads give its address elsewhere.
                await http.create(SERVICES_KIND, lb_service(f"s{19 - i:02}"))
                await trio.sleep(0.01)
                if i % 5 == 4:  # the lease changes hands while Services keep coming
                    await trio.sleep(1.2)
            while True:
                items = await http.list(SERVICES_KIND)
                if all(len(ingress(s)) == len(s["spec"]["ipFamilies"]) for s in items):
                    break
                await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
    for held in holders_at_every_revision(api):
        assert all(len(services) == 1 for services in held.values()), held
    items = await http.list(SERVICES_KIND)
    final = {ip for s in items for ip in ingress(s)}
    assert len(final) == sum(len(s["spec"]["ipFamilies"]) for s in items) >= 20
    assert sum(w.passes for w in writers) > 0


@asynccontextmanager
async def client_of(api: ApiServer, how: str, tmp_path: Path) -> AsyncIterator[ObjectApi]:
    """Plain HTTP (the lab's), or kubernetes-asyncio through a kubeconfig (a cluster's)."""
    if how == "http":
        yield HttpApi(api.url)
        return
    async with open_kube_client(api.write_kubeconfig(tmp_path / "kubeconfig")) as kube:
        yield KubeApi(kube)


@pytest.mark.parametrize("how", ["http", "kubeconfig"])
async def test_one_writer_end_to_end(api: ApiServer, how: str, tmp_path: Path) -> None:
    async def always() -> bool:
        return True

    async with client_of(api, how, tmp_path) as http:
        await _one_writer(api, http, always)


async def _one_writer(api: ApiServer, http: ObjectApi, always: Callable[[], Awaitable[bool]]) -> None:
    with trio.fail_after(20):
        await http.create(LOADBALANCERPOOLS_KIND, pool("lab", "2001:db8:ee::/64", "192.0.2.224/27"))
        await http.create(SERVICES_KIND, lb_service("web"))
        await http.create(
            SERVICES_KIND, lb_service("outside", annotations={"flock.fritzlab.net/loadBalancerIPs": "198.51.100.7"})
        )
        await reconcile(http, always)
        web = await http.get(SERVICES_KIND, "web", "default")
        assert ingress(web) == ["2001:db8:ee::", "192.0.2.224"] or sorted(ingress(web)) == sorted(
            ["2001:db8:ee::", "192.0.2.224"]
        )
        assert all(i["ipMode"] == "VIP" for i in web["status"]["loadBalancer"]["ingress"])
        (cond,) = [c for c in web["status"]["conditions"] if c["type"] == CONDITION_TYPE]
        assert (cond["status"], cond["reason"]) == ("True", "Allocated")
        outside = await http.get(SERVICES_KIND, "outside", "default")
        assert ingress(outside) == []
        (cond,) = [c for c in outside["status"]["conditions"] if c["type"] == CONDITION_TYPE]
        assert (cond["status"], cond["reason"]) == ("False", "NotInPool")
        lab = await http.get(LOADBALANCERPOOLS_KIND, "lab")
        assert lab["status"]["ipv4"] == {"total": "32", "used": 1, "free": "31"}
        assert lab["status"]["ipv6"]["free"] == str(2**64 - 1)
        assert lab["status"]["conditions"][0]["status"] == "True"  # the request outside every pool
        # A restart rebuilds from the Services' status: a second pass writes nothing and moves nothing.
        before = api.store.resource_version
        await reconcile(http, always)
        assert api.store.resource_version == before
        # Type change: the address is released (and the condition goes).
        web = await http.get(SERVICES_KIND, "web", "default")
        web["spec"]["type"] = "ClusterIP"
        for key in ("ports",):
            web["spec"][key] = [{"port": 80, "protocol": "TCP"}]
        await http.replace(SERVICES_KIND, web)
        await reconcile(http, always)
        web = await http.get(SERVICES_KIND, "web", "default")
        assert ingress(web) == []
        assert not [c for c in web["status"].get("conditions") or [] if c["type"] == CONDITION_TYPE]
        assert ipaddress.ip_address("192.0.2.224")


from flock.controller._api import POOLS as LOADBALANCERPOOLS_KIND  # noqa: E402
from flock.controller._api import SERVICES as SERVICES_KIND  # noqa: E402

assert LOADBALANCERPOOLS.plural == LOADBALANCERPOOLS_KIND.plural and SERVICES.plural == SERVICES_KIND.plural
