"""The node's link to the API server: one client, this node's watchers, pod lookups for ADD."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs
import trio

from flock.bird.anycast import follow_pod_readiness
from flock.model import InvalidObject, PodInfo
from flock.nursery import Backoff, ChildSpec, Supervisor
from flock.pods import NotReady, PodLookupFailed
from flock.policy import PolicyPod
from flock.state import NODECONFIG_GATE, Gate, NodeState, gated
from flock.watchers import (
    ChangeListener,
    ClientConfigError,
    KubeClient,
    KubeError,
    NodeConfigWatcher,
    PodWatcher,
    open_kube_client,
)

log = logging.getLogger("flock.agent")

API_GATE = Gate("api", "not connected to the API server yet")
NODECONFIG_INFORMER_GATE = Gate("nodeconfig-informer", "NodeConfig informer not synced")
POD_INFORMER_GATE = Gate("pod-informer", "pod informer not synced")


def nodeconfig_gate(node: str) -> Gate:
    """Closed until a valid NodeConfig for *node* was seen (kept by :class:`NodeState`)."""
    return Gate(NODECONFIG_GATE, f"NodeConfig {node} not loaded")


# Retrying a missing API configuration (a token file not mounted yet): 1, 2, 4 … 30 s.
CONFIG_RETRY = Backoff(initial=1.0, factor=2.0, cap=30.0)

Connect = Callable[[str | os.PathLike[str] | None], contextlib.AbstractAsyncContextManager[KubeClient]]
# More watchers on the same connection (e.g. NetworkPolicy): their child specs for a client.
WatcherFactory = Callable[[KubeClient], Sequence[ChildSpec]]


@attrs.frozen
class ClusterPods:
    """Something that follows every pod of the cluster (the NetworkPolicy watchers):
    *listener* gets each change of the link's one pod informer, *services* run beside it."""

    listener: ChangeListener
    services: Sequence[ChildSpec] = ()
    # False: the follower needs this node's pods only (it learns the others elsewhere: address groups)
    all_pods: bool = True


# A follower of the cluster's pods, built for each client.
ClusterPodsFactory = Callable[[KubeClient], ClusterPods]


@attrs.frozen
class PodWatcherLookup:
    """A :class:`flock.pods.PodLookup` over a pod watcher: API errors become
    :class:`flock.pods.PodLookupFailed`."""

    watcher: PodWatcher

    async def lookup(self, namespace: str, name: str) -> PodInfo | None:
        if self.watcher.get(namespace, name) is None:
            # The runtime is often faster than the watch: say so, so an ADD
            # that then waits (up to the cache wait, then a GET) is explained.
            log.info("pod not in the informer cache yet; waiting for the watch", extra={"pod": f"{namespace}/{name}"})
        try:
            return await self.watcher.lookup(namespace, name)
        except KubeError as exc:
            raise PodLookupFailed("cannot read the pod from the API server", str(exc)) from None

    async def fetch_pod(self, namespace: str, name: str) -> PodInfo | None:
        try:
            return await self.watcher.fetch_pod(namespace, name)
        except KubeError as exc:
            raise PodLookupFailed("cannot read the pod from the API server", str(exc)) from None


@attrs.define(eq=False)
class ApiLink:
    """Supervised service: connects to the API server, then runs this node's
    watchers under a nested supervisor ("api": nodeconfig-watcher, pod-watcher,
    then whatever *watchers* add); ``started()`` once they have all listed.

    With *cluster_pods* the pod watcher watches every pod of the cluster and
    hands each change to that follower as well (one watch, one decoding of each
    event, instead of a node-scoped watch beside a cluster-wide one); without,
    it watches this node's pods only.

    The NodeConfig watcher publishes into *state*; each informer's readiness
    is a gate of *state*.  While the pod watcher runs, this object is the pod
    handler's :class:`flock.pods.PodLookup` (before and between: NotReady, 11).

    Error handling: a missing API configuration (not in a cluster, no
    --kubeconfig) is logged and retried with :data:`CONFIG_RETRY`, so DEL
    keeps working on a node whose API access is broken; everything else
    propagates to the supervisor, which restarts the link (a new client,
    new watchers).
    """

    node: str
    kubeconfig: Path | None
    state: NodeState
    watchers: Sequence[WatcherFactory] = ()
    cluster_pods: ClusterPodsFactory | None = None
    connect: Connect = open_kube_client
    retry: Backoff = CONFIG_RETRY
    _pods: PodWatcherLookup | None = attrs.field(init=False, default=None)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        failures = 0
        while True:
            try:
                async with self.connect(self.kubeconfig) as client:
                    self.state.open_gate(API_GATE.name)
                    await self._watch(client, task_status)
                return
            except ClientConfigError as exc:
                self.state.close_gate(API_GATE.name, f"no API server configuration: {exc}")
                delay = self.retry.delay(failures)
                failures += 1
                log.error("cannot configure the API client; retrying", extra={"error": str(exc), "retry_in": delay})
            await trio.sleep(delay)

    async def _watch(self, client: KubeClient, task_status: trio.TaskStatus[None]) -> None:
        node, state = self.node, self.state
        nodeconfigs = NodeConfigWatcher(client.nodeconfig(node), node, sink=state)
        follower = self.cluster_pods(client) if self.cluster_pods is not None else None
        if follower is None:
            pods = PodWatcher(client.pods_on_node(node), node)
        elif not follower.all_pods:
            pods = PodWatcher(client.pods_on_node(node), node, listeners=(follower.listener,))
        else:
            pods = PodWatcher(client.all_pods(), node, listeners=(follower.listener,))

        async def serve_pods(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            lookup = PodWatcherLookup(pods)
            try:
                async with trio.open_nursery() as nursery:
                    await nursery.start(pods.run)
                    self._pods = lookup
                    # Health-aware anycast: BIRD's inputs read the cache; readiness changes bump the state.
                    state.pods_observed(pods.pods)
                    await nursery.start(follow_pod_readiness, pods, state.pods_changed)
                    task_status.started()
            finally:
                if self._pods is lookup:
                    self._pods = None
                    state.pods_observed(None)

        children = [
            ChildSpec("nodeconfig-watcher", gated(state, NODECONFIG_INFORMER_GATE, nodeconfigs.run)),
            ChildSpec("pod-watcher", gated(state, POD_INFORMER_GATE, serve_pods)),
            *(follower.services if follower is not None else ()),
            *(spec for factory in self.watchers for spec in factory(client)),
        ]
        await Supervisor("api", children).run(task_status=task_status)

    # -- PodLookup -----------------------------------------------------------

    def _lookup(self) -> PodWatcherLookup:
        if self._pods is None:
            raise NotReady("agent not ready", "the pod watcher is not running")
        return self._pods

    async def lookup(self, namespace: str, name: str) -> PodInfo | None:
        return await self._lookup().lookup(namespace, name)

    async def fetch_pod(self, namespace: str, name: str) -> PodInfo | None:
        return await self._lookup().fetch_pod(namespace, name)

    async def fetch_policy_pod(self, namespace: str, name: str) -> PolicyPod | None:
        """One pod as a policy end, read from the API server (explain's ends the agent does not know);
        None: no such pod, or one the policy model refuses."""
        obj = await self._lookup().watcher.source.get(namespace, name)
        if obj is None:
            return None
        try:
            return PolicyPod.from_object(obj)
        except InvalidObject:
            return None
