"""The fake API server's storage: objects, resourceVersions, history and watches.

Plain Python under one ``threading.Lock``, so the HTTP server's asyncio thread,
a test's Trio thread and the lab's control calls can all use it.  Every write
takes the next resourceVersion (one counter for all kinds, like etcd's
revision) and appends to a bounded history; versions older than the history
are compacted: a watch from one answers 410, an exact list at one 410.

Lean at scale: each object is kept as its encoded JSON (compact, as
kube-apiserver sends it) plus the few values its field selectors read, in a
key order (``namespace/name``, etcd's); a read decodes only what it returns,
and list bodies and watch events are joined from those bytes.  150,000 pods
of 5–6 KiB hold about their JSON's size.

Reads (a list, a watch's initial objects) go through :mod:`._lists`: at an
older version (a continue token's, an Exact list's) they are the state then,
the current objects with every change since undone from the history, as
etcd's MVCC read at that revision gives.

Watchers are plain callbacks called under the lock, in resourceVersion order;
they must not block (the HTTP server hands the event to its loop with
``call_soon_threadsafe``).
"""

from __future__ import annotations

import base64
import collections
import copy
import datetime
import json
import re
import secrets
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs

from ._admission import admit, invalid
from ._crds import check_custom
from ._deletion import DeleteOptions, delete_pod
from ._endpointslices import check_update as check_endpoint_slice_update
from ._events import Deliver, WatchEvent, bookmark, event_type
from ._labels import Labels, object_labels
from ._lists import NODE_FIELD, Change, Collection, ListResult, StoredObject, encode, read_version, select
from ._patch import (
    APPLY_PATCH,
    JSON_PATCH,
    MERGE_PATCH,
    PATCH_TYPES,
    STRATEGIC_MERGE_PATCH,
    apply_patch,
    json_patch,
    merge_patch,
    strategic_merge_patch,
)
from ._resources import CUSTOMRESOURCEDEFINITIONS, ENDPOINTSLICES, PODS, SECRETS, SERVICES, Resource
from ._selectors import (
    SUPPORTED_FIELDS,
    FieldSelector,
    FieldValues,
    ListPlan,
    WatchQuery,
    field_values,
)
from ._service_alloc import DEFAULT_SERVICE_CLUSTER_IP_RANGE, ServiceAllocator
from ._services import default_ip_modes, validate_load_balancer_status
from ._status import Invalid, StatusError, expired, too_large
from ._virtual import VirtualWatches

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]{1,253}$")
DEFAULT_HISTORY = 10_000
# The watch cache's wait for a resourceVersion it has not seen yet (the cacher's blockTimeout).
RESOURCE_VERSION_WAIT = 3.0
_BULK_CHUNK = 1000
_GENERATE_NAME_TRIES = 8  # upstream's RetryGenerateName: 7 retries
# names.SimpleNameGenerator's alphabet (no vowels: no words) and lengths.
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_DELETION_FIELDS = (
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
)  # bulk_create commits this many objects per hold of the lock


@attrs.frozen(slots=True, weakref_slot=False)
class NewObject:
    """An object admitted and encoded for creation (:func:`prepare_new`), its resourceVersion
    still to take: *data* holds :data:`_PENDING` where it goes."""

    key: str
    name: str
    data: bytes
    fields: FieldValues
    labels: Labels = ()


# Where a prepared object's resourceVersion goes: metadata comes first and no name, uid or
# namespace before it holds a NUL, so the first occurrence in the JSON is this one.
_PENDING = "\x00resourceVersion\x00"
_PENDING_JSON = encode(_PENDING)


