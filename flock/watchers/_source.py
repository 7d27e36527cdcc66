"""List, watch and get one kind of object through kubernetes-asyncio, from Trio.

A :class:`KubeSource` is what an informer consumes (see
:class:`flock.watchers.ListWatchSource`).  It asks for raw JSON
(``_preload_content=False``): the informer decodes into flock's own values, so
building the library's model objects would be wasted work.  Every body is
read as it arrives: a list's items are decoded one by one
(:class:`flock.watchers.ListDecoder`) and handed on, a watch's events line by
line, so neither a whole list nor its raw objects are ever held.  Watches are
read here rather than through the library's ``Watch`` helper, which opens a
second HTTP session per watch and silently retries once after a 410.

Error handling: nothing is retried here.  The client stack's errors become
:class:`TransientKubeError` (connection trouble, 429/5xx, malformed stream),
:class:`ResourceExpired` (410) or :class:`KubeApiError` (other statuses) and
propagate to the informer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import Any

import aiohttp
import attrs
import outcome
import trio
from kubernetes_asyncio.client.exceptions import ApiException

from ._bridge import AsyncioBridge
from ._errors import KubeError, TransientKubeError, error_for_status
from ._informer import ListOptions, ListPage
from ._liststream import ListDecodeError, ListDecoder

# Closing a response or session must not hang shutdown.
CLOSE_SECONDS = 5.0
# One watch event is one object; etcd refuses objects over 1.5 MiB.
MAX_EVENT_BYTES = 16 * 2**20

AsyncioCall = Callable[..., Awaitable[Any]]


@contextlib.contextmanager
def translated_errors(what: str) -> Iterator[None]:
    try:
        yield
    except KubeError:
        raise
    except ApiException as exc:
        raise error_for_status(exc.status, _json_or_none(exc.body)) from exc
    except (TimeoutError, aiohttp.ClientError, OSError, ValueError, ListDecodeError) as exc:
        raise TransientKubeError(f"{what}: {type(exc).__name__}: {exc}") from exc


def _json_or_none(data: Any) -> Any:
    try:
        return json.loads(data) if data else None
    except (TypeError, ValueError):
        return None


async def _fetch(call: AsyncioCall, kwargs: dict[str, Any]) -> tuple[int, bytes]:
    """(asyncio) One request, its whole body read, the connection released."""
    resp = await call(**kwargs)
    try:
        return resp.status, await resp.read()
    finally:
        resp.release()


# Chunks a response's reader may run ahead of the Trio side: the rest waits in the socket
# (TCP's flow control holds the API server back), so a slow decode never buffers a list.
READ_AHEAD_CHUNKS = 16


async def _pump(
    content: aiohttp.StreamReader, send: trio.MemorySendChannel[outcome.Outcome[bytes]], room: asyncio.Semaphore
) -> None:
    """(asyncio) Every chunk of a response body into *send*, then ``b""`` at its end, or the
    error that ended it; stops when the Trio side has closed its end.  Each chunk takes
    one unit of *room*, which the Trio side gives back once it has taken the chunk."""
    try:
        while True:
            await room.acquire()
            try:
                chunk = await content.readany()
            except Exception as exc:
                send.send_nowait(outcome.Error(exc))
                return
            send.send_nowait(outcome.Value(chunk))
            if not chunk:
                return
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return


@attrs.define(eq=False)
class _EventStream:
    """Watch events from one response body, one JSON object per line.

    The informer applies each event as it comes; :data:`MAX_EVENT_BYTES` bounds a line.
    """

    _next_chunk: Callable[[], Awaitable[bytes]]
    _what: str
    _buffer: bytearray = attrs.field(factory=bytearray)

    def __aiter__(self) -> _EventStream:
        return self

    async def __anext__(self) -> Mapping[str, Any]:
        searched = 0  # a long event in many chunks: each byte is searched once
        while (end := self._buffer.find(b"\n", searched)) < 0:
            searched = len(self._buffer)
            chunk = await self._next_chunk()
            if not chunk:
                if self._buffer.strip():
                    raise TransientKubeError(f"{self._what}: stream ended inside an event")
                raise StopAsyncIteration
            self._buffer += chunk
            if len(self._buffer) > MAX_EVENT_BYTES:
                raise TransientKubeError(f"{self._what}: event larger than {MAX_EVENT_BYTES} bytes")
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 1]
        with translated_errors(self._what):
            event = json.loads(line)
        if not isinstance(event, Mapping) or "type" not in event:
            raise TransientKubeError(f"{self._what}: not a watch event: {line[:200]!r}")
        return event


@attrs.define(eq=False)
class KubeSource:
    """List/watch/get one kind of object (e.g. pods with spec.nodeName=N).

    *list_call*: the kubernetes-asyncio list function, arguments bound except
    the query (field selector, watch, resourceVersion …).  *get_call(namespace,
    name)*: the matching read function.
    """

    bridge: AsyncioBridge
    what: str
    list_call: AsyncioCall
    get_call: Callable[..., Awaitable[Any]]  # (namespace, name, **query)
    field_selector: str = ""
    label_selector: str = ""  # e.g. flock.fritzlab.net/group in (a,b): an agent's address groups

    def _selectors(self) -> dict[str, Any]:
        query: dict[str, Any] = {"field_selector": self.field_selector}
        if self.label_selector:
            query["label_selector"] = self.label_selector
        return query

    async def list(self, options: ListOptions, on_item: Callable[[Any], None]) -> ListPage:
        """One list request; its body is decoded as it arrives and each item handed to
        *on_item* (see :class:`ListDecoder`): no whole list is ever held."""
        query = self._selectors()
        if options.limit:
            query["limit"] = options.limit
        if options.continue_:
            query["_continue"] = options.continue_
        if options.resource_version:
            query["resource_version"] = options.resource_version
        if options.resource_version_match:
            query["resource_version_match"] = options.resource_version_match
        decoder = ListDecoder(max_item_chars=MAX_EVENT_BYTES)
        async with self._response(query) as chunks:
            while chunk := await chunks():
                with translated_errors(self.what):
                    items = decoder.feed(chunk)
                # Outside the translation: what the caller raises is its own (a bug propagates).
                for item in items:
                    on_item(item)
                await trio.lowlevel.checkpoint()  # a long body must not starve the agent's other tasks
            with translated_errors(self.what):
                items = decoder.close()
            for item in items:
                on_item(item)
        meta = decoder.fields.get("metadata")
        if not isinstance(meta, Mapping) or not meta.get("resourceVersion"):
            raise TransientKubeError(f"{self.what}: list answer without metadata.resourceVersion")
        remaining = meta.get("remainingItemCount")
        return ListPage(
            str(meta["resourceVersion"]),
            str(meta.get("continue") or ""),
            remaining if isinstance(remaining, int) and not isinstance(remaining, bool) else None,
        )

    async def get(self, namespace: str | None, name: str) -> Mapping[str, Any] | None:
        """One object by name, or None when the server says 404."""

        async def get_one(**query: Any) -> Any:
            return await self.get_call(namespace, name, **query)

        try:
            return await self._checked(get_one)
        except KubeError as exc:
            if getattr(exc, "status", None) == 404:
                return None
            raise

    @contextlib.asynccontextmanager
    async def watch(
        self, resource_version: str, timeout_seconds: int, *, send_initial_events: bool = False
    ) -> AsyncIterator[AsyncIterator[Mapping[str, Any]]]:
        """Events after *resource_version*; the server ends the stream after
        *timeout_seconds*.  *send_initial_events*: a WatchList (see
        :class:`flock.watchers.ListWatchSource`).  The response is closed on exit,
        even when cancelled."""
        query: dict[str, Any] = dict(
            watch=True,
            allow_watch_bookmarks=True,
            timeout_seconds=timeout_seconds,
            **self._selectors(),
        )
        if resource_version:
            query["resource_version"] = resource_version
        if send_initial_events:
            query["send_initial_events"] = True
            query["resource_version_match"] = "NotOlderThan"
        async with self._response(query) as chunks:
            yield _EventStream(chunks, self.what)

    @contextlib.asynccontextmanager
    async def _response(self, query: dict[str, Any]) -> AsyncIterator[Callable[[], Awaitable[bytes]]]:
        """One request whose body is read as it arrives: yields a function returning the
        next chunk (``b""`` at its end).  A status other than 200 raises its KubeError.
        One asyncio task (:func:`_pump`) reads the body and hands each chunk over a Trio
        channel: trio-asyncio runs asyncio callbacks on the Trio thread, so that is a plain
        ``send_nowait``, where a bridge call per chunk would start an asyncio task each."""
        with translated_errors(self.what):
            resp = await self.bridge.call(self.list_call, **query, _preload_content=False)
        pump: asyncio.Task[None] | None = None
        try:
            if resp.status != 200:
                with translated_errors(self.what):
                    body = await self.bridge.call(resp.read)
                raise error_for_status(resp.status, _json_or_none(body))
            send, receive = trio.open_memory_channel[outcome.Outcome[bytes]](math.inf)
            with send, receive:
                room: asyncio.Semaphore | None = None

                def start_pump() -> asyncio.Task[None]:
                    nonlocal room
                    room = asyncio.Semaphore(READ_AHEAD_CHUNKS)
                    return asyncio.ensure_future(_pump(resp.content, send, room))

                pump = await self.bridge.call_sync(start_pump)
                assert room is not None
                release = room.release

                async def next_chunk() -> bytes:
                    received = await receive.receive()
                    self.bridge.soon(release)
                    with translated_errors(self.what):
                        return received.unwrap()

                yield next_chunk
        finally:
            with trio.move_on_after(CLOSE_SECONDS, shield=True):
                if pump is not None:
                    await self.bridge.call_sync(pump.cancel)
                await self.bridge.call_sync(resp.close)

    async def _checked(self, call: AsyncioCall, **query: Any) -> Any:
        with translated_errors(self.what):
            status, data = await self.bridge.call(_fetch, call, dict(query, _preload_content=False))
        body = _json_or_none(data)
        if status != 200:
            raise error_for_status(status, body if isinstance(body, Mapping) else None)
        if not isinstance(body, Mapping):
            raise TransientKubeError(f"{self.what}: answer is not a JSON object: {data[:200]!r}")
        return body
