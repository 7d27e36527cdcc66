"""NetworkPolicy in the agent: the cluster-wide watchers on each API client, and the policy service.

One :class:`flock.policy.PolicyInputs` outlives API reconnects; each new
client gets new watchers (NetworkPolicy, Namespace, ClusterNetworkPolicy, and
Node while a ClusterNetworkPolicy has a nodes peer) that fill it, and the
pods come from the API link's one pod informer, which then watches every pod
(:class:`flock.agent.ApiLink`'s ``cluster_pods``).  :class:`PolicyLink` is also the service's :class:`flock.policy.Watermark`:
it follows whichever watcher is current.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import trio

from flock.nursery import ChildSpec
from flock.policy import POLICY_GATE, WAITING_FOR_WATCHERS, ClusterNetworkPolicy, PolicyInputs
from flock.state import Gate
from flock.watchers import KubeClient, PeerFeed, PolicyWatcher

from ._api import ClusterPods

POLICY_READY_GATE = Gate(POLICY_GATE, WAITING_FOR_WATCHERS, label="NetworkPolicy not enforced: ")


@attrs.define(eq=False)
class PolicyLink:
    """Builds the policy watchers for an API client (an ``ApiLink`` ``cluster_pods`` factory);
    the policy service's watermark and flockctl's :class:`flock.ctl.PolicyWatch`, following the current watchers."""

    inputs: PolicyInputs
    # --policy-peers=groups: this node's pods and its address groups' members (one feed for the agent's life:
    # each new client's lists reconcile what the previous one left in the inputs)
    peers: PeerFeed | None = None
    _current: PolicyWatcher | None = attrs.field(init=False, default=None)
    _replaced: trio.Event = attrs.field(init=False, factory=trio.Event)

    def cluster_pods(self, client: KubeClient) -> ClusterPods:
        # pods=None: the link's pod informer feeds watcher.pod_listener.
        watcher = PolicyWatcher(
            client.network_policies(),
            client.namespaces(),
            self.inputs,
            cluster_policies=client.cluster_network_policies(),
            nodes=client.nodes(),
        )

        async def run(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            self._set(watcher)
            try:
                await watcher.run(task_status=task_status)
            finally:
                if self._current is watcher:
                    self._set(None)

        if self.peers is None:
            return ClusterPods(watcher.pod_listener, [ChildSpec("policy-watchers", run)])
        peers = self.peers
        peers.progress = watcher.pod_progress

        async def run_groups(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            await peers.run(client, task_status=task_status)

        services = [ChildSpec("policy-watchers", run), ChildSpec("group-watchers", run_groups)]
        return ClusterPods(peers.local_listener, services, all_pods=False)

    def _set(self, watcher: PolicyWatcher | None) -> None:
        self._current = watcher
        self._replaced.set()
        self._replaced = trio.Event()

    @property
    def watermark(self) -> int:
        return self._current.watermark if self._current is not None else 0

    # flock.ctl.PolicyWatch: what flockctl status shows.

    @property
    def cluster_policies(self) -> Mapping[str, ClusterNetworkPolicy]:
        return self.inputs.cluster_policies

    @property
    def refused(self) -> Mapping[str, str]:
        return self._current.refused if self._current is not None else {}

    async def wait_watermark(self, resource_version: int) -> int:
        while True:
            watcher, replaced = self._current, self._replaced
            if watcher is None:
                await replaced.wait()
                continue
            mark = await _until_replaced(watcher, replaced, resource_version)
            if mark is not None:
                return mark


async def _until_replaced(watcher: PolicyWatcher, replaced: trio.Event, resource_version: int) -> int | None:
    """*watcher*'s watermark once it reaches *resource_version*; None if the watcher is replaced first."""
    result: list[int] = []
    async with trio.open_nursery() as nursery:

        async def follow() -> None:
            result.append(await watcher.wait_watermark(resource_version))
            nursery.cancel_scope.cancel()

        async def swapped() -> None:
            await replaced.wait()
            nursery.cancel_scope.cancel()

        nursery.start_soon(follow)
        nursery.start_soon(swapped)
    return result[0] if result else None
