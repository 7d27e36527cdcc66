"""flock-controller's /healthz, /readyz and /metrics over real TCP, the controller running against
the API server fake over HTTP: ready once the API answered, leading or standing by, and its passes,
pool counts and Services by reason in the metrics."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import trio

from flock.apiserver import LOADBALANCERPOOLS, NAMESPACES, SERVICES, ApiServer, namespace_object
from flock.controller import Elector, HttpApi, LeaseSettings, LoadBalancerController
from flock.controller._health import serve_health
from flock.health import HealthServer

from ..health.test_health import http, samples
from .test_race import ingress, lb_service, pool
from .test_watch import until


@pytest.fixture
def api() -> Iterator[ApiServer]:
    with ApiServer(service_cluster_ip_range="fd00:10:96::/112,192.0.2.192/27") as server:
        server.store.create(NAMESPACES, namespace_object("default"))
        yield server


def get(path: str) -> bytes:
    return f"GET {path} HTTP/1.0\r\n\r\n".encode()


async def test_probes_and_metrics_of_a_writer_and_a_standby(api: ApiServer) -> None:
    api.store.create(LOADBALANCERPOOLS, pool("lab", "2001:db8:ee::/120", "192.0.2.224/30"))
    api.store.create(SERVICES, lb_service("web"))
    api.store.create(SERVICES, lb_service("pinned", annotations={"flock.fritzlab.net/loadBalancerIPs": "203.0.113.7"}))
    http_api = HttpApi(api.url)
    lease = LeaseSettings(namespace="default", name="flock-controller")
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            replicas = []
            for identity in ("controller-0", "controller-1"):
                elector = Elector(http_api, identity, lease)
                controller = LoadBalancerController(http_api, elector.confirm, resync_seconds=0.2, identity=identity)
                servers: list[HealthServer] = await nursery.start(serve_health, 0, elector, controller, ("127.0.0.1",))
                replicas.append((elector, controller, servers[0]))
                status, body = await http(servers[0].bound_port or 0, get("/readyz"))
                assert (status, body.splitlines()[0]) == (503, "not ready:")  # the API has not answered yet
                nursery.start_soon(elector.run, controller.run)
                await until(lambda: replicas[0][1].passes > 0, 10)  # controller-0 writes first
            await until(lambda: all(e.answered_at is not None for e, _, _ in replicas), 10)
            assert len(ingress(api.store.get(SERVICES, "web", "default"))) == 2
            for elector, controller, server in replicas:
                port = server.bound_port or 0
                assert await http(port, get("/healthz")) == (200, "ok\n")
                status, body = await http(port, get("/readyz"))
                note = "leading: this replica writes" if elector.leading else "standing by: another replica writes"
                assert status == 200 and note in body, body
                status, text = await http(port, get("/metrics"))
                got = samples(text)
                assert got[("flock_controller_leader", ())] == float(elector.leading)
                assert got[("flock_controller_passes_total", ())] == controller.passes
                if elector.leading:
                    lab = (("family", "ipv4"), ("pool", "lab"))
                    assert got[("flock_controller_pool_addresses", (*lab, ("state", "used")))] == 1
                    assert got[("flock_controller_pool_addresses", (*lab, ("state", "free")))] == 3
                    assert got[("flock_controller_pool_conflicts", (("pool", "lab"),))] == 1  # 203.0.113.7
                    assert got[("flock_controller_services", (("reason", "Allocated"),))] == 1
                    assert got[("flock_controller_services", (("reason", "NotInPool"),))] == 1
            assert [e.leading for e, _, _ in replicas] == [True, False]
            nursery.cancel_scope.cancel()


async def test_a_taken_port_is_an_error_not_a_blind_controller(api: ApiServer) -> None:
    http_api = HttpApi(api.url)
    elector = Elector(http_api, "controller-0")
    controller = LoadBalancerController(http_api, elector.confirm)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            (server,) = await nursery.start(serve_health, 0, elector, controller, ("127.0.0.1",))
            with pytest.raises(ExceptionGroup) as refused:
                await nursery.start(serve_health, server.bound_port, elector, controller, ("127.0.0.1",))
            assert refused.group_contains(OSError, match="in use")
            nursery.cancel_scope.cancel()
