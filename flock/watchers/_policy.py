"""NetworkPolicies, Namespaces and Pods of the whole cluster, as policy values in one
:class:`flock.policy.PolicyInputs`.

Peers live on every node, so all three kinds are watched cluster-wide.  Pods
are watched once per agent: the node's :class:`PodWatcher` runs the one pod
informer over every pod and hands each change to :attr:`PolicyWatcher.pod_listener`
(or, standing alone, the policy watcher runs its own pod informer)::

    inputs = PolicyInputs()
    policy = PolicyWatcher(kube.network_policies(), kube.namespaces(), inputs)
    pods = PodWatcher(kube.all_pods(), node, listeners=(policy.pod_listener,))
    ...supervisor children: pods.run, policy.run

How far the cluster is reflected: :attr:`PolicyWatcher.watermark` is the
API resourceVersion (etcd's one revision counter) through which every change
of all three kinds is in ``inputs``; BOOKMARK events move it on while nothing
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
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import trio

from flock.model import InvalidObject
from flock.policy import Kind, PolicyInputs

from ._informer import Change, ChangeListener, ChangeType, Informer, InformerSettings, ListWatchSource, Object
from ._values import PodTransform, namespace_value, network_policy_value

log = logging.getLogger("flock.watchers")


def namespaced_key(obj: Object) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name', '')}"


def name_key(obj: Object) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def _ignore(change: Change) -> None:
    """The informers' own callback: the feed follows them as a listener."""


_TRANSFORMS: dict[Kind, Callable[[], Callable[[Object], Any]]] = {
    Kind.NETWORK_POLICY: lambda: network_policy_value,
    Kind.NAMESPACE: lambda: namespace_value,
    Kind.POD: PodTransform,
}


@attrs.define(eq=False)
class _KindFeed:
    """One kind's informer stream of values → ``inputs`` (a :class:`ChangeListener`)."""

    kind: Kind
    inputs: PolicyInputs
    progressed: Callable[[], None]
    refused: dict[str, InvalidObject] = attrs.field(factory=dict)
    listed: bool = False
    resource_version: str = ""

    def on_change(self, change: Change) -> None:
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
        if self.kind is Kind.NETWORK_POLICY:
            self.inputs.set_policy(value)
        elif self.kind is Kind.NAMESPACE:
            self.inputs.set_namespace(value)
        else:
            self.inputs.set_pod(value)

    def on_listed(self, objects: Mapping[str, Any]) -> None:
        # The inputs may outlive this stream (a new API client, new watchers): what an
        # earlier stream put there and the informer's read does not hold is gone from the cluster.
        inputs = self.inputs
        held = {Kind.NETWORK_POLICY: inputs.policies, Kind.NAMESPACE: inputs.namespaces, Kind.POD: inputs.pods}[
            self.kind
        ]
        for key in [key for key in held if key not in objects]:
            self.inputs.delete(self.kind, key)
        self.listed = True
        self.inputs.mark_synced(self.kind)
        self.progressed()

    def on_progress(self, resource_version: str) -> None:
        self.resource_version = resource_version
        self.progressed()


@attrs.define(eq=False)
class PolicyWatcher:
    """Supervised service keeping *inputs* equal to the cluster's NetworkPolicies,
    Namespaces and Pods.

    *pods*: a source of every pod in the cluster, or None when another informer
    feeds :attr:`pod_listener` (the node's PodWatcher).  An object the policy
    model refuses is logged and left out (see :attr:`refused`).  Error handling:
    each informer retries on its own (see :class:`Informer`); what it lets
    through propagates to the supervisor.
    """

    policies: ListWatchSource
    namespaces: ListWatchSource
    inputs: PolicyInputs
    pods: ListWatchSource | None = None
    settings: InformerSettings = attrs.Factory(InformerSettings)
    _feeds: dict[Kind, _KindFeed] = attrs.field(init=False)
    _informers: dict[Kind, Informer] = attrs.field(init=False, factory=dict)
    _progress: trio.Event = attrs.field(init=False, factory=trio.Event)

    def __attrs_post_init__(self) -> None:
        self._feeds = {kind: _KindFeed(kind, self.inputs, self._progressed) for kind in Kind}
        sources = {Kind.NETWORK_POLICY: self.policies, Kind.NAMESPACE: self.namespaces}
        if self.pods is not None:
            sources[Kind.POD] = self.pods
        for kind, source in sources.items():
            feed = self._feeds[kind]
            self._informers[kind] = Informer(
                source,
                namespaced_key if kind is not Kind.NAMESPACE else name_key,
                _ignore,
                self.settings,
                name=f"{kind.value} (cluster-wide)",
                listeners=(feed,),
                transform=_TRANSFORMS[kind](),
            )

    @property
    def pod_listener(self) -> ChangeListener:
        """Give this to the PodWatcher that watches every pod (when *pods* is None)."""
        return self._feeds[Kind.POD]

    @property
    def refused(self) -> dict[str, str]:
        """Objects left out because the policy model refused them: "Kind ns/name" → why."""
        return {
            f"{kind.value} {key}": str(exc) for kind, feed in self._feeds.items() for key, exc in feed.refused.items()
        }

    @property
    def synced(self) -> bool:
        """Every kind has been listed once."""
        return all(feed.listed for feed in self._feeds.values())

    @property
    def watermark(self) -> int:
        """The resourceVersion through which every change of all three kinds is in
        ``inputs``; 0 until every kind has been listed."""
        if not self.synced:
            return 0
        versions = [feed.resource_version for feed in self._feeds.values()]
        return min(int(v) for v in versions) if all(v.isdigit() for v in versions) else 0

    async def wait_watermark(self, resource_version: int) -> int:
        """Until :attr:`watermark` is at least *resource_version*; returns it.  The caller owns the deadline."""
        while (mark := self.watermark) < resource_version:
            await self._progress.wait()
        return mark

    def _progressed(self) -> None:
        self._progress.set()
        self._progress = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the informers; started() once each of them has listed."""
        async with trio.open_nursery() as nursery:
            for informer in self._informers.values():
                await nursery.start(informer.run)
            task_status.started()
