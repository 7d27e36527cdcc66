"""ClusterNetworkPolicies and Nodes into the policy watchers' PolicyInputs.

Virtual-time tests read the fake API server's store directly (StoreSource, same
rules as its HTTP front end); the HTTP test runs the agent's client stack.
"""

from __future__ import annotations

import ipaddress
import logging
from pathlib import Path
from typing import Any

import pytest
import trio

from flock.apiserver import (
    CLUSTERNETWORKPOLICIES,
    NAMESPACES,
    NETWORKPOLICIES,
    NODES,
    PODS,
    ApiServer,
    ObjectStore,
    cluster_network_policy_object,
    namespace_object,
    node_object,
)
from flock.nursery import Backoff
from flock.policy import ClusterNetworkPolicy, Kind, PolicyInputs, PolicyNode, Tier
from flock.testing import StoreSource, serving
from flock.watchers import CRD_RETRY_SECONDS, InformerSettings, PolicyWatcher, open_kube_client

SETTINGS = InformerSettings(watch_seconds=60, request_seconds=5, relist_seconds=600, backoff=Backoff(jitter=0.0))
BOOKMARK_S = 0.5

DENY_FROM_ALL: dict[str, Any] = {
    "tier": "Admin",
    "priority": 5,
    "subject": {"namespaces": {"matchLabels": {"ns": "x"}}},
    "ingress": [{"action": "Deny", "from": [{"namespaces": {}}]}],
}
TO_INFRA_NODES: dict[str, Any] = {
    "tier": "Baseline",
    "priority": 1,
    "subject": {"namespaces": {}},
    "egress": [{"action": "Accept", "to": [{"nodes": {"matchLabels": {"role": "infra"}}}]}],
}


class Cluster:
    """A store with a namespace, and the policy watchers over it (every source a StoreSource)."""

    def __init__(self, *, crd: bool = True) -> None:
        self.store = ObjectStore()
        if not crd:
            self.store.uninstall(CLUSTERNETWORKPOLICIES)
        self.store.create(NAMESPACES, namespace_object("x", {"ns": "x"}))
        self.inputs = PolicyInputs()
        self.cnp_source = self.source(CLUSTERNETWORKPOLICIES)
        self.node_source = self.source(NODES)
        self.watcher = PolicyWatcher(
            self.source(NETWORKPOLICIES),
            self.source(NAMESPACES),
            self.inputs,
            self.source(PODS),
            SETTINGS,
            cluster_policies=self.cnp_source,
            nodes=self.node_source,
        )

    def source(self, resource: Any) -> StoreSource:
        return StoreSource(self.store, resource, bookmark_seconds=BOOKMARK_S)

    def cnp(self, name: str) -> ClusterNetworkPolicy:
        return ClusterNetworkPolicy.from_object(self.store.get(CLUSTERNETWORKPOLICIES, name))

    async def caught_up(self) -> None:
        """Until every kind watched is in the inputs up to the store's version (BOOKMARKs move the rest)."""
        with trio.fail_after(BOOKMARK_S * 4):
            await self.watcher.wait_watermark(self.store.resource_version)


async def test_cluster_policies_follow_the_cluster_and_move_the_watermark(autojump_clock: trio.abc.Clock) -> None:
    cluster = Cluster()
    store, inputs, watcher = cluster.store, cluster.inputs, cluster.watcher
    store.create(CLUSTERNETWORKPOLICIES, cluster_network_policy_object("deny", DENY_FROM_ALL))
    with trio.fail_after(30):
        async with serving(watcher):
            assert inputs.complete and watcher.synced and not watcher.watching_nodes
            assert dict(inputs.cluster_policies) == {"deny": cluster.cnp("deny")}
            assert inputs.cluster_policies["deny"].tier is Tier.ADMIN
            assert watcher.watermark == store.resource_version
            # Read with plain lists (custom objects have no WatchList in the client), then one watch.
            assert cluster.cnp_source.watch_requests[0][1] is False

            for write in (
                lambda: store.patch(CLUSTERNETWORKPOLICIES, "deny", {"spec": {"priority": 7}}),
                lambda: store.create(CLUSTERNETWORKPOLICIES, cluster_network_policy_object("second", DENY_FROM_ALL)),
                lambda: store.delete(CLUSTERNETWORKPOLICIES, "deny"),
            ):
                generation, start = inputs.generation, trio.current_time()
                write()
                await inputs.wait_generation(generation)
                assert trio.current_time() == start  # at once
                expected = {o["metadata"]["name"] for o in store.list(CLUSTERNETWORKPOLICIES)[0]}
                assert set(inputs.cluster_policies) == expected
                assert all(p == cluster.cnp(name) for name, p in inputs.cluster_policies.items())
                # The CNP feed moved first; the other kinds' bookmarks bring the watermark up.
                assert watcher.watermark < store.resource_version
                await cluster.caught_up()
            assert sorted(inputs.cluster_policies) == ["second"]


