"""Virtual watches: what thousands of watchers would be sent, counted without a connection.

A benchmark measures the API server → agents traffic of 5,000 nodes without
5,000 processes: it registers the watches those agents would open (by
resource, namespace, field and label selector; one entry may stand for
*count* identical watchers, as 5,000 agents each watching every pod) and the
store counts, for every change it commits, the events and bytes each of them
would receive — with the rules a real watch follows (:func:`._events.event_type`:
an object entering a selection is ADDED, one leaving it DELETED).  The bytes
are those of the JSON line a real watch writes; the object's JSON is the
store's own (encoded once, at the write), so an event costs a length, never a
serialization per watcher.

Indexed so that an event touches only the watches that can match it: a watch
with a field equality (``spec.nodeName=n``, ``metadata.name=n``,
``metadata.namespace=n`` or a namespaced watch's namespace) under that field's
value, else one with a label requirement ``k=v`` / ``k in (…)`` under each
(key, value), else in a short list every event of its resource tries.

Not counted: periodic BOOKMARKs (a real watch's come by the clock), watch
timeouts and re-lists, ERROR events (compaction expiring watches).
"""

from __future__ import annotations

import itertools
import threading
from typing import Any, Protocol

import attrs

from ._events import bookmark, line_overhead, transition
from ._lists import Change, ListResult, StoredObject
from ._resources import RESOURCES, Resource
from ._selectors import SUPPORTED_FIELDS, FieldSelector
from ._status import StatusError


class ObjectStore(Protocol):
    """What the virtual watches read of :class:`flock.apiserver._store.ObjectStore` (its lock, its
    collections and its selection at a version): named here so this module need not import the store's."""

    _lock: threading.Lock
    _rv: int

    def _collection(self, resource: Resource) -> Any: ...

    def _select_locked(
        self, resource: Resource, namespace: str | None, selector: FieldSelector, at: int, start: str, limit: int
    ) -> ListResult: ...


# What a re-watch with a new selector sends at its start (see VirtualWatch.rewatch).
NEW, ALL, NONE = "new", "all", "none"
_REWATCH_INITIAL = (NEW, ALL, NONE)
_LINE = {type: line_overhead(type) for type in ("ADDED", "MODIFIED", "DELETED")}


def resource_named(plural: str) -> Resource:
    """The resource whose plural is *plural* (404 when none is)."""
    for resource in RESOURCES:
        if resource.plural == plural:
            return resource
    raise StatusError(404, f"no resource {plural!r}: expected one of {', '.join(r.plural for r in RESOURCES)}")


@attrs.define(eq=False)
class VirtualWatch:
    """*count* identical watchers of *resource* (in *namespace*, None: all) selected by
    *field_selector* and *label_selector*; *events* and *bytes* are what ONE of them has been
    sent (initial events included when asked for), so the entry's share is *count* times them."""

    id: int
    resource: Resource
    namespace: str | None
    field_selector: str
    label_selector: str
    count: int
    owner: VirtualWatches
    events: int = 0
    bytes: int = 0
    selector: FieldSelector = attrs.field(init=False)
    by_index_alone: bool = attrs.field(init=False)
    _matches: Any = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._select(self.field_selector, self.label_selector)

    def _select(self, field_selector: str, label_selector: str) -> None:
        self.selector = FieldSelector.parse(field_selector, self.resource.kind, label_selector)
        self.field_selector, self.label_selector = field_selector, label_selector
        self._matches = self.selector.matcher(self.resource.kind)
        # Whether the index key it is filed under (see _Index.keys) is its whole selection: then an
        # object the index gives for it is one it sees, and no other is.
        selector = self.selector
        requirements = len(selector.requirements) + len(selector.labels.requirements)
        if self.namespace is not None:
            fields = SUPPORTED_FIELDS.get(self.resource.kind, ())
            self.by_index_alone = requirements == 0 and "metadata.namespace" in fields
        else:
            self.by_index_alone = requirements == 1 and (
                any(r.equal for r in selector.requirements) or selector.labels.indexable() is not None
            )

    def sees(self, obj: StoredObject | None) -> bool:
        if obj is None:
            return False
        if self.namespace is not None and not obj.key.startswith(self.namespace + "/"):
            return False
        return bool(self._matches(obj.fields, obj.labels))

    def rewatch(
        self, *, field_selector: str | None = None, label_selector: str | None = None, initial_events: str = NEW
    ) -> tuple[int, int]:
        """The watchers close their watch and open one with these selectors (None: unchanged), as an
        agent does when the groups it needs change; returns the (events, bytes) that start sent each.

        *initial_events* says what the new watch's start sends: ``"new"`` (the default) an ADDED
        event for each object the new selection holds and the old did not, and nothing for the
        ones it lost (a new watch sends no deletes: the agent forgets those itself) — what an
        agent that keeps its objects and asks only for the difference is sent; ``"all"`` what a
        fresh WatchList sends (every object it selects, then the initial-events-end BOOKMARK);
        ``"none"`` nothing (a watch resumed from the agent's resourceVersion)."""
        if initial_events not in _REWATCH_INITIAL:
            raise StatusError(
                400, f"initialEvents must be one of {', '.join(_REWATCH_INITIAL)}, got {initial_events!r}"
            )
        return self.owner._rewatch(
            self,
            self.field_selector if field_selector is None else field_selector,
            self.label_selector if label_selector is None else label_selector,
            initial_events,
        )

    def close(self) -> None:
        """Stop counting for these watchers (their counts stay in the totals)."""
        self.owner._close(self)

    def report(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "resource": self.resource.plural,
            "namespace": self.namespace,
            "fieldSelector": self.field_selector,
            "labelSelector": self.label_selector,
            "count": self.count,
            "events": self.events,
            "bytes": self.bytes,
        }


