"""Warning Events about a Service (core/v1, what ``kubectl describe service`` lists), deduplicated.

An Event's name is a function of the Service's uid, the reason and the message, so the same refusal
told again — by this writer after the condition flapped, or by a newly elected one — finds the Event
it made before (409 on create) and bumps its ``count`` and ``lastTimestamp`` (describe shows
``(x3 over 5m)``) instead of adding one more. A Service deleted and made again (another uid) starts
afresh. Idempotent by construction, as client-go's EventCorrelator is in memory, and across writers.

Error handling: Events are best effort (the Service's condition holds the truth); every refusal and
I/O error propagates to the caller, which logs it and carries on.
"""

from __future__ import annotations

import datetime
import hashlib
from collections.abc import Mapping
from typing import Any

from ._api import EVENTS, Conflict, NotFound, ObjectApi

EVENT_COMPONENT = "flock-controller"
MESSAGE_LIMIT = 1024
# A bump meets a concurrent one (two writers for a moment, or kubectl): read and bump again, this often.
BUMP_TRIES = 3


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def event_name(service: Mapping[str, Any], reason: str, message: str) -> str:
    """``<service>.<16 hex>``: one name per (Service uid, reason, message)."""
    meta = service["metadata"]
    digest = hashlib.sha256(
        "\0".join((meta.get("uid", ""), meta.get("namespace", ""), meta["name"], reason, message)).encode()
    ).hexdigest()
    return f"{meta['name']}.{digest[:16]}"


def event(service: Mapping[str, Any], reason: str, message: str, identity: str) -> dict[str, Any]:
    """A core/v1 Warning Event about *service*, its first occurrence."""
    meta = service["metadata"]
    now = _now()
    message = message[:MESSAGE_LIMIT]
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": event_name(service, reason, message), "namespace": meta.get("namespace", "default")},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Service",
            "name": meta["name"],
            "namespace": meta.get("namespace", "default"),
            "uid": meta.get("uid", ""),
            "resourceVersion": meta.get("resourceVersion", ""),
        },
        "reason": reason,
        "message": message,
        "type": "Warning",
        "source": {"component": EVENT_COMPONENT},
        "reportingComponent": EVENT_COMPONENT,
        "reportingInstance": identity[:128],
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


async def record(api: ObjectApi, service: Mapping[str, Any], reason: str, message: str, identity: str) -> int:
    """Tell *reason*: *message* about *service*: a new Event, or the existing one's count bumped.
    Returns the Event's count."""
    fresh = event(service, reason, message, identity)
    meta = fresh["metadata"]
    for _ in range(BUMP_TRIES):
        try:
            await api.create(EVENTS, fresh)
            return 1
        except Conflict:
            pass  # told before: bump it
        try:
            current = await api.get(EVENTS, meta["name"], meta["namespace"])
        except NotFound:
            continue  # expired (the API server's event TTL) meanwhile: create it again
        count = int(current.get("count") or 1) + 1
        bumped = {
            **current,
            "count": count,
            "lastTimestamp": fresh["lastTimestamp"],
            "reportingInstance": fresh["reportingInstance"],
            "involvedObject": fresh["involvedObject"],  # the Service's newest resourceVersion
        }
        try:
            await api.replace(EVENTS, bumped)
            return count
        except (Conflict, NotFound):
            continue
    raise Conflict("PUT", f"events/{meta['name']}", 409, f"still changing after {BUMP_TRIES} tries")
