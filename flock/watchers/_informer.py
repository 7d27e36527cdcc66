"""A list+watch cache of one kind of object (client-go's reflector, in Trio).

The informer lists, then watches from the list's resourceVersion, applying
each event to its cache and telling its owner about every change.  It knows
its source only through :class:`ListWatchSource`, so the same loop runs over
HTTP (:class:`flock.watchers.KubeSource`) and over an in-memory store in
virtual-time tests.
"""

from __future__ import annotations

import enum
import logging
import math
import random
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

import attrs
import trio

from flock.nursery import Backoff

from ._errors import KubeApiError, ResourceExpired, ResourceVersionTooLarge, TransientKubeError, error_for_status

log = logging.getLogger("flock.watchers")

Object = Mapping[str, Any]


# The annotation on the BOOKMARK that ends a WatchList's initial events (KEP-3157).
INITIAL_EVENTS_END = "k8s.io/initial-events-end"


@attrs.frozen
class ListOptions:
    """One list request, as client-go's reflector and pager make them.

    *resource_version*: ``""`` the most recent (a consistent read), ``"0"`` any
    (the API server's watch cache), else not older than it (or exactly it with
    ``resource_version_match="Exact"``).  *limit* 0: no limit.  *continue_*:
    the previous page's token; then *resource_version* and
    *resource_version_match* are empty, as the API server requires.
    """

    resource_version: str = ""
    resource_version_match: str = ""  # "", "NotOlderThan" or "Exact"
    limit: int = 0
    continue_: str = ""


@attrs.frozen
class ListPage:
    """What a list answer says besides its items (its ``metadata``)."""

    resource_version: str
    continue_: str = ""
    remaining_item_count: int | None = None


class ListWatchSource(Protocol):
    """Where an informer gets its objects; errors are flock.watchers' KubeError family."""

    async def list(self, options: ListOptions, on_item: Callable[[Object], None]) -> ListPage:
        """One list request.  Each item goes to *on_item* as soon as it is decoded, in
        the answer's order, and is not kept: no whole list is ever held.  410 (an
        expired continue token) → :class:`ResourceExpired`."""
        ...

    def watch(
        self, resource_version: str, timeout_seconds: int, *, send_initial_events: bool = False
    ) -> AbstractAsyncContextManager[AsyncIterator[Object]]:
        """Events after *resource_version* (bookmarks allowed).  *send_initial_events*:
        a WatchList (``sendInitialEvents=true``, ``resourceVersionMatch=NotOlderThan``):
        first an ADDED event for every object as of *resource_version* ("" = the most
        recent), then a BOOKMARK annotated :data:`INITIAL_EVENTS_END`, then changes.
        A server that does not offer it answers :class:`KubeApiError` (422 or 400)."""
        ...

    async def get(self, namespace: str | None, name: str) -> Object | None: ...


@attrs.frozen
class InformerSettings:
    watch_seconds: int = 300  # timeoutSeconds of each watch: the server ends it cleanly
    request_seconds: float = 30.0  # a request (a page, a watch's start) without progress for this long has stalled
    # A full relist without a cause (every object again from the API server): never by default.
    # The watch is the truth; a relist follows a 410, a history reset or a broken watch.
    relist_seconds: float = math.inf
    # Capped at 20 s (24 s with jitter): an API server back from a restart is
    # relisted within 30 s, however long it was away.
    backoff: Backoff = Backoff(initial=0.5, cap=20.0, jitter=0.2)
    # A relist after a 410 or a reset waits a random [0, relist_spread) s first: an API server
    # that compacts or restarts sends every agent of the cluster its 410 at the same moment.
    relist_spread: float = 2.0
    page_size: int = 500  # limit of each list request (client-go's pager); 0: unpaged
    watch_list: bool = True  # try WatchList (sendInitialEvents) first; lists when the server refuses


class ChangeType(enum.Enum):
    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"


@attrs.frozen
class Change:
    type: ChangeType
    key: str
    object: Any  # the value the informer keeps (its transform's result); for DELETED the last one known


class ChangeListener(Protocol):
    """Another consumer of one informer's stream, called synchronously and in order."""

    def on_change(self, change: Change) -> None:
        """Every change, right after the informer's own *on_change*."""

    def on_listed(self, objects: Mapping[str, Any]) -> None:
        """A full read has been applied (every change it found was delivered before);
        *objects* is the informer's cache now: what the cluster holds."""

    def on_progress(self, resource_version: str) -> None:
        """The informer's resourceVersion moved (an event, a list or a BOOKMARK), after
        every change up to it was delivered."""