@attrs.define(eq=False)
class Subscription:
    """One open watch: which objects it sees and where its events go.

    *initial*: the objects at the watch's start, when it asked for them (ADDED
    events the caller sends before any delivered one); *resource_version*: the
    version the watch started at.
    """

    store: ObjectStore
    resource: Resource
    namespace: str | None
    selector: FieldSelector
    deliver: Deliver
    closed: bool = False
    initial: list[StoredObject] = attrs.field(factory=list)
    resource_version: int = 0
    _matches: Callable[[FieldValues, Labels], bool] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._matches = self.selector.matcher(self.resource.kind)

    def sees(self, obj: StoredObject | None) -> bool:
        if obj is None:
            return False
        if self.namespace is not None and not obj.key.startswith(self.namespace + "/"):
            return False
        return self._matches(obj.fields, obj.labels)

    def event_for(self, change: Change) -> WatchEvent | None:
        """The event this watch gets for *change*: an object entering the
        selection is ADDED, one leaving it is DELETED (as kube-apiserver does)."""
        if change.resource != self.resource:
            return None
        type = event_type(change, self.sees)
        return None if type is None else WatchEvent(type, change.new.data)

    def bookmark(self) -> None:
        """Deliver a BOOKMARK at the current resourceVersion, in order with the events."""
        with self.store._lock:
            if not self.closed:
                self.deliver(bookmark(self.resource, self.store._rv))

    def close(self) -> None:
        with self.store._lock:
            self.closed = True
            self.initial = []
            self.store._subscriptions.discard(self)


