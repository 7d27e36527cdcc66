"""flock-controller's Events over HTTP against the API server fake: the same refusal told again bumps
one Event's count (by either client), a Service made again under the same name gets an Event of its
own, and a long message is bounded."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from flock.apiserver import EVENTS, NAMESPACES, SERVICES, ApiServer, namespace_object
from flock.controller import HttpApi, KubeApi
from flock.controller._events import MESSAGE_LIMIT, record
from flock.watchers import open_kube_client

from .test_race import lb_service


@pytest.fixture
def api() -> Iterator[ApiServer]:
    with ApiServer(service_cluster_ip_range="fd00:10:96::/112,192.0.2.192/27") as server:
        server.store.create(NAMESPACES, namespace_object("default"))
        yield server


def events(api: ApiServer) -> list[dict[str, Any]]:
    return api.store.list(EVENTS)[0]


async def test_the_same_refusal_bumps_one_event(api: ApiServer, tmp_path: Path) -> None:
    with trio.fail_after(20):
        service = api.store.create(SERVICES, lb_service("web"))
        http = HttpApi(api.url)
        assert await record(http, service, "NotInPool", "203.0.113.7 outside", "controller-0") == 1
        assert await record(http, service, "NotInPool", "203.0.113.7 outside", "controller-0") == 2
        async with open_kube_client(api.write_kubeconfig(tmp_path / "kubeconfig")) as kube:
            # a newly elected writer, through the cluster's client, finds the same Event
            assert await record(KubeApi(kube), service, "NotInPool", "203.0.113.7 outside", "controller-1") == 3
        (only,) = events(api)
        assert (only["count"], only["reason"], only["type"]) == (3, "NotInPool", "Warning")
        assert (
            only["reportingInstance"] == "controller-1" and only["involvedObject"]["uid"] == service["metadata"]["uid"]
        )
        assert only["firstTimestamp"] <= only["lastTimestamp"]
        # another reason is another Event
        assert await record(http, service, "AddressInUse", "192.0.2.230 held", "controller-0") == 1
        assert sorted((e["reason"], e["count"]) for e in events(api)) == [("AddressInUse", 1), ("NotInPool", 3)]


async def test_a_service_made_again_gets_its_own_event_and_messages_are_bounded(api: ApiServer) -> None:
    with trio.fail_after(20):
        http = HttpApi(api.url)
        first = api.store.create(SERVICES, lb_service("web"))
        await record(http, first, "NotInPool", "x" * 5000, "controller-0")
        api.store.delete(SERVICES, "web", "default")
        again = api.store.create(SERVICES, lb_service("web"))
        await record(http, again, "NotInPool", "x" * 5000, "controller-0")
        got = events(api)
        assert [e["count"] for e in got] == [1, 1]
        assert {e["involvedObject"]["uid"] for e in got} == {first["metadata"]["uid"], again["metadata"]["uid"]}
        assert all(len(e["message"]) == MESSAGE_LIMIT for e in got)
