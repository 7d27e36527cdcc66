"""An agent's PeerFeed over the fake API server (HTTP, kubernetes-asyncio), with the AddressGroups and
NodeAddressGroups written by hand: nothing is listed before its node's list and those groups' slices are;
a pod held by two slices stays until both let go; this node's own pods win over what a group says; a new
list of groups keeps the old members until the new watch has listed; a member or slice that cannot be read
is left out, the rest stands."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from flock.apiserver import ADDRESSGROUPS, NODEADDRESSGROUPS, ApiServer
from flock.groups import address_group, node_address_groups
from flock.policy import Kind, LabelSelector, PolicyInputs, PolicyPod
from flock.policy._compile import PeerSelection
from flock.watchers import PeerFeed, open_kube_client

SPEC = PeerSelection("x", None, LabelSelector((("app", "web"),)))


def pod(name: str, ip: str, node: str = "n2", **labels: str) -> PolicyPod:
    return PolicyPod("x", name, labels or {"app": "web"}, (ipaddress.ip_address(ip),), node=node)


def slice_of(group: str, index: int, *pods: PolicyPod) -> dict[str, Any]:
    return address_group(group, index, SPEC, pods)


@pytest.fixture
def api() -> Iterator[ApiServer]:
    with ApiServer() as server:
        yield server


async def until(check: Callable[[], bool], seconds: float = 10.0) -> None:
    """Poll what the API server's thread and the feed's tasks hold until *check* does."""
    with trio.fail_after(seconds):
        while not check():  # noqa: ASYNC110
            await trio.sleep(0.02)


async def test_listed_only_with_the_nodes_list_and_its_groups_slices(api: ApiServer, tmp_path: Path) -> None:
    api.store.create(ADDRESSGROUPS, slice_of("p-a", 0, pod("w1", "2001:db8::1")))
    api.store.create(ADDRESSGROUPS, slice_of("p-other", 0, pod("w9", "2001:db8::9")))
    inputs = PolicyInputs()
    feed = PeerFeed(inputs, "n1")
    async with open_kube_client(api.write_kubeconfig(tmp_path / "kubeconfig")) as kube, trio.open_nursery() as n:
        n.start_soon(feed.run, kube)
        feed.local_listed({"x/mine": pod("mine", "2001:db8::100", node="n1")})
        await trio.sleep(0.3)
        assert not feed.listed and Kind.POD not in inputs.snapshot().synced  # no NodeAddressGroups yet
        api.store.create(NODEADDRESSGROUPS, node_address_groups("n1", ["p-a"]))
        await until(lambda: feed.listed)
        assert Kind.POD in inputs.snapshot().synced
        assert set(inputs.pods) == {"x/mine", "x/w1"}  # not the group this node does not need
        n.cancel_scope.cancel()


async def test_two_slices_one_pod_and_this_nodes_own_pod_wins(api: ApiServer, tmp_path: Path) -> None:
    shared = pod("w1", "2001:db8::1")
    api.store.create(ADDRESSGROUPS, slice_of("p-a", 0, shared))
    api.store.create(ADDRESSGROUPS, slice_of("p-b", 0, shared, pod("w2", "2001:db8::2")))
    api.store.create(NODEADDRESSGROUPS, node_address_groups("n1", ["p-a", "p-b"]))
    inputs = PolicyInputs()
    feed = PeerFeed(inputs, "n1")
    mine = pod("w2", "2001:db8::22", node="n1")  # this node's pod, as its own watch has it (a newer address)
    async with open_kube_client(api.write_kubeconfig(tmp_path / "kubeconfig")) as kube, trio.open_nursery() as n:
        n.start_soon(feed.run, kube)
        feed.local_listed({mine.key: mine})
        await until(lambda: feed.listed)
        assert inputs.pods["x/w2"] is mine
        api.store.delete(ADDRESSGROUPS, "p-a-0")
        await trio.sleep(0.3)
        assert "x/w1" in inputs.pods  # p-b still holds it
        api.store.update(ADDRESSGROUPS, {**api.store.get(ADDRESSGROUPS, "p-b-0"), "members": []})
        await until(lambda: "x/w1" not in inputs.pods)
        assert inputs.pods["x/w2"] is mine  # its own pod stays, whatever the groups say
        feed.local_changed(mine.key, None)
        assert "x/w2" not in inputs.pods
        n.cancel_scope.cancel()


async def test_a_new_list_of_groups_keeps_the_old_members_until_the_new_watch_has_listed(
    api: ApiServer, tmp_path: Path
) -> None:
    api.store.create(ADDRESSGROUPS, slice_of("p-a", 0, pod("w1", "2001:db8::1")))
    api.store.create(ADDRESSGROUPS, slice_of("p-b", 0, pod("w2", "2001:db8::2")))
    api.store.create(NODEADDRESSGROUPS, node_address_groups("n1", ["p-a"]))
    inputs = PolicyInputs()
    journal = inputs.journal()
    feed = PeerFeed(inputs, "n1")
    async with open_kube_client(api.write_kubeconfig(tmp_path / "kubeconfig")) as kube, trio.open_nursery() as n:
        n.start_soon(feed.run, kube)
        feed.local_listed({})
        await until(lambda: feed.listed)
        journal.drain()
        obj = api.store.get(NODEADDRESSGROUPS, "n1")
        api.store.update(NODEADDRESSGROUPS, {**obj, "groups": ["p-a", "p-b"]})
        await until(lambda: "x/w2" in inputs.pods)
        assert "x/w1" in inputs.pods and list(journal.drain().pods) == ["x/w2"]  # w1 never left on the way
        api.store.update(NODEADDRESSGROUPS, {**api.store.get(NODEADDRESSGROUPS, "n1"), "groups": ["p-b"]})
        await until(lambda: "x/w1" not in inputs.pods)
        assert set(inputs.pods) == {"x/w2"}
        n.cancel_scope.cancel()


async def test_what_cannot_be_read_is_left_out_and_the_rest_stands(api: ApiServer, tmp_path: Path) -> None:
    good = slice_of("p-a", 0, pod("w1", "2001:db8::1"), pod("w2", "2001:db8::2"))
    good["members"][1]["ips"] = ["not-an-address"]  # (no CRD is applied: the store takes it as it is)
    api.store.create(ADDRESSGROUPS, good)
    bad = slice_of("p-a", 1, pod("w3", "2001:db8::3"))
    del bad["group"]
    api.store.create(ADDRESSGROUPS, bad)
    api.store.create(NODEADDRESSGROUPS, node_address_groups("n1", ["p-a"]))
    inputs = PolicyInputs()
    feed = PeerFeed(inputs, "n1")
    async with open_kube_client(api.write_kubeconfig(tmp_path / "kubeconfig")) as kube, trio.open_nursery() as n:
        n.start_soon(feed.run, kube)
        feed.local_listed({})
        await until(lambda: feed.listed)
        assert set(inputs.pods) == {"x/w1"}  # w2's member refused (fail closed: no peer), the unreadable slice too
        n.cancel_scope.cancel()


async def test_a_cluster_without_any_policy_does_not_wait_for_the_controller(api: ApiServer, tmp_path: Path) -> None:
    inputs = PolicyInputs()
    feed = PeerFeed(inputs, "n1")
    async with open_kube_client(api.write_kubeconfig(tmp_path / "kubeconfig")) as kube, trio.open_nursery() as n:
        n.start_soon(feed.run, kube)
        feed.local_listed({})
        await trio.sleep(0.2)
        assert not feed.listed  # the policies not listed yet: they may name peers
        inputs.replace(Kind.NETWORK_POLICY, {})
        inputs.replace(Kind.CLUSTER_POLICY, {})
        await until(lambda: Kind.POD in inputs.synced)  # none at all: nothing needs a peer, no NodeAddressGroups
        api.store.create(ADDRESSGROUPS, slice_of("p-a", 0, pod("w1", "2001:db8::1")))
        api.store.create(NODEADDRESSGROUPS, node_address_groups("n1", ["p-a"]))  # a policy's groups, later
        await until(lambda: "x/w1" in inputs.pods)
        n.cancel_scope.cancel()