@attrs.define(eq=False)
class ObjectStore:
    """Objects of every known resource, with etcd-like resourceVersions.

    *service_cluster_ip_range*: kube-apiserver's ``--service-cluster-ip-range``, one CIDR or two
    (one a family, the first primary), where Services' ClusterIPs come from (see
    :mod:`._service_alloc`); a bad one → ValueError.
    """

    history_limit: int = DEFAULT_HISTORY
    service_cluster_ip_range: str = DEFAULT_SERVICE_CLUSTER_IP_RANGE
    _lock: threading.Lock = attrs.field(init=False, factory=threading.Lock)
    _rv: int = attrs.field(init=False, default=1)
    _collections: dict[Resource, Collection] = attrs.field(init=False, factory=dict)
    _history: collections.deque[Change] = attrs.field(init=False, factory=collections.deque)
    _oldest: int = attrs.field(init=False, default=1)  # versions below this are compacted
    _subscriptions: set[Subscription] = attrs.field(init=False, factory=set)
    _unserved: set[Resource] = attrs.field(init=False, factory=set)  # CRDs not installed
    # What the stored Services hold (ClusterIPs, NodePorts), kept by every commit of one.
    _allocations: ServiceAllocator = attrs.field(init=False)
    # Watches counted, not served (a benchmark's thousands of agents): see :mod:`._virtual`.
    virtual_watches: VirtualWatches = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._allocations = ServiceAllocator.from_text(self.service_cluster_ip_range)
        self.virtual_watches = VirtualWatches(self)

    @property
    def resource_version(self) -> int:
        with self._lock:
            return self._rv

    def footprint(self) -> dict[str, dict[str, int]]:
        """Per resource plural: how many objects and how many bytes of JSON the store holds."""
        with self._lock:
            return {
                res.plural: {
                    "objects": len(coll.objects),
                    "bytes": sum(len(obj.data) for obj in coll.objects.values()),
                }
                for res, coll in self._collections.items()
                if coll.objects
            }

    @property
    def oldest_resource_version(self) -> int:
        """The oldest version still readable (older ones are compacted)."""
        with self._lock:
            return self._oldest

    # ---- reads ---------------------------------------------------------------

    def get(self, resource: Resource, name: str, namespace: str | None = None) -> dict[str, Any]:
        with self._lock:
            obj = self._collection(resource).objects.get(_key(resource, namespace, name))
        if obj is None:
            raise _not_found(resource, name)
        return obj.decode()

    def list(
        self, resource: Resource, namespace: str | None = None, selector: FieldSelector = FieldSelector()
    ) -> tuple[list[dict[str, Any]], int]:
        """Every matching object now (private copies, in key order) and the list's resourceVersion."""
        result = self.read(resource, namespace, selector, ListPlan())
        return [obj.decode() for obj in result.items], result.resource_version

    def read(self, resource: Resource, namespace: str | None, selector: FieldSelector, plan: ListPlan) -> ListResult:
        """One list answer as *plan* says (see :meth:`flock.apiserver._selectors.ListQuery.plan`).

        Raises StatusError: 504 "Too large resource version" for a version not reached yet
        (retry after 1 s when the watch cache answers, which has waited for it); 410 Expired
        for an exact version compacted away (a continue token's: with the token for the rest
        at the latest version).
        """
        with self._lock:
            at = read_version(plan, self._rv, self._oldest)
            return self._select_locked(resource, namespace, selector, at, plan.start, plan.limit)

    # ---- writes --------------------------------------------------------------

    def create(self, resource: Resource, obj: Mapping[str, Any], namespace: str | None = None) -> dict[str, Any]:
        """Create *obj*; without a name, one made from ``metadata.generateName`` (as upstream:
        the prefix, cut to 58 characters, and 5 random ones; retried on a clash, as 1.32 does)."""
        meta = obj.get("metadata") if isinstance(obj, Mapping) else None
        if not isinstance(meta, Mapping) or meta.get("name"):
            return self._create(resource, obj, namespace)
        prefix = meta.get("generateName")
        if not isinstance(prefix, str) or not prefix:
            return self._create(resource, obj, namespace)
        for attempt in range(_GENERATE_NAME_TRIES):
            named = {**obj, "metadata": {**meta, "name": generate_name(prefix)}}
            try:
                return self._create(resource, named, namespace)
            except StatusError as exc:
                if exc.reason != "AlreadyExists" or attempt == _GENERATE_NAME_TRIES - 1:
                    raise
        raise AssertionError("unreachable")

    def _create(self, resource: Resource, obj: Mapping[str, Any], namespace: str | None) -> dict[str, Any]:
        new = admitted(resource, obj, namespace)
        _created(new)
        with self._lock:
            key = _key(resource, new["metadata"].get("namespace"), new["metadata"]["name"])
            if key in self._collection(resource).objects:
                raise _already_exists(resource, new["metadata"]["name"])
            self._check_custom_locked(resource, new)
            self._admit_new_locked(resource, key, new)
            return self._commit(resource, key, "ADDED", None, new)

    def bulk_create(self, resource: Resource, objects: Iterable[dict[str, Any]], namespace: str | None = None) -> int:
        """Create many objects fast (a benchmark's cluster); returns how many.

        Each is admitted and versioned as :meth:`create` does, but the dicts are taken
        over, not copied: they may be changed.  See :meth:`create_prepared`.
        """
        return self.create_prepared(resource, (prepare_new(resource, obj, namespace) for obj in objects))

    def create_prepared(self, resource: Resource, objects: Iterable[NewObject]) -> int:
        """Create objects :func:`prepare_new` made (on any process); returns how many.

        An object that exists already → 409, after the ones before it were created.
        Holds the lock :data:`_BULK_CHUNK` objects at a time, so a server keeps
        answering meanwhile.
        """
        count = 0
        chunk: list[NewObject] = []
        for obj in objects:
            chunk.append(obj)
            if len(chunk) >= _BULK_CHUNK:
                count += self._create_all(resource, chunk)
                chunk = []
        return count + self._create_all(resource, chunk)

    def update(self, resource: Resource, obj: Mapping[str, Any], namespace: str | None = None) -> dict[str, Any]:
        """Replace an object; a stale ``metadata.resourceVersion`` → 409 Conflict."""
        new = admitted(resource, obj, namespace)
        with self._lock:
            return self._replace_locked(resource, new)

    def patch(
        self,
        resource: Resource,
        name: str,
        patch: Any,
        namespace: str | None = None,
        patch_type: str = MERGE_PATCH,
    ) -> dict[str, Any]:
        """Apply a patch of *patch_type* (default a JSON merge patch, RFC 7386: maps merge, null
        deletes, lists are replaced; see :mod:`flock.apiserver._patch` for the others).

        A ``metadata.resourceVersion`` in the patched object is a precondition (409 when stale).
        """
        if patch_type == JSON_PATCH:
            if not isinstance(patch, list):
                raise StatusError(400, f"a JSON patch must be a list, got {type(patch).__name__}")
        elif not isinstance(patch, Mapping):
            raise StatusError(400, f"a merge patch must be an object, got {type(patch).__name__}")
        if patch_type == STRATEGIC_MERGE_PATCH and resource.custom:
            raise StatusError(
                415,
                f"the body of the request was in an unknown format - accepted media types include: "
                f"{JSON_PATCH}, {MERGE_PATCH}, {APPLY_PATCH}",
            )
        with self._lock:
            old = self._collection(resource).objects.get(_key(resource, namespace, name))
            if old is None:
                raise _not_found(resource, name)
            if patch_type == JSON_PATCH:
                merged = json_patch(old.decode(), patch)
            elif patch_type == STRATEGIC_MERGE_PATCH:
                merged = strategic_merge_patch(old.decode(), patch)
            elif patch_type == MERGE_PATCH:
                merged = merge_patch(old.decode(), patch)
            else:
                raise StatusError(
                    415, f"unsupported patch type {patch_type!r}: expected one of {', '.join(PATCH_TYPES)}"
                )
            if not isinstance(merged, dict):
                raise StatusError(422, f"the patched {resource.kind} is not an object")
            merged.setdefault("metadata", {})["name"] = name
            return self._replace_locked(resource, admitted(resource, merged, namespace, owned=True))

    def apply(
        self, resource: Resource, name: str, applied: Mapping[str, Any], manager: str, namespace: str | None = None
    ) -> tuple[dict[str, Any], bool]:
        """Server-side apply by *manager* (simplified: see :mod:`flock.apiserver._patch`); creates the
        object when it is absent.  Returns the object and whether it was created."""
        if not isinstance(applied, Mapping):
            raise StatusError(400, f"an applied configuration must be an object, got {type(applied).__name__}")
        meta: Mapping[str, Any] = applied.get("metadata") or {}
        if not isinstance(meta, Mapping):
            raise StatusError(400, "metadata must be an object in an applied configuration")
        if meta.get("name") not in (None, name):
            raise StatusError(400, "the name of the object does not match the name on the URL")
        for field in ("apiVersion", "kind"):
            want = resource.api_version if field == "apiVersion" else resource.kind
            if applied.get(field) != want:
                raise StatusError(
                    400, f"{field} must be {want!r} in an applied configuration, got {applied.get(field)!r}"
                )
        if meta.get("resourceVersion"):
            raise StatusError(
                400, "metadata.resourceVersion: Invalid value: must not be set in an applied configuration"
            )
        with self._lock:
            key = _key(resource, namespace, name)
            old = self._collection(resource).objects.get(key)
            merged = apply_patch(None if old is None else old.decode(), applied, manager)
            merged.setdefault("metadata", {})["name"] = name
            new = admitted(resource, merged, namespace, owned=True)
            if old is not None:
                return self._replace_locked(resource, new), False
            _created(new)
            self._check_custom_locked(resource, new)
            self._admit_new_locked(resource, key, new)
            return self._commit(resource, key, "ADDED", None, new), True

    def crd(self, resource: Resource) -> dict[str, Any] | None:
        """The stored CustomResourceDefinition of *resource*, if any."""
        with self._lock:
            stored = self._collection(CUSTOMRESOURCEDEFINITIONS).objects.get(resource.crd_name)
        return None if stored is None else stored.decode()

    def set_status(
        self,
        resource: Resource,
        name: str,
        status: Any,
        namespace: str | None = None,
        resource_version: str | None = None,
    ) -> dict[str, Any]:
        """Replace only ``status`` (the ``/status`` subresource, as the kubelet writes podIPs)."""
        with self._lock:
            old = self._collection(resource).objects.get(_key(resource, namespace, name))
            if old is None:
                raise _not_found(resource, name)
            new = old.decode()
            new["status"] = copy.deepcopy(status)
            if resource_version:
                new["metadata"]["resourceVersion"] = resource_version
            return self._replace_locked(resource, admitted(resource, new, namespace, owned=True), status=True)

    def delete(
        self, resource: Resource, name: str, namespace: str | None = None, options: DeleteOptions | None = None
    ) -> dict[str, Any]:
        """Delete an object; returns it as deleted, or (a pod given a grace period) as it now is.

        *options* None (a test's direct call): removed at once, as it is.  With DeleteOptions
        (every HTTP DELETE), a Pod is deleted gracefully as kube-apiserver does (see
        :mod:`._deletion`): bound and given a grace, it is only marked (MODIFIED) until a
        DELETE with grace 0 removes it.
        """
        with self._lock:
            key = _key(resource, namespace, name)
            old = self._collection(resource).objects.get(key)
            if old is None:
                raise _not_found(resource, name)
            if options is None or resource != PODS:
                return self._commit(resource, key, "DELETED", old, old.decode())
            outcome = delete_pod(old.decode(), options, datetime.datetime.now(datetime.UTC))
            if outcome.remove:
                return self._commit(resource, key, "DELETED", old, outcome.obj)
            if not outcome.changed:
                return outcome.obj
            return self._commit(resource, key, "MODIFIED", old, outcome.obj)

    def compact(self, *, expire_watches: bool = False) -> int:
        """Forget the history up to now: watches from an older version, exact lists at
        one and continue tokens of one get 410.

        With *expire_watches*, open watches also get an ERROR 410 event (as when
        a real watcher falls out of the apiserver's window).  Returns the
        resourceVersion compacted to.
        """
        with self._lock:
            self._history.clear()
            self._oldest = self._rv
            if expire_watches:
                for sub in list(self._subscriptions):
                    sub.deliver(WatchEvent.of("ERROR", expired("watch", self._oldest).status()))
                    sub.closed = True
                self._subscriptions.clear()
            return self._rv

    # ---- custom resources -------------------------------------------------------

    def uninstall(self, resource: Resource) -> int:
        """*resource*'s CRD is deleted (or was never installed): its objects are deleted (watches
        get the DELETED events; open ones then see nothing more) and every request for it answers
        404 until :meth:`install`.  Returns how many objects went."""
        with self._lock:
            if resource in self._unserved:
                return 0
            coll = self._collection(resource)
            keys = list(coll.keys)
            for key in keys:
                old = coll.objects[key]
                self._commit(resource, key, "DELETED", old, old.decode())
            self._unserved.add(resource)
        return len(keys)

    def install(self, resource: Resource) -> None:
        """*resource*'s CRD is created: it is served (empty) from now on."""
        with self._lock:
            self._unserved.discard(resource)

    def served(self, resource: Resource) -> bool:
        with self._lock:
            return resource not in self._unserved

    # ---- watches -------------------------------------------------------------

    def watch(
        self,
        resource: Resource,
        namespace: str | None,
        selector: FieldSelector,
        deliver: Deliver,
        *,
        since: int | None = None,
        initial: bool = False,
    ) -> Subscription:
        """Open a watch: from *since* (its later history replayed through *deliver*), or,
        with None, from now; *initial*: the matching objects now go in the subscription's
        ``initial`` (the caller sends them first).  Then live events.

        Raises StatusError 410 when *since* is older than the kept history, 504
        "Too large resource version" when it is newer than the store.
        """
        sub = Subscription(self, resource, namespace, selector, deliver)
        with self._lock:
            self._collection(resource)  # 404 for a resource not served
            if since is not None:
                if since < self._oldest:
                    raise expired(since, self._oldest)
                if since > self._rv:
                    # What a real API server answers a client whose version is
                    # from before a restore or an empty restart.
                    raise too_large(since, self._rv)
                for change in self._history:
                    if change.rv > since and (ev := sub.event_for(change)) is not None:
                        deliver(ev)
            if initial:
                sub.initial = self._select_locked(resource, namespace, selector, self._rv, "", 0).items
            sub.resource_version = self._rv
            self._subscriptions.add(sub)
        return sub

    def start_watch(
        self, resource: Resource, namespace: str | None, selector: FieldSelector, deliver: Deliver, query: WatchQuery
    ) -> Subscription | WatchEvent:
        """The watch *query* (checked and defaulted) asks for, as the watch cache starts it; or
        the ERROR event a stream answers instead (200, then that one event): a WatchList not
        older than a version the store has not reached (the caller has waited for it, see
        :attr:`WatchQuery.minimum`), a version compacted away.

        Raises StatusError 504 for a version ahead of the store (the fake's stand-in for a
        watch cache behind its client: a restored or wiped etcd).
        """
        if query.initial_events:
            current = self.resource_version
            if query.minimum > current:
                return WatchEvent.of("ERROR", too_large(query.minimum, current, 1).status())
            return self.watch(resource, namespace, selector, deliver, initial=True)
        if query.from_now:
            return self.watch(resource, namespace, selector, deliver)
        try:
            return self.watch(resource, namespace, selector, deliver, since=query.minimum)
        except StatusError as err:
            if err.code != 410:
                raise
            # cacher.Watch: "once we have passed authn/authz/admission, and successfully parsed a
            # resource version, other errors must fail with a watch event of type ERROR".
            return WatchEvent.of("ERROR", err.status())

    # ---- internals -------------------------------------------------------------

    def _collection(self, resource: Resource) -> Collection:
        if resource in self._unserved:
            raise _not_served()
        found = self._collections.get(resource)
        if found is None:
            fields = SUPPORTED_FIELDS.get(resource.kind, ())
            node = fields.index(NODE_FIELD) if NODE_FIELD in fields else None
            found = self._collections[resource] = Collection(node_field=node)
        return found

    def _select_locked(
        self, resource: Resource, namespace: str | None, selector: FieldSelector, at: int, start: str, limit: int
    ) -> ListResult:
        return select(
            self._collection(resource), self._history, self._rv, resource, namespace, selector, at, start, limit
        )

    def _commit(
        self, resource: Resource, key: str, kind: str, old: StoredObject | None, new: dict[str, Any]
    ) -> dict[str, Any]:
        self._rv += 1
        new["metadata"]["resourceVersion"] = str(self._rv)
        if old is not None and kind == "DELETED":
            fields, labels = old.fields, old.labels
        else:
            fields, labels = field_values(new, resource.kind), object_labels(new)
        self._commit_stored(resource, kind, old, StoredObject(key, encode(new), self._rv, fields, labels))
        return new

    def _commit_stored(
        self, resource: Resource, kind: str, old: StoredObject | None, stored: StoredObject, *, sort: bool = True
    ) -> None:
        """*stored* (at the version just taken) into the collection, the history and the watches."""
        coll = self._collection(resource)
        if kind == "DELETED":
            coll.remove(stored.key)
        else:
            coll.put(stored, sort=sort)
        if resource == SERVICES:
            self._allocations.record(stored.key, None if kind == "DELETED" else stored.decode())
        change = Change(self._rv, resource, kind, stored.key, old, stored)
        self._history.append(change)
        while len(self._history) > self.history_limit:
            self._oldest = self._history.popleft().rv
        for sub in self._subscriptions:
            if (ev := sub.event_for(change)) is not None:
                sub.deliver(ev)
        self.virtual_watches.count(change)

    def _create_all(self, resource: Resource, objects: Sequence[NewObject]) -> int:
        with self._lock:
            coll = self._collection(resource)
            try:
                for obj in objects:
                    if obj.key in coll.objects:
                        raise _already_exists(resource, obj.name)
                    if resource == SERVICES:
                        obj = self._allocated_locked(resource, obj)
                    self._rv += 1
                    data = obj.data.replace(_PENDING_JSON, b'"%d"' % self._rv, 1)
                    self._commit_stored(
                        resource,
                        "ADDED",
                        None,
                        StoredObject(obj.key, data, self._rv, obj.fields, obj.labels),
                        sort=False,
                    )
            finally:
                coll.keys.sort()
        return len(objects)

    def _allocated_locked(self, resource: Resource, obj: NewObject) -> NewObject:
        """A prepared Service with its addresses and ports (loaded Services are allocated as created ones)."""
        new = json.loads(obj.data)
        self._admit_new_locked(resource, obj.key, new)
        return NewObject(obj.key, obj.name, encode(new), field_values(new, resource.kind), object_labels(new))

    def _check_custom_locked(self, resource: Resource, new: Mapping[str, Any]) -> None:
        """A custom resource whose CRD object is stored: checked against its schema (see :mod:`._crds`)."""
        if not resource.custom:
            return
        crd = self._collection(CUSTOMRESOURCEDEFINITIONS).objects.get(resource.crd_name)
        if crd is not None:
            check_custom(resource, crd.decode(), new)

    def _admit_new_locked(self, resource: Resource, key: str, new: dict[str, Any]) -> None:
        """What a new object needs of the others: a Service's addresses and ports."""
        if resource == SERVICES:
            try:
                self._allocations.admit_create(key, new)
            except Invalid as exc:
                raise invalid(resource, new["metadata"]["name"], exc.field, exc.value, exc.why) from None

    def _admit_change_locked(
        self, resource: Resource, key: str, new: dict[str, Any], old: dict[str, Any], *, status: bool
    ) -> None:
        """An update's checks against the object before it (*status*: a write of the status subresource)."""
        try:
            if resource == SERVICES and status:
                new["spec"] = old["spec"]
                default_ip_modes(new)
                validate_load_balancer_status(new)
            elif resource == SERVICES:
                self._allocations.admit_update(key, new, old)
            elif resource == ENDPOINTSLICES:
                check_endpoint_slice_update(new, old)
        except Invalid as exc:
            raise invalid(resource, new["metadata"]["name"], exc.field, exc.value, exc.why) from None

    def _replace_locked(self, resource: Resource, new: dict[str, Any], *, status: bool = False) -> dict[str, Any]:
        meta = new["metadata"]
        key = _key(resource, meta.get("namespace"), meta["name"])
        stored = self._collection(resource).objects.get(key)
        if stored is None:
            raise _not_found(resource, meta["name"])
        self._check_custom_locked(resource, new)
        old = stored.decode()
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
        # Set by DELETE only (rest.BeforeUpdate keeps them): an update can neither set nor clear them.
        for field in _DELETION_FIELDS:
            if field in old["metadata"]:
                meta[field] = old["metadata"][field]
            else:
                meta.pop(field, None)
        self._admit_change_locked(resource, key, new, old, status=status)
        # As kube-apiserver: the generation counts changes of the desired state (spec), not of metadata or status.
        generation = old["metadata"].get("generation", 1)
        meta["generation"] = generation + 1 if _desired(resource, new) != _desired(resource, old) else generation
        meta["resourceVersion"] = old["metadata"]["resourceVersion"]
        if new == old:
            return old  # a write that changes nothing is no change: no new version, no event
        return self._commit(resource, key, "MODIFIED", stored, new)


