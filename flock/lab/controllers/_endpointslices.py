"""The EndpointSlice controller's loop: caches of Services, Pods, Nodes and the slices it manages,
kept by informers, and a queue of Services to bring in line (see :mod:`._slices` for what "in
line" is).

Every change marks the Services it concerns dirty (a pod: the Services of its namespace whose
selector matches it now or matched it before; a slice: its Service); one worker takes the dirty
Services, plans each against the caches and writes the difference.  The slice cache also takes
what the controller's own writes answer, so a plan never works from a cache that has not yet
seen the previous write (kube-controller-manager's endpointSliceTracker does this with
generations): an event older than what a write answered is ignored, and a deleted slice stays
deleted until a newer event says otherwise.

Error handling: a write the API server refuses (a 409 on a stale slice, a connection error)
marks the Service dirty again after ``RETRY_S``; the informers retry on their own (see
:class:`flock.watchers.Informer`).  Anything else propagates.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

import attrs
import trio

from flock.apiserver import ENDPOINTSLICES, Resource
from flock.watchers import Change, ChangeType

from ._slices import PodValue, ServiceValue, SliceValue, plan_service

log = logging.getLogger("flock.lab.controllers")

RETRY_S = 0.5


class SliceWriter(Protocol):
    """What the controller writes with (flock.lab's ApiClient; a test's store)."""

    async def create(self, res: Resource, obj: dict[str, Any]) -> dict[str, Any]: ...

    async def replace(self, res: Resource, obj: dict[str, Any]) -> dict[str, Any]: ...

    async def delete(self, res: Resource, name: str, namespace: str | None = None) -> dict[str, Any]: ...


def _rv(value: str) -> int:
    return int(value) if value.isdigit() else 0


@attrs.define(eq=False)
class EndpointSliceController:
    """Owns the caches and the queue; the informers call the ``on_*`` methods (synchronously)."""

    writer: SliceWriter
    _services: dict[str, ServiceValue] = attrs.field(init=False, factory=dict)
    _pods: dict[str, PodValue] = attrs.field(init=False, factory=dict)
    _zones: dict[str, str] = attrs.field(init=False, factory=dict)
    _slices: dict[str, SliceValue] = attrs.field(init=False, factory=dict)  # "ns/name" → managed slice
    _gone: dict[str, int] = attrs.field(init=False, factory=dict)  # slices deleted by us: at which version
    _dirty: set[str] = attrs.field(init=False, factory=set)
    _wake: trio.Event = attrs.field(init=False, factory=trio.Event)
    _idle: trio.Event = attrs.field(init=False, factory=trio.Event)
    writes: int = attrs.field(init=False, default=0)  # every create, replace and delete sent

    # ---- what the informers tell ------------------------------------------------------------

    def on_service(self, change: Change) -> None:
        self._mark(change.key)
        if change.type is ChangeType.DELETED:
            self._services.pop(change.key, None)
        else:
            self._services[change.key] = change.object

    def on_pod(self, change: Change) -> None:
        before = self._pods.get(change.key)
        if change.type is ChangeType.DELETED:
            self._pods.pop(change.key, None)
        else:
            self._pods[change.key] = change.object
        for pod in (before, None if change.type is ChangeType.DELETED else change.object):
            if pod is None:
                continue
            for svc in self._services.values():
                if svc.namespace == pod.namespace and svc.managed and svc.selects(pod):
                    self._mark(svc.key)

    def on_node(self, change: Change) -> None:
        zone = "" if change.type is ChangeType.DELETED else str(change.object or "")
        if self._zones.get(change.key, "") == zone:
            return
        self._zones[change.key] = zone
        for pod in self._pods.values():
            if pod.node == change.key:
                for svc in self._services.values():
                    if svc.managed and svc.selects(pod):
                        self._mark(svc.key)

    def on_slice(self, change: Change) -> None:
        value: SliceValue = change.object
        if not value.managed:
            return
        key = f"{value.namespace}/{value.name}"
        rv = _rv(value.resource_version)
        if change.type is ChangeType.DELETED:
            known = self._slices.get(key)
            if known is None or _rv(known.resource_version) <= rv:
                self._slices.pop(key, None)
        elif rv > self._gone.get(key, 0) and rv >= _rv((self._slices.get(key) or value).resource_version):
            self._gone.pop(key, None)
            self._slices[key] = value
        if value.service is not None:
            self._mark(f"{value.namespace}/{value.service}")

    # ---- the worker ---------------------------------------------------------------------------

    def _mark(self, service_key: str) -> None:
        self._dirty.add(service_key)
        self._idle = trio.Event() if self._idle.is_set() else self._idle
        self._wake.set()

    async def wait_idle(self) -> None:
        """Until nothing is dirty and no write is under way (tests)."""
        await self._idle.wait()

    def slices_of(self, service_key: str) -> list[SliceValue]:
        namespace, _, name = service_key.partition("/")
        return [s for s in self._slices.values() if s.namespace == namespace and s.service == name]

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Sync dirty Services until cancelled (call after the informers have listed once)."""
        task_status.started()
        async with trio.open_nursery() as nursery:
            while True:
                if not self._dirty:
                    self._idle.set()
                    await self._wake.wait()
                self._wake = trio.Event()
                while self._dirty:
                    key = min(self._dirty)
                    self._dirty.discard(key)
                    try:
                        await self.sync(key)
                    except (OSError, RuntimeError) as exc:
                        log.warning(
                            "endpointslices of %s: %s; retrying", key, exc, extra={"service": key, "error": str(exc)}
                        )
                        nursery.start_soon(self._retry, key)

    async def _retry(self, key: str) -> None:
        await trio.sleep(RETRY_S)
        self._mark(key)

    async def sync(self, key: str) -> None:
        """Bring *key*'s slices in line with its Service and pods (one plan, its writes in order)."""
        service = self._services.get(key)
        existing = self.slices_of(key)
        if service is None:
            # Its slices go with it (the garbage collector's part upstream: they are owned by it).
            for old in existing:
                await self._delete(old)
            return
        pods = [p for p in self._pods.values() if p.namespace == service.namespace]
        plan = plan_service(service, pods, existing, self._zones)
        if plan.empty:
            return
        log.info(
            "endpointslices of %s: %d created, %d updated, %d deleted",
            key,
            len(plan.create),
            len(plan.update),
            len(plan.delete),
            extra={"service": key},
        )
        for value in plan.update:
            self._took(await self.writer.replace(ENDPOINTSLICES, value.to_object(service)))
        for value in plan.create:
            self._took(await self.writer.create(ENDPOINTSLICES, value.to_object(service)))
        for value in plan.delete:
            await self._delete(value)

    def _took(self, answer: Mapping[str, Any]) -> None:
        self.writes += 1
        value = SliceValue.from_object(answer)
        self._slices[f"{value.namespace}/{value.name}"] = value

    async def _delete(self, value: SliceValue) -> None:
        key = f"{value.namespace}/{value.name}"
        self.writes += 1
        try:
            answer = await self.writer.delete(ENDPOINTSLICES, value.name, value.namespace)
            self._gone[key] = _rv(str((answer.get("metadata") or {}).get("resourceVersion") or ""))
        except RuntimeError as exc:
            if getattr(exc, "status", None) != 404:
                raise
        self._slices.pop(key, None)


def node_zone(obj: Mapping[str, Any]) -> str:
    """A Node as the controller keeps it: its zone label."""
    return str(((obj.get("metadata") or {}).get("labels") or {}).get("topology.kubernetes.io/zone") or "")


__all__ = ["EndpointSliceController", "SliceWriter", "node_zone"]
