"""LoadBalancerPools and Namespaces → the service proxy's allow-list (:class:`flock.services.AllowList`).

The pools say which external addresses a Service may have translated and announced (CVE-2020-8554);
the namespaces' labels are what their ``namespaceSelector`` matches.  Both are watched cluster-wide
and, once both are listed, every change hands a new :class:`AllowList` to
:meth:`ServiceInputs.set_allow` (an equal one wakes nobody)::

    watcher = PoolWatcher(kube.load_balancer_pools(), kube.namespaces(), inputs)
    ...supervisor child: watcher.run

A pool the model refuses is left out (its addresses are allowed by no pool: refused, never half
trusted), logged with its field and listed in :attr:`PoolWatcher.refused`.  The pools' list answering
404 (the CRD not installed) or 403 (the agent's RBAC lacks it) counts as listed with no pools — the
allow-list is then ``--service-external-cidr`` alone — one warning, tried again every
:data:`CRD_RETRY_SECONDS`; pools listed before stay.  Namespaces refused the same way count as
listed with no labels (a pool selecting namespaces then serves none).
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
from flock.policy import Labels, Namespace
from flock.services import AllowList, AnnouncePool, ServiceInputs

from ._errors import KubeApiError
from ._informer import Change, ChangeType, Informer, InformerSettings, ListWatchSource
from ._policy import CRD_RETRY_SECONDS, name_key
from ._services import ignore_change
from ._values import refusal_or

log = logging.getLogger("flock.watchers")

POOLS, NAMESPACES = "LoadBalancerPool", "Namespace"
REFUSED_BACKOFF = Backoff(initial=1.0, factor=2.0, cap=30.0, jitter=0.2)


@attrs.define(eq=False)
class _Feed:
    kind: str
    owner: PoolWatcher

    def on_change(self, change: Change) -> None:
        self.owner.changed(self.kind, change.key, None if change.type is ChangeType.DELETED else change.object)

    def on_listed(self, objects: Mapping[str, Any]) -> None:
        self.owner.listed_all(self.kind, objects)

    def on_progress(self, resource_version: str) -> None:
        pass


@attrs.define(eq=False)
class PoolWatcher:
    """Supervised service keeping ``inputs.allow`` equal to the cluster's LoadBalancerPools."""

    pools: ListWatchSource
    namespaces: ListWatchSource
    inputs: ServiceInputs
    settings: InformerSettings = attrs.Factory(InformerSettings)
    crd_retry_seconds: float = CRD_RETRY_SECONDS
    backoff: Backoff = REFUSED_BACKOFF
    rand: Callable[[], float] = random.random
    refusals: dict[str, str] = attrs.field(init=False, factory=dict)  # kind → the API server's last refusal
    refused: dict[str, str] = attrs.field(init=False, factory=dict)  # pool name → why the model refused it
    _pools: dict[str, AnnouncePool] = attrs.field(init=False, factory=dict)
    _labels: dict[str, Labels] = attrs.field(init=False, factory=dict)
    _listed: set[str] = attrs.field(init=False, factory=set)

    # --- the listeners' side -----------------------------------------------------------------------------------

    def changed(self, kind: str, key: str, value: Any) -> None:
        if kind == POOLS:
            self._pool(key, value)
        elif isinstance(value, Namespace):
            self._labels[key] = value.labels
        else:  # deleted, or refused by the model: no labels known
            self._labels.pop(key, None)
        self._publish()

    def listed_all(self, kind: str, objects: Mapping[str, Any]) -> None:
        if kind == POOLS:
            self._pools.clear()
            for key in [k for k in self.refused if k not in objects]:
                del self.refused[key]
            for key, value in objects.items():
                self._pool(key, value)
        else:
            self._labels = {key: v.labels for key, v in objects.items() if isinstance(v, Namespace)}
        self.refusals.pop(kind, None)
        self._listed.add(kind)
        self._publish()

    def _pool(self, key: str, value: Any) -> None:
        if isinstance(value, InvalidObject):
            self._pools.pop(key, None)
            if self.refused.get(key) != str(value):
                log.error(
                    "LoadBalancerPool %s refused: %s (none of its addresses is allowed)",
                    key,
                    value,
                    extra={"kind": POOLS, "object": key, "field": value.field},
                )
            self.refused[key] = str(value)
        elif value is None:
            self._pools.pop(key, None)
            self.refused.pop(key, None)
        else:
            self._pools[key] = value
            self.refused.pop(key, None)

    def _publish(self) -> None:
        if self._listed >= {POOLS, NAMESPACES}:
            self.inputs.set_allow(AllowList.build(self._pools.values(), self._labels))

    # --- running ---------------------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Both informers (started at once: nothing else of the agent waits for them)."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._follow, POOLS, self.pools, refusal_or(AnnouncePool.from_object))
            nursery.start_soon(self._follow, NAMESPACES, self.namespaces, refusal_or(Namespace.from_object))
            task_status.started()

    async def _follow(self, kind: str, source: ListWatchSource, transform: Callable[[Any], Any]) -> None:
        attempt = 0
        # A custom resource: the client's custom-object calls have no sendInitialEvents.
        settings = attrs.evolve(self.settings, watch_list=False) if kind == POOLS else self.settings
        while True:
            informer = Informer(
                source,
                name_key,
                ignore_change,
                settings,
                name=f"{kind}s (cluster-wide)",
                listeners=(_Feed(kind, self),),
                transform=transform,
            )
            try:
                await informer.run()
                continue  # (an informer runs until cancelled or refused)
            except KubeApiError as exc:
                if exc.status not in (403, 404):
                    raise
                if informer.ready:
                    attempt = 0
                why = "not allowed to list them (RBAC)" if exc.status == 403 else "not served (CRD not installed?)"
                first = kind not in self.refusals
                self.refusals[kind] = f"{why}: {str(exc)[:200]}"
                if kind not in self._listed:  # nothing read yet: as listed with nothing in it
                    self._listed.add(kind)
                    self._publish()
                delay = self.crd_retry_seconds if exc.status == 404 else self.backoff.delay(attempt, self.rand())
                attempt += 1
                (log.warning if first else log.info)(
                    "%ss refused (%s): %s; retrying in %.1f s",
                    kind,
                    exc.status,
                    "no pools: only --service-external-cidr is allowed" if kind == POOLS else "no namespace labels",
                    delay,
                    extra={"kind": kind, "error": str(exc)[:300], "retry_in": delay},
                )
            await trio.sleep(delay)
