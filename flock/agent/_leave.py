"""A node leaving the fabric's Service traffic: graceful shutdown (RFC 8326), then withdrawal.

A node is leaving while any of these holds (:attr:`NodeState.leaving` names them):

- its agent is stopping (SIGTERM: a rolling upgrade, a drain's eviction of the DaemonSet pod, a node
  shutting down) — :meth:`ServiceLeave.leave`, the agent's drain;
- its Node is cordoned (``spec.unschedulable``: ``kubectl cordon``, ``kubectl drain``'s first step);
- its Node carries the label ``node.kubernetes.io/exclude-from-external-load-balancers`` (what a cloud's
  service controller and MetalLB honour) or the cluster autoscaler's ``ToBeDeletedByClusterAutoscaler``
  taint (kube-proxy's health check fails such a node too, KEP-3836).

Leaving, BIRD announces every Service route with the GRACEFUL_SHUTDOWN community and local preference
0 at once, so the fabric moves new flows to the other nodes while this one still delivers what it
gets; after ``--bgp-leave-seconds`` the routes are withdrawn — except the *last-resort* ones, the
``externalTrafficPolicy: Local`` addresses whose every usable endpoint is on this node: withdrawn, their
traffic would have nowhere to go, so they stay (still with the community) until the endpoints move or
the agent exits.  Pod blocks and the node's own routes are not touched: BIRD's graceful restart keeps
those.  Uncordoned, the routes are announced as before.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import attrs
import trio

from flock.nursery import ChildSpec
from flock.state import NodeState
from flock.watchers import Change, ChangeType, Informer, InformerSettings, KubeClient, ListWatchSource

log = logging.getLogger("flock.agent")

EXCLUDE_LABEL = "node.kubernetes.io/exclude-from-external-load-balancers"
AUTOSCALER_TAINT = "ToBeDeletedByClusterAutoscaler"
STOPPING = "the agent is stopping"
CORDONED = "the node is cordoned (spec.unschedulable)"
EXCLUDED = f"the node is labelled {EXCLUDE_LABEL}"
SCALING_DOWN = f"the node is tainted {AUTOSCALER_TAINT}"
NODE_REASONS = (CORDONED, EXCLUDED, SCALING_DOWN)


def node_leaving(node: Mapping[str, Any]) -> frozenset[str]:
    """Why the Node object says its node is leaving (empty: it is not)."""
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    reasons = set()
    if spec.get("unschedulable") is True:
        reasons.add(CORDONED)
    if EXCLUDE_LABEL in (meta.get("labels") or {}):
        reasons.add(EXCLUDED)
    taints = spec.get("taints") or []
    if isinstance(taints, list) and any(isinstance(t, Mapping) and t.get("key") == AUTOSCALER_TAINT for t in taints):
        reasons.add(SCALING_DOWN)
    return frozenset(reasons)


@attrs.define(eq=False)
class ServiceLeave:
    """Supervised service: the graceful-shutdown period of a leaving node, then the withdrawal
    (:attr:`NodeState.leave_withdrawn`); *apply* puts BIRD's config in force now (the drain's last step)."""

    state: NodeState
    seconds: float
    apply: Callable[[], Awaitable[object]] | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        seen = self.state.version
        while True:
            if self.state.leaving and not self.state.leave_withdrawn:
                log.info(
                    "leaving: Service routes announced with GRACEFUL_SHUTDOWN, withdrawn in %.1f s",
                    self.seconds,
                    extra={"op": "bgp-leave", "why": sorted(self.state.leaving)},
                )
                deadline = trio.current_time() + self.seconds
                while self.state.leaving and trio.current_time() < deadline:
                    with trio.move_on_at(deadline):
                        seen = await self.state.wait_changed(seen)
                if self.state.leaving:
                    self.state.set_leave_withdrawn(True)
                    log.info("leaving: Service routes withdrawn (last-resort ones kept)", extra={"op": "bgp-leave"})
                else:
                    log.info("no longer leaving: Service routes announced again", extra={"op": "bgp-leave"})
            seen = await self.state.wait_changed(seen)

    async def leave(self) -> None:
        """The agent's drain on SIGTERM: leave, wait out the period, and put the withdrawal in BIRD."""
        self.state.set_leaving(STOPPING, True)
        if not self.state.service_routes:
            return
        with trio.move_on_after(self.seconds + 1.0):
            while not self.state.leave_withdrawn:
                await self.state.wait_changed(self.state.version)
        if self.apply is not None:
            await self.apply()


@attrs.define(eq=False)
class _NodeFeed:
    state: NodeState

    def on_change(self, change: Change) -> None:
        self._set(frozenset() if change.type is ChangeType.DELETED else change.object)

    def on_listed(self, objects: Mapping[str, Any]) -> None:
        self._set(frozenset().union(*objects.values()) if objects else frozenset())

    def on_progress(self, resource_version: str) -> None:
        pass

    def _set(self, reasons: frozenset[str]) -> None:
        for reason in NODE_REASONS:
            self.state.set_leaving(reason, reason in reasons)


def node_informer(source: ListWatchSource, state: NodeState, settings: InformerSettings | None = None) -> Informer:
    """This node's Node (*source*: ``metadata.name`` selected) → the leaving reasons in *state*."""
    return Informer(
        source,
        lambda obj: str((obj.get("metadata") or {}).get("name", "")),
        lambda change: None,
        settings or InformerSettings(),
        name="this node",
        listeners=(_NodeFeed(state),),
        transform=node_leaving,
    )


def node_watcher(node: str, state: NodeState) -> Callable[[KubeClient], Sequence[ChildSpec]]:
    """A watcher factory for the API link: this node's Node → the leaving reasons in *state*."""

    def children(client: KubeClient) -> Sequence[ChildSpec]:
        return [ChildSpec("node-watcher", node_informer(client.this_node(node), state).run)]

    return children