async def test_a_cluster_policy_the_model_refuses_is_left_out_with_the_field(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    # The API server admits it (the CRD only types selectors); the model cannot place it.
    bad = dict(DENY_FROM_ALL, subject={"namespaces": {"matchExpressions": [{"key": "ns", "operator": "Near"}]}})
    cluster = Cluster()
    cluster.store.create(CLUSTERNETWORKPOLICIES, cluster_network_policy_object("bad", bad))
    cluster.store.create(CLUSTERNETWORKPOLICIES, cluster_network_policy_object("good", DENY_FROM_ALL))
    with trio.fail_after(30), caplog.at_level(logging.ERROR, "flock.watchers"):
        async with serving(cluster.watcher):
            assert cluster.inputs.complete and sorted(cluster.inputs.cluster_policies) == ["good"]
            assert list(cluster.watcher.refused) == ["ClusterNetworkPolicy bad"]
            assert "spec.subject.namespaces" in cluster.watcher.refused["ClusterNetworkPolicy bad"]
            # Fixed: accepted, no longer refused.
            generation = cluster.inputs.generation
            cluster.store.patch(
                CLUSTERNETWORKPOLICIES, "bad", {"spec": {"subject": {"namespaces": {"matchExpressions": None}}}}
            )
            await cluster.inputs.wait_generation(generation)
            assert sorted(cluster.inputs.cluster_policies) == ["bad", "good"] and cluster.watcher.refused == {}
    (record,) = [r for r in caplog.records if "refused" in r.getMessage()]
    assert record.field.startswith("spec.subject.namespaces")  # type: ignore[attr-defined]
    assert record.object == "bad"  # type: ignore[attr-defined]


async def test_without_the_crd_the_admin_tiers_are_off_until_it_is_installed(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = Cluster(crd=False)
    store, inputs, watcher = cluster.store, cluster.inputs, cluster.watcher
    with trio.fail_after(300), caplog.at_level(logging.WARNING, "flock.watchers"):
        start = trio.current_time()
        async with serving(watcher):
            # Not stuck not-ready: listed, empty, and the watermark follows the other kinds alone.
            assert inputs.complete and inputs.cluster_policies == {} and Kind.CLUSTER_POLICY in inputs.synced
            assert watcher.watermark == store.resource_version
            assert cluster.cnp_source.lists == 1
            await trio.sleep(CRD_RETRY_SECONDS * 2 + 1)
            assert cluster.cnp_source.lists == 3  # tried again every 60 s
            warnings = [r.getMessage() for r in caplog.records if "CRD" in r.getMessage()]
            assert warnings == ["ClusterNetworkPolicy CRD not installed: the admin tiers are off"]  # once

            store.install(CLUSTERNETWORKPOLICIES)
            installed = trio.current_time()
            store.create(CLUSTERNETWORKPOLICIES, cluster_network_policy_object("deny", DENY_FROM_ALL))
            generation = inputs.generation
            await inputs.wait_generation(generation)
            # The next retry (the 4th list, 180 s after the start) finds it.
            assert trio.current_time() == pytest.approx(start + 3 * CRD_RETRY_SECONDS)
            assert trio.current_time() - installed < CRD_RETRY_SECONDS
            assert dict(inputs.cluster_policies) == {"deny": cluster.cnp("deny")}
            await cluster.caught_up()
            # Deleted again: its objects go, the tiers are off again, once more warned.
            generation = inputs.generation
            assert store.uninstall(CLUSTERNETWORKPOLICIES) == 1
            await inputs.wait_generation(generation)
            assert inputs.cluster_policies == {} and inputs.complete


async def test_nodes_are_watched_only_while_a_cluster_policy_has_a_nodes_peer(autojump_clock: trio.abc.Clock) -> None:
    cluster = Cluster()
    store, inputs, watcher = cluster.store, cluster.inputs, cluster.watcher
    store.create(NODES, node_object("n1", {"role": "infra"}, [("InternalIP", "2001:db8::1"), ("Hostname", "n1")]))
    store.create(NODES, node_object("n2", {"role": "infra"}, [("InternalIP", "192.0.2.2")]))
    with trio.fail_after(60):
        async with serving(watcher):
            await trio.sleep(5)
            assert not watcher.watching_nodes and cluster.node_source.watches == 0 and inputs.nodes == {}
            assert inputs.complete and Kind.NODE not in inputs.synced

            generation = inputs.generation
            store.create(CLUSTERNETWORKPOLICIES, cluster_network_policy_object("infra", TO_INFRA_NODES))
            await inputs.wait_generation(generation)
            # The policy is in, the Nodes not yet: the rest is applied (its nodes peers fail closed meanwhile).
            assert inputs.nodes_needed and inputs.complete and not inputs.nodes_known
            await cluster.caught_up()
            assert watcher.watching_nodes and inputs.complete and inputs.nodes_known
            assert inputs.nodes["n1"] == PolicyNode("n1", (("role", "infra"),), (ipaddress.ip_address("2001:db8::1"),))
            assert sorted(inputs.nodes) == ["n1", "n2"]
            # Equal label sets are one object (shared through the watcher's interner).
            assert inputs.nodes["n1"].labels is inputs.nodes["n2"].labels
            assert watcher.watermark == store.resource_version

            # A node's label change reaches the inputs, and the watermark covers it.
            generation = inputs.generation
            store.patch(NODES, "n2", {"metadata": {"labels": {"role": "db"}}})
            await inputs.wait_generation(generation)
            assert inputs.nodes["n2"].label_map == {"role": "db"}
            await cluster.caught_up()

            # A second nodes-peer policy, then both go: the Node informer stops and its objects are forgotten.
            store.create(CLUSTERNETWORKPOLICIES, cluster_network_policy_object("infra2", TO_INFRA_NODES))
            store.create(CLUSTERNETWORKPOLICIES, cluster_network_policy_object("deny", DENY_FROM_ALL))
            await cluster.caught_up()
            store.delete(CLUSTERNETWORKPOLICIES, "infra")
            await cluster.caught_up()
            assert watcher.watching_nodes and sorted(inputs.nodes) == ["n1", "n2"]
            generation = inputs.generation
            store.delete(CLUSTERNETWORKPOLICIES, "infra2")
            await inputs.wait_generation(generation)
            await trio.sleep(0.1)
            assert not watcher.watching_nodes
            assert inputs.nodes == {} and Kind.NODE not in inputs.synced and inputs.complete
            assert sorted(inputs.cluster_policies) == ["deny"]
            await cluster.caught_up()  # the watermark follows the kinds still watched
            watches = cluster.node_source.watches
            store.patch(NODES, "n1", {"metadata": {"labels": {"role": "web"}}})
            await trio.sleep(5)
            assert inputs.nodes == {} and cluster.node_source.watches == watches

            # Back again: listed afresh, with what changed meanwhile.
            store.patch(CLUSTERNETWORKPOLICIES, "deny", {"spec": TO_INFRA_NODES})
            await cluster.caught_up()
            assert watcher.watching_nodes and inputs.complete
            assert inputs.nodes["n1"].label_map == {"role": "web"}


async def test_over_http_cluster_policies_and_nodes_reach_the_inputs(tmp_path: Path) -> None:
    fast = InformerSettings(
        watch_seconds=2, request_seconds=1, relist_seconds=600, backoff=Backoff(initial=0.05, cap=0.4)
    )
    with trio.fail_after(40), ApiServer(bookmark_interval=0.1) as api:
        api.uninstall(CLUSTERNETWORKPOLICIES)
        api.create(NODES, node_object("n1", {"role": "infra"}, [("InternalIP", "2001:db8::1")]))
        async with open_kube_client(api.write_kubeconfig(tmp_path / "kubeconfig")) as kube:
            inputs = PolicyInputs()
            watcher = PolicyWatcher(
                kube.network_policies(),
                kube.namespaces(),
                inputs,
                kube.all_pods(),
                fast,
                cluster_policies=kube.cluster_network_policies(),
                nodes=kube.nodes(),
                crd_retry_seconds=0.5,
            )
            async with serving(watcher):
                assert inputs.complete and inputs.cluster_policies == {}
                api.install(CLUSTERNETWORKPOLICIES)
                api.create(CLUSTERNETWORKPOLICIES, cluster_network_policy_object("infra", TO_INFRA_NODES))
                # Found at the next retry (the watermark does not wait for a kind not served).
                while not inputs.cluster_policies:
                    await inputs.wait_generation(inputs.generation)
                await watcher.wait_watermark(api.store.resource_version)
                assert sorted(inputs.cluster_policies) == ["infra"] and inputs.complete
                assert watcher.watching_nodes and inputs.nodes["n1"].label_map == {"role": "infra"}
                api.patch(NODES, "n1", {"metadata": {"labels": {"role": "db"}}})
                await watcher.wait_watermark(api.store.resource_version)
                assert inputs.nodes["n1"].label_map == {"role": "db"}
                api.delete(CLUSTERNETWORKPOLICIES, "infra")
                await watcher.wait_watermark(api.store.resource_version)
                with trio.fail_after(5):
                    while inputs.nodes:  # the Node follower forgets them once it has stopped the informer
                        await inputs.wait_generation(inputs.generation)
                assert not watcher.watching_nodes and inputs.complete
