"""flock-controller's address groups and an agent's PeerFeed, end to end over HTTP (the fake API server,
kubernetes-asyncio on both sides): the agent learns its own pods and exactly the peers its policies name;
a remote pod's new label reaches it; a status-only update writes nothing; a restarted controller resumes
from what it wrote and writes nothing when nothing changed."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trio

from flock.apiserver import (
    ADDRESSGROUPS,
    NAMESPACES,
    NETWORKPOLICIES,
    NODEADDRESSGROUPS,
    NODES,
    PODS,
    ApiServer,
    namespace_object,
    network_policy_object,
    node_object,
    pod_object,
)
from flock.controller import KubeApi
from flock.controller._groups import GroupController
from flock.policy import Kind, PolicyInputs
from flock.watchers import PeerFeed, open_kube_client

WEB_FROM_CLIENTS = {
    "podSelector": {"matchLabels": {"app": "web"}},
    "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "a"}}, "podSelector": {"matchLabels": {"app": "client"}}}]}],
}  # fmt: skip


def running(server: ApiServer, namespace: str, name: str, node: str, ip: str, labels: dict[str, str]) -> None:
    server.store.create(PODS, pod_object(namespace, name, node, labels=labels), namespace)
    server.store.set_status(PODS, name, {"phase": "Running", "podIPs": [{"ip": ip}]}, namespace)


@pytest.fixture
def api() -> Iterator[ApiServer]:
    with ApiServer() as server:
        for node in ("n1", "n2", "n3"):
            server.store.create(NODES, node_object(node))
        server.store.create(NAMESPACES, namespace_object("x"))
        server.store.create(NAMESPACES, namespace_object("y", {"team": "a"}))
        server.store.create(NAMESPACES, namespace_object("z", {"team": "b"}))
        server.store.create(NETWORKPOLICIES, network_policy_object("x", "web", WEB_FROM_CLIENTS), "x")
        running(server, "x", "web", "n1", "2001:db8:1::1", {"app": "web"})
        running(server, "y", "client", "n2", "2001:db8:2::1", {"app": "client"})
        running(server, "z", "client", "n3", "2001:db8:3::1", {"app": "client"})  # team b: not a peer
        running(server, "y", "other", "n3", "2001:db8:3::2", {"app": "other"})
        yield server


async def until(check: Callable[[], bool], seconds: float = 10.0) -> None:
    """Poll what the API server's thread and the controller's tasks hold until *check* does."""
    with trio.fail_after(seconds):
        while not check():  # noqa: ASYNC110
            await trio.sleep(0.02)


async def always() -> bool:
    return True


async def test_an_agent_learns_its_pods_and_exactly_its_peers(api: ApiServer, tmp_path: Path) -> None:
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    inputs = PolicyInputs()
    async with open_kube_client(kubeconfig) as kube, trio.open_nursery() as nursery:
        controller = GroupController(KubeApi(kube), kube, always)
        nursery.start_soon(controller.run)
        feed = PeerFeed(inputs, "n1")
        nursery.start_soon(feed.run, kube)
        # this node's own pods come from its pod informer; here, as the link's listener would hand them over
        feed.local_listed({})
        await until(lambda: Kind.POD in inputs.snapshot().synced and "y/client" in inputs.pods)
        assert set(inputs.pods) == {"y/client"}  # not z/client (team b), not y/other
        assert feed.groups is not None and len(feed.groups) == 1
        (slice_,) = api.list(ADDRESSGROUPS)
        assert [m["name"] for m in slice_["members"]] == ["client"]
        needs = {o["metadata"]["name"]: o["groups"] for o in api.list(NODEADDRESSGROUPS)}
        assert needs == {"n1": sorted(feed.groups), "n2": [], "n3": []}  # every Node has its list

        # A status-only update (a condition): nothing written.
        await until(lambda: controller.passes >= 1)
        writes = controller.writes
        api.store.set_status(
            PODS,
            "client",
            {"phase": "Running", "podIPs": [{"ip": "2001:db8:2::1"}], "conditions": [{"type": "Ready", "status": "True"}]},
            "y",
        )  # fmt: skip
        passes = controller.passes
        await until(lambda: controller.passes > passes)
        assert controller.writes == writes

        # A new client in team a's namespace joins; a relabelled one leaves.
        running(api, "y", "client-2", "n3", "2001:db8:3::9", {"app": "client"})
        await until(lambda: "y/client-2" in inputs.pods)
        assert inputs.pods["y/client-2"].addresses == (ipaddress.ip_address("2001:db8:3::9"),)
        pod = api.store.get(PODS, "client", "y")
        pod["metadata"]["labels"] = {"app": "gone"}
        api.store.update(PODS, pod, "y")
        await until(lambda: "y/client" not in inputs.pods)

        # The namespace's team changes: its pods leave the group, n1's peers empty.
        ns = api.store.get(NAMESPACES, "y")
        ns["metadata"]["labels"]["team"] = "b"
        api.store.update(NAMESPACES, ns)
        await until(lambda: not inputs.pods)
        assert api.list(ADDRESSGROUPS) == []  # an emptied slice is deleted
        nursery.cancel_scope.cancel()


async def test_a_restarted_controller_resumes_and_writes_nothing_new(api: ApiServer, tmp_path: Path) -> None:
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    async with open_kube_client(kubeconfig) as kube:
        async with trio.open_nursery() as nursery:
            first = GroupController(KubeApi(kube), kube, always)
            nursery.start_soon(first.run)
            await until(lambda: first.passes >= 1 and first.writes >= 4)  # a slice, three nodes' lists
            nursery.cancel_scope.cancel()
        version = api.store.resource_version
        async with trio.open_nursery() as nursery:
            second = GroupController(KubeApi(kube), kube, always)
            nursery.start_soon(second.run)
            await until(lambda: second.passes >= 1)
            assert second.writes == 0 and api.store.resource_version == version
            # a change while it runs is written as before
            running(api, "y", "client-3", "n2", "2001:db8:2::3", {"app": "client"})
            await until(lambda: second.writes == 1)
            nursery.cancel_scope.cancel()


async def test_a_lost_lease_writes_nothing(api: ApiServer, tmp_path: Path) -> None:
    async def never() -> bool:
        return False

    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    async with open_kube_client(kubeconfig) as kube:
        controller = GroupController(KubeApi(kube), kube, never)
        with trio.fail_after(10):
            await controller.run()  # returns: fenced off
        assert controller.writes == 0 and api.list(ADDRESSGROUPS) == []


async def test_a_second_term_starts_afresh_and_writes_only_what_changed(api: ApiServer, tmp_path: Path) -> None:
    leading = [True]

    async def fence() -> bool:
        return leading[0]

    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    async with open_kube_client(kubeconfig) as kube:
        controller = GroupController(KubeApi(kube), kube, fence)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(controller.run)
            await until(lambda: controller.passes >= 1 and controller.writes >= 4)
            leading[0] = False  # the Lease lost: the next pass with something to write ends the term
            running(api, "y", "client-4", "n2", "2001:db8:2::4", {"app": "client"})
        writes = controller.writes
        leading[0] = True  # elected again: the same object runs again
        async with trio.open_nursery() as nursery:
            nursery.start_soon(controller.run)
            await until(lambda: controller.writes == writes + 1)  # the slice with client-4, nothing else
            slices = api.list(ADDRESSGROUPS)
            assert sorted(m["name"] for s in slices for m in s["members"]) == ["client", "client-4"]
            nursery.cancel_scope.cancel()


async def test_a_change_while_a_pass_writes_wakes_the_next_pass(api: ApiServer, tmp_path: Path) -> None:
    """A change the informers deliver while a pass is writing (here: inside the pass's fence check) is
    planned by the next pass at once.  The loop used to wait for the generation current *after* the
    write, so such a change slept until some other change came (CI saw a Namespace relabel missed)."""
    injected: list[int] = []
    controller: GroupController | None = None

    async def fence() -> bool:
        assert controller is not None
        if controller.passes == 1 and not injected:
            # the second pass is writing client-4's slice: team a's namespace leaves the selection now
            generation = controller.inputs.generation
            ns = api.store.get(NAMESPACES, "y")
            ns["metadata"]["labels"]["team"] = "b"
            api.store.update(NAMESPACES, ns)
            injected.append(await controller.inputs.wait_generation(generation))
        return True

    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    async with open_kube_client(kubeconfig) as kube, trio.open_nursery() as nursery:
        controller = GroupController(KubeApi(kube), kube, fence)
        nursery.start_soon(controller.run)
        await until(lambda: controller.passes >= 1 and controller.writes >= 4)
        running(api, "y", "client-4", "n2", "2001:db8:2::4", {"app": "client"})
        await until(lambda: bool(injected))
        # nothing else changes from here: only the relabel, seen during the write, can empty the group
        await until(lambda: api.list(ADDRESSGROUPS) == [], seconds=5)
        nursery.cancel_scope.cancel()
