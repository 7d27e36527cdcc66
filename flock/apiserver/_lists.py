"""Reading lists from the fake API server's storage, as etcd and the watch cache answer them.

What a stored object is (:class:`StoredObject`: its JSON and the values its
field selectors read), how one resource's objects are indexed
(:class:`Collection`: by key, keys sorted as etcd orders them, and pods by
``spec.nodeName`` as the watch cache indexes them), and the one read every list
goes through, :func:`select`: the objects as of a version (the current ones
with every later :class:`Change` undone, as etcd's MVCC read at that revision
gives), paged by key with a continue token, the node index used when a field
selector names one node.  :func:`read_version` decides the version a list
reads at (or its 410 / 504).  Pure: the caller (:class:`flock.apiserver._store.ObjectStore`)
holds its lock around a call.
"""

from __future__ import annotations

import bisect
import heapq
import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import attrs

from ._labels import Labels
from ._resources import Resource
from ._selectors import FieldSelector, FieldValues, ListPlan, encode_continue
from ._status import expired_list, inconsistent_continue, too_large

NODE_FIELD = "spec.nodeName"  # indexed, as the watch cache indexes pods by node


def encode(obj: Any) -> bytes:
    """Compact JSON, UTF-8, as kube-apiserver writes it."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


@attrs.frozen(slots=True, weakref_slot=False)
class StoredObject:
    """One version of an object: its JSON and what selectors read (see :func:`field_values`
    and :func:`flock.apiserver._labels.object_labels`)."""

    key: str  # "namespace/name", or "name" for a cluster-scoped kind
    data: bytes
    resource_version: int
    fields: FieldValues
    labels: Labels = ()

    def decode(self) -> dict[str, Any]:
        """A private copy of the object."""
        result: dict[str, Any] = json.loads(self.data)
        return result


@attrs.frozen(slots=True, weakref_slot=False)
class Change:
    """One write: the version it took, and the object before (None: created) and after."""

    rv: int
    resource: Resource
    type: str
    key: str
    old: StoredObject | None
    new: StoredObject  # for DELETED: the object as deleted (at the deletion's version)


@attrs.define(eq=False)
class Collection:
    """The objects of one resource: by key, the keys sorted, and the keys by node."""

    objects: dict[str, StoredObject] = attrs.field(factory=dict)
    keys: list[str] = attrs.field(factory=list)
    node_field: int | None = None  # index of spec.nodeName in the kind's field values
    by_node: dict[str, set[str]] = attrs.field(factory=dict)

    def put(self, obj: StoredObject, *, sort: bool = True) -> None:
        old = self.objects.get(obj.key)
        self.objects[obj.key] = obj
        if old is None:
            if sort:
                bisect.insort(self.keys, obj.key)
            else:
                self.keys.append(obj.key)
        if self.node_field is not None:
            node = obj.fields[self.node_field]
            if old is not None and old.fields[self.node_field] != node:
                self._unindex(old)
            self.by_node.setdefault(node, set()).add(obj.key)

    def remove(self, key: str) -> None:
        old = self.objects.pop(key)
        del self.keys[bisect.bisect_left(self.keys, key)]
        if self.node_field is not None:
            self._unindex(old)

    def _unindex(self, obj: StoredObject) -> None:
        assert self.node_field is not None
        node = obj.fields[self.node_field]
        keys = self.by_node[node]
        keys.discard(obj.key)
        if not keys:
            del self.by_node[node]


@attrs.frozen
class ListResult:
    """One list answer: its items (in key order) and its ``metadata``."""

    items: list[StoredObject]
    resource_version: int
    continue_: str = ""
    remaining_item_count: int | None = None

    def chunks(self, resource: Resource, batch: int = 500) -> Iterator[bytes]:
        """The response body, *batch* items a chunk (so a big one is written as it is made)."""
        meta: dict[str, Any] = {"resourceVersion": str(self.resource_version)}
        if self.continue_:
            meta["continue"] = self.continue_
        if self.remaining_item_count is not None:
            meta["remainingItemCount"] = self.remaining_item_count
        head = {"kind": resource.list_kind, "apiVersion": resource.api_version, "metadata": meta}
        yield encode(head)[:-1] + b',"items":['
        for i in range(0, len(self.items), batch):
            yield (b"," if i else b"") + b",".join(obj.data for obj in self.items[i : i + batch])
        yield b"]}"


def read_version(plan: ListPlan, current: int, oldest: int) -> int:
    """The version a list *plan* reads at, given the store's *current* and *oldest* readable ones.

    Raises StatusError: 504 "Too large resource version" for a version not reached yet
    (retry after 1 s when the watch cache answers, which has waited for it); 410 Expired
    for an exact version compacted away (a continue token's: with the token for the rest
    at the latest version).
    """
    if plan.at is not None:
        if plan.at > current:
            raise too_large(plan.at, current)
        if plan.at < oldest:
            if plan.continued:
                raise inconsistent_continue(encode_continue(-1, plan.start))
            raise expired_list()
        return plan.at
    if plan.minimum > current:
        raise too_large(plan.minimum, current, 1 if plan.from_cache else 0)
    return current


def select(
    coll: Collection,
    history: Sequence[Change],
    current: int,
    resource: Resource,
    namespace: str | None,
    selector: FieldSelector,
    at: int,
    start: str,
    limit: int,
) -> ListResult:
    """The objects of *coll* matching *selector* as of version *at* (*current* is the store's;
    *history* its changes, oldest first), from key *start* (relative to *namespace*'s prefix)
    on, at most *limit* (0: all), in key order, with the continue token for the rest."""
    prefix = f"{namespace}/" if namespace and resource.namespaced else ""
    low = prefix + start
    high = prefix[:-1] + "0" if prefix else None  # "0" follows "/": the end of the namespace's keys
    # What changed after `at`, undone: each key changed since → its version then (None: absent).
    overlay: dict[str, StoredObject | None] = {}
    if at < current:
        for change in reversed(history):
            if change.rv <= at:
                break
            if change.resource == resource:
                overlay[change.key] = change.old

    def at_version(key: str) -> StoredObject | None:
        return overlay[key] if key in overlay else coll.objects.get(key)

    def in_range(key: str) -> bool:
        return key >= low and (high is None or key < high)

    keys = coll.keys
    first = bisect.bisect_left(keys, low)
    end = len(keys) if high is None else bisect.bisect_left(keys, high)
    node = selector.required(NODE_FIELD) if coll.node_field is not None else None
    if node is not None:
        # The node index: only that node's keys (now, or changed since `at`) can match.
        candidates: Iterable[str] = sorted(k for k in coll.by_node.get(node, set()) | overlay.keys() if in_range(k))
    else:
        gone = sorted(k for k, v in overlay.items() if v is not None and k not in coll.objects and in_range(k))
        candidates = heapq.merge(keys[first:end], gone) if gone else keys[first:end]
    matches = selector.matcher(resource.kind)
    items: list[StoredObject] = []
    last = ""
    more = False
    for key in candidates:
        obj = at_version(key)
        if obj is None:
            continue
        if limit and len(items) >= limit:
            more = True
            break
        if matches(obj.fields, obj.labels):
            items.append(obj)
            last = key
    if node is not None and limit and len(items) >= limit and not more:
        # etcd pages by key, whatever matches: any key after the last item means more.
        after = bisect.bisect_right(keys, last)
        more = after < end or any(v is not None and k > last and in_range(k) for k, v in overlay.items())
    if not more:
        return ListResult(items, at)
    remaining = None
    if selector.empty:
        present = end - first  # keys in range now, then as of `at`
        for key, then in overlay.items():
            if in_range(key):
                present += (then is not None) - (key in coll.objects)
        remaining = present - limit
    return ListResult(items, at, encode_continue(at, last[len(prefix) :] + "\x00"), remaining)


__all__ = ["NODE_FIELD", "Change", "Collection", "ListResult", "StoredObject", "encode", "read_version", "select"]
