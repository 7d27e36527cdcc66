"""The controllers' composition: one informer per kind, their changes to the controllers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import trio

from flock.watchers import Change, Informer, InformerSettings, KubeClient

from ._endpointslices import EndpointSliceController, node_zone
from ._kubelet import KubeletStandIn
from ._slices import PodValue, ServiceValue, SliceValue

# Watches end every 5 min and resume: a lab runs for minutes to hours.
SETTINGS = InformerSettings(watch_seconds=300)


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else str(meta.get("name", ""))


async def run_controllers(
    kube: KubeClient,
    slices: EndpointSliceController,
    kubelet: KubeletStandIn | None = None,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the informers and the controllers until cancelled; started() once every informer has
    listed and the controllers run."""

    def on_pod(change: Change) -> None:
        slices.on_pod(change)
        if kubelet is not None:
            kubelet.on_pod(change)

    informers = [
        Informer(kube.nodes(), _key, slices.on_node, SETTINGS, name="nodes", transform=node_zone),
        Informer(
            kube.services(), _key, slices.on_service, SETTINGS, name="services", transform=ServiceValue.from_object
        ),
        Informer(kube.all_pods(), _key, on_pod, SETTINGS, name="pods", transform=PodValue.from_object),
        Informer(
            kube.endpoint_slices(),
            _key,
            slices.on_slice,
            SETTINGS,
            name="endpointslices",
            transform=SliceValue.from_object,
        ),
    ]
    async with trio.open_nursery() as nursery:
        for informer in informers:
            await nursery.start(informer.run)
        await nursery.start(slices.run)
        if kubelet is not None:
            await nursery.start(kubelet.run)
        task_status.started()