def admitted(
    resource: Resource, obj: Mapping[str, Any], namespace: str | None, *, owned: bool = False
) -> dict[str, Any]:
    """*obj* admitted: a private copy unless *owned* (then it may be changed in place)."""
    if not isinstance(obj, Mapping):
        raise StatusError(400, f"expected a {resource.kind} object, got {type(obj).__name__}")
    new: dict[str, Any]
    if owned and isinstance(obj, dict):
        new = obj
    else:
        try:
            new = json.loads(json.dumps(obj))
        except (TypeError, ValueError) as exc:
            raise StatusError(400, f"the {resource.kind} object is not JSON: {exc}") from None
    meta = new.setdefault("metadata", {})
    if not isinstance(meta, dict):
        raise invalid(resource, "?", "metadata", meta, "must be an object")
    name = meta.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise invalid(resource, str(name), "metadata.name", name, "must be a lowercase RFC 1123 subdomain")
    if resource.namespaced:
        ns = namespace or meta.get("namespace") or "default"
        if meta.get("namespace") not in (None, ns):
            raise StatusError(
                400, "the namespace of the provided object does not match the namespace sent on the request"
            )
        meta["namespace"] = ns
    else:
        meta.pop("namespace", None)
    if list(new)[:2] != ["apiVersion", "kind"]:  # first, as the API server writes them
        typed = {"apiVersion": resource.api_version, "kind": resource.kind}
        typed.update(new)
        new.clear()
        new.update(typed)
    new["apiVersion"], new["kind"] = resource.api_version, resource.kind
    if resource == SECRETS:
        return _secret(new, str(name))
    return admit(resource, new)