@attrs.define(eq=False)
class _Index:
    """One resource's virtual watches, by what an event must carry to reach them."""

    by_field: dict[tuple[int, str], set[VirtualWatch]] = attrs.field(factory=dict)
    by_label: dict[tuple[str, str], set[VirtualWatch]] = attrs.field(factory=dict)
    rest: set[VirtualWatch] = attrs.field(factory=set)

    def keys(self, watch: VirtualWatch) -> tuple[str, list[Any]]:
        fields = SUPPORTED_FIELDS.get(watch.resource.kind, ())
        for r in watch.selector.requirements:
            if r.equal:
                return "field", [(fields.index(r.field), r.value)]
        label = watch.selector.labels.indexable()
        if label is not None:
            return "label", [(label.key, value) for value in label.values]
        if watch.namespace is not None and "metadata.namespace" in fields:
            return "field", [(fields.index("metadata.namespace"), watch.namespace)]
        return "rest", []

    def add(self, watch: VirtualWatch) -> None:
        kind, keys = self.keys(watch)
        table: dict[Any, set[VirtualWatch]] = self.by_field if kind == "field" else self.by_label
        if kind == "rest":
            self.rest.add(watch)
        for key in keys:
            table.setdefault(key, set()).add(watch)

    def remove(self, watch: VirtualWatch) -> None:
        kind, keys = self.keys(watch)
        table: dict[Any, set[VirtualWatch]] = self.by_field if kind == "field" else self.by_label
        self.rest.discard(watch)
        for key in keys:
            found = table.get(key)
            if found is not None:
                found.discard(watch)
                if not found:
                    del table[key]

    def hits(self, obj: StoredObject | None) -> set[VirtualWatch]:
        """The indexed watches filed under one of *obj*'s field values or labels."""
        found: set[VirtualWatch] = set()
        if obj is None:
            return found
        if self.by_field:
            for key in enumerate(obj.fields):
                if (hit := self.by_field.get(key)) is not None:
                    found |= hit
        if self.by_label:
            for pair in obj.labels:
                if (hit := self.by_label.get(pair)) is not None:
                    found |= hit
        return found


