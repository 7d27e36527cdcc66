"""The kubelet's part of a lab pod's life: the status it writes, readiness, and termination.

Once a pod is attached (CNI ADD done, its port server listening), the lab
writes the status a kubelet would (:func:`pod_status`): phase Running,
``podIP``/``podIPs``, the conditions Ready and ContainersReady True and a
ready container, so ``kubectl get pods`` says ``1/1 Running`` and the
EndpointSlice controller counts it ready.  ``flock-lab pod ready NS/NAME
false`` flips the readiness (what a failing readiness probe does).

Termination is a kubelet's: the pod is marked by a graceful DELETE
(``deletionTimestamp``; EndpointSlices show it serving and terminating), its
server keeps answering until the grace is over (a container draining after
SIGTERM), then the server stops, CNI DEL tears the sandbox down, and a DELETE
with ``gracePeriodSeconds=0`` removes the Pod.  Whoever terminates a pod
(``flock-lab pod del``, or the lab's kubelet stand-in in
:mod:`flock.lab.controllers` for a pod deleted by kubectl) holds the pod's
lock file (``pods/<ns>_<name>.lock``, ``flock(2)``) while it does, so two never
tear one pod down at once.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flock.lab._plan import LabPlan, NodePlan

# Every lab pod's spec.terminationGracePeriodSeconds, and `pod del`'s grace: short enough for tests.
LAB_GRACE_S = 2
CONTAINER = "app"  # the one container of a lab pod (flock.apiserver.pod_object)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _condition(kind: str, status: bool, since: str) -> dict[str, Any]:
    return {"type": kind, "status": "True" if status else "False", "lastProbeTime": None, "lastTransitionTime": since}


def pod_status(
    addresses: list[str], node: NodePlan, container_id: str, image: str, ready: bool, since: str | None = None
) -> dict[str, Any]:
    """The status a kubelet writes for a running lab pod (*addresses*: IPv6 first, from the CNI
    result); *ready* is its readiness probe's verdict, *since* when that last changed."""
    since = since or _now()
    ready_now = [_condition("Ready", ready, since), _condition("ContainersReady", ready, since)]
    status: dict[str, Any] = {
        "phase": "Running",
        "conditions": [
            _condition("PodReadyToStartContainers", True, since),
            _condition("Initialized", True, since),
            *ready_now,
            _condition("PodScheduled", True, since),
        ],
        "hostIP": str(node.addr6),
        "hostIPs": [{"ip": str(node.addr6)}, {"ip": str(node.addr4)}],
        "podIPs": [{"ip": ip} for ip in addresses],
        "startTime": since,
        "containerStatuses": [
            {
                "name": CONTAINER,
                "image": image,
                "imageID": "",
                "containerID": f"flock-lab://{container_id[:12]}",
                "ready": ready,
                "started": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": since}},
            }
        ],
    }
    if addresses:
        status["podIP"] = addresses[0]
    return status


def with_readiness(status: dict[str, Any], ready: bool) -> dict[str, Any]:
    """*status* with its Ready and ContainersReady conditions and its containers' ``ready`` set to
    *ready* (a condition's lastTransitionTime moves only when its status changes)."""
    now, want = _now(), "True" if ready else "False"
    conditions = []
    for cond in status.get("conditions") or []:
        if cond.get("type") in ("Ready", "ContainersReady") and cond.get("status") != want:
            cond = {**cond, "status": want, "lastTransitionTime": now}
        conditions.append(cond)
    for kind in ("Ready", "ContainersReady"):
        if not any(c.get("type") == kind for c in conditions):
            conditions.append(_condition(kind, ready, now))
    containers = [{**c, "ready": ready} for c in status.get("containerStatuses") or []]
    return {**status, "conditions": conditions, "containerStatuses": containers}


def is_ready(status: dict[str, Any] | None) -> bool:
    """The pod's Ready condition is True (what an EndpointSlice's ``ready`` starts from)."""
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in (status or {}).get("conditions") or [])


def lock_path(plan: LabPlan, namespace: str, name: str) -> Path:
    return plan.pods_dir / f"{namespace}_{name}.lock"


@contextlib.contextmanager
def terminating(plan: LabPlan, namespace: str, name: str) -> Iterator[bool]:
    """Hold the pod's termination lock while the block runs; yields False (and holds nothing)
    when someone else holds it: that one is tearing the pod down."""
    path = lock_path(plan, namespace, name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            path.unlink(missing_ok=True)
    finally:
        os.close(fd)


__all__ = ["LAB_GRACE_S", "is_ready", "lock_path", "pod_status", "terminating", "with_readiness"]