def prepare_new(resource: Resource, obj: dict[str, Any], namespace: str | None = None) -> NewObject:
    """*obj* (taken over) admitted, stamped and encoded for :meth:`ObjectStore.create_prepared`;
    pure, so any process can do it."""
    new = admitted(resource, obj, namespace, owned=True)
    _created(new)
    meta = new["metadata"]
    meta["resourceVersion"] = _PENDING
    return NewObject(
        _key(resource, meta.get("namespace"), meta["name"]),
        meta["name"],
        encode(new),
        field_values(new, resource.kind),
        object_labels(new),
    )


def _desired(resource: Resource, obj: Mapping[str, Any]) -> Any:
    """What ``generation`` counts changes of: the spec (an EndpointSlice's: its endpoints, ports and type;
    an AddressGroup's: all but its metadata)."""
    if resource == ENDPOINTSLICES:
        return obj.get("addressType"), obj.get("endpoints"), obj.get("ports")
    if resource.custom and not resource.requires_spec:
        # a custom resource without spec or status subresource: every change but metadata's
        return {k: v for k, v in obj.items() if k != "metadata"}
    return obj.get("spec")


def generate_name(prefix: str) -> str:
    """A name for ``generateName`` *prefix*: at most 58 characters of it and 5 random ones."""
    return prefix[:58] + "".join(secrets.choice(_NAME_ALPHABET) for _ in range(5))


