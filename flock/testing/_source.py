"""An informer source reading an :class:`ObjectStore` directly, without HTTP.

Same semantics as the fake API server (it is the same store: resourceVersions,
field selectors, 410 for compacted versions, ERROR events), minus the sockets,
so virtual-time tests (``autojump_clock``) can drive an informer: the clock
never jumps while a real socket read is pending there.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import AsyncIterator, Mapping
from typing import Any

import attrs
import trio

from flock.watchers import ResourceExpired, TransientKubeError, error_for_status

from ._resources import Resource
from ._selectors import FieldSelector
from ._status import StatusError
from ._store import ObjectStore


@attrs.define(eq=False)
class StoreSource:
    """List/watch/get *resource* objects of *store* matching *field_selector*.

    ``fail_lists`` makes the next lists raise TransientKubeError (a 5xx burst);
    ``watch_seconds_cap`` ends watches early, cleanly (a proxy with a short timeout).
    """

    store: ObjectStore
    resource: Resource
    field_selector: str = ""
    fail_lists: int = 0
    gets: list[tuple[str | None, str]] = attrs.field(factory=list)  # direct GETs asked for
    lists: int = 0  # lists served
    watches: int = 0  # watches opened
    watch_seconds_cap: float | None = None  # end every watch this soon (a proxy cutting streams)
    _open: set[trio.MemorySendChannel[Mapping[str, Any]]] = attrs.field(init=False, factory=set)

    def restart_server(self, store: ObjectStore | None = None) -> None:
        """The API server restarts: open watches break (connection reset) and
        from now on *store* answers (default: an empty one, as after a wipe)."""
        self.store = store if store is not None else ObjectStore()
        for send in list(self._open):
            send.close()
        self._open.clear()

    @property
    def _selector(self) -> FieldSelector:
        return FieldSelector.parse(self.field_selector, self.resource.kind)

    async def list(self) -> tuple[list[Mapping[str, Any]], str]:
        await trio.lowlevel.checkpoint()
        if self.fail_lists > 0:
            self.fail_lists -= 1
            raise TransientKubeError("503 ServiceUnavailable: injected")
        self.lists += 1
        items, rv = self.store.list(self.resource, None, self._selector)
        return items, str(rv)

    async def get(self, namespace: str | None, name: str) -> Mapping[str, Any] | None:
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
        self, resource_version: str, timeout_seconds: int
    ) -> AsyncIterator[AsyncIterator[Mapping[str, Any]]]:
        send, receive = trio.open_memory_channel[Mapping[str, Any]](math.inf)
        token, owner = trio.lowlevel.current_trio_token(), threading.get_ident()

        def push(event: Mapping[str, Any]) -> None:
            try:
                send.send_nowait(event)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # the watch ended between the write and this delivery

        def deliver(event: Mapping[str, Any]) -> None:
            # Writes may come from another thread (the HTTP server's); hop to Trio's.
            if threading.get_ident() == owner:
                push(event)
            else:
                token.run_sync_soon(push, event)

        self.watches += 1
        if self.watch_seconds_cap is not None:
            timeout_seconds = min(timeout_seconds, self.watch_seconds_cap)  # type: ignore[assignment]
        try:
            sub = self.store.watch(self.resource, None, self._selector, resource_version, deliver)
        except StatusError as err:
            if err.code == 410:
                raise ResourceExpired(err.message) from None
            if err.code == 504:
                raise error_for_status(504, err.status()) from None
            raise
        self._open.add(send)
        try:
            with receive:
                yield _Events(receive, trio.current_time() + timeout_seconds)
        finally:
            self._open.discard(send)
            sub.close()


@attrs.define(eq=False)
class _Events:
    """Events until *deadline* (the server's timeoutSeconds) or an ERROR event."""

    receive: trio.MemoryReceiveChannel[Mapping[str, Any]]
    deadline: float
    done: bool = False

    def __aiter__(self) -> _Events:
        return self

    async def __anext__(self) -> Mapping[str, Any]:
        if not self.done:
            with trio.move_on_at(self.deadline):
                try:
                    event = await self.receive.receive()
                except trio.EndOfChannel:
                    raise TransientKubeError("connection reset: the API server restarted") from None
                self.done = event.get("type") == "ERROR"
                return event
        raise StopAsyncIteration
