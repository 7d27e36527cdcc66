"""NetworkPolicies, Namespaces, Pods, ClusterNetworkPolicies and (while needed) Nodes of the
whole cluster, as policy values in one :class:`flock.policy.PolicyInputs`.

Peers live on every node, so every kind is watched cluster-wide.  Pods
are watched once per agent: the node's :class:`PodWatcher` runs the one pod
informer over every pod and hands each change to :attr:`PolicyWatcher.pod_listener`
(or, standing alone, the policy watcher runs its own pod informer)::

    inputs = PolicyInputs()
    policy = PolicyWatcher(kube.network_policies(), kube.namespaces(), inputs,
                           cluster_policies=kube.cluster_network_policies(), nodes=kube.nodes())
    pods = PodWatcher(kube.all_pods(), node, listeners=(policy.pod_listener,))
    ...supervisor children: pods.run, policy.run

ClusterNetworkPolicy is a custom resource: when its CRD is not installed (the
list answers 404) the admin tiers are off — one warning, the kind counts as
listed with nothing in it, and the list is tried again every
:data:`CRD_RETRY_SECONDS`, so installing the CRD later starts enforcement.
Nodes are watched only while some ClusterNetworkPolicy has a ``nodes`` egress
peer (``inputs.nodes_needed``): the informer starts when the first such policy
appears and stops, its objects forgotten, when the last one goes.

How far the cluster is reflected: :attr:`PolicyWatcher.watermark` is the
API resourceVersion (etcd's one revision counter) through which every change
of every kind watched is in ``inputs``; BOOKMARK events move it on while nothing
changes; a version moves only after every change up to it is in ``inputs``.
The policy service (:class:`flock.policy.PolicyService`, whose ``watermark`` this
is) drains the inputs' change journal and reads the watermark together, without
an await between, and once those changes are in the kernel publishes the
watermark as the gauge ``flock_policy_applied_resource_version`` (following
:meth:`wait_watermark` while nothing newer has been written).  ``flock-lab policy wait`` compares
that gauge with the API server's resourceVersion.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import trio

from flock.model import InvalidObject
from flock.nursery import Backoff
from flock.policy import Kind, PolicyInputs

from ._errors import KubeApiError
from ._informer import Change, ChangeListener, ChangeType, Informer, InformerSettings, ListWatchSource, Object
from ._values import NodeTransform, PodTransform, Shared, cluster_policy_value, namespace_value, network_policy_value

log = logging.getLogger("flock.watchers")

# How often the ClusterNetworkPolicy list is tried again while its CRD is not installed.
CRD_RETRY_SECONDS = 60.0
# Once listed, refusals (404, 403) are taken as passing for this long: retried with backoff, the policies kept.
CRD_GONE_SECONDS = 300.0
CRD_REFUSED_BACKOFF = Backoff(initial=1.0, factor=2.0, cap=30.0, jitter=0.2)


def namespaced_key(obj: Object) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name', '')}"


def name_key(obj: Object) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def _ignore(change: Change) -> None:
    """The informers' own callback: the feed follows them as a listener."""


_KEYS: dict[Kind, Callable[[Object], str]] = {
    Kind.NETWORK_POLICY: namespaced_key,
    Kind.NAMESPACE: name_key,
    Kind.POD: namespaced_key,
    Kind.CLUSTER_POLICY: name_key,
    Kind.NODE: name_key,
}


