"""The fake API server's HTTP front end (aiohttp.web), with fault injection.

Runs on an asyncio loop; :class:`flock.testing.ApiServer` gives it a thread of
its own, and ``python -m flock.apiserver`` runs it as a process.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import socket
import time
from collections.abc import Mapping
from typing import Any

import attrs
import yaml
from aiohttp import web

from flock.netns import call_in_netns

from . import _discovery
from ._admission import admit_nodeconfig_status
from ._debug import DEBUG_PREFIX, WatchLedger, add_debug_routes
from ._deletion import DeleteOptions
from ._events import WatchEvent, added_events, bookmark
from ._patch import APPLY_PATCH, JSON_PATCH, MERGE_PATCH, PATCH_TYPES, STRATEGIC_MERGE_PATCH
from ._resources import NODECONFIGS, RESOURCES, Resource
from ._selectors import FieldSelector, ListQuery, WatchQuery, parse_bool
from ._status import StatusError, status_object
from ._store import RESOURCE_VERSION_WAIT, ObjectStore, Subscription, encode, merge_patch
from ._tables import table, wants_table

log = logging.getLogger("flock.apiserver")

# kube-apiserver's --min-request-timeout: a watch without timeoutSeconds ends after about this long.
DEFAULT_WATCH_SECONDS = 1800.0
_FRESH_POLL = 0.02
_BATCH = 500  # list items or initial watch events written at a time
_TRUE = ("true", "True", "1")
# The /status subresource takes the two patches that only merge maps here.
_STATUS_PATCH_TYPES = (MERGE_PATCH, STRATEGIC_MERGE_PATCH)


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=encode(obj), status=status, content_type="application/json")


def _status_response(err: StatusError) -> web.Response:
    return _json(err.status(), err.code)


@attrs.define(eq=False)
class HttpFrontend:
    """Serves *store* over HTTP at *host*:*port* (port 0: any free port).

    Lists are paged (``limit``/``continue``) or answered whole as kube-apiserver 1.32
    decides (:meth:`ListQuery.plan`); big lists and a WatchList's initial events are
    written in batches of :data:`_BATCH`, the loop free in between.

    Fault injection (call on the server's loop, see :class:`ApiServer` for the
    thread-safe wrappers): :meth:`drop_connections`, :meth:`fail_next`,
    :meth:`pause` / :meth:`resume`; compaction lives on the store.
    """

    store: ObjectStore
    host: str = "127.0.0.1"
    port: int = 0
    bookmark_interval: float = 1.0
    # The WatchList feature gate (on by default since 1.32): off, sendInitialEvents → 422.
    watch_list: bool = True
    # 1.33's snapshots of the watch cache: lists at "0" (or not older than N) honour limit too.
    paged_cache_lists: bool = False
    resource_version_wait: float = RESOURCE_VERSION_WAIT
    # host:port is bound inside this named network namespace (/run/netns/NAME), not the process's own.
    netns: str | None = None
    # More (host, port) to serve on, in the process's own namespace (port 0: any; kept across restarts).
    also_listen: list[tuple[str, int]] = attrs.field(factory=list)
    # Bearer tokens the API accepts (kube-apiserver's --token-auth-file); None: every request, unchecked.
    tokens: frozenset[str] | None = None
    # Bound service account tokens: token → the node it was issued for (its node-name claim).  Such a token is
    # accepted, and writes of NodeConfig status with it pass the node-restriction policy only for that node's.
    token_nodes: Mapping[str, str] = attrs.field(factory=dict)
    # (method, path?query) of the latest API requests; bounded for a long-running lab server.
    requests: collections.deque[tuple[str, str]] = attrs.field(
        init=False, factory=lambda: collections.deque(maxlen=100_000)
    )
    _runner: web.AppRunner | None = attrs.field(init=False, default=None)
    _inflight: dict[asyncio.Task[Any], web.Request] = attrs.field(init=False, factory=dict)
    _fail_remaining: int = attrs.field(init=False, default=0)
    _fail_status: int = attrs.field(init=False, default=500)
    _serving: asyncio.Event | None = attrs.field(init=False, default=None)
    # What each watch connection has been written (``GET /debug/flock/watches``, see :mod:`._debug`).
    watch_ledger: WatchLedger = attrs.field(init=False, factory=WatchLedger)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def also_urls(self) -> list[str]:
        """The URLs of :attr:`also_listen` (bound ports once started)."""
        return [f"http://[{h}]:{p}" if ":" in h else f"http://{h}:{p}" for h, p in self.also_listen]

    async def start(self) -> None:
        """Bind and serve; afterwards ``port`` is the bound port (reused by a restart)."""
        if self._serving is None:
            self._serving = asyncio.Event()
            self._serving.set()
        app = web.Application(middlewares=[self._middleware])
        for res in RESOURCES:
            self._add_routes(app, res)
        app.router.add_get("/healthz", self._plain_ok)
        app.router.add_get("/readyz", self._plain_ok)
        app.router.add_get("/version", self._version)
        self._add_discovery_routes(app)
        app.router.add_post("/flock-testing/{fault}", self._fault)
        app.router.add_get("/flock-testing/stats", self._stats)
        add_debug_routes(app, self.watch_ledger, lambda: self.store)
        sock = _bound(self.host, self.port, self.netns)
        self.port = sock.getsockname()[1]
        more = []
        for i, (host, port) in enumerate(self.also_listen):
            more.append(_bound(host, port, None))
            self.also_listen[i] = (host, more[-1].getsockname()[1])
        # handler_cancellation: a client that hangs up ends its watch here too, as on kube-apiserver.
        self._runner = web.AppRunner(app, shutdown_timeout=0.5, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        for bound in (sock, *more):
            await web.SockSite(self._runner, bound).start()
        log.info("fake apiserver listening", extra={"url": self.url, "also": self.also_urls})

    async def stop(self) -> None:
        """Stop serving: every open connection is cut, as when the process dies."""
        self.drop_connections()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    # ---- faults -------------------------------------------------------------

    def drop_connections(self) -> int:
        """Cut every in-flight request and watch without a clean end; returns how many."""
        victims = list(self._inflight.items())
        for task, request in victims:
            if request.transport is not None:
                request.transport.abort()
            task.cancel()
        return len(victims)

    def fail_next(self, count: int, status: int = 500) -> None:
        """Answer the next *count* API requests with a *status* Status object."""
        self._fail_remaining, self._fail_status = count, status

    def pause(self) -> None:
        """Hold every request and watch event until :meth:`resume` (a hung server)."""
        assert self._serving is not None
        self._serving.clear()

    def resume(self) -> None:
        assert self._serving is not None
        self._serving.set()

    # ---- HTTP ---------------------------------------------------------------

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        task = asyncio.current_task()
        assert task is not None and self._serving is not None
        control = request.path.startswith(("/flock-testing/", DEBUG_PREFIX))
        if not control:  # the fault endpoints must not cut or hold themselves
            self._inflight[task] = request
            self.requests.append((request.method, request.path_qs))
        try:
            if not control:
                await self._serving.wait()
                if self.tokens is not None and not self._authenticated(request):
                    return _json(status_object(401, "Unauthorized", "Unauthorized"), 401)
                if self._fail_remaining > 0:
                    self._fail_remaining -= 1
                    return _json(status_object(self._fail_status, "injected failure"), self._fail_status)
            return await handler(request)
        except StatusError as err:
            return _status_response(err)
        finally:
            self._inflight.pop(task, None)

    def _authenticated(self, request: web.Request) -> bool:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        return scheme.lower() == "bearer" and (
            token.strip() in (self.tokens or frozenset()) or token.strip() in self.token_nodes
        )

    def _node_claim(self, request: web.Request) -> str | None:
        """The node the request's bearer token is bound to (None: not a node-bound token)."""
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        return self.token_nodes.get(token.strip()) if scheme.lower() == "bearer" else None

    @property
    def open_requests(self) -> int:
        return len(self._inflight)

    async def _plain_ok(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _version(self, request: web.Request) -> web.Response:
        return _json(
            {
                "major": "1",
                "minor": "32",
                "gitVersion": "v1.32.0-flock-testing",
                "gitCommit": "",
                "gitTreeState": "clean",
                "buildDate": "2025-01-01T00:00:00Z",
                "goVersion": "",
                "compiler": "flock.testing",
                "platform": "linux/amd64",
            }
        )

    def _add_discovery_routes(self, app: web.Application) -> None:
        """/api, /apis and every group version, and the OpenAPI documents (see :mod:`._discovery`):
        v3's name every kind's paths and their ``fieldValidation`` (so kubectl leaves validation
        to the server), v2's is empty (no schema: kubectl validates nothing client-side, computes
        strategic merge patches from its compiled-in types, and a kind the server does not serve
        gets kubectl's own "no matches for kind" rather than "failed to download openapi")."""

        def aggregated_or(legacy: dict[str, Any], core: bool) -> Any:
            async def handler(request: web.Request) -> web.Response:
                if _discovery.wants_aggregated(request.headers.get("Accept", "")):
                    body = _discovery.aggregated(RESOURCES, core=core)
                    return web.Response(body=encode(body), headers={"Content-Type": _discovery.AGGREGATED_V2})
                return _json(legacy)

            return handler

        async def group(request: web.Request) -> web.Response:
            found = _discovery.api_group(RESOURCES, request.match_info["group"])
            if found is None:
                raise StatusError(404, "the server could not find the requested resource")
            return _json(found)

        async def group_version(request: web.Request) -> web.Response:
            found = _discovery.resource_list(
                RESOURCES, request.match_info.get("group", ""), request.match_info["version"]
            )
            if found is None:
                raise StatusError(404, "the server could not find the requested resource")
            return _json(found)

        app.router.add_get("/api", aggregated_or(_discovery.api_versions(), True))
        app.router.add_get("/apis", aggregated_or(_discovery.api_group_list(RESOURCES), False))
        app.router.add_get("/api/{version}", group_version)
        app.router.add_get("/apis/{group}", group)
        app.router.add_get("/apis/{group}/{version}", group_version)

        async def openapi(request: web.Request) -> web.Response:
            return _json(_discovery.openapi_v3_paths(RESOURCES))

        async def openapi_group_version(request: web.Request) -> web.Response:
            found = _discovery.openapi_v3_document(
                RESOURCES, request.match_info.get("group", ""), request.match_info["version"]
            )
            if found is None:
                raise StatusError(404, "the server could not find the requested resource")
            return _json(found)

        async def openapi_v2(request: web.Request) -> web.Response:
            if "protobuf" in request.headers.get("Accept", ""):
                body, kind = _discovery.OPENAPI_V2_PROTOBUF, _discovery.OPENAPI_V2_PROTOBUF_TYPE
                return web.Response(body=body, headers={"Content-Type": kind})
            return _json(_discovery.openapi_v2_document())

        app.router.add_get("/openapi/v2", openapi_v2)
        app.router.add_get("/openapi/v3", openapi)
        app.router.add_get("/openapi/v3/api/{version}", openapi_group_version)
        app.router.add_get("/openapi/v3/apis/{group}/{version}", openapi_group_version)

    async def _stats(self, request: web.Request) -> web.Response:
        """What the store holds (objects and bytes of JSON per resource) and its version."""
        return _json({"resourceVersion": str(self.store.resource_version), "resources": self.store.footprint()})

    async def _fault(self, request: web.Request) -> web.Response:
        fault, q = request.match_info["fault"], request.query
        if fault == "drop":
            return _json({"dropped": self.drop_connections()})
        if fault == "fail":
            self.fail_next(int(q.get("count", "1")), int(q.get("status", "500")))
        elif fault == "compact":
            return _json({"resourceVersion": str(self.store.compact(expire_watches=q.get("expire") in _TRUE))})
        elif fault == "pause":
            self.pause()
        elif fault == "resume":
            self.resume()
        else:
            raise StatusError(404, f"unknown fault {fault!r}: drop, fail, compact, pause, resume")
        return _json({})

    def _add_routes(self, app: web.Application, res: Resource) -> None:
        async def collection(request: web.Request) -> web.StreamResponse:
            ns = request.match_info.get("namespace")
            _no_dry_run(request)
            if request.method == "POST":
                return _json(self.store.create(res, await _body(request), ns), 201)
            return await self._list_or_watch(request, res, ns)

        async def item(request: web.Request) -> web.StreamResponse:
            ns, name = request.match_info.get("namespace"), request.match_info["name"]
            _no_dry_run(request)
            if request.method == "GET":
                obj = self.store.get(res, name, ns)
                if wants_table(request.headers.get("Accept", "")):
                    return _json(
                        self._table(request, res, [obj], {"resourceVersion": obj["metadata"]["resourceVersion"]})
                    )
                return _json(obj)
            if request.method == "PUT":
                body = await _body(request)
                if (body.get("metadata") or {}).get("name") != name:
                    raise StatusError(400, "the name of the object does not match the name on the URL")
                return _json(self.store.update(res, body, ns))
            if request.method == "PATCH":
                return await self._patch(request, res, name, ns)
            return _json(self.store.delete(res, name, ns, await _delete_options(request)))

        async def status(request: web.Request) -> web.StreamResponse:
            ns, name = request.match_info.get("namespace"), request.match_info["name"]
            if request.method == "GET":
                return _json(self.store.get(res, name, ns))
            body = await _body(request)
            if res == NODECONFIGS:
                admit_nodeconfig_status(self._node_claim(request), name)
            if request.method == "PUT":
                rv = (body.get("metadata") or {}).get("resourceVersion")
                return _json(self.store.set_status(res, name, body.get("status"), ns, rv))
            if request.content_type not in _STATUS_PATCH_TYPES:
                raise StatusError(
                    415, f"flock.testing patches a status with merge patches only, got {request.content_type}"
                )
            current = self.store.get(res, name, ns)
            merged = merge_patch(current.get("status"), body.get("status") or {})
            return _json(self.store.set_status(res, name, merged, ns, current["metadata"]["resourceVersion"]))

        if res.namespaced:
            app.router.add_get(f"{res.prefix}/{res.plural}", collection)
            base = f"{res.prefix}/namespaces/{{namespace}}/{res.plural}"
        else:
            base = f"{res.prefix}/{res.plural}"
        app.router.add_route("GET", base, collection)
        app.router.add_route("POST", base, collection)
        for method in ("GET", "PUT", "PATCH", "DELETE"):
            app.router.add_route(method, base + "/{name}", item)
        for method in ("GET", "PUT", "PATCH"):
            app.router.add_route(method, base + "/{name}/status", status)

    async def _list_or_watch(self, request: web.Request, res: Resource, ns: str | None) -> web.StreamResponse:
        q = request.query
        selector = FieldSelector.parse(q.get("fieldSelector"), res.kind, q.get("labelSelector"))
        if parse_bool("watch", q.get("watch") or "false"):
            return await self._watch(request, res, ns, selector)
        plan = ListQuery.from_query(q).plan(paged_cache_lists=self.paged_cache_lists)
        if plan.from_cache:
            await self._until_version(plan.minimum)
        result = self.store.read(res, ns, selector, plan)
        if wants_table(request.headers.get("Accept", "")):
            meta: dict[str, Any] = {"resourceVersion": str(result.resource_version)}
            if result.continue_:
                meta["continue"] = result.continue_
            if result.remaining_item_count is not None:
                meta["remainingItemCount"] = result.remaining_item_count
            return _json(self._table(request, res, [obj.decode() for obj in result.items], meta))
        if len(result.items) <= _BATCH:
            return web.Response(body=b"".join(result.chunks(res)), content_type="application/json")
        # A big list is written as it is encoded, a batch at a time, the loop free in between.
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        try:
            for chunk in result.chunks(res, _BATCH):
                await self._serving_wait()
                await resp.write(chunk)
                await asyncio.sleep(0)
            await resp.write_eof()
        except ConnectionResetError:
            pass  # the client hung up
        return resp

    def _table(
        self, request: web.Request, res: Resource, objects: list[dict[str, Any]], meta: dict[str, Any]
    ) -> dict[str, Any]:
        crd = self.store.crd(res) if res.custom else None
        return table(res, objects, include_object=request.query.get("includeObject", ""), list_meta=meta, crd=crd)

    async def _patch(self, request: web.Request, res: Resource, name: str, ns: str | None) -> web.Response:
        """PATCH of every kind kube-apiserver takes (see :mod:`._patch`); apply creates (201)."""
        kind = request.content_type
        if kind not in PATCH_TYPES:
            raise StatusError(
                415,
                f"the body of the request was in an unknown format - accepted media types include: {', '.join(PATCH_TYPES)}",
            )
        if kind == APPLY_PATCH:
            manager = request.query.get("fieldManager", "")
            if not manager:
                raise StatusError(
                    400,
                    'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required for apply patch',
                )
            try:
                applied = yaml.safe_load(await request.text())
            except yaml.YAMLError as exc:
                raise StatusError(400, f"error decoding YAML: {exc}") from None
            obj, created = self.store.apply(res, name, applied, manager, ns)
            return _json(obj, 201 if created else 200)
        try:
            patch = await request.json()
        except ValueError as exc:
            raise StatusError(400, f"request body is not JSON: {exc}") from None
        if kind == JSON_PATCH:
            return _json(self.store.patch(res, name, patch, ns, JSON_PATCH))
        return _json(self.store.patch(res, name, patch, ns, kind))

    async def _until_version(self, minimum: int) -> None:
        """Wait (at most ``resource_version_wait``) for the store to reach *minimum*, as the
        watch cache waits to be fresh; the caller then answers 504 if it is still behind."""
        deadline = time.monotonic() + self.resource_version_wait
        # Any thread writes the store: polled, not signalled.
        while self.store.resource_version < minimum and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(_FRESH_POLL)

    async def _serving_wait(self) -> None:
        assert self._serving is not None
        await self._serving.wait()

    async def _watch(
        self, request: web.Request, res: Resource, ns: str | None, selector: FieldSelector
    ) -> web.StreamResponse:
        q = request.query
        try:
            seconds = float(q.get("timeoutSeconds") or DEFAULT_WATCH_SECONDS)
        except ValueError:
            raise StatusError(400, f"invalid timeoutSeconds {q['timeoutSeconds']!r}: expected seconds") from None
        query = WatchQuery.from_query(q).checked(self.watch_list)
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[WatchEvent] = asyncio.Queue()

        def deliver(event: WatchEvent) -> None:
            loop.call_soon_threadsafe(events.put_nowait, event)

        if query.initial_events:
            await self._until_version(query.minimum)
        started = self.store.start_watch(res, ns, selector, deliver, query)
        sub = started if isinstance(started, Subscription) else None
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        traffic = self.watch_ledger.opened(
            res.plural,
            ns,
            q.get("labelSelector", ""),
            q.get("fieldSelector", ""),
            request.headers.get("User-Agent", ""),
        )

        async def write(lines: bytes, events: int = 1) -> None:
            await resp.write(lines)
            self.watch_ledger.wrote(traffic, events, len(lines))

        try:
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            end = time.monotonic() + seconds
            if isinstance(started, WatchEvent):
                await write(started.encode())  # refused: one ERROR event
                await resp.write_eof()
                return resp
            assert sub is not None
            initial, sub.initial = sub.initial, []
            for i in range(0, len(initial), _BATCH):
                await self._serving_wait()
                batch = initial[i : i + _BATCH]
                await write(added_events(batch), len(batch))
                await asyncio.sleep(0)
            del initial
            if query.end_bookmark:
                await write(bookmark(res, sub.resource_version, initial_events_end=True).encode())
            bookmarks = query.allow_bookmarks
            next_bookmark = time.monotonic() + self.bookmark_interval
            while (now := time.monotonic()) < end:
                wake = min(end, next_bookmark) if bookmarks else end
                try:
                    async with asyncio.timeout(max(0.0, wake - now)):
                        ev = await events.get()
                except TimeoutError:
                    if bookmarks and time.monotonic() >= next_bookmark:
                        sub.bookmark()  # arrives through the queue, after the events before it
                        next_bookmark = time.monotonic() + self.bookmark_interval
                    continue
                await self._serving_wait()
                await write(ev.encode())
                if ev.type == "ERROR":
                    break
            await self._serving_wait()  # a paused server does not end streams either
            await resp.write_eof()
            return resp
        except ConnectionResetError:
            return resp  # the client hung up: nothing to answer
        finally:
            self.watch_ledger.closed(traffic)
            if sub is not None:
                sub.close()


def _bound(host: str, port: int, netns: str | None) -> socket.socket:
    """A listening-ready TCP socket bound to host:port; in *netns* (a name under /run/netns) when
    given: made on a fresh OS thread that enters it and ends, so no thread of this process that
    other work uses ever changes namespace (the socket keeps its namespace)."""

    def make() -> socket.socket:
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
        except BaseException:
            sock.close()
            raise
        return sock

    return make() if netns is None else call_in_netns(netns, make)


def _no_dry_run(request: web.Request) -> None:
    """``dryRun=All`` would be answered as if stored and then stored: refuse it instead."""
    if request.query.get("dryRun"):
        raise StatusError(400, "flock.testing does not implement dryRun (kubectl --dry-run=client works)")


async def _body(request: web.Request) -> Mapping[str, Any]:
    if request.content_type == "application/vnd.kubernetes.protobuf":
        # client-go's typed clients send protobuf (kubectl create namespace …); -f files go as JSON.
        raise StatusError(415, "flock.testing reads JSON bodies only, not protobuf: use kubectl create/apply -f FILE")
    try:
        body = await request.json()
    except ValueError as exc:
        raise StatusError(400, f"request body is not JSON: {exc}") from None
    if not isinstance(body, Mapping):
        raise StatusError(400, f"request body must be an object, got {type(body).__name__}")
    return body


async def _delete_options(request: web.Request) -> DeleteOptions:
    """A DELETE's options: its body (DeleteOptions, as kubectl sends them), else its query."""
    body: Mapping[str, Any] | None = None
    if request.can_read_body and (raw := await request.read()).strip():
        try:
            parsed = json.loads(raw)
        except ValueError as exc:
            raise StatusError(400, f"request body is not JSON: {exc}") from None
        if not isinstance(parsed, Mapping):
            raise StatusError(400, f"DeleteOptions must be an object, got {type(parsed).__name__}")
        body = parsed
    return DeleteOptions.from_request(body, request.query)
