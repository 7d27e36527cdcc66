"""What the fake API server's watches send, counted, and the HTTP paths that show it (not upstream).

Real watches: each connection's events and bytes written (the JSON lines,
initial events and bookmarks included; not the HTTP chunk framing), per watch
and totalled by resource, in a :class:`WatchLedger`.  Virtual watches (see
:mod:`._virtual`): registered, re-selected, totalled and cleared over HTTP, so
a benchmark process can stand for thousands of agents.

==========================================  ====================================================
``GET /debug/flock/watches``                real watches (open and the latest closed ones):
                                            ``{"watches": [{resource, namespace, labelSelector,
                                            fieldSelector, userAgent, events, bytes, open}],
                                            "totals": {plural: {watches, events, bytes}}}``
``POST /debug/flock/virtual-watches``       one ``{resource, namespace?, labelSelector?,
                                            fieldSelector?, count?, initialEvents?}`` or a list
                                            of them → 201 ``{"ids": [...]}``
``GET /debug/flock/virtual-watches``        ``{"totals": {plural: {watches, events, bytes}},
                                            "count": entries}``; ``?watches=true`` lists each
``DELETE /debug/flock/virtual-watches``     every one removed, totals forgotten: ``{"removed": n}``
``POST …/virtual-watches/{id}/rewatch``     ``{labelSelector?, fieldSelector?, initialEvents?:
                                            "new"|"all"|"none"}`` → ``{"events", "bytes"}``
                                            sent at the new watch's start
``DELETE …/virtual-watches/{id}``           that one closed
``GET /debug/flock/initial-bytes``          ``?resource=&namespace=&labelSelector=&fieldSelector=``
                                            → ``{"events", "bytes"}`` a WatchList would start with
==========================================  ====================================================
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Mapping
from typing import Any

import attrs
from aiohttp import web

from ._lists import encode
from ._status import StatusError
from ._store import ObjectStore
from ._virtual import NEW, resource_named

DEBUG_PREFIX = "/debug/flock/"
_CLOSED_KEPT = 10_000  # closed watches' records kept for the report


@attrs.define(eq=False)
class WatchTraffic:
    """One real watch connection and what it has been written."""

    id: int
    resource: str
    namespace: str | None
    label_selector: str
    field_selector: str
    user_agent: str
    events: int = 0
    bytes: int = 0
    open: bool = True

    def report(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "resource": self.resource,
            "namespace": self.namespace,
            "labelSelector": self.label_selector,
            "fieldSelector": self.field_selector,
            "userAgent": self.user_agent,
            "events": self.events,
            "bytes": self.bytes,
            "open": self.open,
        }


@attrs.define(eq=False)
class WatchLedger:
    """The real watches' traffic: open ones, the latest closed ones, totals by resource plural
    (every watch since the server started).  Used on the server's loop only."""

    _ids: itertools.count[int] = attrs.field(init=False, factory=lambda: itertools.count(1))
    _open: dict[int, WatchTraffic] = attrs.field(init=False, factory=dict)
    _closed: collections.deque[WatchTraffic] = attrs.field(
        init=False, factory=lambda: collections.deque(maxlen=_CLOSED_KEPT)
    )
    _totals: dict[str, list[int]] = attrs.field(init=False, factory=dict)

    def opened(
        self, resource: str, namespace: str | None, label_selector: str, field_selector: str, user_agent: str
    ) -> WatchTraffic:
        watch = WatchTraffic(next(self._ids), resource, namespace, label_selector, field_selector, user_agent)
        self._open[watch.id] = watch
        self._totals.setdefault(resource, [0, 0, 0])[0] += 1
        return watch

    def wrote(self, watch: WatchTraffic, events: int, size: int) -> None:
        watch.events += events
        watch.bytes += size
        totals = self._totals[watch.resource]
        totals[1] += events
        totals[2] += size

    def closed(self, watch: WatchTraffic) -> None:
        if self._open.pop(watch.id, None) is not None:
            watch.open = False
            self._closed.append(watch)

    def report(self) -> dict[str, Any]:
        return {
            "watches": [w.report() for w in (*self._closed, *self._open.values())],
            "totals": {plural: {"watches": w, "events": e, "bytes": b} for plural, (w, e, b) in self._totals.items()},
        }


