"""The cluster-wide policy watchers: NetworkPolicies, Namespaces and Pods into one PolicyInputs.

Virtual-time tests read the fake API server's store directly (StoreSource);
the HTTP tests run the agent's client stack against the server over real HTTP.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import math
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from flock.apiserver import (
    NAME_LABEL,
    NAMESPACES,
    NETWORKPOLICIES,
    PODS,
    ApiServer,
    ObjectStore,
    namespace_object,
    network_policy_object,
    pod_object,
)
from flock.nursery import Backoff
from flock.policy import Kind, Namespace, NetworkPolicy, PolicyInputs, PolicySnapshot
from flock.testing import StoreSource, serving
from flock.watchers import (
    ChangeType,
    InformerSettings,
    KubeApiError,
    ListOptions,
    ListPage,
    PodWatcher,
    PolicyWatcher,
    open_kube_client,
)

NODE = "node1"
SETTINGS = InformerSettings(watch_seconds=60, request_seconds=5, relist_seconds=600, backoff=Backoff(jitter=0.0))
FAST = InformerSettings(watch_seconds=2, request_seconds=1, relist_seconds=600, backoff=Backoff(initial=0.05, cap=0.4))
DENY: dict[str, Any] = {"podSelector": {}}
ALLOW_FROM_Y: dict[str, Any] = {
    "podSelector": {"matchLabels": {"pod": "a"}},
    "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}], "ports": [{"port": "serve-80"}]}],
}


def serving_pod(namespace: str, name: str, node: str, ip: str, **labels: str) -> dict[str, Any]:
    obj = pod_object(
        namespace, name, node, labels=labels, ports=[{"name": "serve-80", "containerPort": 80, "protocol": "TCP"}]
    )
    obj["status"] = {"phase": "Running", "podIPs": [{"ip": ip}]}
    return obj


BOOKMARK_S = 0.5


def watchers(store: ObjectStore, own_pods: bool = True) -> tuple[PolicyWatcher, PolicyInputs]:
    inputs = PolicyInputs()
    watcher = PolicyWatcher(
        StoreSource(store, NETWORKPOLICIES, bookmark_seconds=BOOKMARK_S),
        StoreSource(store, NAMESPACES, bookmark_seconds=BOOKMARK_S),
        inputs,
        StoreSource(store, PODS, bookmark_seconds=BOOKMARK_S) if own_pods else None,
        SETTINGS,
    )
    return watcher, inputs


def expected(store: ObjectStore) -> dict[str, dict[str, Any]]:
    """What the inputs must hold: every object of the store, as policy values (a pod's
    resourceVersion is not kept: nothing reads it)."""
    from flock.policy import PolicyPod

    policies, _ = store.list(NETWORKPOLICIES)
    namespaces, _ = store.list(NAMESPACES)
    pods, _ = store.list(PODS)
    return {
        "policies": {
            f"{o['metadata']['namespace']}/{o['metadata']['name']}": NetworkPolicy.from_object(o) for o in policies
        },
        "namespaces": {o["metadata"]["name"]: Namespace.from_object(o) for o in namespaces},
        "pods": {
            f"{o['metadata']['namespace']}/{o['metadata']['name']}": attrs.evolve(
                PolicyPod.from_object(o), resource_version=""
            )
            for o in pods
        },
    }


def as_dicts(snap: PolicySnapshot) -> dict[str, dict[str, Any]]:
    return {"policies": dict(snap.policies), "namespaces": dict(snap.namespaces), "pods": dict(snap.pods)}


async def test_inputs_follow_every_kind_and_generation_moves_only_on_change(autojump_clock: trio.abc.Clock) -> None:
    store = ObjectStore()
    store.create(NAMESPACES, namespace_object("x", {"ns": "x"}))
    store.create(NAMESPACES, namespace_object("y", {"ns": "y"}))
    store.create(PODS, serving_pod("x", "a", NODE, "2001:db8:0:1::a", pod="a"))
    store.create(PODS, serving_pod("y", "b", "node2", "2001:db8:0:2::b", pod="b"))
    store.create(NETWORKPOLICIES, network_policy_object("x", "allow-from-y", ALLOW_FROM_Y))
    watcher, inputs = watchers(store)
    with trio.fail_after(30):
        assert not inputs.snapshot().complete and watcher.watermark == 0
        async with serving(watcher):
            snap = inputs.snapshot()
            assert snap.complete and watcher.synced
            assert as_dicts(snap) == expected(store)
            assert dict(snap.namespaces["x"].labels) == {"ns": "x", NAME_LABEL: "x"}
            pod = snap.pods["y/b"]
            assert pod.node == "node2" and pod.addresses == (ipaddress.ip_address("2001:db8:0:2::b"),)
            assert [(p.name, p.port) for p in pod.named_ports] == [("serve-80", 80)]
            assert watcher.watermark == store.resource_version

            # Each kind of change reaches the inputs at once, with one wake-up per change; the
            # other kinds' watches catch the watermark up with their next BOOKMARK.
            for write in (
                lambda: store.patch(NAMESPACES, "y", {"metadata": {"labels": {"ns": "yy"}}}),
                lambda: store.patch(PODS, "a", {"metadata": {"labels": {"pod": "aa"}}}, "x"),
                lambda: store.create(NETWORKPOLICIES, network_policy_object("y", "deny", DENY)),
                lambda: store.delete(NETWORKPOLICIES, "allow-from-y", "x"),
                lambda: store.delete(PODS, "b", "y"),
            ):
                start = trio.current_time()
                write()
                snap = await inputs.wait_changed(snap.generation)
                assert trio.current_time() == start  # woken at once, no polling
                assert as_dicts(snap) == expected(store)
                assert watcher.watermark < store.resource_version
                await trio.sleep(BOOKMARK_S + 0.001)  # past the tie with a bookmark due at the same instant
                assert watcher.watermark == store.resource_version
                assert inputs.snapshot() is snap  # bookmarks change no value
            assert snap.namespaces["y"].label_map["ns"] == "yy"
            assert sorted(snap.policies) == ["y/deny"] and sorted(snap.pods) == ["x/a"]


async def test_one_pod_informer_feeds_the_node_cache_and_the_policy_inputs(autojump_clock: trio.abc.Clock) -> None:
    store = ObjectStore()
    store.create(PODS, serving_pod("x", "a", NODE, "2001:db8:0:1::a"))
    store.create(PODS, serving_pod("x", "b", "node2", "2001:db8:0:2::b"))
    policy, inputs = watchers(store, own_pods=False)
    source = StoreSource(store, PODS)  # every pod, not only this node's
    pods = PodWatcher(source, NODE, SETTINGS, listeners=(policy.pod_listener,))
    with trio.fail_after(30):
        async with serving(policy, pods):
            snap = inputs.snapshot()
            assert snap.complete and sorted(snap.pods) == ["x/a", "x/b"]
            assert sorted(pods.pods) == ["x/a"]  # the node's own cache keeps only this node's pods
            # Pods are read once (one WatchList, no list) and watched on that one stream.
            assert source.lists == 0 and source.watch_requests == [("", True)]

            with pods.subscribe() as changes:
                store.create(PODS, pod_object("x", "c"))  # not scheduled yet: not this node's
                snap = await inputs.wait_changed(snap.generation)
                assert "x/c" in snap.pods and "x/c" not in pods.pods
                store.update(PODS, pod_object("x", "c", NODE))  # bound here: ADDED for this node
                change = await changes.receive()
                assert (change.type, change.pod.key) == (ChangeType.ADDED, "x/c")
                snap = inputs.snapshot()
                assert snap.pods["x/c"].node == NODE
                store.patch(PODS, "b", {"metadata": {"labels": {"role": "db"}}}, "x")  # another node's pod
                snap = await inputs.wait_changed(snap.generation)
                assert snap.pods["x/b"].label_map == {"role": "db"}
                store.delete(PODS, "c", "x")
                change = await changes.receive()
                assert (change.type, change.pod.key) == (ChangeType.DELETED, "x/c")
                with pytest.raises(trio.WouldBlock):
                    changes.receive_nowait()  # the other node's pod changed nothing here
            assert as_dicts(inputs.snapshot()) == expected(store)
            # Without BOOKMARKs (the store source sends none) the watermark is the oldest kind's last event.
            assert 0 < policy.watermark <= store.resource_version


class _Listed:
    """A ListWatchSource that lists fixed objects and then watches nothing (without WatchList)."""

    def __init__(self, items: list[Mapping[str, Any]], rv: str) -> None:
        self.items, self.rv = items, rv

    async def list(self, options: ListOptions, on_item: Callable[[Mapping[str, Any]], None]) -> ListPage:
        await trio.lowlevel.checkpoint()
        for item in self.items:
            on_item(item)
        return ListPage(self.rv)

    @contextlib.asynccontextmanager
    async def watch(
        self, resource_version: str, timeout_seconds: int, *, send_initial_events: bool = False
    ) -> AsyncIterator[AsyncIterator[Any]]:
        if send_initial_events:
            raise KubeApiError(
                422, "Invalid", "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled"
            )
        _send, receive = trio.open_memory_channel[Any](math.inf)
        with receive:
            yield _Quiet(receive)

    async def get(self, namespace: str | None, name: str) -> Mapping[str, Any] | None:
        return None


class _Quiet:
    def __init__(self, receive: trio.MemoryReceiveChannel[Any]) -> None:
        self.receive = receive

    def __aiter__(self) -> _Quiet:
        return self

    async def __anext__(self) -> Any:
        return await self.receive.receive()


async def test_an_object_the_model_refuses_is_left_out_and_logged(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    # Objects a newer API server might send but flock cannot read (the fake server refuses them).
    bad_policy = network_policy_object("x", "bad", {"podSelector": {}, "policyTypes": ["Sideways"]})
    bad_policy["metadata"]["resourceVersion"] = "5"
    good_policy = network_policy_object("x", "good", DENY)
    good_policy["metadata"]["resourceVersion"] = "6"
    bad_ns = namespace_object("z", {"ns": "z"})
    bad_ns["metadata"]["labels"] = ["not", "a", "map"]
    inputs = PolicyInputs()
    watcher = PolicyWatcher(
        _Listed([bad_policy, good_policy], "7"), _Listed([bad_ns], "7"), inputs, _Listed([], "7"), SETTINGS
    )
    with trio.fail_after(30), caplog.at_level(logging.ERROR, "flock.watchers"):
        async with serving(watcher):
            snap = inputs.snapshot()
            assert snap.complete and sorted(snap.policies) == ["x/good"] and snap.namespaces == {}
            assert sorted(watcher.refused) == ["Namespace z", "NetworkPolicy x/bad"]
            assert "spec.policyTypes[0]" in watcher.refused["NetworkPolicy x/bad"]
            assert watcher.watermark == 7
    assert any("x/bad" in r.getMessage() and "refused" in r.getMessage() for r in caplog.records)


async def test_over_http_bookmarks_move_the_watermark_and_faults_converge(tmp_path: Path) -> None:
    with trio.fail_after(40), ApiServer(bookmark_interval=0.1) as api:
        api.create(NAMESPACES, namespace_object("x", {"ns": "x"}))
        api.create(PODS, serving_pod("x", "a", NODE, "2001:db8:0:1::a", pod="a"))
        async with open_kube_client(api.write_kubeconfig(tmp_path / "kubeconfig")) as kube:
            inputs = PolicyInputs()
            policy = PolicyWatcher(
                kube.network_policies(),
                kube.namespaces(),
                inputs,
                settings=FAST,
                cluster_policies=kube.cluster_network_policies(),
                nodes=kube.nodes(),
            )
            pods = PodWatcher(kube.all_pods(), NODE, FAST, listeners=(policy.pod_listener,))
            async with serving(policy, pods):

                async def caught_up() -> PolicySnapshot:
                    """Until the watermark passes the server's version: then the inputs equal the server."""
                    await policy.wait_watermark(api.store.resource_version)
                    snap = inputs.snapshot()
                    assert as_dicts(snap) == expected(api.store)
                    return snap

                await caught_up()
                # A policy write moves only the policy watch; BOOKMARKs move the others past it.
                api.create(NETWORKPOLICIES, network_policy_object("x", "deny", DENY))
                snap = await caught_up()
                assert sorted(snap.policies) == ["x/deny"]
                assert sorted(pods.pods) == ["x/a"]

                # Cut connections, a 5xx burst and an expired history: the caches relist and converge.
                api.drop_connections()
                api.fail_next(3, 503)
                api.create(NAMESPACES, namespace_object("y", {"ns": "y"}))
                api.compact(expire_watches=True)
                api.create(NETWORKPOLICIES, network_policy_object("y", "allow", ALLOW_FROM_Y))
                api.delete(NETWORKPOLICIES, "deny", "x")
                snap = await caught_up()
                assert sorted(snap.policies) == ["y/allow"] and sorted(snap.namespaces) == ["x", "y"]
                # Nodes are listed only while a ClusterNetworkPolicy has a nodes peer.
                assert snap.complete and inputs.snapshot().synced == frozenset(Kind) - {Kind.NODE}