@attrs.define(eq=False)
class _KindFeed:
    """One kind's informer stream of values → ``inputs`` (a :class:`ChangeListener`).

    *changed*: called after every change it writes (the ClusterNetworkPolicy feed
    wakes the Node follower with it).
    """

    kind: Kind
    inputs: PolicyInputs
    progressed: Callable[[], None]
    changed: Callable[[], None] = lambda: None
    refused: dict[str, InvalidObject] = attrs.field(factory=dict)
    listed: bool = False
    resource_version: str = ""
    absent: bool = False  # the kind is not served (a CRD not installed): listed, empty, no version

    def on_change(self, change: Change) -> None:
        if self.absent:
            # The first list after the kind was not served: written whole by on_listed, never a part of
            # the set (a low-priority Accept in force before the Deny above it has arrived).
            return
        self._apply(change)
        self.changed()

    def _apply(self, change: Change) -> None:
        if change.type is ChangeType.DELETED:
            self.refused.pop(change.key, None)
            self.inputs.delete(self.kind, change.key)
            return
        value = change.object.policy if self.kind is Kind.POD else change.object
        if isinstance(value, InvalidObject):
            # Neither the old value (no longer what the cluster says) nor a guess: the
            # object is left out, logged, and counted until it changes or goes.
            self.refused[change.key] = value
            self.inputs.delete(self.kind, change.key)
            log.error(
                "%s %s refused: %s",
                self.kind.value,
                change.key,
                value,
                extra={"kind": self.kind.value, "object": change.key, "field": value.field},
            )
            return
        self.refused.pop(change.key, None)
        self.inputs.set(self.kind, change.key, value)

    def on_listed(self, objects: Mapping[str, Any]) -> None:
        # The inputs may outlive this stream (a new API client, new watchers): what an
        # earlier stream put there and the informer's read does not hold is gone from the cluster.
        held = _held(self.inputs, self.kind)
        for key in [key for key in held if key not in objects]:
            self.inputs.delete(self.kind, key)
        if self.absent:
            fresh = {}
            for key, value in objects.items():
                if isinstance(value, InvalidObject):
                    self._apply(Change(ChangeType.ADDED, key, value))  # refused: logged and counted
                else:
                    fresh[key] = value
            self.inputs.replace(self.kind, fresh)
            log.warning("%s CRD installed: listed, enforcing", self.kind.value, extra={"kind": self.kind.value})
        self.listed, self.absent = True, False
        self.inputs.mark_synced(self.kind)
        self.changed()
        self.progressed()

    def on_progress(self, resource_version: str) -> None:
        self.resource_version = resource_version
        self.progressed()

    def pods_progressed(self, listed: bool, resource_version: str) -> None:
        """Another feed writes this kind into ``inputs`` (an agent's address groups,
        :class:`flock.watchers.PeerFeed`) and says how far it is: listed, and through which version."""
        if listed and not self.listed:
            self.listed = True
            self.inputs.mark_synced(self.kind)
            self.changed()
        self.resource_version = resource_version
        self.progressed()

    def not_served(self) -> None:
        """The kind is not served: nothing of it is in the cluster; listed, with no version to follow."""
        self.refused.clear()
        self.inputs.replace(self.kind, {})
        self.listed, self.absent, self.resource_version = True, True, ""
        self.changed()
        self.progressed()

    def stopped(self) -> None:
        """No longer watched: ``inputs`` forget the kind (see :meth:`PolicyInputs.mark_unsynced`)."""
        self.refused.clear()
        self.listed, self.absent, self.resource_version = False, False, ""
        self.inputs.mark_unsynced(self.kind)
        self.progressed()


def _held(inputs: PolicyInputs, kind: Kind) -> Mapping[str, Any]:
    tables: dict[Kind, Mapping[str, Any]] = {
        Kind.NETWORK_POLICY: inputs.policies,
        Kind.NAMESPACE: inputs.namespaces,
        Kind.POD: inputs.pods,
        Kind.CLUSTER_POLICY: inputs.cluster_policies,
        Kind.NODE: inputs.nodes,
    }
    return tables[kind]


