"""The API link in virtual time: configuration retried with backoff, watchers
publishing into NodeState, readiness gates, pod lookups only while the watcher runs."""

from __future__ import annotations

import contextlib

import attrs
import pytest
import trio

from flock.agent import API_GATE, ApiLink, ClusterPods, node_state
from flock.apiserver import NODECONFIGS, PODS, ObjectStore, nodeconfig_object, pod_object
from flock.nursery import ChildSpec
from flock.pods import NotReady, PodLookupFailed
from flock.testing import StoreSource
from flock.watchers import ClientConfigError, TransientKubeError

NODE = "host001"


@attrs.frozen
class StoreClient:
    """What the link asks of a KubeClient, over the flock/testing API store."""

    api: ObjectStore

    def nodeconfig(self, name: str) -> StoreSource:
        return StoreSource(self.api, NODECONFIGS, f"metadata.name={name}")

    def pods_on_node(self, node: str) -> StoreSource:
        return FailingGets(self.api, PODS, f"spec.nodeName={node}")


class FailingGets(StoreSource):
    async def get(self, namespace, name):
        raise TransientKubeError("pods on host001: connection refused")


async def test_config_is_retried_then_watchers_publish_and_lookups_work(autojump_clock):
    api = ObjectStore()
    api.create(NODECONFIGS, nodeconfig_object(NODE, "2001:db8:0:1::/64"))
    api.create(PODS, pod_object("default", "web-0", NODE))
    attempts: list[float] = []

    @contextlib.asynccontextmanager
    async def connect(kubeconfig):
        attempts.append(trio.current_time())
        if len(attempts) < 3:
            raise ClientConfigError("token file /var/run/secrets/…/token: missing")
        yield StoreClient(api)

    extra_clients = []

    def more_watchers(client):
        async def extra(*, task_status=trio.TASK_STATUS_IGNORED):
            extra_clients.append(client)
            task_status.started()
            await trio.sleep_forever()

        return [ChildSpec("networkpolicy-watcher", extra)]

    state = node_state(NODE)
    link = ApiLink(NODE, None, state, watchers=[more_watchers], connect=connect)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(link.run)
            await trio.sleep(0.5)
            assert state.reason(API_GATE.name).startswith("no API server configuration: token file")
            with pytest.raises(NotReady):
                await link.lookup("default", "web-0")
            await trio.sleep(3)
            assert attempts == [0.0, 1.0, 3.0]  # backoff 1 s, 2 s
            assert extra_clients == [StoreClient(api)]  # a watcher added on the same connection
            # only the bring-up's gate and the policy service's (neither runs here)
            assert state.not_ready() == [
                "ADD not served: start-up has not finished",
                "NetworkPolicy not enforced: waiting for the first lists of NetworkPolicies, Namespaces and Pods",
            ]
            assert str(state.nodeconfig.cidr6) == "2001:db8:0:1::/64"
            assert (await link.lookup("default", "web-0")).name == "web-0"
            with pytest.raises(PodLookupFailed, match="connection refused"):
                await link.fetch_pod("default", "web-0")
            nursery.cancel_scope.cancel()
    # Stopped: the informers' gates are closed again and lookups refused.
    assert "pod informer not synced" in state.not_ready()
    with pytest.raises(NotReady):
        await link.lookup("default", "web-0")


@attrs.define(eq=False)
class ClusterClient:
    """A KubeClient over the store that records which pod sources the link asked for."""

    api: ObjectStore
    pod_sources: list[tuple[str, StoreSource]] = attrs.field(factory=list)

    def nodeconfig(self, name: str) -> StoreSource:
        return StoreSource(self.api, NODECONFIGS, f"metadata.name={name}")

    def pods_on_node(self, node: str) -> StoreSource:
        source = StoreSource(self.api, PODS, f"spec.nodeName={node}")
        self.pod_sources.append(("node", source))
        return source

    def all_pods(self) -> StoreSource:
        source = StoreSource(self.api, PODS)
        self.pod_sources.append(("all", source))
        return source


@attrs.define(eq=False)
class Follower:
    """A ChangeListener that records what it was given."""

    changes: list[tuple[str, str]] = attrs.field(factory=list)
    listed: int = 0
    progress: list[str] = attrs.field(factory=list)

    def on_change(self, change) -> None:
        self.changes.append((change.type.value, change.key))

    def on_listed(self, objects: object) -> None:
        self.listed += 1

    def on_progress(self, resource_version: str) -> None:
        self.progress.append(resource_version)


async def test_cluster_pods_one_pod_watch_serves_the_node_cache_and_the_follower(autojump_clock):
    api = ObjectStore()
    api.create(NODECONFIGS, nodeconfig_object(NODE, "2001:db8:0:1::/64"))
    api.create(PODS, pod_object("default", "web-0", NODE))
    api.create(PODS, pod_object("default", "db-0", "host002"))
    client = ClusterClient(api)
    follower = Follower()
    services_ran = []

    @contextlib.asynccontextmanager
    async def connect(kubeconfig):
        yield client

    def cluster_pods(c):
        async def beside(*, task_status=trio.TASK_STATUS_IGNORED):
            services_ran.append(c)
            task_status.started()
            await trio.sleep_forever()

        return ClusterPods(follower, [ChildSpec("beside", beside)])

    state = node_state(NODE)
    link = ApiLink(NODE, None, state, cluster_pods=cluster_pods, connect=connect)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(link.run)
            await trio.sleep(1)
            # One source of pods, every pod, one watch: not a node-scoped watch beside it.
            assert [kind for kind, _ in client.pod_sources] == ["all"]
            source = client.pod_sources[0][1]
            assert (source.lists, source.watch_requests) == (0, [("", True)])  # one WatchList, no list
            assert services_ran == [client]
            assert follower.listed == 1
            assert sorted(follower.changes) == [("ADDED", "default/db-0"), ("ADDED", "default/web-0")]
            assert sorted(state.pods) == ["default/web-0"]  # the node's cache keeps this node's pods
            # A pod created unbound, then bound here: the follower sees both, the node's cache the binding.
            api.create(PODS, pod_object("default", "web-1"))
            api.patch(PODS, "web-1", {"spec": {"nodeName": NODE}}, "default")
            assert (await link.lookup("default", "web-1")).name == "web-1"
            assert follower.changes[-2:] == [("ADDED", "default/web-1"), ("MODIFIED", "default/web-1")]
            assert follower.progress[-1] == str(api.list(PODS)[1])
            api.delete(PODS, "db-0", "default")
            await trio.sleep(1)
            assert follower.changes[-1] == ("DELETED", "default/db-0")
            assert sorted(state.pods) == ["default/web-0", "default/web-1"]
            nursery.cancel_scope.cancel()