def add_debug_routes(app: web.Application, ledger: WatchLedger, store: Callable[[], ObjectStore]) -> None:
    """The paths above; *store* gives the current store (a restart may replace it)."""

    def json_response(body: Any, status: int = 200) -> web.Response:
        return web.Response(body=encode(body), status=status, content_type="application/json")

    async def watches(request: web.Request) -> web.Response:
        return json_response(ledger.report())

    async def add(request: web.Request) -> web.Response:
        body = await _json_body(request)
        entries = body if isinstance(body, list) else [body]
        virtual = store().virtual_watches
        ids = []
        for entry in entries:
            if not isinstance(entry, Mapping) or not isinstance(entry.get("resource"), str):
                raise StatusError(400, 'a virtual watch is an object with "resource" (a plural, e.g. "pods")')
            watch = virtual.add(
                entry["resource"],
                namespace=_optional_str(entry, "namespace"),
                label_selector=_optional_str(entry, "labelSelector") or "",
                field_selector=_optional_str(entry, "fieldSelector") or "",
                count=_int(entry, "count", 1),
                initial_events=bool(entry.get("initialEvents", False)),
            )
            ids.append(watch.id)
        return json_response({"ids": ids}, 201)

    async def totals(request: web.Request) -> web.Response:
        virtual = store().virtual_watches
        listed = virtual.watches()
        body: dict[str, Any] = {"totals": virtual.totals(), "count": len(listed)}
        if request.query.get("watches") in ("true", "1"):
            body["watches"] = listed
        return json_response(body)

    async def clear(request: web.Request) -> web.Response:
        return json_response({"removed": store().virtual_watches.clear()})

    async def rewatch(request: web.Request) -> web.Response:
        body = await _json_body(request)
        if not isinstance(body, Mapping):
            raise StatusError(400, "a rewatch is an object: {labelSelector?, fieldSelector?, initialEvents?}")
        watch = store().virtual_watches.get(_path_id(request))
        events, size = watch.rewatch(
            field_selector=_optional_str(body, "fieldSelector"),
            label_selector=_optional_str(body, "labelSelector"),
            initial_events=_optional_str(body, "initialEvents") or NEW,
        )
        return json_response({"events": events, "bytes": size})

    async def close(request: web.Request) -> web.Response:
        store().virtual_watches.get(_path_id(request)).close()
        return json_response({})

    async def initial(request: web.Request) -> web.Response:
        q = request.query
        events, size = store().virtual_watches.initial_bytes(
            resource_named(q.get("resource", "")),
            q.get("namespace") or None,
            q.get("labelSelector", ""),
            q.get("fieldSelector", ""),
        )
        return json_response({"events": events, "bytes": size})

    app.router.add_get(DEBUG_PREFIX + "watches", watches)
    app.router.add_post(DEBUG_PREFIX + "virtual-watches", add)
    app.router.add_get(DEBUG_PREFIX + "virtual-watches", totals)
    app.router.add_delete(DEBUG_PREFIX + "virtual-watches", clear)
    app.router.add_post(DEBUG_PREFIX + "virtual-watches/{id}/rewatch", rewatch)
    app.router.add_delete(DEBUG_PREFIX + "virtual-watches/{id}", close)
    app.router.add_get(DEBUG_PREFIX + "initial-bytes", initial)


async def _json_body(request: web.Request) -> Any:
    try:
        return await request.json()
    except ValueError as exc:
        raise StatusError(400, f"request body is not JSON: {exc}") from None


def _optional_str(body: Mapping[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise StatusError(400, f"{key} must be a string, got {type(value).__name__}")
    return value


def _int(body: Mapping[str, Any], key: str, default: int) -> int:
    value = body.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise StatusError(400, f"{key} must be an integer, got {type(value).__name__}")
    return value


def _path_id(request: web.Request) -> int:
    text = request.match_info["id"]
    if not text.isdigit():
        raise StatusError(400, f"a virtual watch's id is a number, got {text!r}")
    return int(text)


__all__ = ["DEBUG_PREFIX", "WatchLedger", "WatchTraffic", "add_debug_routes"]