@attrs.define(eq=False)
class VirtualWatches:
    """The virtual watches of *store* (it calls :meth:`count` with each change, under its lock;
    every method here takes that lock, so any thread may call them)."""

    store: ObjectStore
    _ids: itertools.count[int] = attrs.field(init=False, factory=lambda: itertools.count(1))
    _watches: dict[int, VirtualWatch] = attrs.field(init=False, factory=dict)
    _indexes: dict[Resource, _Index] = attrs.field(init=False, factory=dict)
    # per resource plural: [watchers, events, bytes], closed watches' included
    _totals: dict[str, list[int]] = attrs.field(init=False, factory=dict)

    def add(
        self,
        resource: Resource | str,
        *,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
        count: int = 1,
        initial_events: bool = False,
    ) -> VirtualWatch:
        """*count* watchers of *resource* (a Resource or its plural) from now on; *initial_events*:
        each started as a WatchList (every selected object ADDED, then the initial-events-end
        BOOKMARK: see :meth:`initial_bytes`), else from the current version (nothing at the start).
        A bad selector → StatusError 400, as the real watch's."""
        res = resource if isinstance(resource, Resource) else resource_named(resource)
        if count < 1:
            raise StatusError(400, f"count must be at least 1, got {count}")
        with self.store._lock:
            self.store._collection(res)  # 404 for a resource not served
            watch = VirtualWatch(next(self._ids), res, namespace, field_selector, label_selector, count, self)
            totals = self._totals.setdefault(res.plural, [0, 0, 0])
            totals[0] += count
            if initial_events:
                events, size = self._initial_locked(res, namespace, watch.selector)
                self._add_to(watch, events, size)
            self._watches[watch.id] = watch
            self._indexes.setdefault(res, _Index()).add(watch)
        return watch

    def get(self, id: int) -> VirtualWatch:
        with self.store._lock:
            found = self._watches.get(id)
        if found is None:
            raise StatusError(404, f"no virtual watch {id}")
        return found

    def clear(self) -> int:
        """Remove every virtual watch and forget the totals; returns how many entries there were."""
        with self.store._lock:
            removed = len(self._watches)
            self._watches.clear()
            self._indexes.clear()
            self._totals.clear()
        return removed

    def totals(self) -> dict[str, dict[str, int]]:
        """Per resource plural: the watchers open now, and the events and bytes all of them (closed
        ones included) were sent since the last :meth:`clear`."""
        with self.store._lock:
            return {plural: {"watches": w, "events": e, "bytes": b} for plural, (w, e, b) in self._totals.items()}

    def watches(self) -> list[dict[str, Any]]:
        """Every open virtual watch's :meth:`VirtualWatch.report`."""
        with self.store._lock:
            return [w.report() for w in self._watches.values()]

    def initial_bytes(
        self, resource: Resource | str, namespace: str | None = None, label_selector: str = "", field_selector: str = ""
    ) -> tuple[int, int]:
        """(events, bytes) a WatchList started now with these selectors sends before its live
        events: an ADDED line per selected object and the initial-events-end BOOKMARK line (sent
        to a client that allows bookmarks, as client-go's reflector does)."""
        res = resource if isinstance(resource, Resource) else resource_named(resource)
        selector = FieldSelector.parse(field_selector, res.kind, label_selector)
        with self.store._lock:
            return self._initial_locked(res, namespace, selector)

    def count(self, change: Change) -> None:
        """Count *change* for every virtual watch it reaches (the store calls this under its lock)."""
        index = self._indexes.get(change.resource)
        if index is None:
            return
        size = len(change.new.data)
        totals = self._totals[change.resource.plural]
        before, after = index.hits(change.old), index.hits(change.new)
        for watch in itertools.chain(index.rest, before | after):
            if watch.by_index_alone:
                type = transition(change.type, watch in before, watch in after)
            else:
                type = transition(change.type, watch.sees(change.old), watch.sees(change.new))
            if type is not None:
                line = _LINE[type] + size
                watch.events += 1
                watch.bytes += line
                totals[1] += watch.count
                totals[2] += watch.count * line

    # ---- internals (under the store's lock) ------------------------------------------

    def _initial_locked(self, resource: Resource, namespace: str | None, selector: FieldSelector) -> tuple[int, int]:
        items = self.store._select_locked(resource, namespace, selector, self.store._rv, "", 0).items
        end = bookmark(resource, self.store._rv, initial_events_end=True).encode()
        return len(items) + 1, sum(_LINE["ADDED"] + len(obj.data) for obj in items) + len(end)

    def _add_to(self, watch: VirtualWatch, events: int, size: int) -> None:
        watch.events += events
        watch.bytes += size
        totals = self._totals[watch.resource.plural]
        totals[1] += watch.count * events
        totals[2] += watch.count * size

    def _rewatch(
        self, watch: VirtualWatch, field_selector: str, label_selector: str, initial_events: str
    ) -> tuple[int, int]:
        new = FieldSelector.parse(field_selector, watch.resource.kind, label_selector)  # 400 before any change
        with self.store._lock:
            if watch.id not in self._watches:
                raise StatusError(404, f"no virtual watch {watch.id}")
            index = self._indexes[watch.resource]
            before = VirtualWatch(
                0, watch.resource, watch.namespace, watch.field_selector, watch.label_selector, 1, self
            )
            index.remove(watch)
            watch._select(field_selector, label_selector)
            index.add(watch)
            if initial_events == ALL:
                events, size = self._initial_locked(watch.resource, watch.namespace, new)
            elif initial_events == NEW:
                items = self.store._select_locked(watch.resource, watch.namespace, new, self.store._rv, "", 0).items
                gained = [obj for obj in items if not before.sees(obj)]
                events, size = len(gained), sum(_LINE["ADDED"] + len(obj.data) for obj in gained)
            else:
                events, size = 0, 0
            self._add_to(watch, events, size)
        return events, size

    def _close(self, watch: VirtualWatch) -> None:
        with self.store._lock:
            if self._watches.pop(watch.id, None) is not None:
                self._indexes[watch.resource].remove(watch)
                self._totals[watch.resource.plural][0] -= watch.count


__all__ = ["ALL", "NEW", "NONE", "VirtualWatch", "VirtualWatches", "resource_named"]
