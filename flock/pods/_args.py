"""CNI_ARGS → which pod an ADD is for (Kubernetes' K8S_POD_* keys), and the
per-container options of containers without a pod.

- K8S_POD_NAMESPACE and K8S_POD_NAME: a Kubernetes pod (looked up, waited for).
- Neither, or K8S_POD_NAME alone (rootful podman passes the container name
  so): a container without a pod.  No lookup; NodeConfig defaults, changed
  only by flock annotations in the network configuration's ``args`` (see
  :func:`netconf_annotations`); K8S_POD_NAME, if given, is its label.
- K8S_POD_NAMESPACE alone: an error (code 4), a pod identity half given.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import attrs

from flock.errors import quote
from flock.model import ANNOTATION_PREFIX
from flock.rpc import parse_cni_args

from ._errors import InvalidCniArgs, InvalidNetworkConfig

NAMESPACE, NAME, UID = "K8S_POD_NAMESPACE", "K8S_POD_NAME", "K8S_POD_UID"
# DNS-1123 label (namespace) / subdomain (pod name) characters; anything else
# cannot be a Kubernetes name and must not reach an API path.
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-.")
# str.isalnum() would also admit 'é' or '١', which no Kubernetes UID holds.
_UID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-")
# A container name as podman and docker allow it (the label of a pod-less container).
_CONTAINER_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,252}")
_MAX_ARG_VALUE = 4096


@attrs.frozen
class PodRef:
    """A pod (``namespace`` set) or a container without one (``namespace`` "",
    ``name`` its label, possibly "")."""

    namespace: str
    name: str
    uid: str = ""

    @property
    def is_pod(self) -> bool:
        return bool(self.namespace)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}" if self.is_pod else f"container {self.name or '(unnamed)'}"


def _bad(key: str, value: str, expected: str) -> InvalidCniArgs:
    return InvalidCniArgs("invalid CNI_ARGS", f"{key}={quote(value, 64)}: expected {expected}")


def pod_ref(args: str) -> PodRef:
    """The pod named by CNI_ARGS; :class:`InvalidCniArgs` naming the key and value
    (CNI_ARGS syntax errors from :func:`flock.rpc.parse_cni_args` are CniErrors)."""
    parsed = parse_cni_args(args)
    if not parsed.get(NAMESPACE):
        if parsed.get(UID):
            raise InvalidCniArgs("invalid CNI_ARGS", f"{NAMESPACE} and {NAME} are required with {UID}")
        label = parsed.get(NAME, "")
        if label and not _CONTAINER_NAME.fullmatch(label):
            raise _bad(NAME, label, "a container name (letters, digits, '_', '.', '-'; at most 253 characters)")
        return PodRef("", label)
    out = {}
    for key, limit in ((NAMESPACE, 63), (NAME, 253)):
        value = parsed.get(key, "")
        if not value:
            raise InvalidCniArgs("invalid CNI_ARGS", f"{key} is required (CNI_ARGS={quote(args)})")
        if len(value) > limit or not _NAME_CHARS.issuperset(value) or not value[0].isalnum() or not value[-1].isalnum():
            raise _bad(
                key, value, f"a Kubernetes name (lower-case letters, digits, '-', '.'; at most {limit} characters)"
            )
        out[key] = value
    uid = parsed.get(UID, "")
    if uid and (len(uid) > 64 or not _UID_CHARS.issuperset(uid)):
        raise _bad(UID, uid, "a UID such as 6f1c2a9e-0d4b-4f6e-9a51-3c2d1e0f9b8a")
    return PodRef(out[NAMESPACE], out[NAME], uid)


def netconf_annotations(config: Mapping[str, Any]) -> dict[str, str]:
    """Per-container options of a container without a pod: the flock
    annotations (``flock.fritzlab.net/ipv4`` …) found in the network
    configuration's ``args`` object.  ``args`` comes from the conflist's
    author or the runtime, never from the container; other keys are ignored
    (CNI's ``args`` is shared by all plugins).  Values are strings or
    booleans; anything else is code 7 naming the key."""
    raw = config.get("args")
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise InvalidNetworkConfig("invalid args", f"args={quote(raw, 64)}: expected an object")
    out = {}
    for key, value in raw.items():
        if not isinstance(key, str) or not key.startswith(ANNOTATION_PREFIX):
            continue
        if isinstance(value, bool):
            value = "true" if value else "false"
        if not isinstance(value, str) or len(value) > _MAX_ARG_VALUE:
            raise InvalidNetworkConfig(
                "invalid args",
                f"args[{quote(key, 80)}]={quote(value, 64)}: expected a string of at most {_MAX_ARG_VALUE}",
            )
        out[key] = value
    return out
