"""Graceful deletion, as kube-apiserver does it for Pods (``rest.BeforeDelete`` with the pod strategy).

A DELETE of a pod bound to a node, with a grace period above zero, does not
remove it: it sets ``metadata.deletionTimestamp`` (now + the grace) and
``metadata.deletionGracePeriodSeconds`` and answers the object (a MODIFIED
watch event).  The kubelet stops the containers, tears down the sandbox (CNI
DEL) and sends a second DELETE with ``gracePeriodSeconds=0``, which removes it
(DELETED).  The grace is, by priority: the request's ``gracePeriodSeconds``
(DeleteOptions in the body, else the query), the pod's
``spec.terminationGracePeriodSeconds``, 30.  An unbound pod, or one that has
ended (Succeeded, Failed), is removed at once whatever was asked; a negative
grace counts as 1 s.  A DELETE of a pod already terminating may only shorten
its grace; otherwise the pod is answered as it is.

Other kinds have no graceful deletion (nor finalizers, here): removed at once.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

import attrs

from ._status import StatusError

# kube-apiserver's default of spec.terminationGracePeriodSeconds (applied at create upstream; read here).
DEFAULT_TERMINATION_GRACE_SECONDS = 30
_TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


@attrs.frozen
class DeleteOptions:
    """What a DELETE asks (``meta/v1`` DeleteOptions; only the grace period is read).

    *grace_period_seconds* None: the object's own."""

    grace_period_seconds: int | None = None

    @classmethod
    def from_request(cls, body: Mapping[str, Any] | None, query: Mapping[str, str]) -> DeleteOptions:
        """From the body when it holds DeleteOptions, else from the query (as the apiserver's handler reads them).

        Raises 400 StatusError for a grace period that is not an integer."""
        if body:
            raw: Any = body.get("gracePeriodSeconds")
            if raw is not None and (isinstance(raw, bool) or not isinstance(raw, int)):
                raise StatusError(400, f"gracePeriodSeconds: expected an integer, got {raw!r}")
            return cls(raw)
        text = query.get("gracePeriodSeconds")
        if text is None or text == "":
            return cls()
        try:
            return cls(int(text))
        except ValueError:
            raise StatusError(400, f"gracePeriodSeconds: expected an integer, got {text!r}") from None


@attrs.frozen
class Deletion:
    """What a DELETE of a pod does: *remove* it (with *obj* as its last state), or keep *obj*
    (changed: *changed*, a MODIFIED event; unchanged: the grace already running is kept)."""

    obj: dict[str, Any]
    remove: bool
    changed: bool


def _time(text: str) -> datetime.datetime:
    return datetime.datetime.strptime(text, _TIME_FORMAT).replace(tzinfo=datetime.UTC)


def _text(when: datetime.datetime) -> str:
    return when.strftime(_TIME_FORMAT)


def pod_grace(pod: Mapping[str, Any], options: DeleteOptions) -> int:
    """The grace period a DELETE with *options* gives *pod* (the pod strategy's CheckGracefulDelete)."""
    spec = pod.get("spec") or {}
    if options.grace_period_seconds is not None:
        period = options.grace_period_seconds
    else:
        own = spec.get("terminationGracePeriodSeconds")
        period = own if isinstance(own, int) and not isinstance(own, bool) else DEFAULT_TERMINATION_GRACE_SECONDS
    if not spec.get("nodeName"):
        period = 0  # never scheduled: nothing to stop
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        period = 0  # its containers have ended
    return 1 if period < 0 else period


def delete_pod(pod: dict[str, Any], options: DeleteOptions, now: datetime.datetime) -> Deletion:
    """What DELETE with *options* does to *pod* (a private copy, changed in place) at *now*."""
    meta = pod["metadata"]
    period = pod_grace(pod, options)
    if meta.get("deletionTimestamp"):
        current = meta.get("deletionGracePeriodSeconds")
        if not current:
            # Marked with no grace left (an earlier delete stopped half way): finish it.
            return Deletion(pod, remove=True, changed=False)
        if options.grace_period_seconds is None or period >= current:
            return Deletion(pod, remove=False, changed=False)  # only a shorter grace may be asked for
        # Shortened: the deadline moves earlier by the difference.
        meta["deletionTimestamp"] = _text(
            _time(meta["deletionTimestamp"]) - datetime.timedelta(seconds=current - period)
        )
        meta["deletionGracePeriodSeconds"] = period
        return Deletion(pod, remove=period == 0, changed=True)
    meta["deletionTimestamp"] = _text(now + datetime.timedelta(seconds=period))
    meta["deletionGracePeriodSeconds"] = period
    if meta.get("generation", 0) > 0:
        meta["generation"] += 1
    return Deletion(pod, remove=period == 0, changed=True)


__all__ = ["DEFAULT_TERMINATION_GRACE_SECONDS", "DeleteOptions", "Deletion", "delete_pod", "pod_grace"]