class HistoryReset(Exception):
    """A watch event older than what the cache has seen: the API server's store was reset or restored."""


class _WatchListRefused(Exception):
    """The server does not offer WatchList (it refused sendInitialEvents or ignored it)."""


class _WatchListEndedEarly(Exception):
    """A WatchList's stream ended cleanly before its initial events' bookmark."""


def _rv(obj: Object) -> str:
    meta = obj.get("metadata")
    return str(meta.get("resourceVersion", "")) if isinstance(meta, Mapping) else ""


def identity(obj: Object) -> Any:
    return obj


@attrs.define(eq=False)
class Informer:
    """Keeps :attr:`objects` equal to the server's matching objects, as values.

    *transform* turns each raw object into the value kept (default: the object
    itself), right after it is decoded: no raw object outlives the page or the
    event it came in.  *key* names a raw object in the cache.  *on_change* is
    called synchronously, in order, for every change of a value (a MODIFIED
    event whose value equals the cached one is no change), including the
    differences a relist finds.  *listeners* follow the same stream.

    Reading the collection (client-go's reflector): first a WatchList
    (``sendInitialEvents``) when ``settings.watch_list``, served by the API
    server's watch cache and streamed; a server that refuses it (or ignores it)
    is read with lists from then on: the first list at ``resourceVersion=0``
    (the watch cache), paged by ``settings.page_size`` where the server pages;
    a relist at the last version seen (the cache again); a relist after a
    list's own 410 or a reset at ``""`` (a consistent read, paged).  Each full
    read is applied to the cache as it arrives; what it did not see is deleted
    at its end.  Pages and list bodies are
    decoded item by item (:class:`flock.watchers.ListDecoder`), never whole.

    Error handling: 410 Gone (at watch start, as an ERROR event, or on a page's
    expired continue token), "too large resource version" (the API server came
    back with a history that starts over) and an event older than the cache's
    resourceVersion → read the collection again after a random [0,
    ``relist_spread``) s: after a watch's 410 at the version seen (the watch
    cache), after the others with a consistent read.  TransientKubeError (connection trouble, 5xx, 429) and a
    stalled request (no progress within ``request_seconds``) → retry after
    exponential backoff with jitter (at most 24 s); a watch resumes from the
    last resourceVersion seen.  Anything else (401, 403, 404 of the collection,
    bugs) propagates to the supervisor.
    """

    source: ListWatchSource
    key: Callable[[Object], str]
    on_change: Callable[[Change], None]
    settings: InformerSettings = InformerSettings()
    name: str = "informer"
    rng: random.Random = attrs.field(factory=random.Random)
    listeners: tuple[ChangeListener, ...] = ()
    transform: Callable[[Object], Any] = identity
    _objects: dict[str, Any] = attrs.field(init=False, factory=dict)
    _resource_version: str = attrs.field(init=False, default="")
    _ready: trio.Event = attrs.field(init=False, factory=trio.Event)
    _advanced: trio.Event = attrs.field(init=False, factory=trio.Event)
    _watch_list: bool = attrs.field(init=False, default=True)
    _consistent: bool = attrs.field(init=False, default=False)  # the next list must not be served stale
    _must_read: bool = attrs.field(init=False, default=True)  # the next round reads the collection whole
    _read_at: float = attrs.field(init=False, default=-math.inf)
    _started: trio.TaskStatus[None] | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        self._watch_list = self.settings.watch_list

    @property
    def objects(self) -> Mapping[str, Any]:
        return self._objects

    @property
    def resource_version(self) -> str:
        return self._resource_version

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    @property
    def uses_watch_list(self) -> bool:
        """Whether the collection is read with WatchList (False once the server refused it)."""
        return self._watch_list

    async def wait_ready(self) -> None:
        await self._ready.wait()

    async def wait_synced(self, resource_version: str) -> None:
        """Until the cache reflects *resource_version* or later (read-your-writes).

        Compares versions as integers, as etcd hands them out; the caller owns the deadline.
        """
        while not self._resource_version or int(self._resource_version) < int(resource_version):
            await self._advanced.wait()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Read the collection, then watch forever; started() once it has been read whole."""
        settings = self.settings
        failures = 0
        self._must_read = True
        self._started = task_status  # each run reports started() once (a supervisor may rerun it)
        ignored = 0  # WatchLists in a row that ended cleanly before their bookmark
        spread = False  # the next relist follows a 410 or a reset: spread it
        while True:
            progressed = False
            try:
                if spread:
                    spread = False
                    await trio.sleep(self.rng.random() * settings.relist_spread)
                if trio.current_time() - self._read_at >= settings.relist_seconds:
                    self._must_read = True
                if self._must_read and self._watch_list:
                    # One stream: the initial events, then the watch goes on.
                    try:
                        progressed = await self._watch(initial_events=True)
                        ignored = 0
                    except _WatchListEndedEarly as exc:
                        # A server shutting down (or a proxy) may end a stream early; one that keeps
                        # ending it before the bookmark ignores sendInitialEvents.
                        ignored += 1
                        if ignored < 3:
                            raise TransientKubeError(str(exc)) from None
                        self._refuse_watch_list(f"{exc} {ignored} times")
                        continue
                    except _WatchListRefused as exc:
                        self._refuse_watch_list(str(exc))
                        continue
                else:
                    if self._must_read:
                        await self._list()
                        self._read()
                    progressed = await self._watch(initial_events=False)
                failures = 0
            except (HistoryReset, ResourceExpired) as exc:
                # A watch's 410 relists at the version seen, from the watch cache; what says the
                # cache itself cannot be trusted (a reset history, a version it has not reached)
                # relists with a consistent read, as does a list's expired continue token (_list).
                if isinstance(exc, HistoryReset | ResourceVersionTooLarge):
                    self._consistent = True
                if isinstance(exc, HistoryReset):
                    log.warning("%s: %s; relisting", self.name, exc, extra={"informer": self.name, "error": str(exc)})
                else:
                    log.info(
                        "%s: resourceVersion %s expired, relisting",
                        self.name,
                        self._resource_version or "(none)",
                        extra={"informer": self.name, "error": str(exc)},
                    )
                self._must_read, spread = True, True
            except (TransientKubeError, trio.TooSlowError) as exc:
                if progressed:
                    failures = 0
                delay = settings.backoff.delay(failures, self.rng.random())
                failures += 1
                log.warning(
                    "%s: %s; retrying in %.2fs",
                    self.name,
                    str(exc) or f"request stalled (no answer within {settings.request_seconds:g} s)",
                    delay,
                    extra={"informer": self.name, "attempt": failures},
                )
                await trio.sleep(delay)

    def _refuse_watch_list(self, why: str) -> None:
        self._watch_list = False
        log.info(
            "%s: %s; reading it with paged lists from now on",
            self.name,
            why,
            extra={"informer": self.name, "error": why},
        )

    def _read(self) -> None:
        """The collection has been read whole: the watch resumes from here; the first time in
        this run, started()."""
        self._must_read = False
        self._read_at = trio.current_time()
        self._ready.set()
        if self._started is not None:
            self._started.started()
            self._started = None

    async def _list(self) -> None:
        """Read the whole collection with list requests (pages where the server pages)."""
        settings = self.settings
        if self._consistent:
            # After a 410 or a reset: a consistent read (from etcd, so paged).
            first = ListOptions(limit=settings.page_size)
        elif self._resource_version:
            # A relist: not older than what we have seen, from the watch cache (client-go leaves
            # the limit off here: a limit would send it to etcd).
            first = ListOptions(self._resource_version, "NotOlderThan")
        else:
            first = ListOptions("0", limit=settings.page_size)  # the watch cache, whatever its age
        seen: set[str] = set()
        options = first
        list_rv = ""
        while True:
            # A stall is no progress for request_seconds: every item moves the deadline on, so a
            # big unpaged answer streaming steadily is never cut (at 150,000 pods it takes a while).
            with trio.CancelScope(deadline=trio.current_time() + settings.request_seconds) as scope:

                def item(obj: Object, scope: trio.CancelScope = scope) -> None:
                    scope.deadline = trio.current_time() + settings.request_seconds
                    self._swept(seen, obj)

                try:
                    page = await self.source.list(options, item)
                except ResourceExpired:
                    self._consistent = True  # the continue token's version was compacted
                    raise
            if scope.cancelled_caught:
                raise trio.TooSlowError
            list_rv = list_rv or page.resource_version
            if not page.continue_:
                break
            options = ListOptions(limit=settings.page_size, continue_=page.continue_)
        self._consistent = False
        self._end_sweep(seen, list_rv)

    async def _watch(self, *, initial_events: bool) -> bool:
        """One watch from the version seen; returns whether any event arrived.

        *initial_events*: a WatchList: the initial events are swept into the cache
        up to the annotated BOOKMARK (the collection read whole), then the watch goes on.
        """
        settings = self.settings
        seen: set[str] | None = set() if initial_events else None  # None once the initial events are in
        rv = "" if initial_events and self._consistent else self._resource_version
        progressed = False
        opened = trio.current_time()
        with trio.fail_after(settings.watch_seconds + settings.request_seconds):
            try:
                async with self.source.watch(rv, settings.watch_seconds, send_initial_events=initial_events) as events:
                    async for event in events:
                        progressed = True
                        if seen is None:
                            self._apply(event)
                            continue
                        kind, obj = event.get("type"), event.get("object") or {}
                        if kind == "BOOKMARK":
                            meta = obj.get("metadata") or {}
                            if (meta.get("annotations") or {}).get(INITIAL_EVENTS_END) != "true":
                                raise _WatchListRefused("the server ignored sendInitialEvents (a bookmark came first)")
                            self._consistent = False
                            self._end_sweep(seen, _rv(obj))
                            seen = None
                            self._read()
                        elif kind in ("ADDED", "MODIFIED"):
                            self._swept(seen, obj)
                        elif kind == "ERROR":
                            raise error_for_status(int(obj.get("code") or 500), obj)
                        else:
                            raise _WatchListRefused(f"the server ignored sendInitialEvents (a {kind} event came first)")
            except KubeApiError as exc:
                if seen is not None and exc.status in (400, 422):
                    raise _WatchListRefused(f"the server refused WatchList ({exc})") from None
                raise
        if seen is not None:
            # A server that offers WatchList ends its initial events with the bookmark, however few.
            raise _WatchListEndedEarly("the WatchList ended before its initial events' bookmark")
        if not progressed and trio.current_time() - opened < settings.watch_seconds / 2:
            # A server or proxy that ends watches at once must not make us spin.
            raise TransientKubeError("watch ended at once without an event")
        return progressed

    def _swept(self, seen: set[str], obj: Object) -> None:
        """One object of a full read: into the cache, the difference delivered."""
        key = self.key(obj)
        seen.add(key)
        self._put(key, self.transform(obj))

    def _end_sweep(self, seen: set[str], resource_version: str) -> None:
        """A full read has ended: what it did not see is gone."""
        gone = [key for key in self._objects if key not in seen]
        for key in gone:
            self._emit(Change(ChangeType.DELETED, key, self._objects.pop(key)))
        for listener in self.listeners:
            listener.on_listed(self._objects)
        # The version moves after the changes it covers were delivered (see ChangeListener.on_progress).
        self._set_resource_version(resource_version)

    def _put(self, key: str, value: Any) -> None:
        before = self._objects.get(key)
        if before is None:
            self._objects[key] = value
            self._emit(Change(ChangeType.ADDED, key, value))
        elif before is not value and before != value:
            self._objects[key] = value
            self._emit(Change(ChangeType.MODIFIED, key, value))

    def _apply(self, event: Object) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            raise error_for_status(int(obj.get("code") or 500), obj)
        if kind == "BOOKMARK":
            self._set_resource_version(_rv(obj))
            return
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            raise TransientKubeError(f"unknown watch event type {kind!r}")
        rv = _rv(obj)
        if rv.isdigit() and self._resource_version.isdigit() and int(rv) < int(self._resource_version):
            raise HistoryReset(
                f"event at resourceVersion {rv} after {self._resource_version}: the server's history restarted"
            )
        key = self.key(obj)
        if kind == "DELETED":
            before = self._objects.pop(key, None)
            if before is not None:
                self._emit(Change(ChangeType.DELETED, key, before))
        else:
            self._put(key, self.transform(obj))
        # The version moves after the change it covers was delivered (see ChangeListener.on_progress).
        self._set_resource_version(rv)

    def _emit(self, change: Change) -> None:
        self.on_change(change)
        for listener in self.listeners:
            listener.on_change(change)

    def _set_resource_version(self, resource_version: str) -> None:
        if resource_version and resource_version != self._resource_version:
            self._resource_version = resource_version
            self._advanced.set()
            self._advanced = trio.Event()
            for listener in self.listeners:
                listener.on_progress(resource_version)
