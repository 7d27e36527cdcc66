"""The lab's kubelet stand-in for pods deleted by others (``kubectl delete pod``): once a pod on a
lab node is marked terminating, it waits the pod's grace (its server still answering) and then
tears it down as ``flock-lab pod del`` does (:func:`flock.lab.finish_pod`), or, for a pod the lab
never attached, deletes it with grace 0.  A pod whose termination lock another holds (``pod del``
at work) is left to that one.

Error handling: a teardown that fails (a CNI DEL error, the API server away) is logged and tried
again after ``RETRY_S``, as long as the pod is marked; nothing propagates but bugs.
"""

from __future__ import annotations

import logging

import attrs
import trio

from flock.apiserver import PODS
from flock.lab._api import ApiError
from flock.lab._kubelet import terminating
from flock.lab._lifecycle import api_client
from flock.lab._plan import LabPlan
from flock.lab._pods import finish_pod, load_pods
from flock.lab._state import LabError
from flock.watchers import Change, ChangeType

from ._slices import PodValue

log = logging.getLogger("flock.lab.controllers")

RETRY_S = 1.0


@attrs.define(eq=False)
class KubeletStandIn:
    plan: LabPlan
    _nursery: trio.Nursery | None = attrs.field(init=False, default=None)
    _marked: dict[str, PodValue] = attrs.field(init=False, factory=dict)  # terminating pods of lab nodes
    _busy: set[str] = attrs.field(init=False, factory=set)  # pods whose termination task runs

    def on_pod(self, change: Change) -> None:
        pod: PodValue = change.object
        nodes = {n.name for n in self.plan.nodes}
        if change.type is ChangeType.DELETED or not pod.terminating or pod.node not in nodes:
            self._marked.pop(change.key, None)
            return
        self._marked[change.key] = pod
        if change.key not in self._busy and self._nursery is not None:
            self._busy.add(change.key)
            self._nursery.start_soon(self._terminate, change.key)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for key in list(self._marked):
                if key not in self._busy:
                    self._busy.add(key)
                    nursery.start_soon(self._terminate, key)
            task_status.started()
            await trio.sleep_forever()

    async def _terminate(self, key: str) -> None:
        try:
            pod = self._marked.get(key)
            if pod is None:
                return
            # The container drains for its grace (from when the kubelet learns of it), as after SIGTERM.
            await trio.sleep(pod.deletion_grace)
            while key in self._marked:
                try:
                    await self._finish(self._marked[key])
                    return
                except (LabError, ApiError, OSError) as exc:
                    log.warning("terminating pod %s: %s; retrying", key, exc, extra={"pod": key, "error": str(exc)})
                    await trio.sleep(RETRY_S)
        finally:
            self._busy.discard(key)

    async def _finish(self, pod: PodValue) -> None:
        with terminating(self.plan, pod.namespace, pod.name) as mine:
            if not mine:
                log.info("pod %s: `flock-lab pod del` is tearing it down", pod.key, extra={"pod": pod.key})
                self._marked.pop(pod.key, None)
                return
            lab = next((p for p in load_pods(self.plan) if p.key == pod.key), None)
            if lab is not None:
                await finish_pod(self.plan, lab)
            else:
                # Never attached by the lab (a Pod applied with a lab node's name): nothing to tear down.
                try:
                    await api_client(self.plan).delete(PODS, pod.name, pod.namespace, grace_period_seconds=0)
                except ApiError as exc:
                    if exc.status != 404:
                        raise
            log.info("pod %s terminated", pod.key, extra={"pod": pod.key, "attached": lab is not None})
            self._marked.pop(pod.key, None)


__all__ = ["KubeletStandIn"]
