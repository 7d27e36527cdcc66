"""An informer source reading an :class:`ObjectStore` directly, without HTTP.

Same semantics as the fake API server (it is the same store and the same
rules: resourceVersions, paging and continue tokens, WatchList, field and
label selectors, 410 for compacted versions, ERROR events), minus the sockets, so
virtual-time tests (``autojump_clock``) can drive an informer: the clock never
jumps while a real socket read is pending there.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import attrs
import trio

from flock.apiserver._events import WatchEvent, bookmark
from flock.apiserver._resources import Resource
from flock.apiserver._selectors import NOT_OLDER_THAN, FieldSelector, ListQuery, WatchQuery
from flock.apiserver._status import StatusError
from flock.apiserver._store import RESOURCE_VERSION_WAIT, ObjectStore, StoredObject, Subscription
from flock.watchers import ListOptions, ListPage, TransientKubeError, error_for_status

Object = Mapping[str, Any]
_CHECKPOINT_EVERY = 100  # items handed on between checkpoints: a long list must not starve other tasks
_FRESH_POLL = 0.05


@attrs.define(eq=False)
class StoreSource:
    """List/watch/get *resource* objects of *store* matching *field_selector* and *label_selector*
    (a :class:`flock.watchers.ListWatchSource`).

    ``fail_lists`` makes the next list requests raise TransientKubeError (a 5xx burst);
    ``watch_seconds_cap`` ends watches early, cleanly (a proxy with a short timeout);
    ``bookmark_seconds`` sends a BOOKMARK at the store's version after that long without an event;
    ``watch_list`` False refuses WatchList as a server without the feature gate (422);
    ``paged_cache_lists`` pages lists at "0" too (1.33's cache snapshots; 1.32 answers them whole).
    ``list_requests`` and ``watch_requests`` record what was asked, in order.
    """

    store: ObjectStore
    resource: Resource
    field_selector: str = ""
    label_selector: str = ""
    fail_lists: int = 0
    gets: list[tuple[str | None, str]] = attrs.field(factory=list)  # direct GETs asked for
    lists: int = 0  # list requests served (pages)
    watches: int = 0  # watches opened
    watch_seconds_cap: float | None = None  # end every watch this soon (a proxy cutting streams)
    bookmark_seconds: float | None = None
    watch_list: bool = True
    paged_cache_lists: bool = False
    resource_version_wait: float = RESOURCE_VERSION_WAIT  # the watch cache's wait for a future version
    list_requests: list[ListOptions] = attrs.field(factory=list)
    # (resource_version, send_initial_events) of every watch asked for, refused ones included.
    watch_requests: list[tuple[str, bool]] = attrs.field(factory=list)
    _open: set[trio.MemorySendChannel[Object]] = attrs.field(init=False, factory=set)

    def restart_server(self, store: ObjectStore | None = None) -> None:
        """The API server restarts: open watches break (connection reset) and
        from now on *store* answers (default: an empty one, as after a wipe)."""
        self.store = store if store is not None else ObjectStore()
        for send in list(self._open):
            send.close()
        self._open.clear()

    @property
    def page_limits(self) -> list[int]:
        """The ``limit`` of every list request so far."""
        return [options.limit for options in self.list_requests]

    @property
    def _selector(self) -> FieldSelector:
        return FieldSelector.parse(self.field_selector, self.resource.kind, self.label_selector)

    async def list(self, options: ListOptions, on_item: Callable[[Object], None]) -> ListPage:
        """One list request, by the API server's rules (see :meth:`ListQuery.plan`); each item
        goes to *on_item*, decoded, in key order.  Errors as the HTTP source raises them:
        410 → ResourceExpired, 504 too large → ResourceVersionTooLarge, 400/422 → KubeApiError.
        """
        await trio.lowlevel.checkpoint()
        if self.fail_lists > 0:
            self.fail_lists -= 1
            raise TransientKubeError("503 ServiceUnavailable: injected")
        self.lists += 1
        self.list_requests.append(options)
        query = ListQuery(options.resource_version, options.resource_version_match, options.limit, options.continue_)
        try:
            plan = query.plan(paged_cache_lists=self.paged_cache_lists)
            if plan.from_cache:
                await self._until_version(plan.minimum)
            result = self.store.read(self.resource, None, self._selector, plan)
        except StatusError as err:
            raise error_for_status(err.code, err.status()) from None
        for i, obj in enumerate(result.items):
            on_item(obj.decode())
            if i % _CHECKPOINT_EVERY == _CHECKPOINT_EVERY - 1:
                await trio.lowlevel.checkpoint()
        return ListPage(str(result.resource_version), result.continue_, result.remaining_item_count)

    async def get(self, namespace: str | None, name: str) -> Object | None:
        await trio.lowlevel.checkpoint()
        self.gets.append((namespace, name))
        try:
            return self.store.get(self.resource, name, namespace)
        except StatusError as err:
            if err.code == 404:
                return None
            raise

    @contextlib.asynccontextmanager
    async def watch(
        self, resource_version: str, timeout_seconds: int, *, send_initial_events: bool = False
    ) -> AsyncIterator[AsyncIterator[Object]]:
        """Events after *resource_version*, bookmarks allowed; *send_initial_events*: a WatchList
        (``sendInitialEvents=true&resourceVersionMatch=NotOlderThan``): an ADDED event for every
        object not older than *resource_version*, the BOOKMARK annotated ``k8s.io/initial-events-end``
        at their version, then changes.  A watch from "" or "0" without it is one too, as on a
        server with the feature gate on."""
        self.watch_requests.append((resource_version, send_initial_events))
        query = WatchQuery(
            resource_version,
            NOT_OLDER_THAN if send_initial_events else "",
            True if send_initial_events else None,
            allow_bookmarks=True,
        )
        send, receive = trio.open_memory_channel[Object](math.inf)
        token, owner = trio.lowlevel.current_trio_token(), threading.get_ident()

        def push(event: WatchEvent) -> None:
            try:
                send.send_nowait(event.decode())
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # the watch ended between the write and this delivery

        def deliver(event: WatchEvent) -> None:
            # Writes may come from another thread (the HTTP server's); hop to Trio's.
            if threading.get_ident() == owner:
                push(event)
            else:
                token.run_sync_soon(push, event)

        self.watches += 1
        if self.watch_seconds_cap is not None:
            timeout_seconds = min(timeout_seconds, self.watch_seconds_cap)  # type: ignore[assignment]
        try:
            query = query.checked(self.watch_list)
            if query.initial_events:
                await self._until_version(query.minimum)
            started = self.store.start_watch(self.resource, None, self._selector, deliver, query)
        except StatusError as err:
            raise error_for_status(err.code, err.status()) from None
        # What comes after the initial objects: the WatchList's end bookmark, or the ERROR refusing the watch.
        then: list[Object] = []
        initial: list[StoredObject] = []
        sub: Subscription | None = None
        if isinstance(started, WatchEvent):
            then.append(started.decode())
        else:
            sub = started
            initial, sub.initial = sub.initial, []
            if query.end_bookmark:
                then.append(bookmark(self.resource, sub.resource_version, initial_events_end=True).decode())
        self._open.add(send)
        try:
            with receive:
                yield _Events(
                    receive,
                    trio.current_time() + timeout_seconds,
                    self.bookmark_seconds,
                    self._bookmark,
                    initial,
                    then,
                )
        finally:
            self._open.discard(send)
            if sub is not None:
                sub.close()

    async def _until_version(self, minimum: int) -> None:
        """Wait (at most ``resource_version_wait``) for the store to reach *minimum*, as the watch cache does."""
        with trio.move_on_after(self.resource_version_wait):
            # The store may be written from any thread: polled, not signalled.
            while self.store.resource_version < minimum:  # noqa: ASYNC110
                await trio.sleep(_FRESH_POLL)

    def _bookmark(self) -> Object:
        return bookmark(self.resource, self.store.resource_version).decode()


@attrs.define(eq=False)
class _Events:
    """The *initial* objects as ADDED events and the *then* events (the WatchList's bookmark, or
    the ERROR that refuses it), then events until *deadline* (the server's timeoutSeconds) or an
    ERROR event; a BOOKMARK after *bookmark_seconds* without one."""

    receive: trio.MemoryReceiveChannel[Object]
    deadline: float
    bookmark_seconds: float | None
    bookmark: Callable[[], Object]
    initial: list[StoredObject]
    then: list[Object]
    done: bool = False
    _sent: int = 0

    def __aiter__(self) -> _Events:
        return self

    async def __anext__(self) -> Object:
        if self._sent < len(self.initial):
            obj = self.initial[self._sent]
            self._sent += 1
            if self._sent % _CHECKPOINT_EVERY == 0:
                await trio.lowlevel.checkpoint()
            if self._sent == len(self.initial):
                self.initial = []
                self._sent = 0
            return {"type": "ADDED", "object": obj.decode()}
        if self.then:
            event = self.then.pop(0)
            self.done = event.get("type") == "ERROR"
            return event
        if not self.done:
            with trio.move_on_at(self.deadline):
                try:
                    if self.bookmark_seconds is None:
                        event = await self.receive.receive()
                    else:
                        with trio.move_on_after(self.bookmark_seconds):
                            event = await self.receive.receive()
                            self.done = event.get("type") == "ERROR"
                            return event
                        # Writes on this thread deliver synchronously, so nothing older than
                        # the store's version is still on its way (writers on other threads: no bookmarks)
                        # but an event written at the instant the wait timed out: it goes first.
                        try:
                            event = self.receive.receive_nowait()
                        except trio.WouldBlock:
                            return self.bookmark()
                        self.done = event.get("type") == "ERROR"
                        return event
                except trio.EndOfChannel:
                    raise TransientKubeError("connection reset: the API server restarted") from None
                self.done = event.get("type") == "ERROR"
                return event
        raise StopAsyncIteration
