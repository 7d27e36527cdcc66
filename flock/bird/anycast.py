"""Health-aware anycast: re-render BIRD's config when a local pod's readiness changes.

Which anycast addresses are announced is decided in
:meth:`flock.bird.BirdInputs.collect` from the pod informer's cache; this
service only tells the reloader when that answer may have changed (a pod's
Ready condition flipped, a pod appeared or went). The reloader debounces
(500 ms) and renders; BIRD withdraws or announces the /128 or /32 at once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Protocol

import trio

from flock.model import PodInfo
from flock.watchers import ChangeType, PodChange


class PodChanges(Protocol):
    @property
    def pods(self) -> Mapping[str, PodInfo]: ...

    def subscribe(self) -> AbstractContextManager[trio.MemoryReceiveChannel[PodChange]]: ...


async def follow_pod_readiness(
    pods: PodChanges, poke: Callable[[], None], *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Call *poke* whenever a pod's readiness (or existence) changes, until cancelled."""
    with pods.subscribe() as changes:
        seen = {key: pod.ready for key, pod in pods.pods.items()}
        task_status.started()
        async for change in changes:
            key = change.pod.key
            if change.type is ChangeType.DELETED:
                seen.pop(key, None)
                poke()
            elif key not in seen or seen[key] != change.pod.ready:
                seen[key] = change.pod.ready
                poke()