async def test_inputs_outliving_their_watchers_lose_what_went_while_no_one_watched(
    autojump_clock: trio.abc.Clock,
) -> None:
    # The agent keeps one PolicyInputs across API reconnects; each client gets new watchers.
    store = ObjectStore()
    store.create(NAMESPACES, namespace_object("x", {"ns": "x"}))
    store.create(NETWORKPOLICIES, network_policy_object("x", "stays", DENY))
    store.create(NETWORKPOLICIES, network_policy_object("x", "goes", DENY))
    store.create(PODS, serving_pod("x", "a", NODE, "2001:db8:0:1::a"))
    first, inputs = watchers(store)
    with trio.fail_after(30):
        async with serving(first):
            assert sorted(inputs.snapshot().policies) == ["x/goes", "x/stays"]
        store.delete(NETWORKPOLICIES, "goes", "x")  # while no one watches
        store.delete(PODS, "a", "x")
        store.patch(NAMESPACES, "x", {"metadata": {"labels": {"ns": "xx"}}})
        second = PolicyWatcher(
            StoreSource(store, NETWORKPOLICIES),
            StoreSource(store, NAMESPACES),
            inputs,
            StoreSource(store, PODS),
            SETTINGS,
        )
        async with serving(second):
            assert as_dicts(inputs.snapshot()) == expected(store)
            assert sorted(inputs.snapshot().policies) == ["x/stays"] and inputs.snapshot().pods == {}