@attrs.define(eq=False)
class PolicyWatcher:
    """Supervised service keeping *inputs* equal to the cluster's NetworkPolicies,
    Namespaces, Pods, ClusterNetworkPolicies and, while a ClusterNetworkPolicy has a
    ``nodes`` peer, Nodes.

    *pods*: a source of every pod in the cluster, or None when another informer
    feeds :attr:`pod_listener` (the node's PodWatcher).  *cluster_policies*: None
    is a cluster without the CRD (the admin tiers off).  *nodes*: None leaves a
    ``nodes`` peer's policy unapplied (``inputs`` never complete while one exists).
    An object the policy model refuses is logged and left out (see :attr:`refused`).

    Error handling: each informer retries on its own (see :class:`Informer`); a
    ClusterNetworkPolicy list answering 404 (the CRD not installed, or deleted) is
    retried every :data:`CRD_RETRY_SECONDS`; what else an informer lets through
    propagates to the supervisor.
    """

    policies: ListWatchSource
    namespaces: ListWatchSource
    inputs: PolicyInputs
    pods: ListWatchSource | None = None
    settings: InformerSettings = attrs.Factory(InformerSettings)
    cluster_policies: ListWatchSource | None = None
    nodes: ListWatchSource | None = None
    shared: Shared = attrs.Factory(Shared)  # label sets shared across the pods and nodes this watcher decodes
    crd_retry_seconds: float = CRD_RETRY_SECONDS
    crd_gone_seconds: float = CRD_GONE_SECONDS
    _rand: Callable[[], float] = random.random
    _feeds: dict[Kind, _KindFeed] = attrs.field(init=False)
    _informers: dict[Kind, Informer] = attrs.field(init=False, factory=dict)
    _progress: trio.Event = attrs.field(init=False, factory=trio.Event)
    _cluster_changed: trio.Event = attrs.field(init=False, factory=trio.Event)
    _watching_nodes: bool = attrs.field(init=False, default=False)

    def __attrs_post_init__(self) -> None:
        self._feeds = {kind: _KindFeed(kind, self.inputs, self._progressed) for kind in Kind}
        self._feeds[Kind.CLUSTER_POLICY].changed = self._cluster_policies_changed
        sources = {Kind.NETWORK_POLICY: self.policies, Kind.NAMESPACE: self.namespaces}
        if self.pods is not None:
            sources[Kind.POD] = self.pods
        for kind, source in sources.items():
            self._informers[kind] = self._informer(kind, source)

    def _informer(self, kind: Kind, source: ListWatchSource) -> Informer:
        transforms: dict[Kind, Callable[[Object], Any]] = {
            Kind.NETWORK_POLICY: network_policy_value,
            Kind.NAMESPACE: namespace_value,
            Kind.POD: PodTransform(shared=self.shared),
            Kind.CLUSTER_POLICY: cluster_policy_value,
            Kind.NODE: NodeTransform(self.shared),
        }
        settings = self.settings
        if kind is Kind.CLUSTER_POLICY:
            # A custom resource: the client's custom-object calls have no sendInitialEvents.
            settings = attrs.evolve(settings, watch_list=False)
        return Informer(
            source,
            _KEYS[kind],
            _ignore,
            settings,
            name=f"{kind.value} (cluster-wide)",
            listeners=(self._feeds[kind],),
            transform=transforms[kind],
        )

    @property
    def pod_listener(self) -> ChangeListener:
        """Give this to the PodWatcher that watches every pod (when *pods* is None)."""
        return self._feeds[Kind.POD]

    @property
    def pod_progress(self) -> _KindFeed:
        """Where a :class:`flock.watchers.PeerFeed` that writes the pods says how far it is."""
        return self._feeds[Kind.POD]

    @property
    def refused(self) -> dict[str, str]:
        """Objects left out because the policy model refused them: "Kind key" → why."""
        return {
            f"{kind.value} {key}": str(exc) for kind, feed in self._feeds.items() for key, exc in feed.refused.items()
        }

    @property
    def watching_nodes(self) -> bool:
        """Whether the Node informer runs (some ClusterNetworkPolicy has a ``nodes`` peer)."""
        return self._watching_nodes

    def _watched(self) -> list[_KindFeed]:
        kinds = [Kind.NETWORK_POLICY, Kind.NAMESPACE, Kind.POD, Kind.CLUSTER_POLICY]
        # Nodes count from the moment a policy needs them, not from when their informer has
        # started: a nodes peer that has just arrived holds the watermark until they are listed.
        if self.inputs.nodes_needed:
            kinds.append(Kind.NODE)
        return [self._feeds[kind] for kind in kinds]

    @property
    def synced(self) -> bool:
        """Every kind watched has been listed once (ClusterNetworkPolicy: or found not served)."""
        return all(feed.listed for feed in self._watched())

    @property
    def watermark(self) -> int:
        """The resourceVersion through which every change of every kind watched is in
        ``inputs``; 0 until every one of them has been listed (a kind not served has
        nothing to follow: it does not hold the mark back)."""
        if not self.synced:
            return 0
        versions = [feed.resource_version for feed in self._watched() if not feed.absent]
        return min(int(v) for v in versions) if all(v.isdigit() for v in versions) else 0

    async def wait_watermark(self, resource_version: int) -> int:
        """Until :attr:`watermark` is at least *resource_version*; returns it.  The caller owns the deadline."""
        while (mark := self.watermark) < resource_version:
            await self._progress.wait()
        return mark

    def _progressed(self) -> None:
        self._progress.set()
        self._progress = trio.Event()

    def _cluster_policies_changed(self) -> None:
        self._cluster_changed.set()
        self._cluster_changed = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the informers; started() once each of them has listed (ClusterNetworkPolicy:
        or was found not served).  The Node informer starts and stops on its own after."""
        async with trio.open_nursery() as nursery:
            for informer in self._informers.values():
                await nursery.start(informer.run)
            await nursery.start(self._run_cluster_policies)
            nursery.start_soon(self._follow_nodes)
            task_status.started()

    async def _run_cluster_policies(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        feed = self._feeds[Kind.CLUSTER_POLICY]
        if self.cluster_policies is None:
            feed.not_served()
            task_status.started()
            return
        started = False
        served = False  # listed once in this process: a refusal after that is taken as passing
        refused_since: float | None = None
        attempt = 0
        while True:
            informer = self._informer(Kind.CLUSTER_POLICY, self.cluster_policies)  # a fresh cache each time
            try:
                await informer.run(task_status=trio.TASK_STATUS_IGNORED if started else task_status)
                continue  # (an informer runs until cancelled or refused)
            except KubeApiError as exc:
                if exc.status not in (403, 404):
                    raise
                refusal = exc
            started = started or informer.ready
            now = trio.current_time()
            if informer.ready:
                served, refused_since, attempt = True, None, 0
            if refused_since is None:
                refused_since = now
            if served and now - refused_since < self.crd_gone_seconds:
                # API servers answer 404 for a served custom resource while they start, after an etcd
                # restart; 403 while RBAC rolls out. A CRD really deleted first deleted every policy (the
                # watch saw them go): keep what is known, and ask again soon.
                delay = CRD_REFUSED_BACKOFF.delay(attempt, self._rand())
                attempt += 1
                log.warning(
                    "ClusterNetworkPolicies refused (%s): keeping the %d known, retrying in %.1f s",
                    refusal.status,
                    len(self.inputs.cluster_policies),
                    delay,
                    extra={"kind": Kind.CLUSTER_POLICY.value, "error": str(refusal)[:300]},
                )
            else:
                if not feed.absent:
                    why = "CRD not installed" if refusal.status == 404 else "not allowed to list them (RBAC)"
                    log.warning(
                        "ClusterNetworkPolicy %s: the admin tiers are off",
                        why,
                        extra={"kind": Kind.CLUSTER_POLICY.value, "retry_in": self.crd_retry_seconds},
                    )
                feed.not_served()
                served = False
                delay = self.crd_retry_seconds
            if not started:
                task_status.started()
                started = True
            await trio.sleep(delay)
            # The next list that succeeds starts enforcement (the feed's on_listed says so).

    async def _run_nodes(self, source: ListWatchSource) -> None:
        """The Node informer, again after a refusal (403 from RBAC without nodes, …): until Nodes are listed
        the nodes peers fail closed (flock.policy), and nothing else of the policies waits for them."""
        attempt = 0
        while True:
            informer = self._informer(Kind.NODE, source)
            try:
                await informer.run()
            except KubeApiError as exc:
                delay = CRD_REFUSED_BACKOFF.delay(attempt, self._rand())
                attempt = 0 if informer.ready else attempt + 1
                log.error(
                    "cannot list Nodes (%s): ClusterNetworkPolicy nodes peers fail closed; retrying in %.1f s",
                    exc.status,
                    delay,
                    extra={"kind": Kind.NODE.value, "error": str(exc)[:300]},
                )
                await trio.sleep(delay)

    async def _follow_nodes(self) -> None:
        """Run the Node informer while ``inputs.nodes_needed``; forget the Nodes when it stops."""
        feed = self._feeds[Kind.NODE]
        while True:
            if not self.inputs.nodes_needed:
                # (Also at start: Nodes an earlier watcher left in the inputs are not followed any more.)
                feed.stopped()
                while not self.inputs.nodes_needed:
                    await self._cluster_changed.wait()
            if self.nodes is None:
                log.error(
                    "a ClusterNetworkPolicy has a nodes peer, but no Node source was given: it is not applied",
                    extra={"kind": Kind.NODE.value},
                )
                while self.inputs.nodes_needed:
                    await self._cluster_changed.wait()
                continue
            log.info("watching Nodes: a ClusterNetworkPolicy has a nodes peer", extra={"kind": Kind.NODE.value})
            async with trio.open_nursery() as nursery:
                self._watching_nodes = True
                try:
                    nursery.start_soon(self._run_nodes, self.nodes)
                    while self.inputs.nodes_needed:
                        await self._cluster_changed.wait()
                    nursery.cancel_scope.cancel()
                finally:
                    self._watching_nodes = False
            log.info(
                "stopped watching Nodes: no ClusterNetworkPolicy has a nodes peer", extra={"kind": Kind.NODE.value}
            )
