"""The fake API server's storage: objects, resourceVersions, history and watches.

Plain Python under one ``threading.Lock``, so the HTTP server's asyncio thread,
a test's Trio thread and the lab's control calls can all use it.  Every write
takes the next resourceVersion (one counter for all kinds, like etcd's
revision) and appends to a bounded history that watches replay from; versions
older than the history answer 410 Expired.  Watchers are plain callbacks
called under the lock, in resourceVersion order; they must not block (the HTTP
server hands the event to its loop with ``call_soon_threadsafe``).
"""

from __future__ import annotations

import base64
import collections
import copy
import datetime
import re
import threading
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from ._resources import PODS, SECRETS, Resource
from ._selectors import FieldSelector
from ._status import StatusError, expired

Event = dict[str, Any]  # {"type": "ADDED"|"MODIFIED"|"DELETED"|"BOOKMARK"|"ERROR", "object": {...}}
Deliver = Callable[[Event], None]

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]{1,253}$")
DEFAULT_HISTORY = 10_000


@attrs.frozen
class _Change:
    rv: int
    resource: Resource
    type: str
    old: Mapping[str, Any] | None
    new: Mapping[str, Any]


@attrs.define(eq=False)
class Subscription:
    """One open watch: which objects it sees and where its events go."""

    store: ObjectStore
    resource: Resource
    namespace: str | None
    selector: FieldSelector
    deliver: Deliver
    closed: bool = False

    def sees(self, obj: Mapping[str, Any] | None) -> bool:
        if obj is None:
            return False
        if self.namespace is not None and obj["metadata"].get("namespace") != self.namespace:
            return False
        return self.selector.matches(obj)

    def event_for(self, change: _Change) -> Event | None:
        """The event this watch gets for *change*: an object entering the
        selection is ADDED, one leaving it is DELETED (as kube-apiserver does)."""
        if change.resource != self.resource:
            return None
        was, now = self.sees(change.old), self.sees(change.new)
        if change.type == "DELETED":
            return {"type": "DELETED", "object": change.new} if was else None
        if was and now:
            return {"type": change.type, "object": change.new}
        if now:
            return {"type": "ADDED", "object": change.new}
        if was:
            return {"type": "DELETED", "object": change.new}
        return None

    def bookmark(self) -> None:
        """Deliver a BOOKMARK at the current resourceVersion, in order with the events."""
        with self.store._lock:
            if not self.closed:
                self.deliver(
                    {
                        "type": "BOOKMARK",
                        "object": {
                            "kind": self.resource.kind,
                            "apiVersion": self.resource.api_version,
                            "metadata": {"resourceVersion": str(self.store._rv)},
                        },
                    }
                )

    def close(self) -> None:
        with self.store._lock:
            self.closed = True
            self.store._subscriptions.discard(self)