def _key(resource: Resource, namespace: str | None, name: str) -> str:
    return f"{namespace or 'default'}/{name}" if resource.namespaced else name


def _created(new: dict[str, Any]) -> None:
    """What the API server sets on a new object."""
    meta = new["metadata"]
    for field in _DELETION_FIELDS:
        meta.pop(field, None)  # rest.BeforeCreate: a new object is not being deleted
    meta["uid"] = str(uuid.uuid4())
    meta["creationTimestamp"] = _now()
    meta["generation"] = 1


def _secret(new: dict[str, Any], name: str) -> dict[str, Any]:
    """A Secret as kube-apiserver stores it: ``stringData`` folded into ``data``
    (base64), every ``data`` value base64, keys as Kubernetes allows them."""
    data = new.get("data") or {}
    if not isinstance(data, dict):
        raise invalid(SECRETS, name, "data", "<object>", "must be a map of key to base64 value")
    string_data = new.pop("stringData", None) or {}
    if not isinstance(string_data, dict):
        raise invalid(SECRETS, name, "stringData", "<object>", "must be a map of key to string")
    for key, value in string_data.items():
        if not isinstance(value, str):
            raise invalid(SECRETS, name, f"stringData[{key}]", "<value>", "must be a string")
        data[key] = base64.b64encode(value.encode()).decode()
    for key, value in data.items():
        if not isinstance(key, str) or not _SECRET_KEY.match(key):
            raise invalid(SECRETS, name, "data", key, "keys must consist of alphanumeric characters, '-', '_' or '.'")
        try:
            base64.b64decode(value, validate=True)
        except (TypeError, ValueError):
            # Never echo a value: it is a secret.
            raise invalid(SECRETS, name, f"data[{key}]", "<value>", "must be base64") from None
    new["data"] = data
    new.setdefault("type", "Opaque")
    return new


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _not_found(resource: Resource, name: str) -> StatusError:
    group = f"{resource.plural}.{resource.group}" if resource.group else resource.plural
    return StatusError(404, f'{group} "{name}" not found', details={"name": name, "kind": resource.plural})


def _not_served() -> StatusError:
    """What kube-apiserver answers for a resource it does not serve (a CRD not installed)."""
    return StatusError(404, "the server could not find the requested resource")


def _already_exists(resource: Resource, name: str) -> StatusError:
    return StatusError(
        409,
        f'{resource.plural} "{name}" already exists',
        reason="AlreadyExists",
        details={"name": name, "kind": resource.plural},
    )


__all__ = ["ListResult", "NewObject", "ObjectStore", "StoredObject", "Subscription", "WatchEvent", "prepare_new"]
