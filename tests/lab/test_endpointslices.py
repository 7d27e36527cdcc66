"""The lab's EndpointSlice controller (flock.lab.controllers): its pure part against
kube-controller-manager's endpointslice semantics, then live, against the API server over HTTP
with flock's informers, reacting to a readiness flip well within a second."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import attrs
import trio

from flock.apiserver import (
    ENDPOINTSLICES,
    NODES,
    PODS,
    SERVICES,
    ApiServer,
    DeleteOptions,
    ObjectStore,
    Resource,
    node_object,
    pod_object,
)
from flock.lab.controllers import (
    CONTROLLER_NAME,
    EndpointSliceController,
    PodValue,
    ServiceValue,
    SliceValue,
    plan_service,
    run_controllers,
)
from flock.watchers import open_kube_client


def service(name: str = "web", **spec: Any) -> dict[str, Any]:
    body = {
        "selector": {"app": "web"},
        "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}],
        "ipFamilies": ["IPv6", "IPv4"],
        "clusterIP": "fd00:10:96::10",
        "clusterIPs": ["fd00:10:96::10", "192.0.2.200"],
        **spec,
    }
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"namespace": "shop", "name": name, "uid": f"uid-{name}", "labels": {"team": "a"}},
        "spec": body,
    }


def pod(
    name: str,
    ips: tuple[str, ...] = (),
    *,
    node: str = "node1",
    ready: bool = True,
    terminating: bool = False,
    phase: str = "Running",
    labels: dict[str, str] | None = None,
    ports: tuple[dict[str, Any], ...] = (),
) -> dict[str, Any]:
    obj = pod_object("shop", name, node, labels=labels or {"app": "web"}, ports=ports)
    obj["metadata"]["uid"] = f"uid-{name}"
    if terminating:
        obj["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z"
        obj["metadata"]["deletionGracePeriodSeconds"] = 2
    obj["status"] = {
        "phase": phase,
        "podIPs": [{"ip": ip} for ip in ips],
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    return obj


def plan(svc: dict[str, Any], pods: list[dict[str, Any]], existing: tuple[SliceValue, ...] = (), **kw: Any):
    return plan_service(ServiceValue.from_object(svc), [PodValue.from_object(p) for p in pods], existing, **kw)


def conditions(s: SliceValue) -> dict[str, tuple[bool, bool, bool]]:
    return {e.address: (e.ready, e.serving, e.terminating) for e in s.endpoints}


def applied(p: Any, existing: tuple[SliceValue, ...] = ()) -> tuple[SliceValue, ...]:
    """The slices after a plan's writes (new ones named as the API server would)."""
    gone = {s.name for s in p.delete}
    out = {s.name: s for s in existing if s.name not in gone}
    out.update({s.name: s for s in p.update})
    for i, s in enumerate(p.create):
        name = f"new-{len(out)}-{i}"
        out[name] = attrs.evolve(s, name=name)
    return tuple(out.values())


def test_one_slice_per_family_with_the_pods_the_selector_matches() -> None:
    pods = [
        pod("a", ("2001:db8:0:1::a", "198.51.100.10")),
        pod("b", ("2001:db8:0:2::b",), node="node2"),  # IPv6 only: in the IPv6 slice alone
        pod("other", ("2001:db8:0:1::c",), labels={"app": "db"}),
        pod("done", ("2001:db8:0:1::d",), phase="Succeeded"),  # ended: never an endpoint
        pod("pending", ()),  # no address yet
    ]
    p = plan(service(), pods)
    assert not p.update and not p.delete
    by_family = {s.address_type: s for s in p.create}
    assert set(by_family) == {"IPv6", "IPv4"}
    six, four = by_family["IPv6"], by_family["IPv4"]
    assert [e.address for e in six.endpoints] == ["2001:db8:0:1::a", "2001:db8:0:2::b"]
    assert [e.address for e in four.endpoints] == ["198.51.100.10"]
    assert [(pt.name, pt.port, pt.protocol) for pt in six.ports] == [("http", 8080, "TCP")]
    obj = six.to_object(ServiceValue.from_object(service()))
    meta = obj["metadata"]
    assert meta["generateName"] == "web-" and "name" not in meta
    assert meta["labels"] == {
        "team": "a",
        "kubernetes.io/service-name": "web",
        "endpointslice.kubernetes.io/managed-by": CONTROLLER_NAME,
    }
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "name": "web",
            "uid": "uid-web",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    first = obj["endpoints"][1]
    assert first == {
        "addresses": ["2001:db8:0:2::b"],
        "conditions": {"ready": True, "serving": True, "terminating": False},
        "targetRef": {"kind": "Pod", "namespace": "shop", "name": "b", "uid": "uid-b"},
        "nodeName": "node2",
    }


