"""Watch events as the API server writes them, and how one change reads to one watcher.

Pure values shared by the store's real watches (:class:`flock.apiserver._store.Subscription`)
and its counted virtual ones (:mod:`._virtual`), so both see the same event for the same change.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs

from ._lists import Change, StoredObject, encode
from ._resources import Resource
from ._selectors import INITIAL_EVENTS_END


@attrs.frozen(slots=True, weakref_slot=False)
class WatchEvent:
    """A watch event whose object is already JSON."""

    type: str  # "ADDED"|"MODIFIED"|"DELETED"|"BOOKMARK"|"ERROR"
    object: bytes

    @classmethod
    def of(cls, type: str, obj: Mapping[str, Any]) -> WatchEvent:
        return cls(type, encode(obj))

    def encode(self) -> bytes:
        """One line of a watch response."""
        return b'{"type":"' + self.type.encode() + b'","object":' + self.object + b"}\n"

    def decode(self) -> dict[str, Any]:
        return {"type": self.type, "object": json.loads(self.object)}


Deliver = Callable[[WatchEvent], None]


def bookmark(resource: Resource, resource_version: int, *, initial_events_end: bool = False) -> WatchEvent:
    """A BOOKMARK at *resource_version*; *initial_events_end*: the one that ends a WatchList's initial events."""
    meta: dict[str, Any] = {"resourceVersion": str(resource_version)}
    if initial_events_end:
        meta["annotations"] = {INITIAL_EVENTS_END: "true"}
    return WatchEvent.of("BOOKMARK", {"kind": resource.kind, "apiVersion": resource.api_version, "metadata": meta})


def added_events(objects: Iterable[StoredObject]) -> bytes:
    """ADDED events for *objects*, as watch response lines."""
    return b"".join(b'{"type":"ADDED","object":' + obj.data + b"}\n" for obj in objects)


def event_type(change: Change, sees: Callable[[StoredObject | None], bool]) -> str | None:
    """The type of the event a watcher that *sees* some objects gets for *change* (None: none):
    an object entering its selection is ADDED, one leaving it DELETED, as kube-apiserver's
    cacher sends them.  The event's object is ``change.new`` either way."""
    return transition(change.type, sees(change.old), sees(change.new))


def transition(type: str, was: bool, now: bool) -> str | None:
    """:func:`event_type` of a change of *type* to an object the watcher saw before (*was*) and
    sees after (*now*)."""
    if type == "DELETED":
        return "DELETED" if was else None
    if was and now:
        return type
    if now:
        return "ADDED"
    if was:
        return "DELETED"
    return None


def line_overhead(type: str) -> int:
    """Bytes a watch event line of *type* adds to its object's JSON."""
    return len(WatchEvent(type, b"").encode())


__all__ = ["Deliver", "WatchEvent", "added_events", "bookmark", "event_type", "line_overhead", "transition"]
