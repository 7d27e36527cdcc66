"""The pods scheduled on this node, as :class:`flock.model.PodInfo`, by namespace/name.

Its source may be this node's pods (``spec.nodeName=<node>``) or every pod in
the cluster: the cache keeps this node's, and *listeners* (the policy
watcher) follow every change of the one informer, so an agent watches the
cluster's pods once, not twice.

ADD often arrives before the watch has delivered its pod: :meth:`PodWatcher.wait_for_pod`
returns at once when the pod is cached and otherwise wakes the moment the
watch delivers it; :meth:`PodWatcher.lookup` adds DESIGN's bound (≤ 3 s, then
one direct GET).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator, Mapping

import attrs
import trio

from flock.model import PodInfo

from ._informer import Change, ChangeListener, ChangeType, Informer, InformerSettings, ListWatchSource, Object
from ._values import PodRecord, PodTransform

log = logging.getLogger("flock.watchers")

# DESIGN (ADD): wait this long for the informer before one direct GET.
POD_CACHE_WAIT_SECONDS = 3.0


@attrs.frozen
class PodChange:
    type: ChangeType
    pod: PodInfo  # for DELETED, the last state known


def _pod_key(obj: Object) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name', '')}"


@attrs.define(eq=False)
class PodWatcher:
    """Supervised service keeping the cache of this node's pods.

    The informer keeps a :class:`PodRecord` per pod (its policy value, and for
    this node's pods their :class:`PodInfo`), never the objects.  Observe
    changes with :meth:`subscribe`.  Error handling: see :class:`Informer`; a
    pod object PodInfo cannot read is logged and treated as not on this node.
    """

    source: ListWatchSource
    node: str
    settings: InformerSettings = InformerSettings()
    cache_wait_seconds: float = POD_CACHE_WAIT_SECONDS
    listeners: tuple[ChangeListener, ...] = ()
    _pods: dict[str, PodInfo] = attrs.field(init=False, factory=dict)
    _waiters: dict[str, trio.lowlevel.ParkingLot] = attrs.field(init=False, factory=dict)
    _subscribers: set[trio.MemorySendChannel[PodChange]] = attrs.field(init=False, factory=set)
    _informer: Informer = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._informer = Informer(
            self.source,
            _pod_key,
            self._on_change,
            self.settings,
            name=f"pods on {self.node}",
            listeners=self.listeners,
            transform=PodTransform(self.node),
        )

    @property
    def informer(self) -> Informer:
        return self._informer

    @property
    def pods(self) -> Mapping[str, PodInfo]:
        """The cache, keyed "namespace/name" (read-only view; do not mutate)."""
        return self._pods

    @property
    def ready(self) -> bool:
        return self._informer.ready

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; started() once the first list is cached."""
        await self._informer.run(task_status=task_status)

    def get(self, namespace: str, name: str) -> PodInfo | None:
        return self._pods.get(f"{namespace}/{name}")

    async def wait_for_pod(self, namespace: str, name: str) -> PodInfo:
        """The cached pod, at once if present, else as soon as the watch delivers
        it.  Waits forever: the caller owns the deadline."""
        key = f"{namespace}/{name}"
        while (pod := self._pods.get(key)) is None:
            lot = self._waiters.setdefault(key, trio.lowlevel.ParkingLot())
            try:
                await lot.park()
            finally:
                # A cancelled wait (the caller's deadline) must not leave its key behind.
                if not lot and self._waiters.get(key) is lot:
                    del self._waiters[key]
        return pod

    async def fetch_pod(self, namespace: str, name: str) -> PodInfo | None:
        """One direct GET, bypassing the cache; None when the server has no such pod.

        Errors propagate (flock.watchers' KubeError family); nothing is retried.
        """
        obj = await self.source.get(namespace, name)
        return None if obj is None else PodInfo.from_object(obj)

    async def lookup(self, namespace: str, name: str) -> PodInfo | None:
        """The pod for an ADD: from the cache, waiting up to ``cache_wait_seconds``
        for the watch, then one direct GET.  None when the server has no such pod.

        The GET's answer is returned as it is (even when bound to another node)
        and is not put in the cache, which only the watch fills.  Errors of the
        GET propagate (KubeError family); the caller's deadline bounds it.
        """
        with trio.move_on_after(self.cache_wait_seconds):
            return await self.wait_for_pod(namespace, name)
        log.info(
            "pod %s/%s not in the cache after %.1fs; asking the API server",
            namespace,
            name,
            self.cache_wait_seconds,
            extra={"pod": f"{namespace}/{name}"},
        )
        return await self.fetch_pod(namespace, name)

    @contextlib.contextmanager
    def subscribe(self) -> Iterator[trio.MemoryReceiveChannel[PodChange]]:
        """Every change from now on, in order, while the block lasts.

        The channel is unbounded so the informer never waits for a slow
        reader; a node's pods are at most a few hundred.
        """
        send, receive = trio.open_memory_channel[PodChange](math.inf)
        self._subscribers.add(send)
        try:
            with receive:
                yield receive
        finally:
            self._subscribers.discard(send)
            send.close()

    def _on_change(self, change: Change) -> None:
        record: PodRecord = change.object
        if change.type is ChangeType.DELETED or record.local is None:
            pod = self._pods.pop(change.key, None)
            if pod is None:
                return
            kind = ChangeType.DELETED
        else:
            pod = record.local
            # ADDED/MODIFIED as this cache sees it: a pod bound here after it was seen unbound is new here.
            kind = ChangeType.MODIFIED if change.key in self._pods else ChangeType.ADDED
            self._pods[change.key] = pod
            if (lot := self._waiters.pop(change.key, None)) is not None:
                lot.unpark_all()
        for send in self._subscribers:
            send.send_nowait(PodChange(kind, pod))