def test_conditions_of_not_ready_terminating_and_published_pods() -> None:
    pods = [
        pod("ready", ("2001:db8::1",)),
        pod("unready", ("2001:db8::2",), ready=False),
        pod("draining", ("2001:db8::3",), terminating=True),  # Ready, being deleted
        pod("dying", ("2001:db8::4",), ready=False, terminating=True),
    ]
    single = service(ipFamilies=["IPv6"], clusterIPs=["fd00:10:96::10"])
    (s,) = plan(single, pods).create
    assert conditions(s) == {
        "2001:db8::1": (True, True, False),
        "2001:db8::2": (False, False, False),
        "2001:db8::3": (False, True, True),  # serving and terminating: where kube-proxy falls back to
        "2001:db8::4": (False, False, True),
    }
    (s,) = plan({**single, "spec": {**single["spec"], "publishNotReadyAddresses": True}}, pods).create
    assert set(conditions(s).values()) == {(True, True, False), (True, True, True)}


def test_named_target_ports_resolve_per_pod_and_split_slices() -> None:
    svc = service(
        ipFamilies=["IPv6"],
        ports=[
            {"name": "http", "port": 80, "targetPort": "web", "protocol": "TCP"},
            {"name": "dns", "port": 53, "targetPort": 5353, "protocol": "UDP"},
        ],
    )
    pods = [
        pod("a", ("2001:db8::a",), ports=({"name": "web", "containerPort": 8080, "protocol": "TCP"},)),
        pod("b", ("2001:db8::b",), ports=({"name": "web", "containerPort": 9090, "protocol": "TCP"},)),
        pod(
            "c", ("2001:db8::c",), ports=({"name": "web", "containerPort": 8080, "protocol": "UDP"},)
        ),  # wrong protocol
    ]
    slices = plan(svc, pods).create
    got = {tuple((pt.name, pt.port) for pt in s.ports): [e.address for e in s.endpoints] for s in slices}
    assert got == {
        (("http", 8080), ("dns", 5353)): ["2001:db8::a"],
        (("http", 9090), ("dns", 5353)): ["2001:db8::b"],
        (("dns", 5353),): ["2001:db8::c"],  # the named port left out for the pod that lacks it
    }


def test_at_most_100_endpoints_a_slice_and_little_churn() -> None:
    svc = service(ipFamilies=["IPv6"])
    pods = [pod(f"p{i:03}", (f"2001:db8::{i:x}",)) for i in range(1, 251)]
    first = plan(svc, pods)
    assert sorted(len(s.endpoints) for s in first.create) == [50, 100, 100]
    slices = applied(first)
    # One pod's readiness flips: one slice rewritten, the others untouched.
    pods[7] = pod("p008", ("2001:db8::8",), ready=False)
    second = plan(svc, pods, slices)
    assert not second.create and not second.delete and len(second.update) == 1
    slices = applied(second, slices)
    # A pod goes and a new one comes: the new endpoint takes the room in the slice being rewritten anyway.
    pods = [p for p in pods if p["metadata"]["name"] != "p200"] + [pod("p999", ("2001:db8::999",))]
    third = plan(svc, pods, slices)
    assert not third.create and not third.delete and len(third.update) == 1
    (changed,) = third.update
    assert "2001:db8::999" in conditions(changed) and "2001:db8::c8" not in conditions(changed)
    slices = applied(third, slices)
    assert plan(svc, pods, slices).empty  # in line: nothing to write


def test_empty_service_keeps_a_placeholder_and_unmanaged_slices_go() -> None:
    svc = service(ipFamilies=["IPv6"])
    (placeholder,) = plan(svc, []).create
    assert placeholder.endpoints == () and placeholder.ports == ()
    slices = applied(plan(svc, []))
    assert plan(svc, [], slices).empty  # the placeholder stays, unchanged
    with_pod = plan(svc, [pod("a", ("2001:db8::a",))], slices)
    assert len(with_pod.create) == 1 and len(with_pod.delete) == 1  # the placeholder makes way
    slices = applied(with_pod, slices)
    # The selector removed: the Service is no longer this controller's; its slices go.
    unmanaged = {**svc, "spec": {k: v for k, v in svc["spec"].items() if k != "selector"}}
    assert len(plan(unmanaged, [pod("a", ("2001:db8::a",))], slices).delete) == 1
    # A slice someone else wrote for the Service (no managed-by label) is never touched.
    users = SliceValue("shop", "web-mine", "IPv6", (), (), (("kubernetes.io/service-name", "web"),))
    assert plan(unmanaged, [], (users,)).empty