@attrs.define(eq=False)
class ObjectStore:
    """Objects of every known resource, with etcd-like resourceVersions."""

    history_limit: int = DEFAULT_HISTORY
    _lock: threading.Lock = attrs.field(init=False, factory=threading.Lock)
    _rv: int = attrs.field(init=False, default=1)
    _objects: dict[tuple[Resource, str, str], Mapping[str, Any]] = attrs.field(init=False, factory=dict)
    _history: collections.deque[_Change] = attrs.field(init=False)
    _oldest: int = attrs.field(init=False, default=1)  # watches from an rv below this get 410
    _subscriptions: set[Subscription] = attrs.field(init=False, factory=set)

    @_history.default
    def _new_history(self) -> collections.deque[_Change]:
        return collections.deque()

    @property
    def resource_version(self) -> int:
        with self._lock:
            return self._rv

    # ---- reads ---------------------------------------------------------------

    def get(self, resource: Resource, name: str, namespace: str | None = None) -> dict[str, Any]:
        with self._lock:
            obj = self._objects.get((resource, self._ns(resource, namespace), name))
        if obj is None:
            raise _not_found(resource, name)
        return copy.deepcopy(dict(obj))

    def list(
        self, resource: Resource, namespace: str | None = None, selector: FieldSelector = FieldSelector()
    ) -> tuple[list[Mapping[str, Any]], int]:
        """Matching objects (shared, never mutated: do not change them) and the list's resourceVersion."""
        with self._lock:
            items = [
                obj
                for (res, ns, _), obj in self._objects.items()
                if res == resource and (namespace is None or ns == namespace) and selector.matches(obj)
            ]
            return items, self._rv

    # ---- writes --------------------------------------------------------------

    def create(self, resource: Resource, obj: Mapping[str, Any], namespace: str | None = None) -> dict[str, Any]:
        new = self._validated(resource, obj, namespace)
        meta = new["metadata"]
        with self._lock:
            key = (resource, meta.get("namespace", ""), meta["name"])
            if key in self._objects:
                raise StatusError(
                    409,
                    f'{resource.plural} "{meta["name"]}" already exists',
                    reason="AlreadyExists",
                    details={"name": meta["name"], "kind": resource.plural},
                )
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = _now()
            return self._commit(resource, key, "ADDED", None, new)

    def update(self, resource: Resource, obj: Mapping[str, Any], namespace: str | None = None) -> dict[str, Any]:
        """Replace an object; a stale ``metadata.resourceVersion`` → 409 Conflict."""
        new = self._validated(resource, obj, namespace)
        with self._lock:
            return self._replace_locked(resource, new)

    def patch(
        self, resource: Resource, name: str, patch: Mapping[str, Any], namespace: str | None = None
    ) -> dict[str, Any]:
        """Apply a JSON merge patch (RFC 7386: maps merge, null deletes, lists are replaced).

        A ``metadata.resourceVersion`` in the patch is a precondition (409 when stale).
        """
        if not isinstance(patch, Mapping):
            raise StatusError(400, f"a merge patch must be an object, got {type(patch).__name__}")
        with self._lock:
            old = self._objects.get((resource, self._ns(resource, namespace), name))
            if old is None:
                raise _not_found(resource, name)
            merged = _merge_patch(copy.deepcopy(dict(old)), patch)
            merged.setdefault("metadata", {})["name"] = name
            return self._replace_locked(resource, self._validated(resource, merged, namespace))

    def _replace_locked(self, resource: Resource, new: dict[str, Any]) -> dict[str, Any]:
        meta = new["metadata"]
        key = (resource, meta.get("namespace", ""), meta["name"])
        old = self._objects.get(key)
        if old is None:
            raise _not_found(resource, meta["name"])
        wanted = meta.get("resourceVersion")
        if wanted and wanted != old["metadata"]["resourceVersion"]:
            raise StatusError(
                409,
                f'Operation cannot be fulfilled on {resource.plural} "{meta["name"]}": '
                "the object has been modified; please apply your changes to the latest version and try again",
                details={"name": meta["name"], "kind": resource.plural},
            )
        meta["uid"] = old["metadata"]["uid"]
        meta["creationTimestamp"] = old["metadata"]["creationTimestamp"]
        return self._commit(resource, key, "MODIFIED", old, new)

    def delete(self, resource: Resource, name: str, namespace: str | None = None) -> dict[str, Any]:
        with self._lock:
            key = (resource, self._ns(resource, namespace), name)
            old = self._objects.get(key)
            if old is None:
                raise _not_found(resource, name)
            gone = copy.deepcopy(dict(old))
            return self._commit(resource, key, "DELETED", old, gone)

    def compact(self, *, expire_watches: bool = False) -> int:
        """Forget the history up to now: watches from an older version get 410.

        With *expire_watches*, open watches also get an ERROR 410 event (as when
        a real watcher falls out of the apiserver's window).  Returns the
        resourceVersion compacted to.
        """
        with self._lock:
            self._history.clear()
            self._oldest = self._rv
            if expire_watches:
                for sub in list(self._subscriptions):
                    sub.deliver({"type": "ERROR", "object": expired("watch", self._oldest).status()})
                    sub.closed = True
                self._subscriptions.clear()
            return self._rv

    # ---- watches -------------------------------------------------------------

    def watch(
        self,
        resource: Resource,
        namespace: str | None,
        selector: FieldSelector,
        since: str | None,
        deliver: Deliver,
    ) -> Subscription:
        """Open a watch: replay what happened after *since* (or, for no
        version / "0", ADDED for every current object), then deliver live events.

        Raises StatusError 410 when *since* is older than the kept history.
        """
        sub = Subscription(self, resource, namespace, selector, deliver)
        with self._lock:
            if since in (None, "", "0"):
                for (res, _, _), obj in self._objects.items():
                    if res == resource and sub.sees(obj):
                        deliver({"type": "ADDED", "object": obj})
            else:
                try:
                    start = int(since)
                except ValueError:
                    raise StatusError(400, f"invalid resourceVersion {since!r}") from None
                if start < self._oldest:
                    raise expired(start, self._oldest)
                if start > self._rv:
                    # What a real API server answers a client whose version is
                    # from before a restore or an empty restart.
                    raise StatusError(
                        504,
                        f"Too large resource version: {start}, current: {self._rv}",
                        reason="Timeout",
                        details={
                            "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}]
                        },
                    )
                for change in self._history:
                    if change.rv > start and (ev := sub.event_for(change)) is not None:
                        deliver(ev)
            self._subscriptions.add(sub)
        return sub

    # ---- internals -------------------------------------------------------------

    @staticmethod
    def _ns(resource: Resource, namespace: str | None) -> str:
        return (namespace or "default") if resource.namespaced else ""

    def _commit(
        self,
        resource: Resource,
        key: tuple[Resource, str, str],
        kind: str,
        old: Mapping[str, Any] | None,
        new: dict[str, Any],
    ) -> dict[str, Any]:
        self._rv += 1
        new["metadata"]["resourceVersion"] = str(self._rv)
        if kind == "DELETED":
            del self._objects[key]
        else:
            self._objects[key] = new
        change = _Change(self._rv, resource, kind, old, new)
        self._history.append(change)
        while len(self._history) > self.history_limit:
            self._oldest = self._history.popleft().rv
        for sub in self._subscriptions:
            if (ev := sub.event_for(change)) is not None:
                sub.deliver(ev)
        return copy.deepcopy(new)

    def _validated(self, resource: Resource, obj: Mapping[str, Any], namespace: str | None) -> dict[str, Any]:
        if not isinstance(obj, Mapping):
            raise StatusError(400, f"expected a {resource.kind} object, got {type(obj).__name__}")
        new = copy.deepcopy(dict(obj))
        meta = new.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise _invalid(resource, "?", "metadata", meta, "must be an object")
        name = meta.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise _invalid(resource, str(name), "metadata.name", name, "must be a lowercase RFC 1123 subdomain")
        if resource.namespaced:
            ns = namespace or meta.get("namespace") or "default"
            if meta.get("namespace") not in (None, ns):
                raise StatusError(
                    400, "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        new["apiVersion"], new["kind"] = resource.api_version, resource.kind
        if resource == SECRETS:
            return _secret(new, name)
        spec = new.get("spec")
        if not isinstance(spec, dict):
            raise _invalid(resource, name, "spec", spec, "Required value")
        if resource == PODS:
            containers = spec.get("containers")
            if not isinstance(containers, list) or not containers:
                raise _invalid(resource, name, "spec.containers", containers, "Required value")
            for i, c in enumerate(containers):
                if not isinstance(c, dict) or not c.get("name") or not c.get("image"):
                    raise _invalid(resource, name, f"spec.containers[{i}]", c, "name and image are required")
        return new


def _secret(new: dict[str, Any], name: str) -> dict[str, Any]:
    """A Secret as kube-apiserver stores it: ``stringData`` folded into ``data``
    (base64), every ``data`` value base64, keys as Kubernetes allows them."""
    data = new.get("data") or {}
    if not isinstance(data, dict):
        raise _invalid(SECRETS, name, "data", "<object>", "must be a map of key to base64 value")
    string_data = new.pop("stringData", None) or {}
    if not isinstance(string_data, dict):
        raise _invalid(SECRETS, name, "stringData", "<object>", "must be a map of key to string")
    for key, value in string_data.items():
        if not isinstance(value, str):
            raise _invalid(SECRETS, name, f"stringData[{key}]", "<value>", "must be a string")
        data[key] = base64.b64encode(value.encode()).decode()
    for key, value in data.items():
        if not isinstance(key, str) or not _SECRET_KEY.match(key):
            raise _invalid(SECRETS, name, "data", key, "keys must consist of alphanumeric characters, '-', '_' or '.'")
        try:
            base64.b64decode(value, validate=True)
        except (TypeError, ValueError):
            # Never echo a value: it is a secret.
            raise _invalid(SECRETS, name, f"data[{key}]", "<value>", "must be base64") from None
    new["data"] = data
    new.setdefault("type", "Opaque")
    return new


def _merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge_patch(result.get(key), value)
    return result


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _not_found(resource: Resource, name: str) -> StatusError:
    group = f"{resource.plural}.{resource.group}" if resource.group else resource.plural
    return StatusError(404, f'{group} "{name}" not found', details={"name": name, "kind": resource.plural})


def _invalid(resource: Resource, name: str, field: str, value: Any, why: str) -> StatusError:
    return StatusError(
        422,
        f'{resource.kind} "{name}" is invalid: {field}: {why} (got {value!r})',
        details={"name": name, "kind": resource.kind, "causes": [{"field": field, "message": why}]},
    )


__all__ = ["ObjectStore", "Subscription"]
