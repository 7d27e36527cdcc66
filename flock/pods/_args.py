"""CNI_ARGS → which pod an ADD is for (Kubernetes' K8S_POD_* keys)."""

from __future__ import annotations

import attrs

from flock.rpc import parse_cni_args

from ._errors import InvalidCniArgs

NAMESPACE, NAME, UID = "K8S_POD_NAMESPACE", "K8S_POD_NAME", "K8S_POD_UID"
# DNS-1123 label (namespace) / subdomain (pod name) characters; anything else
# cannot be a Kubernetes name and must not reach an API path.
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-.")
# str.isalnum() would also admit 'é' or '١', which no Kubernetes UID holds.
_UID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-")


@attrs.frozen
class PodRef:
    namespace: str
    name: str
    uid: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _bad(key: str, value: str, expected: str) -> InvalidCniArgs:
    return InvalidCniArgs("invalid CNI_ARGS", f"{key}={value!r}: expected {expected}")


def pod_ref(args: str) -> PodRef:
    """The pod named by CNI_ARGS; :class:`InvalidCniArgs` naming the key and value
    (CNI_ARGS syntax errors from :func:`flock.rpc.parse_cni_args` are CniErrors)."""
    parsed = parse_cni_args(args)
    out = {}
    for key, limit in ((NAMESPACE, 63), (NAME, 253)):
        value = parsed.get(key, "")
        if not value:
            raise InvalidCniArgs("invalid CNI_ARGS", f"{key} is required (CNI_ARGS={args!r})")
        if len(value) > limit or not _NAME_CHARS.issuperset(value) or not value[0].isalnum() or not value[-1].isalnum():
            raise _bad(
                key, value, f"a Kubernetes name (lower-case letters, digits, '-', '.'; at most {limit} characters)"
            )
        out[key] = value
    uid = parsed.get(UID, "")
    if uid and (len(uid) > 64 or not _UID_CHARS.issuperset(uid)):
        raise _bad(UID, uid, "a UID such as 6f1c2a9e-0d4b-4f6e-9a51-3c2d1e0f9b8a")
    return PodRef(out[NAMESPACE], out[NAME], uid)
