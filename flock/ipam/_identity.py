"""Who a pod is, for ip-algo: namespace, app, image, pod and node names."""

from __future__ import annotations

import re

import attrs

from flock.fnv import fnv1a_64
from flock.model import PodInfo

TEMPLATE_HASH_LABEL = "pod-template-hash"
# Deployment hashes use Kubernetes' SafeEncodeString alphabet (no vowels, no
# 0/1/3), so a custom ReplicaSet name such as "web-frontend" is not mistaken
# for one.
_TRAILING_HASH = re.compile(r"-[bcdfghjklmnpqrstvwxz2456789]{5,10}$")


@attrs.frozen
class PodIdentity:
    """The strings ip-algo's named fields hash."""

    namespace: str
    app: str
    image: str
    pod: str
    node: str

    def field(self, name: str) -> str:
        return getattr(self, name)


def app_name(pod: PodInfo) -> str:
    """The top-most stable controller name that every replica agrees on.

    ReplicaSet → its name without the pod-template-hash (the pod's label when
    present, else a trailing ``-<hash>``), so replicas across roll-outs of a
    Deployment agree; other controllers → the owner's name; bare pod → pod name.
    """
    owner = next((o for o in pod.owners if o.controller), pod.owners[0] if pod.owners else None)
    if owner is None or not owner.name:
        return pod.name
    if owner.kind == "ReplicaSet":
        label = pod.labels.get(TEMPLATE_HASH_LABEL)
        if label:
            suffix = "-" + label
            return (
                owner.name[: -len(suffix)]
                if owner.name.endswith(suffix) and len(owner.name) > len(suffix)
                else owner.name
            )
        return _TRAILING_HASH.sub("", owner.name) or owner.name
    return owner.name


def image_name(pod: PodInfo, container_id: str) -> str:
    """The first container's image; FNV-1a-64 of the container ID when there is none."""
    return pod.first_image or f"{fnv1a_64(container_id):016x}"


def pod_identity(pod: PodInfo, node_name: str, container_id: str) -> PodIdentity:
    return PodIdentity(
        namespace=pod.namespace,
        app=app_name(pod),
        image=image_name(pod, container_id),
        pod=pod.name,
        node=node_name,
    )
