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

from ._errors import ResourceExpired, TransientKubeError, error_for_status

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
    request_seconds: float = 30.0  # deadline of a list, and slack on a watch past watch_seconds
    relist_seconds: float = 1800.0  # a full list at least this often bounds any staleness
    # Capped at 20 s (24 s with jitter): an API server back from a restart is
    # relisted within 30 s, however long it was away.
    backoff: Backoff = Backoff(initial=0.5, cap=20.0, jitter=0.2)


class ChangeType(enum.Enum):
    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"


@attrs.frozen
class Change:
    type: ChangeType
    key: str
    object: Object  # the new state; for DELETED the last state known


class ChangeListener(Protocol):
    """Another consumer of one informer's stream, called synchronously and in order."""

    def on_change(self, change: Change) -> None:
        """Every change, right after the informer's own *on_change*."""

    def on_listed(self) -> None:
        """A full list has been applied (every change it found was delivered before)."""

    def on_progress(self, resource_version: str) -> None:
        """The informer's resourceVersion moved (an event, a list or a BOOKMARK), after
        every change up to it was delivered."""


class HistoryReset(Exception):
    """A watch event older than what the cache has seen: the API server's store was reset or restored."""


def _rv(obj: Object) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))


@attrs.define(eq=False)
class Informer:
    """Keeps :attr:`objects` equal to the server's matching objects.

    *key* names an object in the cache; *on_change* is called synchronously,
    in order, for every change (including the differences a relist finds).
    *listeners* follow the same stream (one informer feeding several caches).

    Error handling: 410 Gone (at watch start or as an ERROR event) and "too
    large resource version" (the API server came back with a history that
    starts over: restarted empty, or restored) → relist at once and replace
    the cache; so does an event older than the cache's resourceVersion (the
    same reset, seen from inside a watch).  TransientKubeError (connection
    trouble, 5xx, 429) and a stalled watch (no event, bookmark or clean end
    within its timeout plus ``request_seconds``) → retry after exponential
    backoff with jitter (at most 24 s); a watch resumes from the last
    resourceVersion seen.  Anything else (401, 403, 404 of the collection,
    bugs) propagates to the supervisor.
    """

    source: ListWatchSource
    key: Callable[[Object], str]
    on_change: Callable[[Change], None]
    settings: InformerSettings = InformerSettings()
    name: str = "informer"
    rng: random.Random = attrs.field(factory=random.Random)
    listeners: tuple[ChangeListener, ...] = ()
    _objects: dict[str, Object] = attrs.field(init=False, factory=dict)
    _resource_version: str = attrs.field(init=False, default="")
    _ready: trio.Event = attrs.field(init=False, factory=trio.Event)
    _advanced: trio.Event = attrs.field(init=False, factory=trio.Event)

    @property
    def objects(self) -> Mapping[str, Object]:
        return self._objects

    @property
    def resource_version(self) -> str:
        return self._resource_version

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    async def wait_ready(self) -> None:
        await self._ready.wait()

    async def wait_synced(self, resource_version: str) -> None:
        """Until the cache reflects *resource_version* or later (read-your-writes).

        Compares versions as integers, as etcd hands them out; the caller owns the deadline.
        """
        while not self._resource_version or int(self._resource_version) < int(resource_version):
            await self._advanced.wait()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """List, then watch forever; started() after the first successful list."""
        settings = self.settings
        failures = 0
        must_list = True
        listed_at = -math.inf
        started = False
        while True:
            progressed = False
            try:
                if must_list or trio.current_time() - listed_at >= settings.relist_seconds:
                    with trio.fail_after(settings.request_seconds):
                        items, rv = await self.source.list()
                    self._replace(items, rv)
                    listed_at, must_list, failures = trio.current_time(), False, 0
                    if not started:
                        started = True
                        self._ready.set()
                        task_status.started()
                opened = trio.current_time()
                with trio.fail_after(settings.watch_seconds + settings.request_seconds):
                    async with self.source.watch(self._resource_version, settings.watch_seconds) as events:
                        async for event in events:
                            progressed = True
                            self._apply(event)
                if not progressed and trio.current_time() - opened < settings.watch_seconds / 2:
                    # A server or proxy that ends watches at once must not make us spin.
                    raise TransientKubeError(f"{self.name}: watch ended at once without an event")
                failures = 0
            except HistoryReset as exc:
                log.warning("%s: %s; relisting", self.name, exc, extra={"informer": self.name, "error": str(exc)})
                must_list = True
            except ResourceExpired as exc:
                log.info(
                    "%s: resourceVersion %s expired, relisting",
                    self.name,
                    self._resource_version,
                    extra={"informer": self.name, "error": str(exc)},
                )
                must_list = True
            except (TransientKubeError, trio.TooSlowError) as exc:
                if progressed:
                    failures = 0
                delay = settings.backoff.delay(failures, self.rng.random())
                failures += 1
                log.warning(
                    "%s: %s; retrying in %.2fs",
                    self.name,
                    exc or "request stalled",
                    delay,
                    extra={"informer": self.name, "attempt": failures},
                )
                await trio.sleep(delay)

    def _replace(self, items: list[Object], resource_version: str) -> None:
        """Swap in a fresh list, emitting only what differs from the cache."""
        old, new = self._objects, {self.key(obj): obj for obj in items}
        self._objects = new
        for key, obj in new.items():
            before = old.get(key)
            if before is None:
                self._emit(Change(ChangeType.ADDED, key, obj))
            elif _rv(before) != _rv(obj) or before != obj:
                self._emit(Change(ChangeType.MODIFIED, key, obj))
        for key, obj in old.items():
            if key not in new:
                self._emit(Change(ChangeType.DELETED, key, obj))
        # The version moves after the changes it covers were delivered (see ChangeListener.on_progress).
        self._set_resource_version(resource_version)
        for listener in self.listeners:
            listener.on_listed()

    def _apply(self, event: Object) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            raise error_for_status(int(obj.get("code") or 500), obj)
        if kind == "BOOKMARK":
            self._set_resource_version(_rv(obj))
            return
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            raise TransientKubeError(f"{self.name}: unknown watch event type {kind!r}")
        key = self.key(obj)
        rv = _rv(obj)
        if rv.isdigit() and self._resource_version.isdigit() and int(rv) < int(self._resource_version):
            raise HistoryReset(
                f"event at resourceVersion {rv} after {self._resource_version}: the server's history restarted"
            )
        if kind == "DELETED":
            if self._objects.pop(key, None) is not None:
                self._emit(Change(ChangeType.DELETED, key, obj))
        else:
            change = ChangeType.MODIFIED if key in self._objects else ChangeType.ADDED
            self._objects[key] = obj
            self._emit(Change(change, key, obj))
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