def test_zone_hostname_and_family_change() -> None:
    svc = service(ipFamilies=["IPv6"])
    subdomained = pod("a", ("2001:db8::a", "198.51.100.1"))
    subdomained["spec"].update(hostname="a", subdomain="web")
    (s,) = plan(svc, [subdomained], zones={"node1": "zone-a"}).create
    assert (s.endpoints[0].zone, s.endpoints[0].hostname) == ("zone-a", "a")
    slices = applied(plan(svc, [subdomained]))
    # The Service becomes IPv4 only: the IPv6 slice goes, an IPv4 one comes.
    four = service(ipFamilies=["IPv4"], clusterIP="192.0.2.200", clusterIPs=["192.0.2.200"])
    p = plan(four, [subdomained], slices)
    assert [s.address_type for s in p.delete] == ["IPv6"] and [s.address_type for s in p.create] == ["IPv4"]


class StoreWriter:
    """Writes straight into the API server's store (thread-safe), as HTTP would."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    async def create(self, res: Resource, obj: dict[str, Any]) -> dict[str, Any]:
        return await trio.to_thread.run_sync(self.store.create, res, obj)

    async def replace(self, res: Resource, obj: dict[str, Any]) -> dict[str, Any]:
        return await trio.to_thread.run_sync(self.store.update, res, obj)

    async def delete(self, res: Resource, name: str, namespace: str | None = None) -> dict[str, Any]:
        return await trio.to_thread.run_sync(self.store.delete, res, name, namespace)


async def _until(what: Any, limit: float) -> float:
    """Poll *what* (a function of nothing) until true; the seconds it took."""
    start = time.monotonic()
    with trio.fail_after(limit):
        while not what():  # noqa: ASYNC110 (another thread's server: polled)
            await trio.sleep(0.01)
    return time.monotonic() - start


async def test_live_against_the_api_server(tmp_path: Path) -> None:
    with trio.fail_after(60), ApiServer(service_cluster_ip_range="fd00:10:96::/112,192.0.2.192/27") as api:
        store = api.store
        store.create(
            NODES,
            {**node_object("node1"), "metadata": {"name": "node1", "labels": {"topology.kubernetes.io/zone": "z1"}}},
        )
        store.create(PODS, pod("a", ("2001:db8::a", "198.51.100.1")))
        store.create(PODS, pod("b", ("2001:db8::b", "198.51.100.2"), node="node2"))
        svc = service()
        for key in ("clusterIP", "clusterIPs"):
            svc["spec"].pop(key)
        svc["spec"]["ipFamilyPolicy"] = "PreferDualStack"
        store.create(SERVICES, svc)

        def slices() -> list[dict[str, Any]]:
            items, _ = store.list(ENDPOINTSLICES, "shop")
            return items

        def ready_of(address: str) -> bool | None:
            for s in slices():
                for e in s["endpoints"]:
                    if e["addresses"] == [address]:
                        return bool(e["conditions"]["ready"])
            return None

        controller = EndpointSliceController(StoreWriter(store))
        async with open_kube_client(api.write_kubeconfig(tmp_path / "kubeconfig")) as kube, trio.open_nursery() as n:
            await n.start(run_controllers, kube, controller)
            await _until(lambda: ready_of("2001:db8::b") and ready_of("198.51.100.2"), 5)
            names = sorted(s["metadata"]["name"] for s in slices())
            assert len(names) == 2 and all(name.startswith("web-") and len(name) == 9 for name in names)
            z = [e for s in slices() for e in s["endpoints"] if e["addresses"] == ["2001:db8::a"]]
            assert z[0]["zone"] == "z1" and z[0]["nodeName"] == "node1"
            # A readiness flip reaches the slices well within a second.
            status = store.get(PODS, "b", "shop")["status"]
            status["conditions"] = [{"type": "Ready", "status": "False"}]
            store.set_status(PODS, "b", status, "shop")
            took = await _until(lambda: ready_of("2001:db8::b") is False, 5)
            assert took < 0.5, took
            # A graceful delete: serving and terminating, not ready; then gone with the pod.
            store.delete(PODS, "a", "shop", DeleteOptions(5))
            await _until(lambda: ready_of("2001:db8::a") is False, 5)
            (ep,) = [e for s in slices() for e in s["endpoints"] if e["addresses"] == ["2001:db8::a"]]
            assert ep["conditions"] == {"ready": False, "serving": True, "terminating": True}
            store.delete(PODS, "a", "shop", DeleteOptions(0))
            await _until(lambda: ready_of("2001:db8::a") is None, 5)
            # Someone deletes a managed slice: it comes back.
            victim = slices()[0]["metadata"]["name"]
            store.delete(ENDPOINTSLICES, victim, "shop")
            await _until(lambda: len(slices()) == 2 and victim not in {s["metadata"]["name"] for s in slices()}, 5)
            # The Service goes: so do its slices.
            store.delete(SERVICES, "web", "shop")
            await _until(lambda: not slices(), 5)
            n.cancel_scope.cancel()
